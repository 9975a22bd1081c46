"""Properties of the public functions over their parameter boxes (hypothesis, reproducible).

Each hypothesis example is a *batch* of parameter points evaluated in one vectorised call of a
fixed padded shape, so the kernels compile once per dtype (not once per example):
``log_a``/``compute_rdp`` always see q, σ of shape (64, 1) and 8 orders. ``derandomize=True``
makes every run draw the same examples.

Tolerances (relative): the sampled-Gaussian kernel certifies log A to 32 ulps, so monotonicity
and additivity are checked to 1e-12; float32 log A is within the margin that ``compute_epsilon``
adds to float32 RDP (``conversion._RDP_REL_ERROR_FLOAT32``) of float64, and ~1e-5 typically; conversions are
checked against 40-digit mpmath values of the same formulas and must never be on the unsafe
side (ε and δ at least the exact conversion of the same curve).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
from hypothesis import given, settings, strategies as st

import jaxrdp
from jaxrdp.accounting import conversion

ROWS, K = 64, 8          # the one kernel shape: (ROWS, 1) x (K,)
HALF = ROWS // 2         # pairs of points share one call: first half and second half
SETTINGS = dict(max_examples=12, deadline=None, derandomize=True)
REL = 1e-12


def _log_uniform(lo, hi):
  return st.floats(math.log(lo), math.log(hi)).map(math.exp)


qs = st.one_of(st.sampled_from([0.0, 1.0]), _log_uniform(1e-6, 1.0))
sigmas = _log_uniform(0.1, 1e3)
factors = st.floats(1.0, 4.0)


def _orders(draw_fractional, draw_integer):
  return st.tuples(st.lists(draw_fractional, min_size=K - 3, max_size=K - 3),
                   st.lists(draw_integer, min_size=2, max_size=2)).map(
                       lambda t: np.sort(np.array([1.0] + t[0] + [float(i) for i in t[1]])))


box_orders = _orders(st.floats(1.0, 1e3), st.integers(2, 1000))


def _pad(rows, n):
  """``rows`` (a list of tuples) repeated to exactly n rows, as a float64 array (n, width)."""
  a = np.array(rows, dtype=np.float64)
  return a[np.arange(n) % len(a)]


def _kernel(q, sigma, orders, dtype=np.float64):
  return np.asarray(jaxrdp.rdp_sampled_gaussian(jnp.asarray(q, dtype)[:, None],
                                                jnp.asarray(sigma, dtype)[:, None],
                                                jnp.asarray(orders, dtype)))


def _pairs(draw_q, draw_sigma):
  return st.lists(st.tuples(draw_q, draw_sigma, factors), min_size=1, max_size=HALF)


# --- the sampled Gaussian: monotonicity, composition --------------------------------------------

@settings(**SETTINGS)
@given(_pairs(qs, _log_uniform(0.1, 250.0)), box_orders)
def test_rdp_is_non_increasing_in_the_noise_multiplier(points, orders):
  p = _pad(points, HALF)
  sigma_big = np.minimum(p[:, 1] * p[:, 2], 1e3)
  r = _kernel(np.concatenate([p[:, 0], p[:, 0]]), np.concatenate([p[:, 1], sigma_big]), orders)
  small, big = r[:HALF], r[HALF:]
  assert np.all(big <= small * (1 + REL))


@settings(**SETTINGS)
@given(_pairs(_log_uniform(1e-6, 1.0), sigmas), box_orders)
def test_rdp_is_non_decreasing_in_the_sampling_rate(points, orders):
  p = _pad(points, HALF)
  q_small = p[:, 0] / p[:, 2]
  r = _kernel(np.concatenate([q_small, p[:, 0]]), np.concatenate([p[:, 1], p[:, 1]]), orders)
  assert np.all(r[HALF:] >= r[:HALF] * (1 - REL))


@settings(**SETTINGS)
@given(st.lists(st.tuples(qs, sigmas, st.integers(0, 10 ** 5), st.integers(0, 10 ** 5)),
                min_size=1, max_size=ROWS), box_orders)
def test_compute_rdp_composes_additively_and_grows_with_the_steps(points, orders):
  # Mironov 2017, Prop. 1: RDP(T1 + T2) = RDP(T1) + RDP(T2) at every order.
  p = _pad(points, ROWS)
  q, sigma, t1, t2 = p.T
  r1, r2, r12 = (np.asarray(jaxrdp.compute_rdp(q, sigma, t, orders)) for t in (t1, t2, t1 + t2))
  np.testing.assert_allclose(r12, r1 + r2, rtol=1e-14, atol=0)
  assert np.all(np.maximum(r1, r2) <= r12 * (1 + REL))   # more steps never cost less


@settings(**SETTINGS)
@given(_pairs(qs, sigmas), box_orders)
def test_rdp_is_between_zero_and_the_unsampled_gaussian(points, orders):
  # Subsampling never hurts: 0 <= RDP(q, σ, α) <= α / (2σ²) = RDP(1, σ, α) (Mironov et al. 2019).
  p = _pad(points, HALF)
  q = np.concatenate([p[:, 0], p[:, 0]])
  sigma = np.concatenate([p[:, 1], p[:, 1] * p[:, 2]])
  r = _kernel(q, sigma, orders)
  gauss = np.asarray(jaxrdp.rdp_gaussian(sigma[:, None], orders))
  assert np.all(r >= 0) and np.all(r <= gauss * (1 + REL))


# --- NaN-free values and gradients over the whole box --------------------------------------------

@settings(**SETTINGS)
@given(st.lists(st.tuples(qs, sigmas), min_size=1, max_size=ROWS), box_orders)
def test_log_a_and_its_gradients_are_nan_free_over_the_box(points, orders):
  # q ∈ [0, 1] (0 and 1 included), σ ∈ [0.1, 1e3], α ∈ [1, 1e3] (1 and integers included).
  p = _pad(points, ROWS)
  q, sigma = jnp.asarray(p[:, :1]), jnp.asarray(p[:, 1:])
  alpha = jnp.asarray(orders)
  value = np.asarray(jaxrdp.log_a(q, sigma, alpha))
  assert not np.any(np.isnan(value)) and np.all(value >= 0)
  g_q, g_s = jax.grad(lambda a, b: jnp.sum(jaxrdp.log_a(a, b, alpha)), argnums=(0, 1))(q, sigma)
  assert not np.any(np.isnan(np.asarray(g_q))) and not np.any(np.isnan(np.asarray(g_s)))
  # Where log A is finite, it grows with q and shrinks with σ.
  finite = np.all(np.isfinite(value), axis=1, keepdims=True) & (p[:, :1] < 1)
  assert np.all(np.asarray(g_q)[finite] >= 0) and np.all(np.asarray(g_s)[finite] <= 0)


# --- float32 against float64 --------------------------------------------------------------------

@settings(**SETTINGS)
@given(st.lists(st.tuples(_log_uniform(1e-4, 1.0), _log_uniform(0.3, 100.0), _log_uniform(1e-9, 1e-3)),
                min_size=1, max_size=ROWS),
       _orders(st.floats(1.0, 256.0), st.integers(2, 256)))
def test_float32_rdp_is_within_the_conversion_margin_and_epsilon_never_below_float64(points, orders):
  p = _pad(points, ROWS).astype(np.float32).astype(np.float64)   # float32-exact inputs
  orders = orders.astype(np.float32).astype(np.float64)
  r32 = _kernel(p[:, 0], p[:, 1], orders, np.float32).astype(np.float64)
  r64 = _kernel(p[:, 0], p[:, 1], orders)
  normal = np.isfinite(r64) & (r64 > 1e-30)   # float32 keeps relative precision there
  rel = np.abs(r32[normal] - r64[normal]) / r64[normal]
  assert rel.max() <= conversion._RDP_REL_ERROR_FLOAT32   # the margin compute_epsilon adds
  assert np.median(rel) <= 1e-5                  # docs/trust.md, Accuracy: ~1e-5 typical
  steps = 1000.0
  delta = p[:, 2]
  eps32, _ = jaxrdp.compute_epsilon(jnp.asarray(orders, jnp.float32), jnp.asarray(r32 * steps, jnp.float32),
                                    jnp.asarray(delta, jnp.float32))
  eps64, _ = jaxrdp.compute_epsilon(orders, r64 * steps, delta)
  eps32, eps64 = np.asarray(eps32, np.float64), np.asarray(eps64)
  # float32 RDP is raised by its margin before converting: its ε is never below float64's.
  assert np.all(eps32 >= eps64)
  assert np.all(eps32 <= eps64 * (1 + 3e-3))


# --- conversions: round trip and safe side --------------------------------------------------------

def _mp_epsilon(orders, rdp, delta):
  """40-digit min over the orders of the improved conversion (Balle et al. 2020, Thm. 21) and
  the KL bound, on the given (float) RDP values."""
  with mp.workdps(40):
    best = mp.inf
    for a, r in zip(orders, rdp):
      a, r = mp.mpf(a), mp.mpf(r)
      if not mp.isfinite(r):
        continue
      if delta ** 2 >= -mp.expm1(-r):
        return mp.mpf(0)
      if a > 1:
        best = min(best, r + mp.log1p(-1 / a) - (mp.log(delta) + mp.log(a)) / (a - 1))
    return max(best, mp.mpf(0))


def _mp_delta(orders, rdp, eps):
  with mp.workdps(40):
    best = mp.mpf(1)
    for a, r in zip(orders, rdp):
      a, r = mp.mpf(a), mp.mpf(r)
      if not mp.isfinite(r):
        continue
      best = min(best, mp.sqrt(-mp.expm1(-r)))
      if a > 1:
        best = min(best, mp.exp((a - 1) * (r - eps + mp.log1p(-1 / a)) - mp.log(a)))
    return best


@settings(**SETTINGS)
@given(st.lists(st.tuples(_log_uniform(1e-4, 0.9), _log_uniform(0.5, 20.0), st.integers(1, 10 ** 5),
                          _log_uniform(1e-12, 1e-2)), min_size=1, max_size=ROWS),
       _orders(st.floats(1.01, 200.0), st.integers(2, 200)))
def test_epsilon_delta_epsilon_round_trip_on_the_safe_side(points, orders):
  p = _pad(points, ROWS)
  q, sigma, steps, delta = p.T
  rdp = np.asarray(jaxrdp.compute_rdp(q, sigma, steps, orders))
  eps = np.asarray(jaxrdp.compute_epsilon(orders, rdp, delta)[0])
  delta2 = np.asarray(jaxrdp.compute_delta(orders, rdp, eps)[0])
  eps2 = np.asarray(jaxrdp.compute_epsilon(orders, rdp, delta2)[0])
  ok = np.isfinite(eps) & (eps > 0)
  # δ is exp of (α − 1)(r − ε + ...): rounding of ε ~ 1e4 is amplified by α − 1 in log δ.
  np.testing.assert_allclose(delta2[ok], delta[ok], rtol=1e-6)
  np.testing.assert_allclose(eps2[ok], eps[ok], rtol=1e-9, atol=1e-12)
  assert np.all(delta2[eps == 0] <= delta[eps == 0] * (1 + 1e-9))
  for i in range(min(len(points), 4)):   # never on the unsafe side of the exact conversion
    assert eps[i] >= float(_mp_epsilon(orders, rdp[i], mp.mpf(delta[i])))
    if np.isfinite(eps[i]):
      assert delta2[i] >= float(_mp_delta(orders, rdp[i], mp.mpf(eps[i])))


# --- dpsgd_epsilon: monotone in σ, q and T --------------------------------------------------------

@settings(max_examples=8, deadline=None, derandomize=True)
@given(st.lists(st.tuples(_log_uniform(5e-4, 0.5), st.floats(0.5, 5.0), st.integers(1, 5 * 10 ** 4),
                          _log_uniform(1e-9, 1e-5), st.floats(1.0, 2.0)), min_size=1, max_size=4))
def test_dpsgd_epsilon_is_monotone_in_noise_sampling_rate_and_steps(points):
  tol = 1e-10   # the refined order is found by a search; the grid value is monotone exactly
  for q, sigma, steps, delta, f in points:
    eps = lambda q_=q, s_=sigma, t_=steps: float(jaxrdp.dpsgd_epsilon(q_, s_, float(t_), delta))
    base = eps()
    assert eps(s_=sigma * f) <= base * (1 + tol)
    assert eps(q_=q / f) <= base * (1 + tol)
    assert eps(t_=max(1, int(steps / f))) <= base * (1 + tol)


# --- other mechanisms -------------------------------------------------------------------------

def _non_decreasing(r):
  return np.all(r[..., 1:] >= r[..., :-1] * (1 - REL))


@settings(**SETTINGS)
@given(st.lists(st.tuples(_log_uniform(0.1, 100.0), st.floats(0.5, 1.0), _log_uniform(1e-4, 10.0),
                          _log_uniform(1e-3, 1.0), _log_uniform(0.1, 10.0), st.integers(1, 10 ** 4)),
                min_size=1, max_size=ROWS), box_orders)
def test_mechanism_curves_are_non_decreasing_in_the_order_and_nan_free(points, orders):
  # Rényi divergence is non-decreasing in α (van Erven & Harremoës 2014, Thm. 3).
  p = _pad(points, ROWS)
  col = lambda j: p[:, j:j + 1]
  curves = {
      "gaussian": jaxrdp.rdp_gaussian(col(0), orders),
      "laplace": jaxrdp.rdp_laplace(col(0), orders),
      "randomized_response": jaxrdp.rdp_randomized_response(col(1), orders),
      "zcdp": jaxrdp.rdp_zcdp(col(2), orders),
      "relative_gaussian": jaxrdp.rdp_relative_gaussian(eta=col(3) * 0.1, gamma=col(4), dim=col(5),
                                                        orders=orders),
  }
  for name, r in curves.items():
    r = np.asarray(r)
    assert not np.any(np.isnan(r)), name
    assert np.all(r >= 0) and _non_decreasing(r), name
  # Limits at α = ∞: Laplace ε₀ = 1/b, randomized response log(p / (1 - p)).
  assert np.all(np.asarray(curves["laplace"]) <= (1 / col(0)) * (1 + REL))
  with np.errstate(divide="ignore"):
    t = np.log(col(1) / (1 - col(1)))
  assert np.all(np.asarray(curves["randomized_response"]) <= t * (1 + REL) + 1e-300)


@settings(**SETTINGS)
@given(st.lists(st.tuples(_log_uniform(0.1, 100.0), _log_uniform(1e-3, 10.0), st.floats(1.0, 4.0)),
                min_size=1, max_size=ROWS), box_orders)
def test_mechanisms_are_monotone_in_their_noise(points, orders):
  p = _pad(points, ROWS)
  b, rho, f = p[:, :1], p[:, 1:2], p[:, 2:3]
  for fn in (jaxrdp.rdp_gaussian, jaxrdp.rdp_laplace):
    assert np.all(np.asarray(fn(b * f, orders)) <= np.asarray(fn(b, orders)) * (1 + REL))
  p_rr = 0.5 + 0.5 / (1 + b)       # in (0.5, 1), increasing as b shrinks
  p_rr2 = 0.5 + 0.5 / (1 + b / f)
  assert np.all(np.asarray(jaxrdp.rdp_randomized_response(p_rr, orders))
                <= np.asarray(jaxrdp.rdp_randomized_response(p_rr2, orders)) * (1 + REL))
  assert np.all(np.asarray(jaxrdp.zcdp_to_epsilon(rho, 1e-6))
                <= np.asarray(jaxrdp.zcdp_to_epsilon(rho * f, 1e-6)) * (1 + REL))


@settings(**SETTINGS)
@given(st.lists(st.tuples(_log_uniform(1e-5, 0.25), _log_uniform(3.0, 50.0)), min_size=1, max_size=ROWS),
       _orders(st.floats(1.0, 200.0), st.integers(2, 200)))
def test_closed_form_is_at_least_the_exact_rdp(points, orders):
  # Mironov-Talwar-Zhang Thm. 11 is an upper bound (+inf outside its conditions).
  p = _pad(points, ROWS)
  exact = _kernel(p[:, 0], p[:, 1], orders)
  bound = np.asarray(jaxrdp.rdp_sampled_gaussian_closed_form(p[:, :1], p[:, 1:], orders))
  assert not np.any(np.isnan(bound))
  assert np.all(bound >= exact)
