"""The Relative Gaussian Mechanism: exact RDP (sound and tight), and its optax transform.

References: Hendrikx, Mangold, Bellet, AISTATS 2024 (arXiv:2308.15250), Def. 2, Def. 3, Thm. 1;
the Rényi divergence of Gaussians (Gil, Alajaji, Linder 2013), checked here against numerical
integration. Every expected value is computed in this file from the two Gaussians of an
explicit pair of outputs (mpmath, 50 digits, or float64 numpy for screening), never from the
closed form under test. Derivation: docs/relative_gaussian.md.
"""

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import optax
import pytest
from scipy import stats

from jaxrdp.mechanisms.gaussian import rdp_gaussian
from jaxrdp.mechanisms.relative_gaussian import rdp_relative_gaussian
from jaxrdp.training.relative_gaussian_transform import (RelativeGaussianNoiseState,
                                                rdp_relative_gaussian_descent,
                                                relative_gaussian_noise)

mp.mp.dps = 50


# --- references: the Rényi divergence of the two Gaussians of a pair of outputs -------------

def _divergence_from_stds_mp(dist2, su, sv, alpha, d):
  r"""D_α(N(μ_u, s_u² I_d) ‖ N(μ_v, s_v² I_d)) with ‖μ_u − μ_v‖² = dist2, in mpmath.

  D_α = α‖Δμ‖²/(2 s_α²) + d/(2(1 − α)) · log(s_α² / (s_u^{2(1−α)} s_v^{2α})), with
  s_α² = α s_v² + (1 − α) s_u² (> 0, else +∞); α = 1 is the KL divergence
  ‖Δμ‖²/(2 s_v²) + (d/2)(s_u²/s_v² − 1 − log(s_u²/s_v²)) (Gil, Alajaji, Linder 2013).
  """
  a, dist2, su, sv, d = (_mpf(x) for x in (alpha, dist2, su, sv, d))
  if a == 1:
    r = su**2 / sv**2
    return dist2 / (2 * sv**2) + d / 2 * (r - 1 - mp.log(r))
  sa2 = a * sv**2 + (1 - a) * su**2
  if sa2 <= 0:
    return mp.inf
  return a * dist2 / (2 * sa2) + d / (2 * (1 - a)) * mp.log(sa2 / (su ** (2 * (1 - a)) * sv ** (2 * a)))


def _mpf(x):
  """Exact conversion of a float (or an mpf, kept as is) to mpmath."""
  return x if isinstance(x, mp.mpf) else mp.mpf(float(x))


def _norm_mp(w):
  return mp.sqrt(mp.fsum(c * c for c in w))


def _divergence_mp(u, v, gamma, sigma, alpha, dim=None):
  """D_α between the RGM output distributions at outputs u, v (s = γ‖·‖ + σ), from the vectors."""
  u = [_mpf(c) for c in (u if isinstance(u, list) else np.atleast_1d(u))]
  v = [_mpf(c) for c in (v if isinstance(v, list) else np.atleast_1d(v))]
  g, s = _mpf(gamma), _mpf(sigma)
  dist2 = mp.fsum((p - q) ** 2 for p, q in zip(u, v))
  return _divergence_from_stds_mp(dist2, g * _norm_mp(u) + s, g * _norm_mp(v) + s, alpha,
                                  len(u) if dim is None else dim)


def _divergence_np(u, v, gamma, sigma, alpha):
  """The same formula in float64 numpy, vectorised over pairs (rows of u, v): for screening."""
  su = gamma * np.linalg.norm(u, axis=-1) + sigma
  sv = gamma * np.linalg.norm(v, axis=-1) + sigma
  d = u.shape[-1]
  t = sv / su
  dist2 = np.sum((u - v) ** 2, axis=-1)
  if alpha == 1:
    r = 1 / (t * t)
    return dist2 / (2 * sv * sv) + d / 2 * (r - 1 - np.log(r))
  w = alpha * t * t + 1 - alpha
  ok = w > 0
  ws = np.where(ok, w, 1.0)
  out = alpha * dist2 / (2 * su * su * ws) + d / (2 * (1 - alpha)) * (np.log(ws) - 2 * alpha * np.log(t))
  return np.where(ok, out, np.inf)


def _admissible_mp(u, v, eta, r_rel, gamma, sigma):
  """Def. 2 in both directions and σ ≥ γR_rel/η, checked exactly (50 digits) on the given numbers."""
  u = [_mpf(c) for c in (u if isinstance(u, list) else np.atleast_1d(u))]
  v = [_mpf(c) for c in (v if isinstance(v, list) else np.atleast_1d(v))]
  eta, r_rel = _mpf(eta), _mpf(r_rel)
  dist = _norm_mp([p - q for p, q in zip(u, v)])
  return (dist <= eta * _norm_mp(u) + r_rel and dist <= eta * _norm_mp(v) + r_rel
          and _mpf(sigma) * eta >= _mpf(gamma) * r_rel)


def _worst_pair_mp(eta, r_rel, norm_v, dim):
  """u = ((1 + η)‖v‖ + R_rel) e₁, v = ‖v‖ e₁, exactly: s_u = (1 + η) s_v when σ = γR_rel/η."""
  eta, r_rel, norm_v = _mpf(eta), _mpf(r_rel), _mpf(norm_v)
  zeros = [mp.mpf(0)] * (dim - 1)
  return [(1 + eta) * norm_v + r_rel] + zeros, [norm_v] + zeros


def _rel(ours, ref):
  return float((mp.mpf(float(ours)) - ref) / ref)


# --- the divergence formula itself -----------------------------------------------------------

@pytest.mark.parametrize("mu_p,mu_q,sp,sq,alpha", [
    (0.0, 1.0, 1.0, 1.0, 2.0), (0.3, -0.4, 1.3, 1.0, 1.5), (0.3, -0.4, 1.0, 1.3, 3.7),
    (2.0, 0.0, 0.8, 1.1, 1.2), (0.0, 0.5, 1.2, 1.0, 1.0)])
def test_gaussian_renyi_divergence_matches_numerical_integration_in_1d(mu_p, mu_q, sp, sq, alpha):
  p = lambda x: mp.npdf(x, mu_p, sp)
  q = lambda x: mp.npdf(x, mu_q, sq)
  with mp.workdps(30):
    if alpha == 1:
      integral = mp.quad(lambda x: p(x) * mp.log(p(x) / q(x)), [-mp.inf, -5, 0, 5, mp.inf])
      expected = integral
    else:
      integral = mp.quad(lambda x: p(x) ** alpha * q(x) ** (1 - alpha), [-mp.inf, -5, 0, 5, mp.inf])
      expected = mp.log(integral) / (alpha - 1)
  got = _divergence_from_stds_mp((mp.mpf(mu_p) - mu_q) ** 2, sp, sq, alpha, 1)
  assert abs(got - expected) <= 1e-15 * abs(expected)


def test_divergence_in_d_dimensions_is_the_sum_over_coordinates_of_integrals():
  """Isotropic Gaussians factorise: D_α = Σ_k log(∫ p_k^α q_k^{1−α})/(α − 1), by 1-d quadrature."""
  u, v, gamma, sigma, alpha = np.array([0.7, -0.2, 1.1]), np.array([0.1, 0.4, 0.9]), 0.8, 0.3, 1.7
  su = gamma * np.linalg.norm(u) + sigma
  sv = gamma * np.linalg.norm(v) + sigma
  total = mp.mpf(0)
  with mp.workdps(30):
    for a_k, b_k in zip(u, v):
      f = lambda x: mp.npdf(x, a_k, su) ** alpha * mp.npdf(x, b_k, sv) ** (1 - alpha)
      total += mp.log(mp.quad(f, [-mp.inf, -4, 0, 4, mp.inf])) / (alpha - 1)
  got = _divergence_mp(u, v, gamma, sigma, alpha)
  assert abs(got - total) <= 1e-15 * total


# --- soundness: never below the divergence of an admissible pair -----------------------------

def _random_pairs(rng, eta, r_rel, dim, count):
  """Admissible pairs over a wide box, half of them near the collinear worst case."""
  norm_v = 10 ** rng.uniform(-6, 6, count)
  direction = rng.standard_normal((count, dim))
  direction /= np.linalg.norm(direction, axis=1, keepdims=True)
  v = norm_v[:, None] * direction
  w = rng.standard_normal((count, dim))
  near = rng.uniform(size=count) < 0.5   # steps almost along ±v̂, the extreme directions
  sign = np.where(rng.uniform(size=count) < 0.5, 1.0, -1.0)[:, None]
  w = np.where(near[:, None], sign * direction + 1e-3 * rng.uniform() * w, w)
  w /= np.linalg.norm(w, axis=1, keepdims=True)
  radius = (eta * norm_v + r_rel) * np.where(rng.uniform(size=count) < 0.7, 1.0,
                                             rng.uniform(size=count))
  u = v + radius[:, None] * w
  dist = np.linalg.norm(u - v, axis=1)
  ok = dist <= eta * np.linalg.norm(u, axis=1) + r_rel
  return u[ok], v[ok]


def _sigma_at_least(gamma, r_rel, eta, factor):
  """σ = factor·γR_rel/η rounded so that σ·η ≥ γ·R_rel holds exactly."""
  sigma = gamma * r_rel / eta * factor
  while _mpf(sigma) * _mpf(eta) < _mpf(gamma) * _mpf(r_rel):
    sigma = np.nextafter(sigma, np.inf)
  return sigma


@pytest.mark.parametrize("seed", range(6))
def test_sound_no_admissible_pair_has_a_larger_divergence(seed):
  """Random admissible pairs, both orders, over a wide box: float64 screening, then the four
  largest within 1e-8 of ε(α) are checked exactly (admissibility and divergence in mpmath)."""
  rng = np.random.default_rng(seed)
  closest, exact_checks = 0.0, 0
  for _ in range(40):
    eta = 10 ** rng.uniform(-4, 1)   # includes η > 2, where the triangle inequality binds
    gamma = 10 ** rng.uniform(-3, 2)
    dim = int(rng.choice([1, 2, 3, 10, 100]))
    r_rel = 0.0 if rng.uniform() < 0.2 else 10 ** rng.uniform(-3, 3)
    sigma = _sigma_at_least(gamma, r_rel, eta, 1 if rng.uniform() < 0.5 else 10 ** rng.uniform(0, 1))
    if sigma == 0:
      sigma = 10 ** rng.uniform(-3, 0)
    pole = (1 + eta) ** 2 / (2 * eta + eta**2)
    alpha = 1.0 if rng.uniform() < 0.1 else 1 + (pole - 1) * rng.uniform(0.001, 0.999)
    ours = float(rdp_relative_gaussian(eta=eta, gamma=gamma, dim=dim, orders=alpha))
    u, v = _random_pairs(rng, eta, r_rel, dim, 4000)
    for p, q in [(u, v), (v, u)]:
      values = _divergence_np(p, q, gamma, sigma, alpha)
      assert values.max() <= ours * (1 + 1e-9), (eta, gamma, dim, alpha, r_rel, sigma)
      top = np.argsort(values)[::-1][:4]
      for i in top[values[top] > ours * (1 - 1e-8)]:
        if _admissible_mp(p[i], q[i], eta, r_rel, gamma, sigma):
          exact_checks += 1
          assert mp.mpf(ours) >= _divergence_mp(p[i], q[i], gamma, sigma, alpha)
      closest = max(closest, values.max() / ours)
  assert closest > 0.99   # the random search itself gets close to the supremum
  assert exact_checks > 0


def test_sound_reverse_direction_of_the_worst_pair_is_smaller():
  """Neighbours are symmetric: D_α(Q‖P) of the worst pair (larger noise second) is below ε(α)."""
  for eta, gamma, dim, alpha in [(0.01, 0.05, 10, 20.0), (0.5, 1.0, 1, 1.3), (3.0, 0.2, 5, 1.05)]:
    u, v = _worst_pair_mp(eta, 0.7, 1.3, dim)
    sigma = _mpf(gamma) * mp.mpf(0.7) / _mpf(eta)
    ours = _mpf(rdp_relative_gaussian(eta=eta, gamma=gamma, dim=dim, orders=alpha))
    assert _divergence_mp(u, v, gamma, sigma, alpha) <= ours
    assert _divergence_mp(v, u, gamma, sigma, alpha) < 0.99 * ours


# --- tightness: an explicit admissible pair attains the value --------------------------------

TIGHT = [  # (alpha, eta, gamma, dim, R_rel, ||v||)
    (2.0, 0.01, 0.01 * np.sqrt(20), 1, 1.0, 3.0),
    (2.0, 0.01, 0.01 * np.sqrt(20), 100, 0.2, 50.0),
    (1.0, 0.1, 0.3, 7, 1.0, 1e-3),
    (1 + 1e-7, 0.1, 0.3, 7, 1.0, 2.0),
    (32.0, 1e-3, 0.02, 1000, 5.0, 1e4),
    (1.3, 0.9, 2.0, 3, 0.0, 1.0),      # R_rel = 0, sigma = 0
    (1.02, 5.0, 0.7, 2, 0.3, 0.01),    # eta > 2
    (1.2, 0.3, 50.0, 20, 1.0, 1.0),    # large gamma: the variance term dominates
    (500.0, 1e-4, 1e-3, 4, 1.0, 1e6),
    (4.9, 0.1, 0.1, 10, 1.0, 1.0),     # 1 - beta*kappa = 0.181
]


@pytest.mark.parametrize("alpha,eta,gamma,dim,r_rel,norm_v", TIGHT)
def test_tight_collinear_pair_attains_the_value(alpha, eta, gamma, dim, r_rel, norm_v):
  """The pair u = (1 + η)v + R_rel v̂, σ = γR_rel/η (exact, in mpmath) reaches ε(α) within 1e-9."""
  sigma = _mpf(gamma) * _mpf(r_rel) / _mpf(eta)
  u, v = _worst_pair_mp(eta, r_rel, norm_v, dim)
  assert _admissible_mp(u, v, eta, r_rel, gamma, sigma)
  ref = _divergence_mp(u, v, gamma, sigma, alpha)
  ours = rdp_relative_gaussian(eta=eta, gamma=gamma, dim=dim, orders=alpha)
  assert 0 <= _rel(ours, ref) <= 1e-9


def test_tight_when_sigma_exceeds_its_minimum_the_value_is_approached_at_large_norms():
  alpha, eta, gamma, dim, r_rel = 3.0, 0.05, 0.1, 4, 1.0
  sigma = 5 * _mpf(gamma) * _mpf(r_rel) / _mpf(eta)
  ours = rdp_relative_gaussian(eta=eta, gamma=gamma, dim=dim, orders=alpha)
  gaps = []
  for norm_v in [1.0, 1e2, 1e4, 1e6, 1e8]:
    u, v = _worst_pair_mp(eta, r_rel, norm_v, dim)
    assert _admissible_mp(u, v, eta, r_rel, gamma, sigma)
    gaps.append(_rel(ours, _divergence_mp(u, v, gamma, sigma, alpha)))
  assert all(g > 0 for g in gaps)
  assert all(b < a for a, b in zip(gaps, gaps[1:]))
  assert gaps[-1] < 1e-5   # the gap is O(σ/(γ‖v‖))


def test_agrees_with_the_reduction_to_the_noise_ratio_in_the_notes():
  """formulas.md §1: the bound with ‖Δ‖/s_u ≤ (η/γ)min(1, r), r = s_v/s_u ∈ [1/(1+η), 1+η],
  is largest at r = 1/(1 + η), where it equals ε(α)."""
  for alpha, eta, gamma, dim in [(2.0, 0.01, 0.01 * np.sqrt(20), 1), (2.0, 0.01, 0.0447, 100),
                                 (5.0, 0.05, 0.2, 30), (1.3, 0.6, 1.0, 2)]:
    r = np.linspace(1 / (1 + eta), 1 + eta, 20001)
    w = alpha * r**2 + 1 - alpha
    bound = (alpha * (eta / gamma) ** 2 * np.minimum(1, r) ** 2 / (2 * w)
             + dim / (2 * (1 - alpha)) * np.log(w / r ** (2 * alpha)))
    ours = float(rdp_relative_gaussian(eta=eta, gamma=gamma, dim=dim, orders=alpha))
    assert np.argmax(bound) == 0                           # worst at r = 1/(1 + η)
    # the float64 grid values themselves carry ~1e-14 relative rounding
    assert bound.max() * (1 - 1e-12) <= ours <= bound.max() * (1 + 1e-12)


def test_notes_values_for_the_authors_calibration():
  """formulas.md §1: α = 2, ε = 0.1, η = 0.01, γ = η√(α/ε) gives 0.0512 (d = 1), 0.0712 (d = 100)."""
  gamma = 0.01 * np.sqrt(2 / 0.1)
  for dim, expected in [(1, 0.0512), (100, 0.0712)]:
    got = float(rdp_relative_gaussian(eta=0.01, gamma=gamma, dim=dim, orders=2.0))
    assert got == pytest.approx(expected, abs=5e-5)


# --- limits ----------------------------------------------------------------------------------

def test_infinite_from_the_seed_theorem_1_condition_on_alpha():
  for eta in [1e-3, 0.1, 1.0, 4.0]:
    pole = (1 + mp.mpf(eta)) ** 2 / (2 * mp.mpf(eta) + mp.mpf(eta) ** 2)
    above = np.nextafter(float(pole), np.inf)
    assert np.isinf(rdp_relative_gaussian(eta=eta, gamma=1.0, dim=3, orders=above))
    assert np.isinf(rdp_relative_gaussian(eta=eta, gamma=1.0, dim=3, orders=float(pole) * 1.5))
    below = float(pole) * (1 - 1e-6)
    assert np.isfinite(rdp_relative_gaussian(eta=eta, gamma=1.0, dim=3, orders=below))
    assert np.isinf(rdp_relative_gaussian(eta=eta, gamma=1.0, dim=3, orders=np.inf))


def test_order_one_is_the_kl_divergence_and_the_limit_of_orders_above_one():
  eta, gamma, dim = 0.2, 0.5, 6
  u, v = _worst_pair_mp(eta, 1.0, 2.0, dim)
  kl = _divergence_mp(u, v, gamma, _mpf(gamma) / _mpf(eta), 1.0)
  assert 0 <= _rel(rdp_relative_gaussian(eta=eta, gamma=gamma, dim=dim, orders=1.0), kl) <= 1e-13
  near = rdp_relative_gaussian(eta=eta, gamma=gamma, dim=dim,
                               orders=np.array([1 + 1e-12, 1 + 1e-9, 1 + 1e-6]))
  assert np.all(np.diff(np.asarray(near)) > 0)
  assert float(near[0]) == pytest.approx(float(kl), rel=1e-10)


def test_small_eta_at_fixed_gamma_over_eta_tends_to_the_gaussian_mechanism():
  """η → 0 with γ/η = c fixed: noise ≈ σ = cR_rel, sensitivity R_rel: ε → α/(2c²)."""
  c, dim = 3.0, 50
  for alpha in [1.0, 2.0, 10.0]:
    gauss = float(rdp_gaussian(c, alpha))
    gaps = [float(rdp_relative_gaussian(eta=e, gamma=c * e, dim=dim, orders=alpha)) / gauss - 1
            for e in [1e-2, 1e-4, 1e-6, 1e-8]]
    assert all(g > 0 for g in gaps)
    assert all(b < a for a, b in zip(gaps, gaps[1:]))
    assert gaps[-1] < 1e-6


def test_large_gamma_leaves_the_variance_ratio_leak():
  """γ → ∞ removes the mean term but not the leak through the noise level (d/2 · bracket)."""
  eta, alpha, dim = 0.1, 2.0, 3
  # Same means, noise levels (1 + η) : 1 (the extreme ratio): the divergence that remains.
  floor = _divergence_from_stds_mp(0, 1 + _mpf(eta), 1, alpha, dim)
  assert floor > 0
  assert 0 <= _rel(rdp_relative_gaussian(eta=eta, gamma=1e9, dim=dim, orders=alpha), floor) <= 1e-12


def test_affine_in_the_dimension_and_dim_one_allowed():
  a, e, g = 3.0, 0.05, 0.2
  vals = np.asarray(rdp_relative_gaussian(eta=e, gamma=g, dim=np.array([1, 2, 3, 1000]), orders=a))
  assert vals[2] - vals[1] == pytest.approx(vals[1] - vals[0], rel=1e-10)
  assert vals[3] - vals[0] == pytest.approx(999 * (vals[1] - vals[0]), rel=1e-9)


# --- validation, jit, vmap, dtypes -----------------------------------------------------------

@pytest.mark.parametrize("args,name", [
    ((0.1, 1.0, 2, 0.5), "orders"), ((0.1, 1.0, 2, np.nan), "orders"),
    ((0.0, 1.0, 2, 2.0), "eta"), ((-1.0, 1.0, 2, 2.0), "eta"), ((np.inf, 1.0, 2, 2.0), "eta"),
    ((0.1, 0.0, 2, 2.0), "gamma"), ((0.1, np.inf, 2, 2.0), "gamma"),
    ((0.1, 1.0, 0, 2.0), "dim"), ((0.1, 1.0, -3, 2.0), "dim"),
])
def test_bad_input_raises_naming_the_argument_and_range(args, name):
  with pytest.raises(ValueError, match=rf"{name} must lie in"):
    rdp_relative_gaussian(**dict(zip(("eta", "gamma", "dim", "orders"), args)))


def test_non_integer_dim_and_bad_dtypes_raise():
  with pytest.raises(ValueError, match="dim must be a positive integer"):
    rdp_relative_gaussian(eta=0.1, gamma=1.0, dim=2.5, orders=2.0)
  with pytest.raises(TypeError, match="gamma"):
    rdp_relative_gaussian(eta=0.1, gamma=1.0 + 0j, dim=2, orders=2.0)
  with pytest.raises(TypeError, match="dim"):
    rdp_relative_gaussian(eta=0.1, gamma=1.0, dim=True, orders=2.0)


@pytest.mark.parametrize("args", [(0.1, 1.0, 2.0, 0.5), (0.0, 1.0, 2.0, 2.0), (0.1, -1.0, 2.0, 2.0),
                                  (0.1, 1.0, 0.0, 2.0), (0.1, 1.0, 2.5, 2.0), (0.1, 1.0, 2.0, np.nan),
                                  (np.inf, 1.0, 2.0, 2.0)])
def test_invalid_input_under_jit_gives_nan(args):
  kwargs = dict(zip(("eta", "gamma", "dim", "orders"), args))
  assert np.isnan(jax.jit(rdp_relative_gaussian)(**kwargs))


def test_jit_and_vmap_match_eager():
  alpha = jnp.array([1.0, 1.5, 2.0, 8.0, 40.0, jnp.inf])
  eta = jnp.array([1e-3, 0.01, 0.1, 0.02, 1e-3, 0.5])
  gamma = jnp.array([0.01, 0.1, 1.0, 0.05, 0.002, 3.0])
  dim = jnp.array([1, 10, 3, 100, 7, 2])
  eager = np.array([float(rdp_relative_gaussian(eta=e, gamma=g, dim=d, orders=a))
                    for a, e, g, d in zip(alpha, eta, gamma, dim)])
  for transformed in (jax.jit(rdp_relative_gaussian), jax.vmap(rdp_relative_gaussian)):
    np.testing.assert_array_equal(
        np.asarray(transformed(eta=eta, gamma=gamma, dim=dim, orders=alpha)), eager)
  grid = rdp_relative_gaussian(eta=0.01, gamma=gamma[None, :], dim=5, orders=alpha[:, None])
  assert grid.shape == (6, 6)


def test_float32_is_never_below_the_exact_value_and_keeps_its_dtype():
  rng = np.random.default_rng(7)
  for _ in range(200):
    eta = np.float32(10 ** rng.uniform(-4, 0.5))
    gamma = np.float32(10 ** rng.uniform(-3, 2))
    dim = int(rng.integers(1, 10_000))
    pole = (1 + float(eta)) ** 2 / (2 * float(eta) + float(eta) ** 2)
    alpha = np.float32(1 + (pole - 1) * rng.uniform(0, 0.99))
    got = rdp_relative_gaussian(eta=eta, gamma=gamma, dim=dim, orders=alpha)
    assert got.dtype == jnp.float32
    u, v = _worst_pair_mp(float(eta), 0.0, 1.0, 1)
    ref = _divergence_mp(u, v, float(gamma), 0.0, float(alpha), dim=dim)
    assert 0 <= _rel(got, ref) <= 2e-4    # 1 − βκ ≥ 0.01 here: at most ~1e-4 of rounding-up


def test_differentiable_in_gamma_with_the_derivative_of_the_divergence():
  alpha, eta, gamma, dim = 3.0, 0.05, 0.2, 4
  u, v = _worst_pair_mp(eta, 0.0, 1.0, dim)
  expected = mp.diff(lambda g: _divergence_mp(u, v, g, 0.0, alpha), mp.mpf(gamma))
  of_gamma = lambda g: rdp_relative_gaussian(eta=eta, gamma=g, dim=float(dim), orders=alpha)
  got = jax.grad(of_gamma)(gamma)
  assert float(got) == pytest.approx(float(expected), rel=1e-12)
  d_orders_eta = jax.grad(lambda a, e: rdp_relative_gaussian(eta=e, gamma=0.2, dim=4.0, orders=a),
                          argnums=(0, 1))(1.0, 0.05)
  assert np.all(np.isfinite(d_orders_eta))


# --- the optax transform ---------------------------------------------------------------------

def _updates():
  return {"w": jnp.full((40, 25), 0.1), "b": jnp.arange(6.0).reshape(2, 3) / 10}


def _global_norm(tree):
  return float(np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(tree))))


def test_noise_has_mean_zero_and_standard_deviation_gamma_norm_plus_sigma():
  """Chi-square test of the variance and z-test of the mean; false-failure rate 1e-6 each."""
  gamma, sigma, steps = 0.3, 0.5, 200
  g = _updates()
  std = gamma * _global_norm(g) + sigma
  tx = relative_gaussian_noise(0.01, gamma, sigma, jax.random.key(0))
  update = jax.jit(tx.update)
  state, noise = tx.init(g), []
  for _ in range(steps):
    out, state = update(g, state)
    noise.append(np.concatenate([np.ravel(np.asarray(o, np.float64) - np.asarray(x, np.float64))
                                 for o, x in zip(jax.tree.leaves(out), jax.tree.leaves(g))]))
  z = np.concatenate(noise)
  n = z.size
  assert abs(z.mean()) <= stats.norm.isf(0.5e-6) * std / np.sqrt(n)
  chi2 = np.sum((z - z.mean()) ** 2) / std**2
  assert stats.chi2.ppf(0.5e-6, n - 1) <= chi2 <= stats.chi2.isf(0.5e-6, n - 1)


def test_zero_update_gets_noise_of_standard_deviation_sigma():
  tx = relative_gaussian_noise(0.01, 5.0, 0.25, 3)
  g = {"x": jnp.zeros(100_000)}
  out, _ = tx.update(g, tx.init(g))
  z = np.asarray(out["x"], np.float64)
  chi2 = np.sum((z - z.mean()) ** 2) / 0.25**2
  assert stats.chi2.ppf(0.5e-6, z.size - 1) <= chi2 <= stats.chi2.isf(0.5e-6, z.size - 1)


def test_fresh_key_every_step_and_reproducible_from_the_key():
  g = _updates()
  tx = relative_gaussian_noise(0.01, 0.1, 0.1, jax.random.key(42))
  s0 = tx.init(g)
  out1, s1 = tx.update(g, s0)
  out2, s2 = tx.update(g, s1)
  assert isinstance(s1, RelativeGaussianNoiseState)
  assert int(s0.count) == 0 and int(s1.count) == 1 and int(s2.count) == 2
  assert not np.array_equal(jax.random.key_data(s0.rng_key), jax.random.key_data(s1.rng_key))
  assert not np.allclose(out1["w"], out2["w"])
  again, _ = relative_gaussian_noise(0.01, 0.1, 0.1, jax.random.key(42)).update(g, s0)
  np.testing.assert_array_equal(out1["w"], again["w"])
  same = {"a": jnp.zeros(50), "b": jnp.zeros(50)}   # equal leaves get independent noise
  out, _ = tx.update(same, tx.init(same))
  assert not np.allclose(out["a"], out["b"])


def test_jit_update_matches_eager_and_state_is_a_pytree():
  g = _updates()
  tx = relative_gaussian_noise(0.01, 0.2, 0.3, 7)
  state = tx.init(g)
  eager, s_eager = tx.update(g, state)
  jitted, s_jit = jax.jit(tx.update)(g, state)
  for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
  assert jax.tree.structure(s_eager) == jax.tree.structure(s_jit)
  assert len(jax.tree.leaves(state)) == 2


def test_chains_with_an_optimizer_under_jit():
  params = {"w": jnp.ones(5)}
  tx = optax.chain(relative_gaussian_noise(0.01, 0.1, 0.0, jax.random.key(1)), optax.sgd(0.1))

  @jax.jit
  def step(p, s):
    upd, s = tx.update(jax.grad(lambda q: jnp.sum(q["w"] ** 2))(p), s, p)
    return optax.apply_updates(p, upd), s

  p, s = params, tx.init(params)
  for _ in range(50):
    p, s = step(p, s)
  assert float(jnp.linalg.norm(p["w"])) < 0.5 * float(jnp.linalg.norm(params["w"]))


def test_key_accepts_typed_raw_and_int_and_refuses_none():
  g = {"x": jnp.zeros(4)}
  typed_tx = relative_gaussian_noise(0.1, 0.1, 1.0, jax.random.key(5))
  typed = typed_tx.update(g, typed_tx.init(g))[0]
  raw_tx = relative_gaussian_noise(0.1, 0.1, 1.0, jax.random.PRNGKey(5))
  raw = raw_tx.update(g, raw_tx.init(g))[0]
  int_tx = relative_gaussian_noise(0.1, 0.1, 1.0, 5)
  seeded = int_tx.update(g, int_tx.init(g))[0]
  np.testing.assert_array_equal(typed["x"], raw["x"])
  np.testing.assert_array_equal(typed["x"], seeded["x"])
  with pytest.raises(TypeError, match="key is required"):
    relative_gaussian_noise(0.1, 0.1, 1.0, None)
  with pytest.raises(TypeError, match="key"):
    relative_gaussian_noise(0.1, 0.1, 1.0, 1.5)
  with pytest.raises(TypeError, match="key"):
    relative_gaussian_noise(0.1, 0.1, 1.0, True)
  with pytest.raises(ValueError, match="single PRNG key"):
    relative_gaussian_noise(0.1, 0.1, 1.0, jax.random.split(jax.random.key(0), 3))


def test_transform_validates_its_parameters():
  with pytest.raises(ValueError, match="eta must lie in"):
    relative_gaussian_noise(0.0, 0.1, 1.0, 0)
  with pytest.raises(ValueError, match="gamma must lie in"):
    relative_gaussian_noise(0.1, -0.1, 1.0, 0)
  with pytest.raises(ValueError, match="sigma must lie in"):
    relative_gaussian_noise(0.1, 0.1, -1.0, 0)
  with pytest.raises(ValueError, match=r"sigma must be >= gamma \* r_rel / eta"):
    relative_gaussian_noise(0.1, 0.2, 0.9, 0, r_rel=0.5)   # needs sigma >= 1
  relative_gaussian_noise(0.1, 0.2, 1.0, 0, r_rel=0.5)


def test_rdp_after_k_steps_is_k_times_one_step():
  orders = np.array([1.0, 2.0, 10.0, 1e6, np.inf])
  args = dict(eta=0.01, gamma=0.05, dim=12)
  one = np.asarray(rdp_relative_gaussian(**args, orders=orders))
  forty = rdp_relative_gaussian_descent(**args, steps=40, orders=orders)
  np.testing.assert_array_equal(np.asarray(forty), 40 * one)
  none = rdp_relative_gaussian_descent(**args, steps=0, orders=orders)
  np.testing.assert_array_equal(np.asarray(none), np.zeros(5))
  with pytest.raises(ValueError, match="steps must lie in"):
    rdp_relative_gaussian_descent(**args, steps=-1, orders=2.0)
  assert np.isnan(jax.jit(rdp_relative_gaussian_descent)(eta=0.01, gamma=0.05, dim=12.0, steps=-1.0,
                                                         orders=2.0))
