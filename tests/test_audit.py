"""Empirical privacy audit (jaxrdp.audit): sound lower bounds, tightness, and detection of bugs.

Reference values never come from the audit itself: Clopper–Pearson limits are checked against
``scipy.stats.beta.ppf``; the audited ε against the transform's own accountant
(``privacy_spent`` after the same number of steps) and, for one Gaussian step, against the exact
(ε, δ) curve of the Gaussian mechanism (Balle & Wang 2018, Thm. 8, solved with SciPy); the
trials' statistics against NumPy recomputations of the clipped sum.

False-failure rates. Every audit uses a fixed key, so each test is deterministic. A test that
asserts ``bound <= accountant ε`` would fail for a random key with probability at most
``1 - confidence`` (the audit's guarantee, if the transform and accountant are correct): 1 %
here (confidence 0.99). Distribution checks use 5-sigma acceptance regions (≈ 6e-7 each).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import optimize, stats

import jaxrdp
from jaxrdp.audit.canary import (AuditResult, audit_from_statistics, audit_statistics, audit_transform,
                          clopper_pearson_upper, epsilon_lower_bound)

CLIP, B_EXPECTED, BATCH = 1.0, 4.0, 8
CONFIDENCE = 0.99


def _grads(canary_norm=5.0, seed=0):
  """Per-example float32 gradients (two leaves); example 0 is the canary, of norm canary_norm."""
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(BATCH, 6)) * 0.6
  b = rng.normal(size=(BATCH, 2)) * 0.6
  norm0 = math.sqrt(np.sum(w[0] ** 2) + np.sum(b[0] ** 2))
  w[0] *= canary_norm / norm0
  b[0] *= canary_norm / norm0
  return {"w": jnp.asarray(w, jnp.float32), "b": jnp.asarray(b, jnp.float32)}


def _params():
  return {"w": jnp.zeros((6,), jnp.float32), "b": jnp.zeros((2,), jnp.float32)}


def _agg(sigma, q, clip=CLIP, key=0):
  return jaxrdp.differentially_private_aggregate(clip, sigma, key, sampling_rate=q,
                                                 expected_batch_size=B_EXPECTED)


def _accountant_epsilon(tx, steps, delta):
  """The ε the transform's own accountant reports after ``steps`` updates."""
  params = _params()
  state = tx.init(params)
  for _ in range(steps):
    _, state = tx.update(_grads(), state, params)
  return float(jaxrdp.privacy_spent(state, delta)[0])


def _gaussian_exact_epsilon(mu, delta):
  """Exact ε of one Gaussian mechanism with sensitivity/std = mu (Balle & Wang 2018, Thm. 8)."""
  f = lambda e: (stats.norm.cdf(-e / mu + mu / 2) - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2)
                 - delta)
  return optimize.brentq(f, 0.0, 50.0, xtol=1e-12)


# --------------------------------------------------------------------------- confidence limits


@pytest.mark.parametrize("k,n,alpha", [(0, 10, 0.05), (0, 50_000, 0.005), (3, 100, 0.025),
                                       (50, 100, 0.01), (99, 100, 0.025), (1_000, 50_000, 5e-4),
                                       (24_900, 50_000, 0.025), (7, 1_000_000, 0.025)])
def test_clopper_pearson_upper_equals_the_beta_quantile(k, n, alpha):
  upper = clopper_pearson_upper(k, n, alpha)
  reference = stats.beta.ppf(1 - alpha, k + 1, n - k)
  assert reference <= upper <= reference * (1 + 1e-6)  # never below: rounded up
  # Defining property: P[Bin(n, upper) <= k] = alpha.
  assert stats.binom.cdf(k, n, upper) == pytest.approx(alpha, rel=1e-4)


def test_clopper_pearson_upper_of_all_successes_is_one():
  assert clopper_pearson_upper(20, 20, 0.05) == 1.0


def test_epsilon_lower_bound_is_the_clopper_pearson_formula():
  fp, fn, n, delta, conf = 12, 30_000, 50_000, 1e-5, 0.95
  a = (1 - conf) / 2
  fpr, fnr = stats.beta.ppf(1 - a, fp + 1, n - fp), stats.beta.ppf(1 - a, fn + 1, n - fn)
  ref = max(0.0, math.log((1 - delta - fpr) / fnr), math.log((1 - delta - fnr) / fpr))
  assert epsilon_lower_bound(fp, fn, n, delta, conf) == pytest.approx(ref, rel=1e-6)
  # Symmetric in the two error kinds; a pair of trial counts is accepted.
  assert epsilon_lower_bound(fn, fp, (n, n), delta, conf) == pytest.approx(ref, rel=1e-6)
  # A test no better than chance proves nothing.
  assert epsilon_lower_bound(25_000, 25_000, n, delta, conf) == 0.0


@pytest.mark.parametrize("fp,fn,trials,error,message", [
    (-1, 3, 100, ValueError, "false_positives must be >= 0, got -1"),
    (3, -1, 100, ValueError, "false_negatives must be >= 0, got -1"),
    (101, 3, 100, ValueError, r"false_positives must be <= the absent world's trials \(100\), got 101"),
    (3, 11, (100, 10), ValueError, r"false_negatives must be <= the present world's trials \(10\), got 11"),
    (2.5, 3, 100, TypeError, "false_positives must be an int, got 2.5"),
    (3, None, 100, TypeError, "false_negatives must be an int, got None"),
])
def test_epsilon_lower_bound_names_the_count_that_is_wrong(fp, fn, trials, error, message):
  with pytest.raises(error, match=message) as info:
    epsilon_lower_bound(fp, fn, trials, 1e-5)
  assert "successes" not in str(info.value)


def test_choosing_the_threshold_on_the_counted_trials_would_break_the_confidence_level():
  """Identical worlds (ε = 0): at confidence 0.95 a positive bound is a violation, allowed in
  ≤ 5 % of runs. 300 runs of 2 × 2,000 Gaussian trials (δ = 1e-3), NumPy seed 0.

  The audit (threshold chosen on one half, errors counted on the other) must violate at most
  30 times: at the nominal 5 % that count is exceeded with probability 5e-5 (measured: 0).
  Counting on the very trials that chose the threshold (passing each world's trials twice,
  so that both halves are the same) overfits: measured ≈ 12 % violations; the test asks for
  ≥ 15 (of an expected ≈ 35), showing that the check can fail."""
  rng = np.random.default_rng(0)
  split = in_sample = 0
  for _ in range(300):
    a, p = rng.normal(size=2_000), rng.normal(size=2_000)
    split += audit_from_statistics(a, p, sampling_rate=1.0, delta=1e-3,
                                   confidence=0.95).epsilon_lower_bound > 0
    twice = audit_from_statistics(np.concatenate([a, a]), np.concatenate([p, p]),
                                  sampling_rate=1.0, delta=1e-3, confidence=0.95)
    in_sample += twice.epsilon_lower_bound > 0
  assert split <= 30
  assert in_sample >= 15


# --------------------------------------------------------------------------- audits of jaxrdp's transform


@pytest.fixture(scope="module")
def gaussian_step_audit():
  """q = 1, one step, σ = 1: the Gaussian mechanism with μ = C / (σC) = 1. 500,000 trials/world."""
  tx = _agg(1.0, 1.0)
  delta = 1e-3
  result = audit_transform(tx, _grads(), 0, num_trials=500_000, key=jax.random.key(2024),
                           delta=delta, sampling_rate=1.0, confidence=CONFIDENCE,
                           trials_per_batch=1 << 15)
  return result, _accountant_epsilon(tx, 1, delta)


def test_gaussian_step_bound_is_below_the_exact_epsilon_and_within_0_7_of_the_accountant(
    gaussian_step_audit):
  """One Gaussian step (q = 1, σ = 1, δ = 1e-3, 5e5 trials per world, confidence 0.99).

  Soundness: bound ≤ exact Gaussian ε (3.139) ≤ accountant ε (3.537, RDP); a correct
  transform fails the first inequality with probability ≤ 1 % over keys. Tightness: measured
  bound 2.857 with this key, i.e. 0.81 of the accountant's ε and 0.91 of the exact ε; the test
  asks for 0.7 of the accountant's ε (the attainable bound is limited by the smallest error
  rate 2.5e5 evaluation trials can measure; 2e6 trials per world give 3.03, 0.86)."""
  result, eps = gaussian_step_audit
  exact = _gaussian_exact_epsilon(1.0, 1e-3)
  assert exact <= eps
  assert result.epsilon_lower_bound <= exact
  assert result.epsilon_lower_bound >= 0.7 * eps
  assert result.evaluation_trials == 250_000


def test_trials_release_fresh_noise_of_std_sigma_c_over_b_and_the_canary_shifts_it_by_c_over_b(
    gaussian_step_audit):
  """The statistic is <update, v>, v the canary's direction. Absent: <S, v>/b + N(0, (σC/b)²),
  S the clipped sum of the other examples (NumPy reference); present: shifted by C/b (the
  canary's norm 5 is clipped to C). 5-sigma regions on the mean and the std (false-failure
  rate ≈ 6e-7 each), and a lag-1 correlation within 5/√n (consecutive trials are independent)."""
  result, _ = gaussian_step_audit
  g = {k: np.asarray(v, np.float64) for k, v in _grads().items()}
  flat = np.concatenate([g["w"], g["b"]], axis=1)
  norms = np.linalg.norm(flat, axis=1)
  clipped = flat * np.minimum(1.0, CLIP / norms)[:, None]
  v = flat[0] / norms[0]
  centre = clipped[1:].sum(axis=0) @ v / B_EXPECTED
  sd = 1.0 * CLIP / B_EXPECTED
  for stat, mean in ((result.absent_statistics[:, 0], centre),
                     (result.present_statistics[:, 0], centre + CLIP / B_EXPECTED)):
    n = len(stat)
    assert abs(stat.mean() - mean) < 5 * sd / math.sqrt(n)
    assert abs(stat.std() / sd - 1) < 5 / math.sqrt(2 * n)
    # Independent trials (fresh keys): lag-1 correlation within 5 / sqrt(n).
    assert abs(np.corrcoef(stat[:-1], stat[1:])[0, 1]) < 5 / math.sqrt(n)
  assert result.present_included.all()


@pytest.mark.parametrize("q,steps,sigma", [(0.5, 3, 1.0), (0.2, 5, 1.0)])
def test_poisson_sampled_canary_bound_never_exceeds_the_accountant(q, steps, sigma):
  """q < 1, a few steps: the canary joins each step with probability q in the "present" world.

  Confidence 0.99 (false-failure rate ≤ 1 % for a correct transform and accountant), 1e5 trials
  per world, δ = 1e-5. Measured with this key: q = 0.5, T = 3: bound 2.42 vs accountant 6.48;
  q = 0.2, T = 5: 1.70 vs 4.54 (see docs/audit.md)."""
  tx = _agg(sigma, q)
  delta = 1e-5
  result = audit_transform(tx, _grads(), 0, num_trials=100_000, key=jax.random.key(7),
                           delta=delta, sampling_rate=q, num_steps=steps, confidence=CONFIDENCE,
                           trials_per_batch=1 << 14)
  eps = _accountant_epsilon(tx, steps, delta)
  assert 0.0 < result.epsilon_lower_bound <= eps
  # The canary's inclusion is Bernoulli(q) per step (5-sigma binomial region).
  frac = result.present_included.mean()
  n = result.present_included.size
  assert abs(frac - q) < 5 * math.sqrt(q * (1 - q) / n)


# --------------------------------------------------------------------------- negative controls


@pytest.mark.parametrize("broken", ["noise_divided_by_10", "clipping_disabled", "fixed_noise_key"])
def test_the_audit_detects_a_broken_transform(broken):
  """A transform that claims (q = 1, σ = 1) but leaks more must give a bound ABOVE the accountant's ε.

  * noise std divided by 10 (σ = 0.1 used, σ = 1 accounted);
  * clipping disabled: clip at 1000 C with σ / 1000 (same noise std σC) and a canary of norm
    100 C, so the canary moves the sum by 100 C instead of C;
  * the noise key ignored (every run reuses one key: optax's default-key pitfall), via a factory.

  20,000 trials per world, δ = 1e-5, confidence 0.99, accountant ε = 4.73. Measured with this
  key: no error at all in each case, bound 7.54 (= log(10⁴ / log 200), the most 10,000
  evaluation trials can show). The bound stays below 4.73 only if both error-rate limits exceed
  e^-4.73 ≈ 9e-3 (≳ 60 errors of each kind among 10,000), whereas the broken transforms shift
  the statistic by ≥ 10 noise stds (error rates ≈ Φ(−5) ≈ 3e-7 at a middle threshold) or
  remove the noise's randomness: a false failure has probability < 1e-9."""
  delta = 1e-5
  eps = _accountant_epsilon(_agg(1.0, 1.0), 1, delta)
  grads = _grads()
  if broken == "noise_divided_by_10":
    tx = _agg(0.1, 1.0)
  elif broken == "clipping_disabled":
    tx, grads = _agg(1.0 / 1000, 1.0, clip=1000 * CLIP), _grads(canary_norm=100.0)
  else:
    fixed = _agg(1.0, 1.0, key=0)
    fixed.init(_params())
    tx = lambda key: fixed  # a factory that drops the trial key
  result = audit_transform(tx, grads, 0, num_trials=20_000, key=jax.random.key(11), delta=delta,
                           sampling_rate=1.0, confidence=CONFIDENCE)
  assert result.epsilon_lower_bound > eps


# --------------------------------------------------------------------------- interface


def test_a_factory_receives_each_trials_key():
  """A factory ``key -> transform`` gives the same trials as the built transform (whose state's
  key is replaced per trial): both run the transform with the trial's key."""
  base = _agg(1.0, 1.0, key=123)
  base.init(_params())

  def factory(key):
    init = lambda p: base.init(p)._replace(key=jax.random.key_data(key))
    return optax.GradientTransformationExtraArgs(init, base.update)

  kw = dict(num_trials=64, key=jax.random.key(5), sampling_rate=0.5, num_steps=2)
  built = audit_statistics(base, _grads(), 0, **kw)
  made = audit_statistics(factory, _grads(), 0, **kw)
  for x, y in zip(built, made):
    np.testing.assert_array_equal(x, y)
  # Deterministic given the key; another key gives other trials.
  again = audit_statistics(base, _grads(), 0, **kw)
  np.testing.assert_array_equal(again[0], built[0])
  other = audit_statistics(base, _grads(), 0, **dict(kw, key=jax.random.key(6)))
  assert not np.array_equal(other[0], built[0])


def test_custom_statistic_and_result_fields():
  tx = _agg(1.0, 1.0)
  result = audit_transform(tx, _grads(), 0, num_trials=64, key=jax.random.key(5), delta=1e-5,
                           sampling_rate=0.5, num_steps=2,
                           statistic=lambda u: jnp.sum(u["w"]) + jnp.sum(u["b"]))
  assert isinstance(result, AuditResult)
  assert result.absent_statistics.shape == result.present_statistics.shape == (64, 2)
  assert result.present_included.dtype == bool and result.evaluation_trials == 32
  assert result.orientation in (1, -1)
  assert result.epsilon_lower_bound == pytest.approx(
      epsilon_lower_bound(result.false_positives, result.false_negatives, 32, 1e-5, 0.95))


def test_errors_name_the_argument():
  tx, g = _agg(1.0, 1.0), _grads()
  kw = dict(num_trials=10, key=jax.random.key(0), delta=1e-5, sampling_rate=1.0)
  for n in (0, -5, 1):
    with pytest.raises(ValueError, match="num_trials"):
      audit_transform(tx, g, 0, **dict(kw, num_trials=n))
  with pytest.raises(TypeError, match="num_trials"):
    audit_transform(tx, g, 0, **dict(kw, num_trials=10.0))
  for c in (0.0, 1.0, 1.5, -0.1):
    with pytest.raises(ValueError, match="confidence"):
      audit_transform(tx, g, 0, confidence=c, **kw)
  for d in (0.0, 1.0, -1e-5, float("nan")):
    with pytest.raises(ValueError, match="delta"):
      audit_transform(tx, g, 0, **dict(kw, delta=d))
  for i in (-1, BATCH, 100):
    with pytest.raises(ValueError, match="canary_index"):
      audit_transform(tx, g, i, **kw)
  with pytest.raises(TypeError, match="canary_index"):
    audit_transform(tx, g, 0.0, **kw)
  for q in (0.0, 1.5):
    with pytest.raises(ValueError, match="sampling_rate"):
      audit_transform(tx, g, 0, **dict(kw, sampling_rate=q))
  with pytest.raises(ValueError, match="num_steps"):
    audit_transform(tx, g, 0, num_steps=0, **kw)
  with pytest.raises(TypeError, match="key is required"):
    audit_transform(tx, g, 0, **dict(kw, key=None))
  with pytest.raises(TypeError, match="tx_or_factory"):
    audit_transform("dpsgd", g, 0, **kw)
  with pytest.raises(ValueError, match="exactly one DifferentiallyPrivateAggregateState"):
    audit_transform(optax.sgd(0.1), g, 0, **kw)
  with pytest.raises(TypeError, match="statistic"):
    audit_transform(tx, g, 0, statistic=3, **kw)
  with pytest.raises(ValueError, match="canary's gradient"):
    audit_transform(tx, jax.tree.map(lambda x: x.at[0].set(0.0), g), 0, **kw)
  with pytest.raises(ValueError, match="successes must be <= trials"):
    clopper_pearson_upper(11, 10, 0.05)
  with pytest.raises(ValueError, match="alpha"):
    clopper_pearson_upper(1, 10, 1.0)
  with pytest.raises(ValueError, match="trials"):
    epsilon_lower_bound(0, 0, 0, 1e-5)
  with pytest.raises(ValueError, match="delta"):
    epsilon_lower_bound(0, 0, 10, 0.0)
  with pytest.raises(ValueError, match="confidence"):
    epsilon_lower_bound(0, 0, 10, 1e-5, confidence=1.0)
