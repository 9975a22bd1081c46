"""Closed-form mechanisms and zCDP conversions.

References: Mironov 2017 (arXiv:1702.07476) Prop. 5 (randomized response), Prop. 6 / Cor. 2
(Laplace), Prop. 7 / Cor. 3 (Gaussian), Table II (α = 1 and α = ∞ limits); Bun–Steinke 2016
(arXiv:1605.02065) Def. 1.1, Prop. 1.3, Prop. 1.4; Bun–Dwork–Rothblum–Steinke 2018 Def. 1 (tCDP);
Canonne–Kamath–Steinke 2020 (arXiv:2004.00010) Cor. 13. Reference values are computed here with
mpmath at 50 digits from those formulas, or taken from dp_accounting / OpenDP as stated.
"""

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as dpa

import jaxrdp

mp.mp.dps = 50

NEAR_ONE = [1 + 1e-12, 1 + 1e-9, 1 + 1e-6, 1.001, 1.01, 1.05, 1.0999, 1.1]
ORDERS = NEAR_ONE + [1.5, 2.0, 3.7, 10.0, 64.0, 1e3, 1e6, 1e12]


# --- mpmath references (formulas of the papers, evaluated at 50 digits) ---------------------

# The closed forms are log(1 + S)/(α − 1) with S as small as 1e-40 here: they are evaluated
# with 150 digits, so that 50 survive the cancellation.

def _laplace_mp(scale, alpha):
  """Mironov 2017, Prop. 6 (α > 1) and Table II (α = 1)."""
  with mp.workdps(150):
    e0, a = 1 / mp.mpf(scale), mp.mpf(alpha)
    if a == 1:
      return +(e0 + mp.exp(-e0) - 1)
    return +(mp.log(a / (2 * a - 1) * mp.exp((a - 1) * e0) + (a - 1) / (2 * a - 1) * mp.exp(-a * e0)) / (a - 1))


def _rr_mp(p, alpha):
  """Mironov 2017, Prop. 5."""
  with mp.workdps(150):
    p, a = mp.mpf(p), mp.mpf(alpha)
    if a == 1:
      return +((2 * p - 1) * mp.log(p / (1 - p)))
    return +(mp.log(p**a * (1 - p)**(1 - a) + (1 - p)**a * p**(1 - a)) / (a - 1))


def _zcdp_epsilon_mp(rho, delta):
  """CKS 2020 Cor. 13: the infimum over α, at the root of ρβ² + log1p(β) = log(1/δ)."""
  rho, lam = mp.mpf(rho), -mp.log(mp.mpf(delta))
  beta = mp.findroot(lambda b: rho * b**2 + mp.log1p(b) - lam, (mp.mpf(0), lam + mp.sqrt(lam / rho)),
                     solver="anderson")
  a = 1 + beta
  return a * rho + mp.log1p(-1 / a) + (lam - mp.log(a)) / beta


def _zcdp_delta_mp(rho, eps):
  """CKS 2020 Cor. 13: the infimum over α, at the root of ρ(2α − 1) + log(1 − 1/α) = ε."""
  rho, eps = mp.mpf(rho), mp.mpf(eps)
  beta = mp.findroot(lambda b: rho * (2 * b + 1) - mp.log1p(1 / b) - eps,
                     (mp.mpf("1e-40"), (eps + 2) / rho), solver="anderson")
  a = 1 + beta
  return mp.exp(beta * (a * rho - eps) + a * mp.log1p(-1 / a) - mp.log(beta))


def _rel_err(got, ref):
  got, ref = np.asarray(got, dtype=np.float64), np.asarray([float(r) for r in ref])
  return np.max(np.abs(got - ref) / np.abs(ref))


# --- Gaussian ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-15), (np.float32, 1e-6)])
def test_gaussian_is_alpha_over_two_sigma_squared(dtype, rtol):
  # Mironov 2017, Prop. 7 / Cor. 3.
  sigma = np.array([0.3, 1.0, 4.5], dtype)[:, None]
  orders = np.array(ORDERS, dtype)
  got = jaxrdp.rdp_gaussian(sigma, orders)
  assert got.dtype == dtype
  ref = [mp.mpf(float(a)) / (2 * mp.mpf(float(s))**2) for s in sigma[:, 0] for a in orders]
  assert _rel_err(np.ravel(got), ref) < rtol


def test_gaussian_limits():
  # Table II: the line α/(2σ²) at α = 1 is the KL divergence; no noise or α = ∞ is unbounded.
  assert float(jaxrdp.rdp_gaussian(2.0, 1.0)) == 0.125
  assert float(jaxrdp.rdp_gaussian(2.0, np.inf)) == np.inf
  assert np.all(np.isinf(np.asarray(jaxrdp.rdp_gaussian(0.0, [1.0, 2.0]))))


def test_gaussian_agrees_with_dp_accounting_and_sampled_gaussian_at_q_one():
  orders = np.array([1.5, 2.0, 2.5, 4.0, 8.0, 16.0, 32.0, 256.0])
  for sigma in (0.5, 1.1, 10.0):
    theirs = dpa._compute_rdp_poisson_subsampled_gaussian(1.0, sigma, orders)
    np.testing.assert_allclose(jaxrdp.rdp_gaussian(sigma, orders), theirs, rtol=1e-14)
    np.testing.assert_allclose(jaxrdp.rdp_gaussian(sigma, orders),
                               jaxrdp.rdp_sampled_gaussian(1.0, sigma, orders), rtol=1e-14)


# --- Laplace ----------------------------------------------------------------------------------

LAPLACE_SCALES = [1e-3, 0.05, 0.5, 1.0, 3.0, 100.0, 1e5]


def test_laplace_matches_mpmath_float64():
  # Mironov 2017, Prop. 6; every order from 1 + 1e-12 to 1e12, eps0 from 1e-5 to 1e3.
  scale = np.array(LAPLACE_SCALES)[:, None]
  orders = np.array([1.0] + ORDERS)
  got = jaxrdp.rdp_laplace(scale, orders)
  ref = [_laplace_mp(s, a) for s in LAPLACE_SCALES for a in orders]
  assert _rel_err(np.ravel(got), ref) < 1e-12


def test_laplace_is_stable_as_order_tends_to_one():
  # The log is 0/0 at α = 1: the near-α = 1 form must keep full precision on (1, 1.1].
  orders = np.array([1 + 1e-15, 1 + 1e-12, 1 + 1e-10, 1 + 1e-7, 1 + 1e-4, 1.02, 1.07, 1.1])
  for scale in (0.01, 0.3, 1.0, 30.0):
    ref = [_laplace_mp(scale, a) for a in orders]
    assert _rel_err(jaxrdp.rdp_laplace(scale, orders), ref) < 1e-12


def test_laplace_is_continuous_across_its_two_forms():
  # The forms switch at (α − 1)·ε0 = 1; here ε0 = 2, α = 1.5.
  orders = 1.5 + np.array([-1e-9, -1e-15, 0.0, 1e-15, 1e-9])
  ref = [_laplace_mp(0.5, a) for a in orders]
  assert _rel_err(jaxrdp.rdp_laplace(0.5, orders), ref) < 1e-13


def test_laplace_matches_mpmath_float32():
  scale = np.array(LAPLACE_SCALES, np.float32)[:, None]
  orders = np.array([1.0, 1 + 2**-20, 1.05, 1.1, 2.0, 10.0, 1e3, 1e6], np.float32)
  got = jaxrdp.rdp_laplace(scale, orders)
  assert got.dtype == np.float32
  ref = [_laplace_mp(float(s), float(a)) for s in scale[:, 0] for a in orders]
  assert _rel_err(np.ravel(got), ref) < 1e-5


def test_laplace_limits():
  # Table II: α = 1 gives ε0 + e^{-ε0} − 1, α = ∞ gives ε0; no noise is unbounded.
  for e0 in (1e-4, 0.5, 1.0, 20.0):
    assert float(jaxrdp.rdp_laplace(1 / e0, 1.0)) == pytest.approx(e0 + np.expm1(-e0), rel=1e-14)
    assert float(jaxrdp.rdp_laplace(1 / e0, np.inf)) == pytest.approx(e0, rel=1e-15)
  assert np.all(np.isinf(np.asarray(jaxrdp.rdp_laplace(0.0, [1.0, 2.0, np.inf]))))


def test_laplace_reference_values_from_notes():
  # ../shared/notes/formulas.md §6 (dp_accounting 0.6.0), ε0 = 1, values to 8 digits.
  orders = np.array([1.5, 2, 2.5, 4, 8, 16, 32])
  ref = [0.51288351, 0.61912363, 0.69395054, 0.81368930, 0.91019880, 0.95590677, 0.97814843]
  np.testing.assert_allclose(jaxrdp.rdp_laplace(1.0, orders), ref, rtol=0, atol=6e-9)


def test_laplace_agrees_with_dp_accounting():
  # dp_accounting's _laplace_rdp(eps0, order): Taylor series below α = 1.1, Prop. 6 above.
  orders = np.array([1.0, 1.01, 1.09, 1.5, 2.0, 7.3, 64.0, 1024.0])
  for e0 in (0.1, 1.0, 5.0):
    theirs = [dpa._laplace_rdp(e0, a) for a in orders]
    np.testing.assert_allclose(jaxrdp.rdp_laplace(1 / e0, orders), theirs, rtol=1e-12)


def test_laplace_is_below_its_zcdp_line():
  # ε0-DP implies (ε0²/2)-zCDP (BS16 Prop. 1.4): the curve lies below α ε0²/2.
  orders = np.array(ORDERS[:-1])
  for e0 in (0.01, 0.5, 3.0):
    line = jaxrdp.rdp_zcdp(jaxrdp.pure_dp_to_zcdp(e0), orders)
    assert np.all(np.asarray(jaxrdp.rdp_laplace(1 / e0, orders)) <= np.asarray(line))


# --- randomized response ----------------------------------------------------------------------

RR_P = [0.5 + 1e-12, 0.5 + 1e-7, 0.51, 0.6, 0.75, 0.9, 0.999, 1 - 1e-9]


def test_randomized_response_matches_mpmath_float64():
  # Mironov 2017, Prop. 5, from p barely above 1/2 to p barely below 1.
  p = np.array(RR_P)[:, None]
  orders = np.array([1.0] + ORDERS)
  got = jaxrdp.rdp_randomized_response(p, orders)
  ref = [_rr_mp(q, a) for q in RR_P for a in orders]
  assert _rel_err(np.ravel(got), ref) < 1e-12


def test_randomized_response_matches_mpmath_float32():
  p = np.array([0.5 + 2**-20, 0.51, 0.6, 0.75, 0.9, 0.999], np.float32)[:, None]
  orders = np.array([1.0, 1 + 2**-20, 1.05, 2.0, 10.0, 1e3, 1e6], np.float32)
  got = jaxrdp.rdp_randomized_response(p, orders)
  assert got.dtype == np.float32
  ref = [_rr_mp(float(q), float(a)) for q in p[:, 0] for a in orders]
  assert _rel_err(np.ravel(got), ref) < 1e-5


def test_randomized_response_limits():
  # Table II: α = 1 gives (2p − 1) log(p/(1−p)); α = ∞ gives the DP parameter log(p/(1−p)).
  for p in (0.55, 0.75, 0.99):
    t = np.log(p / (1 - p))
    assert float(jaxrdp.rdp_randomized_response(p, 1.0)) == pytest.approx((2 * p - 1) * t, rel=1e-14)
    assert float(jaxrdp.rdp_randomized_response(p, np.inf)) == pytest.approx(t, rel=1e-14)
  orders = [1.0, 2.0, np.inf]
  assert np.all(np.asarray(jaxrdp.rdp_randomized_response(0.5, orders)) == 0)   # a coin flip
  assert np.all(np.isinf(np.asarray(jaxrdp.rdp_randomized_response(1.0, orders))))   # the truth


def test_randomized_response_agrees_with_dp_accounting():
  # dp_accounting's k-ary RR with k = 2 under REPLACE_ONE keeps the bit with probability
  # 1 − noise/2, i.e. noise = 2(1 − p).
  orders = np.array([1.01, 1.5, 2.0, 3.7, 16.0, 256.0])
  for p in (0.55, 0.75, 0.95):
    theirs = dpa._compute_randomized_response_rdp(2 * (1 - p), 2, orders, dpa.NeighborRel.REPLACE_ONE)
    np.testing.assert_allclose(jaxrdp.rdp_randomized_response(p, orders), theirs, rtol=1e-12)


# --- zCDP and tCDP curves ---------------------------------------------------------------------

def test_zcdp_curve_is_xi_plus_rho_alpha():
  # BS16 Def. 1.1; at α = ∞ unbounded unless ρ = 0.
  orders = np.array([1.0, 2.0, 10.0, np.inf])
  np.testing.assert_allclose(jaxrdp.rdp_zcdp(0.1, orders, xi=0.05), [0.15, 0.25, 1.05, np.inf])
  np.testing.assert_allclose(jaxrdp.rdp_zcdp(0.0, orders, xi=0.05), [0.05] * 4)


def test_zcdp_epsilon_matches_dp_accounting_reference():
  # ../shared/notes/formulas.md §6: ρ = 0.01 at orders {2, 4, 8, 16, 32}, δ = 1e-5.
  orders = np.array([2.0, 4.0, 8.0, 16.0, 32.0])
  eps, order = jaxrdp.compute_epsilon(orders, jaxrdp.rdp_zcdp(0.01, orders), 1e-5)
  assert float(eps) == pytest.approx(0.547838, abs=1e-6)
  assert float(order) == 32
  accountant = dpa.RdpAccountant(orders)
  accountant.compose(dp_event.ZCDpEvent(0.01))
  assert float(eps) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)


def test_tcdp_curve_is_truncated_at_omega():
  # BDRS 2018, Def. 1: ρα below ω, no guarantee from ω on; ω = ∞ is ρ-zCDP.
  orders = np.array([1.0, 2.0, 4.999, 5.0, 9.0, np.inf])
  np.testing.assert_allclose(jaxrdp.rdp_tcdp(0.1, 5.0, orders), [0.1, 0.2, 0.4999, np.inf, np.inf, np.inf])
  np.testing.assert_allclose(jaxrdp.rdp_tcdp(0.1, np.inf, orders), jaxrdp.rdp_zcdp(0.1, orders))
  assert np.all(np.asarray(jaxrdp.rdp_tcdp(0.0, 5.0, orders)) == 0)


def test_pure_dp_to_zcdp_is_half_epsilon_squared():
  # BS16 Prop. 1.4.
  np.testing.assert_allclose(jaxrdp.pure_dp_to_zcdp(np.array([0.0, 0.5, 2.0, np.inf])), [0, 0.125, 2, np.inf])


# --- zCDP -> (ε, δ) ---------------------------------------------------------------------------

ZCDP_GRID = [(rho, delta) for rho in (1e-5, 0.01, 0.1, 1.0, 100.0) for delta in (0.1, 1e-5, 1e-12, 1e-100)]


def test_simple_zcdp_conversion_is_bun_steinke():
  # BS16 Prop. 1.3: ε = ρ + 2 sqrt(ρ log(1/δ)).
  for rho, delta in ZCDP_GRID:
    expected = rho + 2 * np.sqrt(rho * np.log(1 / delta))
    assert float(jaxrdp.zcdp_to_epsilon(rho, delta, method="simple")) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_tight_zcdp_epsilon_is_the_exact_infimum_and_never_below(dtype, rtol):
  # CKS 2020 Cor. 13, minimised over α by mpmath at 50 digits.
  for rho, delta in ZCDP_GRID:
    if dtype == np.float32 and delta < 1e-30:
      continue
    r, d = dtype(rho), dtype(delta)
    got = jaxrdp.zcdp_to_epsilon(r, d)
    assert got.dtype == dtype
    if d * d >= -np.expm1(-float(r)):   # the KL bound already gives ε = 0
      assert float(got) == 0
      continue
    exact = float(_zcdp_epsilon_mp(float(r), float(d)))
    assert exact <= float(got) <= exact * (1 + rtol)


def test_tight_zcdp_epsilon_matches_opendp():
  # OpenDP's tests of cdp_epsilon / cdp_delta (zCDP_to_approxDP/test.rs): ρ = (1/4)²/2.
  assert float(jaxrdp.zcdp_to_epsilon(1 / 32, 1e-3)) == pytest.approx(0.6880024554878086, rel=1e-14)
  assert float(jaxrdp.zcdp_to_delta(1 / 32, 0.0)) == pytest.approx(0.1508457845622862, rel=1e-14)


def test_tight_zcdp_epsilon_is_at_most_simple():
  for rho, delta in ZCDP_GRID:
    tight = float(jaxrdp.zcdp_to_epsilon(rho, delta))
    assert tight <= float(jaxrdp.zcdp_to_epsilon(rho, delta, method="simple"))


def test_tight_zcdp_epsilon_is_compute_epsilon_on_a_dense_order_grid():
  # The same conversion (CKS Prop. 12 per order) minimised over 40,000 orders instead of
  # exactly: the grid can only be higher, by the grid's resolution (here < 1e-7 relative).
  orders = 1 + np.geomspace(1e-4, 1e6, 40_000)
  for rho, delta in [(1e-3, 1e-5), (0.01, 1e-5), (0.5, 1e-8), (20.0, 1e-3)]:
    grid, _ = jaxrdp.compute_epsilon(orders, jaxrdp.rdp_zcdp(rho, orders), delta)
    exact = float(jaxrdp.zcdp_to_epsilon(rho, delta))
    assert exact <= float(grid) <= exact * (1 + 1e-7)


def test_zcdp_delta_is_the_exact_infimum_and_never_below():
  for rho, eps in [(1e-4, 0.05), (0.01, 0.5), (0.1, 1.0), (1.0, 3.0), (1.0, 30.0), (50.0, 60.0)]:
    exact = _zcdp_delta_mp(rho, eps)
    got = float(jaxrdp.zcdp_to_delta(rho, eps))
    # Relative to log δ (δ reaches 1e-93 here): 1e-13 of |log δ|, at least 1e-13 of δ.
    assert float(exact) <= got
    assert float(mp.log(got) - mp.log(exact)) <= 1e-13 * max(1.0, abs(float(mp.log(exact))))


def test_zcdp_delta_inverts_zcdp_epsilon():
  for rho, delta in ZCDP_GRID:
    eps = jaxrdp.zcdp_to_epsilon(rho, delta)
    if float(eps) > 0:
      assert float(jaxrdp.zcdp_to_delta(rho, eps)) == pytest.approx(delta, rel=1e-10)


def test_zcdp_delta_special_values():
  assert float(jaxrdp.zcdp_to_delta(0.0, 0.0)) == 0            # no privacy loss at all
  assert float(jaxrdp.zcdp_to_delta(1.0, np.inf)) == 0
  # Never above 1, and never above the KL bound sqrt(1 − e^{−ρ}).
  assert float(jaxrdp.zcdp_to_delta(1e4, 0.0)) <= 1
  assert float(jaxrdp.zcdp_to_delta(1e-6, 0.0)) <= np.sqrt(-np.expm1(-1e-6)) * (1 + 1e-12)


# --- composition ------------------------------------------------------------------------------

def test_curves_compose_by_addition_and_convert_like_dp_accounting():
  # Mironov 2017 Prop. 1: 100 Gaussian steps + 10 Laplace releases + a 0.05-zCDP step.
  orders = np.array([1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0, 256.0])
  rdp = (100 * jaxrdp.rdp_gaussian(20.0, orders) + 10 * jaxrdp.rdp_laplace(10.0, orders)
         + jaxrdp.rdp_zcdp(0.05, orders))
  accountant = dpa.RdpAccountant(orders)
  accountant.compose(dp_event.GaussianDpEvent(20.0), 100)
  accountant.compose(dp_event.LaplaceDpEvent(10.0), 10)
  accountant.compose(dp_event.ZCDpEvent(0.05))
  eps, _ = jaxrdp.compute_epsilon(orders, rdp, 1e-6)
  assert float(eps) == pytest.approx(accountant.get_epsilon(1e-6), rel=1e-12)


def test_gaussian_steps_compose_into_zcdp():
  # T Gaussian steps are T/(2σ²)-zCDP: the same curve, the same tight ε.
  orders = jnp.asarray(jaxrdp.DEFAULT_ORDERS[jnp.isfinite(jaxrdp.DEFAULT_ORDERS)])
  np.testing.assert_allclose(1000 * jaxrdp.rdp_gaussian(30.0, orders),
                             jaxrdp.rdp_zcdp(1000 / (2 * 30.0**2), orders), rtol=1e-14)


# --- transformations and edges ----------------------------------------------------------------

CURVES = [
    (jaxrdp.rdp_gaussian, (1.3,)),
    (jaxrdp.rdp_laplace, (0.7,)),
    (jaxrdp.rdp_randomized_response, (0.8,)),
    (jaxrdp.rdp_zcdp, (0.2,)),
    (lambda rho, orders: jaxrdp.rdp_tcdp(rho, 20.0, orders), (0.2,)),
]


@pytest.mark.parametrize("fn,params", CURVES)
def test_curves_are_the_same_under_jit_and_vmap(fn, params):
  orders = jnp.array([1.0, 1.5, 2.0, 30.0, jnp.inf])
  eager = fn(*params, orders)
  np.testing.assert_array_equal(jax.jit(fn)(*params, orders), eager)
  batch = jnp.array([params[0], params[0] * 0.9 + 0.05])
  np.testing.assert_allclose(jax.vmap(fn, in_axes=(0, None))(batch, orders),
                             fn(batch[:, None], orders), rtol=1e-15)


def test_conversions_are_the_same_under_jit_and_vmap():
  rho = jnp.array([0.0, 1e-3, 0.1, 10.0])
  for method in ("tight", "simple"):
    eager = jaxrdp.zcdp_to_epsilon(rho, 1e-6, method=method)
    jitted = jax.jit(lambda r: jaxrdp.zcdp_to_epsilon(r, 1e-6, method=method))(rho)
    mapped = jax.vmap(lambda r: jaxrdp.zcdp_to_epsilon(r, 1e-6, method=method))(rho)
    np.testing.assert_array_equal(jitted, eager)
    np.testing.assert_allclose(mapped, eager, rtol=1e-15)
  np.testing.assert_allclose(jax.vmap(jaxrdp.zcdp_to_delta, in_axes=(0, None))(rho, 1.0),
                             jaxrdp.zcdp_to_delta(rho, 1.0), rtol=1e-15)


def _grads(fn, *args):
  return [float(g) for g in jax.grad(fn, argnums=tuple(range(len(args))))(*args)]


@pytest.mark.parametrize("fn,args", [
    (jaxrdp.rdp_gaussian, (0.0, 2.0)), (jaxrdp.rdp_gaussian, (1.0, np.inf)), (jaxrdp.rdp_gaussian, (1.0, 1.0)),
    (jaxrdp.rdp_laplace, (0.0, 2.0)), (jaxrdp.rdp_laplace, (1.0, np.inf)), (jaxrdp.rdp_laplace, (1.0, 1.0)),
    (jaxrdp.rdp_laplace, (0.5, 1.5)), (jaxrdp.rdp_laplace, (1e-3, 1e6)),
    (jaxrdp.rdp_randomized_response, (0.5, 2.0)), (jaxrdp.rdp_randomized_response, (1.0, 2.0)),
    (jaxrdp.rdp_randomized_response, (0.7, 1.0)), (jaxrdp.rdp_randomized_response, (0.7, np.inf)),
    (jaxrdp.rdp_zcdp, (0.0, np.inf)), (jaxrdp.rdp_zcdp, (0.1, 1.0)),
    (jaxrdp.rdp_tcdp, (0.0, 2.0, 3.0)), (jaxrdp.rdp_tcdp, (0.1, 2.0, 3.0)),
    (jaxrdp.zcdp_to_epsilon, (0.0, 1e-5)), (jaxrdp.zcdp_to_epsilon, (1e-8, 0.5)),
    (jaxrdp.zcdp_to_epsilon, (1e4, 1e-5)), (jaxrdp.zcdp_to_delta, (0.0, 1.0)),
    (jaxrdp.zcdp_to_delta, (0.1, np.inf)), (jaxrdp.zcdp_to_delta, (0.1, 0.0)), (jaxrdp.pure_dp_to_zcdp, (0.0,)),
])
def test_gradients_at_the_edges_are_finite(fn, args):
  assert np.all(np.isfinite(_grads(fn, *args)))


def test_simple_zcdp_gradient_at_rho_zero_is_the_one_sided_infinity():
  g_rho, g_delta = _grads(lambda r, d: jaxrdp.zcdp_to_epsilon(r, d, method="simple"), 0.0, 1e-5)
  assert g_rho == np.inf and g_delta == 0


def test_order_derivatives_are_smooth_through_order_one():
  # d/dα at α = 1 against a central difference of the mpmath curves just above 1.
  for fn, mp_fn, param in [(jaxrdp.rdp_laplace, _laplace_mp, 0.3), (jaxrdp.rdp_randomized_response, _rr_mp, 0.8)]:
    with mp.workdps(150):   # the difference loses ~30 digits
      a0, h = mp.mpf(1) + mp.mpf("1e-25"), mp.mpf("1e-30")
      ref = (mp_fn(param, a0 + h) - mp_fn(param, a0 - h)) / (2 * h)
    assert float(jax.grad(fn, argnums=1)(param, 1.0)) == pytest.approx(float(ref), rel=1e-13)


def test_zcdp_epsilon_gradient_matches_finite_differences():
  # Envelope theorem: the optimal α is held fixed, the derivative is still exact.
  for rho, delta in [(0.01, 1e-5), (2.0, 1e-9)]:
    g_rho, g_delta = _grads(jaxrdp.zcdp_to_epsilon, rho, delta)
    h = 1e-6 * rho
    fd = (float(jaxrdp.zcdp_to_epsilon(rho + h, delta)) - float(jaxrdp.zcdp_to_epsilon(rho - h, delta))) / (2 * h)
    assert g_rho == pytest.approx(fd, rel=1e-7)
    h = 1e-6 * delta
    fd = (float(jaxrdp.zcdp_to_epsilon(rho, delta + h)) - float(jaxrdp.zcdp_to_epsilon(rho, delta - h))) / (2 * h)
    assert g_delta == pytest.approx(fd, rel=1e-6)


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("call,name", [
    (lambda: jaxrdp.rdp_gaussian(-1.0, 2.0), "noise_multiplier"),
    (lambda: jaxrdp.rdp_gaussian(1.0, 0.5), "orders"),
    (lambda: jaxrdp.rdp_laplace(-0.1, 2.0), "scale"),
    (lambda: jaxrdp.rdp_laplace(np.nan, 2.0), "scale"),
    (lambda: jaxrdp.rdp_randomized_response(0.4, 2.0), "p"),
    (lambda: jaxrdp.rdp_randomized_response(1.1, 2.0), "p"),
    (lambda: jaxrdp.rdp_zcdp(-0.1, 2.0), "rho"),
    (lambda: jaxrdp.rdp_zcdp(0.1, 2.0, xi=-1.0), "xi"),
    (lambda: jaxrdp.rdp_tcdp(0.1, 1.0, 2.0), "omega"),
    (lambda: jaxrdp.zcdp_to_epsilon(0.1, 0.0), "delta"),
    (lambda: jaxrdp.zcdp_to_epsilon(0.1, 1.0), "delta"),
    (lambda: jaxrdp.zcdp_to_epsilon(-0.1, 1e-5), "rho"),
    (lambda: jaxrdp.zcdp_to_delta(0.1, -1.0), "epsilon"),
    (lambda: jaxrdp.pure_dp_to_zcdp(-1.0), "epsilon"),
])
def test_bad_input_raises_naming_the_argument_and_range(call, name):
  with pytest.raises(ValueError, match=rf"{name} must lie in"):
    call()


def test_bad_method_and_dtype_raise():
  with pytest.raises(ValueError, match="method"):
    jaxrdp.zcdp_to_epsilon(0.1, 1e-5, method="exact")
  with pytest.raises(TypeError, match="p"):
    jaxrdp.rdp_randomized_response(0.7 + 0j, 2.0)


@pytest.mark.parametrize("fn,args", [
    (jaxrdp.rdp_gaussian, (-1.0, 2.0)), (jaxrdp.rdp_gaussian, (1.0, 0.5)),
    (jaxrdp.rdp_laplace, (-1.0, 2.0)), (jaxrdp.rdp_laplace, (1.0, 0.5)),
    (jaxrdp.rdp_randomized_response, (0.3, 2.0)), (jaxrdp.rdp_randomized_response, (0.7, np.nan)),
    (jaxrdp.rdp_zcdp, (-1.0, 2.0)), (jaxrdp.rdp_tcdp, (0.1, 0.5, 2.0)),
    (jaxrdp.zcdp_to_epsilon, (0.1, 1.5)), (jaxrdp.zcdp_to_epsilon, (-0.1, 1e-5)),
    (jaxrdp.zcdp_to_delta, (0.1, -1.0)), (jaxrdp.pure_dp_to_zcdp, (-1.0,)),
])
def test_under_jit_bad_input_gives_nan(fn, args):
  assert np.isnan(float(jax.jit(fn)(*args)))
