"""Schedules, the refined optimal order, envelope gradients and calibration (jaxrdp.accounting)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrdp
from jaxrdp.accounting import dpsgd as accounting
from jaxrdp.accounting import epsilon   # where the search's globals are looked up (patched)

Q, SIGMA, T, DELTA = 0.01, 1.1, 10_000.0, 1e-5


def _grid_eps(q, sigma, t, delta, orders=jaxrdp.DEFAULT_ORDERS):
  rdp = jnp.sum(jnp.atleast_2d(jaxrdp.compute_rdp(q, sigma, t, orders)), axis=0)
  return float(jaxrdp.compute_epsilon(orders, rdp, delta)[0])


def test_without_refinement_equals_compute_epsilon_on_the_grid():
  # The order search converts order by order (not all orders in one call): the same value up
  # to the last ulp or two.
  grid = _grid_eps(Q, SIGMA, T, DELTA)
  assert float(accounting.dpsgd_epsilon(Q, SIGMA, T, DELTA, refine_order=False)) == pytest.approx(
      grid, rel=1e-15, abs=0)


def test_refined_order_is_tighter_than_the_grid_but_not_below_the_continuous_optimum():
  grid = _grid_eps(Q, SIGMA, T, DELTA)
  refined = float(accounting.dpsgd_epsilon(Q, SIGMA, T, DELTA))
  assert refined <= grid
  dense = np.linspace(4.0, 5.5, 3001)  # brackets the optimum (grid optimum is 4.7)
  assert refined >= _grid_eps(Q, SIGMA, T, DELTA, orders=dense) - 1e-9


def test_classic_conversion_is_the_published_formula():
  # method="classic": ε = min over the grid of Σ T_i RDP_i(α) + log(1/δ)/(α − 1) (Mironov 2017,
  # Prop. 3; TF Privacy's tutorials, Abadi et al. 2016), here in NumPy from compute_rdp's curve;
  # never below the default (improved) conversion; the same under jit and what the CLI prints.
  from jaxrdp.cli import commands as cli
  grid = jaxrdp.DEFAULT_ORDERS
  for q, sigma, steps, delta in [(0.01, 1.1, 10_000, 1e-5), ((0.02, 0.005), (0.9, 1.6), (300, 4000), 1e-6)]:
    rdp = np.asarray(jaxrdp.compute_rdp(np.atleast_1d(q)[:, None] * 1.0, np.atleast_1d(sigma)[:, None],
                                        np.atleast_1d(steps)[:, None] * 1.0, grid)).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
      want = np.min(np.where(grid > 1, rdp - np.log(delta) / (grid - 1), np.inf))
    got = float(jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, method="classic"))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got >= float(jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, refine_order=False))
  jitted = jax.jit(lambda s: jaxrdp.dpsgd_epsilon(0.02, s, 4000, 1e-6, method="classic"))
  np.testing.assert_allclose(float(jitted(jnp.asarray(1.6))),
                             float(jaxrdp.dpsgd_epsilon(0.02, 1.6, 4000, 1e-6, method="classic")),
                             rtol=1e-13)
  np.testing.assert_allclose(cli.epsilons(0.01, 1.1, 10_000, 1e-5)[3],
                             float(jaxrdp.dpsgd_epsilon(0.01, 1.1, 10_000, 1e-5, method="classic")),
                             rtol=1e-13)
  # Differentiable: d ε/d σ against central differences.
  f = lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 10_000, 1e-5, method="classic")
  h = 1e-6
  np.testing.assert_allclose(float(jax.grad(f)(1.1)), (float(f(1.1 + h)) - float(f(1.1 - h))) / (2 * h),
                             rtol=1e-6)
  with pytest.raises(ValueError, match="method must be one of"):
    jaxrdp.dpsgd_epsilon(0.01, 1.1, 10_000, 1e-5, method="tight")
  # Under jit, an invalid δ gives NaN, never a number (the classic formula alone gives 0 at δ = 2).
  assert np.isnan(float(jax.jit(lambda d: jaxrdp.dpsgd_epsilon(0.01, 1.1, 10_000, d,
                                                               method="classic"))(2.0)))


def test_phases_compose_by_addition():
  split = accounting.dpsgd_epsilon(jnp.array([Q, Q]), SIGMA, jnp.array([T / 2, T / 2]), DELTA, refine_order=False)
  assert float(split) == pytest.approx(_grid_eps(Q, SIGMA, T, DELTA), rel=1e-13)
  qs, sigmas, ts = jnp.array([0.01, 0.02, 0.005]), jnp.array([1.0, 1.5, 0.8]), jnp.array([100.0, 300.0, 50.0])
  eps = float(accounting.dpsgd_epsilon(qs, sigmas, ts, DELTA, refine_order=False))
  assert eps == pytest.approx(_grid_eps(qs, sigmas, ts, DELTA), rel=1e-13)


def test_gradients_match_finite_differences():
  # A three-phase schedule; every entry of q and sigma gets its own derivative (envelope
  # gradient at the optimal order), checked by central differences in float64.
  q = jnp.array([0.01, 0.02, 0.005])
  sigma = jnp.array([1.0, 1.5, 0.8])
  t = jnp.array([100.0, 300.0, 50.0])
  f = lambda q_, s_: accounting.dpsgd_epsilon(q_, s_, t, DELTA)
  grads = jax.grad(f, argnums=(0, 1))(q, sigma)
  h = 1e-6
  for arg, grad in enumerate(grads):
    for i in range(3):
      step = jnp.zeros(3).at[i].set(h)
      plus = [q, sigma]
      minus = [q, sigma]
      plus[arg] = plus[arg] + step
      minus[arg] = minus[arg] - step
      fd = (float(f(*plus)) - float(f(*minus))) / (2 * h)
      assert float(grad[i]) == pytest.approx(fd, rel=2e-4, abs=1e-8)


def test_calibrated_noise_multiplier_is_safe_and_tight():
  sigma = float(accounting.calibrate_noise_multiplier(2.0, DELTA, Q, T))
  assert float(accounting.dpsgd_epsilon(Q, sigma, T, DELTA, refine_order=False)) <= 2.0
  assert float(accounting.dpsgd_epsilon(Q, sigma * (1 - 1e-6), T, DELTA, refine_order=False)) > 2.0


def test_calibration_jits_and_vmaps_over_targets():
  targets = jnp.array([1.0, 2.0, 8.0])
  sigmas = jax.jit(jax.vmap(lambda e: accounting.calibrate_noise_multiplier(e, DELTA, Q, 1000.0)))(targets)
  assert np.all(np.diff(np.asarray(sigmas)) < 0)
  for e, s in zip(targets, sigmas):
    assert float(accounting.dpsgd_epsilon(Q, s, 1000.0, DELTA, refine_order=False)) <= float(e)


def _central_difference(f, x, h):
  return (float(f(x + h)) - float(f(x - h))) / (2 * h)


def test_calibrations_are_differentiable_by_the_implicit_function_theorem():
  # Reverse mode raised (the search's loop cannot be transposed); the derivative is
  # -(∂ε/∂x)/(∂ε/∂σ) at the answer. Against central differences of the calibration itself
  # (its bracket closes to 1e-9 relative: differences over 1e-5 are good to ~1e-6).
  sigma = lambda e, d, q, t: accounting.calibrate_noise_multiplier(e, d, q, t)
  args = (2.0, 1e-5, 0.01, 1000.0)
  grads = jax.grad(sigma, argnums=(0, 1, 2, 3))(*args)
  jitted = jax.jit(jax.grad(sigma, argnums=(0, 1, 2, 3)))(*args)
  np.testing.assert_allclose(jitted, grads, rtol=1e-10)
  for i, g in enumerate(grads):
    x = args[i]
    f = lambda v: sigma(*args[:i], v, *args[i + 1:])
    np.testing.assert_allclose(g, _central_difference(f, x, 1e-5 * x), rtol=1e-5)
  np.testing.assert_allclose(jax.jvp(lambda e: sigma(e, *args[1:]), (2.0,), (1.0,))[1],
                             grads[0], rtol=1e-12)
  rate = lambda e: accounting.calibrate_sampling_rate(e, 1e-5, 1.1, 1000.0)
  np.testing.assert_allclose(jax.grad(rate)(2.0), _central_difference(rate, 2.0, 2e-5),
                             rtol=1e-5)
  targets = jnp.array([1.0, 2.0, 4.0])
  batched = jax.jit(jax.vmap(jax.grad(lambda e: sigma(e, *args[1:]))))(targets)
  np.testing.assert_allclose(batched, [jax.grad(lambda e: sigma(e, *args[1:]))(e)
                                       for e in targets], rtol=1e-10)
  assert np.isnan(jax.hessian(lambda e: sigma(e, *args[1:]))(2.0))   # first order only
  # An answer at the end of the range, below the target there, stays put: q = 1.
  at_one = lambda e: accounting.calibrate_sampling_rate(e, 1e-5, 5.0, 10.0)
  assert float(at_one(20.0)) == 1.0 and float(jax.grad(at_one)(20.0)) == 0.0


def test_calibrated_sampling_rate_and_steps_are_safe_and_tight():
  q = float(accounting.calibrate_sampling_rate(2.0, DELTA, 1.0, T))
  assert float(accounting.dpsgd_epsilon(q, 1.0, T, DELTA, refine_order=False)) <= 2.0
  assert float(accounting.dpsgd_epsilon(q * (1 + 1e-6), 1.0, T, DELTA, refine_order=False)) > 2.0
  steps = float(accounting.calibrate_steps(2.0, DELTA, Q, 1.0))
  assert steps == int(steps) > 0
  assert float(accounting.dpsgd_epsilon(Q, 1.0, steps, DELTA, refine_order=False)) <= 2.0
  assert float(accounting.dpsgd_epsilon(Q, 1.0, steps + 1, DELTA, refine_order=False)) > 2.0


def test_unreachable_targets_raise():
  with pytest.raises(ValueError, match="target_epsilon"):
    accounting.calibrate_steps(1e-6, DELTA, 0.5, 0.5)
  with pytest.raises(ValueError, match="target_epsilon"):
    accounting.calibrate_noise_multiplier(-1.0, DELTA, Q, T)
  with pytest.raises(ValueError, match="sampling_rate"):
    accounting.dpsgd_epsilon(jnp.array([0.1, 1.5]), 1.0, 10.0, DELTA)
  with pytest.raises(ValueError, match="broadcast"):
    accounting.dpsgd_epsilon(jnp.array([0.1, 0.2]), jnp.array([1.0, 1.0, 1.0]), 10.0, DELTA)


SCHEDULES = [
    (0.01, 1.1, 10_000.0, 1e-5),
    (np.array([0.01, 0.02, 0.005]), np.array([1.0, 1.5, 0.8]), np.array([100.0, 300.0, 50.0]), 1e-6),
    (0.3, 0.7, 50.0, 1e-8),
    (1e-4, 5.0, 1e5, 1e-6),
]


@pytest.mark.parametrize("schedule", [0] + [pytest.param(i, marks=pytest.mark.slow)
                                          for i in range(1, len(SCHEDULES))])
def test_the_grid_search_equals_the_branch_and_bound_search(schedule):
  # A concrete grid is searched by evaluating every order (exact sums, shared nodes) and
  # refining in slots of the same program, from the host; a traced grid by branch and bound
  # with the per-order quadrature; jax.jit with a concrete grid runs the grid search as one
  # loop, with the per-order fallback inside. The same ε (to the kernels' rounding); the
  # refinements differ (the branch and bound: steps of 8 orders; the grid search: steps of rows
  # of shared nodes, 96 orders on the default grid), so the orders agree to their resolution
  # (the bracket, a grid spacing wide, narrowed at least 8,300 times), and ε to what that
  # resolution leaves at a quadratic minimum: the grid search's finer order is never worse
  # (to 1e-12), the branch and bound's is within 1e-7. At q = 1e-4, σ = 5, T = 10⁵ the spacing
  # near α = 459 is 16, the resolution 0.002, and ε'' ≈ 1.5e-4 (measured: ε rises 7.3e-11
  # over Δα = 0.001), so ε/ε* − 1 ≈ ½ ε'' Δα² / ε* = 1.1e-8 there; ≤ 6e-12 in the other cases.
  q, s, t, d = SCHEDULES[schedule]
  q, s, t = accounting.schedule_phases(q, s, t)
  d = np.asarray(d)
  grid = np.asarray(jaxrdp.DEFAULT_ORDERS)
  eps_bb, best_bb = (float(v) for v in accounting._search_epsilon(q, s, t, d, jnp.asarray(grid), True))
  eps, best = (float(v) for v in accounting._concrete_epsilon(q, s, t, d, grid, True))
  assert eps <= eps_bb * (1 + 1e-12), (eps, eps_bb)
  assert eps_bb <= eps * (1 + 1e-7), (eps, eps_bb)
  assert best == pytest.approx(best_bb, rel=1e-5, abs=0)
  if q.shape == (1,):   # (one compiled program for the constant schedules)
    jitted = float(jax.jit(accounting.dpsgd_epsilon)(q, s, t, d))
    assert jitted == pytest.approx(eps, rel=1e-12, abs=0)
  assert float(accounting.dpsgd_epsilon(q, s, t, d)) == eps


def test_an_open_value_is_filled_by_the_per_order_quadrature(monkeypatch):
  q, s, t = accounting.schedule_phases(Q, SIGMA, T)
  grid = np.asarray(jaxrdp.DEFAULT_ORDERS)
  expected = [float(v) for v in accounting._concrete_epsilon(q, s, t, np.asarray(DELTA), grid, True)]
  calls = []
  evaluate = epsilon._grid_evaluation

  def leave_one_open(*args, **kwargs):
    rdp, pending, eps = evaluate(*args, **kwargs)
    calls.append(1)   # as if nothing could be certified: every value +inf and open
    return jnp.full_like(rdp, jnp.inf), jnp.ones_like(pending), jnp.full_like(eps, jnp.inf)

  monkeypatch.setattr(epsilon, "_grid_evaluation", leave_one_open)
  got = [float(v) for v in accounting._concrete_epsilon(q, s, t, np.asarray(DELTA), grid, True)]
  assert calls
  assert got[0] == pytest.approx(expected[0], rel=1e-12, abs=0)
  # The order to the refinement's precision (its last bracket, a 10^6th of the grid's two
  # spacings of 0.1 around the best grid order): ε is flat there, so values of the two
  # kernels that differ by ~1e-14 may place the model's last windows differently in it.
  assert got[1] == pytest.approx(expected[1], abs=2e-6 * 0.1)


@pytest.mark.parametrize("alpha", [4.6714502644696205, 5.0, 37.5])
def test_the_gradient_at_a_concrete_order_equals_the_per_order_gradient(alpha):
  # Eager envelope gradients come from the exact sum (integer order) or the shared nodes'
  # own derivatives (fractional), in forward mode; the per-order quadrature's reverse-mode
  # gradient is the reference.
  q, s, t = accounting.schedule_phases(np.array([0.01, 0.2]), np.array([1.1, 3.0]), np.array([1e4, 30.0]))
  d = np.asarray(1e-5)
  new = accounting._concrete_gradient(np.asarray(alpha), q, s, t, d)
  old = accounting._epsilon_gradient(jnp.asarray(alpha), q, s, t, d)
  for a, b in zip(new, old):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=0)


def test_calibration_on_the_grid_equals_the_branch_and_bound_calibration():
  q, _, t = accounting.schedule_phases(Q, 1.0, T)
  grid = jnp.asarray(jaxrdp.DEFAULT_ORDERS)
  old = float(accounting.calibrate_sigma_unchecked(jnp.asarray(2.0), jnp.asarray(DELTA), q, t, grid))
  new = float(jaxrdp.calibrate_noise_multiplier(2.0, DELTA, Q, T))
  assert new == pytest.approx(old, rel=1e-8)
  assert _grid_eps(Q, new, T, DELTA) <= 2.0


@pytest.mark.parametrize("refine", [False, True])
def test_long_schedules_prune_orders_without_changing_epsilon(refine, monkeypatch):
  # A long schedule evaluates only the grid orders whose bound (phases binned by σ, RDP
  # monotone in q and σ) can still reach the minimum, and refines in windows of 16 orders:
  # the same grid ε as evaluating the whole grid (to the kernels' rounding), and a refined ε
  # within the refinements' resolution of the whole grid's search (8 orders a step).
  rng = np.random.default_rng(3)
  n = 200
  q = np.exp(rng.uniform(np.log(1e-3), np.log(0.05), n))
  sigma = rng.uniform(0.7, 2.0, n)
  t = rng.integers(1, 50, n).astype(float)
  grid = np.asarray(jaxrdp.DEFAULT_ORDERS)
  assert n > epsilon._BINNED_PHASES
  # Which search ran, so that a patch that did not take cannot pass as agreement.
  binned, calls = epsilon._binned_search, []
  monkeypatch.setattr(epsilon, "_binned_search", lambda *a: calls.append(1) or binned(*a))
  pruned = float(accounting._concrete_epsilon(q, sigma, t, np.asarray(1e-6), grid, refine)[0])
  assert calls
  calls.clear()
  monkeypatch.setattr(epsilon, "_BINNED_PHASES", np.inf)
  whole = float(accounting._concrete_epsilon(q, sigma, t, np.asarray(1e-6), grid, refine)[0])
  assert not calls
  assert pruned == pytest.approx(whole, rel=1e-12 if not refine else 1e-9, abs=0)


def test_dpsgd_epsilon_under_jit_of_vmap_over_steps_equals_eager_calls():
  # Regression: the concrete order grid reached the inlined search as a NumPy array and was
  # indexed with a traced index (found while writing examples/train_dpsgd_pld.py).
  with jax.enable_x64(True):
    steps = jnp.array([50.0, 100.0])
    batched = jax.jit(jax.vmap(lambda t: jaxrdp.dpsgd_epsilon(0.0445, 2.9, t, 1e-5)))(steps)
    eager = [float(jaxrdp.dpsgd_epsilon(0.0445, 2.9, float(t), 1e-5)) for t in steps]
    np.testing.assert_allclose(np.asarray(batched), eager, rtol=1e-10)


@pytest.mark.parametrize("kind", ["decaying", "mixed_q", "small_sigma", "large_q"])
def test_long_schedules_windows_reach_the_full_search(kind, monkeypatch):
  # The refined ε of a long schedule (two windows of 8 orders, placed by a stand-in schedule
  # and a model of log R) against the full grid search with its own refinement: within 1e-9
  # (measured: within 1.2e-10 on 42 random schedules of these kinds), and never above the
  # grid's minimum. "mixed_q" (q and σ independent) misplaces the first window by several
  # grid orders (the windows walk), "small_sigma" has R growing as e^(α/σ²).
  rng = np.random.default_rng(11)
  n = 150
  q, sigma = {
      "decaying": (np.full(n, 0.004), np.linspace(2.0, 0.7, n)),
      "mixed_q": (np.exp(rng.uniform(np.log(1e-3), np.log(0.05), n)), rng.uniform(0.7, 2.0, n)),
      "small_sigma": (np.full(n, 1e-4), rng.uniform(0.4, 0.8, n)),
      "large_q": (rng.uniform(0.2, 1.0, n), rng.uniform(5, 50, n)),
  }[kind]
  t = rng.integers(1, 50, n).astype(float)
  grid = np.asarray(jaxrdp.DEFAULT_ORDERS)
  delta = np.asarray(1e-7)
  windowed = float(accounting._concrete_epsilon(q, sigma, t, delta, grid, True)[0])
  grid_min = float(accounting._concrete_epsilon(q, sigma, t, delta, grid, False)[0])
  monkeypatch.setattr(epsilon, "_BINNED_PHASES", np.inf)
  whole = float(accounting._concrete_epsilon(q, sigma, t, delta, grid, True)[0])
  assert windowed == pytest.approx(whole, rel=1e-9, abs=0)
  assert windowed <= grid_min
