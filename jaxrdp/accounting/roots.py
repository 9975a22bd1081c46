r"""The safe-side bracketing root finder of the calibrations.

:func:`_safe_boundary` finds the smallest s with g(s) ≤ 0 for a non-increasing g, one
evaluation of g per step of a single ``while_loop`` (regula falsi with the Illinois
modification, bisection as the fallback); :func:`_host_boundary` runs the same steps
(:func:`_boundary_point`, :func:`_boundary_update`, in NumPy) from the host, where each
evaluation of g is one call of a compiled program. Their state is a :class:`_BoundaryState`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrdp._internal import loops


class _BoundaryState(NamedTuple):
  """The state of :func:`_safe_boundary` (the carry of its loop): scalars, jax.numpy in a
  graph, NumPy on the host (:func:`_host_boundary`). Its five floats, the last end moved and
  the count are one array: in a loop their update is then one kernel, not seven (XLA compiles
  each kernel on its own, ~10 ms apiece however small; the count's increment and the side's
  conversion were one each)."""
  bounds: Any    # (low, high, f_lo, f_hi, value, side, count), below
  done: Any      # the search has stopped
  found: Any     # some point had g <= 0 (hi is finite)
  is_open: Any   # some evaluation used a value left open

  @property
  def low(self):    # the bracket's ends: g(low) > 0 (-inf until such a point is seen) ...
    return self.bounds[0]

  @property
  def high(self):   # ... and g(high) <= 0 (+inf until such a point is seen)
    return self.bounds[1]

  @property
  def f_lo(self):   # the interpolation weights at lo and hi (g there, halved by Illinois)
    return self.bounds[2]

  @property
  def f_hi(self):
    return self.bounds[3]

  @property
  def value(self):  # what g returned with its value at high (NaN until hi is finite)
    return self.bounds[4]

  @property
  def side(self):   # which end moved last: -1 hi, 1 lo, 0 neither yet (whole, as a float)
    return self.bounds[5]

  @property
  def count(self):  # evaluations of g so far (whole, as a float: exact in float32 too)
    return self.bounds[6]


def _safe_boundary(g, s0, s_min, s_max, batched_as=(), with_value=False):
  r"""Smallest s in [s_min, s_max] with g(s) ≤ 0, for g non-increasing ("ok" to the right).

  One evaluation of g per step of a single ``while_loop`` (one copy of the kernel in the
  compiled graph): first a bracket, walking from s0 in steps of 1.5, then regula falsi with the
  Illinois modification (superlinear), falling back to bisection when an end is infinite or
  the interpolated point leaves the bracket. Stops when the bracket is narrower than 1e-9
  (or than a few ulps of its dtype); a point within half of that of an end is moved to half
  of it from that end, so that an accurate interpolation closes the bracket with its next
  evaluation rather than two more (as in Brent's method).
  Returns (s, found, open): s is always a point where g was evaluated and found ≤ 0, or
  s_min when g(s_min) ≤ 0; found is false when even g(s_max) > 0. ``g`` returns its value and
  a flag (a value it used was left open, see :func:`jaxrdp.accounting.epsilon._grid_values`);
  ``open``: any flag. ``g`` may return a third value, a scalar of the dtype of ``s0`` (such as
  ε itself): with ``with_value``, the one it returned at the point returned is returned too
  (NaN where none was found), so that a caller need not evaluate g there again.
  ``batched_as``: the values g depends on
  (:func:`jaxrdp._internal.loops.while_loop`).
  The steps are :func:`_boundary_point` and :func:`_boundary_update`, which
  :func:`_host_boundary` runs from the host instead.
  """
  def body(state):
    x = _boundary_point(state, s0, s_min, s_max, jnp)
    gx, open_x, *value = g(x)
    return _boundary_update(state, x, gx, open_x, s_min, s_max, jnp, *value)
  state = loops.while_loop(lambda st: ~st.done & (st.count < _BOUNDARY_STEPS), body,
                           jax.tree_util.tree_map(jnp.asarray, _boundary_start(s0.dtype)),
                           batched_as=batched_as)
  if with_value:
    return state.high, state.found, state.is_open, state.value
  return state.high, state.found, state.is_open


_BOUNDARY_STEPS = 200


def _boundary_start(dtype):
  """The state of :func:`_safe_boundary` before its first step (:class:`_BoundaryState`)."""
  false = np.asarray(False)
  return _BoundaryState(bounds=np.array([-np.inf, np.inf, np.inf, -np.inf, np.nan, 0, 0], dtype),
                        done=false, found=false, is_open=false)


def _boundary_point(state, s0, s_min, s_max, xp):
  """The next point :func:`_safe_boundary` evaluates (``xp``: jax.numpy or numpy)."""
  lo, hi, f_lo, f_hi = state.low, state.high, state.f_lo, state.f_hi
  have_lo, have_hi = xp.isfinite(lo), xp.isfinite(hi)
  with np.errstate(invalid="ignore", divide="ignore"):   # unused branches may be NaN
    interp = hi - f_hi * (hi - lo) / (f_hi - f_lo)
    bisect = ~xp.isfinite(f_lo) | ~xp.isfinite(f_hi) | ~((interp > lo) & (interp < hi))
    both = xp.where(bisect, 0.5 * (lo + hi), interp)
    half = 0.5 * _bracket_tolerance(hi, xp)   # the bracket is wider than twice this
    both = xp.minimum(xp.maximum(both, lo + half), hi - half)
  up = xp.minimum(xp.where(have_lo, lo + 1.5, s0), s_max)
  down = xp.maximum(xp.where(have_hi, hi - 1.5, s0), s_min)
  return xp.where(have_lo & have_hi, both, xp.where(have_hi, down, up)).astype(lo.dtype)


def _bracket_tolerance(hi, xp):
  """The width at which :func:`_safe_boundary`'s bracket stops: 1e-9, or a few ulps where the
  dtype cannot resolve 1e-9 (float32: otherwise the search would run its 200 steps without
  moving)."""
  return xp.maximum(1e-9, 4 * float(np.finfo(hi.dtype).eps) * xp.maximum(1.0, xp.abs(hi)))


def _boundary_update(state, x, gx, open_x, s_min, s_max, xp, value=None):
  """The state of :func:`_safe_boundary` after g(x) = gx (open_x: it used an open value;
  ``value``: what g returned with it, kept where x becomes the high end)."""
  lo, hi, f_lo, f_hi, side = state.low, state.high, state.f_lo, state.f_hi, state.side
  inf = xp.asarray(np.inf, lo.dtype)
  gx = xp.where(xp.isnan(gx), inf, gx).astype(lo.dtype)   # no information counts as not ok
  ok = gx <= 0
  # Illinois: when the same end moves twice, halve the other end's weight.
  new_f_lo = xp.where(ok, xp.where(side == -1, f_lo / 2, f_lo), gx)
  new_f_hi = xp.where(ok, gx, xp.where(side == 1, f_hi / 2, f_hi))
  lo, hi = xp.where(ok, lo, x), xp.where(ok, x, hi)
  found = xp.isfinite(hi)
  done = ((~ok & (x >= s_max)) | (ok & (x <= s_min))
          | (xp.isfinite(lo) & found & (hi - lo < _bracket_tolerance(hi, xp))))
  side = xp.where(ok, -1, 1).astype(lo.dtype)
  kept = state.value if value is None else xp.where(ok, value, state.value).astype(lo.dtype)
  return _BoundaryState(bounds=xp.stack([lo, hi, new_f_lo, new_f_hi, kept, side,
                                         state.count + 1]),
                        done=done, found=found, is_open=state.is_open | open_x)


def _host_boundary(g, s0, s_min, s_max, dtype):
  """:func:`_safe_boundary` with its steps run from the host: ``g`` (a host function of a
  NumPy scalar) evaluates a compiled program, the bracket's logic is NumPy. (s, found)."""
  state = _boundary_start(dtype)
  s0 = np.asarray(s0, dtype)
  while not state.done and state.count < _BOUNDARY_STEPS:
    x = _boundary_point(state, s0, s_min, s_max, np)
    state = _boundary_update(state, x, np.asarray(g(x), dtype), False, s_min, s_max, np)
  return state.high, state.found
