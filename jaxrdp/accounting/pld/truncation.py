r"""Truncated Poisson sampling: the weights of its step's PLD, in the graph.

Each of N examples joins a batch independently with probability q, and a batch of more than
B examples is cut to B of them chosen uniformly at random (``jaxrdp.poisson_sample``'s
overflow policy). For a dataset D' = D ∪ {z}, with K ~ Binomial(N − 1, q) the examples of D
drawn (arXiv 2508.15089; dp_accounting's ``from_truncated_subsampled_gaussian_mechanism``):

* with probability 1 − w, w = P[K ≥ B], the batch without z is never cut when z joins:
  the Poisson pair at (q, σ);
* with probability w it is cut, and z is in it with probability
  q_c = q·E[B/(K + 1) | K ≥ B] = B·P[Binomial(N, q) > B]/(N·w): the replace-one pair at
  (q_c, σ/2) (:func:`jaxrdp.accounting.pld.discretisation._replace_loss`).

:func:`truncation_weights` computes (w, q_c) from the binomial terms
t_j = C(N − 1, j) q^j (1 − q)^{N−1−j} on a window of :data:`_TERMS` terms on either side of
B, with what bounds them:

* q_c: the average of the decreasing weights q·B/(j + 1) over the terms j ≥ B of the window.
  Leaving out terms beyond the window raises such an average, so this is an upper bound on
  q_c, and the replace-one pair at a larger q_c dominates the one at q_c (the smaller rate is
  a post-processing of the larger: keep the sample with probability q_c/q_c', else draw a
  fresh N(0, s²), the same map on both sides). Independent of the log of t_B, which cancels.
* w ∈ [w_lo, w_hi]: the window's sum of the terms j ≥ B, with a geometric bound on the terms
  past it (their ratio r_j = (N − 1 − j)q/((j + 1)(1 − q)) decreases in j), and one minus the
  window's sum of the terms j < B with the same kind of bound below, the tighter of the two;
  each end moved out by the rounding of log t_B (whose log C(N − 1, B) comes from the host)
  and of the sums. The step's masses are mixed with the weights 1 − w_lo and w_hi: every
  mass, and every point of the discretised PLD (the split is linear in the masses with
  non-negative coefficients), is then at least the true mixture's, and so is its composition
  (convolution is monotone in non-negative inputs), whatever w in the interval is.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jaxrdp.accounting import binomial

_TERMS = 4096   # binomial terms on either side of B

_U = float(np.finfo(np.float64).eps) / 2


def log_choose(n: int, k: int) -> tuple[float, float]:
  """(log C(n, k), a bound on its absolute error) on the host: ``math.lgamma`` (within a few
  ulps of each of its three values; 8 ulps of each is allowed)."""
  if k < 0 or k > n:
    return -math.inf, 0.0
  parts = (math.lgamma(n + 1), math.lgamma(k + 1), math.lgamma(n - k + 1))
  return parts[0] - parts[1] - parts[2], 8 * _U * (sum(abs(v) for v in parts) + 1.0)


def host_weights(n: int, b, q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(1 − w, w, q_c) of concrete (N, B, q) arrays, for sizing (the host's certified tails of
  :mod:`jaxrdp.accounting.binomial`; the kernels compute their own with
  :func:`truncation_weights`)."""
  b, q = np.broadcast_arrays(np.asarray(b, np.int64), np.asarray(q, np.float64))
  w = np.array([binomial.overflow_probability(n - 1, float(p), int(v) - 1)
                for v, p in zip(b.ravel(), q.ravel())]).reshape(b.shape)
  cut = np.array([binomial.overflow_probability(n, float(p), int(v))
                  for v, p in zip(b.ravel(), q.ravel())]).reshape(b.shape)
  with np.errstate(divide="ignore", invalid="ignore"):
    qc = np.where(w > 0, np.minimum(b * cut / (n * w), 1.0), 0.0)
  return 1.0 - w, w, qc


def truncation_weights(q, n, b, log_c, log_c_error):
  """(1 − w_lo, w_hi, q̂_c) of truncated Poisson sampling (see the module docstring),
  elementwise.

  Args:
    q: the sampling rate (traced or not; its float dtype is the arithmetic's, and the
      rounding allowances are that dtype's).
    n: N, the number of examples (an int or a float array of whole numbers).
    b: B ≥ 1, the largest batch (the same).
    log_c: log C(N − 1, B) (:func:`log_choose`), -inf where B > N − 1.
    log_c_error: a bound on its absolute error.

  Returns:
    The weights of the Poisson pair and of the replace-one pair, each an upper bound on its
    true weight (1 − w and w; they may sum to a little more than one), and q̂_c ≥ q_c. (1, 0,
    0) where a batch is never cut (B ≥ N, or q = 0); (0, 1, B/N) at q = 1.
  """
  q = jnp.asarray(q)
  dtype = q.dtype if jnp.issubdtype(q.dtype, jnp.floating) else jnp.result_type(float)
  u = float(jnp.finfo(dtype).eps) / 2             # the unit roundoff of the arithmetic
  q, n, b, log_c, log_c_error = jnp.broadcast_arrays(
      *(jnp.asarray(v, dtype) for v in (q, n, b, log_c, log_c_error)))
  full = (q >= 1) & (b <= n - 1.0)               # every example drawn: always cut
  b_given = b
  inner = (q > 0) & (q < 1) & (b <= n - 1.0)
  # Lanes with nothing to compute get harmless values (no NaN in any derivative).
  qs = jnp.where(inner, q, 0.5)
  m = jnp.where(inner, n - 1.0, 2.0)              # the other examples
  b = jnp.where(inner, b, 1.0)
  log_c = jnp.where(inner, log_c, math.log(2.0))
  log_c_error = jnp.where(inner, log_c_error, 0.0)
  log_odds = jnp.log(qs) - jnp.log1p(-qs)
  ex = lambda v: v[..., None]
  k = jnp.arange(_TERMS, dtype=dtype)
  # Upward from B: j = B + k, log t_j − log t_B = Σ_{i<k} log r_{B+i}.
  j_up = ex(b) + k
  up_ok = j_up <= ex(m)
  log_r_up = (jnp.log(jnp.maximum(ex(m) - j_up, 0.5)) - jnp.log(j_up + 1.0) + ex(log_odds))
  rel_up = jnp.concatenate([jnp.zeros_like(j_up[..., :1]), jnp.cumsum(log_r_up, -1)[..., :-1]],
                           axis=-1)
  # Downward from B − 1: j = B − 1 − k, log t_j − log t_B = −Σ_{i≤k} log r_j.
  j_dn = ex(b) - 1.0 - k
  dn_ok = j_dn >= 0
  log_r_dn = (jnp.log(ex(m) - jnp.maximum(j_dn, 0.0)) - jnp.log(jnp.maximum(j_dn, 0.0) + 1.0)
              + ex(log_odds))
  rel_dn = -jnp.cumsum(log_r_dn, -1)
  log_t_b = log_c + b * jnp.log(qs) + (m - b) * jnp.log1p(-qs)
  # The rounding of log t_B, and of the window's partial sums of log-ratios (each within a few
  # u of its size) and of the sums of terms: relative.
  size = jnp.abs(log_c) + b * jnp.abs(jnp.log(qs)) + (m - b) * jnp.abs(jnp.log1p(-qs))
  window = 8 * u * _TERMS * (2.0 + jnp.abs(log_odds) + 2 * jnp.log(m + 2.0))
  rounding = log_c_error + 8 * u * size + window

  def log_sum(x, ok):
    x = jnp.where(ok, x, -jnp.inf)
    top = jnp.max(x, -1)                          # finite: the first entry is always ok
    return jnp.log(jnp.sum(jnp.exp(x - top[..., None]), -1)) + top

  def log_rest(last, log_r, ok):
    """log of the geometric bound on the terms past the window (−inf: there are none;
    None-like +inf flag returned separately where the ratio is not below 1)."""
    bounded = log_r < 0
    r = jnp.where(bounded, log_r, -1.0)
    value = jnp.where(ok, last + r - jnp.log(-jnp.expm1(r)), -jnp.inf)
    return value, bounded | ~ok

  s_up = log_sum(rel_up, up_ok)                   # log Σ_{window, j ≥ B} t_j / t_B
  s_dn = log_sum(rel_dn, dn_ok)                   # (j = B − 1 always exists: B ≥ 1)
  rest_up, up_known = log_rest(rel_up[..., -1], log_r_up[..., -1], up_ok[..., -1])
  rest_dn, dn_known = log_rest(rel_dn[..., -1], -log_r_dn[..., -1], dn_ok[..., -1])
  # w ∈ [w_lo, w_hi] from each side (t_B's scale restored, each end moved out by the rounding).
  up_lo = jnp.exp(log_t_b + s_up - rounding)
  up_hi = jnp.where(up_known, jnp.exp(log_t_b + jnp.logaddexp(s_up, rest_up) + rounding), 1.0)
  dn_lo = jnp.exp(log_t_b + s_dn - rounding)
  dn_hi = jnp.where(dn_known, jnp.exp(log_t_b + jnp.logaddexp(s_dn, rest_dn) + rounding), 1.0)
  w_lo = jnp.maximum(up_lo, 1.0 - dn_hi)
  w_hi = jnp.maximum(jnp.minimum(jnp.minimum(up_hi, 1.0 - dn_lo), 1.0), w_lo)
  # q_c: the window's average of q·B/(j + 1) over j ≥ B (log t_B cancels), raised by the
  # rounding of its weights' logarithms: twice the window's bound, for a ratio of two sums.
  weights = jnp.log(ex(b)) - jnp.log(j_up + 1.0)
  log_avg = log_sum(rel_up + weights, up_ok) - s_up
  qc = jnp.minimum(qs * jnp.exp(log_avg + 2 * window), 1.0)
  poisson = jnp.where(inner, (1.0 - w_lo) * (1 + 4 * u), jnp.where(full, 0.0, 1.0))
  replace = jnp.where(inner, w_hi * (1 + 4 * u), jnp.where(full, 1.0, 0.0))
  qc = jnp.where(inner, qc, jnp.where(full, b_given / n, 0.0))
  return poisson, replace, qc

