"""ε and its gradient inside a user's own ``jax.jit`` agree with the eager calls.

Under ``jax.jit`` the envelope gradient is taken at the traced optimal order on shared nodes
(``rdp_tangent_at_order``: 2049 nodes, or the nested grids for more than 1,024 pairs), and
long schedules (more than 64 phases) take the binned search (a stand-in schedule from phases
binned by σ, windows of orders). The eager calls take their own programs; the values must agree.
References: the eager ``jax.grad`` (exact envelope gradient at the optimal order, itself
checked against finite differences in test_accounting.py) and the whole-grid minimum of
``compute_epsilon`` over ``compute_rdp`` (the pruning must not change it).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrdp

# (q, σ, T, δ): the usual regime, a larger q, large σ, q = 1, and small σ (optimal order
# above 64, where the 129-node grid cannot certify the derivative).
CASES = [(0.01, 1.1, 10_000.0, 1e-5), (0.05, 0.8, 2_000.0, 1e-6), (0.001, 5.0, 100.0, 1e-5),
         (1.0, 3.0, 10.0, 1e-5), (0.2, 0.35, 100.0, 1e-5)]


@pytest.mark.parametrize("case", CASES)
def test_jitted_gradient_matches_the_eager_one(case):
  f = lambda q, s, t, d: jaxrdp.dpsgd_epsilon(q, s, t, d)
  args = tuple(jnp.asarray(v) for v in case)
  eager = jax.value_and_grad(f, argnums=(0, 1, 2, 3))(*args)
  jitted = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))(*args)
  np.testing.assert_allclose(float(jitted[0]), float(eager[0]), rtol=1e-12)
  for g_jit, g_eager in zip(jitted[1], eager[1]):
    assert np.isfinite(float(g_jit))
    np.testing.assert_allclose(float(g_jit), float(g_eager), rtol=1e-9)


def _schedule(n, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.uniform(0.005, 0.02, n), rng.uniform(0.8, 2.0, n),
          rng.integers(1, 6, n).astype(np.float64))


# Under jit a long schedule's derivatives along σ, T and δ come from the windowed search's loop
# (the derivatives at the best order so far carried), along q from one pass at the order found.
@pytest.mark.parametrize("argnums", [(1,), (1, 2, 3), (0, 1)])
def test_a_long_traced_schedule_matches_the_eager_value_and_gradient(argnums):
  q, sigma, t = _schedule(300)
  f = lambda q_, s, t_, d: jaxrdp.dpsgd_epsilon(q_, s, t_, d)
  args = (q, sigma, t, np.float64(1e-5))
  eager = jax.value_and_grad(f, argnums)(*args)
  jitted = jax.jit(jax.value_and_grad(f, argnums))(*(jnp.asarray(v) for v in args))
  np.testing.assert_allclose(float(jitted[0]), float(eager[0]), rtol=1e-9)
  for g_jit, g_eager in zip(jitted[1], eager[1]):
    assert np.all(np.isfinite(g_jit)) and np.any(g_jit != 0)
    np.testing.assert_allclose(np.asarray(g_jit), np.asarray(g_eager), rtol=1e-8)


def test_the_binned_search_keeps_the_whole_grid_minimum():
  # Without refinement the traced ε of a long schedule is the minimum over every grid order
  # of the composed RDP: the orders its bounds leave out cannot be the minimum.
  q, sigma, t = _schedule(500, seed=1)
  orders = jaxrdp.DEFAULT_ORDERS
  rdp = np.sum(np.asarray(jaxrdp.compute_rdp(q, sigma, t, orders)), axis=0)
  whole_grid = float(jaxrdp.compute_epsilon(orders, rdp, 1e-5)[0])
  traced = jax.jit(lambda s: jaxrdp.dpsgd_epsilon(q, s, t, 1e-5, refine_order=False))(sigma)
  np.testing.assert_allclose(float(traced), whole_grid, rtol=1e-12)
  refined = float(jax.jit(lambda s: jaxrdp.dpsgd_epsilon(q, s, t, 1e-5))(sigma))
  assert refined <= float(traced)


@pytest.mark.parametrize("phases", [1, 100])
def test_second_derivatives_of_epsilon_are_nan_not_zero(phases):
  # The derivative rules take first derivatives only (the envelope gradient at the optimal
  # order). Differentiating them again gave 0, a plausible number (d²ε/dσ² is ~7.5 here by
  # differences of the gradient): every second derivative is NaN, eagerly and under jit.
  q, t = jnp.full(phases, 0.01), jnp.full(phases, 1000.0 / phases)
  f = lambda s: jnp.sum(jaxrdp.dpsgd_epsilon(q, s, t, 1e-5))
  sigma = jnp.full(phases, 1.2)
  gradient = jax.grad(f)(sigma)
  assert np.all(np.isfinite(gradient)) and np.all(gradient < 0)
  for second in (jax.hessian(f), jax.jit(jax.hessian(f)), jax.jacrev(jax.grad(f))):
    assert np.all(np.isnan(second(sigma))), second
  # And in the steps and δ (the gradient at the order found).
  for i, x in ((2, t), (3, jnp.float64(1e-5))):
    g = lambda v: jnp.sum(jaxrdp.dpsgd_epsilon(q, sigma, *((v, 1e-5) if i == 2 else (t, v))))
    assert np.all(np.isfinite(jax.grad(g)(x))) and np.all(np.isnan(jax.hessian(g)(x)))


def test_second_derivatives_of_the_rdp_curve_are_nan_or_right():
  # log A's quadrature carries first derivatives (the integrand's, on the value's nodes);
  # differentiating those again gave 0 for RDP (d²/dσ² ≈ 1.09 below, by differences of the
  # gradient) and a RecursionError for log_a. NaN now; the exact sums of integer orders
  # (eagerly) are differentiated by JAX, a right second derivative.
  rdp = lambda alpha: lambda s: jaxrdp.compute_rdp(0.01, s, 1000.0, jnp.array([alpha]))[0]
  for f in (rdp(2.5), lambda s: jaxrdp.log_a(0.01, s, 2.5)):
    assert np.isfinite(jax.grad(f)(1.2))
    assert np.isnan(jax.hessian(f)(1.2)) and np.isnan(jax.jit(jax.hessian(f))(1.2))
  g, h = jax.grad(rdp(8.0)), 1e-4
  np.testing.assert_allclose(jax.hessian(rdp(8.0))(1.2), (g(1.2 + h) - g(1.2 - h)) / (2 * h),
                             rtol=1e-6)
