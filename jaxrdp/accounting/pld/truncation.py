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
from jax import lax

from jaxrdp.accounting import binomial

_TERMS = 4096   # binomial terms on either side of B

_U = float(np.finfo(np.float64).eps) / 2


_BLOCK = 64     # terms per block of :func:`_prefix_sums` (_TERMS = _BLOCK²)
_PREFIX_ROUNDING = 2 * _BLOCK + 2


def _prefix_sums(x):
  """Inclusive prefix sums along the last axis (of length _TERMS): within blocks of _BLOCK
  terms, and of the blocks' totals, each a product with a triangular matrix of ones (exact
  products: each sum's rounding is at most (_BLOCK − 1)u times the sum of its terms'
  magnitudes, whatever order the product adds them in; Higham 2002, §3.1). Each prefix sum is
  then within _PREFIX_ROUNDING·u (γ over 2·_BLOCK + 2 additions) of the sum of the magnitudes
  of its terms — a bound that holds on every backend, unlike that of a scan whose order the
  compiler chooses (``jnp.cumsum``: up to _TERMS − 1 additions in a chain)."""
  blocks = x.reshape(x.shape[:-1] + (_TERMS // _BLOCK, _BLOCK))
  upper = jnp.asarray(np.triu(np.ones((_BLOCK, _BLOCK))), x.dtype)   # [i, k] = 1 for i ≤ k
  inside = jnp.matmul(blocks, upper, precision=lax.Precision.HIGHEST)
  before = jnp.matmul(inside[..., -1], jnp.asarray(np.triu(np.ones((_BLOCK, _BLOCK)), 1), x.dtype),
                      precision=lax.Precision.HIGHEST)                 # blocks before each
  return (inside + before[..., None]).reshape(x.shape)


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
  ex = lambda v: v[..., None, None]
  # Both sides of B at once, on an axis (upward, downward) before the terms': j = B + k upward,
  # j = B − 1 − k downward, and the log-ratio log r_j of each term to the one before.
  k = jnp.arange(_TERMS, dtype=dtype)
  j = ex(b) + jnp.stack([k, -1.0 - k])                            # (..., 2, _TERMS)
  ok = (j <= ex(m)) & (j >= 0)
  jc = jnp.clip(j, 0.0, ex(m))
  log_r = jnp.log(jnp.maximum(ex(m) - jc, 0.5)) - jnp.log(jc + 1.0) + ex(log_odds)
  # log t_j − log t_B: upward Σ_{i<k} log r_{B+i} (the exclusive prefix sum), downward
  # −Σ_{i≤k} log r_{B−1−i}.
  inclusive = _prefix_sums(log_r)
  upward = jnp.arange(2) == 0
  rel = jnp.where(upward[:, None], inclusive - log_r, -inclusive)
  log_t_b = log_c + b * jnp.log(qs) + (m - b) * jnp.log1p(-qs)
  # The rounding of log t_B, and of the window's partial sums of log-ratios (:func:`_prefix_sums`:
  # within _PREFIX_ROUNDING·u of the sum of the magnitudes, with the log-ratios' own rounding
  # and the subtraction), and of the sums of terms (_TERMS of them): relative.
  size = jnp.abs(log_c) + b * jnp.abs(jnp.log(qs)) + (m - b) * jnp.abs(jnp.log1p(-qs))
  window = (_PREFIX_ROUNDING + 8) * u * _TERMS * (2.0 + jnp.abs(log_odds) + 2 * jnp.log(m + 2.0))
  rounding = log_c_error + 8 * u * size + window

  def log_sum(x):
    x = jnp.where(ok, x, -jnp.inf)
    top = jnp.max(x, -1)                          # finite: the first entry is always ok
    return jnp.log(jnp.sum(jnp.exp(x - top[..., None]), -1)) + top

  # log Σ_{window} t_j / t_B on each side (j = B − 1 always exists downward: B ≥ 1), and the
  # geometric bound on the terms past the window (their ratio to the one before falls with
  # the distance from B; a side whose last ratio is not below 1, upward log r, downward
  # −log r, has no bound: +inf), −inf where there are none.
  sums = log_sum(rel)                                                # (..., 2)
  last_r = jnp.where(upward, log_r[..., -1], -log_r[..., -1])
  bounded = last_r < 0
  r = jnp.where(bounded, last_r, -1.0)
  rest = jnp.where(ok[..., -1], rel[..., -1] + r - jnp.log(-jnp.expm1(r)), -jnp.inf)
  known = bounded | ~ok[..., -1]
  # w ∈ [w_lo, w_hi] from each side (t_B's scale restored, each end moved out by the rounding):
  # upward w ≥ the window's terms, w ≤ them and the rest; downward 1 − w likewise.
  scale, rounding = log_t_b[..., None], rounding[..., None]
  lo = jnp.exp(scale + sums - rounding)
  hi = jnp.where(known, jnp.exp(scale + jnp.logaddexp(sums, rest) + rounding), 1.0)
  w_lo = jnp.maximum(lo[..., 0], 1.0 - hi[..., 1])
  w_hi = jnp.maximum(jnp.minimum(jnp.minimum(hi[..., 0], 1.0 - lo[..., 1]), 1.0), w_lo)
  # q_c: the window's average of q·B/(j + 1) over j ≥ B (log t_B cancels), raised by the
  # rounding of its weights' logarithms: twice the window's bound, for a ratio of two sums.
  weights = jnp.log(ex(b)) - jnp.log(jc + 1.0)
  log_avg = log_sum(rel + weights)[..., 0] - sums[..., 0]
  qc = jnp.minimum(qs * jnp.exp(log_avg + 2 * window), 1.0)
  poisson = jnp.where(inner, (1.0 - w_lo) * (1 + 4 * u), jnp.where(full, 0.0, 1.0))
  replace = jnp.where(inner, w_hi * (1 + 4 * u), jnp.where(full, 1.0, 0.0))
  qc = jnp.where(inner, qc, jnp.where(full, b_given / n, 0.0))
  return poisson, replace, qc

