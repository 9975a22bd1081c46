r"""log J of the fractional orders of a split on shared nodes, values and derivatives.

Each (pair, group of orders) is one row (:func:`_shared_values`): values on the nested grids
of :func:`shared_levels._log_j_levels`, values with tangents on one grid
(:func:`shared_nodes._log_j_shared`: 129 nodes, and 2049 where those leave a value open,
:func:`_on_finer_grid_where_open`), or on the nested grids with the derivative in the same
pass (many pairs at one order). :func:`rdp_tangent_at_order` is the RDP and its tangent
at one order, the derivative that the envelope theorem needs at the optimal order of a
conversion.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import loops
from jaxrdp.mechanisms.sampled_gaussian.common import _in_row_blocks, _where
from jaxrdp.mechanisms.sampled_gaussian.shared_levels import _level_block_rows, _log_j_levels
from jaxrdp.mechanisms.sampled_gaussian.shared_nodes import (_SHARED_INTERVALS, _log_j_shared,
                                                             _order_block)
from jaxrdp.mechanisms.sampled_gaussian.terms import _generic, _terms

_SHARED_ELEMENTS = 1 << 16   # (row, order, node) elements per block of the tangents' rows:
                             # their intermediates stay in the caches (2x faster at 10^4 rows)


_TANGENT_INTERVALS = (_SHARED_INTERVALS, 16 * _SHARED_INTERVALS)   # grids of _shared_tangents


_FINE_ONLY = 1024   # (pair, order) elements up to which tangents take the 2049 nodes at once
# Pairs up to which rdp_tangent_at_order takes the 2049 nodes at once. Its callers with more
# pairs (the envelope gradient of a schedule of more than 64 phases) have the nested grids'
# loop in their graph anyway: there the loop with tangents compiled into fewer kernels than
# the fine grid (jax.jit(jax.value_and_grad) of ε, 300 phases: 216 -> 188) and ran 3-5x faster
# (300 phases 122 -> 41 ms, 1,000 phases 392 -> 80 ms warm: 2049 nodes per pair).
_FINE_PAIRS = 64


def _on_finer_grid_where_open(run, open_of, elements):
  """``run(intervals)`` -> (log J, tangent) on 129 nodes, and where ``open_of(log J)`` says a
  value is left open, again on 2049 (a ``lax.cond``: run only then). Up to _FINE_ONLY
  ``elements`` on 2049 nodes at once: one copy of the kernel in the graph (the compile time
  of a second is worth far more than the run time of 16x the nodes on so few)."""
  if elements <= _FINE_ONLY:
    return run(_TANGENT_INTERVALS[1])
  first = run(_TANGENT_INTERVALS[0])
  return lax.cond(jnp.any(open_of(first[0])), lambda _: run(_TANGENT_INTERVALS[1]),
                  lambda _: first, None)


def _shared_tangents(q, sigma, alphas, groups, tangents):
  """(log J, its tangent) (n, m) of the orders of ``groups`` on shared nodes with tangents
  (:func:`_shared_values`), on the grids of :func:`_on_finer_grid_where_open`; +inf (tangent
  0) where even 2049 nodes cannot certify a value, and at every order outside ``groups``."""
  grouped = np.zeros(alphas.shape[-1], bool)
  for g in groups:
    grouped[list(g)] = True
  if tangents[2] is None:   # the orders held fixed: the nested grids, the derivative with them
    return _partials_times_tangents(q, sigma, alphas, groups, tangents[:2])
  run = lambda intervals: _shared_values(q, sigma, alphas, groups, tangents, intervals)
  if not groups:
    return run(_SHARED_INTERVALS)
  return _on_finer_grid_where_open(run, lambda log_j: ~jnp.isfinite(log_j[:, grouped]),
                                   q.shape[0] * int(grouped.sum()))


def _partials_times_tangents(q, sigma, alphas, groups, tangents):
  """(log J, its tangent) as :func:`_shared_values` on the nested grids, the tangent along
  ``tangents`` (dq, dsigma; None: zero) formed outside the loop from the partial derivatives
  the loop takes along constant directions (one copy of the rows per direction given): the
  result is linear in the tangents and the values do not depend on them, so that reverse mode
  can transpose it and a ``jax.vmap`` over tangents (``jax.jacfwd``) leaves the loop
  unbatched."""
  n = q.shape[0]
  given = [(i, d) for i, d in enumerate(tangents) if d is not None]
  if not given:
    log_j = _shared_values(q, sigma, alphas, groups)
    return log_j, jnp.zeros_like(log_j)
  k = len(given)
  stack = lambda v: jnp.concatenate([v] * k) if k > 1 else v
  unit = lambda i: jnp.concatenate([jnp.full((n,), float(i == j), q.dtype) for j, _ in given])
  per_pair = alphas if alphas.ndim == 1 else stack(alphas)
  # The partials depend on the primal values alone (loops.of_primals: not partially evaluated
  # again under jax.grad; no second derivative, NaN).
  # The directions not given are not differentiated at all (None), in the loop either.
  directions = lambda: tuple(unit(i) if any(i == j for j, _ in given) else None for i in (0, 1))
  log_j, partials = loops.of_primals(
      lambda q_, s_, a_: _shared_values(q_, s_, a_, groups, directions() + (None,)))(
          stack(q), stack(sigma), per_pair)
  partials = partials.reshape((k, n) + partials.shape[1:])
  return log_j[:n], sum(p * d[:, None] for p, (_, d) in zip(partials, given))


def rdp_tangent_at_order(q, sigma, alpha, dq, dsigma):
  r"""(RDP, its tangent along (``dq``, ``dsigma``), certified) of flat q, sigma (n,) at one
  order ``alpha`` (a scalar, traced or not), without argument checks: the derivative that the
  envelope theorem needs at the optimal order of a conversion (Mironov, Talwar, Zhang 2019,
  Sec. 3; the tangent is the quadrature of the integrand's derivative, as in
  :func:`_log_j_shared`): up to _FINE_PAIRS pairs on 2049 nodes, more on the nested grids of
  :func:`_log_j_levels` (129 to 4097 nodes, the derivative in the same pass); ``certified``
  is false where those could not certify the value (then +inf, tangent 0: a caller reports
  NaN).
  Integer and fractional orders alike, so that the graph holds one small kernel whatever the
  order turns out to be (the per-order kernel's derivative is ~5x its compile time).
  ``dq`` or ``dsigma`` None: that direction is zero and not differentiated."""
  alpha = jnp.broadcast_to(jnp.asarray(alpha, q.dtype), q.shape)
  generic, q_g, s_g, a_g = _generic(q, sigma, alpha)
  zero = jnp.zeros_like(q)
  # A direction given as None is zero: not differentiated (nor the order, held fixed).
  tangents = tuple(None if d is None else _where(generic, d, zero) for d in (dq, dsigma)) + (None,)

  # One row per pair, with its own order. Up to _FINE_PAIRS pairs on 2049 nodes at once (one
  # small kernel, no loop: compiles fastest); more on the nested grids, refined only where
  # needed, with the derivative in the same pass (one loop, however many pairs; 129 nodes
  # and 2049 where those leave a value open took two copies of the kernel and all pairs on
  # 2049 if any one needed them).
  moving = [i for i, d in enumerate(tangents[:2]) if d is not None]
  if q.shape[0] <= _FINE_PAIRS:
    log_j, d_log_j = _log_j_shared(q_g, s_g, a_g[:, None], tangents, _TANGENT_INTERVALS[1])
    return _rdp_with_tangent(q, sigma, alpha, log_j[:, 0], d_log_j[:, 0], dq, dsigma, generic)

  def block(xs):
    d = [None, None]
    for i, v in zip(moving, xs[3:]):
      d[i] = v
    if not moving:
      log_j = _log_j_levels(xs[0], xs[1], xs[2])
      return log_j, jnp.zeros_like(log_j)
    return _log_j_levels(xs[0], xs[1], xs[2], tuple(d))
  log_j, d_log_j = _in_row_blocks(block, _level_block_rows(1), q_g, s_g, _order_block(a_g[:, None]),
                                  *(tangents[i] for i in moving))
  return _rdp_with_tangent(q, sigma, alpha, log_j[:, 0], d_log_j[:, 0], dq, dsigma, generic)


def _rdp_with_tangent(q, sigma, alpha, log_j, d_log_j, dq, dsigma, generic):
  """:func:`rdp_tangent_at_order`'s result from log J and its tangent: the special cases
  around the kernel, differentiated along the directions given only."""
  primals, dots = (q, sigma, log_j), (dq, dsigma, d_log_j)
  moving = [i for i, d in enumerate(dots) if d is not None]

  def rdp_of(*args):
    full = list(primals)
    for i, v in zip(moving, args):
      full[i] = v
    return _terms(full[0], full[1], alpha, full[2])[1]
  rdp, d_rdp = jax.jvp(rdp_of, tuple(primals[i] for i in moving), tuple(dots[i] for i in moving))
  return rdp, d_rdp, ~generic | jnp.isfinite(log_j)


def _shared_values(q, sigma, alphas, groups, tangents=None, intervals=_SHARED_INTERVALS):
  """log J (n, m) of the orders of ``groups`` (static tuples of positions into ``alphas``: (m,),
  or (n, m) for each pair's own orders) on shared nodes (:func:`_log_j_levels`), +inf at every
  other order; with ``tangents`` (of q, sigma (n,), alphas) values and tangents: on the same
  nested grids where the orders' tangent is None (held fixed), else on one grid of
  ``intervals`` + 1 nodes (:func:`_log_j_shared`); tangents 0 where not certified."""
  n, m = q.shape[0], alphas.shape[-1]
  log_j = jnp.full((n, m), jnp.inf, q.dtype)
  if not groups:
    return log_j if tangents is None else (log_j, jnp.zeros_like(log_j))
  # One row per (pair, group), every group padded to the longest with its last order.
  width = max(len(g) for g in groups)
  index = np.array([g + (g[-1],) * (width - len(g)) for g in groups])
  n_groups = len(groups)
  # The orders, shared by every pair (m,) or each pair's own (n, m), as rows (pair, group),
  # through ``per_group`` (of the orders (..., groups, width)).
  def as_rows(q_, s_, a_, per_group=lambda v: v):
    grouped = per_group(a_[..., index])
    rows = (jnp.tile(grouped, (n, 1)) if a_.ndim == 1
            else grouped.reshape((n * n_groups,) + grouped.shape[2:]))
    return jnp.repeat(q_, n_groups), jnp.repeat(s_, n_groups), rows
  if tangents is None or tangents[2] is None:   # the nested grids (with (dq, dsigma))
    blocks = -(-(n * n_groups) // _level_block_rows(width))   # equal blocks: little padding
    rows = as_rows(q, sigma, lax.stop_gradient(alphas), _order_block)
    if tangents is None:
      kernel, extra = (lambda xs: _log_j_levels(*xs)), ()
    else:
      moving = [i for i in (0, 1) if tangents[i] is not None]   # None: not differentiated

      def kernel(xs):
        d = [None, None]
        for i, v in zip(moving, xs[3:]):
          d[i] = v
        return _log_j_levels(*xs[:3], tuple(d))
      extra = tuple(jnp.repeat(tangents[i], n_groups) for i in moving)
    shared = _in_row_blocks(kernel, -(-(n * n_groups) // blocks), *rows, *extra)
    shared = shared if isinstance(shared, tuple) else (shared,)
  else:
    rows = max(1, _SHARED_ELEMENTS // (width * (intervals + 1)))
    shared = _in_row_blocks(lambda xs: _log_j_shared(*xs[:3], xs[3:], intervals), rows,
                            *as_rows(q, sigma, alphas),
                            *as_rows(tangents[0], tangents[1], tangents[2]))
  # Each order's column among the rows' (pair, group, slot) values, or the fill column after
  # them: one gather with static indices (a scatter is a sequential loop on CPUs).
  source = np.full(m, n_groups * width)
  for k, g in enumerate(groups):
    source[np.asarray(g)] = k * width + np.arange(len(g))
  place = lambda v, fill: jnp.concatenate(
      [v.reshape(n, n_groups * width), jnp.full((n, 1), fill, q.dtype)], axis=1)[:, source]
  log_j = place(shared[0], jnp.inf)
  return log_j if tangents is None else (log_j, place(shared[1], 0.0))
