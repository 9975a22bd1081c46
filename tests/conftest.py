"""Test configuration.

The tests compute in float64 where they compare with 60-digit references, so x64 is switched
on here, for the test process only (the library itself never touches the flag; a test checks
that importing it leaves the flag alone). float32 tests pass float32 arrays explicitly.
"""

import atexit
import gc
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
# faster too. Each program's LLVM module is also compiled whole, not split into up to 32 parts
# for XLA's thread pool: the two xdist workers keep both cores busy, so the parts run no sooner
# and only add work (the split and each part's own passes): the suite takes ~7 % less time
# (user CPU 1,149 -> 1,059 s, wall 635 -> 589 s on 2 cores). Code generation, not arithmetic:
# the same kernels, each compiled by the same passes.
# tests/test_default_compiler_options.py checks the kernel against the mpmath references with
# XLA's defaults, in a child process. JAXRDP_TEST_XLA_DEFAULTS=1 runs the whole suite with the
# defaults. Set before JAX starts its backend; child processes inherit it. XLA aborts the
# process on a flag it does not know (jaxlib 0.11 has no fusion-emitters flag), so the flags
# are first tried in a child process, once (then one by one if they fail together): the xdist
# workers inherit the result.
FAST_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=1",
                  "--xla_cpu_parallel_codegen_split_count=1")


def _accepted(flags):
  """Whether this jaxlib starts with ``flags`` in XLA_FLAGS (tried in a child process)."""
  env = dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
  probe = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; jnp.ones(2).sum()"],
                         env=env, capture_output=True, timeout=300)
  return probe.returncode == 0


def _with_fast_flags():
  flags = os.environ.get("XLA_FLAGS", "").split()
  missing = [f for f in FAST_XLA_FLAGS if f not in flags]
  if not missing or os.environ.get("JAXRDP_TEST_XLA_PROBED") == "1":
    return
  os.environ["JAXRDP_TEST_XLA_PROBED"] = "1"
  if not _accepted(flags + missing):
    missing = [f for f in missing if _accepted(flags + [f])]
  os.environ["XLA_FLAGS"] = " ".join(flags + missing)


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

# Python's cyclic collector, in the test processes: tracing and lowering (a sixth of the
# suite's time) allocate many short-lived containers, and at the default first threshold (700)
# the collector often runs, its older generations over every module and cache imported. Here
# it runs per 10,000 net allocations, and what collection imported is frozen (not traversed again:
# pytest_collection_finish below). The suite on 2 cores: 589 -> 579 s (2-6 % on single files),
# the same peak memory. It still runs: nothing it would have found is left uncollected.
gc.set_threshold(10_000, 10, 10)


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


# The files whose tests take longest in all (summed per file by tools/suite_profile.py on a
# 2-core machine, which also splits each file's time into XLA compilation, lowering, tracing
# and the rest), run first: each worker runs one file at a time, and a long file started last
# keeps one core busy after the other has finished (longest first is the classic remedy).
# Files not named keep their order, after these.
_LONGEST_FIRST = ("test_schedules", "test_pld_truncation", "test_pld_api", "test_bad_input",
                  "test_traced_path", "test_sampled_gaussian", "test_pld", "test_pld_mixture",
                  "test_samplers", "test_accounting", "test_pld_soundness", "test_order_search",
                  "test_integer_orders", "test_pld_corners", "test_transform", "test_sampling",
                  "test_sweep", "test_properties", "test_sweep_processes",
                  "test_default_compiler_options", "test_mechanisms", "test_readme")


def pytest_collection_finish(session):
  """Everything imported by collection (JAX, jaxrdp, the references) is frozen: the collector's
  full passes skip it (see gc.set_threshold above)."""
  del session
  gc.collect()
  gc.freeze()


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))   # stable
