r"""The RDP curve's entry points and how a call is dispatched to the kernels.

:func:`log_a` and :func:`rdp_sampled_gaussian` (checked, public) and :func:`log_a_and_rdp`
(the internal entry point) take any broadcast (q, σ, α) through the per-order quadrature
(:func:`quadrature._log_j`), eager calls padded to a few bucket sizes; one (q, σ) at a
concrete 1-D grid of orders takes the grid's path when it certifies every value.

A concrete grid of orders (:func:`log_a_and_rdp_at_orders`, used by ``compute_rdp`` and
``sweep``) is cheaper: integer orders up to 4096 are the exact binomial sum, fractional
orders up to 64 share nodes per group of orders, and the per-order kernel computes whatever
is left (:func:`_quadrature_values`), or leaves it to :func:`fill_pending` on the host.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import loops
from jaxrdp._internal import validation
from jaxrdp.mechanisms.sampled_gaussian.common import (_first_pending, _placeholder_primal,
                                                       _rule_only_when_batched, _where)
from jaxrdp.mechanisms.sampled_gaussian.integer_orders import _integer_orders, _pair_constants
from jaxrdp.mechanisms.sampled_gaussian.order_split import order_split, order_tables
from jaxrdp.mechanisms.sampled_gaussian.quadrature import _KERNEL, _log_j
from jaxrdp.mechanisms.sampled_gaussian.shared_values import _shared_tangents, _shared_values
from jaxrdp.mechanisms.sampled_gaussian.terms import _terms

_FALLBACK_BATCH = 256        # (pair, order) elements of the per-order quadrature per step


@compilation.on_host
def log_a(q: jax.typing.ArrayLike, sigma: jax.typing.ArrayLike,
          alpha: jax.typing.ArrayLike) -> jax.Array:
  r"""log A_α of the Poisson-sampled Gaussian mechanism (Mironov, Talwar, Zhang 2019, Sec. 3).

  .. math:: A_\alpha = E_{z\sim N(0,\sigma^2)}\big[(1-q+q\,e^{(2z-1)/(2\sigma^2)})^\alpha\big]

  Exact for integer and fractional orders (no absolute-value series, no truncation): the
  quadrature of the non-negative integrand of :math:`A_\alpha - 1` described in the module
  docstring, checked on every call. Broadcasts over its arguments; jittable, vmappable and
  differentiable in ``q``, ``sigma`` and ``alpha``; computes in the floating dtype of its
  inputs (float32 or float64).

  Args:
    q: sampling rate in [0, 1].
    sigma: noise multiplier (noise std / L2 sensitivity), >= 0.
    alpha: Rényi order, >= 1 (``inf`` allowed; A_1 = 1).

  Returns:
    log A_α, with the exact special cases q = 0 → 0, q = 1 → α(α−1)/(2σ²), σ = 0 or
    α = ∞ (with q > 0) → +inf. Where the quadrature cannot certify its accuracy the result is
    +inf, never a smaller value.

  Raises:
    ValueError: (eagerly) an argument outside its range, or arguments that do not broadcast.

  References:
    Mironov, Talwar, Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
    arXiv:1908.10530, Sec. 3 (definition of A_α; Sec. 3.3 numerically stable computation).
  """
  validation.check("sampling_rate", q, name="q")
  validation.check("noise_multiplier", sigma, name="sigma")
  validation.check("orders", alpha, name="alpha")
  validation.check_broadcast(q=q, sigma=sigma, alpha=alpha)
  return log_a_and_rdp(q, sigma, alpha)[0]


@compilation.on_host
def rdp_sampled_gaussian(q: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
                         orders: jax.typing.ArrayLike) -> jax.Array:
  r"""RDP ε(α) = log A_α / (α − 1) of one step of the Poisson-sampled Gaussian mechanism.

  ``orders`` may contain 1 (the KL divergence, the limit α → 1, computed without dividing by
  zero: the kernel integrates :math:`(A_\alpha - 1)/(\alpha - 1)` directly) and ``inf``
  (+inf unless q = 0). Broadcasts ``q``, ``noise_multiplier`` and ``orders``.

  Args:
    q: sampling rate in [0, 1].
    noise_multiplier: σ, noise standard deviation / L2 sensitivity, >= 0.
    orders: Rényi orders >= 1 (``inf`` allowed).

  Returns:
    The RDP at each order, broadcast shape, in the inputs' floating dtype.

  Raises:
    ValueError: (eagerly) an argument outside its range, or arguments that do not broadcast.

  References:
    Mironov, Talwar, Zhang (2019), arXiv:1908.10530, Sec. 3; Mironov (2017), Def. 3.
  """
  validation.check("sampling_rate", q, name="q")
  validation.check("noise_multiplier", noise_multiplier)
  validation.check("orders", orders)
  validation.check_broadcast(q=q, noise_multiplier=noise_multiplier, orders=orders)
  return log_a_and_rdp(q, noise_multiplier, orders)[1]


def log_a_and_rdp(q, sigma, alpha):
  """(log A, RDP) without argument checks: the internal entry point (validate at the public
  boundary, then call this). Converts to floating arrays and broadcasts. Concrete inputs are
  broadcast and flattened on the host and padded to :func:`jaxrdp._internal.compilation.bucket` elements
  (generic stand-ins), so that eager calls of any shape share a few compiled programs."""
  q = validation.as_float_array(q)
  sigma = validation.as_float_array(sigma)
  alpha = validation.as_float_array(alpha)
  if not validation.is_concrete((q, sigma, alpha)):
    return _log_a_and_rdp_jit(q, sigma, alpha)
  dtype = jnp.result_type(q, sigma, alpha)
  if q.ndim == 0 and sigma.ndim == 0 and alpha.ndim == 1:
    on_grid = _on_concrete_grid(q, sigma, alpha, dtype)
    if on_grid is not None:
      return on_grid
  arrays = np.broadcast_arrays(*(np.asarray(v, dtype) for v in (q, sigma, alpha)))
  shape, n = arrays[0].shape, arrays[0].size
  if n == 0 or n > compilation.BUCKET_MAX:
    return _log_a_and_rdp_jit(*(jnp.asarray(v) for v in arrays))
  size = compilation.bucket(n)
  flat = [np.concatenate([v.reshape(-1), np.full(size - n, fill, dtype)])
          for v, fill in zip(arrays, (0.5, 1.0, 2.0))]
  out = _log_a_and_rdp_jit(*flat)
  return tuple(jnp.asarray(np.asarray(v)[:n].reshape(shape)) for v in out)


def _on_concrete_grid(q, sigma, orders, dtype):
  """(log A, RDP) of one (q, sigma) at a concrete 1-D grid of orders through the exact sums
  and shared nodes (:func:`log_a_and_rdp_at_orders`), as ``compute_rdp`` computes it, when
  they cover every order and certify every value (None otherwise: the caller then takes the
  per-order quadrature, so no value is left +inf that it would compute). A first call then
  compiles those instead of the per-order quadrature (about half the time for dp_accounting's
  grid)."""
  split = order_split(orders)
  covered = sum(len(p) for p, _ in split.sums) + sum(len(g) for g in split.shared)
  if covered != orders.shape[0]:
    return None
  log_a_value, rdp, pending = _on_grid_jit(
      np.asarray(q, dtype)[None], np.asarray(sigma, dtype)[None], np.asarray(orders, dtype),
      split, order_tables(orders, split))
  if np.asarray(pending).any():
    return None
  return log_a_value[0], rdp[0]


@functools.partial(compilation.jit, static_argnames=("split",),
                   work=lambda arguments: arguments["orders"].size)   # not the tables' size
def _on_grid_jit(q, sigma, orders, split, tables):
  return log_a_and_rdp_at_orders(q, sigma, orders, split, tables, fallback=False)


@compilation.jit
def _log_a_and_rdp_jit(q, sigma, alpha):
  dtype = jnp.result_type(q, sigma, alpha)
  q, sigma, alpha = jnp.broadcast_arrays(q.astype(dtype), sigma.astype(dtype), alpha.astype(dtype))
  shape = q.shape
  if q.size == 0:
    return q, q
  log_a_value, rdp = _terms(q.reshape(-1), sigma.reshape(-1), alpha.reshape(-1))
  return log_a_value.reshape(shape), rdp.reshape(shape)


def _quadrature_values(q, sigma, alphas, groups, fallback):
  """log J (n, m) for flat generic q, sigma (n,) and orders ``alphas`` ((m,), or each pair's own
  (n, m)): the orders of
  ``groups`` (static tuples of positions) on shared nodes, then, with ``fallback``, the
  per-order kernel (:func:`_log_j`) at every other order, on compacted batches of
  _FALLBACK_BATCH elements (static shapes; nothing runs when nothing is left). Where the
  per-order kernel is in the graph anyway, it also computes the rare values the shared nodes
  could not certify; a grid whose orders all have shared nodes (or exact sums) leaves those
  +inf instead (sound: RDP is over-reported, never under-reported) and keeps the per-order
  kernel out of the graph, which would double the compile time. Without ``fallback`` all
  those values are left +inf."""
  n, m = q.shape[0], alphas.shape[-1]
  all_shared = sum(len(g) for g in groups) == m
  log_j = _shared_values(q, sigma, alphas, groups)
  if not fallback or all_shared:
    return log_j
  size = n * m
  batch = min(size, _FALLBACK_BATCH)
  q_all, s_all, a_all = (jnp.broadcast_to(v, (n, m)).reshape(-1)
                         for v in (q[:, None], sigma[:, None], alphas))

  def body(state):
    log_j, pending = state
    idx = _first_pending(pending, batch)   # the first pending elements; size after them
    take = jnp.minimum(idx, size - 1)
    value = _KERNEL(q_all[take], s_all[take], a_all[take])
    return log_j.at[idx].set(value, mode="drop"), pending.at[idx].set(False, mode="drop")

  log_j = log_j.reshape(-1)
  log_j, _ = loops.while_loop(lambda st: jnp.any(st[1]), body, (log_j, ~jnp.isfinite(log_j)))
  return log_j.reshape(n, m)


@functools.lru_cache(maxsize=None)
def _quadrature_kernel(groups, fallback):
  """_quadrature_values for one static ``groups``, with a batching rule that flattens a
  vmapped batch of pairs into the same flat computation (vmap = arrays), orders that differ
  along the batch into each pair's own orders."""
  @jax.custom_batching.custom_vmap
  def kernel(q, sigma, alphas):
    if _placeholder_primal():
      return jnp.full((q.shape[0], alphas.shape[-1]), jnp.nan, q.dtype)
    return _quadrature_values(q, sigma, alphas, groups, fallback)

  @kernel.def_vmap
  @loops.without_nested_jit   # (see _rule_only_when_batched)
  def _rule(axis_size, in_batched, q, sigma, alphas):
    q, sigma, alphas = _flattened(axis_size, in_batched, q, sigma, alphas)
    out = kernel(q.reshape(-1), sigma.reshape(-1), alphas)
    return out.reshape(q.shape + out.shape[-1:]), True

  return _rule_only_when_batched(kernel)


def _flattened(axis_size, in_batched, q, sigma, orders):
  """(q, sigma) (B, n) and the orders ((m,), or (B * n, m) where they differ along the batch
  or by pair) of a vmapped batch of flat pairs (n,) with orders (m,) or (n, m): the pairs of
  the whole batch in one flat computation, each with its own orders where needed."""
  q, sigma = (x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)
              for x, b in zip((q, sigma), in_batched[:2]))
  if in_batched[2] or orders.ndim == 2:
    orders = orders if in_batched[2] else jnp.broadcast_to(orders, (axis_size,) + orders.shape)
    if orders.ndim == 2:   # (B, m): the same for every pair of a batch entry
      orders = jnp.broadcast_to(orders[:, None, :], q.shape + orders.shape[-1:])
    orders = orders.reshape(-1, orders.shape[-1])
  return q, sigma, orders


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _log_j_orders(q, sigma, alphas, groups, fallback):
  """log J (n, m) of flat generic q, sigma (n,) at the orders ``alphas`` ((m,) or (n, m)); +inf
  only where
  even the per-order kernel cannot certify a value (without ``fallback``: wherever the
  shared nodes did not)."""
  return _quadrature_kernel(groups, fallback)(q, sigma, alphas)


def _log_j_orders_jvp(groups, fallback, primals, tangents):
  zero = [isinstance(d, jax.custom_derivatives.SymbolicZero) for d in tangents]
  given = tuple(None if z else d for z, d in zip(zero, tangents))
  tangents = tuple(jnp.zeros_like(p) if z else d for p, d, z in zip(primals, tangents, zero))
  if not fallback or sum(len(g) for g in groups) == primals[2].shape[-1]:
    # Value and tangent on the shared nodes, in one pass (what is left open stays +inf): the
    # per-order kernel's derivative is not in the graph. With the orders held fixed, on the
    # nested grids (refined only where needed); else on one grid with the orders' tangent.
    if zero[2]:
      return _shared_tangents(*primals, groups, given)
    return _shared_tangents(*primals, groups, tangents)
  # With the fallback, value and derivatives from the per-order kernel, which accumulates
  # the derivatives on its own nodes.
  n, m = primals[0].shape[0], primals[2].shape[-1]
  flat = lambda vs: [jnp.broadcast_to(v, (n, m)).reshape(-1)
                     for v in (vs[0][:, None], vs[1][:, None], vs[2])]
  value, tangent = jax.jvp(_log_j, flat(primals), flat(tangents))
  return value.reshape(n, m), tangent.reshape(n, m)


_log_j_orders.defjvp(_log_j_orders_jvp, symbolic_zeros=True)


def log_a_and_rdp_at_orders(q, sigma, orders, split=None, tables=None, fallback=True):
  """(log A, RDP) of shape ``q.shape + orders.shape`` for q, sigma of one (batch) shape and a
  1-D array of orders, without argument checks. ``split`` (:func:`order_split` of the
  concrete orders, static) sends integer orders up to 4096 to the exact binomial sum and
  groups of fractional orders up to 64 to the shared-node quadrature, the others to the
  per-order quadrature; without it every order goes to the per-order quadrature. ``tables``:
  :func:`order_tables` of the same orders and split.

  ``fallback=False`` (with a split) leaves out the per-order quadrature and returns a third
  output, the elements that need it (their log A and RDP are +inf meanwhile): a caller with
  concrete inputs computes those few afterwards (:func:`log_a_and_rdp`) and compiles the
  per-order kernel only when there are any."""
  if split is None:
    return _log_a_and_rdp_jit(q[..., None], sigma[..., None], orders)
  batch = q.shape
  dtype = jnp.result_type(q, sigma, orders)
  qf, sf = (v.reshape(-1).astype(dtype) for v in (q, sigma))
  tables = tuple(jnp.asarray(t, dtype) for t in tables or ())
  if any(compilation.batched(v) for v in (q, sigma)):   # under jax.vmap: flattened by its rule
    stacked = _at_orders_kernel(split, fallback)(qf, sf, orders.astype(dtype), tables)
  else:   # (the wrappers cost tracing and lowering time where they are not needed)
    stacked = _at_orders_flat(qf, sf, orders.astype(dtype), tables, split, fallback)
  shape = batch + orders.shape
  if fallback:
    return stacked[0].reshape(shape), stacked[1].reshape(shape)
  return stacked[0].reshape(shape), stacked[1].reshape(shape), (stacked[2] > 0).reshape(shape)


@functools.lru_cache(maxsize=None)
def _at_orders_kernel(split, fallback):
  """:func:`_at_orders_flat` for one static split, with a batching rule that flattens a
  vmapped batch of pairs into the same flat computation (so that ``jax.jit(jax.vmap(f))``
  traces and runs the code of ``f`` on whole arrays), and its derivatives those of the same
  code (``jax.custom_batching.custom_vmap`` has no reverse mode of its own)."""
  plain = lambda qf, sf, orders, tables: _at_orders_flat(qf, sf, orders, tables, split, fallback)

  @jax.custom_batching.custom_vmap
  def batched(qf, sf, orders, tables):
    if _placeholder_primal():
      return jnp.full((2 if fallback else 3, qf.shape[0], orders.shape[-1]), jnp.nan, qf.dtype)
    return plain(qf, sf, orders, tables)

  @batched.def_vmap
  @loops.without_nested_jit   # (see _rule_only_when_batched)
  def _rule(axis_size, in_batched, qf, sf, orders, tables):
    if (any(jax.tree_util.tree_leaves(in_batched[3]))
        or (split.sums and (in_batched[2] or orders.ndim == 2))):
      # Batched tables, or exact sums at orders that differ along the batch: no flattening.
      axes = (0 if in_batched[0] else None, 0 if in_batched[1] else None,
              0 if in_batched[2] else None, tuple(0 if b else None for b in in_batched[3]))
      return jax.vmap(plain, in_axes=axes)(qf, sf, orders, tables), True
    qf, sf, orders = _flattened(axis_size, in_batched, qf, sf, orders)
    out = batched(qf.reshape(-1), sf.reshape(-1), orders, tables)
    out = out.reshape(out.shape[:1] + qf.shape + out.shape[-1:])
    return jnp.moveaxis(out, 1, 0), True

  call = _rule_only_when_batched(batched)

  @jax.custom_jvp
  def kernel(qf, sf, orders, tables):
    return call(qf, sf, orders, tables)

  @kernel.defjvp
  def _jvp(primals, tangents):
    return jax.jvp(plain, primals, tangents)

  return kernel


def _at_orders_flat(qf, sf, orders, tables, split, fallback):
  """(log A, RDP[, pending]) stacked, (2 or 3, n, m), for flat q, sigma (n,) and the orders
  of ``split`` ((m,), or (n, m) for each pair's own orders where the split has no exact
  sums): see :func:`log_a_and_rdp_at_orders`."""
  dtype = qf.dtype
  generic = (qf > 0) & (qf < 1) & (sf > 0)
  qg, sg_ = _where(generic, qf, 0.5), _where(generic, sf, 1.0)
  pair = _pair_constants(qg, sg_, sf)   # per-pair logarithms and reciprocals, one kernel
  # log J of every order at the generic stand-ins, then one _terms for the whole grid: the
  # orders are taken in the split's order (the exact sums' buckets, then the rest) by one
  # gather, and the results put back by one.
  positions = [np.asarray(p, int) for p, _ in split.sums or ()]
  placed = np.concatenate(positions) if positions else np.zeros(0, int)
  rest = np.setdiff1d(np.arange(orders.shape[-1]), placed)
  perm = np.concatenate([placed, rest])
  identity = bool(np.all(perm == np.arange(perm.size)))
  permuted = orders if identity else orders[..., perm]
  log_js, pendings = [], []
  if positions:
    starts = np.cumsum([0] + [p.size for p in positions])
    log_js.append(_integer_orders(pair, [permuted[a:b] for a, b in zip(starts[:-1], starts[1:])],
                                  tables, tuple(k_max + 1 for _, k_max in split.sums)))
    pendings.append(jnp.zeros((qf.shape[0], placed.size), bool))
  if rest.size:
    alphas = permuted[..., placed.size:]
    where_rest = {int(p): k for k, p in enumerate(rest)}
    groups = tuple(tuple(where_rest[p] for p in g) for g in split.shared)
    usable = jnp.isfinite(alphas) & (alphas >= 1)
    log_j = _log_j_orders(qg, sg_, _where(usable, alphas, 2.0), groups, fallback)
    log_js.append(log_j)
    pendings.append(generic[:, None] & usable & ~jnp.isfinite(log_j))
  log_j = jnp.concatenate(log_js, axis=-1) if len(log_js) > 1 else log_js[0]
  log_a, rdp = _terms(qf[:, None], sf[:, None], permuted, log_j, pair[2][:, 1:])
  outputs = [log_a, rdp]
  if not fallback:
    pending = jnp.concatenate(pendings, axis=-1) if len(pendings) > 1 else pendings[0]
    outputs.append(pending.astype(dtype))
  stacked = jnp.stack(outputs)
  return stacked if identity else stacked[:, :, np.argsort(perm)]


def fill_pending(rdp, pending, q, sigma, orders, steps=1.0):
  """``rdp`` (batch + (K,), T steps) with its ``pending`` entries (from
  :func:`log_a_and_rdp_at_orders` with ``fallback=False``) computed by the per-order
  quadrature, on the host's concrete values: one call, its size padded to a power of two so
  that few shapes compile. q, sigma, steps broadcast to the batch; orders: (K,)."""
  rdp = np.array(rdp)
  index = np.nonzero(pending)
  take = lambda v: np.broadcast_to(np.asarray(v)[..., None], rdp.shape)[index]
  count = index[0].size
  size = max(64, 1 << (count - 1).bit_length())
  pad = lambda v, fill: np.concatenate([v, np.full(size - count, fill, v.dtype)])
  values = log_a_and_rdp(pad(take(q), 0.5), pad(take(sigma), 1.0),
                         pad(np.asarray(orders)[index[-1]], 2.0))[1]
  t = take(steps)
  rdp[index] = np.where(t == 0, 0.0, t * np.asarray(values)[:count])
  return jnp.asarray(rdp)
