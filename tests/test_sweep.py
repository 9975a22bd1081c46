"""jaxrdp.sweep and jaxrdp.sweep_noise_multiplier: every cell agrees with the one-configuration
functions (dpsgd_epsilon with refine_order=False, calibrate_noise_multiplier).

Tolerances. The sweep runs the same kernel, composition and conversion as dpsgd_epsilon, but
not the same compiled program: dpsgd_epsilon evaluates one (q, σ) pair, which XLA compiles
with q and σ as broadcast scalars and simplifies accordingly (e.g. x / broadcast(σ²) becomes
x · broadcast(1/σ²)), while the sweep evaluates blocks of pairs. The per-step RDP then
differs in its last bits (measured: ~70 % of cells bitwise equal, the rest within 15 ulps of
ε), far inside the 256-ulp allowance the conversion adds to the kernel's values. The tests
therefore state ``rtol = 64 ulps``. Within the sweep (chunk sizes, sub-grids) results are
bitwise identical: pairs always go through the kernel in blocks of one fixed size.

Shapes are shared between tests (module fixtures, the same grid sizes in test_cli_sweep.py)
because each new chunk shape compiles the kernel again (seconds).
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrdp
from jaxrdp.accounting.sweep import sweep, sweep_noise_multiplier

# 4 x 3 x 3 x 2 = 72 cells, with the exact special cases q = 0, q = 1, sigma = 0 and T = 0.
Q = np.array([0.0, 1e-3, 0.05, 1.0])
SIGMA = np.array([0.0, 0.8, 2.5])
T = np.array([0.0, 10.0, 5000.0])
DELTA = np.array([1e-5, 1e-10])
ULPS = 64


def _reference(q, sigma, steps, delta):
  """dpsgd_epsilon(refine_order=False) per cell; NaN where sigma = 0 (checked separately: the
  order search of dpsgd_epsilon does not terminate when the RDP is +inf at every order)."""
  out = np.full((q.size, sigma.size, steps.size, delta.size), np.nan, q.dtype)
  for i, j, k, l in np.ndindex(out.shape):
    if sigma[j] > 0:
      out[i, j, k, l] = jaxrdp.dpsgd_epsilon(q[i], sigma[j], steps[k], delta[l],
                                             refine_order=False)
  return out


def _assert_close_where_defined(got, ref):
  defined = ~np.isnan(ref)
  np.testing.assert_allclose(got[defined], ref[defined],
                             rtol=ULPS * np.finfo(got.dtype).eps, atol=0)


@pytest.fixture(scope="module")
def eps64():
  return np.asarray(sweep(Q, SIGMA, T, DELTA))


@pytest.fixture(scope="module")
def eps32():
  f32 = lambda v: v.astype(np.float32)
  return np.asarray(sweep(f32(Q), f32(SIGMA), f32(T), f32(DELTA)))


def test_shape_and_dtype(eps64):
  assert eps64.shape == (4, 3, 3, 2) and eps64.dtype == np.float64
  assert isinstance(sweep(Q, SIGMA, T, DELTA), jax.Array)


def test_every_cell_equals_dpsgd_epsilon_on_the_grid_orders(eps64):
  _assert_close_where_defined(eps64, _reference(Q, SIGMA, T, DELTA))
  # The special cases are exact: q = 0 or T = 0 spend nothing, sigma = 0 (q > 0, T > 0) is inf.
  assert np.all(eps64[0] == 0) and np.all(eps64[:, :, 0] == 0)
  assert np.all(np.isinf(eps64[1:, 0, 1:]))


def test_entries_left_open_by_the_shared_nodes_are_filled():
  # Tiny sigma: the shared-node quadrature, even refined to 4097 nodes, leaves some (pair,
  # order) entries of the default grid uncertified at sigma = 0.01; the sweep fills them with
  # the per-order kernel, as dpsgd_epsilon does in its own program.
  q, sigma = np.array([0.3, 0.5, 0.01, 0.9]), np.array([0.25, 0.3, 0.01])
  from jaxrdp.mechanisms import sampled_gaussian
  split = sampled_gaussian.order_split(jaxrdp.DEFAULT_ORDERS)
  tables = sampled_gaussian.order_tables(jaxrdp.DEFAULT_ORDERS, split)
  pending = jax.jit(lambda a, b: sampled_gaussian.log_a_and_rdp_at_orders(
      a, b, jnp.asarray(jaxrdp.DEFAULT_ORDERS), split, tables, fallback=False)[2])(
          np.repeat(q, 3), np.tile(sigma, 4))
  assert np.asarray(pending).any()
  got = np.asarray(sweep(q, sigma, T, DELTA))
  _assert_close_where_defined(got, _reference(q, sigma, T, DELTA))
  assert np.all(np.isfinite(got[:, :, 1:]))


def test_chunk_size_and_grid_do_not_change_results(eps64):
  # 7 x 9 = 63 pairs (blocks of 24 pairs on CPU): one call of 72 pairs by default, two of 48
  # with chunk_size=48. The grid contains the module's grid, whose values must not change.
  q = np.sort(np.concatenate([Q, [1e-4, 0.2, 0.6]]))
  sigma = np.sort(np.concatenate([SIGMA, [0.5, 1.1, 1.7, 4.0, 7.0, 20.0]]))
  default = np.asarray(sweep(q, sigma, T, DELTA))
  np.testing.assert_array_equal(np.asarray(sweep(q, sigma, T, DELTA, chunk_size=48)), default)
  np.testing.assert_array_equal(default[np.ix_(np.isin(q, Q), np.isin(sigma, SIGMA))], eps64)


def test_float32_inputs_compute_in_float32(eps32, eps64):
  assert eps32.dtype == np.float32
  f32 = lambda v: v.astype(np.float32)
  _assert_close_where_defined(eps32, _reference(f32(Q), f32(SIGMA), f32(T), f32(DELTA)))
  # Never below the float64 value (the float32 conversion adds its larger rounding allowance).
  assert np.all(eps32.astype(np.float64) >= eps64 * (1 - 1e-7))
  assert np.array_equal(np.isinf(eps32), np.isinf(eps64))


def test_inverse_sweep_equals_calibrate_noise_multiplier_per_cell():
  # 1e16 steps at q = 1 spend RDP α/2 even at σ = 1e8 (the largest searched): a target of 0.5
  # is then unreachable (NaN expected; calibrate_noise_multiplier raises ValueError).
  targets, q, steps, delta = np.array([0.5, 3.0, 1e-3]), np.array([0.01, 1.0]), \
      np.array([100.0, 1e16]), np.array([1e-5])
  got = np.asarray(sweep_noise_multiplier(targets, deltas=delta, sampling_rates=q, steps=steps))
  assert got.shape == (3, 2, 2, 1) and got.dtype == np.float64
  for e, i, k, l in np.ndindex(got.shape):
    try:
      ref = float(jaxrdp.calibrate_noise_multiplier(targets[e], delta[l], q[i], steps[k]))
    except ValueError:   # not reachable: the sweep reports NaN
      assert np.isnan(got[e, i, k, l]), (e, i, k, l)
      continue
    # Same search; the last bits of ε(σ) may differ (see the module docstring), which can move
    # the final regula-falsi step within the search's bracket of 1e-9 (relative).
    assert got[e, i, k, l] == pytest.approx(ref, rel=1e-9), (e, i, k, l)
    # And the σ found meets the target (the same grid-order ε, up to those last bits).
    eps = jaxrdp.dpsgd_epsilon(q[i], got[e, i, k, l], steps[k], delta[l], refine_order=False)
    assert float(eps) <= targets[e] * (1 + 1e-13)
  assert np.isnan(got).sum() >= 1 and np.isfinite(got).sum() >= 6


def test_inverse_sweep_searches_again_where_the_shared_nodes_leave_a_value_open(monkeypatch):
  # A target of 300 for one step needs sigma ~ 0.05, where the shared nodes leave some values
  # of the default grid open: the cell's search runs again, calibrate_noise_multiplier's
  # (the per-order quadrature fills them), with its answer, for those cells only.
  from jaxrdp.accounting import sweep as sweep_module
  from jaxrdp.mechanisms import sampled_gaussian
  grid = np.asarray(jaxrdp.DEFAULT_ORDERS)
  split = sampled_gaussian.order_split(grid)
  targets, q = np.array([20.0, 300.0]), np.array([0.01, 0.5])
  cells = [(e, s) for e in targets for s in q]
  args = [np.array(v, float) for v in zip(*cells)]
  _, is_open = sweep_module._search_fn(sweep_module._mesh(None), 24, split)(
      *(np.resize(v, 24) for v in (args[0], args[1], np.ones(4), np.full(4, 1e-5))), grid,
      sampled_gaussian.order_tables(grid, split))
  assert not np.asarray(is_open)[:2].any() and np.asarray(is_open)[2:4].all()
  again = []
  host = sweep_module._host_calibration
  monkeypatch.setattr(sweep_module, "_host_calibration",
                      lambda unknown, target, *rest: again.append(float(target)) or
                      host(unknown, target, *rest))
  got = np.asarray(sweep_noise_multiplier(targets, deltas=np.array([1e-5]), sampling_rates=q,
                                          steps=np.array([1.0])))
  assert again == [300.0, 300.0]
  for (e, i) in np.ndindex(2, 2):
    ref = float(jaxrdp.calibrate_noise_multiplier(targets[e], 1e-5, q[i], 1.0))
    assert got[e, i, 0, 0] == pytest.approx(ref, rel=1e-9), (e, i)


def test_inverse_sweep_cells_do_not_depend_on_the_grid_with_a_short_order_grid():
  # A short order grid gets blocks of at most 32 searches on CPU (not 4096 / 6 = 682, which
  # made a small grid almost all padding), still of a fixed size: a cell is the same, bitwise,
  # whether computed in a small grid or in a larger one that contains it, and meets its target.
  orders = np.array([2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
  kw = dict(deltas=np.array([1e-5]), orders=orders)
  small = np.asarray(sweep_noise_multiplier(np.array([1.0, 4.0]), sampling_rates=np.array([0.01]),
                                            steps=np.array([1000.0]), **kw))
  large = np.asarray(sweep_noise_multiplier(np.array([0.5, 1.0, 2.0, 4.0]),
                                            sampling_rates=np.array([0.001, 0.01, 0.1]),
                                            steps=np.array([100.0, 1000.0, 10_000.0]), **kw))
  np.testing.assert_array_equal(small[:, 0, 0, 0], large[[1, 3], 1, 1, 0])
  for sigma, target in zip(small[:, 0, 0, 0], (1.0, 4.0)):
    eps = jaxrdp.dpsgd_epsilon(0.01, sigma, 1000, 1e-5, orders=orders, refine_order=False)
    assert float(eps) <= target * (1 + 1e-13)


def test_progress_bar(eps64, capsys):
  import tqdm  # noqa: F401  (a test extra: the progress path always runs)
  np.testing.assert_array_equal(np.asarray(sweep(Q, SIGMA, T, DELTA, progress=True)), eps64)
  assert "72" in capsys.readouterr().err   # tqdm writes cells done / total to stderr


def test_progress_without_tqdm_is_a_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "tqdm", None)
  monkeypatch.setitem(sys.modules, "tqdm.auto", None)
  with pytest.raises(ImportError, match="pip install tqdm"):
    sweep(Q, SIGMA, T, DELTA, progress=True)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(sampling_rates=[0.1, 1.5]), ValueError, r"sampling_rates must lie in \[0.0, 1.0\]"),
    (dict(sampling_rates=0.1), ValueError, "sampling_rates must be a 1-D array"),
    (dict(sampling_rates=[[0.1]]), ValueError, r"sampling_rates must be a 1-D array.*\(1, 1\)"),
    (dict(sampling_rates=[]), ValueError, "sampling_rates must not be empty"),
    (dict(noise_multipliers=[-1.0]), ValueError, r"noise_multipliers must lie in \[0.0, inf\]"),
    (dict(noise_multipliers=[np.nan]), ValueError, "noise_multipliers"),
    (dict(steps=[-5.0]), ValueError, r"steps must lie in \[0.0, inf\]"),
    (dict(deltas=[1.0]), ValueError, r"deltas must lie in \(0.0, 1.0\)"),
    (dict(deltas=[0.0]), ValueError, "deltas"),
    (dict(deltas=None), TypeError, "deltas is required"),
    (dict(steps=["10"]), TypeError, "steps must be a real number"),
    (dict(noise_multipliers=[1 + 1j]), TypeError, "noise_multipliers"),
    (dict(chunk_size=0), ValueError, r"chunk_size must be a positive int \(>= 1\), got 0"),
    (dict(chunk_size=2.5), TypeError, "chunk_size must be a positive int"),
    (dict(chunk_size=True), TypeError, "chunk_size"),
    (dict(orders=[0.5, 2.0]), ValueError, r"orders must lie in \[1.0, inf\]"),
    (dict(orders=[[2.0]]), ValueError, "orders must be a 1-D array"),
    (dict(devices=[]), ValueError, "devices must not be empty"),
])
def test_bad_input_raises_naming_the_argument(kwargs, error, match):
  args = dict(sampling_rates=[0.01], noise_multipliers=[1.0], steps=[10.0], deltas=[1e-5])
  args.update(kwargs)
  with pytest.raises(error, match=match):
    sweep(**args)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(target_epsilons=[0.0]), ValueError, r"target_epsilons must lie in \(0.0, inf\]"),
    (dict(target_epsilons=[np.inf]), ValueError, "target_epsilons"),
    (dict(sampling_rates=[-0.1]), ValueError, "sampling_rates"),
    (dict(steps=[[10.0]]), ValueError, "steps must be a 1-D array"),
    (dict(deltas=[2.0]), ValueError, "deltas"),
    (dict(chunk_size=-3), ValueError, "chunk_size"),
])
def test_inverse_bad_input_raises_naming_the_argument(kwargs, error, match):
  args = dict(target_epsilons=[1.0], deltas=[1e-5], sampling_rates=[0.01], steps=[10.0])
  args.update(kwargs)
  with pytest.raises(error, match=match):
    sweep_noise_multiplier(**args)


def test_tracing_is_a_clear_error():
  with pytest.raises(TypeError, match="cannot be traced"):
    jax.jit(lambda q: sweep(q, [1.0], [10.0], [1e-5]))(jnp.array([0.01]))
