"""The eager dispatch layer (jaxrdp._internal.compilation) leaves no global side effects.

Each test fails without the fix it names: a failed background compilation is evicted, not
re-raised forever; JAX settings that change results are honoured (plain ``jax.jit``), not
ignored by an executable compiled for the defaults; a user's ``jax.disable_jit()`` runs the
body op by op; a collector another thread switched off stays off; the background compilers
can be shut down (and are, at exit); ``JAXRDP_PLAIN_JIT=1`` makes every entry point a plain
``jax.jit`` with the same values. Where the default backend is an accelerator, small eager calls
run on the host's CPU device, large ones and those under a chosen default device where JAX puts
them.
"""

import gc
import os
import pathlib
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrdp._internal import compilation

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def dispatch_layer_on(monkeypatch):
  """The entry points made by these tests use the dispatch layer, also in a
  ``JAXRDP_PLAIN_JIT=1`` run of the suite (the switch is read when an entry point is made)."""
  monkeypatch.setattr(compilation, "plain_jit", lambda: False)


def test_a_failed_background_compilation_is_compiled_again(monkeypatch):
  real = compilation._compile_with_options
  failures = []

  def fail_once(lowered):
    if not failures:
      failures.append(True)
      raise RuntimeError("compilation failed")
    return real(lowered)

  monkeypatch.setattr(compilation, "_compile_with_options", fail_once)
  f = compilation.jit(lambda v: v * 3.0 - 1.0)
  x = np.arange(4.0)
  f.prepare(x)   # compiled in the background: fails there
  with pytest.raises(RuntimeError, match="compilation failed"):
    f(x)
  np.testing.assert_array_equal(np.asarray(f(x)), x * 3.0 - 1.0)


def test_one_executable_for_numpy_uncommitted_and_committed_arguments():
  # A NumPy array, an uncommitted JAX array and one committed to the default device run the
  # same executable: keyed by the form they came in, the same program compiled once per form
  # (optimize_schedule's iterations pass committed arrays where a calibration before them
  # passed NumPy ones: ~1 s compiled twice). Another weak type or shape is another program.
  f = compilation.jit(lambda v, w: jnp.log1p(v) * w)
  v = np.linspace(0.1, 1.0, 8)
  expected = np.log1p(v) * 2.0
  for x in (v, jnp.asarray(v), jax.device_put(v, jax.devices()[0])):
    for w in (np.float64(2.0), jnp.asarray(2.0, jnp.float64)):
      np.testing.assert_allclose(np.asarray(f(x, w)), expected, rtol=1e-15)
  assert len(f.executables) == 1
  f(v, 2.0)   # weakly typed
  f(v[:4], np.float64(2.0))
  assert len(f.executables) == 3


def test_settings_that_change_results_are_honoured():
  f = compilation.jit(lambda v: jnp.log(v))
  x = np.array([-1.0, 2.0])
  assert np.isnan(np.asarray(f(x))[0])   # an executable for the default settings is cached
  with jax.debug_nans(True):
    with pytest.raises(FloatingPointError):
      f(x)
  assert np.isnan(np.asarray(f(x))[0])


def test_a_user_s_disable_jit_runs_the_body_op_by_op():
  seen = []

  def body(v):
    seen.append(isinstance(v, jax.core.Tracer))
    return v * 2.0 + 1.0

  f = compilation.jit(body)
  x = np.arange(3.0)
  expected = np.asarray(f(x))
  with jax.disable_jit():
    np.testing.assert_array_equal(np.asarray(f(x)), expected)
  assert seen == [True, False]


def test_a_collector_another_thread_switches_off_stays_off():
  go, done = threading.Event(), threading.Event()

  def other():
    go.wait(30)
    gc.disable()
    done.set()

  thread = threading.Thread(target=other)
  thread.start()

  def body(v):
    go.set()
    done.wait(30)   # the other thread switches the collector off while this compiles
    return v + 1.0

  try:
    compilation.jit(body)(np.arange(2.0))
    thread.join(30)
    assert not gc.isenabled()
  finally:
    gc.enable()


def test_the_background_compilers_shut_down():
  f = compilation.jit(lambda v: v - 2.0)
  f.prepare(np.arange(5.0))
  assert any(t.name.startswith(compilation._THREAD_PREFIX) for t in threading.enumerate())
  compilation.shutdown()
  for t in threading.enumerate():
    if t.name.startswith(compilation._THREAD_PREFIX):
      t.join(30)
  assert not any(t.name.startswith(compilation._THREAD_PREFIX) for t in threading.enumerate())
  np.testing.assert_array_equal(np.asarray(f(np.arange(5.0))), np.arange(5.0) - 2.0)


def test_plain_jit_switch_gives_plain_jax_jit_and_the_same_values():
  script = """
import jax
jax.config.update("jax_enable_x64", True)
import jaxrdp
from jaxrdp._internal import compilation
from jaxrdp.accounting import composition
value = float(jaxrdp.dpsgd_epsilon(0.01, 1.1, 1000, 1e-5))
jaxrdp.compute_rdp(0.01, 1.1, 1000, jaxrdp.DEFAULT_ORDERS)
# No ahead-of-time executable of jaxrdp's own, no background compiler: plain jax.jit.
assert not composition.compute_rdp_unchecked.executables
assert not compilation._BACKGROUND
print(repr(value))
"""
  def run(switch):
    env = dict(os.environ, JAXRDP_PLAIN_JIT=switch, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=False)
    return out
  plain = run("1")
  assert plain.returncode == 0, plain.stderr[-2000:]
  import jaxrdp   # (the suite runs in float64, tests/conftest.py)
  expected = float(jaxrdp.dpsgd_epsilon(0.01, 1.1, 1000, 1e-5))
  assert abs(float(plain.stdout.strip()) - expected) <= 1e-12 * expected


def test_compiler_options_for_a_user_s_jit_give_the_default_values():
  # jaxrdp.compiler_options(): the eager layer's CPU options for a user's own jax.jit. The
  # values are XLA's defaults' to ~1e-14 relative (they choose code generation, not arithmetic).
  import jaxrdp
  options = jaxrdp.compiler_options()
  assert options == {k: v for k, v in compilation._CPU_OPTIONS.items()
                     if k not in compilation._UNSUPPORTED}
  assert jaxrdp.compiler_options(backend="gpu") == {} and options is not jaxrdp.compiler_options()
  f = jax.value_and_grad(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 100.0, 1e-5))
  sigma = jnp.linspace(0.8, 1.6, 3)
  ours, default = (jax.jit(f, compiler_options=o)(sigma) for o in (options, None))
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(default)):
    np.testing.assert_allclose(a, b, rtol=1e-13, atol=0)


def test_compiler_options_leave_out_an_option_this_jaxlib_rejects(monkeypatch):
  monkeypatch.setattr(compilation, "_CPU_OPTIONS",
                      {**compilation._CPU_OPTIONS, "xla_no_such_option_for_jaxrdp": True})
  monkeypatch.setattr(compilation, "_UNSUPPORTED", set(compilation._UNSUPPORTED))
  monkeypatch.setattr(compilation, "_PROBED", [])
  options = compilation.compiler_options()
  assert "xla_no_such_option_for_jaxrdp" not in options
  assert jax.jit(lambda x: 2 * x, compiler_options=options)(3.0) == 6.0


def test_small_eager_calls_run_on_the_host_where_the_default_backend_is_an_accelerator(
    monkeypatch):
  # Where jax.default_backend() is a GPU or TPU, a small eager call compiles ahead of time
  # for the host's CPU device with the CPU options (an accelerator compiles it several times
  # slower and runs it no faster); a large one, one on a default device the user chose, and
  # one under a setting plain jax.jit honours stay plain jax.jit calls. (This machine has
  # only a CPU: the accelerator is its default device relabelled; run_gpu.sh checks a GPU.)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  f = compilation.jit(lambda v: jnp.expm1(v) / 3.0)
  small, large = np.linspace(0.1, 1.0, 8), np.linspace(0.1, 1.0, compilation._RUN_TIME_ELEMENTS)
  out = f(small)
  assert len(f.executables) == 1 and isinstance(out, jax.Array) and not out.committed
  assert out.devices() == {jax.devices("cpu")[0]}
  np.testing.assert_allclose(np.asarray(out), np.expm1(small) / 3.0, rtol=1e-15, atol=0)
  (key,) = f.executables
  assert str(jax.devices("cpu")[0]) in key   # compiled under the host device
  f(large)
  with jax.default_device(jax.devices()[0]):
    f(small + 1.0)
  with jax.debug_nans(True):
    f(small + 2.0)
  assert len(f.executables) == 1   # those three were plain jax.jit calls
  # prepare() compiles in the background for the host and says where the outputs will be.
  g = compilation.jit(lambda v: v * 5.0)
  (shape,) = jax.tree.leaves(g.prepare(small))
  assert shape.sharding == jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
  np.testing.assert_array_equal(np.asarray(g(small)), small * 5.0)
  assert len(g.executables) == 1


def test_public_queries_run_whole_on_the_host_where_the_default_backend_is_an_accelerator(
    monkeypatch):
  # compilation.on_host (the public accounting queries): a small eager call runs under the
  # host's CPU device, so that the operations between its compiled programs are not compiled
  # one by one for the accelerator; traced and large calls, and a chosen default device, not.
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  seen = []
  f = compilation.on_host(lambda v: seen.append(jax.config.jax_default_device) or v)
  host = jax.devices("cpu")[0]
  f(np.ones(3))
  f(np.ones(compilation._RUN_TIME_ELEMENTS))
  jax.jit(f)(np.ones(3))
  with jax.default_device(jax.devices()[0]):
    f(np.ones(3))
  assert seen == [host, None, None, jax.devices()[0]]
  import jaxrdp   # the public queries carry it (none with JAXRDP_PLAIN_JIT=1 at import)
  plain = os.environ.get("JAXRDP_PLAIN_JIT", "") not in ("", "0")
  assert hasattr(jaxrdp.dpsgd_epsilon, "__wrapped__") is not plain
  monkeypatch.undo()   # the real backend: a CPU here (nothing chosen), an accelerator elsewhere
  expected = None if jax.default_backend() == "cpu" else host
  assert compilation.on_host(lambda: jax.config.jax_default_device)() == expected
