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

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxrdp._internal import loops
from jaxrdp._internal import validation
from jaxrdp.accounting.conversion import compute_epsilon, epsilon_at_orders

BATCH = 8          # orders evaluated per step of the search
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


def refinement_orders(lo, hi, xp=jnp, count=BATCH):
  """The ``count`` equally spaced orders strictly inside the bracket [lo, hi]."""
  # NumPy constants in either case (in a graph an iota would be a kernel of its own), divided
  # in lo's precision, as jnp would.
  dtype = np.dtype(lo.dtype)
  fractions = np.arange(1, count + 1, dtype=dtype) / dtype.type(count + 1)
  return lo + (hi - lo) * fractions


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
  values: Any     # (best ε, its order, the bracket's lo, hi, steps taken), float
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
  def bracket(self):
    return self.values[2], self.values[3]


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


def search_update(state, eps, pending, grid, refine_steps, xp, brackets, grid_steps=1,
                  active=True):
  """The search's state after a step with ε ``eps`` and open flags ``pending`` at the grid's
  orders followed by the refinement's (as :func:`search_orders` lays them out). Step
  ``grid_steps - 1`` takes the best grid order and brackets the refinement between its grid
  neighbours (steps before it only fill in the grid's values: :func:`_grid_search`); each later
  step keeps the best of the refinement's orders and narrows the bracket
  (the same rules as the branch-and-bound search above). ``state``: a :class:`SearchState`.
  ``xp``: jax.numpy in a graph, numpy on the host. ``brackets``: :func:`grid_brackets` of
  ``grid`` (computed once per search). ``active`` (a traced bool, or True): where false, the
  step leaves the result (best ε, its order, the open flag) as it was and ends the search, in
  the same kernels as the update (a step after the search's end, :func:`_grid_search`'s
  evaluation of the optimal order with its derivatives)."""
  step, is_open = state.step, state.is_open
  best, best_alpha = state.best, state.order
  lo, hi = state.bracket
  k = grid.shape[0]
  usable = xp.isfinite(grid) & (grid > 1)
  inside = refinement_orders(lo, hi, xp, count=eps.shape[0] - k)
  eps_new = eps[k:]
  # The best grid order and the best refinement order as one reduction (in a graph one kernel,
  # not two): each row padded with +inf to the longer (argmin keeps the first of equal values).
  m = max(k, eps_new.shape[0])
  pad = lambda v: xp.concatenate([v, xp.full((m - v.shape[0],), xp.inf, v.dtype)])
  i, j = xp.argmin(xp.stack([pad(eps[:k]), pad(eps_new)]), axis=1)
  better = (eps_new[j] < best) & (step >= grid_steps)
  first = step == grid_steps - 1
  start = (brackets[0][i], brackets[1][i])   # bracket_of(grid, usable, grid[i])
  new = refined_bracket(lo, hi, inside, eps_new, xp, best=j)
  values = xp.where(first, xp.stack([eps[i], grid[i], *start, step + 1]),
                    xp.stack([xp.where(better, eps_new[j], best),
                              xp.where(better, inside[j], best_alpha), *new, step + 1]))
  opened = xp.where(first, xp.any(pending[:k]), xp.any(pending[k:]))
  if active is not True:   # (the step is counted either way)
    values = xp.where(active | (np.arange(5) == 4), values, state.values)
    opened = opened & active
  best, best_alpha = values[0], values[1]
  is_open = is_open | opened
  refinable = xp.isfinite(best) & xp.isfinite(best_alpha) & (best_alpha > 1) & xp.any(usable)
  # Whether another step is due, from the step count as an array of shape (1,) (a slice, not
  # a reshape of the scalar: XLA would move the reshape out of the loop).
  count = state.values[4:5]
  go = (count < grid_steps - 1) | ((count - (grid_steps - 1) < refine_steps) & refinable)
  return SearchState(values, is_open, (go & active).astype(np.int32))


def search_start(dtype):
  """The search's state before its first step: no best order yet (ε = +inf, order NaN)."""
  return SearchState(np.array([np.inf, np.nan, 1.0, 1.0, 0.0], dtype), np.zeros((), bool),
                     np.ones((1,), np.int32))


def search_result(state, delta, xp):
  """(ε, its order, whether a value that could matter was left open) of a finished search:
  ε NaN for δ outside (0, 1), the order NaN where no usable order gave a finite ε."""
  eps, best = state.best, state.order
  found = xp.isfinite(best) & (best > 1) & xp.isfinite(eps)
  eps = xp.where(validation.in_domain("delta", delta), eps, xp.nan).astype(best.dtype)
  return eps, xp.where(found, best, xp.nan).astype(best.dtype), state.is_open
