"""Composition: the RDP of T steps is T times the RDP of one (Mironov 2017, Prop. 1)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import validation
from jaxrdp.mechanisms import sampled_gaussian


@compilation.on_host
def compute_rdp(q: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
                steps: jax.typing.ArrayLike, orders: jax.typing.ArrayLike) -> jax.Array:
  r"""RDP of ``steps`` compositions of the Poisson-sampled Gaussian mechanism.

  .. math:: \varepsilon_T(\alpha) = T \cdot \frac{\log A_\alpha(q, \sigma)}{\alpha - 1}

  Same name and argument order as dp_accounting / TF Privacy ``compute_rdp``. ``q``,
  ``noise_multiplier`` and ``steps`` broadcast against each other (shape ``S``); ``orders`` is
  a scalar or a 1-D array of ``K`` orders; the result has shape ``S + orders.shape``. Orders
  may contain 1 (KL divergence) and ``inf``. Large inputs are processed in chunks, so memory
  stays bounded (call it on whole arrays rather than under ``jax.vmap`` for that).

  Args:
    q: sampling rate in [0, 1].
    noise_multiplier: σ, the noise standard deviation divided by the L2 sensitivity, ≥ 0.
    steps: number of steps T ≥ 0.
    orders: Rényi orders ≥ 1 (``inf`` allowed).

  Returns:
    RDP at each order, in the floating dtype of the inputs.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Mironov, Talwar, Zhang (2019), arXiv:1908.10530, Sec. 3; Mironov (2017), arXiv:1702.07476,
    Prop. 1 (composition).
  """
  validation.check("sampling_rate", q, name="q")
  validation.check("noise_multiplier", noise_multiplier)
  validation.check("steps", steps)
  validation.check("orders", orders)
  validation.check_broadcast(q=q, noise_multiplier=noise_multiplier, steps=steps)
  return rdp_curve(q, noise_multiplier, steps, orders)


def rdp_curve(q, noise_multiplier, steps, orders):
  """:func:`compute_rdp` after its checks, for callers that checked the arguments themselves
  (concrete inputs bucketed on the host, as there; orders scalar or 1-D)."""
  given = orders
  orders = validation.as_float_array(orders)
  if orders.ndim > 1:
    raise ValueError(f"orders must be a scalar or a 1-D array, got shape {orders.shape}.")
  # From the orders as given: under an outer jax.jit even a converted constant is a tracer,
  # and the split needs the concrete values.
  split = sampled_gaussian.order_split(given) if orders.ndim == 1 else None
  tables = sampled_gaussian.order_tables(given, split)
  args = tuple(validation.as_float_array(v) for v in (q, noise_multiplier, steps))
  if split is None or not validation.is_concrete((args, orders)):
    return compute_rdp_unchecked(*args, orders, split, tables)
  # Concrete inputs: flattened on the host and padded to a bucketed batch size, so that calls
  # of any batch shape share a few compiled programs; the orders the exact sums and shared
  # nodes leave open (rarely any) are computed afterwards by the per-order quadrature,
  # compiled only when some are open.
  dtype = jnp.result_type(args[0], args[1], orders)   # as in rdp_of_steps
  q, sigma, steps = np.broadcast_arrays(*(np.asarray(v, dtype) for v in args))
  batch, n = q.shape, q.size
  if n == 0 or n > compilation.BUCKET_MAX:
    rdp, pending = compute_rdp_unchecked(*args, orders, split, tables, fallback=False)
    q, sigma, steps = args
  else:
    size = compilation.bucket(n)
    pad = lambda v, fill: np.concatenate([v.reshape(-1), np.full(size - n, fill, dtype)])
    padded = (pad(q, 0.5), pad(sigma, 1.0), pad(steps, 1.0))
    rdp, pending = by_order_parts(compute_rdp_unchecked, padded, np.asarray(orders, dtype),
                                  split, tables, fallback=False)
    shape = batch + orders.shape
    rdp, pending = rdp[:n].reshape(shape), pending[:n].reshape(shape)
  pending = np.asarray(pending)
  if not pending.any():
    return validation.to_device(rdp)
  return sampled_gaussian.fill_pending(rdp, pending, q, sigma, orders, steps)


_PREPARED = set()   # signatures by_order_parts has prepared both programs for


@functools.lru_cache(maxsize=64)
def order_parts(split, size):
  """((columns, split) of the other orders, (columns, split) of the exact sums) of a grid of
  ``size`` orders with ``split``; None unless it has both. Each part's split is the grid's,
  re-indexed (not recomputed from the values: a search moves its slots' orders between calls,
  and its program must stay the same). Remembered per split: searches ask at every step."""
  summed = np.zeros(size, bool)
  for positions, _ in split.sums or ():   # None: a search's slots (no sums)
    summed[list(positions)] = True
  if summed.all() or not summed.any():
    return None
  index = lambda mask: np.cumsum(mask) - 1
  renumber = lambda positions, mask: tuple(int(i) for i in index(mask)[list(positions)])
  rest = sampled_gaussian.OrderSplit((), tuple(renumber(g, ~summed) for g in split.shared))
  sums = sampled_gaussian.OrderSplit(tuple((renumber(p, summed), k) for p, k in split.sums), ())
  def columns(mask):
    out = np.flatnonzero(mask)
    out.flags.writeable = False
    return out
  return (columns(~summed), rest), (columns(summed), sums)


def by_order_parts(program, before, orders, split, tables, **kwargs):
  """``program(*before, orders, split, tables, **kwargs)`` for concrete arguments (an entry
  point of :func:`jaxrdp._internal.compilation.jit` whose outputs have the orders on their
  last axis), as NumPy arrays. A grid with both exact sums (integer orders) and other orders
  is evaluated as two grids, each its own program, both prepared before either runs, so that
  tracing one overlaps compiling the other (XLA releases the GIL): the first call of
  ``compute_rdp`` at the default orders takes ~0.1 s less on two cores, more on more. Each
  order's value is the whole grid's: its sum bucket and its group of shared nodes are the
  same in its part."""
  halves = order_parts(split, orders.size)
  if halves is None:
    return tuple(np.asarray(v) for v in program(*before, orders, split, tables, **kwargs))
  # The fractional orders' program, the larger, first: its compilation starts earliest.
  parts = [(columns, (*before, orders[columns], part_split, part_tables))
           for (columns, part_split), part_tables in zip(halves, ((), tables))]
  prepare = getattr(program, "prepare", None)   # None: not an entry point (a test's stand-in)
  # Prepared once per signature (a program evicted later compiles at its call, as usual): a
  # search calls this at every step, and preparing means binding and keying the arguments.
  signature = (program, split, orders.shape, orders.dtype, tuple(sorted(kwargs.items())),
               tuple((np.shape(v), getattr(v, "dtype", type(v))) for v in before),
               jax.config.jax_enable_x64, str(jax.config.jax_default_device))
  if prepare is not None and signature not in _PREPARED:
    for _, args in parts:
      prepare(*args, **kwargs)
    if len(_PREPARED) >= 256:
      _PREPARED.clear()
    _PREPARED.add(signature)
  # Both dispatched before either is read: the two programs run at the same time.
  results = [(columns, program(*args, **kwargs)) for columns, args in parts]
  outs = None
  for columns, result in results:
    values = [np.asarray(v) for v in result]
    if outs is None:
      outs = [np.empty(v.shape[:-1] + orders.shape, v.dtype) for v in values]
    for out, v in zip(outs, values):
      out[..., columns] = v
  return tuple(outs)


def _work(arguments):
  """Elements of compute_rdp's output: the batch times the orders (not the tables)."""
  shape = jnp.broadcast_shapes(*(jnp.shape(arguments[k]) for k in ("q", "sigma", "steps")))
  return math.prod(shape) * jnp.size(arguments["orders"])


def rdp_of_steps(q, sigma, steps, orders, split=None, tables=None, fallback=True):
  """compute_rdp without argument checks (floating arrays; orders scalar or 1-D). ``split``:
  :func:`jaxrdp.mechanisms.sampled_gaussian.order_split` of the concrete orders (static): integer
  orders to the exact binomial sum (``tables``: their
  :func:`jaxrdp.mechanisms.sampled_gaussian.order_tables`), fractional ones to the shared-node quadrature.
  ``fallback=False`` (with a split): also returns which entries still need the per-order
  quadrature (see :func:`jaxrdp.mechanisms.sampled_gaussian.log_a_and_rdp_at_orders`)."""
  batch = jnp.broadcast_shapes(jnp.shape(q), jnp.shape(sigma), jnp.shape(steps))
  dtype = jnp.result_type(q, sigma, orders)
  q, sigma = (jnp.broadcast_to(v, batch).astype(dtype) for v in (q, sigma))
  pending = None
  if orders.ndim == 1:
    out = sampled_gaussian.log_a_and_rdp_at_orders(q, sigma, orders.astype(dtype), split, tables,
                                                   fallback=fallback or split is None)
    rdp = out[1]
    pending = out[2] if len(out) > 2 else None
  else:
    rdp = sampled_gaussian.log_a_and_rdp(q, sigma, orders)[1]
  expand = (Ellipsis,) + (None,) * orders.ndim
  t = jnp.broadcast_to(steps, batch)[expand].astype(rdp.dtype)
  # 0 steps spend nothing, even at orders where one step is infinite; under jit, negative or
  # NaN steps give NaN.
  out = jnp.where(t == 0, jnp.zeros_like(rdp), t * rdp)
  out = jnp.where(validation.in_domain("steps", t), out, jnp.nan)
  return out if pending is None else (out, pending)


compute_rdp_unchecked = functools.partial(
    compilation.jit, static_argnames=("split", "fallback"), work=_work)(rdp_of_steps)
compute_rdp_unchecked.__doc__ = """:func:`rdp_of_steps` compiled on its own (an entry point; inside
a traced function call :func:`rdp_of_steps`, which transformations trace once)."""


def schedule_phases(sampling_rate, noise_multiplier, steps):
  """(q, σ, T) as three 1-D phase arrays of one dtype (a scalar schedule has one phase): host
  arrays for concrete values, JAX arrays for traced ones; ValueError naming the arguments and
  their shapes for shapes that are not one schedule."""
  shape = validation.check_schedule(sampling_rate=sampling_rate,
                                    noise_multiplier=noise_multiplier, steps=steps) or (1,)
  q = validation.as_float_array(sampling_rate)
  sigma = validation.as_float_array(noise_multiplier)
  t = validation.as_float_array(steps)
  dtype = jnp.result_type(q, sigma, t)
  if validation.is_concrete((q, sigma, t)):  # on the host: eager JAX ops would compile
    return tuple(np.broadcast_to(np.asarray(v, dtype), shape) for v in (q, sigma, t))
  return tuple(jnp.broadcast_to(v.astype(dtype), shape) for v in (q, sigma, t))
