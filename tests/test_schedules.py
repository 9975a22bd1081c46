"""Gradient-designed schedules (jaxrdp.accounting.schedules): feasibility, optimality, ε trajectories.

All schedules here have two phases, so that the optimum can be found independently by a scan
over the one free shape parameter (the ratio σ₂/σ₁), each candidate scaled onto the budget.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrdp
from jaxrdp._internal import compilation
from jaxrdp.accounting import envelope, epsilon, schedules
from jaxrdp.accounting.dpsgd import order_grid

Q = jnp.array([0.02, 0.02])
T = jnp.array([200.0, 200.0])
DELTA = 1e-5
WEIGHT = jnp.array([0.2, 1.0])    # late steps count five times more


def utility(sigma, _q):
  return jnp.sum(WEIGHT * T * sigma ** 2) / jnp.sum(WEIGHT * T)


@pytest.fixture(scope="module")
def budget():
  return float(jaxrdp.dpsgd_epsilon(Q, jnp.array([1.0, 1.0]), T, DELTA))


@pytest.fixture(scope="module")
def optimised(budget):
  return jaxrdp.optimize_schedule(utility, sampling_rate=Q, noise_multiplier=jnp.array([1.0, 1.0]),
                                  steps=T, target_epsilon=budget, delta=DELTA, num_iterations=60)


def test_result_spends_at_most_the_budget_and_sits_on_its_boundary(optimised, budget):
  eps = float(jaxrdp.dpsgd_epsilon(Q, optimised.noise_multiplier, T, DELTA))
  assert eps == pytest.approx(float(optimised.epsilon), rel=1e-12)
  assert eps <= budget
  assert eps >= budget * (1 - 1e-9)
  # Any less noise overspends.
  assert float(jaxrdp.dpsgd_epsilon(Q, optimised.noise_multiplier * (1 - 1e-8), T, DELTA)) > budget


def test_late_weighted_proxy_gives_decaying_noise_and_beats_constant(optimised):
  sigma = np.asarray(optimised.noise_multiplier)
  assert sigma[0] > sigma[1]
  assert float(optimised.utility) < float(utility(jnp.array([1.0, 1.0]), Q))
  assert float(optimised.utility) == pytest.approx(float(utility(optimised.noise_multiplier, Q)))


def test_matches_an_independent_scan_over_the_shape(optimised, budget):
  grid = order_grid(None, jnp.float64)
  best = np.inf
  for log_ratio in np.linspace(-1.0, 0.2, 25):   # σ₂/σ₁ = e^log_ratio
    theta = jnp.array([0.0, log_ratio])
    u = schedules._safe_scale(theta, 0.0, Q, schedules._epsilon_of(False, T, jnp.asarray(DELTA), grid),
                              budget)
    best = min(best, float(utility(jnp.exp(u + theta), Q)))
  # The optimiser's result is at least as good as the scan's best (within the scan's spacing).
  assert float(optimised.utility) <= best * (1 + 1e-3)


def test_epsilon_trajectory_equals_dpsgd_epsilon_of_prefixes():
  sigma = jnp.array([1.3, 0.9])
  at = np.array([0.0, 50.0, 200.0, 333.0, 400.0])
  traj = np.asarray(jaxrdp.epsilon_trajectory(Q, sigma, T, DELTA, at))
  assert traj[0] == 0.0
  for n, eps in zip(at[1:], traj[1:]):
    prefix = jnp.array([min(n, 200.0), max(0.0, n - 200.0)])
    assert eps == pytest.approx(float(jaxrdp.dpsgd_epsilon(Q, sigma, prefix, DELTA)), rel=1e-12)
  assert np.all(np.diff(traj) > 0)


def test_callback_sees_every_iteration_and_the_history(budget):
  seen = []
  result = jaxrdp.optimize_schedule(utility, sampling_rate=Q, noise_multiplier=jnp.array([1.0, 1.0]),
                                    steps=T, target_epsilon=budget, delta=DELTA, num_iterations=5,
                                    callback=lambda i, u: seen.append((i, u)))
  assert [i for i, _ in seen] == [1, 2, 3, 4, 5]
  np.testing.assert_array_equal([u for _, u in seen], result.history)


def test_a_callback_that_is_not_callable_is_refused(budget):
  with pytest.raises(TypeError, match="callback"):
    jaxrdp.optimize_schedule(utility, sampling_rate=Q, noise_multiplier=jnp.array([1.0, 1.0]),
                             steps=T, target_epsilon=budget, delta=DELTA, callback=3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(target_epsilon=0.0), "target_epsilon"),
    (dict(target_epsilon=1.0, delta=1.5), "delta"),
    (dict(target_epsilon=1.0, noise_multiplier=jnp.array([1.0, 0.0])), "noise_multiplier"),
    (dict(target_epsilon=1.0, steps=jnp.array([0.0, 0.0])), "spends no privacy"),
    (dict(target_epsilon=1.0, num_iterations=-1), "num_iterations"),
])
def test_bad_input_raises(kwargs, match):
  args = dict(sampling_rate=Q, noise_multiplier=jnp.array([1.0, 1.0]), steps=T, delta=DELTA)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    jaxrdp.optimize_schedule(utility, **args)


def test_optimiser_survives_an_infinite_epsilon_on_its_path():
  """A coarse order grid gives ε = +inf at small σ, where the Newton step onto the boundary
  once produced scale −inf and a projection loop that never ended: the step is now damped,
  and +inf / NaN steps add noise instead. Run in a subprocess, so that a regression fails
  (timeout) instead of hanging the suite."""
  import subprocess
  import sys
  code = (
      "import jax; jax.config.update('jax_enable_x64', True)\n"
      "import jax.numpy as jnp, jaxrdp\n"
      "q, s, t = jnp.array([0.01, 0.02]), jnp.array([1.0, 1.5]), jnp.array([100.0, 100.0])\n"
      "r = jaxrdp.optimize_schedule(lambda sigma, q: jnp.sum(sigma ** 2), sampling_rate=q,\n"
      "    noise_multiplier=s, steps=t, target_epsilon=2.0, delta=1e-5, orders=[2.0, 8.0, 32.0],\n"
      "    num_iterations=20)\n"
      "eps = jaxrdp.dpsgd_epsilon(q, r.noise_multiplier, t, 1e-5, orders=[2.0, 8.0, 32.0])\n"
      "print(float(eps), bool(jnp.all(jnp.isfinite(r.noise_multiplier))))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  eps, finite = out.stdout.split()
  assert finite == "True"
  assert float(eps) <= 2.0


# --- the analytic utility and designed sampling-rate schedules ---

def _noise_variance_by_steps(steps, eta, clip, n, mu, sigma, q):
  """The noise's variance in the final iterate, one step at a time (the model of
  noisy_sgd_utility written out: noise N(0, (σ_t C / (q_t N))²) at step t, damped by every
  later step's factor (1 − η_s μ))."""
  sigma_t = np.repeat(sigma, steps)
  q_t = np.repeat(q, steps)
  total = 0.0
  for t in range(len(eta)):
    damping = 1.0
    for s in range(t + 1, len(eta)):
      damping *= (1.0 - eta[s] * mu) ** 2
    total += eta[t] ** 2 * (sigma_t[t] * clip / (q_t[t] * n)) ** 2 * damping
  return total


def test_noisy_sgd_utility_is_the_variance_the_noise_leaves_step_by_step():
  rng = np.random.default_rng(3)
  steps = np.array([3, 5, 0, 2])
  eta = rng.uniform(0.05, 0.5, steps.sum())
  sigma, q = rng.uniform(0.5, 3.0, 4), rng.uniform(0.01, 0.2, 4)
  expected = _noise_variance_by_steps(steps, eta, 1.5, 700, 0.8, sigma, q)
  u = jaxrdp.noisy_sgd_utility(steps, eta, l2_norm_clip=1.5, dataset_size=700, curvature=0.8)
  assert float(u(jnp.asarray(sigma), jnp.asarray(q))) == pytest.approx(expected, rel=1e-12)
  # A callable learning rate (an optax schedule) is evaluated at steps 0, 1, ...
  as_schedule = jaxrdp.noisy_sgd_utility(steps, lambda i: eta[i], l2_norm_clip=1.5,
                                         dataset_size=700, curvature=0.8)
  assert float(as_schedule(jnp.asarray(sigma), jnp.asarray(q))) == pytest.approx(expected,
                                                                                rel=1e-12)


@pytest.mark.parametrize("design,seed,accountant", [("sampling_rate", 0, "rdp"),
                                                     ("both", 1, "rdp"), ("both", 2, "pld")])
def test_designed_sampling_rates_keep_the_gradient_count_and_spend_at_most_the_budget(
    design, seed, accountant):
  rng = np.random.default_rng(seed)
  phases = int(rng.integers(3, 6))
  steps = jnp.full(phases, 40.0)
  q0 = jnp.asarray(rng.uniform(0.01, 0.05, phases))
  sigma0 = jnp.asarray(rng.uniform(0.8, 1.5, phases))
  target = float(rng.uniform(1.0, 4.0))
  u = jaxrdp.noisy_sgd_utility(steps, 0.2, l2_norm_clip=1.0, dataset_size=2000, curvature=0.05)
  run = lambda k: jaxrdp.optimize_schedule(u, sampling_rate=q0, noise_multiplier=sigma0,
                                           steps=steps, target_epsilon=target, delta=DELTA,
                                           num_iterations=k, design=design,
                                           accountant=accountant)
  start, result = run(0), run(40 if accountant == "rdp" else 6)
  for r in (start, result):
    eps = float(jaxrdp.dpsgd_epsilon(r.sampling_rate, r.noise_multiplier, steps, DELTA,
                                     accountant=accountant))
    assert eps == pytest.approx(float(r.epsilon), rel=1e-12)
    assert target * (1 - 1e-9) <= eps <= target
    # The expected number of gradient evaluations is the initial schedule's.
    assert float(jnp.sum(r.sampling_rate * steps)) == pytest.approx(float(jnp.sum(q0 * steps)),
                                                                    rel=1e-12)
  np.testing.assert_allclose(start.sampling_rate, q0, rtol=1e-12)
  if design == "sampling_rate":   # σ's shape is held: a common factor on the initial one
    ratio = np.asarray(result.noise_multiplier / sigma0)
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)
  assert float(result.utility) < (0.99 if accountant == "rdp" else 0.999) * float(start.utility)
  # Noise late is damped least: the design buys larger batches (less noise per mean) late.
  assert float(result.sampling_rate[-1]) > float(result.sampling_rate[0])


def test_a_stochastic_utility_gets_a_fresh_key_each_iteration_and_the_same_result_per_key():
  calls = []

  def noisy(sigma, q, key):   # the late-weighted proxy times a draw of the key's noise
    calls.append(key)
    return utility(sigma, q) * (1.0 + 0.05 * jax.random.normal(key, ()))
  run = lambda key: jaxrdp.optimize_schedule(noisy, sampling_rate=Q,
                                             noise_multiplier=jnp.array([1.0, 1.0]), steps=T,
                                             target_epsilon=2.0, delta=DELTA, num_iterations=8,
                                             key=key)
  first = run(jax.random.key(0))
  again, other = run(jax.random.key(0)), run(jax.random.key(1))
  np.testing.assert_array_equal(first.noise_multiplier, again.noise_multiplier)
  assert not np.array_equal(first.history, other.history)   # other draws, other iterates
  for r in (first, other):
    eps = float(jaxrdp.dpsgd_epsilon(Q, r.noise_multiplier, T, DELTA))
    assert 2.0 * (1 - 1e-9) <= eps <= 2.0
    assert r.noise_multiplier[0] > r.noise_multiplier[1]   # still decaying noise
  with pytest.raises(TypeError):   # a deterministic utility with a key: called with three
    jaxrdp.optimize_schedule(utility, sampling_rate=Q, noise_multiplier=jnp.array([1.0, 1.0]),
                             steps=T, target_epsilon=2.0, delta=DELTA, num_iterations=1,
                             key=jax.random.key(0))


def _random_design_problem(seed, budgets):
  """A random schedule (2 to 5 phases of 30 to 60 steps), its noisy-SGD utility and random
  budgets in [1, 4]."""
  rng = np.random.default_rng(seed)
  phases = int(rng.integers(2, 6))
  steps = jnp.asarray(rng.integers(30, 61, phases).astype(float))
  q0 = jnp.asarray(rng.uniform(0.01, 0.05, phases))
  sigma0 = jnp.asarray(rng.uniform(0.8, 1.5, phases))
  u = jaxrdp.noisy_sgd_utility(steps, 0.2, l2_norm_clip=1.0, dataset_size=2000, curvature=0.05)
  return u, q0, sigma0, steps, jnp.asarray(rng.uniform(1.0, 4.0, budgets))


def _midpoints(steps):
  """Each phase's midpoint step as a fraction of all steps (the families' variable)."""
  steps = np.asarray(steps)
  return (np.cumsum(steps) - steps / 2) / steps.sum()


def _polynomial_residual(x, log_values, degree):
  """The residual of the least-squares polynomial of ``degree`` through (x, log_values)."""
  fit = np.polynomial.polynomial.Polynomial.fit(x, log_values, degree)
  return float(np.max(np.abs(fit(x) - log_values)))


@pytest.mark.parametrize("family,degree", [("exponential", 1), ("polynomial", 2)])
def test_a_family_gives_schedules_of_its_form_within_the_budget(family, degree):
  rng = np.random.default_rng(20)
  steps = jnp.asarray(rng.integers(20, 80, 7).astype(float))
  q0 = jnp.asarray(rng.uniform(0.02, 0.04, 7))
  sigma0 = jnp.asarray(rng.uniform(0.8, 1.2, 7))
  u = jaxrdp.noisy_sgd_utility(steps, 0.2, l2_norm_clip=1.0, dataset_size=2000, curvature=0.05)
  result = jaxrdp.optimize_schedule(u, sampling_rate=q0, noise_multiplier=sigma0, steps=steps,
                                    target_epsilon=2.0, delta=DELTA, num_iterations=30,
                                    design="both", family=family, degree=2)
  x = _midpoints(steps)
  # log σ − log σ0 and log q − log q0 are polynomials of the family's degree in x: the fit of
  # that degree is exact, that of one degree less is not.
  for ratio in (result.noise_multiplier / sigma0, result.sampling_rate / q0):
    assert _polynomial_residual(x, np.log(np.asarray(ratio)), degree) < 1e-12
    assert _polynomial_residual(x, np.log(np.asarray(ratio)), degree - 1) > 1e-4
  eps = float(jaxrdp.dpsgd_epsilon(result.sampling_rate, result.noise_multiplier, steps, DELTA))
  assert 2.0 * (1 - 1e-9) <= eps <= 2.0
  assert float(jnp.sum(result.sampling_rate * steps)) == pytest.approx(float(jnp.sum(q0 * steps)),
                                                                       rel=1e-12)
  assert float(result.utility) < 0.9 * float(result.history[0])


@pytest.mark.parametrize("design,seed,family", [("noise_multiplier", 10, "phases"),
                                                ("sampling_rate", 11, "polynomial"),
                                                ("both", 12, "exponential")])
def test_the_design_runs_under_jit_and_spends_at_most_each_random_budget(design, seed, family):
  u, q0, sigma0, steps, budgets = _random_design_problem(seed, 2)
  design_for = jax.jit(jax.vmap(lambda b: jaxrdp.optimize_schedule(
      u, sampling_rate=q0, noise_multiplier=sigma0, steps=steps, target_epsilon=b, delta=DELTA,
      num_iterations=12, design=design, family=family)))
  results = design_for(budgets)
  assert results.history.shape == (2, 12)
  for i, target in enumerate(np.asarray(budgets)):
    sigma, q = results.noise_multiplier[i], results.sampling_rate[i]
    eps = float(jaxrdp.dpsgd_epsilon(q, sigma, steps, DELTA))   # eagerly, on its own path
    assert eps == pytest.approx(float(results.epsilon[i]), rel=1e-12)
    assert target * (1 - 1e-8) <= eps <= target
    assert float(jnp.sum(q * steps)) == pytest.approx(float(jnp.sum(q0 * steps)), rel=1e-12)
    if design == "noise_multiplier":
      np.testing.assert_array_equal(q, q0)
    if design == "sampling_rate":   # σ's shape is held
      np.testing.assert_allclose(sigma / sigma0, sigma[0] / sigma0[0], rtol=1e-12)
    # The same design as an eager call (which solves for the initial scale where the graph
    # takes five Newton steps onto the boundary).
    if family == "exponential":   # log q − log q0 linear in the phases' midpoints
      ratio = np.log(np.asarray(q / q0))
      assert _polynomial_residual(_midpoints(steps), ratio, 1) < 1e-12
    eager = jaxrdp.optimize_schedule(u, sampling_rate=q0, noise_multiplier=sigma0, steps=steps,
                                     target_epsilon=float(target), delta=DELTA,
                                     num_iterations=12, design=design, family=family)
    np.testing.assert_allclose(sigma, eager.noise_multiplier, rtol=1e-3)
    np.testing.assert_allclose(q, eager.sampling_rate, rtol=1e-3)
    assert float(results.utility[i]) == pytest.approx(float(eager.utility), rel=1e-3)
    assert float(results.utility[i]) < float(results.history[i, 0])   # it improved


def test_the_design_runs_under_jit_with_the_pld_on_a_given_grid_and_reports_progress():
  u, q0, sigma0, steps, budgets = _random_design_problem(13, 1)
  target = float(budgets[0])
  grid = jaxrdp.pld_grid(q0, 0.8 * sigma0, steps)   # (a design below it: a larger, valid ε)
  calls = []
  design_for = jax.jit(lambda b: jaxrdp.optimize_schedule(
      u, sampling_rate=q0, noise_multiplier=sigma0, steps=steps, target_epsilon=b, delta=DELTA,
      num_iterations=4, design="both", accountant="pld", pld_grid=grid,
      callback=lambda i, value: calls.append((i, value))))
  result = jax.block_until_ready(design_for(target))
  eps = float(jaxrdp.dpsgd_epsilon(result.sampling_rate, result.noise_multiplier, steps, DELTA,
                                   accountant="pld", pld_grid=grid))
  assert eps == pytest.approx(float(result.epsilon), rel=1e-12)
  assert target * (1 - 1e-8) <= eps <= target
  assert float(jnp.sum(result.sampling_rate * steps)) == pytest.approx(
      float(jnp.sum(q0 * steps)), rel=1e-12)
  assert [i for i, _ in calls] == [1, 2, 3, 4]
  np.testing.assert_allclose([v for _, v in calls], result.history, rtol=1e-12)
  with pytest.raises(TypeError, match="pld_grid"):   # the PLD's sizes need concrete values
    jax.jit(lambda b: jaxrdp.optimize_schedule(
        u, sampling_rate=q0, noise_multiplier=sigma0, steps=steps, target_epsilon=b,
        delta=DELTA, num_iterations=1, accountant="pld"))(target)


def test_the_design_prepares_the_derivative_its_iterations_take(monkeypatch):
  # optimize_schedule compiles its iterations' derivative of ε in the background before the
  # first iteration (envelope.prepare_gradient, at a fractional order up to 64); the
  # derivative then runs that program: no other is compiled (a program keyed apart, by a
  # weak type or a shape, would compile a second time while the first goes unused).
  q, sigma, t = np.full(3, 0.05), np.array([1.0, 1.1, 1.2]), np.full(3, 100.0)
  best = float(epsilon._concrete_epsilon(q, sigma, t, np.asarray(1e-5),
                                         np.asarray(jaxrdp.DEFAULT_ORDERS), False)[1])
  assert 1 < best < 64 and best != round(best)   # (the order the derivative is taken at)
  before = set(envelope._gradient_at.executables)
  envelope.prepare_gradient(q, sigma, t, np.asarray(1e-5), wanted=(True, True, False, False))
  prepared = set(envelope._gradient_at.executables) - before
  assert len(prepared) == (0 if compilation.plain_jit() else 1)   # (plain jax.jit: no cache)
  d_sigma, d_q = jax.grad(lambda s, q_: jaxrdp.dpsgd_epsilon(q_, s, t, 1e-5, refine_order=False),
                          argnums=(0, 1))(sigma, q)
  assert set(envelope._gradient_at.executables) - before == prepared
  assert np.all(np.asarray(d_sigma) < 0) and np.all(np.asarray(d_q) > 0)
  asked = []
  monkeypatch.setattr(envelope, "prepare_gradient", lambda *a, **k: asked.append(k["wanted"]))
  utility = lambda s, q_: jnp.sum(s * s / q_)
  schedules.optimize_schedule(utility, sampling_rate=q, noise_multiplier=sigma, steps=t,
                              target_epsilon=3.0, delta=1e-5, num_iterations=1, design="both")
  # Before the iterations; their derivatives (epsilon_and_gradient) then find it prepared.
  assert asked == [(True, True, False, False)]


@pytest.mark.parametrize("refine", [False, True])
def test_epsilon_and_gradient_are_value_and_grad_of_the_eager_epsilon(refine):
  # The eager design's boundary calls the search and the envelope gradient directly
  # (epsilon.epsilon_and_gradient) instead of jax.value_and_grad of ε: the same numbers.
  q, sigma, t = np.array([0.02, 0.05, 0.1]), np.array([0.9, 1.3, 2.0]), np.array([300.0, 50.0, 8.0])
  delta, grid = jnp.asarray(1e-5), np.asarray(jaxrdp.DEFAULT_ORDERS)
  eps, grads = epsilon.epsilon_and_gradient(q, sigma, t, delta, grid, refine,
                                            (True, True, False, False))
  value, (d_sigma, d_q) = jax.value_and_grad(
      lambda s, q_: epsilon.dpsgd_epsilon_unchecked(q_, s, t, delta, grid, refine),
      argnums=(0, 1))(sigma, q)
  assert float(eps) == float(value)
  np.testing.assert_array_equal(np.asarray(grads[1]), np.asarray(d_sigma))
  np.testing.assert_array_equal(np.asarray(grads[0]), np.asarray(d_q))
  assert np.all(np.asarray(d_sigma) < 0) and np.all(np.asarray(d_q) > 0)
