r"""log J on shared nodes, values only: nested grids refined where needed, in one loop.

Every second node of the 129-node grid first; a row with an order that cannot be certified
yet gets the midpoints, level by level (129, 257, ..., 4097 nodes), only where needed; all of
it in one ``lax.while_loop`` with the integrand traced once (:func:`_log_j_levels`), each
order certified as in the per-order kernel.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import loops
from jaxrdp.mechanisms.sampled_gaussian.common import (_LOG_HALF, _exp_floor, _first_pending,
                                                       _select_columns, _where)
from jaxrdp.mechanisms.sampled_gaussian.quadrature import _assess
from jaxrdp.mechanisms.sampled_gaussian.shared_nodes import (_SHARED_INTERVALS, _grid_nodes,
                                                             _grid_terms, _reference_power,
                                                             _shared_span)

_SHARED_LEVELS = 6   # levels after the first: 129, 257, ..., 4097 nodes
_LEVEL_NODES = _SHARED_INTERVALS // 2 + 1   # nodes per row and step of _log_j_levels
_LEVEL_ROWS = 512           # rows per step of _log_j_levels at most
_LEVEL_SHARE = 4            # and a quarter of the rows (the refinement levels, which few rows
_LEVEL_COMPACT_FROM = 64   # need, cost a quarter of level 0) from this many rows on
_LEVEL_BLOCK_ELEMENTS = 1 << 22   # entries of one call's row state at most (bounds memory;
                                  # the loop's work arrays are _LEVEL_ROWS rows whatever r is)


def _level_block_rows(g):
  """Rows per call of :func:`_log_j_levels` with g orders per row: as many as keep its packed
  row state (about 14 g + 24 columns with tangents) within _LEVEL_BLOCK_ELEMENTS, so that up
  to ~10^4 rows of 32 orders (~10^5 of one) need no loop of calls around the kernel."""
  return max(_LEVEL_ROWS, _LEVEL_BLOCK_ELEMENTS // (14 * g + 24))


@functools.lru_cache(maxsize=None)
def _level_weights():
  """(65, 6) float64: the columns of the sums one step of :func:`_log_j_levels` takes over its
  65 nodes. Level 0 (the nodes lo + 2 h j, j = 0..64): the trapezoid rules on every node,
  every second and every fourth node (end weights 1/2); a refinement block (midpoints, the
  65th node is a dummy): the plain sum of the first 64; the first and the last value (the
  window's edges at level 0)."""
  j = np.arange(_LEVEL_NODES)
  ends = (j == 0) | (j == _LEVEL_NODES - 1)
  trapezoid = np.where(ends, 0.5, 1.0)
  columns = [trapezoid, trapezoid * (j % 2 == 0), trapezoid * (j % 4 == 0),
             (j < _LEVEL_NODES - 1).astype(float), (j == 0).astype(float),
             (j == _LEVEL_NODES - 1).astype(float)]
  table = np.stack(columns, axis=-1)
  table.flags.writeable = False
  return table


def _stein_sigma(nodes, inv_2s2, alpha, m_ref, ref, log_q, d_log_s):
  r"""d sigma times the integrand of d J / d sigma at shared nodes, relative to the value
  integrand's reference (the constant :math:`e^{m_{ref}(m_{ref}-1)/(2\sigma^2)}`, the peak
  ``ref``, :math:`\varphi`'s normalisation and the step, which the sums of J share): summed with
  the same rule, their ratio to J's sum is d log J.

  With :math:`\mu = 1/\sigma`, :math:`A_\alpha = E_w[f(\mu w - \mu^2/2)]` for
  :math:`w \sim N(0, 1)` and :math:`f(u) = (1 - q + q e^u)^\alpha`; Stein's identity
  :math:`E[w\,h(w)] = E[h'(w)]` gives :math:`\partial A/\partial\mu = \mu E[f'' - f'] =
  \mu\,\alpha(\alpha-1)\,q^2 E[L^2 (1+x)^{\alpha-2}]` (L = e^u, 1 + x = 1 - q + qL), so that
  :math:`\partial J/\partial\sigma = -\alpha q^2 K/\sigma^3` with
  :math:`K = E_{z \sim N(0,\sigma^2)}[L^2 (1+x)^{\alpha-2}]` (J = (A - 1)/(alpha - 1)): a positive
  integrand, no cancellation, on the value's nodes. Its exponent
  :math:`2\log q - z^2/(2\sigma^2) + 2u + (\alpha-2)\ell` (:math:`\ell = \log(1+x)`) in the
  form with the local power 2 or alpha (:func:`_integrand`'s identity) whose terms are smaller,
  as the value's: what keeps float32 exact."""
  z = nodes["z"]
  # At the node z = 1/2 (u = 0, x = 0, marked by log|x| = -inf) _grid_nodes computes the other
  # fields at a placeholder u; there l = l - u = 0 (the value's integrand is 0 there, this not).
  at_zero = nodes["log_q1m"] == -jnp.inf
  ell, ell_minus_u = (_where(at_zero, 0.0, nodes[k]) for k in ("ell", "ell_minus_u"))
  relative = lambda m: (m - m_ref) * (m + m_ref - 1) * inv_2s2
  two = relative(2.0) - (z - 2) ** 2 * inv_2s2 + (alpha - 2) * ell
  at_alpha = relative(alpha) - (z - alpha) ** 2 * inv_2s2 + (alpha - 2) * ell_minus_u
  size_two = jnp.maximum(jnp.maximum(4.0, (z - 2) ** 2) * inv_2s2, jnp.abs((alpha - 2) * ell))
  size_alpha = jnp.maximum(jnp.maximum(alpha * alpha, (z - alpha) ** 2) * inv_2s2,
                           jnp.abs((alpha - 2) * ell_minus_u))
  e = 2 * log_q + _where(size_alpha < size_two, at_alpha, two)
  return (-2 * alpha * inv_2s2 * d_log_s) * jnp.exp(jnp.maximum(e - ref, _exp_floor(z.dtype)))


def _log_j_levels(q, sigma, orders, tangents=None):
  r"""log J (r, g) on rows: flat generic q, sigma (r,), each row with its own ascending orders
  and their constants ``orders`` (r, 5 g) (:func:`_order_block`), on nested grids of its span
  (:func:`_shared_span`); +inf where a value cannot be certified. With ``tangents`` = (dq,
  dsigma) (each (r,) or None: that direction not differentiated), also log J's derivative
  along them (r, g) (0 where not certified): the same rules applied, on the same nodes and
  level, in the same pass, to the integrand of the derivative (window, reference power and its
  scale held fixed, as they only decide where and relative to what to sum): along q the
  integrand's derivative (``jax.jvp``), along sigma the integrand that Stein's identity gives
  (:func:`_stein_sigma`), a function of the nodes' values that needs no derivative of them
  (their derivatives along sigma, traced, took ~10 more kernels: ~0.3 s of a first
  ``jax.grad``'s compilation). Both agree to 2e-14 (float64) over q in [1e-8, 0.99], sigma in
  [0.3, 50] and the default orders.

  Level 0 is every second node of the 129-node grid (65 nodes, step 2h); its trapezoid rule
  and those on every second and fourth of its nodes (33, 17) certify most rows (:func:`_assess`,
  as in the per-order kernel). A row with an order that level 0 cannot certify is refined
  level by level (129, 257, ..., 4097 nodes: T(h/2) = T(h)/2 + (h/2) * the sum of the new
  midpoints, relative to the same reference), until all its orders are certified or level
  _SHARED_LEVELS is done; the rules of the last three levels decide. The bumps move right with
  the order, and the certificate checks every order's own decay at the window's edges.

  One ``lax.while_loop`` does all of it, so the integrand is in the graph once (compile time):
  each step takes a compacted batch of the rows still pending (from _LEVEL_COMPACT_FROM rows
  on: a quarter of the rows, at most _LEVEL_ROWS; fewer rows all take every step) and
  evaluates 65 nodes per row — the whole of level 0, or one block of 64 midpoints of a refinement level —
  with the order-independent part of the integrand (all its logarithms) once per node
  (:func:`_grid_nodes`) and two exponentials and one expm1 per (node, order)
  (:func:`_grid_terms`), summed in linear space relative to the peak located at level 0
  (:func:`_reference_power`, on every fourth node of the 129-node grid but the last). The
  sums over the nodes are one contraction with :func:`_level_weights`."""
  r, g = orders.shape[0], orders.shape[1] // 5
  dtype = q.dtype
  sg = lax.stop_gradient
  q, sigma, orders = sg(q), sg(sigma), sg(orders)
  moving_q, moving_s = (tangents is not None and d is not None for d in (tangents or (None,) * 2))
  with_tangent = moving_q or moving_s
  alphas = orders[:, :g]
  lo, h = _shared_span(q, sigma, alphas)
  cap = r if r < _LEVEL_COMPACT_FROM else min(_LEVEL_ROWS, -(-r // _LEVEL_SHARE))
  weights = jnp.asarray(_level_weights(), dtype)
  j = np.arange(_LEVEL_NODES).astype(dtype)   # constants (an iota would be a kernel)
  ex = lambda v: v[:, None, None]
  log_half_2pi = 0.5 * math.log(2 * math.pi)
  # One packed matrix (one gather per step, one scatter). Fixed per row: q sigma lo log q
  # log(1-q) log sigma 1/(2 sigma^2) | alphas and their constants (_order_constants). State per
  # row: level being built, its block, the blocks of the level, its step and log step, and the
  # rates of _assess at that step (exp(-pi^2 sigma^2/h), exp(-1.5 pi^2 sigma^2/h^2), whose max
  # is rho_h, and rho_2h; halving h squares the first, raises the second to the 4th power) |
  # per order: the midpoint sum so far, the sum and the rule of the last complete level, the
  # rule of the one before (all relative to ref), m_ref, ref, the edge value, log J, failed |
  # whether the row is pending. Everything the body needs per row is a column: no division, logarithm or exponential of a
  # row's scalars in the loop (each would be a kernel of its own, evaluated before the
  # broadcast over nodes and orders).
  # With tangents, more fixed columns: the derivatives of log q, log(1-q) and q (moving q), of
  # log sigma (moving sigma) along the row's direction; and three more per-order blocks of
  # state: the derivatives of the midpoint sum, of the last complete level's sum and of log J.
  n_fixed, n_counters = 7 + 3 * moving_q + moving_s, 8
  n_blocks = 12 if with_tangent else 9
  width = n_fixed + 5 * g   # the fixed columns; then the state, then whether the row is pending
  # The matrix is one kernel: per-row columns computed by _select_columns, placed by padding
  # with zeros and adding (exact), with the orders' columns and a constant row.
  wide = lambda v, k: jnp.broadcast_to(v[:, None], (r, k))
  q_, s_ = wide(q, 7), wide(sigma, 7)
  x = _select_columns([q_, s_, wide(lo, 7), q_, -q_, s_, s_])
  fixed = _select_columns([x, x, x, jnp.log(x), jnp.log1p(x), jnp.log(x), 0.5 / (x * x)])
  if with_tangent:
    dq = sg(tangents[0]) if moving_q else None
    columns = [dq / q, -dq / (1 - q), dq] if moving_q else []
    columns += [sg(tangents[1]) / sigma] if moving_s else []
    fixed = jnp.concatenate([fixed, jnp.stack(columns, axis=-1)], axis=-1)
  # The constant row: zero fixed columns; level 0, block 0, blocks 0.5, then the row's step
  # (level 0: every second node of the 129-node grid), log step and rates in columns 3 to 7;
  # per order: zeros, log J +inf, failed 1; pending 1.
  template = np.concatenate([np.zeros(width), [0.0, 0.0, 0.5], np.zeros(5), np.zeros(4 * g),
                             np.zeros(3 * g), np.full(g, np.inf), np.ones(g),
                             np.zeros((n_blocks - 9) * g), [1.0]]).astype(dtype)
  # Step, log step, then the exponents of the rates at the step, (a, b) = (-pi^2 sigma^2/h,
  # -1.5 pi^2 sigma^2/h^2), and at twice the step, (a/2, b/4).
  step0, s2 = wide(2 * h, 6), wide(sigma * sigma, 6)
  a, b = -math.pi ** 2 * s2, -1.5 * math.pi ** 2 * s2
  x = (_select_columns([step0, step0, a, b, a, b])
       / _select_columns([jnp.ones_like(step0), jnp.ones_like(step0), step0, step0 * step0,
                          2 * step0, 4 * step0 * step0]))
  x = _select_columns([x, jnp.log(x), jnp.exp(x), jnp.exp(x), jnp.exp(x), jnp.exp(x)])
  rho_coarse = jnp.maximum(x[:, :5], x[:, 1:])   # column 4: max(e^(a/2), e^(b/4))
  per_row = _where(np.arange(5) == 4, rho_coarse, x[:, :5])
  pad = lambda v, start: jnp.pad(v, ((0, 0), (start, template.size - start - v.shape[1])))
  packed = pad(fixed, 0) + pad(orders, n_fixed) + pad(per_row, width + 3) + template
  cell = lambda m, k: m[:, n_counters + k * g:n_counters + (k + 1) * g]   # k-th per-order block

  compact = r > cap   # otherwise every row is in every step (no gather, no scatter)

  def body(carry):
    packed, left = carry
    pending = packed[:, -1] > 0
    if compact:
      order = _first_pending(pending, cap)   # the first cap pending rows; r after them
      valid = order < r
      rows = packed[jnp.minimum(order, r - 1)]
      idx = order   # r where not valid: the write back drops it
    else:   # the barrier keeps XLA from hoisting each per-order constant out of the loop
      rows = lax.optimization_barrier(packed)   # as a kernel of its own
    fx, st = rows[:, :width], rows[:, width:]
    q_, s_, lo_, log_q_, log1m_q_, log_s_, inv_2s2 = (fx[:, i] for i in range(7))
    d_row = [fx[:, i] for i in range(7, n_fixed)]   # with tangents: the derivatives' columns
    alphas_, *constants = (fx[:, n_fixed + k * g:n_fixed + (k + 1) * g] for k in range(5))
    log_beta = constants[-1]
    constants = [v[..., None] for v in constants]
    level, blk, blocks, step, log_step, rate_a, rate_b, rho_coarse = (
        st[:, i] for i in range(n_counters))
    partial, total, log_t, older, m_ref_, ref_, edge, log_j, still_failed, *d_state = (
        cell(st, k) for k in range(n_blocks))
    first = level == 0
    # Level 0: lo + step j; level >= 1 (step halved), block b: the midpoints
    # lo + step (128 b + 1 + 2 j).
    offset = _where(first, 0.0, step * (2 * (_LEVEL_NODES - 1) * blk + 1))
    z = ex(lo_) + ex(offset) + ex(_where(first, step, 2 * step)) * j
    row_values = (inv_2s2, log_q_, log1m_q_, q_)
    nodes_of = lambda i2, lq, l1q, qq: _grid_nodes(z, ex(i2), ex(lq), ex(l1q), ex(qq))
    if moving_q:   # along q: d log q, d log(1-q), dq (sigma's derivative: _stein_sigma)
      nodes, d_nodes = jax.jvp(lambda *v: nodes_of(inv_2s2, *v), row_values[1:],
                               tuple(d_row[:3]))
    else:
      nodes = nodes_of(*row_values)
    alpha = alphas_[..., None]
    # The peak on every second node but the last (32: a reduction over more than 32 entries
    # is two kernels on XLA:CPU). The last is the window's right edge: a peak there fails the
    # certificate's edge test whatever the scale the peak sets.
    e_abs, _ = _grid_terms({k: v[..., :-1:2] for k, v in nodes.items()}, ex(inv_2s2), alpha,
                           jnp.zeros_like(alpha), exponent_only=True, constants=constants)
    m_new, ref_new = _reference_power(e_abs, ex(inv_2s2), alpha)
    m_ref_ = _where(first[:, None], m_new[..., 0], m_ref_)
    ref_ = _where(first[:, None], ref_new[..., 0], ref_)

    def values_of(nodes_, i2):
      e, mult = _grid_terms(nodes_, ex(i2), alpha, m_ref_[..., None], constants=constants)
      return jnp.exp(jnp.maximum(e - ref_[..., None], _exp_floor(dtype))) * mult
    if moving_q:
      values, d_values = jax.jvp(lambda n: values_of(n, inv_2s2), (nodes,), (d_nodes,))
    else:
      values = values_of(nodes, inv_2s2)
      d_values = jnp.zeros_like(values) if with_tangent else None
    if moving_s:   # d/dsigma of the integrand, as the integrand of _stein_sigma, times d sigma
      d_values = d_values + _stein_sigma(nodes, ex(inv_2s2), alpha, m_ref_[..., None],
                                         ref_[..., None], ex(log_q_), ex(d_row[-1]))
    # The 65th node of a refinement block is a dummy: zero, so that it cannot reach the sums
    # even as inf or NaN (a weight of 0 would not stop those).
    real = first[:, None, None] | (j < _LEVEL_NODES - 1)
    values = _where(real, values, 0.0)
    sums = jnp.einsum("rgk,kc->rgc", values, weights, precision=lax.Precision.HIGHEST)
    shift = m_ref_ * (m_ref_ - 1) * inv_2s2[:, None]
    base = (ref_ - log_half_2pi - log_s_[:, None]) + log_step[:, None]   # log T = log(sum) + base
    partial = _where(first[:, None], 0.0, partial + sums[..., 3])
    complete = first | (blk == blocks - 1)
    new_total = _where(first[:, None], sums[..., 0], total + partial)
    if with_tangent:   # the same sums of the derivatives (the rule and the midpoints)
      d_sums = jnp.einsum("rgk,kc->rgc", _where(real, d_values, 0.0), weights[:, ::3],
                          precision=lax.Precision.HIGHEST)
      d_partial, d_total, d_log_j = d_state
      d_partial = _where(first[:, None], 0.0, d_partial + d_sums[..., 1])
      d_new_total = _where(first[:, None], d_sums[..., 0], d_total + d_partial)
    # One logarithm of the four sums: the level's rule, at level 0 also the rules on every
    # second and fourth node and the larger edge value.
    # (Selected, not stacked: a stack is a loop per piece, each with its own logarithm.)
    log_sums = jnp.log(_select_columns(
        [jnp.broadcast_to(v[..., None], (cap, g, 4))
         for v in (new_total, sums[..., 1], sums[..., 2], jnp.maximum(sums[..., 4], sums[..., 5]))]
    )) + base[..., None]
    new_log_t = log_sums[..., 0]
    coarse = _where(first[:, None], log_sums[..., 1] + math.log(2), log_t)
    coarser = _where(first[:, None], log_sums[..., 2] + math.log(4), older)
    edge = _where(first[:, None], log_sums[..., 3], edge)
    rho = jnp.maximum(rate_a, rate_b)[:, None]
    still = _assess(new_log_t, coarse, coarser, edge, shift, rho, rho * rho_coarse[:, None],
                    alphas_, log_beta)
    was_failed = still_failed > 0
    newly = complete[:, None] & was_failed & ~still
    failed_now = was_failed & ~newly
    done = complete & (~jnp.any(failed_now, axis=-1) | (level == _SHARED_LEVELS))
    c = complete[:, None]
    # A completed level starts the next: twice the blocks, half the step.
    # The row's counters as one select (one kernel, not one per column): complete ->
    # (level + 1, 0, 2 blocks, step/2, log step - log 2, rate_a^2, rate_b^4, rho_h), else
    # (level, block + 1, blocks, step, log step, the same rates). All exact but the rates
    # (a few ulps per level: they only scale the error estimate).
    current = st[:, :n_counters]
    row = lambda *v: np.array(v, dtype)
    squared = current * current
    scaled = (current * row(1.0, 0.0, 2.0, 0.5, 1.0, 1.0, 1.0, 1.0)
              + row(1.0, 0.0, 0.0, 0.0, _LOG_HALF, 0.0, 0.0, 0.0))
    counters = _where(complete[:, None],
                      _select_columns([scaled] * 5 + [squared, squared * squared,
                                                      jnp.broadcast_to(rho, current.shape)]),
                      current + row(0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))
    # The per-order blocks as two selects over the block index (a stack is a loop per piece,
    # each with its own copy of the code the pieces share), the two that depend on the
    # certificate apart: a select computes every one of its candidates for every entry.
    select = lambda fields: _select_columns(
        [jnp.broadcast_to(f[:, None, :], (cap, len(fields), g)) for f in fields],
        axis=1).reshape(cap, len(fields) * g)
    plain = select([_where(c, 0.0, partial), _where(c, new_total, total),
                    _where(c, new_log_t, log_t), _where(c, coarse, older), m_ref_, ref_, edge])
    judged = select([_where(newly, new_log_t + shift, log_j), failed_now.astype(dtype)])
    parts = [counters, plain, judged]
    if with_tangent:   # d log J = d(sum)/sum: both sums relative to the same constant
      d_new = d_new_total / new_total
      parts.append(select([_where(c, 0.0, d_partial), _where(c, d_new_total, d_total),
                           _where(newly, d_new, d_log_j)]))
    parts.append((~done)[:, None].astype(dtype))
    if compact:   # written back by a scatter, which takes the concatenation in its kernel
      out = jnp.concatenate(parts, axis=-1)
    else:   # placed by padding with zeros and adding (exact), as ``packed`` is: fused into
      # the write below, where a concatenation is a kernel of its own
      starts = np.cumsum([0] + [p.shape[1] for p in parts])
      out = sum(jnp.pad(p, ((0, 0), (int(a), int(starts[-1] - a) - p.shape[1])))
                for p, a in zip(parts, starts))
    # The rows left pending, counted down here (read from the output, so that the test is not
    # compiled twice): the loop's condition is then one comparison, not a reduction over all
    # rows (kernels of their own).
    finished = out[:, -1] == 0
    if not compact:   # rows done before this step keep their state
      left = left - jnp.sum(pending & finished, dtype=np.int32)
      return lax.dynamic_update_slice(packed, _where(pending[:, None], out, st), (0, width)), left
    left = left - jnp.sum(valid & finished, dtype=np.int32)
    return packed.at[idx, width:].set(out, mode="drop"), left   # out-of-range writes are dropped

  # The count has shape (1,), not (): a condition on a scalar costs compile time
  # (:func:`jaxrdp._internal.loops.while_loop`).
  packed, _ = loops.while_loop(lambda c: c[1][0] > 0, body, (packed, np.full(1, r, np.int32)))
  log_j = cell(packed[:, width:], 7)
  if not with_tangent:
    return log_j
  return log_j, _where(jnp.isfinite(log_j), cell(packed[:, width:], 11), 0.0)
