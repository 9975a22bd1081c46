r"""log J at integer orders up to 4096: the exact binomial sum.

.. math:: A_\alpha - 1 = \sum_{k=2}^{\alpha} \binom{\alpha}{k} q^k (1-q)^{\alpha-k}
          \big(e^{k(k-1)/(2\sigma^2)} - 1\big)

(Mironov, Talwar, Zhang 2019, Sec. 3.2, minus the same expansion of :math:`1 = (1-q+q)^\alpha`):
a sum of non-negative terms, summed in log space, so nothing cancels (float32 too). The terms
that depend on (q, σ, k) (:func:`_per_pair_terms`) and on (α, k) (:func:`_log_binomials`) are
computed once each and shared across orders and pairs (:func:`_log_j_integer`,
:func:`_integer_orders`).
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp.mechanisms.sampled_gaussian.common import _in_row_blocks, _select_columns, _where

_SUM_ELEMENTS = 1 << 24      # terms per step of the summation (bounds memory)


def _log_expm1_of_square(k, log_sigma, inv_s2):
  """log(e^c - 1) for c = k(k-1)/(2 sigma^2), k >= 2 (from log sigma and 1/sigma^2). Where
  c is below 1e-8 it is log c + c/2 (within 1e-17 relative), with log c taken from log
  sigma: for huge sigma c underflows (float64 above ~1e154, float32 above ~1e19), and
  e^c - 1 = 0 would make the result +inf instead of the tiny true value."""
  half = k * (k - 1) / 2   # k: a NumPy array (constants: no kernel of their own); exact
  c = half.astype(inv_s2.dtype) * inv_s2
  tiny = c < 1e-8
  log_c = np.log(half).astype(inv_s2.dtype) - 2 * log_sigma
  c_safe = _where(tiny, 1.0, c)
  return _where(tiny, log_c + c / 2, c_safe + jnp.log(-jnp.expm1(-c_safe)))


_SUM_CHUNK = 65   # terms per chunk of the exact sums (k = 0..64: one chunk for orders <= 64)


def _log_j_integer(per_pair, log1m_q, alphas, packed, widths):
  r"""log J = log((A_α − 1)/(α − 1)) for integer orders α >= 2, exactly:

  .. math:: A_\alpha - 1 = \sum_{k=2}^{\alpha} \binom{\alpha}{k} q^k (1-q)^{\alpha-k}
            \big(e^{k(k-1)/(2\sigma^2)} - 1\big),

  the binomial expansion of :math:`E_{\mu_0}[(1-q+qL)^\alpha]` with :math:`E_{\mu_0}[L^k] =
  e^{k(k-1)/(2\sigma^2)}` (Mironov, Talwar, Zhang 2019, Sec. 3.2) minus the same expansion of
  :math:`1 = (1-q+q)^\alpha`: a sum of non-negative terms, summed in log space, so nothing
  cancels (float32 too). ``per_pair``: :func:`_per_pair_terms` (n, >= K+1); ``log1m_q``:
  log(1 - q), shape (n, 1); ``alphas``: one array of orders per bucket (m_b,); ``packed``:
  their log C(α, k) cut into chunks (:func:`packed_binomials`), ``widths``: each bucket's
  K_b + 1. Returns (n, Σ m_b), the buckets' orders in turn. The terms depend on (q, sigma, k)
  and on (alpha, k) separately: both parts are computed once and shared across orders / pairs.

  Every bucket's rows are cut into chunks of _SUM_CHUNK terms and all chunks of all buckets
  summed together (log-sum-exp per chunk, then over each order's chunks): one set of kernels
  for any number of buckets. The chunks' log-binomials come packed as one table, and which
  chunk of the per-pair terms each row takes and each row's order are constants
  (:func:`_chunk_layout`): the terms are one elementwise expression with a gather of rows,
  where a concatenation of the buckets' pieces was a loop per piece (~10 % of the machine
  code XLA generates for ε).
  """
  chunk_k, chunk_order, by_order, filled = _chunk_layout(
      tuple((len(a), w) for a, w in zip(alphas, widths)))
  alpha = jnp.concatenate(alphas) if len(alphas) > 1 else alphas[0]
  # The per-pair terms cut into chunks too (k = 0..64, 65..129, ...: per_pair reaches a whole
  # number of chunks), each table row's taken whole (a gather of rows, not of terms).
  if per_pair.shape[0] * chunk_k.size * _SUM_CHUNK >= _GATHERED_ONCE:
    per_pair = _computed_once(per_pair)
  chunks = per_pair.reshape(per_pair.shape[0], -1, _SUM_CHUNK)
  terms = (packed[None] + chunks[:, chunk_k]
           + (log1m_q * alpha[chunk_order][None, :])[..., None])
  terms = _where(jnp.isfinite(packed)[None], terms, -jnp.inf)
  top = lax.stop_gradient(jnp.max(terms, axis=-1))
  has_terms = jnp.isfinite(top)   # false for a chunk of padding only (k beyond its order)
  top = _where(has_terms, top, 0.0)
  total = jnp.sum(jnp.exp(terms - top[..., None]), axis=-1)   # 0 for padding only
  if by_order is None:
    log_a_minus_1 = jnp.log(total) + top
  else:
    # Each order's chunks (n, m, most chunks; padded with chunks of nothing), summed in linear
    # space relative to the largest of their tops: no logarithm of a partial sum is rounded
    # (in float32 that would cost ~|log A| ulps).
    chunk_top = _where(filled, _where(has_terms, top, -jnp.inf)[:, by_order], -jnp.inf)
    chunk_total = _where(filled, total[:, by_order], 0.0)
    top = jnp.max(chunk_top, axis=-1)   # finite: every order has terms
    weighted = chunk_total * jnp.exp(chunk_top - top[..., None])
    log_a_minus_1 = jnp.log(jnp.sum(weighted, axis=-1)) + top
  return log_a_minus_1 - jnp.log(alpha - 1)


# Gathered terms from which on the per-pair terms are computed once, before the gather (below,
# XLA:CPU fuses them into it: each gathered row recomputes its exponentials and logarithms).
_GATHERED_ONCE = 1 << 20


def _computed_once(x):
  """``x``, exactly (0 + x), as the last entry of a cumulative sum: XLA:CPU fuses an
  elementwise producer into a gather that reads it, however many times each element is read
  (it counts a gather as a permutation), and a cumulative sum (a window reduction) is not
  fused into its consumer. Where the default orders' 302 chunks of 65 terms are gathered from
  64 chunks of per-pair terms, the exponentials and logarithms are then computed once instead
  of ~4.7 times (jax.vmap of ε over 64 σ: 7.1 ms -> ~1.5 ms of its warm call; a sum over the
  pair instead of the cumulative sum costs XNNPACK's reduction 1.2 ms more, and XLA removes
  an integer one); two kernels more to compile (~30 ms), so only for large batches."""
  return lax.cumsum(jnp.stack([jnp.zeros_like(x), x], axis=-1), axis=x.ndim)[..., 1]


@functools.lru_cache(maxsize=None)
def _chunk_layout(shapes):
  """For buckets of (orders, K + 1) = ``shapes``, cut into chunks of _SUM_CHUNK terms: which
  chunk of its order each chunk is (its terms' k are _SUM_CHUNK times that and on), the order
  of each chunk, and each order's chunks (orders, most chunks; its last repeated) with which
  of those are its own (None for both where every order has one chunk)."""
  chunk_k, chunk_order, counts, order = [], [], [], 0
  for m, width in shapes:
    per_order = -(-width // _SUM_CHUNK)
    chunk_k.append(np.tile(np.arange(per_order), m))
    chunk_order.append(np.repeat(np.arange(order, order + m), per_order))
    counts += [per_order] * m
    order += m
  # (int32: indices of JAX's own width whether or not 64-bit types are enabled.)
  chunk_k = np.concatenate(chunk_k).astype(np.int32)
  chunk_order = np.concatenate(chunk_order).astype(np.int32)
  if max(counts) == 1:
    return chunk_k, chunk_order, None, None
  widest, first = max(counts), np.concatenate([[0], np.cumsum(counts)])
  by_order = np.minimum(first[:-1, None] + np.arange(widest), first[1:, None] - 1)
  return (chunk_k, chunk_order, by_order.astype(np.int32),
          np.arange(widest) < np.array(counts)[:, None])


def packed_binomials(tables):
  """The log-binomial tables of the buckets (m_b, K_b + 1), each order's row cut into chunks
  of _SUM_CHUNK (the last padded with -inf), all as one (chunks, _SUM_CHUNK) table."""
  rows = []
  for table in tables:
    m, width = table.shape
    per_order = -(-width // _SUM_CHUNK)
    padded = np.full((m, per_order * _SUM_CHUNK), -np.inf)
    padded[:, :width] = table
    rows.append(padded.reshape(m * per_order, _SUM_CHUNK))
  packed = np.concatenate(rows)
  packed.flags.writeable = False
  return packed


@functools.lru_cache(maxsize=None)
def _log_binomials(orders, k_max):
  """log C(a, k) for each integer order a and 0 <= k <= k_max, -inf unless 2 <= k <= a
  (float64, each entry correctly rounded: C(a, k) is an exact integer)."""
  table = np.full((len(orders), k_max + 1), -np.inf)
  for row, a in enumerate(orders):
    c = a   # C(a, 1); then C(a, k + 1) = C(a, k) (a - k) / (k + 1), exactly in integers
    for k in range(2, a + 1):
      c = c * (a - k + 1) // k
      table[row, k] = math.log(c)
  table.flags.writeable = False
  return table


def _pair_constants(q, sigma, sigma_raw):
  """(log q, log sigma), log(1 - q), (1/sigma^2, 1/(2 sigma_raw^2)) for the generic
  stand-ins q, sigma (n,) and sigma_raw (1/2 where sigma_raw = 0), shapes (n, 2), (n, 1),
  (n, 2): each function once on the columns it serves (:func:`_select_columns`). XLA computes
  each as a kernel of its own wherever it is used (an expensive function of a per-pair value
  that is broadcast), so three kernels rather than five."""
  wide = lambda v: jnp.broadcast_to(v[:, None], v.shape + (2,))
  s_raw = wide(_where(sigma_raw > 0, sigma_raw, 1.0))
  logs = jnp.log(_select_columns([wide(q), wide(sigma)]))
  reciprocals = 1 / _select_columns([wide(sigma * sigma), 2 * s_raw * s_raw])
  return logs, jnp.log1p(-q)[:, None], reciprocals


def _per_pair_terms(pair, k_max):
  """k log(q / (1 - q)) + log(e^{k(k-1)/(2 sigma^2)} - 1) for k = 0 .. k_max (k < 2 as k = 2:
  their binomial coefficients are -inf), shape (n, k_max + 1), from :func:`_pair_constants`;
  and log(1 - q), shape (n, 1)."""
  k = np.arange(k_max + 1, dtype=np.float64)
  (logs, log1m_q, reciprocals) = pair
  log_q, log_sigma, inv_s2 = logs[:, :1], logs[:, 1:], reciprocals[:, :1]
  per_pair = (k.astype(log_q.dtype) * (log_q - log1m_q)
              + _log_expm1_of_square(np.maximum(k, 2.0), log_sigma, inv_s2))
  return per_pair, log1m_q


def _integer_orders(pair, alphas, tables, widths):
  """log J (n, m) at the integer orders of every bucket of the split for flat generic q,
  sigma given by their :func:`_pair_constants` ``pair`` (``alphas``: one array per
  bucket, ``tables``: their log-binomials packed into chunks, (:func:`packed_binomials`,
  from :func:`order_tables`), ``widths``: each bucket's K + 1), concatenated. The per-pair
  terms are computed once, up to the largest bucket."""
  packed = tables[0].astype(pair[0].dtype)
  k_max = -(-max(widths) // _SUM_CHUNK) * _SUM_CHUNK - 1   # a whole number of chunks

  def block(pairs):
    per_pair, log1m_q = _per_pair_terms(pairs, k_max)
    return _log_j_integer(per_pair, log1m_q, alphas, packed, widths)

  return _in_row_blocks(block, max(1, _SUM_ELEMENTS // packed.size), *pair)
