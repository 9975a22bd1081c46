r"""The per-order kernel: log J = log((A_α − 1)/(α − 1)) by a certified trapezoidal rule.

The expectation of the non-negative integrand (:mod:`jaxrdp.mechanisms.sampled_gaussian.integrand`)
is a trapezoidal sum over :math:`z` in log space on the windows of :func:`integrand._placement`.
For integrands analytic in a strip (here :math:`|\Im z| < \pi\sigma^2`, the branch point of
:math:`\log(1+x)`), the trapezoidal rule converges exponentially in the number of nodes, at a
known rate (:func:`_rates`).

* Every result is certified: the error of the rule is estimated from its differences with
  the rules on every second and every fourth node and the known convergence rate
  (:func:`_assess`: two grid phases, so that a coarse rule that is exact by accident cannot
  vouch for the fine one), and the integrand must have decayed at the window edges. Elements
  that fail get twice the nodes (only the new midpoints are evaluated, only for those
  elements, :func:`_refine`), up to 4097 per window (more than 257 only below sigma ~ 0.035,
  where the strip of analyticity, of half-width pi sigma^2, is narrower than their spacing;
  as many as the finest grid of the shared nodes, whose derivatives take 129 nodes only and
  otherwise this kernel: where the shared nodes certify a value, its derivative must be
  certified too, not left zero); a result that still fails is returned as ``+inf`` (a valid,
  if useless, upper bound), never as a smaller number.
* Derivatives (any of q, sigma, alpha; jvp and vjp) are the same quadrature applied to the
  integrand's derivative, accumulated on the nodes of the primal computation itself, at the
  level each element reached (:func:`_log_j`): no second pass.

How it is organised for compilation and batching: the integrand is traced three times per
graph — once for the placement probes (all at once, an extra axis), once for the first level
(:func:`_first_level`) and once inside the refinement loop, whose body refines any level one
block of midpoints at a time (static shapes). The kernel works on flat arrays
(:func:`_log_j_flat`); under :func:`jax.vmap` a batching rule
(:func:`jax.custom_batching.custom_vmap`, :func:`_flat_kernel`) flattens the batch into the
same flat kernel, so ``vmap(f)(q, sigma)`` runs exactly the code of ``f(q_array, sigma_array)``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxrdp._internal import loops
from jaxrdp.mechanisms.sampled_gaussian.common import (_LOG_HALF, _first_pending, _in_row_blocks,
                                                       _logsumexp,
                                                       _placeholder_primal, _pow2,
                                                       _rule_only_when_batched, _softplus, _where)
from jaxrdp.mechanisms.sampled_gaussian.integrand import _integrand, _placement, _relative_to

_BLOCK = 32               # intervals per window at level 0; midpoints per refinement block
_LEVELS = 8               # levels 0..7: 33, 65, ..., 4097 nodes per window, as many as the
                          # shared grid's finest (small sigma; see the module docstring)
_REFINE_BATCH = 512       # elements refined at a time (compacted)
_ERROR_TOL_ULPS = 32      # accepted estimated relative error of log A, in units of eps
_CHUNK = 4096             # elements per lax.map step at level 0 (bounds memory)
_BATCH = 65536            # elements per pass of the whole pipeline (bounds memory)


def _sum_with_mean(v, dv, axis):
  """(log sum exp of v, the exp(v)-weighted mean of dv) over ``axis`` (dv has one more,
  trailing axis: the three parameters). dv is None when no derivative is carried."""
  log_sum = _logsumexp(v, axis=axis)
  if dv is None:
    return log_sum, None
  weight = jnp.exp(v - jnp.expand_dims(_where(jnp.isfinite(log_sum), log_sum, 0.0), axis))
  weight = _where(jnp.isfinite(v), weight, 0.0)
  dv = _where(jnp.isfinite(v)[..., None], dv, 0.0)
  return log_sum, jnp.sum(weight[..., None] * dv, axis=axis - 1 if axis < 0 else axis)


def _add_with_mean(l1, d1, l2, d2):
  """log(e^l1 + e^l2) and the weighted mean of the two derivatives (None stays None)."""
  total = jnp.logaddexp(l1, l2)
  if d1 is None:
    return total, None
  safe = _where(jnp.isfinite(total), total, 0.0)
  w1 = _where(jnp.isfinite(l1), jnp.exp(l1 - safe), 0.0)[..., None]
  w2 = _where(jnp.isfinite(l2), jnp.exp(l2 - safe), 0.0)[..., None]
  return total, w1 * d1 + w2 * d2


def _rates(h, sigma):
  r"""(:math:`\rho_h`, :math:`\rho_h\rho_{2h}`): the factors by which halving the step h and
  2h shrinks the trapezoidal error (see :func:`_assess`)."""
  s2 = sigma * sigma
  log_rate = lambda step: jnp.maximum(-math.pi ** 2 * s2 / step, -1.5 * math.pi ** 2 * s2 / (step * step))
  log_rho = log_rate(h)
  return jnp.exp(log_rho), jnp.exp(log_rho + log_rate(2 * h))


def _assess(log_t, log_t_coarse, log_t_coarser, edge, shift, rho, rho_pair, alpha, log_beta=None):
  r"""True where the rule's result cannot be certified to _ERROR_TOL_ULPS ulps of log A.

  For an integrand analytic in the strip :math:`|\Im z| < d`, the trapezoidal error behaves
  as :math:`C e^{-2\pi d/h}`: halving h multiplies it by :math:`\rho = e^{-\pi d/h}`.
  Here :math:`d = \pi\sigma^2` (the branch point of :math:`\log(1+x)` at
  :math:`z_0 + i\pi\sigma^2`); the Gaussian factor converges faster
  (:math:`\rho = e^{-1.5\pi^2\sigma^2/h^2}`), so the larger rho is a safe rate.

  The error of a rule oscillates with the phase of the grid against the integrand's bumps
  (:math:`E_h \cos(2\pi c/h)`), so one difference :math:`|T(h) - T(2h)|` can be small by
  accident: the coarse rule happens to be exact while the fine one is not (seen: 3.9e-11
  accepted as 32 ulps). Two differences at consecutive phases cannot both be: with
  :math:`\theta = \pi c/h`, :math:`|T(h)-T(2h)| \approx E_{2h}|\cos\theta|` and
  :math:`|T(2h)-T(4h)| \approx E_{4h}|\cos(\theta/2)|`, and :math:`\max(|\cos\theta|,
  |\cos(\theta/2)|) \ge 1/2`. So the error of T(h) is estimated as
  :math:`\max(\rho_h |T(h)-T(2h)|,\ \rho_h\rho_{2h} |T(2h)-T(4h)|)/(1-\rho_h)`, doubled
  (``rho``, ``rho_pair``: :math:`\rho_h` and :math:`\rho_h\rho_{2h}`, from :func:`_rates`).
  The gap is judged on log A (what is returned): :math:`d\log A/\log A = s\, d\log J` with
  :math:`s = \mathrm{sigmoid}(\ell)/\mathrm{softplus}(\ell) \le 1`, :math:`\ell = \log(\beta J)`.
  The integrand must also have decayed at the window edges.
  """
  sg = lax.stop_gradient
  log_t, log_t_coarse, log_t_coarser = sg(log_t), sg(log_t_coarse), sg(log_t_coarser)
  edge, rho, rho_pair = sg(edge), sg(rho), sg(rho_pair)
  log_j = log_t + sg(shift)  # sums are relative to the reference constant `shift`
  dtype = log_j.dtype
  eps = float(jnp.finfo(dtype).eps)
  alpha = sg(alpha)
  log_beta = _log_beta(alpha) if log_beta is None else sg(log_beta)
  log_beta_j = log_beta + log_j
  tiny_j = log_beta_j < -20
  lbj_safe = _where(tiny_j, 0.0, log_beta_j)
  sensitivity = _where(tiny_j | (alpha <= 1), 1.0, jax.nn.sigmoid(lbj_safe) / _softplus(lbj_safe))
  gap = jnp.abs(log_t - log_t_coarse) * rho
  gap_before = jnp.abs(log_t_coarse - log_t_coarser) * rho_pair
  # error <= tol with error = 2 max(gap, gap_before) sensitivity / (1 - rho), written without
  # the division (a per-row division would be a kernel of its own); rho = 1 fails, and so does
  # NaN (an -inf - -inf gap).
  bound = 2 * jnp.maximum(gap, gap_before) * sensitivity
  certified = (bound <= _ERROR_TOL_ULPS * eps * (1 - rho)) & (rho < 1)
  edge_ok = edge - log_t < math.log(eps) - 4
  return ~certified | ~edge_ok | ~jnp.isfinite(log_j)


def _beta_or_one(alpha):
  """alpha - 1, and 1 where alpha <= 1 (so that its logarithm is finite where it is not used)."""
  return _where(alpha > 1, alpha - 1, 1.0)


def _log_beta(alpha):
  """log(alpha - 1), 0 at alpha <= 1 (where it is not used)."""
  return jnp.log(_beta_or_one(alpha))


def _reference_constant(m_ref, sigma):
  return m_ref * (m_ref - 1) / (2 * sigma * sigma)


def _node_values(place, q, sigma, alpha, fraction, with_grad):
  """The integrand (relative to the reference constant) at the nodes center + half * fraction
  of both windows: shape (n, 2, k) for ``fraction`` of shape (k,) or (n, k); with
  ``with_grad``, also its derivatives in (q, sigma, alpha) at fixed nodes, shape (n, 2, k, 3)."""
  a0, a1, b0, b1, _, m_ref = place
  center = jnp.stack([0.5 * (a0 + a1), 0.5 * (b0 + b1)], axis=-1)[..., None]
  half = jnp.stack([0.5 * (a1 - a0), 0.5 * (b1 - b0)], axis=-1)[..., None]
  fraction = fraction if fraction.ndim == 1 else fraction[:, None, :]
  offset = half * fraction
  ex = lambda v: v[:, None, None]

  def values(q_, s_, a_):
    m, local = _integrand(center, offset, ex(s_), ex(jnp.log(q_)), ex(jnp.log1p(-q_)), ex(q_), ex(a_))
    return _relative_to(m, local, ex(m_ref), ex(s_))

  if not with_grad:
    return values(q, sigma, alpha), None
  basis = jnp.eye(3, dtype=q.dtype)
  one = jnp.ones_like(q)
  tangent = lambda e: jax.jvp(values, (q, sigma, alpha), (e[0] * one, e[1] * one, e[2] * one))
  v, dv = jax.vmap(tangent, out_axes=(None, -1))(basis)
  return v, dv


def _first_level(place, q, sigma, alpha, with_grad):
  """The rule with _BLOCK + 1 nodes per window: per-window log sums (n, 2) and derivative
  means (n, 2, 3) or None, the edge value and whether the result fails certification."""
  a0, a1, b0, b1, merged, m_ref = place
  dtype = q.dtype
  fraction = (2 * jnp.arange(_BLOCK + 1, dtype=dtype) - _BLOCK) / _BLOCK
  v, dv = _node_values(place, q, sigma, alpha, fraction, with_grad)
  log_h = jnp.log(jnp.stack([a1 - a0, b1 - b0], axis=-1) / _BLOCK)
  idx = jnp.arange(_BLOCK + 1)
  end_weight = _where((idx == 0) | (idx == _BLOCK), _LOG_HALF, 0.0).astype(dtype)
  log_t, d_t = _sum_with_mean(v + end_weight, dv, axis=-1)
  log_t = log_t + log_h
  coarse = _logsumexp(v[..., ::2] + end_weight[::2], axis=-1) + log_h + math.log(2)
  coarser = _logsumexp(v[..., ::4] + end_weight[::4], axis=-1) + log_h + math.log(4)
  first, last = v[..., 0] + log_h, v[..., -1] + log_h
  inner = _where(merged, -jnp.inf, jnp.maximum(last[:, 0], first[:, 1]))  # shared midpoint is interior
  edge = jnp.maximum(jnp.maximum(first[:, 0], last[:, 1]), inner)
  total = jnp.logaddexp(log_t[:, 0], log_t[:, 1])
  shift = _reference_constant(m_ref, sigma)
  step = jnp.maximum(a1 - a0, b1 - b0) / _BLOCK
  total_coarse = jnp.logaddexp(coarse[:, 0], coarse[:, 1])
  failed = _assess(total, total_coarse, jnp.logaddexp(coarser[:, 0], coarser[:, 1]), edge, shift,
                   *_rates(step, sigma), alpha)
  return log_t, d_t, edge, failed, total_coarse


def _refine(place, q, sigma, alpha, log_t, d_t, edge, failed, total_coarse, with_grad):
  """Halve the step of the failed elements until certified or at the last level.

  One ``while_loop`` whose body evaluates one block of _BLOCK new midpoints per window for up
  to _REFINE_BATCH pending elements (compacted): level l (1.._LEVELS-1) takes 2^(l-1) blocks,
  then T(h/2) = T(h)/2 + (h/2) sum(midpoints) is assessed against T(h) and T(2h)
  (``total_coarse``: T(2h) of level 0). Static shapes, one
  copy of the integrand; the cost follows what the parameters demand. The per-element state
  is one packed matrix (one gather and one scatter per step: few kernels to compile).
  Returns (log_t, d_t, failed)."""
  size = q.shape[0]
  dtype = q.dtype
  batch = max(1, min(size, _REFINE_BATCH))
  a0, a1, b0, b1, _, m_ref = place
  # Columns: a0 a1 b0 b1 m_ref q sigma alpha edge | level block failed older | log_t(2) acc(2) |
  # d_t(6) d_acc(6); `older` is the total of the level before the current one.
  n_grad = 0 if d_t is None else 6
  fixed = jnp.stack([a0, a1, b0, b1, m_ref, q, sigma, alpha, edge], axis=-1)
  counters = jnp.stack([jnp.ones_like(q), jnp.zeros_like(q), failed.astype(dtype), total_coarse],
                       axis=-1)
  sums = jnp.concatenate([log_t, jnp.full_like(log_t, -jnp.inf)], axis=-1)
  parts = [fixed, counters, sums]
  if d_t is not None:
    parts += [d_t.reshape(size, 6), jnp.zeros((size, 6), dtype)]
  packed = jnp.concatenate(parts, axis=-1)
  within = jnp.arange(_BLOCK, dtype=dtype) + 0.5

  def body(state):
    packed, pending = state
    idx = _first_pending(pending, batch)   # the first pending elements; size after them
    rows = packed[jnp.minimum(idx, size - 1)]
    a0_, a1_, b0_, b1_, m_ref_, q_, s_, a_, edge_, level, block, failed_, older = (
        rows[:, i] for i in range(13))
    old, acc = rows[:, 13:15], rows[:, 15:17]
    d_old = d_acc = None
    if n_grad:
      d_old, d_acc = rows[:, 17:23].reshape(-1, 2, 3), rows[:, 23:29].reshape(-1, 2, 3)
    pl = (a0_, a1_, b0_, b1_, None, m_ref_)
    coarse_intervals = _BLOCK * _pow2(level - 1)
    j = (_BLOCK * block)[:, None] + within
    fraction = (2 * j - coarse_intervals[:, None]) / coarse_intervals[:, None]
    v, dv = _node_values(pl, q_, s_, a_, fraction, with_grad)
    blk, d_blk = _sum_with_mean(v, dv, axis=-1)
    acc, d_acc = _add_with_mean(acc, d_acc, blk, d_blk)
    last_block = block == _pow2(level - 1) - 1
    # Level complete: T(h/2) = T(h)/2 + (h/2) * sum over the new midpoints.
    widths = jnp.stack([a1_ - a0_, b1_ - b0_], axis=-1)
    log_half_h = jnp.log(widths / (2 * coarse_intervals[:, None]))
    new, d_new = _add_with_mean(old + _LOG_HALF, d_old, acc + log_half_h, d_acc)
    total_new = jnp.logaddexp(new[:, 0], new[:, 1])
    total_old = jnp.logaddexp(old[:, 0], old[:, 1])
    step = jnp.max(widths, axis=-1) / (2 * coarse_intervals)
    still = _assess(total_new, total_old, older, edge_, _reference_constant(m_ref_, s_),
                    *_rates(step, s_), a_)
    done = last_block & (~still | (level == _LEVELS - 1))
    col = last_block[:, None]
    out = [rows[:, :9],
           jnp.stack([_where(last_block, level + 1, level), _where(last_block, 0.0, block + 1),
                      _where(last_block, still.astype(dtype), failed_),
                      _where(last_block, total_old, older)], axis=-1),
           _where(col, new, old), _where(col, -jnp.inf, acc)]
    if n_grad:
      out += [_where(col, d_new.reshape(-1, 6), d_old.reshape(-1, 6)),
              _where(col, 0.0, d_acc.reshape(-1, 6))]
    write = idx   # size where not valid: out-of-range writes are dropped
    packed = packed.at[write].set(jnp.concatenate(out, axis=-1), mode="drop")
    return packed, pending.at[write].set(~done, mode="drop")

  packed, _ = loops.while_loop(lambda st: jnp.any(st[1]), body, (packed, failed))
  d_t = packed[:, 17:23].reshape(size, 2, 3) if n_grad else None
  return packed[:, 13:15], d_t, packed[:, 11] > 0


def _log_j_flat(q, sigma, alpha, with_grad):
  """log J = log((A_alpha - 1)/(alpha - 1)) on flat arrays of generic parameters (0 < q < 1,
  sigma > 0, 1 <= alpha < inf), +inf where it cannot be certified; with ``with_grad`` also
  d log J / d(q, sigma, alpha), shape (n, 3), on the same nodes."""
  if q.shape[0] > _BATCH:
    # The whole pipeline one batch at a time: working memory of one batch for any size.
    return _in_row_blocks(lambda xs: _log_j_flat(*xs, with_grad), _BATCH, q, sigma, alpha)
  place = _placement(q, sigma, alpha)
  # The first level in chunks: its (n, 2, nodes) arrays stay small.
  log_t, d_t, edge, failed, total_coarse = _in_row_blocks(
      lambda xs: _first_level(xs[:6], *xs[6:], with_grad), _CHUNK, *place, q, sigma, alpha)
  log_t, d_t, failed = _refine(place, q, sigma, alpha, log_t, d_t, edge, failed, total_coarse,
                               with_grad)
  m_ref = place[-1]
  shift = _reference_constant(m_ref, sigma)
  total, d_total = _add_with_mean(log_t[:, 0], None if d_t is None else d_t[:, 0],
                                  log_t[:, 1], None if d_t is None else d_t[:, 1])
  log_j = _where(failed, jnp.inf, total + shift)
  if not with_grad:
    return log_j
  # The reference constant m_ref (m_ref - 1)/(2 sigma^2) is added back: its sigma-derivative.
  d_shift = jnp.stack([jnp.zeros_like(shift), -2 * shift / sigma, jnp.zeros_like(shift)], axis=-1)
  grads = _where(failed[:, None], 0.0, d_total + d_shift)
  return log_j, grads


def _flat_kernel(with_grad):
  """_log_j_flat for flat inputs, with a batching rule that flattens any vmapped batch into
  the same flat kernel (so jax.vmap never batches its loops)."""
  @jax.custom_batching.custom_vmap
  def kernel(q, sigma, alpha):
    if _placeholder_primal():
      nan = jnp.full(q.shape, jnp.nan, q.dtype)
      return (nan, jnp.full(q.shape + (3,), jnp.nan, q.dtype)) if with_grad else nan
    return _log_j_flat(q, sigma, alpha, with_grad)

  @kernel.def_vmap
  @loops.without_nested_jit   # (see _rule_only_when_batched)
  def _rule(axis_size, in_batched, q, sigma, alpha):
    args = [x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)
            for x, b in zip((q, sigma, alpha), in_batched)]
    shape = args[0].shape
    out = kernel(*(x.reshape(-1) for x in args))
    out = jax.tree_util.tree_map(lambda v: v.reshape(shape + v.shape[1:]), out)
    return out, jax.tree_util.tree_map(lambda _: True, out)

  return _rule_only_when_batched(kernel)


_KERNEL = _flat_kernel(False)
_KERNEL_WITH_GRAD = _flat_kernel(True)


@jax.custom_jvp
def _log_j(q, sigma, alpha):
  """log J = log((A_alpha - 1)/(alpha - 1)) on flat arrays; +inf where it cannot be certified."""
  return _KERNEL(q, sigma, alpha)


@_log_j.defjvp
def _log_j_jvp(primals, tangents):
  # The windows do not depend on the parameters (they only decide where to look), so d log J
  # is the quadrature of the integrand's derivative on the same nodes, at the level each
  # element reached; the kernel accumulates it alongside the value (one pass). The tangent is
  # linear in the inputs' tangents, so JAX transposes it for reverse mode. The kernel's
  # values depend on the primals alone (loops.of_primals: no second derivative, NaN).
  log_j, grads = loops.of_primals(_KERNEL_WITH_GRAD)(*primals)
  tangent = sum(grads[..., i] * t for i, t in enumerate(tangents))
  return log_j, tangent
