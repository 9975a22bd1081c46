r"""The best order of a grid without evaluating every order: branch and bound on convexity.

For a composition of sampled Gaussian steps, :math:`F(\alpha) = (\alpha - 1)\,R(\alpha)`
(R the composed RDP) is a sum of :math:`T_i \log A_\alpha(q_i, \sigma_i)`, each the cumulant
generating function of a privacy-loss variable, hence **convex** in α with F(1) = 0; and R
is non-decreasing in α (Rényi divergences grow with the order; van Erven and Harremoës 2014,
Thm. 3). So, from the orders already evaluated, every other order has a lower bound on F:

* the extension of the chord through the two evaluated orders just below it, and through the
  two just above it (a convex function lies above its secants outside their interval);
* :math:`(\alpha - 1) R(\alpha_{\text{below}})` (monotonicity), and 0.

ε at an order is non-decreasing in R, so these give lower bounds on ε at every unevaluated
order. The search evaluates a spread of orders first, then, batch by batch, the orders whose
lower bound is smallest, and stops when no unevaluated order's lower bound is below the best
ε found: the minimum over the evaluated orders is then the minimum over the whole grid.

Safety does not depend on the bounds: the value returned is always ε at an order that was
evaluated (a valid bound). A bound made too high by rounding could only prune an order that
would have been better, i.e. return a larger ε; the bounds are lowered by a rounding allowance
(amplified by the chord's extrapolation factor) so that this does not happen in practice.
Typical grids of 150-170 orders need 20-40 evaluations instead of all of them.

Refinement beyond the grid runs in the same loop (one evaluation site, so the RDP kernel is
compiled once): once no grid order can beat the best, each further step evaluates BATCH
equally spaced orders inside the bracket between the grid neighbours of the best order found
and keeps the neighbours of the best of them (ε is unimodal in α there), shrinking the
bracket by (BATCH + 1)/2 per step. Every value returned is still ε at an evaluated order.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxrdp._internal import loops
from jaxrdp._internal import validation
from jaxrdp.accounting.conversion import compute_epsilon, epsilon_at_orders

BATCH = 8          # orders evaluated per step of the search
SHRINK = 1e6       # how many times the refinement narrows the grid's bracket (search_update)
ZOOM = 1 / 64      # a model step's narrowest window, relative to the bracket (model_windows)
MODEL_SAFETY = 4   # the window's half-width in error estimates of the model's vertex
MODEL_RESOLUTION = 8   # the window's edges this many units of rounding above its vertex in ε
_MIN_GRID = 24      # smaller grids are evaluated whole


def _spread_rank(k: int) -> np.ndarray:
  """Rank of each sorted position so that the first BATCH picks are evenly spread."""
  first = np.unique(np.round(np.linspace(0, k - 1, BATCH)).astype(int))
  rank = np.full(k, k, dtype=np.int32)
  rank[first] = np.arange(first.size)
  return rank


def bracket_of(orders, usable, best_alpha, xp=jnp):
  """The refinement's starting bracket: the usable grid neighbours of the best order (below it,
  1 + 1e-3 when none; above it, the order itself when none). ``best_alpha`` a scalar, or an
  array of orders: a bracket for each. ``xp``: jax.numpy in a graph, numpy on the host (the
  same arithmetic)."""
  at = best_alpha[..., None]
  below = xp.max(xp.where(usable & (orders < at), orders, -xp.inf), axis=-1)
  above = xp.min(xp.where(usable & (orders > at), orders, xp.inf), axis=-1)
  lo = xp.where(xp.isfinite(below), below, xp.minimum(best_alpha, 1 + 1e-3))
  hi = xp.where(xp.isfinite(above), above, best_alpha)
  return lo.astype(orders.dtype), hi.astype(orders.dtype)


def grid_brackets(orders):
  """:func:`bracket_of` at every order of a concrete grid, (lo, hi) arrays: where the best order
  is a grid order, its bracket is a lookup by its index (in a graph, one gather instead of two
  reductions over the grid)."""
  orders = np.asarray(orders)
  return bracket_of(orders, np.isfinite(orders) & (orders > 1), orders, np)


def _fractions(count, dtype):
  """i/(count + 1), i = 1..count: where refinement_orders places its orders. NumPy constants
  in either case (in a graph an iota would be a kernel of its own), divided in the orders'
  precision, as jnp would."""
  dtype = np.dtype(dtype)
  return np.arange(1, count + 1, dtype=dtype) / dtype.type(count + 1)


def refinement_orders(lo, hi, xp=jnp, count=BATCH):
  """The ``count`` equally spaced orders strictly inside the bracket [lo, hi]."""
  return lo + (hi - lo) * _fractions(count, lo.dtype)


def refined_bracket(lo, hi, inside, eps_new, xp=jnp, best=None):
  """The neighbours of the best of the orders ``inside`` (ε unimodal there, NaN counted as
  +inf by the caller): the next bracket. The bracket's ends are not sampled again; where every
  value is +inf, the bracket is (lo, the first order inside). ``best``: the index of the best
  (``argmin(eps_new)``) where the caller has it."""
  n = inside.shape[0]
  j = xp.argmin(eps_new) if best is None else best
  # The best's place among (lo, inside..., hi): lo's where every value is +inf.
  at = xp.where(eps_new[j] == xp.inf, 0, j + 1)
  lower = xp.where(at <= 1, lo, inside[xp.clip(at - 2, 0, n - 1)])
  upper = xp.where(at >= n, hi, inside[xp.clip(at, 0, n - 1)])
  return lower, upper


def grid_epsilon(composed_rdp, grid, delta, *, refine_steps=0, initial=None,
                 return_evaluations=False):
  """(ε, order): min over ``grid`` of the improved conversion of ``composed_rdp(orders)``,
  then ``refine_steps`` steps of refinement beyond the grid.

  ``composed_rdp`` maps a 1-D array of orders to the composed RDP there. Without refinement,
  equal in value to ``compute_epsilon(grid, composed_rdp(grid), delta)`` (to the last ulp or
  two: orders are converted one by one), with fewer evaluations. ``initial`` = (ε, order)
  already known as the grid's minimum skips the search (refinement only).
  ``return_evaluations`` also returns how many orders were evaluated.
  """
  k = grid.shape[0]
  dtype = grid.dtype
  if k < _MIN_GRID and initial is None:
    eps, order = compute_epsilon(grid, composed_rdp(grid), delta)
    if refine_steps:
      eps, order, n = grid_epsilon(composed_rdp, grid, delta, refine_steps=refine_steps,
                                   initial=(eps, order), return_evaluations=True)
      return (eps, order, k + n) if return_evaluations else (eps, order)
    return (eps, order, k) if return_evaluations else (eps, order)
  rel = 1e-12 if jnp.finfo(dtype).bits > 32 else 1e-3   # rounding allowance of the bounds
  alphas = jnp.sort(grid)                                 # NaN orders last
  # Position 0 is the virtual order 1 with F = 0 (and R ≥ 0): a known point of every curve.
  a = jnp.concatenate([jnp.ones((1,), dtype), alphas])
  idx = jnp.arange(k + 1)
  usable = jnp.isfinite(a) & (a > 1)
  rank = jnp.asarray(np.concatenate([[k + 1], _spread_rank(k)]))
  # Infinite orders have no place in the chords: evaluate them first.
  rank = jnp.where(jnp.isinf(a), -1, rank)

  def lower_bound(r, known):
    on_curve = known & (usable | (idx == 0))
    f = jnp.where(idx == 0, 0.0, (a - 1) * r)
    below = lax.cummax(jnp.where(on_curve, idx, -1))
    left1 = jnp.concatenate([jnp.array([-1]), below[:-1]])
    left0 = jnp.where(left1 >= 0, left1[jnp.maximum(left1, 0)], -1)
    above = lax.cummin(jnp.where(on_curve, idx, k + 1), reverse=True)
    right1 = jnp.concatenate([above[1:], jnp.array([k + 1])])
    right2 = jnp.where(right1 <= k, right1[jnp.minimum(right1, k)], k + 1)

    def chord(i, j, x):   # line through points i, j (both known, finite) evaluated at x
      ok = (i >= 0) & (i <= k) & (j >= 0) & (j <= k)
      i, j = jnp.clip(i, 0, k), jnp.clip(j, 0, k)
      fi, fj, ai, aj = f[i], f[j], a[i], a[j]
      ok = ok & jnp.isfinite(fi) & jnp.isfinite(fj) & (aj != ai)
      width = jnp.where(ok, aj - ai, 1.0)
      slope = jnp.where(ok, (fj - fi) / width, 0.0)
      line = fj + (x - aj) * slope
      err = rel * (jnp.abs(fj) + jnp.abs((x - aj) / width) * (jnp.abs(fi) + jnp.abs(fj)))
      return jnp.where(ok, line - err, -jnp.inf)

    from_left = chord(left0, left1, a)
    from_right = chord(right2, right1, a)
    r_below = jnp.where(left1 >= 0, r[jnp.maximum(left1, 0)], 0.0)
    mono = (a - 1) * r_below * (1 - rel)
    f_lb = jnp.maximum(jnp.maximum(from_left, from_right), jnp.maximum(mono, 0.0))
    return jnp.where(usable, f_lb / jnp.where(usable, a - 1, 1.0), 0.0)

  bracket = lambda best_alpha: bracket_of(a, usable, best_alpha)

  def refinable(best, best_alpha):
    return jnp.isfinite(best) & jnp.isfinite(best_alpha) & (best_alpha > 1) & jnp.any(usable)

  def body(state):
    r, known, best, best_alpha, step, lo, hi, refined, cand, bound = state
    searching = jnp.any(cand)
    key = jnp.where(step == 0, rank.astype(dtype), bound)
    # Candidates get finite keys, the rest +inf: every step evaluates at least one candidate,
    # so the search ends after at most K / BATCH + 1 steps.
    big = jnp.finfo(dtype).max
    key = jnp.where(cand, jnp.clip(jnp.where(jnp.isnan(key) | jnp.isinf(a), -big, key), -big, big),
                    jnp.inf)
    # A grid of fewer than BATCH - 1 orders (only refined, never searched: it is evaluated
    # whole) has fewer positions than BATCH: the first pick fills the rest, a repeat that
    # sets the same values again.
    _, pick = lax.top_k(-key, min(BATCH, k + 1))
    pick = jnp.concatenate([pick, jnp.full((BATCH - pick.shape[0],), pick[0], pick.dtype)])
    # Refinement: equally spaced orders strictly inside the bracket.
    inside = refinement_orders(lo, hi)
    orders = jnp.where(searching, a[pick], inside)
    r_new = composed_rdp(orders)
    r = jnp.where(searching, r.at[pick].set(r_new), r)
    known = jnp.where(searching, known.at[pick].set(True), known)
    # One conversion for the new orders and the lower bounds of every grid order.
    eps_all = epsilon_at_orders(jnp.concatenate([orders, a]),
                                jnp.concatenate([r_new, lower_bound(r, known)]), delta)
    eps_new, bound = eps_all[:BATCH], eps_all[BATCH:]
    # NaN counts as no information; the virtual order 1 (position 0) is not in the grid.
    eps_new = jnp.where(jnp.isnan(eps_new) | (searching & (pick == 0)), jnp.inf, eps_new)
    i = jnp.argmin(eps_new)
    better = eps_new[i] < best
    best = jnp.where(better, eps_new[i], best)
    best_alpha = jnp.where(better, orders[i], best_alpha)
    # The minimum of a unimodal function lies between the neighbours of the best sample.
    new_lo, new_hi = refined_bracket(lo, hi, inside, eps_new, best=i)
    start_lo, start_hi = bracket(best_alpha)
    lo = jnp.where(searching, start_lo, new_lo)
    hi = jnp.where(searching, start_hi, new_hi)
    # Still worth evaluating: strictly below the best (when everything is +inf, σ = 0,
    # nothing is left to try); infinite orders have no lower bound.
    cand = ~known & ((bound < best) | jnp.isinf(a))
    return (r, known, best, best_alpha, step + 1, lo, hi, refined + (~searching).astype(jnp.int32),
            cand, bound)

  def cond(state):
    return jnp.any(state[8]) | ((state[7] < refine_steps) & refinable(state[2], state[3]))

  zero = jnp.asarray(0, jnp.int32)
  if initial is None:
    known0 = (idx == 0) | jnp.isnan(a)
    best0, alpha0 = jnp.asarray(jnp.inf, dtype), jnp.asarray(jnp.nan, dtype)
    lo0 = hi0 = jnp.asarray(1.0, dtype)
  else:
    known0 = jnp.ones((k + 1,), bool)
    best0, alpha0 = (jnp.asarray(v, dtype) for v in initial)
    lo0, hi0 = bracket(alpha0)
  # The first step evaluates a spread of orders (every unknown order is a candidate).
  state = (jnp.zeros((k + 1,), dtype), known0, best0, alpha0, zero, lo0, hi0, zero, ~known0,
           jnp.zeros((k + 1,), dtype))
  state = loops.while_loop(cond, body, state)
  if return_evaluations:
    return state[2], state[3], state[4] * BATCH
  return state[2], state[3]


# ---------------------------------------------------------------------------------------------
# The grid search with refinement of :mod:`jaxrdp.accounting.epsilon`: every grid order
# evaluated (in rows of shared nodes, or all at once from the host), then the refinement. The
# same steps in a graph (jax.numpy) and from the host (NumPy).


class SearchState(NamedTuple):
  """The order search's state (:func:`search_update`). The floats and the step count are one
  array: in a loop their update is then one kernel, not five (XLA compiles each kernel on its
  own, ~10 ms apiece however small; the count's increment alone was one)."""
  values: Any     # (best ε, its order, the next step's window lo, hi, steps taken, the bracket
                  # that holds the optimum lo, hi, the bracket's width to reach), float
  is_open: Any    # bool: a value that could matter was left open
  go: Any         # another step is due: 1, else 0 (int32 of shape (1,): a loop's condition
                  # reads it, see jaxrdp._internal.loops.while_loop)

  @property
  def step(self):   # a whole number (exact in float32 up to 2^24 steps), as a float
    return self.values[4]

  @property
  def best(self):
    return self.values[0]

  @property
  def order(self):
    return self.values[1]

  @property
  def bracket(self):   # where the next step places its orders (inside the bracket that
    return self.values[2], self.values[3]   # holds the optimum, values 5 and 6)


def search_orders(state, orders, n, xp):
  """The orders one step of the eager search evaluates: the grid and its ``n`` slots, which
  hold the refinement's orders after step 0. ``xp``: numpy (jax.numpy works as well)."""
  k = orders.shape[0] - n
  inside = refinement_orders(*state.bracket, xp, count=n)
  if xp is np:
    slotted = orders.copy()
    slotted[k:] = inside
  else:
    slotted = orders.at[k:].set(inside)
  return xp.where(state.step == 0, orders, slotted)


def model_windows(inside, eps_new, xp=jnp):
  r"""Where the next refinement step places its orders if the best of this step's orders
  ``inside`` (equally spaced; ε ``eps_new``, NaN as +inf) is the one with two on each side at
  each position: (2, n - 4), the windows' lo and hi, NaN where the model does not apply (a value
  around it is not finite, or the three are not convex well above rounding; and where the best
  is within two orders of an end of the step, which has no column: the caller then takes the
  bracket). The window lies around the vertex of the parabola through the best order and its
  two neighbours, as narrow as the parabola's error and rounding allow and at least ZOOM times
  the bracket (2s: the best's neighbours, :func:`refined_bracket`).

  The parabola's error: with ε locally :math:`a u^2 + b u^3`, the vertex of the parabola P
  through :math:`x_j, x_j \pm s` is off by at most :math:`|b| s^2 / (2a)`, and P misses the
  values at :math:`x_j \pm 2s` by :math:`6 |b| s^3`: so the vertex's error is at most
  s r / (6 c), r the larger miss (a third difference) and c the second difference
  (:math:`2 a s^2`); the window's half-width is MODEL_SAFETY times that (the higher terms).
  Rounding: the window is no narrower than where P rises MODEL_RESOLUTION units of rounding
  above its vertex, so that the next step's orders still tell ε apart. The half-width is then
  rounded up to s times a power of two and the centre to a quarter of it: ε evaluated by two
  programs that round differently (eager, and with derivatives in a graph) places the same
  orders.

  Where ε is close to a parabola on the step's scale (most schedules) the next step narrows
  the bracket (count + 1)/(2 ZOOM) times instead of (count + 1)/2; where it is not (the sharp
  rise of RDP at large orders) the window widens, up to the bracket (an ordinary step). A
  window that misses the optimum all the same shows at the next step (its best order is the
  window's first or last: :func:`refined_bracket` then reaches to the bracket's end) and costs
  that step's narrowing: every ε is still the value at an evaluated order, and the bracket
  always holds the optimum (ε is unimodal in it)."""
  n = eps_new.shape[0]
  dtype = np.dtype(eps_new.dtype)
  # Elementwise over the positions (one kernel in a graph): each position's orders, values
  # and window.
  x = lambda d: inside[2 + d:n - 2 + d]
  e = lambda d: eps_new[2 + d:n - 2 + d]
  s = inside[1] - inside[0]
  curvature = e(-1) - 2 * e(0) + e(1)
  miss = xp.maximum(xp.abs(e(-2) - 3 * e(-1) + 3 * e(0) - e(1)),
                    xp.abs(e(2) - 3 * e(1) + 3 * e(0) - e(-1)))
  rounding = MODEL_RESOLUTION * dtype.type(np.finfo(dtype).eps) * xp.abs(e(0))
  model = (xp.isfinite(e(-2)) & xp.isfinite(e(-1)) & xp.isfinite(e(1)) & xp.isfinite(e(2))
           & (curvature > rounding))
  c = xp.where(model, curvature, 1.0)
  # Relative to s, by comparisons and products alone (exact up to rounding, and cheap: in a
  # graph they join the kernel of what uses them, where a division or a square root would be
  # a kernel of its own). The half-width: the least of 1 (the bracket's half), 1/2, ..., ZOOM
  # not below the vertex's error (MODEL_SAFETY r / (6 c)) nor below where the parabola rises
  # by the rounding's bound (sqrt(2 rounding / c)).
  half, per_half = xp.ones_like(c), xp.ones_like(c)
  for t in 2.0 ** -np.arange(1, round(-math.log2(ZOOM)) + 1):
    fits = ((MODEL_SAFETY / 6) * miss <= t * c) & (2 * rounding <= (t * t) * c)
    half = xp.where(fits, dtype.type(t), half)
    per_half = xp.where(fits, dtype.type(1 / t), per_half)
  # The vertex's offset (left - right) / (2c), at most half a spacing (|left - right| <= c),
  # rounded to a quarter of the half-width: m quarters, found bit by bit (m <= 2 / half).
  gap = e(-1) - e(1)
  scaled, m = xp.abs(gap) * (2 * per_half), xp.zeros_like(c)
  for bit in 2.0 ** np.arange(round(-math.log2(ZOOM)) + 1, -1, -1):
    m = xp.where(scaled >= (m + (bit - 0.5)) * c, m + bit, m)
  offset = xp.where(gap < 0, -m, m) * (half / 4)
  middle = xp.clip(offset, half - 1, 1 - half) * s + x(0)
  return xp.where(model, middle + np.array([[-1.0], [1.0]], dtype) * (half * s), xp.nan)


def search_update(state, eps, pending, grid, refine_steps, xp, brackets, grid_steps=1,
                  active=True, slots=None):
  """The search's state after a step with ε ``eps`` and open flags ``pending`` at the grid's
  orders followed by the refinement's (as :func:`search_orders` lays them out). Step
  ``grid_steps - 1`` takes the best grid order and brackets the refinement between its grid
  neighbours (steps before it only fill in the grid's values: :func:`_grid_search`); each later
  step keeps the best of the refinement's orders, narrows the bracket to its neighbours
  (:func:`refined_bracket`) and places the next step's orders (:func:`model_windows`), until
  the bracket is SHRINK times narrower than the grid's or ``refine_steps`` steps are done.
  ``state``: a :class:`SearchState`. ``xp``: jax.numpy in a graph, numpy on the host.
  ``brackets``: :func:`grid_brackets` of ``grid`` (computed once per search). ``active`` (a
  traced bool, or True): where false, the step leaves the result (best ε, its order, the open
  flag) as it was and ends the search, in the same kernels as the update (a step after the
  search's end, :func:`_grid_search`'s evaluation of the optimal order with its
  derivatives). ``slots``: the refinement's orders of this step where the caller has them as
  an array (read from it rather than computed again: in a graph, fewer kernels)."""
  step, is_open = state.step, state.is_open
  best, best_alpha = state.best, state.order
  lo, hi = state.bracket
  k = grid.shape[0]
  usable = xp.isfinite(grid) & (grid > 1)
  inside = (refinement_orders(lo, hi, xp, count=eps.shape[0] - k) if slots is None
            else slots)   # this step's orders
  eps_new = eps[k:]
  # The best grid order and the best refinement order as one reduction (in a graph one kernel,
  # not two): each row padded with +inf to the longer (argmin keeps the first of equal values).
  m = max(k, eps_new.shape[0])
  pad = lambda v: xp.concatenate([v, xp.full((m - v.shape[0],), xp.inf, v.dtype)])
  i, j = xp.argmin(xp.stack([pad(eps[:k]), pad(eps_new)]), axis=1)
  # Everything the update reads at i or j as one lookup in one table (in a graph one gather,
  # where each lookup was one or, under jax.vmap, two kernels): at i the grid's ε, order and
  # bracket (bracket_of(grid, usable, grid[i])); at j the refinement's ε and order, the
  # orders beside it and the model's window (model_windows: column j - 2).
  n = eps_new.shape[0]
  if n < 5:   # no order of the step has two on each side
    windows = xp.full((2, 1), xp.nan, eps.dtype)
  elif xp is np:   # (+inf values make NaN where the model does not apply: no warning)
    with np.errstate(invalid="ignore", over="ignore"):
      windows = model_windows(inside, eps_new, xp)
  else:
    windows = model_windows(inside, eps_new, xp)
  # The grid's constants (an unbatched table: under jax.vmap a batched one would be
  # broadcast first) and the step's values.
  grid_i, start_lo, start_hi = xp.stack([grid, brackets[0], brackets[1]])[:, i]
  # (The windows as one piece, lo then hi: under jax.vmap two pieces computed each its own
  # copy of the model.)
  w = windows.shape[1]
  pieces = [eps[:k], eps_new, inside, windows.reshape(-1)]
  piece = np.array([0, 1, 2, 2, 2, 3, 3])
  starts = np.concatenate([[0], np.cumsum([p.shape[0] for p in pieces])])[piece] + np.array(
      [0, 0, 0, 0, 0, 0, w])
  sizes = np.array([k, n, n, n, n, w, w])
  at_j = np.arange(7) >= 1
  shift = np.array([0, 0, 0, -1, 1, -2, -2])
  index = starts + xp.clip(xp.where(at_j, j, i) + shift, 0, sizes - 1)
  looked_up = xp.concatenate(pieces)[index]
  eps_i, eps_j, order_j, below_j, above_j, window_lo, window_hi = (looked_up[r]
                                                                   for r in range(7))
  better = (eps_j < best) & (step >= grid_steps)
  first = step == grid_steps - 1
  # The optimum lies between the best order's neighbours among the bracket's ends and the
  # window's orders (the window lies in the bracket; refined_bracket's rule): the bracket's
  # low end where the best is the first order or every value is +inf, and then the first order.
  a, b = state.values[5], state.values[6]
  infinite = eps_j == xp.inf
  new = (xp.where(infinite | (j == 0), a, below_j),
         xp.where(infinite, inside[0], xp.where(j >= n - 1, b, above_j)))
  use = (j >= 2) & (j <= n - 3) & ~xp.isnan(window_lo)   # (NaN: the model does not apply)
  window = xp.where(use, window_lo, new[0]), xp.where(use, window_hi, new[1])
  # The new values as one select per entry over the entries' index (a stack of computed
  # scalars is a loop per piece, each with its own copy of what the pieces share).
  entry = np.arange(8)
  pieces = [xp.where(first, eps_i, xp.where(better, eps_j, best)),
            xp.where(first, grid_i, xp.where(better, order_j, best_alpha)),
            xp.where(first, start_lo, window[0]), xp.where(first, start_hi, window[1]),
            step + 1, xp.where(first, start_lo, new[0]), xp.where(first, start_hi, new[1]),
            xp.where(first, (start_hi - start_lo) / SHRINK, state.values[7])]
  values = pieces[-1] * np.ones(8, pieces[-1].dtype)
  for c in range(6, -1, -1):
    values = xp.where(entry == c, pieces[c], values)
  opened = xp.where(first, xp.any(pending[:k]), xp.any(pending[k:]))
  if active is not True:   # (the step is counted either way)
    values = xp.where(active | (np.arange(8) == 4), values, state.values)
    opened = opened & active
  best, best_alpha = values[0], values[1]
  is_open = is_open | opened
  refinable = xp.isfinite(best) & xp.isfinite(best_alpha) & (best_alpha > 1) & xp.any(usable)
  # Whether another step is due, from the step count and the bracket as arrays of shape (1,)
  # (slices, not reshapes of scalars: XLA would move a reshape out of the loop).
  count, wide = state.values[4:5], values[6:7] - values[5:6] > values[7:8]
  go = (count < grid_steps - 1) | ((count - (grid_steps - 1) < refine_steps) & refinable & wide)
  return SearchState(values, is_open, (go & active).astype(np.int32))


def search_start(dtype):
  """The search's state before its first step: no best order yet (ε = +inf, order NaN)."""
  return SearchState(np.array([np.inf, np.nan, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0], dtype),
                     np.zeros((), bool), np.ones((1,), np.int32))


def search_result(state, delta, xp):
  """(ε, its order, whether a value that could matter was left open) of a finished search:
  ε NaN for δ outside (0, 1), the order NaN where no usable order gave a finite ε."""
  eps, best = state.best, state.order
  found = xp.isfinite(best) & (best > 1) & xp.isfinite(eps)
  eps = xp.where(validation.in_domain("delta", delta), eps, xp.nan).astype(best.dtype)
  return eps, xp.where(found, best, xp.nan).astype(best.dtype), state.is_open
