r"""Clipped per-example gradient sums, with or without materialising every per-example gradient.

DP-SGD (Abadi et al. 2016, Alg. 1) bounds each example's influence by clipping its gradient
to global L2 norm C before summing:

.. math:: S = \sum_{i \in B} m_i\, g_i \min\!\Big(1, \frac{C}{\lVert g_i \rVert_2}\Big),

where :math:`m_i \in \{0, 1\}` is the padding mask. Every term has norm at most C, so adding or
removing one example moves S by at most C: the L2 sensitivity the Gaussian noise is scaled to.

* Masked examples, and examples whose gradient norm is not finite (NaN or inf entries, or a
  sum of squares that overflows), contribute exactly zero. This is done by selection
  (``jnp.where``), never by multiplying with 0, which would turn NaN padding into NaN sums.
  Dropping an example is a per-example function of norm 0 ≤ C, so the bound is unchanged.
* Squares and sums are accumulated in at least float32 (bfloat16 gradients are promoted).

:func:`clipped_grad_sum` computes S from a per-example loss in microbatches with
``lax.scan``, so that only ``microbatch_size`` per-example gradients exist at a time, and
returns a :class:`ClippedGradSum`, which :func:`jaxrdp.differentially_private_aggregate`
accepts in place of per-example gradients (it then only adds the noise).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxrdp._internal import loops
from jaxrdp._internal import validation


class ClippedGradSum(NamedTuple):
  """A sum of per-example gradients, each clipped to L2 norm ``l2_norm_clip``.

  Produced by :func:`clipped_grad_sum`; pass it as the ``updates`` of
  :func:`jaxrdp.differentially_private_aggregate`, which then skips clipping and checks that
  ``l2_norm_clip`` does not exceed its own clipping norm (the noise is scaled to the latter).

  Attributes:
    grad_sum: a pytree shaped like the parameters, dtype at least float32.
    l2_norm_clip: the clipping norm every summand was clipped to.
  """
  grad_sum: Any
  l2_norm_clip: jax.Array


def _accumulation_dtype(dtype):
  """At least float32: bfloat16/float16 squares and sums lose too much precision."""
  return jnp.promote_types(dtype, jnp.float32)


def batch_size_of(leaves, name: str = "per-example gradients") -> int:
  """The common leading (batch) dimension of ``leaves``; ValueError naming ``name`` otherwise."""
  if not leaves:
    raise ValueError(f"{name} must contain at least one array.")
  shapes = [jnp.shape(x) for x in leaves]
  if any(len(s) == 0 for s in shapes):
    raise ValueError(f"{name} must have a leading batch axis on every leaf; got a scalar leaf "
                     f"(leaf shapes {shapes}). Compute them with jax.vmap(jax.grad(loss), ...).")
  sizes = {s[0] for s in shapes}
  if len(sizes) != 1:
    raise ValueError(f"{name} must share one leading batch axis; got leaf shapes {shapes}.")
  return sizes.pop()


def check_mask(mask, batch_size: int):
  """The padding mask as bool[batch_size] (all True when None)."""
  if mask is None:
    return jnp.ones((batch_size,), dtype=bool)
  dtype = getattr(mask, "dtype", None) or jnp.asarray(mask).dtype
  if dtype != jnp.bool_:
    raise TypeError(f"mask must be a boolean array (True = real example, False = padding), "
                    f"got dtype {dtype}.")
  if jnp.shape(mask) != (batch_size,):
    raise ValueError(f"mask must have shape ({batch_size},), one entry per example of the batch; "
                     f"got shape {jnp.shape(mask)}.")
  return jnp.asarray(mask)


def clip_and_sum(per_example_grads, l2_norm_clip, mask=None):
  r"""Σ_i m_i clip_C(g_i) over the leading axis of every leaf (see the module docstring).

  Args:
    per_example_grads: pytree whose leaves share a leading batch axis of size B.
    l2_norm_clip: C ≥ 0, the bound on each example's global L2 norm.
    mask: optional bool[B]; False marks padding, which contributes exactly zero.

  Returns:
    The pytree of clipped sums (leaves without the batch axis), each leaf in
    ``promote_types(leaf.dtype, float32)``.

  References:
    Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, Alg. 1 (norm clipping).
  """
  leaves, treedef = jax.tree.flatten(per_example_grads)
  batch = batch_size_of(leaves)
  for leaf in leaves:
    if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
      raise TypeError(f"per-example gradients must be floating point; got a leaf of dtype "
                      f"{jnp.result_type(leaf)}.")
  mask = check_mask(mask, batch)
  acc = [_accumulation_dtype(jnp.result_type(x)) for x in leaves]
  norm_dtype = jnp.result_type(*acc)
  sq = jnp.zeros((batch,), norm_dtype)
  for leaf, dt in zip(leaves, acc):
    x = jnp.asarray(leaf).astype(dt)
    sq = sq + jnp.sum(x * x, axis=tuple(range(1, x.ndim))).astype(norm_dtype)
  # NaN/inf gradients give a non-finite sq; masked rows may hold anything.
  valid = mask & jnp.isfinite(sq)
  norm = jnp.sqrt(jnp.where(valid, sq, 0))
  clip = jnp.asarray(l2_norm_clip, norm_dtype)
  over = norm > clip
  scale = jnp.where(over, clip / jnp.where(over, norm, 1), 1)
  sums = []
  for leaf, dt in zip(leaves, acc):
    x = jnp.asarray(leaf).astype(dt)
    keep = valid.reshape((batch,) + (1,) * (x.ndim - 1))
    # Selection first: 0 * NaN would be NaN.
    safe = jnp.where(keep, x, 0)
    sums.append(jnp.tensordot(scale.astype(dt), safe, axes=1))
  return jax.tree.unflatten(treedef, sums)


def clipped_grad_sum(loss_fn: Callable[..., jax.Array], params, batch, l2_norm_clip: jax.typing.ArrayLike,
                     *, mask: jax.typing.ArrayLike | None = None,
                     microbatch_size: int | None = None) -> ClippedGradSum:
  r"""Sum of clipped per-example gradients of ``loss_fn``, ``microbatch_size`` examples at a time.

  Per-example gradients are computed with ``jax.vmap(jax.grad(loss_fn))`` on microbatches of
  ``microbatch_size`` examples inside ``lax.scan``, clipped and summed there, so peak memory
  holds ``microbatch_size`` per-example gradients instead of B. The result is the same sum as
  clipping all B at once (up to float rounding of the summation order). A batch whose size is
  not a multiple of ``microbatch_size`` is padded with masked zero examples.

  Usage::

    grad_sum = jaxrdp.clipped_grad_sum(loss_fn, params, batch, l2_norm_clip, mask=mask,
                                       microbatch_size=32)
    updates, opt_state = opt.update(grad_sum, opt_state, params)   # opt = jaxrdp.dpsgd(...)

  Args:
    loss_fn: ``loss_fn(params, example) -> scalar``, the loss of ONE example (the leaves of
      ``example`` have no batch axis).
    params: the parameters (pytree) to differentiate with respect to.
    batch: pytree whose leaves share a leading batch axis of size B.
    l2_norm_clip: C ≥ 0.
    mask: optional bool[B]; False marks padding (contributes exactly zero, even when its loss
      or gradient is NaN).
    microbatch_size: examples per scan step; ``None`` (or ≥ B) processes the batch at once.

  Returns:
    :class:`ClippedGradSum` with ``grad_sum`` shaped like ``params`` (dtype at least float32)
    and the clipping norm used. Under ``jax.jit`` a clipping norm outside [0, inf) (NaN
    included) gives a ``grad_sum`` of NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Abadi et al., CCS 2016, Alg. 1; microbatched clipping as in jax_privacy's ``clipped_grad``.
  """
  if not callable(loss_fn):
    raise TypeError(f"loss_fn must be a callable loss_fn(params, example), got "
                    f"{type(loss_fn).__name__}.")
  validation.check("l2_norm_clip", l2_norm_clip)
  leaves, treedef = jax.tree.flatten(batch)
  size = batch_size_of(leaves, "batch")
  mask = check_mask(mask, size)
  clip = jnp.asarray(l2_norm_clip)
  if not jnp.issubdtype(clip.dtype, jnp.floating):
    clip = clip.astype(jnp.result_type(float))
  if microbatch_size is not None and (isinstance(microbatch_size, bool) or not isinstance(
      microbatch_size, int) or microbatch_size <= 0):
    raise ValueError(f"microbatch_size must be a positive int or None, got {microbatch_size!r}.")
  # Under jit the check above does not run: a clip outside [0, inf) gives NaN sums, never
  # gradients clipped to a negative or unbounded norm (the eager call raised).
  valid = validation.all_in_domains(l2_norm_clip=clip)
  grad_fn = jax.vmap(jax.grad(loss_fn), in_axes=(None, 0))
  if microbatch_size is None or microbatch_size >= size:
    total = clip_and_sum(grad_fn(params, batch), clip, mask)
    return ClippedGradSum(validation.nan_where_invalid(valid, total), clip)
  steps = -(-size // microbatch_size)
  pad = steps * microbatch_size - size

  def split(x):
    x = jnp.asarray(x)
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    return x.reshape((steps, microbatch_size) + x.shape[1:])

  micro = jax.tree.unflatten(treedef, [split(x) for x in leaves])
  micro_mask = jnp.pad(mask, (0, pad)).reshape(steps, microbatch_size)
  zero = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), _accumulation_dtype(jnp.result_type(p))),
                      params)

  def body(total, xs):
    examples, m = xs
    part = clip_and_sum(grad_fn(params, examples), clip, m)
    return jax.tree.map(lambda a, b: a + b.astype(a.dtype), total, part), None

  total, _ = loops.scan(body, zero, (micro, micro_mask))
  return ClippedGradSum(validation.nan_where_invalid(valid, total), clip)
