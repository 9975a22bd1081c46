"""The kernel with XLA's default CPU compiler options, against the mpmath references.

The rest of the suite compiles with the faster-compiling options of jaxrdp's own eager calls
(tests/conftest.py). A user's ``jax.jit`` compiles with XLA's defaults, so this file runs the
reference checks of test_log_a_reference.py once more in a child process without those flags
(and without the persistent compilation cache): ``jax.jit`` of ``log_a`` in float64 and
float32, the gradients, and a ``compute_rdp`` curve at the default orders against the eager
call.
"""

import os
import pathlib
import subprocess
import sys

from conftest import FAST_XLA_FLAGS

ROOT = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, os, pathlib
assert "fusion_emitters" not in os.environ.get("XLA_FLAGS", "")
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
import jaxrdp

assert jax.config.jax_compilation_cache_dir in (None, ""), jax.config.jax_compilation_cache_dir

def load(name):
  points = json.loads((pathlib.Path("tests/data") / name).read_text())["points"]
  return {k: np.array([float(p[k]) for p in points])
          for k in ("q", "sigma", "alpha", "log_a", "dlog_a_dq", "dlog_a_dsigma")}

rel = lambda x, ref: np.abs(x - ref) / np.where(ref == 0, 1.0, np.abs(ref))
r = load("log_a_reference.json")
value = np.asarray(jax.jit(jaxrdp.log_a)(r["q"], r["sigma"], r["alpha"]))
assert np.all(np.isfinite(value))
assert rel(value, r["log_a"]).max() <= 1e-12, rel(value, r["log_a"]).max()
assert np.all(value >= r["log_a"] * (1 - 128 * np.finfo(np.float64).eps))

inside = (r["q"] > 0) & (r["q"] < 1)
grad = jax.jit(jax.vmap(jax.grad(jaxrdp.log_a, argnums=(0, 1))))
dq, ds = (np.asarray(g) for g in grad(r["q"], r["sigma"], r["alpha"]))
assert rel(dq, r["dlog_a_dq"])[inside].max() <= 1e-8
assert rel(ds, r["dlog_a_dsigma"])[inside].max() <= 1e-8

r = load("log_a_reference_float32.json")
q32, s32, a32 = (r[k].astype(np.float32) for k in ("q", "sigma", "alpha"))
value = np.asarray(jax.jit(jaxrdp.log_a)(q32, s32, a32)).astype(np.float64)
normal = (r["log_a"] >= np.finfo(np.float32).tiny) & (r["log_a"] <= np.finfo(np.float32).max)
assert rel(value[normal], r["log_a"][normal]).max() <= 1e-5

rng = np.random.default_rng(0)
q, sigma = 10 ** rng.uniform(-4, np.log10(0.5), 64), rng.uniform(0.5, 5, 64)
orders = np.asarray(jaxrdp.DEFAULT_ORDERS)
jitted = np.asarray(jax.jit(lambda a, b: jaxrdp.compute_rdp(a, b, 1, orders))(q, sigma))
eager = np.asarray(jaxrdp.compute_rdp(q, sigma, 1, orders))
assert np.all(np.isfinite(jitted))
np.testing.assert_allclose(jitted, eager, rtol=1e-12)
print("OK")
"""


def test_default_xla_options_meet_the_references():
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if f not in FAST_XLA_FLAGS]
  env["XLA_FLAGS"] = " ".join(flags)
  env["JAXRDP_TEST_XLA_DEFAULTS"] = "1"
  env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
  for key in [k for k in env if k.startswith("JAX_COMPILATION_CACHE")]:
    del env[key]
  proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().endswith("OK")


def test_an_option_this_jaxlib_does_not_know_is_dropped(monkeypatch):
  # XLA renames and retires its flags (jaxlib 0.11 rejects xla_cpu_use_fusion_emitters with
  # "No such compile option"): eager calls must then compile without that option, not fail.
  import jax
  import numpy as np

  from jaxrdp._internal import compilation
  monkeypatch.setattr(compilation, "_CPU_OPTIONS",
                      dict(compilation._CPU_OPTIONS, xla_cpu_option_from_the_future=True))
  monkeypatch.setattr(compilation, "_UNSUPPORTED", set())
  x = np.arange(3.0)
  executable = compilation._compile_with_options(jax.jit(lambda v: v * 2.5 + 1.0).lower(x))
  np.testing.assert_array_equal(np.asarray(executable(x)), [1.0, 3.5, 6.0])
  assert "xla_cpu_option_from_the_future" in compilation._UNSUPPORTED
  # And through an entry point (on the CPU backend, where the options are used).
  f = compilation.jit(lambda v: v * 2.5 + 1.0)
  np.testing.assert_array_equal(np.asarray(f(x + 1.0)), [3.5, 6.0, 8.5])


def test_the_garbage_collector_is_paused_while_compiling_and_restored(monkeypatch):
  # Eager entry points trace and compile with Python's cyclic collector off (a full collection
  # during a first call costs ~50-60 ms), then restore it: on if it was on, off if the user
  # had switched it off, also when the compilation fails. (Only while no other Python thread
  # runs, tests/test_dispatch.py; pytest-xdist's workers run threads of their own.)
  import gc

  import numpy as np

  from jaxrdp._internal import compilation
  monkeypatch.setattr(compilation, "_other_threads", lambda: False)
  seen = []

  def traced(v):
    seen.append(gc.isenabled())
    return v + 1.0

  assert gc.isenabled()
  np.testing.assert_array_equal(np.asarray(compilation.jit(traced)(np.arange(2.0))), [1.0, 2.0])
  assert seen == [False] and gc.isenabled()

  def failing(v):
    raise RuntimeError("trace failed")
  try:
    compilation.jit(failing)(np.arange(2.0))
  except RuntimeError:
    pass
  assert gc.isenabled()

  gc.disable()
  try:
    seen.clear()
    compilation.jit(traced)(np.arange(3.0))
    assert seen == [False] and not gc.isenabled()
  finally:
    gc.enable()


def test_the_garbage_collector_is_paused_while_an_entry_point_is_traced_in_a_users_jit(
    monkeypatch):
  # Inside a user's jax.jit (and jax.vmap) an entry point's body is traced with the collector
  # off as well, then it is restored: on if it was on, off if the user had switched it off.
  import gc

  import jax
  import numpy as np

  from jaxrdp._internal import compilation
  monkeypatch.setattr(compilation, "_other_threads", lambda: False)
  seen = []

  def traced(v):
    seen.append(gc.isenabled())
    return v + 1.0

  f = compilation.jit(traced)
  x = np.arange(2.0)
  assert gc.isenabled()
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: f(v) * 2.0)(x)), [2.0, 4.0])
  assert seen == [False] and gc.isenabled()
  np.testing.assert_array_equal(np.asarray(jax.vmap(f)(x)), [1.0, 2.0])
  assert seen == [False, False] and gc.isenabled()
  gc.disable()
  try:
    jax.jit(lambda v: f(v) * 3.0)(np.arange(3.0))   # a new shape: traced again
    assert seen == [False, False, False] and not gc.isenabled()
  finally:
    gc.enable()
