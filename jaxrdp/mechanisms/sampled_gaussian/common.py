"""Pieces that several parts of the sampled-Gaussian kernel share.

Elementwise helpers (double-where selects, the exponent floor, log-sum-exp, a stable
softplus, log exprel on t <= 0, exact powers of two), the refinement loops' compaction
(:func:`_first_pending`), the constants of the integrand that the
per-order and the shared-node quadratures both use (its series, the windows' half-width),
row blocks that bound working memory (:func:`_in_row_blocks`), selects that XLA computes as
one kernel (:func:`_select_columns`), and the placeholder primal of the kernels that have a
batching rule (:func:`_rule_only_when_batched`: under :func:`jax.vmap` only the rule traces
them).
"""

from __future__ import annotations

import functools
import math
import threading

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import loops
from jaxrdp._internal import numerics

_SERIES_TERMS = 16        # Taylor terms of (1+x)^a - 1 - a x around x = 0 ...
_SERIES_RADIUS = 0.1      # ... used for |x| <= min(0.1, 1/(2 alpha)): terms shrink by >= 10x
_HALF_WIDTH = 11.0        # window half-width in local standard deviations (e^{-60})
_LOG_HALF = math.log(0.5)
_TOP_K_ENTRIES = 1 << 24   # _first_pending's float32 keys are exact below this many entries


_where = numerics.select
_exp_floor = numerics.exp_floor
_logsumexp = numerics.logsumexp


def _pow2(k):
  """2**k for a float array of small integers k, exactly (XLA's float64 exp2 is not: on CPU
  exp2(3.) = 8 - 2e-15, which would break the block counters of the refinement loops)."""
  return jnp.ldexp(jnp.ones_like(k), k.astype(jnp.int32))


def _log_exprel_nonpositive(t):
  """log((e^t - 1)/t) for t <= 0: the ratio lies in (0, 1], so nothing overflows.

  Near t = 0 (alpha -> 1, where t = -(alpha - 1)|ell|) the Taylor polynomial
  t/2 + t^2/24 (next term t^4/2880: below 1e-15 of the value for |t| <= 1e-4): it has the
  derivative 1/2 at t = 0, which a constant 0 there would drop (the alpha-derivative of
  log A at alpha = 1), and the direct form's derivative e^t/(e^t - 1) - 1/t cancels
  catastrophically as t -> 0."""
  direct = t < -1e-4
  t_safe = _where(direct, t, -1.0)
  return _where(direct, jnp.log(jnp.expm1(t_safe) / t_safe), t * (0.5 + t / 24))


def _first_pending(pending, count):
  """The positions of the first ``count`` true entries of the 1-D boolean ``pending``, in
  ascending order, then n = ``pending.shape[0]`` where fewer are true: an index that a scatter
  with ``mode="drop"`` drops and a gather must clip. The refinement loops' compaction (each
  step takes a batch of the entries still pending).

  The ``count`` largest of the keys n − i over the true entries i (0 elsewhere): ``lax.top_k``
  of float32 keys, exact below 2^24 entries, runs XLA's partial-sort routine on CPUs (0.08 ms
  at 10^4 entries, batches of 512), where a stable sort of the positions took 1.1 ms (a
  quarter of a 10^4-row kernel's run time) and ``jnp.nonzero`` (a running count and a
  scatter) compiles into ~10x the kernels. From 2^24 entries on, the stable sort."""
  n = pending.shape[0]
  if n >= _TOP_K_ENTRIES:
    return jnp.where(jnp.arange(count) < jnp.sum(pending), lax.sort(
        (~pending, jnp.arange(n, dtype=np.int32)), num_keys=1, is_stable=True)[1][:count], n)
  # The positions are a NumPy constant (an iota would be a kernel of its own in a loop).
  keys = _where(pending, (n - np.arange(n)).astype(np.float32), np.float32(0))
  return n - lax.top_k(keys, count)[0].astype(np.int32)


def _softplus(x):
  """log(1 + e^x), stable; cheaper than jax.nn.softplus on CPU. Below e^-(~700) in float64
  (e^-(~86) in float32) it returns that floor instead of a subnormal: an absolute change far
  below the rounding of anything it is added to."""
  return jnp.maximum(x, 0) + jnp.log1p(jnp.exp(jnp.maximum(-jnp.abs(x), _exp_floor(x.dtype))))


def _in_row_blocks(fn, rows, *arrays):
  """fn(tuple of arrays) on blocks of ``rows`` leading entries (lax.map), outputs
  concatenated: working memory of one block for any size."""
  n = arrays[0].shape[0]
  if n <= rows:
    return fn(arrays)
  n_blocks = -(-n // rows)
  pad = n_blocks * rows - n
  split = lambda v: jnp.concatenate([v, jnp.broadcast_to(v[:1], (pad,) + v.shape[1:])]).reshape(
      (n_blocks, rows) + v.shape[1:])
  out = loops.map(fn, tuple(split(v) for v in arrays))
  return jax.tree_util.tree_map(lambda v: v.reshape((n_blocks * rows,) + v.shape[2:])[:n], out)


def _select_columns(columns, axis=-1):
  """The arrays ``columns`` (one shape, k entries along ``axis``) as one array whose entry i
  along ``axis`` is that of ``columns[i]``: one select each, so that XLA computes it as one
  kernel (a concatenation of computed pieces is a kernel per piece on CPUs).
  To compute expensive functions of per-row values in the same kernel, select their
  arguments first and apply each function to the whole selection (see :func:`_log_j_levels`):
  a function of a broadcast per-row value is moved before the broadcast by XLA, where it is
  a kernel of its own."""
  shape, axis = columns[0].shape, axis % columns[0].ndim
  # A NumPy constant: an iota would be a kernel of its own where it feeds a loop.
  column = np.arange(shape[axis]).reshape((-1,) + (1,) * (len(shape) - 1 - axis))
  out = columns[-1]
  for i in range(len(columns) - 2, -1, -1):
    out = _where(column == i, columns[i], out)
  return out


_PRIMAL = threading.local()   # .skip: the next custom_vmap primal traced is a placeholder


def _placeholder_primal():
  """True once after :func:`_rule_only_when_batched` asked for it (and then False)."""
  skip = getattr(_PRIMAL, "skip", False)
  _PRIMAL.skip = False
  return skip


def _rule_only_when_batched(kernel):
  """``kernel`` (a :func:`jax.custom_batching.custom_vmap` whose primal returns a placeholder
  when :func:`_placeholder_primal` says so) called so that, on values being batched by
  :func:`jax.vmap`, the primal is not traced: custom_vmap traces it for the unbatched shapes
  before the batching rule replaces it, which would trace the whole kernel twice. The
  placeholder (NaN of the output's shape) is never evaluated: the rule's result replaces it.
  The same in the body of a loop that vmap batches, which ``lax.while_loop`` traces at the
  unbatched shapes before vmap batches it (:func:`jaxrdp._internal.loops.batched_witness`):
  the first argument is made batched there, so that the rule replaces the primal whatever
  the others are. The rules themselves trace with nested jits disabled
  (:func:`jaxrdp._internal.loops.without_nested_jit`): vmap calls them when it batches an
  enclosing loop, outside the entry point's ``jax.disable_jit()``, where each ``jax.numpy``
  call would otherwise be traced as a jaxpr of its own (~190 under ``jax.jit(jax.vmap(ε))``)."""
  @functools.wraps(kernel)
  def call(*args):
    if not any(compilation.batched(x) for x in jax.tree_util.tree_leaves(args)):
      witness = loops.batched_witness()
      if witness is None:
        return kernel(*args)
      args = (loops.batched_like(witness, args[0]),) + args[1:]
    _PRIMAL.skip = True
    try:
      return kernel(*args)
    finally:
      _PRIMAL.skip = False
  return call
