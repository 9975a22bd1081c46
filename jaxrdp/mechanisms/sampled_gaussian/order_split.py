"""A concrete grid of orders, split by how each order is computed.

Integer orders in [2, 4096] are summed exactly, in buckets by size
(:mod:`jaxrdp.mechanisms.sampled_gaussian.integer_orders`); fractional orders in (1, 64]
share one grid of nodes per group of ascending orders
(:mod:`jaxrdp.mechanisms.sampled_gaussian.shared_values`); every other order (1, inf, NaN,
larger orders) goes to the per-order quadrature. :class:`OrderSplit` is static
(a jit argument); the binomial tables of the exact sums (:func:`order_tables`) are passed as
arguments, so that grids with the same split share one compiled program.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from jaxrdp.mechanisms.sampled_gaussian.integer_orders import _log_binomials, packed_binomials

# --- a concrete grid of orders: exact sums at integer orders, shared nodes at fractional ones ---

_MAX_INTEGER_ORDER = 4096    # integer orders up to this are summed exactly (O(alpha) terms)
_SUM_BUCKETS = (64, 256, 1024, 4096)   # orders up to each are summed over k <= it
_SHARED_MAX_ORDER = 64.0     # fractional orders up to this share one grid of nodes per group
_SHARED_GROUP = 32           # orders per group (one window and one set of nodes per pair)
_SHARED_SPAN = 4.0           # a group's orders lie in [a, max(2 a, a + _SHARED_SPAN)]


class OrderSplit(tuple):
  """Static description of a concrete 1-D order grid (hashable: a static jit argument).

  ``sums``: tuples ``(positions, k_max)`` of integer orders in [2, 4096], summed exactly,
  one tuple per bucket of _SUM_BUCKETS (k_max: the bucket's end; the orders' values stay
  dynamic, with their binomial coefficients from :func:`order_tables`); ``shared``: tuples of
  positions of fractional orders in (1, 64], ascending, each one group of the shared-node
  quadrature. Every other position (1, inf, NaN, larger orders) goes to the per-order
  quadrature."""

  def __new__(cls, sums, shared):
    return super().__new__(cls, (sums, shared))

  @property
  def sums(self):
    return self[0]

  @property
  def shared(self):
    return self[1]


def order_split(orders):
  """:class:`OrderSplit` of a concrete 1-D order array; None when ``orders`` is traced."""
  if isinstance(orders, jax.core.Tracer):
    return None
  # Remembered per grid: searches and calibrations ask for it at every call.
  return _order_split(np.asarray(orders, np.float64).reshape(-1).tobytes())


@functools.lru_cache(maxsize=64)
def _order_split(key):
  a = np.frombuffer(key, np.float64)
  with np.errstate(invalid="ignore"):
    integer = (a == np.round(a)) & (a >= 2) & (a <= _MAX_INTEGER_ORDER)
    shared = (a > 1) & (a <= _SHARED_MAX_ORDER) & ~integer & np.isfinite(a)
  sums = []
  for lo, hi in zip((2,) + tuple(b + 1 for b in _SUM_BUCKETS[:-1]), _SUM_BUCKETS):
    pos = np.nonzero(integer & (a >= lo) & (a <= hi))[0]
    if pos.size:
      sums.append((tuple(int(i) for i in pos), hi))
  groups, current = [], []
  for i in np.nonzero(shared)[0][np.argsort(a[shared], kind="stable")]:
    if current and (len(current) == _SHARED_GROUP
                    or a[i] > max(2 * a[current[0]], a[current[0]] + _SHARED_SPAN)):
      groups.append(tuple(current))
      current = []
    current.append(int(i))
  if current:
    groups.append(tuple(current))
  return OrderSplit(tuple(sums), tuple(groups))


def order_tables(orders, split):
  """The log-binomial tables of the exact sums of :func:`order_split`, packed into chunks as
  one float64 array (a 1-tuple: :func:`packed_binomials` of one table per bucket, (orders in
  it, k_max + 1); empty without integer orders), from the concrete ``orders``; None without a
  split. Passed as an argument,
  so that grids with the same split share one compiled program."""
  if split is None:
    return None
  if not split.sums:
    return ()
  a = np.asarray(orders, np.float64).reshape(-1)
  return (packed_binomials([_log_binomials(tuple(int(v) for v in a[np.asarray(pos)]), k_max)
                            for pos, k_max in split.sums]),)
