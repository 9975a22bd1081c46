r"""ε of a long schedule (more than _BINNED_PHASES phases) in static shapes, traced or not.

RDP is non-decreasing in q and non-increasing in σ (Mironov, Talwar, Zhang 2019), so the phases
sorted by σ and cut into bins bound the schedule's RDP from above and below at every order
(:func:`_phase_bins`); without refinement the grid orders whose lower bound can still be the
minimum are evaluated, a window at a time (:func:`_binned_search`). With refinement a
representative pair per bin stands for the schedule: its optimum places the first window
of orders, and a model of log R through each window's orders the next
(:func:`_windowed_search`, :func:`_vertex_of`). Every ε returned is ε at an evaluated
order, a valid bound.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import loops
from jaxrdp._internal import validation
from jaxrdp.accounting import composition
from jaxrdp.accounting import order_search
from jaxrdp.accounting.envelope import _rdp_and_derivatives, _search_gradient
from jaxrdp.accounting.conversion import composed_epsilons as _composed_epsilons
from jaxrdp.accounting.conversion import epsilon_at_orders
from jaxrdp.mechanisms import sampled_gaussian

_BOUND_BINS = 64   # bins of phases whose bounds decide which grid orders a long schedule needs
_BINNED_PHASES = _BOUND_BINS   # schedules with more phases: _binned_search
_WINDOW = 16       # orders per step of _binned_search's grid search (one group of shared nodes)
_WINDOW_REFINE_STEPS = 2   # windows of _PROBES orders with the best inside (_windowed_search)
_MAX_WALK = 6      # other windows at most (_windowed_search)
_PROBES = 8        # orders per window of _windowed_search (one group of shared nodes)
_SHRINK = 8        # a window's spacing: its neighbours' half distance over this


def _phase_bins(q, sigma, t):
  """(q, σ, T) of 2 * _BOUND_BINS pairs: the phases sorted by σ and cut into _BOUND_BINS equal
  bins (static sizes), each bin's steps at (its largest q, its smallest σ), then at (its
  smallest q, its largest σ). RDP is non-decreasing in q and non-increasing in σ (Mironov,
  Talwar, Zhang 2019), so the first half bounds the schedule's RDP from above at every
  order and the second from below. Phases with no steps take no part; a bin without steps
  is a neutral pair (q = 1/2, σ = 1, no steps). Then a representative of each bin (below)."""
  p, bins = q.shape[0], _BOUND_BINS
  size = -(-p // bins)
  order = jnp.argsort(sigma, stable=True)
  # q, σ, T stacked: one gather, one pad, and each reduction below one kernel for all the
  # rows it serves (a kernel each, apart). Padding phases have no steps: no part either.
  stacked = jnp.stack([q, sigma, t], axis=1)[order]                     # (p, 3)
  stacked = jnp.pad(stacked, ((0, size * bins - p), (0, 0)))
  qs, ss, ts = jnp.moveaxis(stacked.reshape(bins, size, 3), -1, 0)
  live = ts > 0
  # The bins' extremes as maxima: the largest q and σ, and the negated smallest (exact).
  extremes = jnp.max(jnp.where(live, jnp.stack([qs, -qs, -ss, ss]),
                               np.array([0.0, -1.0, -np.inf, 0.0], q.dtype)[:, None, None]),
                     axis=2)
  sums = jnp.sum(jnp.stack([ts, jnp.where(live, ts * (qs * qs), 0.0),
                            jnp.where(live, ts * ss, 0.0)]), axis=2)
  steps = sums[0]
  empty = steps == 0
  neutral = lambda v, fill: jnp.where(empty, fill, v)
  # A third pair per bin stands for it in _windowed_search's estimate of the optimal order:
  # the steps' root mean square q (RDP grows as q^2 for small q) and mean σ.
  mean = lambda v: v / jnp.where(empty, 1.0, steps)
  q_pairs = jnp.concatenate([neutral(extremes[0], 0.5), neutral(-extremes[1], 0.5),
                             neutral(jnp.sqrt(mean(sums[1])), 0.5)])
  s_pairs = jnp.concatenate([neutral(-extremes[2], 1.0), neutral(extremes[3], 1.0),
                             neutral(mean(sums[2]), 1.0)])
  return q_pairs, s_pairs, jnp.concatenate([steps, steps, steps])


@functools.partial(compilation.jit, static_argnames=("split", "refine_steps", "wanted"))
def _binned_search(q, sigma, t, delta, grid, split, tables, refine_steps, wanted=None):
  """(ε, its order) of a long traced schedule on a concrete grid, in static shapes.

  The bounds of :func:`_phase_bins` give an upper and a lower bound of ε at every grid order
  (one evaluation of the grid for 2 * _BOUND_BINS pairs). Then one loop, each step evaluating
  every phase at _WINDOW orders (one group of shared nodes; a value it cannot certify is
  +inf, never smaller): first the grid orders whose lower bound is below the best ε found,
  _WINDOW at a time, smallest bound first (usually one step: they lie around the optimum),
  then ``refine_steps`` steps of _WINDOW equally spaced orders inside the bracket of the best
  order (:mod:`jaxrdp.accounting.order_search`'s rules). Every order left out has a lower
  bound at least the ε returned, and every ε returned is ε at an evaluated order. With
  ``refine_steps`` > 0 the search is :func:`_windowed_search` instead (a third pair per bin
  stands for its phases; no bounds), which with ``wanted`` (static) also returns the
  partial derivatives d ε / d(q, σ, T, δ) that it names (:func:`_windowed_search`)."""
  grid = jnp.asarray(grid)
  tables, ends = tables   # the kernel's tables; grid_ends of the grid
  bq, bs, bt = _phase_bins(q, sigma, t)
  if refine_steps:   # the stand-ins at the grid: where the windows start
    bq, bs, bt = (v[2 * _BOUND_BINS:] for v in (bq, bs, bt))
    rdp = composition.rdp_of_steps(bq, bs, bt, grid, split, tables, fallback=False)[0]
    return _windowed_search(q, sigma, t, delta, grid, jnp.sum(rdp, axis=0), refine_steps,
                            ends, wanted)
  rdp, pending = composition.rdp_of_steps(bq[:2 * _BOUND_BINS], bs[:2 * _BOUND_BINS],
                                          bt[:2 * _BOUND_BINS], grid, split, tables,
                                          fallback=False)
  half = _BOUND_BINS
  lower = _composed_epsilons(grid, jnp.where(pending[half:], 0.0, rdp[half:]), delta)
  usable = jnp.isfinite(grid) & (grid > 1)
  window = sampled_gaussian.OrderSplit(None, (tuple(range(_WINDOW)),))
  big = jnp.finfo(grid.dtype).max

  def body(state):
    best, alpha, lo, hi, known, refined = state
    candidates = ~known & usable & (lower < best)
    searching = jnp.any(candidates)
    key = jnp.where(candidates, jnp.clip(lower, -big, big), jnp.inf)
    pick = jnp.sort(lax.top_k(-key, _WINDOW)[1])   # the grid ascends: so do the orders
    inside = order_search.refinement_orders(lo, hi, count=_WINDOW)
    orders = jnp.where(searching, grid[pick], inside)
    # The schedule through a barrier with the state (loops.in_body): what the step computes
    # from the phases alone stays in the step's kernels.
    r = composition.rdp_of_steps(*loops.in_body((q, sigma, t), refined), orders, window, None,
                                 fallback=False)[0]
    eps = _composed_epsilons(orders, r, delta)
    eps = jnp.where(searching & ~candidates[pick], jnp.inf, eps)   # fillers of the last window
    j = jnp.argmin(eps)
    better = eps[j] < best
    best, alpha = jnp.where(better, eps[j], best), jnp.where(better, orders[j], alpha)
    start = order_search.bracket_of(grid, usable, alpha)
    new = order_search.refined_bracket(lo, hi, inside, eps, best=j)
    lo, hi = (jnp.where(searching, a, b) for a, b in zip(start, new))
    known = known | (searching & jnp.zeros_like(known).at[pick].set(True))
    return best, alpha, lo, hi, known, refined + (~searching).astype(jnp.int32)

  def cond(state):
    best, alpha, _, _, known, refined = state
    searching = jnp.any(~known & usable & (lower < best))
    refinable = jnp.isfinite(best) & jnp.isfinite(alpha) & (alpha > 1)
    return searching | ((refined < refine_steps) & refinable)

  one = jnp.ones((), grid.dtype)
  state = (jnp.inf * one, jnp.nan * one, one, one, ~usable, jnp.zeros((), jnp.int32))
  best, alpha, *_ = loops.while_loop(cond, body, state, batched_as=(q, sigma, t, delta))
  eps = jnp.where(validation.in_domain("delta", delta), best, jnp.nan)
  found = jnp.isfinite(alpha) & (alpha > 1) & jnp.isfinite(best)
  return eps, jnp.where(found, alpha, jnp.nan)


def _parabola_vertex(x, f):
  """The vertex of the parabola through (x, f) (three points each, last axis), and whether it
  is a minimum between the outer two (x ascending, the middle value the smallest, finite)."""
  (x0, x1, x2), (f0, f1, f2) = (jnp.moveaxis(v, -1, 0) for v in (x, f))
  a, b = (x1 - x0) * (f1 - f2), (x1 - x2) * (f1 - f0)
  den = a - b
  ok = jnp.all(jnp.isfinite(f), axis=-1) & (den < 0) & (x0 < x1) & (x1 < x2)
  vertex = x1 - 0.5 * ((x1 - x0) * a - (x1 - x2) * b) / jnp.where(ok, den, -1.0)
  return jnp.where(ok, jnp.clip(vertex, x0, x2), x1), ok


_MODEL_POINTS = 129   # orders at which _vertex_of evaluates its model


def _window_of(x, r, j):
  """What :func:`_vertex_of` places the optimum from, as one array (one carried value of a
  loop): the five orders around the j-th of x (ascending), the composed RDP r there, the j-th
  order's neighbours and the order itself, and 1 where the model through the five is well
  defined (0 < j < len(x) − 1, the five orders distinct, r finite and positive), else 0."""
  n = x.shape[0]
  at = jnp.clip(j - 2, 0, n - 5) + jnp.arange(5)
  places = jnp.concatenate([at, jnp.stack([jnp.maximum(j - 1, 0), jnp.minimum(j + 1, n - 1), j])])
  xs, rs = x[places], r[at]
  ok = ((j > 0) & (j < n - 1) & jnp.all(jnp.isfinite(rs) & (rs > 0))
        & jnp.all(xs[1:5] > xs[:4]))
  return jnp.concatenate([xs, rs, ok.astype(x.dtype)[None]])


def _vertex_of(window, delta):
  """The order between the neighbours of a :func:`_window_of` minimising ε with the composed
  RDP's logarithm taken as the polynomial through (x, log r) at its five orders; its own
  order where the model is not well defined. log R is smooth where ε is not: nearly
  log α + const where the steps are Gaussian-like, nearly linear in α where a small σ makes R
  grow as e^{α/σ²}, while the conversion's −log δ/(α − 1) dominates ε's curvature at small
  orders; so this places the optimum far closer than a parabola through ε itself. ε of the
  model on _MODEL_POINTS orders, then the parabola through its smallest value and the
  neighbours."""
  xs, (lo, hi, x_j), rs, ok = window[:5], window[5:8], window[8:13], window[13] > 0
  log_r = jnp.log(jnp.where(rs > 0, rs, 1.0))
  a = lo + (hi - lo) * jnp.linspace(0.0, 1.0, _MODEL_POINTS, dtype=xs.dtype)
  # Lagrange's form, the five terms at once: term i is the product over m ≠ i of (a − x_m),
  # over its weight, the product of (x_i − x_m) (the factor m = i is 1).
  others = ~np.eye(5, dtype=bool)
  weight = jnp.prod(jnp.where(others, xs[:, None] - xs[None, :], 1.0), axis=-1)         # (5,)
  term = jnp.prod(jnp.where(others[..., None], a - xs[:, None], 1.0), axis=-2)          # (5, P)
  model = jnp.sum(term * jnp.where(ok, log_r / jnp.where(ok, weight, 1.0), 0.0)[:, None], axis=0)
  eps = epsilon_at_orders(a, jnp.exp(model), delta)
  m = jnp.clip(jnp.argmin(jnp.where(jnp.isnan(eps), jnp.inf, eps)), 1, _MODEL_POINTS - 2)
  around = m + jnp.arange(-1, 2)
  vertex, _ = _parabola_vertex(a[around], eps[around])
  return jnp.where(ok, vertex, x_j)


def grid_ends(grid):
  """Of a concrete grid (ascending), computed on the host: the refinement's starting bracket
  at each grid order (:func:`jaxrdp.accounting.order_search.grid_brackets`: in a graph one
  gather, where :func:`~jaxrdp.accounting.order_search.bracket_of` took two reductions over
  the grid) and the usable orders' range (lowest, highest; +inf, −inf where none is usable),
  for :func:`_binned_search`."""
  grid = np.asarray(grid)
  usable = np.isfinite(grid) & (grid > 1)
  low = np.min(np.where(usable, grid, np.inf)).astype(grid.dtype)
  high = np.max(np.where(usable, grid, -np.inf)).astype(grid.dtype)
  return order_search.grid_brackets(grid) + (low, high)


def _windowed_search(q, sigma, t, delta, grid, standin, windows, ends, wanted=None):
  """(ε, its order) of a long schedule, refined continuously in windows of _PROBES orders
  each, every window one evaluation of every phase (one group of shared nodes).

  ``standin``: the composed RDP at the (ascending) grid orders of a schedule that stands for
  this one (a representative of each bin of :func:`_phase_bins`). Its optimum, found on the
  grid and placed between the grid orders by :func:`_vertex_of`, centres the first
  window, whose orders are the centre plus −3..4 spacings of a quarter of the grid's local
  spacing. While the best order of a window lies at its edge, the next is centred on that
  order with twice the spacing (at most _MAX_WALK such windows); otherwise on the optimum of
  the model through the five orders around the best one, with the spacing over _SHRINK (its
  last slot: the grid order nearest the centre); until ``windows`` windows had their best
  order inside (usually the first two). The
  result is the smallest ε at an evaluated order: a valid bound whatever the stand-in. With ε
  unimodal in α around the optimum, the grid's smallest value lies at one of the grid
  neighbours of the optimal order, and the result is below both to within the windows'
  resolution (measured: within 1e-9 of the full grid search's refined ε and never above the
  grid's minimum, tests/test_accounting.py, tests/test_traced_path.py).

  ``wanted`` (static): which of the partial derivatives d ε / d(q, σ, T, δ) to return as well
  (the envelope theorem's, at the order found), taken in the same loop: every window is
  evaluated with the derivatives of every phase's RDP along the wanted directions (the nested
  grids carry them in the same pass), and those at the best order so far are carried, so a
  derivative's graph holds one copy of the kernel, not a second pass of every phase at the
  order found (jax.jit(jax.value_and_grad) of ε, 10,000 phases: 180 -> 155 kernels)."""
  dtype = grid.dtype
  usable = jnp.isfinite(grid) & (grid > 1)
  estimate = _composed_epsilons(grid, standin[None], delta)
  masked = jnp.where(usable & ~jnp.isnan(estimate), estimate, jnp.inf)
  # The usable orders' range (a grid ascends; orders at most 1 and NaN are not usable), and
  # each grid order's bracket: from the host (grid_ends).
  lo_of, hi_of, low, high = (jnp.asarray(v) for v in ends)   # (NumPy where inlined)
  offsets = np.arange(_PROBES) - 3
  probes = sampled_gaussian.OrderSplit(None, (tuple(range(_PROBES)),))
  directions = [i for i in (0, 1) if wanted and wanted[i]]

  def evaluate(orders, phases):   # T·RDP (n, _PROBES); with ``wanted``, its derivatives
    rdp_of = lambda q_, s_, t_: composition.rdp_of_steps(q_, s_, t_, orders, probes, None,
                                                         fallback=False)[0]
    if directions:
      return _rdp_and_derivatives(rdp_of, *phases, wanted)
    r = rdp_of(*phases)
    return r, jnp.zeros((0,) + r.shape, r.dtype)   # (T or δ only: no derivative of the RDP)

  def body(state):
    (best, alpha, window, spacing, step, placed), at_best = state[:6], state[6:]
    # The centre from the window the step before left (the first: the stand-in's, at the
    # grid), here rather than at the end of that step: the model is then one copy in the
    # graph, in the loop, and the last step does not place a window no step evaluates.
    centre = _vertex_of(window, delta)
    orders = jnp.clip(centre + offsets.astype(dtype) * spacing, low, high)
    nearest = grid[jnp.argmin(jnp.where(usable, jnp.abs(grid - centre), jnp.inf))]
    orders = jnp.sort(jnp.where((placed > 0) & (offsets == _PROBES - 4), nearest, orders))
    r, d_r = evaluate(orders, loops.in_body((q, sigma, t), step))   # (as in _binned_search)
    eps = _composed_epsilons(orders, r, delta)
    j = jnp.argmin(eps)
    better = eps[j] < best
    if wanted:   # T·RDP and its derivatives at the best order so far
      at_best = (jnp.where(better, r[:, j], at_best[0]),
                 jnp.where(better, d_r[:, :, j], at_best[1]))
    best, alpha = jnp.where(better, eps[j], best), jnp.where(better, orders[j], alpha)
    window = _window_of(orders, jnp.sum(r, axis=0), j)
    ok = (window[-1] > 0) & jnp.isfinite(eps[j])
    window = jnp.where(np.arange(window.shape[0]) == window.shape[0] - 1,
                       ok.astype(dtype), window)
    spacing = jnp.where(ok, spacing / _SHRINK, 2 * spacing)
    return (best, alpha, window, spacing, step + 1, placed + ok.astype(jnp.int32)) + at_best

  one, zero = jnp.ones((), dtype), jnp.zeros((), jnp.int32)
  i = jnp.argmin(masked)
  lo, hi = lo_of[i], hi_of[i]   # order_search.bracket_of(grid, usable, grid[i])
  state = (jnp.inf * one, jnp.nan * one, _window_of(grid, standin, i), (hi - lo) / 8, zero,
           zero)
  if wanted:   # placeholders until a window has a finite ε (none: no usable order)
    state += (sigma, jnp.broadcast_to(sigma, (len(directions),) + sigma.shape))
  # ``windows`` windows with the best order inside (at most _MAX_WALK others).
  out = loops.while_loop(lambda s: (s[5] < windows) & (s[4] < windows + _MAX_WALK),
                         body, state, batched_as=(q, sigma, t, delta))
  best, alpha = out[:2]
  eps = jnp.where(validation.in_domain("delta", delta), best, jnp.nan)
  found = jnp.isfinite(alpha) & (alpha > 1) & jnp.isfinite(best)
  result = eps, jnp.where(found, alpha, jnp.nan)
  if not wanted:
    return result
  return result + (_search_gradient(*result, q, sigma, t, delta, *out[6:], wanted),)
