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


def _log_j_integer(per_pair, log1m_q, alphas, log_binoms):
  r"""log J = log((A_α − 1)/(α − 1)) for integer orders α >= 2, exactly:

  .. math:: A_\alpha - 1 = \sum_{k=2}^{\alpha} \binom{\alpha}{k} q^k (1-q)^{\alpha-k}
            \big(e^{k(k-1)/(2\sigma^2)} - 1\big),

  the binomial expansion of :math:`E_{\mu_0}[(1-q+qL)^\alpha]` with :math:`E_{\mu_0}[L^k] =
  e^{k(k-1)/(2\sigma^2)}` (Mironov, Talwar, Zhang 2019, Sec. 3.2) minus the same expansion of
  :math:`1 = (1-q+q)^\alpha`: a sum of non-negative terms, summed in log space, so nothing
  cancels (float32 too). ``per_pair``: :func:`_per_pair_terms` (n, >= K+1); ``log1m_q``:
  log(1 - q), shape (n, 1); ``alphas``: one array of orders per bucket (m_b,), ``log_binoms``:
  their log C(α, k), (m_b, K_b + 1), -inf unless 2 <= k <= α. Returns (n, Σ m_b), the buckets'
  orders in turn. The terms depend on (q, sigma, k) and on (alpha, k) separately: both parts
  are computed once and shared across orders / pairs.

  Every bucket's rows are cut into chunks of _SUM_CHUNK terms and all chunks of all buckets
  summed together (log-sum-exp per chunk, then over each order's chunks): one set of kernels
  for any number of buckets, where a set per bucket cost XLA a compilation each.
  """
  chunks, counts = [], []
  for alpha, log_binom in zip(alphas, log_binoms):
    m, width = log_binom.shape
    per_order = -(-width // _SUM_CHUNK)
    terms = log_binom[None] + per_pair[:, None, :width] + (log1m_q * alpha[None, :])[..., None]
    terms = _where(jnp.isfinite(log_binom)[None], terms, -jnp.inf)
    terms = jnp.pad(terms, ((0, 0), (0, 0), (0, per_order * _SUM_CHUNK - width)),
                    constant_values=-jnp.inf)
    chunks.append(terms.reshape(terms.shape[0], m * per_order, _SUM_CHUNK))
    counts += [per_order] * m
  terms = jnp.concatenate(chunks, axis=1) if len(chunks) > 1 else chunks[0]
  top = lax.stop_gradient(jnp.max(terms, axis=-1))
  has_terms = jnp.isfinite(top)   # false for a chunk of padding only (k beyond its order)
  top = _where(has_terms, top, 0.0)
  total = jnp.sum(jnp.exp(terms - top[..., None]), axis=-1)   # 0 for padding only
  alpha = jnp.concatenate(alphas) if len(alphas) > 1 else alphas[0]
  if max(counts) == 1:
    log_a_minus_1 = jnp.log(total) + top
  else:
    # Each order's chunks (n, m, most chunks; padded with a chunk of nothing), summed in
    # linear space relative to the largest of their tops: no logarithm of a partial sum is
    # rounded (in float32 that would cost ~|log A| ulps).
    # (Each bucket's chunks reshaped into its orders' rows and padded with empty chunks,
    # then joined: one kernel, where a gather with constant indices took two, and with
    # many pairs a transposed copy of each.)
    widest = max(counts)

    def by_order(v, fill):   # (n, chunks) -> (n, m, widest): each bucket's orders as rows
      rows, start = [], 0
      for log_binom in log_binoms:
        m_b, width = log_binom.shape
        p_b = -(-width // _SUM_CHUNK)
        block = v[:, start:start + m_b * p_b].reshape(v.shape[0], m_b, p_b)
        rows.append(jnp.pad(block, ((0, 0), (0, 0), (0, widest - p_b)), constant_values=fill))
        start += m_b * p_b
      return jnp.concatenate(rows, axis=1) if len(rows) > 1 else rows[0]
    chunk_top = by_order(_where(has_terms, top, -jnp.inf), -jnp.inf)
    chunk_total = by_order(total, 0.0)
    top = jnp.max(chunk_top, axis=-1)   # finite: every order has terms
    weighted = chunk_total * jnp.exp(chunk_top - top[..., None])
    log_a_minus_1 = jnp.log(jnp.sum(weighted, axis=-1)) + top
  return log_a_minus_1 - jnp.log(alpha - 1)


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


def _integer_orders(pair, alphas, tables):
  """log J (n, m) at the integer orders of every bucket of the split for flat generic q,
  sigma given by their :func:`_pair_constants` ``pair`` (``alphas``: one array per
  bucket, ``tables``: their log-binomial tables (m_b, k_max + 1) from :func:`order_tables`),
  concatenated. The per-pair terms are computed once, up to the largest bucket."""
  tables = [t.astype(pair[0].dtype) for t in tables]
  k_max = max(t.shape[1] for t in tables) - 1

  def block(pairs):
    per_pair, log1m_q = _per_pair_terms(pairs, k_max)
    return _log_j_integer(per_pair, log1m_q, alphas, tables)

  terms = sum(t.shape[0] * t.shape[1] for t in tables)
  return _in_row_blocks(block, max(1, _SUM_ELEMENTS // terms), *pair)
