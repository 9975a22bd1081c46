r"""Empirical privacy audit of a DP-SGD step: a statistically sound lower bound on ε.

An accountant gives an *upper* bound on ε, proved for the mechanism the code is supposed to
implement. An audit runs the code and measures how well an attacker can tell whether one
*canary* example was used. If the implementation is (ε, δ)-DP, every test that guesses
"canary present" from the released output obeys, for its false-positive rate FPR (guessing
"present" when it was absent) and false-negative rate FNR (Kairouz, Oh, Viswanath 2015, Thm. 2.1;
Nasr et al. 2021, Sec. 3),

.. math:: \mathrm{FPR} + e^{\varepsilon}\,\mathrm{FNR} \ge 1 - \delta, \qquad
          \mathrm{FNR} + e^{\varepsilon}\,\mathrm{FPR} \ge 1 - \delta .

With upper confidence limits :math:`\overline{\mathrm{FPR}}, \overline{\mathrm{FNR}}` the reported
bound is

.. math:: \hat\varepsilon = \max\Big(0,\ \log\frac{1-\delta-\overline{\mathrm{FPR}}}{\overline{\mathrm{FNR}}},\
          \log\frac{1-\delta-\overline{\mathrm{FNR}}}{\overline{\mathrm{FPR}}}\Big).

If the code is (ε, δ)-DP then :math:`\hat\varepsilon \le \varepsilon` with probability at least
``confidence``, whatever the attacker's test. A bound above the accountant's ε therefore shows
a bug (too little noise, missing clipping, reused keys, a leaked batch size, ...); a bound close
to it shows the accountant is nearly tight for this attack.

How :func:`audit_transform` makes the bound sound:

* **Worlds.** Both worlds use the same per-example gradients and mask for the other examples
  (the attacker's choice; the sampled-Gaussian analysis of Mironov, Talwar, Zhang 2019 holds
  conditionally on them). "Absent": the canary is masked out at every step. "Present": at each
  step the canary is included independently with probability ``sampling_rate``
  (:func:`jaxrdp.poisson_sample`, the library's sampler), as Poisson sampling would do.
  Every trial runs the transform from a fresh state with its own key (``jax.vmap`` over keys).
* **Statistic.** At each step, the released update is projected on the canary's gradient
  direction :math:`v = g_c / \lVert g_c \rVert` (clipping does not change it): for the Gaussian
  mechanism with the other examples fixed this is the Neyman–Pearson optimal statistic. Over
  T steps, the projections :math:`z_t` are combined by the log-likelihood ratio of the
  sampled Gaussian, :math:`\sum_t \log(1 - q + q\,e^{\mu_t x_t - \mu_t^2/2})`, with
  :math:`x_t = (z_t - c_t)/s_t` and centre, scale and shift (:math:`c_t, s_t, \mu_t s_t`)
  estimated on the selection half (below). Any statistic gives a valid bound; this one
  makes it tight.
* **Threshold selection without bias.** The trials of each world are split in two halves.
  The orientation and the threshold are chosen on the first half (maximising the bound
  computed there with Wilson limits); the counts FP, FN are taken on the second half only,
  which is independent of that choice. (Choosing the threshold on the samples that are then
  counted would pick the luckiest of many thresholds: the confidence level would not hold.)
* **Confidence limits.** :math:`\overline{\mathrm{FPR}}` and :math:`\overline{\mathrm{FNR}}`
  are one-sided Clopper–Pearson limits (Clopper, Pearson 1934), each at level
  :math:`1 - (1-\text{confidence})/2`; by the union bound both hold together with probability
  ≥ ``confidence``, and then both inequalities above hold for the true rates, hence for
  :math:`\hat\varepsilon`. The limits are computed by bisection on the exact binomial CDF in
  NumPy float64 (log-space sums), independently of ``jax_enable_x64`` and without SciPy
  (``jax.scipy.special.betainc`` would run in float32 by default, too coarse at 10⁵ trials).

The largest bound an audit can show is :math:`\log(n / \log(2/\alpha))` for n evaluation
trials per world and α = 1 − confidence (both error counts 0, then
:math:`\overline{\mathrm{FPR}} = \overline{\mathrm{FNR}} \approx \log(2/\alpha)/n`): 7.5 for
n = 10⁴ at confidence 0.99. Audit with enough trials.

Auditing your own training step (a worked example)::

  import jax, jax.numpy as jnp, jaxrdp

  tx = jaxrdp.dpsgd(0.1, 1.0, 1.0, jax.random.key(1), sampling_rate=1.0,
                    expected_batch_size=64.0)           # your optimizer, as built for training
  # Per-example gradients of a real batch at the current parameters. Example 0 is the canary:
  # e.g. a mislabelled example, whose gradient norm exceeds the clip C = 1.
  grads = jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)
  result = jaxrdp.audit_transform(tx, grads, canary_index=0, params=params,
                                  num_trials=100_000, key=jax.random.key(0), delta=1e-5,
                                  sampling_rate=1.0)
  _, state = tx.update(grads, tx.init(params), params)  # one step: the accountant's claim
  eps, _ = jaxrdp.privacy_spent(state, 1e-5)
  print(result.epsilon_lower_bound, "<=", eps)          # 2.37 <= 4.73 (σ = 1)

The built transform's key is replaced by each trial's key (in its
:class:`jaxrdp.DifferentiallyPrivateAggregateState`). Any other transform can be audited by
passing a factory ``key -> transform`` instead (traced once; a jaxrdp transform built inside
the trace computes its RDP there, which costs a compilation of the RDP kernel). With
``sampling_rate`` q < 1 and ``num_steps`` T > 1 the audit attacks T steps in which the canary
is Poisson-sampled. Measured figures for the jaxrdp transform are in ``docs/audit.md``.

References:
  Clopper, Pearson, "The use of confidence or fiducial limits illustrated in the case of the
  binomial", Biometrika 1934. Kairouz, Oh, Viswanath, "The composition theorem for
  differential privacy", ICML 2015. Jagielski, Ullman, Oprea, "Auditing differentially private
  machine learning: how private is private SGD?", NeurIPS 2020. Nasr, Song, Thakurta,
  Papernot, Carlini, "Adversary instantiation: lower bounds for differentially private machine
  learning", IEEE S&P 2021. Mironov, Talwar, Zhang, "Rényi Differential Privacy of the Sampled
  Gaussian Mechanism", arXiv:1908.10530, 2019.
"""

from __future__ import annotations

import math
import statistics as _statistics
from typing import Any, Callable, NamedTuple

import numpy as np
import jax

from jaxrdp.audit.bounds import _check_probability, _epsilon_from_rates, _upper_limit
from jaxrdp.audit.trials import TransformOrFactory, audit_statistics
# Re-exported: user code imports the bounds from this module too.
from jaxrdp.audit.bounds import clopper_pearson_upper, epsilon_lower_bound  # noqa: F401


class AuditResult(NamedTuple):
  """The outcome of :func:`audit_transform`.

  Attributes:
    epsilon_lower_bound: ε̂, a lower bound on the ε of the audited code at ``delta``, valid
      with probability ≥ ``confidence``.
    delta: the δ of the bound.
    confidence: its confidence level.
    false_positives: evaluation trials of the "absent" world classified "present".
    false_negatives: evaluation trials of the "present" world classified "absent".
    evaluation_trials: evaluation trials per world (the second half).
    fpr_upper: Clopper–Pearson upper limit of the false-positive rate.
    fnr_upper: Clopper–Pearson upper limit of the false-negative rate.
    threshold: the test says "present" when ``orientation * score > threshold``, the score
      being the sampled-Gaussian log-likelihood ratio of the trial's per-step statistics
      (fitted on the selection half; see the module docstring).
    orientation: +1 or −1, chosen on the selection half.
    absent_statistics: per-step statistics of every "absent" trial, shape (num_trials, T).
    present_statistics: per-step statistics of every "present" trial, shape (num_trials, T).
    present_included: whether the canary was included at each step, shape (num_trials, T).
  """
  epsilon_lower_bound: float
  delta: float
  confidence: float
  false_positives: int
  false_negatives: int
  evaluation_trials: int
  fpr_upper: float
  fnr_upper: float
  threshold: float
  orientation: int
  absent_statistics: np.ndarray
  present_statistics: np.ndarray
  present_included: np.ndarray


# --------------------------------------------------------------------------- the test


def _scores(absent, present, included, select, sampling_rate):
  """The sampled-Gaussian log-likelihood ratio of every trial, fitted on ``select`` trials only."""
  a_sel, p_sel, i_sel = absent[select], present[select], included[select]
  centre = a_sel.mean(axis=0)
  scale = a_sel.std(axis=0)
  scale = np.where(scale > 0, scale, 1.0)
  hits = i_sel.sum(axis=0)
  shift = np.where(hits > 0, (p_sel * i_sel).sum(axis=0) / np.maximum(hits, 1) - centre, 0.0)
  mu = shift / scale
  log1m_q = math.log1p(-sampling_rate) if sampling_rate < 1 else -math.inf

  def score(z):
    x = (z - centre) / scale
    return np.sum(np.logaddexp(log1m_q, math.log(sampling_rate) + mu * x - mu * mu / 2), axis=1)
  return score(absent), score(present)


def _wilson_upper(k, n, z):
  p = k / n
  return np.minimum(1.0, (p + z * z / (2 * n) + z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)))
                    / (1 + z * z / n))


def _choose_test(absent, present, delta, confidence):
  """(orientation, threshold) maximising the Wilson-limit bound on these (selection) scores."""
  z = _statistics.NormalDist().inv_cdf(1 - (1 - confidence) / 2)
  best = (-math.inf, 1, math.inf)
  for sign in (1, -1):
    a, p = np.sort(sign * absent), np.sort(sign * present)
    t = np.concatenate([a, p])
    fp = len(a) - np.searchsorted(a, t, side="right")    # absent called present: score > t
    fn = np.searchsorted(p, t, side="right")             # present called absent: score <= t
    fpr, fnr = _wilson_upper(fp, len(a), z), _wilson_upper(fn, len(p), z)
    with np.errstate(divide="ignore", invalid="ignore"):
      value = np.maximum(np.log(1 - delta - fpr) - np.log(fnr),
                         np.log(1 - delta - fnr) - np.log(fpr))
    value = np.where(np.isnan(value), -math.inf, value)
    i = int(np.argmax(value))
    if value[i] > best[0]:
      best = (float(value[i]), sign, float(t[i]))
  return best[1], best[2]


def audit_transform(tx_or_factory: TransformOrFactory, per_example_grads: Any,
                    canary_index: int, *, num_trials: int, key: jax.Array | int, delta: float,
                    sampling_rate: float, num_steps: int = 1, confidence: float = 0.95,
                    params: Any = None, mask: jax.typing.ArrayLike | None = None,
                    statistic: Callable[[Any], jax.Array] | None = None,
                    trials_per_batch: int = 1024) -> AuditResult:
  r"""Empirical lower bound on the ε of a DP aggregation step, by a canary membership test.

  Runs ``num_trials`` trials in each world ("absent": the canary masked out; "present": the
  canary included at each step with probability ``sampling_rate``), each trial ``num_steps``
  updates from a fresh state with its own key, vectorised with ``jax.vmap`` in chunks of
  ``trials_per_batch``. Chooses a threshold test on the first half of the trials and counts
  its errors on the second half; returns the Clopper–Pearson bound of
  :func:`epsilon_lower_bound`. If the code is (ε, δ)-DP for the canary's add/remove, the
  bound is ≤ ε with probability ≥ ``confidence``. See the module docstring for the method.

  Args:
    tx_or_factory: a callable ``key -> optax.GradientTransformation`` (e.g.
      ``lambda k: jaxrdp.dpsgd(lr, C, σ, k, ...)``), called with each trial's key; or a built
      transform holding one :class:`jaxrdp.DifferentiallyPrivateAggregateState`, whose key is
      replaced by each trial's key (its only randomness must come from that key). Its update
      must accept ``mask=``.
    per_example_grads: pytree of per-example gradients with a leading batch axis (may be
      sharded); the same gradients are used at every step.
    canary_index: the example whose presence is tested, an int in [0, batch).
    num_trials: trials per world, ≥ 2 (half select the test, half evaluate it).
    key: a PRNG key or int seed (required).
    delta: δ of the bound, in (0, 1).
    sampling_rate: q in (0, 1], the canary's inclusion probability per step; use the
      transform's Poisson sampling rate.
    num_steps: T ≥ 1 updates per trial.
    confidence: the bound's confidence level, in (0, 1).
    params: the parameters passed to ``init``/``update`` (default: zeros shaped like one
      example's gradient).
    mask: optional bool[batch] for the other examples (the canary's entry is overridden).
    statistic: ``updates -> scalar`` per step; default: projection on the canary gradient's
      direction. Any statistic gives a valid bound.
    trials_per_batch: trials vectorised at once (memory: batch × parameters per trial).

  Returns:
    An :class:`AuditResult`.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued, or a key that is neither a PRNG key nor
      an int seed.

  References:
    Jagielski, Ullman, Oprea, NeurIPS 2020; Nasr et al., IEEE S&P 2021; Clopper, Pearson 1934.
  """
  delta = _check_probability("delta", delta, "delta")
  confidence = _check_probability("confidence", confidence, "confidence")
  absent, present, included = audit_statistics(
      tx_or_factory, per_example_grads, canary_index, num_trials=num_trials, key=key,
      sampling_rate=sampling_rate, num_steps=num_steps, params=params, mask=mask,
      statistic=statistic, trials_per_batch=trials_per_batch)
  return audit_from_statistics(absent, present, included, sampling_rate=sampling_rate,
                               delta=delta, confidence=confidence)


def audit_from_statistics(absent_statistics: np.ndarray, present_statistics: np.ndarray,
                          present_included: np.ndarray | None = None, *, sampling_rate: float,
                          delta: float, confidence: float = 0.95) -> AuditResult:
  r"""The test and bound of :func:`audit_transform`, from trials run elsewhere.

  The first half of the trials (rows) of each world fits the score (the sampled-Gaussian
  log-likelihood ratio of the per-step statistics, see the module docstring) and chooses the
  orientation and the threshold; the errors are counted on the second half and turned into
  :func:`epsilon_lower_bound`. Rows must be independent trials, identically distributed within
  each world (their order must not depend on the outcomes).

  Args:
    absent_statistics: float[N, T] (or [N]): per-step statistics of the trials without the canary.
    present_statistics: float[N, T] (or [N]): the same with the canary Poisson-sampled.
    present_included: bool[N, T]: whether the canary was used at each step (default: all True;
      only used to fit the score).
    sampling_rate: q in (0, 1], the canary's inclusion probability per step.
    delta: δ in (0, 1).
    confidence: in (0, 1).

  Returns:
    An :class:`AuditResult`.
  """
  delta = _check_probability("delta", delta, "delta")
  confidence = _check_probability("confidence", confidence, "confidence")
  q = _check_probability("sampling_rate", sampling_rate, "positive_sampling_rate")
  absent = np.asarray(absent_statistics, np.float64)
  present = np.asarray(present_statistics, np.float64)
  if absent.ndim == 1:
    absent, present = absent[:, None], present.reshape(present.shape[0], -1)
  if absent.ndim != 2 or present.shape != absent.shape:
    raise ValueError("absent_statistics and present_statistics must have one shape, (trials,) or "
                     f"(trials, steps); got {absent.shape} and {present.shape}.")
  num_trials = absent.shape[0]
  if num_trials < 2:
    raise ValueError(f"num_trials must be >= 2 (half of the trials choose the threshold, half "
                     f"evaluate it), got {num_trials}.")
  included = (np.ones(present.shape, bool) if present_included is None
              else np.asarray(present_included, bool).reshape(present.shape))
  if not (np.all(np.isfinite(absent)) and np.all(np.isfinite(present))):
    raise ValueError("the statistic is not finite in some trials (NaN updates: invalid "
                     "hyperparameters under jit?); no bound can be computed.")
  half = num_trials // 2
  select = np.arange(num_trials) < half
  score_a, score_p = _scores(absent, present, included, select, q)
  orientation, threshold = _choose_test(score_a[select], score_p[select], delta, confidence)
  evaluate = ~select
  fp = int(np.sum(orientation * score_a[evaluate] > threshold))
  fn = int(np.sum(~(orientation * score_p[evaluate] > threshold)))
  n_eval = num_trials - half
  alpha = (1.0 - confidence) / 2
  fpr_u = _upper_limit(fp, n_eval, alpha)
  fnr_u = _upper_limit(fn, n_eval, alpha)
  return AuditResult(
      epsilon_lower_bound=_epsilon_from_rates(fpr_u, fnr_u, delta), delta=delta,
      confidence=confidence, false_positives=fp, false_negatives=fn, evaluation_trials=n_eval,
      fpr_upper=fpr_u, fnr_upper=fnr_u, threshold=threshold, orientation=orientation,
      absent_statistics=absent, present_statistics=present, present_included=included)
