"""Privacy random variables (``prv_accountant``'s interface) for the pairs of truncated Poisson
sampling and of mixtures of Gaussians, so that the PRV accountant (Gopi, Lee, Wutschitz 2021)
gives an independent, certified lower bound on their ε: its ``eps_lower`` for one direction of
the pair is at most that direction's exact ε, which is at most the larger of the two directions'
(what jaxrdp reports).

Written from the pairs' definitions alone (no jaxrdp code): each loss inverted by bisection in
NumPy, the truncation weights from SciPy's binomial tails. ``cdf`` is the CDF of the privacy
loss log(P(x)/Q(x)) under P; ``rdp`` an upper bound on D_α(P‖Q), which the accountant needs
only to size its domain safely (a larger bound widens it).

* :class:`MixtureOfGaussians`: P = Σ_i p_i N(c_i, σ²), Q = N(0, σ²) (dp_accounting's
  ``MixtureOfGaussiansDpEvent``, the remove direction), c_i ≥ 0 not all 0: the loss
  L(x) = log Σ_i p_i e^{(2 c_i x − c_i²)/(2σ²)} increases in x; D_α ≤ log Σ_i p_i
  e^{α(α − 1)c_i²/(2σ²)}/(α − 1) (joint convexity of e^{(α − 1)D_α}, van Erven and Harremoës
  2014, Thm. 13).
* :class:`ReplaceOne`: P = (1 − q)N(0, s²) + qN(1, s²), Q = (1 − q)N(0, s²) + qN(−1, s²), the
  same in both directions; D_α ≤ log(1 − q + q e^{2α(α − 1)/s²})/(α − 1) (joint convexity).
* :class:`KnownComponent`: the pair that is pair i with probability w_i, the component seen:
  its loss is pair i's with probability w_i (the CDFs mixed), and
  e^{(α − 1)D_α} = Σ_i w_i e^{(α − 1)D_α,i} exactly.
* :func:`truncated_poisson`: the step of truncated Poisson sampling (arXiv 2508.15089), N
  examples in the larger neighbour: the Poisson pair at (q, σ) with probability 1 − w, the
  replace-one pair at (q_c, σ/2) with probability w, w = P[Binomial(N − 1, q) ≥ B],
  q_c = B·P[Binomial(N, q) > B]/(N·w).
"""

from __future__ import annotations

import math

import numpy as np
from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism
from prv_accountant.privacy_random_variables.abstract_privacy_random_variable import (
    PrivacyRandomVariable)
from scipy import special, stats


def _invert(loss, t, low=-1e4, high=1e4, iterations=64):
  """x with loss(x) = t for an increasing ``loss``, elementwise (bisection, to the float)."""
  t = np.asarray(t, np.float64)
  lo, hi = np.full(t.shape, low), np.full(t.shape, high)
  for _ in range(iterations):
    mid = 0.5 * (lo + hi)
    above = loss(mid) >= t
    hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
  return 0.5 * (lo + hi)


class MixtureOfGaussians(PrivacyRandomVariable):

  def __init__(self, sigma, c, p):
    self.sigma, self.c, self.p = float(sigma), np.asarray(c, np.float64), np.asarray(p, np.float64)
    assert np.all(self.c >= 0) and np.any((self.c > 0) & (self.p > 0))

  def loss(self, x):
    x = np.asarray(x)[..., None]
    held = self.p > 0
    terms = np.where(held, np.log(np.where(held, self.p, 1.0))
                     + (2 * self.c * x - self.c**2) / (2 * self.sigma**2), -np.inf)
    top = terms.max(axis=-1)
    return top + np.log(np.exp(terms - top[..., None]).sum(axis=-1))

  def cdf(self, t):
    x = _invert(self.loss, t)[..., None]
    return np.sum(self.p * stats.norm.cdf((x - self.c) / self.sigma), axis=-1)

  def rdp(self, alpha):
    return special.logsumexp(alpha * (alpha - 1) * self.c**2 / (2 * self.sigma**2),
                             b=self.p) / (alpha - 1)


class ReplaceOne(PrivacyRandomVariable):

  def __init__(self, q, s):
    self.q, self.s = float(q), float(s)

  def loss(self, x):
    log_density = lambda mean: np.logaddexp(math.log1p(-self.q) - x**2 / (2 * self.s**2),
                                            math.log(self.q) - (x - mean)**2 / (2 * self.s**2))
    return log_density(1.0) - log_density(-1.0)

  def cdf(self, t):
    x = _invert(self.loss, t)
    return (1 - self.q) * stats.norm.cdf(x / self.s) + self.q * stats.norm.cdf((x - 1) / self.s)

  def rdp(self, alpha):
    return np.logaddexp(math.log1p(-self.q),
                        math.log(self.q) + 2 * alpha * (alpha - 1) / self.s**2) / (alpha - 1)


class KnownComponent(PrivacyRandomVariable):

  def __init__(self, weights, prvs):
    self.weights, self.prvs = [float(w) for w in weights], list(prvs)

  def cdf(self, t):
    return sum(w * np.asarray(prv.cdf(t), np.float64) for w, prv in zip(self.weights, self.prvs)
               if w > 0)

  def rdp(self, alpha):
    return special.logsumexp([(alpha - 1) * float(prv.rdp(alpha)) for prv in self.prvs],
                             b=self.weights) / (alpha - 1)


def truncated_poisson(larger_size, max_batch_size, q, sigma):
  """The PRV of one step of truncated Poisson sampling (module docstring), N = ``larger_size``
  the larger neighbour's examples (jaxrdp's ``dataset_size`` + 1: either neighbour may hold
  the example, so ``dataset_size`` others are counted)."""
  n, b = int(larger_size), int(max_batch_size)
  w = float(stats.binom.sf(b - 1, n - 1, q))
  poisson = PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)
  if w == 0:
    return poisson
  qc = b * float(stats.binom.sf(b, n, q)) / (n * w)
  return KnownComponent([1 - w, w], [poisson, ReplaceOne(qc, sigma / 2)])


def lower_bound(prv, steps, delta, eps_scale):
  """The PRV accountant's ``eps_lower`` for ``steps`` compositions of ``prv`` at ``delta`` (ε
  error 1 % of ``eps_scale``, δ error δ/1000), or None where the accountant fails (its
  discretiser's check of the mean)."""
  import warnings
  from prv_accountant import PRVAccountant
  try:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
      warnings.simplefilter("ignore")
      accountant = PRVAccountant(prvs=[prv], max_self_compositions=[int(steps)],
                                 eps_error=max(0.01, 0.01 * eps_scale), delta_error=delta / 1000)
      lower, _, _ = accountant.compute_epsilon(delta=delta, num_self_compositions=[int(steps)])
  except RuntimeError:
    return None
  return float(lower)
