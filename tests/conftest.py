"""Test configuration.

The tests compute in float64 where they compare with 60-digit references, so x64 is switched
on here, for the test process only (the library itself never touches the flag; a test checks
that importing it leaves the flag alone). float32 tests pass float32 arrays explicitly.
"""

import atexit
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

# The suite compiles with the XLA:CPU options that jaxrdp's own eager calls use
# (jaxrdp/_internal/compilation.py: the classic loop emitters and LLVM's lighter pipeline; the
# same arithmetic, no fast-math), so that the tests' own ``jax.jit`` programs compile ~1.5x
# faster too. tests/test_default_compiler_options.py checks the kernel against the mpmath
# references with XLA's defaults, in a child process. JAXRDP_TEST_XLA_DEFAULTS=1 runs the
# whole suite with the defaults. Set before JAX starts its backend; child processes inherit it.
# XLA aborts the process on a flag it does not know (jaxlib 0.11 has no fusion-emitters flag),
# so the flags are first tried in a child process, once: the xdist workers inherit the result.
FAST_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=1")


def _with_fast_flags():
  flags = os.environ.get("XLA_FLAGS", "").split()
  missing = [f for f in FAST_XLA_FLAGS if f not in flags]
  if not missing or os.environ.get("JAXRDP_TEST_XLA_PROBED") == "1":
    return
  os.environ["JAXRDP_TEST_XLA_PROBED"] = "1"
  env = dict(os.environ, XLA_FLAGS=" ".join(flags + missing), JAX_PLATFORMS="cpu")
  probe = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; jnp.ones(2).sum()"],
                         env=env, capture_output=True, timeout=300)
  if probe.returncode == 0:
    os.environ["XLA_FLAGS"] = env["XLA_FLAGS"]


if os.environ.get("JAXRDP_TEST_XLA_DEFAULTS") != "1":
  _with_fast_flags()

# One compilation cache for the run, shared by the xdist workers and by the child processes that
# tests start (JAX's persistent cache, keyed on the program, the options and the jaxlib: what it
# returns is the executable XLA compiles for them). Programs that several test files compile
# (the PLD composition on one grid, a public function under jax.jit, the examples' programs in
# the README's tour) are compiled once per run instead of once per process: ~7 % of the
# suite's time. It starts empty, in a temporary directory that the run removes at its end,
# so no run reuses another's programs (a first call is never timed here: benchmarks/ do that,
# with no cache). Not where the user set a cache directory, nor with JAXRDP_TEST_NO_CACHE=1.
_RUN_CACHE = []   # the directory this process created (the controller's), removed at exit
if (not os.environ.get("JAX_COMPILATION_CACHE_DIR")
    and os.environ.get("JAXRDP_TEST_NO_CACHE") != "1"):
  _RUN_CACHE.append(tempfile.mkdtemp(prefix="jaxrdp-test-xla-cache-"))
  atexit.register(shutil.rmtree, _RUN_CACHE[0], ignore_errors=True)   # (also after a usage error)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _RUN_CACHE[0]
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


DATA = pathlib.Path(__file__).parent / "data"


def _load(name):
  with open(DATA / name) as f:
    points = json.load(f)["points"]
  col = lambda key: np.array([float(p[key]) for p in points])
  return {k: col(k) for k in ("q", "sigma", "alpha", "log_a", "dlog_a_dq", "dlog_a_dsigma")}


def peer_references(group):
  """dp_accounting's ε for the cases of ``group`` in tests/data/peer_references.json
  (tools/make_peer_references.py), each a dict of the case's arguments, its "epsilon" as a float
  and an "id" for pytest."""
  with open(DATA / "peer_references.json") as f:
    cases = json.load(f)[group]
  for case in cases:
    case["epsilon"] = float(case["epsilon"])
    case["id"] = "-".join(f"{v}" for k, v in case.items() if k not in ("epsilon", "c", "p"))
  return cases


@pytest.fixture(scope="session")
def log_a_reference():
  """The mpmath reference points (tools/make_references.py), as float64 numpy arrays."""
  return _load("log_a_reference.json")


@pytest.fixture(scope="session")
def log_a_reference_float32():
  """References at float32-exact inputs (tools/make_references.py --float32)."""
  return _load("log_a_reference_float32.json")


# The files whose tests take longest in all (summed per file from --junitxml on the 2-core CI
# machine; tools/suite_profile.py also splits each file's time into XLA compilation, lowering,
# tracing and the rest), run first: each worker runs one file at a time, and a long file started last
# keeps one core busy after the other has finished (longest first is the classic remedy).
# Files not named keep their order, after these.
_LONGEST_FIRST = ("test_sampled_gaussian", "test_bad_input", "test_integer_orders",
                  "test_accounting", "test_traced_path", "test_sweep", "test_sweep_processes",
                  "test_pld_api", "test_pld",
                  "test_order_search", "test_transform", "test_properties",
                  "test_api_consistency", "test_pld_soundness", "test_default_compiler_options",
                  "test_schedules", "test_pld_corners", "test_edge_gradients")


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))   # stable
