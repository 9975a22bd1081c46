r"""Clopper–Pearson confidence limits and the lower bound on ε from a test's error counts.

If a mechanism is (ε, δ)-DP, every test that tells its two worlds apart obeys
FPR + e^ε·FNR ≥ 1 − δ and FNR + e^ε·FPR ≥ 1 − δ (Kairouz, Oh, Viswanath 2015, Thm. 2.1), so
upper confidence limits of the two error rates give a lower bound on ε
(:func:`epsilon_lower_bound`; Nasr et al. 2021, Sec. 3). The limits are one-sided
Clopper–Pearson limits (:func:`clopper_pearson_upper`; Clopper, Pearson 1934), by bisection on
the exact binomial CDF in NumPy float64 (log-space sums), independently of ``jax_enable_x64``
and without SciPy. See :mod:`jaxrdp.audit.canary` for the audit that produces the counts.
"""

from __future__ import annotations

import math

import numpy as np

from jaxrdp._internal import validation

# The bisection accepts an upper limit p only when log P[Bin(n, p) <= k] <= log α − this:
# covers the float64 rounding of the log-space CDF (≲ 1e-9 for n ≲ 1e7), so the limit is
# never below the exact Clopper–Pearson limit.
_LOG_CDF_SLACK = 1e-7


def _check_count(name, x, lo=0):
  if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
    raise TypeError(f"{name} must be an int, got {x!r}.")
  if x < lo:
    raise ValueError(f"{name} must be >= {lo}, got {x}.")
  return int(x)


def _check_probability(name, x, domain):
  """A real scalar in ``DOMAINS[domain]`` (a probability), as a Python float."""
  if x is None or isinstance(x, (bool, np.bool_)):
    raise TypeError(f"{name} must be a real number, got {x!r}.")
  validation.check_float_dtype(name, x)
  if np.ndim(x) != 0:
    raise ValueError(f"{name} must be a scalar, got shape {np.shape(x)}.")
  validation.check(domain, x, name=name)
  return float(np.asarray(x))


_LGAMMA = np.vectorize(math.lgamma, otypes=[np.float64])


def _log_binomial_cdf(log_choose, n: int, p: float) -> float:
  """log P[Bin(n, p) ≤ k] in float64 by a log-space sum of the pmf (no cancellation).

  ``log_choose`` holds log C(n, j) for j = 0..k."""
  j = np.arange(len(log_choose), dtype=np.float64)
  terms = log_choose + j * math.log(p) + (n - j) * math.log1p(-p)
  top = float(np.max(terms))
  return top + math.log(float(np.sum(np.exp(terms - top))))


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
  r"""One-sided Clopper–Pearson upper confidence limit of a binomial proportion.

  The p with :math:`P[\mathrm{Bin}(n, p) \le k] = \alpha` (1 when k = n): the true
  proportion is at most this with probability ≥ 1 − α. Computed by bisection on the exact
  binomial CDF in float64 (log-space sum), rounded up; equals
  ``scipy.stats.beta.ppf(1 - alpha, k + 1, n - k)``.

  Args:
    successes: k, an int in [0, n].
    trials: n ≥ 1.
    alpha: the error probability, in (0, 1).

  Returns:
    The upper limit, a float in (k/n, 1].

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Clopper, Pearson, Biometrika 26 (1934) 404–413.
  """
  n = _check_count("trials", trials, lo=1)
  k = _check_count("successes", successes)
  if k > n:
    raise ValueError(f"successes must be <= trials, got {k} > {n}.")
  alpha = _check_probability("alpha", alpha, "significance")
  return _upper_limit(k, n, alpha)


def _upper_limit(k: int, n: int, alpha: float) -> float:
  """:func:`clopper_pearson_upper` after its checks (0 <= k <= n, n >= 1, α in (0, 1))."""
  if k == n:
    return 1.0
  target = math.log(alpha) - _LOG_CDF_SLACK
  if k == 0:  # P[X = 0] = (1 - p)^n = α in closed form; then the same acceptance check
    hi = min(1.0, -math.expm1(target / n) * (1 + 1e-12))
    return hi
  j = np.arange(k + 1, dtype=np.float64)
  log_choose = math.lgamma(n + 1) - _LGAMMA(j + 1) - _LGAMMA(n - j + 1)
  # The CDF decreases in p. The limit lies above k/n when α < 1/2 (k is a median of
  # Bin(n, k/n)); otherwise the bisection ends at k/n, still above the limit.
  lo, hi = k / n, 1.0
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if mid <= lo or mid >= hi:
      break
    if _log_binomial_cdf(log_choose, n, mid) <= target:
      hi = mid
    else:
      lo = mid
    if hi - lo <= 1e-13 * hi:
      break
  return hi


def epsilon_lower_bound(false_positives: int, false_negatives: int,
                        trials: int | tuple[int, int], delta: float,
                        confidence: float = 0.95) -> float:
  r"""Lower bound on ε from a distinguishing test's error counts (Clopper–Pearson).

  .. math:: \hat\varepsilon = \max\Big(0,\ \log\frac{1-\delta-\overline{\mathrm{FPR}}}{\overline{\mathrm{FNR}}},\
            \log\frac{1-\delta-\overline{\mathrm{FNR}}}{\overline{\mathrm{FPR}}}\Big),

  each upper limit one-sided at level :math:`1 - (1 - \text{confidence})/2`. If the mechanism
  is (ε, δ)-DP and the test was fixed before these trials were drawn, ε̂ ≤ ε with probability
  ≥ ``confidence`` (union bound over the two limits).

  Args:
    false_positives: trials of the "absent" world the test called "present" (an int, at
      most that world's trials).
    false_negatives: trials of the "present" world the test called "absent" (an int, at
      most that world's trials).
    trials: trials per world (an int), or ``(absent_trials, present_trials)``.
    delta: δ in (0, 1).
    confidence: in (0, 1).

  Returns:
    ε̂ ≥ 0 (a float).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued, or a count that is not an int.

  References:
    Kairouz, Oh, Viswanath, ICML 2015, Thm. 2.1 (hypothesis-testing view of DP); Nasr et al.,
    IEEE S&P 2021, Sec. 3 (Clopper–Pearson lower bounds).
  """
  if isinstance(trials, tuple):
    if len(trials) != 2:
      raise ValueError(f"trials must be an int or a pair (absent, present), got {trials!r}.")
    n_absent, n_present = trials
  else:
    n_absent = n_present = trials
  n_absent = _check_count("trials", n_absent, lo=1)
  n_present = _check_count("trials", n_present, lo=1)
  errors = {}
  for name, count, world, n in (("false_positives", false_positives, "absent", n_absent),
                                ("false_negatives", false_negatives, "present", n_present)):
    errors[name] = _check_count(name, count)
    if errors[name] > n:
      raise ValueError(f"{name} must be <= the {world} world's trials ({n}), got {count}.")
  delta = _check_probability("delta", delta, "delta")
  confidence = _check_probability("confidence", confidence, "confidence")
  alpha = (1.0 - confidence) / 2
  fpr = _upper_limit(errors["false_positives"], n_absent, alpha)
  fnr = _upper_limit(errors["false_negatives"], n_present, alpha)
  return _epsilon_from_rates(fpr, fnr, delta)


def _epsilon_from_rates(fpr, fnr, delta):
  best = 0.0
  for num, den in ((1 - delta - fpr, fnr), (1 - delta - fnr, fpr)):
    if num > 0 and den > 0:
      best = max(best, math.log(num) - math.log(den))
  return best
