"""Binomial tails on the host, certified: never below the true probability.

:func:`overflow_probability` bounds P[Binomial(n, q) > m], the probability that a Poisson
batch of n examples at rate q overflows m slots; :func:`jaxrdp.poisson_overflow_probability`
and the sizing of the truncated-Poisson PLD (:mod:`jaxrdp.accounting.pld.truncation`) use it.
"""

from __future__ import annotations

import functools
import math

import numpy as np

_TERMS = 4096             # binomial terms evaluated per block in the tail sums
_NEGLIGIBLE_LOG = -46.0   # a remainder below e^-46 (1e-20) of the sum is dropped ...
                          # ... only in the lower-tail sum, where dropping is on the safe side


_lgamma = np.vectorize(math.lgamma, otypes=[np.float64])


def _log_pmf(n, ks, log_q, log1m_q):
  """log C(n,k) q^k (1-q)^(n-k) for an int array ks, and a bound on its absolute rounding error."""
  k = ks.astype(np.float64)
  parts = (math.lgamma(n + 1.0), -_lgamma(k + 1), -_lgamma(n - k + 1), k * log_q, (n - k) * log1m_q)
  value = sum(parts)
  # Each part and each addition is off by a few ulps of the largest magnitude involved.
  error = 8 * np.finfo(np.float64).eps * sum(np.abs(p) for p in parts)
  return value, error


def _logsumexp(x):
  top = np.max(x)
  if not np.isfinite(top):
    return top
  return top + math.log(np.sum(np.exp(x - top)))


@functools.lru_cache(maxsize=256)
def overflow_probability(n: int, q: float, m: int) -> float:
  """An upper bound on P[Binomial(n, q) > m] (ints n, m ≥ 0, q in [0, 1]; unchecked): the
  method of :func:`jaxrdp.poisson_overflow_probability`, which checks its arguments."""
  if m >= n or q == 0.0:
    return 0.0
  if q == 1.0:
    return 1.0
  log_q, log1m_q = math.log(q), math.log1p(-q)
  log_ratio_q = log_q - log1m_q
  mode = math.floor((n + 1) * q)
  if m + 1 > mode:
    # Upper tail: t_{m+1} >= t_{m+2} >= ...
    total, allowance, k = -math.inf, 0.0, m + 1
    while True:
      ks = np.arange(k, min(k + _TERMS, n + 1), dtype=np.int64)
      lp, err = _log_pmf(n, ks, log_q, log1m_q)
      total = np.logaddexp(total, _logsumexp(lp))
      allowance = max(allowance, float(np.max(err)))
      last = int(ks[-1])
      if last == n:
        break
      log_r = math.log(n - last) - math.log(last + 1) + log_ratio_q
      rest = lp[-1] + log_r - math.log(-math.expm1(log_r))
      if rest < total + _NEGLIGIBLE_LOG or lp[-1] < -800:
        total = np.logaddexp(total, rest)
        break
      k = last + 1
    return float(min(1.0, math.exp(total + allowance) * (1 + 1e-12)))
  # Lower tail: P[X <= m] summed from k = m down (terms shrink as k decreases below the mode);
  # a partial sum is a lower bound, so 1 - sum is an upper bound on P[X > m].
  total, allowance, k = -math.inf, 0.0, m
  while k >= 0:
    ks = np.arange(max(k - _TERMS + 1, 0), k + 1, dtype=np.int64)
    lp, err = _log_pmf(n, ks, log_q, log1m_q)
    total = np.logaddexp(total, _logsumexp(lp))
    allowance = max(allowance, float(np.max(err)))
    if lp[0] < total + _NEGLIGIBLE_LOG:
      break
    k = int(ks[0]) - 1
  return float(min(1.0, -math.expm1(total - allowance) * (1 + 1e-12)))
