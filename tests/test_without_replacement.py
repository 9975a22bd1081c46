"""Sampling without replacement (Wang, Balle, Kasiviswanathan 2019, Thm. 27 and Cor. 10).

References: tests/data/wor_reference.json, written by tools/make_wor_references.py with mpmath
from the theorem's formula (forward differences as exact alternating sums carrying ≥ 40 correct
digits, sums at 60 digits), on q ∈ {1e-4, 1e-3, 1e-2, 0.1, 0.5, 0.9} × σ ∈ {0.3, 0.5, 0.8, 1, 2,
5, 10, 30, 100} × α ∈ {2..64, 96, 128, 200, 256, 512} ∪ {2.5, 3.7, 10.3, 63.5, 100.7}; and a
float32 grid at float32 inputs. dp_accounting 0.6 (``_compute_rdp_sample_wor_gaussian``) is
the implementation compared with, live.

Tolerances: float64 1e-12 relative to the reference (measured worst 1.6e-14); float32 1e-5
relative, and never below the reference by more than 1e-5 (measured worst 1.5e-6); dp_accounting
1e-10 relative wherever its own value is within 1e-10 of the reference; gradients 1e-6 relative to
central differences.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa

from jaxrdp.mechanisms.without_replacement import rdp_sampled_gaussian_without_replacement as wor

DATA = pathlib.Path(__file__).parent / "data" / "wor_reference.json"


_PAD = 32          # every small evaluation below goes through one compiled shape ...
_MAX_ORDER = 256   # ... and one number of terms


def _at(q, sigma, alpha):
  """wor at the listed points (padded to a fixed length so that the tests share one compile)."""
  q, sigma, alpha = (np.atleast_1d(np.asarray(v, np.float64)) for v in (q, sigma, alpha))
  q, sigma, alpha = np.broadcast_arrays(q, sigma, alpha)
  n = q.size
  pad = lambda v, fill: np.concatenate([v.ravel(), np.full(_PAD - n, fill)])
  out = _jit_at(pad(q, 0.1), pad(sigma, 1.0), pad(alpha, 2.0))
  return np.asarray(out)[:n].reshape(q.shape)


# Under jit the eager range checks cannot run; the tests below that use _at also check that.
_jit_at = jax.jit(lambda q, s, a: wor(q, s, a, max_order=_MAX_ORDER))


_grad_at = jax.jit(jax.vmap(jax.grad(lambda q, s, a: wor(q, s, a, max_order=_MAX_ORDER), argnums=(0, 1, 2))))


def _reference(key):
  """The reference as a tensor grid: (q, sigma, alpha, rdp[sigma, q, alpha])."""
  with open(DATA) as f:
    points = json.load(f)[key]
  q = sorted({float(p["q"]) for p in points})
  s = sorted({float(p["sigma"]) for p in points})
  a = sorted({float(p["alpha"]) for p in points})
  rdp = np.full((len(s), len(q), len(a)), np.nan)
  for p in points:
    rdp[s.index(float(p["sigma"])), q.index(float(p["q"])), a.index(float(p["alpha"]))] = float(p["rdp"])
  assert not np.any(np.isnan(rdp))
  return np.array(q), np.array(s), np.array(a), rdp


@pytest.fixture(scope="module")
def float64_grid():
  q, s, a, ref = _reference("points")
  got = np.asarray(wor(q[None, :, None], s[:, None, None], a[None, None, :]))
  return q, s, a, ref, got


def test_matches_mpmath_reference_float64(float64_grid):
  # Tolerance 1e-12 relative over the whole reference grid (measured worst: 1.6e-14).
  q, s, a, ref, got = float64_grid
  assert got.dtype == np.float64
  np.testing.assert_allclose(got, ref, rtol=1e-12, atol=0)


def test_float32_matches_the_references_and_never_falls_below_them():
  # One float32 call on a box that contains the float32 reference grid (q ∈ {1e-3, 1e-2, 0.1,
  # 0.5}, σ ∈ {0.5, ..., 30}, α ∈ {2, 3, 4, 5, 8, ..., 256, 2.5, 10.3}, mpmath at the float32
  # inputs) and extends it to q ∈ [1e-6, 0.99], σ ∈ [0.1, 1000], α ∈ [1, 1024], where the
  # reference is the float64 result (itself within 1e-12 of mpmath, above).
  # Tolerances: on the mpmath grid 1e-5 relative (measured worst 1.5e-6); on the whole box
  # 5e-5 relative (measured worst 2.3e-5, below the 2.5e-4 that compute_epsilon allows for
  # float32 RDP values) -- in both cases also the largest shortfall below the reference.
  rq, rs, ra, ref = _reference("points_float32")
  q = np.unique(np.concatenate([rq, [1e-6, 1e-4, 0.9, 0.99]]).astype(np.float32))
  s = np.unique(np.concatenate([rs, [0.1, 0.2, 100.0, 1000.0]]).astype(np.float32))
  a = np.unique(np.concatenate([ra, [1.0, 1.5, 7.7, 200.3, 512.0, 1024.0]]).astype(np.float32))
  got = np.asarray(wor(q[None, :, None], s[:, None, None], a[None, None, :]))
  assert got.dtype == np.float32
  got = got.astype(np.float64)
  pick = np.ix_(np.searchsorted(s, rs.astype(np.float32)), np.searchsorted(q, rq.astype(np.float32)),
                np.searchsorted(a, ra.astype(np.float32)))
  rel = got[pick] / ref - 1
  assert np.max(np.abs(rel)) < 1e-5 and np.min(rel) > -1e-5
  f64 = np.asarray(wor(q[None, :, None].astype(np.float64), s[:, None, None].astype(np.float64),
                       a[None, None, :].astype(np.float64)))
  assert np.array_equal(np.isfinite(got), np.isfinite(f64))
  fin = np.isfinite(f64) & (f64 > 0)
  rel = got[fin] / f64[fin] - 1
  assert np.max(np.abs(rel)) < 5e-5 and np.min(rel) > -5e-5


# dp_accounting's grid of the brief: the rows of the reference grid it covers.
DPA_Q = [1e-4, 1e-3, 1e-2, 0.1, 0.5]
DPA_SIGMA = [0.5, 0.8, 1.0, 2.0, 5.0, 10.0]
DPA_ALPHA = list(range(2, 65)) + [128, 256]


def test_matches_dp_accounting_where_its_forward_differences_are_accurate(float64_grid):
  # At integer orders ≤ 256 the two compute the same bound. dp_accounting builds the forward
  # differences by repeated subtraction in float64, which cancels catastrophically for large σ
  # (see jaxrdp/mechanisms/without_replacement.py): at σ ≥ 5 with q ≥ 0.1 its value drifts from the
  # 50-digit reference at 66 of these 1,950 points (measured: too large at 44 points with
  # σ = 10, up to 2.1x at q = 0.1, α = 256; too small at 22 points with q = 0.5, σ = 5, α ≥ 34,
  # by up to 6.8e-10 relative at α = 43, i.e. it under-reports there). Where
  # dp_accounting is within 1e-10 of the reference, jaxrdp must be within 1e-10 of
  # dp_accounting; where it is not, jaxrdp must be within 1e-12 of the reference.
  q, s, a, ref, got = float64_grid
  qi = [list(q).index(x) for x in DPA_Q]
  si = [list(s).index(x) for x in DPA_SIGMA]
  ai = [list(a).index(x) for x in DPA_ALPHA]
  theirs_off = []
  for j, sigma in zip(si, DPA_SIGMA):
    for k, qq in zip(qi, DPA_Q):
      theirs = dpa._compute_rdp_sample_wor_gaussian(qq, sigma, DPA_ALPHA)
      mine, exact = got[j, k, ai], ref[j, k, ai]
      accurate = np.abs(theirs / exact - 1) <= 1e-10
      np.testing.assert_allclose(mine[accurate], theirs[accurate], rtol=1e-10, atol=0)
      np.testing.assert_allclose(mine[~accurate], exact[~accurate], rtol=1e-12, atol=0)
      theirs_off += [(qq, sigma, al) for al in np.array(DPA_ALPHA)[~accurate]]
  # The drift is confined to σ ≥ 5, q ≥ 0.1 and to a minority of the 1,950 points.
  assert all(sig >= 5 and qq >= 0.1 for qq, sig, _ in theirs_off)
  assert len(theirs_off) <= 66  # 66 with dp_accounting 0.6


def test_matches_dp_accounting_at_fractional_orders():
  # Corollary 10 interpolation, as dp_accounting (σ = 2: no cancellation in its differences).
  orders = [1.5, 2.5, 3.7, 10.3, 63.5, 100.7]
  qs = [1e-3, 0.05, 0.5]
  got = _at(np.array(qs)[:, None], 2.0, np.array(orders)[None, :])
  theirs = [dpa._compute_rdp_sample_wor_gaussian(qq, 2.0, orders) for qq in qs]
  np.testing.assert_allclose(got, theirs, rtol=1e-12)


def test_reference_values_from_notes():
  # dp_accounting 0.6.0, q = 0.01, σ = 1 (shared/notes/formulas.md, section 6).
  orders = np.array([1.5, 2, 2.5, 4, 8, 16, 32])
  expected = [5.43508638e-04, 5.43508638e-04, 7.37751336e-04, 1.14160656e-03, 2.68416501e-03, 3.13406092,
              11.2686355]
  np.testing.assert_allclose(_at(0.01, 1.0, orders), expected, rtol=1e-8)


def test_above_256_it_is_at_most_dp_accounting(float64_grid):
  # Beyond α = 256 dp_accounting keeps only the second argument of the minimum; jaxrdp keeps
  # both (tighter, still Theorem 27) and equals the reference at α = 512 (checked above).
  q, s, a, ref, got = float64_grid
  k = list(a).index(512.0)
  for j, sigma in enumerate(s):
    if sigma > 10:  # dp_accounting's Stirling-free sum is slow only in Python; a few rows suffice
      continue
    for i, qq in enumerate(q):
      theirs = dpa._compute_rdp_sample_wor_gaussian(qq, sigma, [512])[0]
      assert got[j, i, k] <= theirs * (1 + 1e-12)


def test_orders_between_one_and_two_take_the_order_two_value():
  # Cor. 10 with K(1) = 0 makes the bound constant on (1, 2]; at α = 1 (KL) it is used too.
  got = _at(0.03, 1.7, [1.0, 1.01, 1.5, 2.0])
  assert np.all(got == got[-1])


def test_special_values():
  # q = 0: 0 (also at α = ∞); q = 1: the Gaussian mechanism α/(2σ²); α = ∞ or σ = 0: +inf.
  q = [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.1, 0.1]
  s = [0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 0.0]
  a = [2.0, np.inf, 1.0, 3.0, 100.0, np.inf, np.inf, 2.0]
  got = _at(q, s, a)
  np.testing.assert_array_equal(got[:2], 0.0)
  np.testing.assert_allclose(got[2:5], [1 / 8, 3 / 8, 100 / 8], rtol=1e-15)
  np.testing.assert_array_equal(got[5:], np.inf)


def test_number_of_terms_follows_the_orders():
  # Concrete orders: the largest finite one, rounded up to a power of two, at most 4096; traced
  # orders: 1024; max_order overrides both.
  from jaxrdp.mechanisms.without_replacement import static_max_order
  assert static_max_order(np.array([1.5, 3.0, np.inf]), None) == 4
  assert static_max_order(np.array([3.0, 300.0]), None) == 512
  assert static_max_order(np.array([3.0, 1e6]), None) == 4096
  assert static_max_order(np.array([3.0, 1e6]), 100) == 100
  seen = []
  jax.jit(lambda o: seen.append(static_max_order(o, None)) or o)(np.array([2.0]))
  assert seen == [1024]


def test_orders_above_the_limit_are_infinite(float64_grid):
  # _at (jitted) uses max_order = 256; below it the value does not depend on the limit: it
  # equals the eager float64 grid (max_order 512) at q = 0.01, σ = 2.
  q, s, a, ref, got = float64_grid
  mine = _at(0.01, 2.0, [3.0, 256.0, 256.5, 300.0])
  assert np.all(mine[2:] == np.inf)
  grid = got[list(s).index(2.0), list(q).index(0.01), [list(a).index(3.0), list(a).index(256.0)]]
  np.testing.assert_allclose(mine[:2], grid, rtol=1e-14)


def test_broadcasts_and_vmaps(float64_grid):
  # The grid fixture is one broadcast call (σ[:, None, None], q[None, :, None], α[None, None, :]);
  # vmapping over σ gives the same rows.
  q, s, a, ref, got = float64_grid
  assert got.shape == (len(s), len(q), len(a))
  mapped = jax.jit(jax.vmap(lambda si: wor(q[:, None], si, a)))(jnp.asarray(s[:3]))
  np.testing.assert_allclose(np.asarray(mapped), got[:3], rtol=1e-15)


def test_gradients_match_finite_differences():
  # Central differences (relative step 1e-6) of the same function, float64; tolerance 1e-6.
  pts = np.array([(0.01, 2.0, 10.5), (0.5, 10.0, 100.3), (0.1, 0.7, 30.2), (1e-3, 30.0, 7.5)])
  q, s, a = pts.T
  h = 1e-6
  g = np.stack([np.asarray(x)[:4] for x in _grad_at(*(np.resize(v, _PAD) for v in (q, s, a)))], axis=-1)
  plus = _at(np.concatenate([q * (1 + h), q, q]), np.concatenate([s, s * (1 + h), s]),
             np.concatenate([a, a, a + h]))
  minus = _at(np.concatenate([q * (1 - h), q, q]), np.concatenate([s, s * (1 - h), s]),
              np.concatenate([a, a, a - h]))
  fd = ((plus - minus) / (2 * h * np.concatenate([q, s, np.ones(4)]))).reshape(3, 4).T
  np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_gradients_at_the_edges_are_finite():
  # q = 0, q = 1, σ = 0, α = ∞, α = 1, tiny σ, huge σ.
  q = [0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5]
  s = [1.0, 1.0, 0.0, 1.0, 1.0, 1e-3, 1e5]
  a = [2.0, 2.0, 2.0, np.inf, 1.0, 2.0, 200.0]
  grads = _grad_at(*(np.resize(np.array(v), _PAD) for v in (q, s, a)))
  assert all(np.all(np.isfinite(np.asarray(x))) for x in grads)


def test_float32_gradient_is_finite():
  g = jax.grad(lambda s: wor(np.float32(0.05), s, np.float32(10.5)))(np.float32(3.0))
  assert g.dtype == np.float32 and np.isfinite(float(g))


@pytest.mark.parametrize("kwargs,error,name", [
    (dict(sampling_rate=-0.1), ValueError, "sampling_rate"), (dict(sampling_rate=1.5), ValueError, "sampling_rate"),
    (dict(noise_multiplier=-1.0), ValueError, "noise_multiplier"),
    (dict(noise_multiplier=np.inf), ValueError, "noise_multiplier"),
    (dict(orders=0.5), ValueError, "orders"), (dict(orders=np.nan), ValueError, "orders"),
    (dict(orders=2j), TypeError, "orders"), (dict(max_order=1), ValueError, "max_order"),
    (dict(max_order=2.5), TypeError, "max_order")])
def test_bad_input_raises_naming_the_argument(kwargs, error, name):
  args = dict(sampling_rate=0.1, noise_multiplier=1.0, orders=2.0)
  args.update(kwargs)
  with pytest.raises(error, match=name):
    wor(**args)


def test_under_jit_bad_input_gives_nan():
  q = [-0.1, 1.5, 0.1, 0.1, np.nan, 0.1]
  s = [1.0, 1.0, -1.0, 1.0, 1.0, np.nan]
  a = [2.0, 2.0, 2.0, 0.5, 2.0, 2.0]
  assert np.all(np.isnan(_at(q, s, a)))
