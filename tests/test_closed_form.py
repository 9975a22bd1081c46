"""Theorem 11 of Mironov, Talwar, Zhang (2019): the closed-form bound 2q²α/σ² and its conditions.

References: Mironov, Talwar, Zhang, arXiv:1908.10530, Sec. 3.2, Theorem 11 (conditions q ≤ 1/5,
σ ≥ 4, (4) α ≤ σ²L/2 − 2 log σ, (5) α ≤ (σ²L²/2 − log 5 − 2 log σ)/(L + log(qα) + 1/(2σ²)),
L = log(1 + 1/(q(α − 1)))). The exact RDP it is compared with is ``jaxrdp.rdp_sampled_gaussian``
(itself tested against 60-digit mpmath references in test_log_a_reference.py); the formula and
its conditions are re-evaluated here with mpmath at 50 digits.

Parameter box: q ∈ [1e-6, 0.19999999] (14 log-spaced), σ ∈ [4, 400] (11 log-spaced), α ∈
[1.0001, 2e4] (45 log-spaced) ∪ {2, ..., 40}; float32 on every other q and σ and every third α.
Tolerances: the bound must be ≥ the exact RDP with no tolerance (float64 and float32); the
value must lie in [2q²α/σ², 2q²α/σ² (1 + 8 eps)] against mpmath; the finite region must agree
with mpmath's conditions except within 1e-9 relative of their boundary, and the largest
order allowed must agree with mpmath's to 1e-12 relative.
"""

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest

import jaxrdp
from jaxrdp.mechanisms.closed_form import rdp_sampled_gaussian_closed_form as closed_form

mp.mp.dps = 50

# The dense grid of the region (float64): q from 1e-6 to just below 1/5, σ from 4 to 400,
# orders from 1 + 1e-4 to 2e4 (fractional) plus every integer 2..40.
GRID_Q = np.geomspace(1e-6, 0.19999999, 14)
GRID_SIGMA = np.geomspace(4.0, 400.0, 11)
GRID_ALPHA = np.unique(np.concatenate([np.geomspace(1.0001, 2e4, 45), np.arange(2.0, 41.0)]))


def _conditions_mp(q, sigma, alpha):
  """Slack of (4) and (5) (both must be ≥ 0), in mpmath, from the theorem's statement."""
  q, s, a = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)
  big_l = mp.log(1 + 1 / (q * (a - 1)))
  slack4 = s**2 * big_l / 2 - 2 * mp.log(s) - a
  slack5 = (s**2 * big_l**2 / 2 - mp.log(5) - 2 * mp.log(s)) / (big_l + mp.log(q * a) + 1 / (2 * s**2)) - a
  return slack4, slack5


def _alpha_max_mp(q, sigma):
  """Largest order satisfying (4) and (5): both slacks decrease in α on the region (checked)."""
  lo, hi = mp.mpf(1) + mp.mpf("1e-30"), mp.mpf(1e6)
  for _ in range(200):
    mid = (lo + hi) / 2
    if min(_conditions_mp(q, sigma, mid)) >= 0:
      lo = mid
    else:
      hi = mid
  return lo


def _float32_points():
  q = GRID_Q[::2].astype(np.float32)[:, None, None]
  s = GRID_SIGMA[::2].astype(np.float32)[None, :, None]
  a = GRID_ALPHA[::3].astype(np.float32)[None, None, :]
  return np.broadcast_arrays(q, s, a)


@pytest.fixture(scope="module")
def grid():
  """The bound on the dense grid, the float32 points, and the exact RDP where the bound is finite.

  rdp_sampled_gaussian compiles for ~10 s per input shape, so it is called once, on all points.
  """
  q, s, a = np.meshgrid(GRID_Q, GRID_SIGMA, GRID_ALPHA, indexing="ij")
  bound = np.asarray(closed_form(q, s, a))
  valid = np.isfinite(bound)
  q32, s32, a32 = _float32_points()
  b32 = np.asarray(closed_form(q32, s32, a32))
  fin32 = np.isfinite(b32)
  cat = lambda x, y: np.concatenate([x[valid], y[fin32].astype(np.float64)])
  exact = np.asarray(jaxrdp.rdp_sampled_gaussian(cat(q, q32), cat(s, s32), cat(a, a32)))
  n = int(valid.sum())
  return {"q": q[valid], "sigma": s[valid], "alpha": a[valid], "bound": bound[valid], "exact": exact[:n],
          "valid": valid, "b32": b32, "fin32": fin32, "exact32": exact[n:]}


def test_bound_is_at_least_the_exact_rdp_wherever_it_is_finite(grid):
  # Dense grid above (≈ 5,000 finite points, integer and fractional orders).
  assert grid["valid"].sum() > 4000
  assert np.all(np.isfinite(grid["exact"]))
  assert np.all(grid["bound"] >= grid["exact"])


def test_bound_is_within_a_factor_four_of_the_exact_rdp(grid):
  # Measured tightness (tools/closed_form_tightness.py prints where): bound/exact lies in
  # [3.79, 4.0]; the exact RDP is ≈ q²α/(2σ²) for small q, so the ratio tends to 4.
  ratio = grid["bound"] / grid["exact"]
  assert ratio.min() > 3.7
  assert ratio.max() < 4.0 + 1e-9


def test_grid_covers_integer_and_fractional_orders(grid):
  a = grid["alpha"]
  assert np.any(a == np.round(a)) and np.any(a != np.round(a))


def test_finite_exactly_where_the_theorem_applies_on_the_grid():
  # mpmath at every 7th grid point: conditions with slack beyond 1e-9 relative decide it.
  q, s, a = np.meshgrid(GRID_Q[::3], GRID_SIGMA[::3], GRID_ALPHA[::7], indexing="ij")
  got = np.asarray(closed_form(q, s, a)).ravel()
  for qi, si, ai, gi in zip(q.ravel(), s.ravel(), a.ravel(), got):
    s4, s5 = _conditions_mp(qi, si, ai)
    if min(s4, s5) > 1e-9 * ai:
      assert np.isfinite(gi)
    elif min(s4, s5) < 0:
      assert gi == np.inf


def test_value_is_the_formula_rounded_up():
  # 2q²α/σ² at 50 digits; the result lies in [ref, ref (1 + 8 eps)].
  pts = [(1e-4, 4.0, 1.5), (0.01, 4.0, 10.0), (0.05, 7.3, 3.25), (0.19, 50.0, 10.0), (3e-3, 100.0, 200.0)]
  for q, s, a in pts:
    assert min(_conditions_mp(q, s, a)) > 0
    ref = 2 * mp.mpf(q)**2 * mp.mpf(a) / mp.mpf(s)**2
    got = float(closed_form(q, s, a))
    assert got >= ref and got <= ref * (1 + 8 * np.finfo(np.float64).eps)


@pytest.mark.parametrize("q,sigma", [(1e-5, 4.0), (1e-3, 4.0), (0.01, 4.0), (0.1, 6.0), (0.19, 4.0),
                                     (0.05, 30.0), (1e-3, 300.0), (0.19, 400.0)])
def test_order_limit_matches_mpmath(q, sigma):
  # α_max from the conditions at 50 digits: finite 1e-12 below it, +inf 1e-12 above.
  alpha_max = float(_alpha_max_mp(q, sigma))
  below, above = alpha_max * (1 - 1e-12), alpha_max * (1 + 1e-12)
  assert np.isfinite(float(closed_form(q, sigma, below)))
  assert float(closed_form(q, sigma, above)) == np.inf


def test_outside_the_box_is_infinite():
  # q = 0.2 as a binary float exceeds 1/5; σ < 4; q > 1/5.
  assert float(closed_form(0.2, 10.0, 2.0)) == np.inf
  assert np.isfinite(float(closed_form(np.nextafter(0.2, 0), 10.0, 2.0)))
  assert float(closed_form(0.01, np.nextafter(4.0, 0), 2.0)) == np.inf
  assert float(closed_form(0.3, 100.0, 2.0)) == np.inf
  assert float(closed_form(0.01, 4.0, np.inf)) == np.inf
  assert float(closed_form(0.01, 0.0, 2.0)) == np.inf


def test_special_values():
  # α = 1: the limit 2q²/σ² bounds the KL divergence (RDP is non-decreasing in α); q = 0: 0.
  assert float(closed_form(0.1, 5.0, 1.0)) == pytest.approx(2 * 0.01 / 25, rel=1e-15)
  assert np.all(np.asarray(closed_form(0.0, [1.0, 4.0], [1.0, np.inf])) == 0)


def test_float32_is_conservative(grid):
  # At float32 inputs: finite only where float64 is finite too, and ≥ the exact float64 RDP.
  q, s, a = _float32_points()
  b32, fin = grid["b32"], grid["fin32"]
  assert b32.dtype == np.float32
  b64 = np.asarray(closed_form(q.astype(np.float64), s.astype(np.float64), a.astype(np.float64)))
  assert fin.sum() > 100 and np.all(np.isfinite(b64[fin]))
  assert np.all(b32[fin].astype(np.float64) >= grid["exact32"])


def test_broadcasting_jit_and_vmap():
  q = np.array([1e-3, 0.01, 0.1])[:, None]
  orders = np.array([1.0, 2.0, 3.5, 8.0, 1e4])
  eager = np.asarray(closed_form(q, 6.0, orders))
  assert eager.shape == (3, 5)
  np.testing.assert_array_equal(np.asarray(jax.jit(closed_form)(q, 6.0, orders)), eager)
  mapped = jax.vmap(lambda qi: closed_form(qi, 6.0, orders))(jnp.asarray(q[:, 0]))
  np.testing.assert_array_equal(np.asarray(mapped), eager)


def test_gradient_is_that_of_the_formula_and_nan_free():
  g = jax.grad(closed_form, argnums=(0, 1, 2))(0.05, 5.0, 3.0)
  # d/dq, d/dσ, d/dα of 2q²α/σ², up to the 4-ulp rounding factor.
  np.testing.assert_allclose([float(x) for x in g], [4 * 0.05 * 3 / 25, -4 * 0.0025 * 3 / 125, 2 * 0.0025 / 25],
                             rtol=1e-14)
  for args in [(0.0, 5.0, 3.0), (0.05, 5.0, 1.0), (0.05, 5.0, np.inf), (0.05, 2.0, 3.0), (0.05, 5.0, 1e4),
               (0.3, 5.0, 3.0), (0.05, 0.0, 3.0)]:
    assert all(np.isfinite(float(x)) for x in jax.grad(closed_form, argnums=(0, 1, 2))(*args))


@pytest.mark.parametrize("args,name", [((-0.1, 5.0, 2.0), "sampling_rate"), ((1.1, 5.0, 2.0), "sampling_rate"),
                                       ((0.1, -5.0, 2.0), "noise_multiplier"), ((0.1, np.inf, 2.0), "noise_multiplier"),
                                       ((0.1, 5.0, 0.5), "orders"), ((0.1, 5.0, np.nan), "orders")])
def test_bad_input_raises_naming_the_argument(args, name):
  with pytest.raises(ValueError, match=name):
    closed_form(*args)


def test_complex_input_raises_type_error():
  with pytest.raises(TypeError, match="orders"):
    closed_form(0.1, 5.0, 2j)


@pytest.mark.parametrize("args", [(-0.1, 5.0, 2.0), (1.5, 5.0, 2.0), (0.1, -1.0, 2.0), (0.1, 5.0, 0.5),
                                  (np.nan, 5.0, 2.0)])
def test_under_jit_bad_input_gives_nan(args):
  assert np.isnan(float(jax.jit(closed_form)(*args)))
