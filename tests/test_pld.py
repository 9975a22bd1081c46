"""The PLD accountant: ``jaxrdp.pld_epsilon`` / ``pld_delta`` / ``pld_grid`` (jaxrdp.accounting.pld).

References, none computed by the code under test:

* ``dp_accounting.pld.PLDAccountant`` (Google's PLD accountant, pessimistic estimate, the same
  discretisation interval 1e-4): the same quantity, the pessimistic connect-the-dots bound of
  the Poisson-subsampled Gaussian (add/remove, the larger direction), computed independently;
* ``prv_accountant.PRVAccountant`` (Gopi, Lee, Wutschitz 2021): its ``eps_lower`` is a
  certified lower bound on the true ε, which a pessimistic bound can never be below (used where
  ε ≤ 50; above, its error bounds were found invalid, see tests/test_soundness.py);
* ``jaxrdp.dpsgd_epsilon`` (RDP): a looser upper bound on the same ε, so the PLD ε must not
  exceed it beyond the discretisation's allowance;
* central differences for the derivatives, identities (δ(ε(δ)) = δ, q = 0 or T = 0 gives ε = 0)
  and monotonicity of the true ε for the rest.

Configurations are drawn with a fixed seed from the box q ∈ [1e-3, 0.3] (log-uniform),
σ ∈ [0.6, 5], T ∈ [30, 3·10⁴] (log-uniform integer), δ ∈ [1e-8, 1e-5] (log-uniform).

Speed: every PldGrid (array shapes) compiles its own program (~1.5 s), so each family of
configurations is evaluated on one grid made for the whole family (``pld_grid`` documents that a
grid made for wider schedules serves narrower ones: a valid bound, here the same value to ~1e-9),
and the reference values are computed once per module.
"""

from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
import jaxrdp

SEED = 20261126
INTERVAL = 1e-4          # dp_accounting's PLDAccountant default, and jaxrdp's
PRV_MAX_EPSILON = 50.0   # above it the PRV accountant's lower bound is not trusted
# Pessimistic bounds of the same quantity on the same grid spacing: pld_epsilon's docstring
# promises agreement with dp_accounting within 0.01 % on this box (the issue asks for
# ours ≤ 1.01 × theirs and ours ≥ (1 − 1e-3) × theirs; the documented band is inside both).
DP_ACCOUNTING_RTOL = 1e-4

# One configuration for the single-point tests: the anchor of ../shared/notes/anchors.md
# (dp_accounting PLD 5.1926, prv 5.1823 / 5.2029).
Q, SIGMA, T, DELTA = 0.01, 1.1, 10_000, 1e-5


# ---------------------------------------------------------------------------------------------
# Configurations and references.


def _constant_configs(n, seed):
  """(q, σ, T, δ) drawn from the box; q, T and δ log-uniform, T an integer."""
  rng = np.random.default_rng(seed)
  q = np.exp(rng.uniform(math.log(1e-3), math.log(0.3), n))
  sigma = rng.uniform(0.6, 5.0, n)
  steps = np.floor(np.exp(rng.uniform(math.log(30), math.log(3e4 + 1), n)))
  delta = np.exp(rng.uniform(math.log(1e-8), math.log(1e-5), n))
  return [(np.array([a]), np.array([b]), np.array([c]), d)
          for a, b, c, d in zip(q, sigma, steps, delta)]


def _two_phase_configs(n, seed):
  """Two-phase schedules: each phase drawn from the box, T per phase in [15, 1.5·10⁴] so that
  the whole run stays within T ∈ [30, 3·10⁴]."""
  rng = np.random.default_rng(seed)
  q = np.exp(rng.uniform(math.log(1e-3), math.log(0.3), (n, 2)))
  sigma = rng.uniform(0.6, 5.0, (n, 2))
  steps = np.floor(np.exp(rng.uniform(math.log(15), math.log(1.5e4 + 1), (n, 2))))
  delta = np.exp(rng.uniform(math.log(1e-8), math.log(1e-5), n))
  return list(zip(q, sigma, steps, delta))


def _dp_accounting_epsilon(q, sigma, steps, delta):
  """dp_accounting's PLDAccountant (pessimistic, Δ = 1e-4), one composed event per phase."""
  accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=INTERVAL)
  for qi, si, ti in zip(q, sigma, steps):
    accountant.compose(dp_accounting.PoissonSampledDpEvent(
        float(qi), dp_accounting.GaussianDpEvent(float(si))), int(ti))
  return float(accountant.get_epsilon(float(delta)))


def _prv_lower_bound(q, sigma, steps, delta, eps_scale):
  """The PRV accountant's certified lower bound on ε (ε error 1 % of the expected ε, δ error
  δ/1000), or None where the reference itself fails (its discretiser's sanity check)."""
  from prv_accountant import PRVAccountant
  from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism
  prvs = [PoissonSubsampledGaussianMechanism(sampling_probability=float(qi),
                                             noise_multiplier=float(si))
          for qi, si in zip(q, sigma)]
  counts = [int(ti) for ti in steps]
  try:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
      warnings.simplefilter("ignore")
      accountant = PRVAccountant(prvs=prvs, max_self_compositions=counts,
                                 eps_error=max(0.01, 0.01 * eps_scale), delta_error=delta / 1000)
      lower, _, _ = accountant.compute_epsilon(delta=delta, num_self_compositions=counts)
  except RuntimeError:   # "Discrete mean differs from continuous mean significantly."
    return None
  return float(lower)


def _family_grid(configs):
  """One grid for a family (leading axis: schedules, last axis: phases)."""
  q, sigma, steps, _ = (np.stack([np.asarray(c[i]) for c in configs]) for i in range(4))
  return jaxrdp.pld_grid(q, sigma, steps)


def _evaluate(configs):
  """(ours, dp_accounting's) ε for each configuration, ours on one grid for the family."""
  grid = _family_grid(configs)
  ours = np.array([float(jaxrdp.pld_epsilon(q, s, t, d, pld_grid=grid)) for q, s, t, d in configs])
  theirs = np.array([_dp_accounting_epsilon(*c) for c in configs])
  return ours, theirs


@pytest.fixture(scope="module")
def constant():
  configs = _constant_configs(8, SEED)
  ours, theirs = _evaluate(configs)
  return configs, ours, theirs


@pytest.fixture(scope="module")
def two_phase():
  configs = _two_phase_configs(4, SEED + 1)
  ours, theirs = _evaluate(configs)
  return configs, ours, theirs


# One grid for the single-configuration tests: the one an eager call at (Q, SIGMA, T) sizes for
# itself; every other point they use is narrower (smaller q or T, larger σ), so they share one
# compiled program per function.
@functools.lru_cache(maxsize=None)
def _shared_grid():
  return jaxrdp.pld_grid(Q, SIGMA, T)


def _eps(q, sigma, steps, delta):
  return jaxrdp.pld_epsilon(q, sigma, steps, delta, pld_grid=_shared_grid())


# ---------------------------------------------------------------------------------------------
# Against independent accountants.


def _assert_agrees_with_dp_accounting(configs, ours, theirs):
  ratio = ours / theirs
  bad = [(c, o, t) for c, o, t, r in zip(configs, ours, theirs, ratio)
         if not 1 - DP_ACCOUNTING_RTOL <= r <= 1 + DP_ACCOUNTING_RTOL]
  assert bad == [], bad


def test_epsilon_agrees_with_dp_accounting_pld_accountant(constant):
  # Both are the pessimistic connect-the-dots bound at Δ = 1e-4 of the same dominating pairs:
  # they may differ only by rounding and by how far out each truncates the tails.
  _assert_agrees_with_dp_accounting(*constant)


def test_two_phase_epsilon_agrees_with_dp_accounting_pld_accountant(two_phase):
  # dp_accounting composes the two phases' events one after the other (compose(event, count)).
  _assert_agrees_with_dp_accounting(*two_phase)


def _short_configs(n, seed):
  """Short schedules (1 to 4 phases of 5 to 400 steps, q in [0.005, 0.1], σ in [0.6, 2]) at δ
  in [1e-10, 1e-4]: heavy upper tails on the narrow windows their own grids get."""
  rng = np.random.default_rng(seed)
  configs = []
  for _ in range(n):
    k = int(rng.integers(1, 5))
    configs.append((rng.uniform(0.005, 0.1, k), rng.uniform(0.6, 2.0, k),
                    np.full(k, float(rng.integers(5, 401))), float(10.0 ** -rng.uniform(4, 10))))
  return configs


# Found 1 % to 3.5 % above dp_accounting with the grid an eager call sizes for itself (the tilt
# of the composition too large for its window, so that the circle wrapped the upper tail onto
# the losses read): 2 × 90 steps at (0.0111, 1.236), (0.0150, 1.218); 187 steps at
# (0.0243, 1.157); 2 × 71 steps at (0.0338, 1.013), (0.0235, 1.412); δ = 1e-5.
_WRAPPED = [(np.array([0.01113279, 0.01497133]), np.array([1.23649953, 1.21775161]),
             np.array([90.0, 90.0]), 1e-5),
            (np.array([0.02431181]), np.array([1.15722386]), np.array([187.0]), 1e-5),
            (np.array([0.033772, 0.02351645]), np.array([1.0132952, 1.41221948]),
             np.array([71.0, 71.0]), 1e-5)]


def test_short_schedules_on_their_own_grids_agree_with_dp_accounting():
  configs = _WRAPPED + _short_configs(3, SEED + 4)
  ours = np.array([float(jaxrdp.pld_epsilon(q, s, t, d)) for q, s, t, d in configs])
  theirs = np.array([_dp_accounting_epsilon(*c) for c in configs])
  _assert_agrees_with_dp_accounting(configs, ours, theirs)


# Long schedules read at small δ: the window sizing's bound on the wrapped mass is loose there
# (the Chernoff orders above λ* see the far upper tail poorly), so the tilt it lowers to
# (alone: +3.3e-4 above dp_accounting at (0.001, 0.8, 30,000, 1e-8)) is composed beside λ*
# and the smaller mass kept at each point.
_LONG_SMALL_DELTA = [(np.array([0.001]), np.array([0.8]), np.array([30_000.0]), 1e-8),
                     (np.array([0.0063827]), np.array([1.1847645]), np.array([28_754.0]),
                      7.19e-10)]


def test_long_schedules_at_small_delta_on_their_own_grids_agree_with_dp_accounting():
  ours = np.array([float(jaxrdp.pld_epsilon(q, s, t, d)) for q, s, t, d in _LONG_SMALL_DELTA])
  theirs = np.array([_dp_accounting_epsilon(*c) for c in _LONG_SMALL_DELTA])
  _assert_agrees_with_dp_accounting(_LONG_SMALL_DELTA, ours, theirs)


def test_a_second_tilt_in_one_lane_leaves_the_others_bitwise_under_vmap():
  # (0.001, 0.8) composes at two tilts, (0.002, 1.0) at one: under vmap both lanes compose
  # twice, the second lane its one tilt again; every lane is what its own call gives, to the
  # last few ulps: the composed PMFs are bitwise the same, but XLA reduces the read-out's
  # sums in an order it picks per shape (with a batch axis or without: 8 ulps apart on
  # (65,536, 131,072) points, within the rounding allowance ε carries). A tilt 10 % off
  # moves this lane's ε by 1e-7 relative.
  q, s, steps, delta = _LONG_SMALL_DELTA[0]
  grid = jaxrdp.pld_grid(q, s, steps, interval=INTERVAL, delta=delta)
  f = lambda q, s: jaxrdp.pld_epsilon(q, s, steps[0], delta, pld_grid=grid)
  qs, sigmas = jnp.array([0.001, 0.002]), jnp.array([0.8, 1.0])
  batched = np.asarray(jax.jit(jax.vmap(f))(qs, sigmas))
  alone = np.array([float(jax.jit(f)(a, b)) for a, b in zip(qs, sigmas)])
  np.testing.assert_allclose(batched, alone, rtol=1e-14, atol=0)


def test_epsilon_is_never_below_the_prv_accountants_lower_bound(constant):
  # (Two-phase schedules: in the slow test; the PRV accountant takes seconds per schedule.)
  checked = 0
  configs, ours, theirs = constant
  for (q, sigma, steps, delta), eps, reference in zip(configs, ours, theirs):
    if reference > PRV_MAX_EPSILON:
      continue
    lower = _prv_lower_bound(q, sigma, steps, delta, reference)
    assert lower is not None, (q, sigma, steps, delta)  # it handles every drawn configuration
    assert eps >= lower, (q, sigma, steps, delta, eps, lower)
    checked += 1
  assert checked == len(configs)   # every drawn configuration has ε ≤ 50


def test_epsilon_is_never_above_the_rdp_epsilon(constant):
  # RDP's ε (jaxrdp's own accountant, Mironov 2017 with the improved conversion) bounds the same
  # true ε from above, less tightly; the PLD bound exceeds the truth by at most its
  # discretisation allowance, so it stays below RDP's up to that allowance.
  configs, ours, _ = constant
  for (q, sigma, steps, delta), eps in zip(configs, ours):
    rdp = float(jaxrdp.dpsgd_epsilon(q, sigma, steps, delta))
    assert eps <= rdp * 1.01 + 1e-3, (q, sigma, steps, delta, eps, rdp)


@pytest.mark.slow   # ~1.5 min: 40 constant and 10 two-phase schedules against both references
def test_many_random_configurations_agree_with_dp_accounting_and_stay_above_prv():
  figures = {}
  for name, configs in (("constant", _constant_configs(40, SEED + 2)),
                        ("two_phase", _two_phase_configs(10, SEED + 3))):
    ours, theirs = _evaluate(configs)
    _assert_agrees_with_dp_accounting(configs, ours, theirs)
    to_prv, failed = [], []
    for (q, sigma, steps, delta), eps, reference in zip(configs, ours, theirs):
      if reference > PRV_MAX_EPSILON:
        continue
      lower = _prv_lower_bound(q, sigma, steps, delta, reference)
      if lower is None:   # the reference failed, not the code under test
        failed.append((q, sigma, steps, delta))
        continue
      assert eps >= lower, (q, sigma, steps, delta, eps, lower)
      if lower > 0:
        to_prv.append(eps / lower)
    figures[name] = dict(max_ratio_to_dp_accounting=float(np.max(ours / theirs)),
                         min_ratio_to_dp_accounting=float(np.min(ours / theirs)),
                         min_ratio_to_prv_lower=float(min(to_prv)),
                         max_ratio_to_prv_lower=float(max(to_prv)), prv_checked=len(to_prv),
                         prv_failed=failed)
    assert len(to_prv) >= 0.6 * len(configs)   # the PRV accountant handled most of them
  print(figures)


# ---------------------------------------------------------------------------------------------
# Derivatives: jax.grad against central differences (the discretised ε is piecewise smooth).


def _central_difference(f, x, rel_step=1e-5):
  h = rel_step * x
  return (float(f(x + h)) - float(f(x - h))) / (2 * h)


def test_gradient_in_noise_multiplier_sampling_rate_and_delta_matches_central_differences():
  # jax.grad without a grid: an eager derivative sizes the grid from the primal values.
  grads = jax.grad(jaxrdp.pld_epsilon, argnums=(0, 1, 3))(Q, SIGMA, T, DELTA)
  want = (_central_difference(lambda q: _eps(q, SIGMA, T, DELTA), Q),
          _central_difference(lambda s: _eps(Q, s, T, DELTA), SIGMA),
          _central_difference(lambda d: _eps(Q, SIGMA, T, d), DELTA))
  np.testing.assert_allclose(np.array([float(g) for g in grads]), np.array(want), rtol=2e-3)
  assert float(grads[0]) > 0 and float(grads[1]) < 0 and float(grads[2]) < 0


def test_gradient_of_a_two_phase_schedule_matches_central_differences_per_phase():
  q, sigma, steps = np.array([0.01, 0.005]), np.array([1.3, 1.1]), np.array([3000.0, 7000.0])
  grad_q, grad_sigma = jax.grad(jaxrdp.pld_epsilon, argnums=(0, 1))(q, sigma, steps, DELTA)
  for i in range(2):
    unit = np.eye(2)[i]
    want_q = _central_difference(lambda x: _eps(q + (x - q[i]) * unit, sigma, steps, DELTA), q[i])
    want_s = _central_difference(lambda x: _eps(q, sigma + (x - sigma[i]) * unit, steps, DELTA),
                                 sigma[i])
    np.testing.assert_allclose(float(grad_q[i]), want_q, rtol=2e-3)
    np.testing.assert_allclose(float(grad_sigma[i]), want_s, rtol=2e-3)


# ---------------------------------------------------------------------------------------------
# Properties of the true ε that the bound keeps.


def test_epsilon_decreases_with_noise_multiplier():
  eps = [float(_eps(Q, s, T, DELTA)) for s in (1.1, 1.3, 1.6, 2.0)]
  assert np.all(np.diff(eps) < 0), eps


def test_epsilon_increases_with_sampling_rate():
  eps = [float(_eps(q, SIGMA, T, DELTA)) for q in (0.001, 0.002, 0.005, 0.01)]
  assert np.all(np.diff(eps) > 0), eps


def test_epsilon_increases_with_steps():
  eps = [float(_eps(Q, SIGMA, t, DELTA)) for t in (100, 1000, 3000, 10_000)]
  assert np.all(np.diff(eps) > 0), eps


def test_delta_at_the_returned_epsilon_is_the_requested_delta():
  # ε(δ) is the root of δ(ε) = δ on the same discretised PLD: pld_delta inverts pld_epsilon.
  # Each reads a composition tilted at its own Chernoff order and raised by its own rounding
  # bound (jaxrdp.accounting.pld.convolution._spectrum_error), a few 1e-6 of δ here: the two
  # agree to that, and δ(ε(δ)) is never below δ (both are upper bounds of the same exact curve).
  grid = _shared_grid()
  for delta in (1e-8, 1e-6, 1e-5):
    eps = jaxrdp.pld_epsilon(Q, SIGMA, T, delta, pld_grid=grid)
    back = float(jaxrdp.pld_delta(Q, SIGMA, T, eps, pld_grid=grid))
    assert back == pytest.approx(delta, rel=2e-5)


# ---------------------------------------------------------------------------------------------
# jit and vmap.


@functools.lru_cache(maxsize=None)
def _jitted():
  """pld_epsilon under jit with every argument traced, on the grid for (Q, SIGMA, T)."""
  return jax.jit(functools.partial(jaxrdp.pld_epsilon, pld_grid=_shared_grid()))


def test_jit_with_a_grid_gives_the_eager_value():
  eager = float(jaxrdp.pld_epsilon(Q, SIGMA, T, DELTA))   # sizes its grid from the values
  jitted = float(_jitted()(jnp.float64(Q), jnp.float64(SIGMA), jnp.float64(T), jnp.float64(DELTA)))
  assert jitted == pytest.approx(eager, rel=1e-8)


def test_jit_without_a_grid_raises_naming_pld_grid():
  with pytest.raises(ValueError, match="pld_grid"):
    jax.jit(lambda s: jaxrdp.pld_epsilon(Q, s, T, DELTA))(SIGMA)


def test_vmap_over_noise_multiplier_equals_a_loop():
  # Without a grid: an eager vmap sizes one grid for all the batched values.
  sigmas = np.array([1.1, 1.3, 1.6, 2.0])
  batched = jax.vmap(lambda s: jaxrdp.pld_epsilon(Q, s, T, DELTA))(sigmas)
  looped = [float(_eps(Q, s, T, DELTA)) for s in sigmas]
  np.testing.assert_allclose(np.asarray(batched), looped, rtol=1e-8)


# ---------------------------------------------------------------------------------------------
# Precision and bad input.


def test_float32_is_refused_naming_the_dtype():
  # Without x64, Python floats become float32; with it, float32 arrays for q, σ and T keep the
  # computation in float32 (a float32 array against float64 ones would be promoted).
  with jax.enable_x64(False):
    with pytest.raises(TypeError, match="float32"):
      jaxrdp.pld_epsilon(Q, SIGMA, T, DELTA)
  f32 = [np.float32(v) for v in (Q, SIGMA, T)]
  with pytest.raises(TypeError, match="float32"):
    jaxrdp.pld_epsilon(*f32, DELTA)
  with pytest.raises(TypeError, match="float32"):
    jaxrdp.pld_delta(*f32, 1.0)


@pytest.mark.parametrize("args,name", [
    ((1.5, SIGMA, T, DELTA), "sampling_rate"),
    ((-0.1, SIGMA, T, DELTA), "sampling_rate"),
    ((Q, -1.0, T, DELTA), "noise_multiplier"),
    ((Q, SIGMA, 2.5, DELTA), "steps"),
    ((Q, SIGMA, -3, DELTA), "steps"),
    ((Q, SIGMA, T, 0.0), "delta"),
    ((Q, SIGMA, T, 1.0), "delta"),
])
def test_invalid_argument_raises_naming_it(args, name):
  with pytest.raises(ValueError, match=name):
    jaxrdp.pld_epsilon(*args)


def test_negative_epsilon_for_delta_raises_naming_it():
  with pytest.raises(ValueError, match="epsilon"):
    jaxrdp.pld_delta(Q, SIGMA, T, -1.0)


@pytest.mark.parametrize("args", [(1.5, SIGMA, T, DELTA), (Q, SIGMA, 2.5, DELTA),
                                  (Q, SIGMA, T, 0.0)])
def test_invalid_argument_under_jit_gives_nan(args):
  assert np.isnan(float(_jitted()(*(jnp.float64(a) for a in args))))


# ---------------------------------------------------------------------------------------------
# Edges.


def test_zero_sampling_rate_gives_zero_epsilon():
  # q = 0: the record is never used, both distributions are N(0, σ²) at every step.
  assert float(_eps(0.0, SIGMA, T, DELTA)) == 0.0


def test_zero_steps_give_zero_epsilon():
  # Nothing released: the privacy loss is 0 with probability one.
  assert float(_eps(Q, SIGMA, 0, DELTA)) == 0.0


@pytest.mark.parametrize("sigma,steps,delta", [(1.0, 100, 1e-5), (2.0, 10, 1e-6), (0.8, 1, 1e-5)])
def test_full_batch_epsilon_is_the_exact_gaussian_epsilon_from_above(sigma, steps, delta):
  # q = 1: T Gaussian steps compose to one Gaussian mechanism with μ = √T/σ, whose exact
  # δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Balle & Wang 2018, Thm. 8), solved for ε here
  # with SciPy. The pessimistic PLD must be at or above it, within the discretisation.
  from scipy.optimize import brentq
  from scipy.stats import norm
  mu = math.sqrt(steps) / sigma
  exact = brentq(lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2)
                 - delta, 0.0, 500.0, xtol=1e-14, rtol=1e-15)
  eps = float(jaxrdp.pld_epsilon(1.0, sigma, steps, delta))
  assert exact <= eps <= exact * (1 + 1e-6), (eps, exact)
