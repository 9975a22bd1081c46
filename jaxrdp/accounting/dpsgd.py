r"""ε of a DP-SGD training schedule, differentiable, and calibration of σ, q or the step count.

A schedule is a sequence of phases; phase i runs ``steps[i]`` steps of the Poisson-sampled
Gaussian mechanism at ``sampling_rate[i]`` and ``noise_multiplier[i]``. RDP composes by
addition (Mironov 2017, Prop. 1), so the schedule's RDP at order α is
:math:`\sum_i T_i\,\varepsilon_{q_i,\sigma_i}(\alpha)`, and ε is its conversion to
(ε, δ)-DP (:func:`jaxrdp.compute_epsilon`, minimised over the orders).

Optimal order: after the grid, the order is refined continuously (8 orders per step in the
bracket around the best grid order; the conversion is smooth and unimodal in α there). The
result is the minimum of the grid value and the refined value: never looser than the grid,
and never below the true RDP-based value, since every order gives a valid bound. Gradients
follow the envelope theorem: the optimal order is held fixed (exact, since ε is minimised
over it).

How it is evaluated: on a concrete grid (the default) every grid order goes through the exact
sums and the shared nodes (:func:`jaxrdp.mechanisms.sampled_gaussian.log_a_and_rdp_at_orders`) and the
refinement's orders through 8 extra slots of the same program (:func:`_search_orders` and
:func:`_search_update`, driven from the host for concrete inputs, one loop in the graph for
traced ones). Long schedules (more than 64 phases), traced or not, evaluate each phase only at
the grid orders that bounds from the phases binned by σ leave in play, and refine in windows
of 16 orders (:func:`_binned_search`, one program with static shapes). Calibrations run their
safe-side search on the full evaluation, and the envelope gradient is taken at the one
optimal order through its own split. The per-order quadrature is compiled only when
something is left open (then it fills just those values). A traced grid uses the branch and
bound of :mod:`jaxrdp.accounting.order_search` with the per-order quadrature: the same ε.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import loops
from jaxrdp._internal import validation
from jaxrdp.accounting import composition
from jaxrdp.accounting.composition import schedule_phases
from jaxrdp.accounting import conversion
from jaxrdp.mechanisms import sampled_gaussian
from jaxrdp.accounting import order_search
from jaxrdp.accounting import pld
from jaxrdp.accounting.order_search import grid_epsilon
from jaxrdp.accounting.conversion import compute_epsilon, epsilon_at_orders
from jaxrdp.accounting.orders import DEFAULT_ORDERS

REFINE_STEPS = 6         # refinement steps of 8 orders each (the bracket shrinks 4.5x per step)
_SIGMA_MIN, _SIGMA_MAX = 1e-4, 1e8   # noise multipliers searched
_Q_MIN = 1e-12                       # smallest sampling rate searched


def order_grid(orders, dtype):
  """The order grid (checked if given) as a 1-D array of ``dtype``."""
  if orders is None:
    orders = DEFAULT_ORDERS
  else:
    validation.check("orders", orders)
  # A concrete grid stays a host array (also under an outer jax.jit, where a converted
  # constant would be a tracer): its split into exact sums and shared nodes needs the values.
  xp = np if validation.is_concrete(orders) else jnp
  grid = xp.asarray(orders, dtype)
  if grid.ndim > 1:
    raise ValueError(f"orders must be a 1-D array of orders (or a scalar), got shape {grid.shape}.")
  return grid.reshape(-1)


def schedule_rdp(q, sigma, t, orders):
  """Σ_i T_i RDP_i at each order (orders of any shape)."""
  rdp = composition.rdp_of_steps(q, sigma, t, orders.reshape(-1))
  return jnp.sum(rdp, axis=0).reshape(orders.shape)


def _epsilon_at(q, sigma, t, delta, alpha):
  """Improved conversion at each order of the 1-D array α (Balle et al. 2020, Thm. 21)."""
  r = schedule_rdp(q, sigma, t, alpha)
  return epsilon_at_orders(alpha, r, delta)


def dpsgd_epsilon(sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
                  steps: jax.typing.ArrayLike, delta: jax.typing.ArrayLike, *,
                  orders: jax.typing.ArrayLike | None = None,
                  refine_order: bool = True, method: str = "improved",
                  accountant: str = "rdp", pld_grid: pld.PldGrid | None = None) -> jax.Array:
  r"""ε of DP-SGD with Poisson sampling, for a constant or phased schedule.

  Args:
    sampling_rate: q, a scalar or a 1-D array (one entry per phase), in [0, 1].
    noise_multiplier: σ, scalar or 1-D, ≥ 0.
    steps: steps per phase, scalar or 1-D, ≥ 0. The three broadcast to one schedule.
    delta: δ in (0, 1).
    orders: the order grid (default :data:`jaxrdp.DEFAULT_ORDERS`).
    refine_order: refine the best grid order continuously (never looser than the grid).
    method: the conversion from RDP to (ε, δ). ``"improved"`` (the default; Balle et al. 2020,
      Thm. 21, as dp_accounting) or ``"classic"``, ε = min_α RDP(α) + log(1/δ)/(α − 1)
      (Mironov 2017, Prop. 3), what TF Privacy's tutorials and Abadi et al. 2016 reported: to
      reconcile with published numbers. The classic value is taken on the order grid
      (``refine_order`` does not apply) and is never smaller than the improved one.
    accountant: ``"rdp"`` (the default: exact RDP at every order, the fastest path, float32
      and float64) or ``"pld"``: the privacy-loss distribution of the schedule
      (:func:`jaxrdp.pld_epsilon`), tight where RDP is loose (RDP's ε is 1.05–3.8x the
      PLD's on random schedules, most at small q and ε ≲ 1), float64 only, steps whole
      numbers. ``orders``, ``refine_order`` and ``method`` belong to the RDP accountant.
    pld_grid: with ``accountant="pld"`` inside ``jax.jit``, the static grid sizes
      (:func:`jaxrdp.pld_grid`); sized from the arguments otherwise.

  Returns:
    ε (a scalar in the inputs' dtype). Jittable; differentiable with respect to
    ``sampling_rate``, ``noise_multiplier`` (every entry of a schedule), ``steps`` and
    ``delta``, with exact envelope gradients at the optimal order. ε alone, not
    :func:`jaxrdp.compute_epsilon`'s ``(ε, order)`` pair: ε is what is differentiated,
    calibrated and optimised (``jax.grad`` needs a scalar output), and the order it was
    minimised over is an internal of the search (with ``refine_order`` it lies between grid
    orders). The grid order, when wanted: ``compute_epsilon(orders, rdp, delta)`` with ``rdp``
    the sum over phases of ``compute_rdp(sampling_rate, noise_multiplier, steps, orders)``;
    its ε is this function's with ``refine_order=False`` (up to rounding). Under ``jax.jit``
    (where the range checks cannot run) NaN when an argument lies outside its range, with
    either accountant.

  Raises:
    ValueError: an argument outside its range (named, with the range and the value), shapes
      that are not one schedule or a ``delta`` that is not a scalar (named, with the shapes),
      or an unknown ``method``.

  References:
    Abadi et al. 2016 (DP-SGD); Mironov, Talwar, Zhang 2019 (RDP of the sampled Gaussian);
    Balle et al. 2020, Thm. 21 (conversion); Mironov 2017, Prop. 3 (classic conversion).
  """
  validation.check_choice("method", method, conversion.METHODS)
  validation.check_all(sampling_rate=sampling_rate, noise_multiplier=noise_multiplier,
                       steps=steps, delta=delta)
  validation.check_scalar(delta=delta)   # ε of several δ: jax.vmap
  if use_pld(accountant, orders=orders, refine_order=refine_order, method=method,
              pld_grid=pld_grid):
    return pld.pld_epsilon(sampling_rate, noise_multiplier, steps, delta, pld_grid=pld_grid)
  q, sigma, t = schedule_phases(sampling_rate, noise_multiplier, steps)
  grid = order_grid(orders, q.dtype)
  # Under jit the checks above do not see the values: an argument outside its domain gives
  # NaN (the RDP of an invalid q or σ is NaN, which the order search would skip as no
  # information and report +inf or the other phases' ε).
  valid = validation.all_in_domains(sampling_rate=q, noise_multiplier=sigma, steps=t,
                                    delta=delta, orders=grid)
  delta = validation.to_device(delta, q.dtype)
  if method == "classic":
    rdp = jnp.sum(composition.rdp_curve(q, sigma, t, grid), axis=0)
    eps = jnp.min(epsilon_at_orders(grid, rdp, delta, method))
  else:
    eps = dpsgd_epsilon_unchecked(q, sigma, t, delta, grid, refine_order)
  return validation.nan_where_invalid(valid, eps)


ACCOUNTANTS = ("rdp", "pld")
_RDP_DEFAULTS = {"orders": None, "refine_order": True, "method": "improved", "max_steps": None}


def use_pld(accountant, pld_grid=None, **rdp_options) -> bool:
  """Whether ``accountant`` is "pld" (ValueError for another name, for RDP options given with
  the PLD accountant, and for a PLD grid given with the RDP one: nothing is ignored)."""
  validation.check_choice("accountant", accountant, ACCOUNTANTS)
  if accountant == "pld":
    given = [k for k, v in rdp_options.items() if v is not _RDP_DEFAULTS[k]
             and not (k == "method" and v == "improved")]
    if given:
      raise ValueError(f"{', '.join(given)} apply to accountant='rdp' only; "
                       f"accountant='pld' got {', '.join(f'{k}={rdp_options[k]!r}' for k in given)}.")
    return True
  if pld_grid is not None:
    raise ValueError("pld_grid applies to accountant='pld' only.")
  return False


def dpsgd_epsilon_unchecked(q, sigma, t, delta, grid, refine_order):
  """dpsgd_epsilon without argument checks (phase arrays of one dtype). The order search is
  compiled on its own; the envelope derivative is attached outside it, so that a derivative
  taken eagerly (``jax.grad`` of this function) compiles two smaller graphs with the CPU
  option of :mod:`jaxrdp._internal.compilation` rather than one large graph without it."""
  sg = lax.stop_gradient
  _prepare_gradient(q, sigma, t, delta, grid)
  found = _concrete_epsilon(sg(q), sg(sigma), sg(t), sg(delta), grid, refine_order)
  if found is None:
    found = _search_epsilon(sg(q), sg(sigma), sg(t), sg(delta), grid, refine_order)
  eps, best = found
  return _envelope(eps, best, q, sigma, t, delta)


def _with_slots(grid):
  """(orders, split, tables) for a concrete grid: the grid followed by _BATCH slots for the
  refinement's orders (placeholders here), with the split of the grid plus one shared-node
  group for the slots; None for a traced grid. Every step of the search then evaluates the
  same program: the grid and the slots together."""
  split = sampled_gaussian.order_split(grid)
  if split is None:
    return None
  k = grid.shape[0]
  slots = tuple(range(k, k + order_search.BATCH))
  split = sampled_gaussian.OrderSplit(split.sums, split.shared + (slots,))
  orders = np.concatenate([np.asarray(grid), np.linspace(1.5, 2.5, len(slots), dtype=grid.dtype)])
  return orders, split, sampled_gaussian.order_tables(grid, split)


def _work(arguments):
  """Elements of one evaluation of the grid: phases times orders."""
  return arguments["q"].size * arguments["orders"].size


def _grid_values(q, sigma, t, delta, orders, split, tables, fallback):
  """ε (NaN as +inf) at each of ``orders`` for the schedule, and which orders were left open
  (only without ``fallback``, which leaves out the per-order quadrature)."""
  out = composition.rdp_of_steps(q, sigma, t, orders, split, tables, fallback=fallback)
  rdp, pending = (out, jnp.zeros(out.shape, bool)) if fallback else out
  return _composed_epsilons(orders, rdp, delta), jnp.any(pending, axis=0)


def _search_orders(state, orders, xp):
  """The orders one step of the search evaluates: the grid and its slots, which hold the
  refinement's orders after step 0. ``xp``: jax.numpy in a graph, numpy on the host."""
  k = orders.shape[0] - order_search.BATCH
  inside = order_search.refinement_orders(state[3], state[4], xp)
  if xp is np:
    slotted = orders.copy()
    slotted[k:] = inside
  else:
    slotted = orders.at[k:].set(inside)
  return xp.where(state[0] == 0, orders, slotted)


def _search_update(state, eps, pending, orders, refine_steps, xp):
  """The search's state after a step with ε ``eps`` and open flags ``pending`` at the orders
  of :func:`_search_orders`. Step 0 takes the best grid order and brackets the refinement
  between its grid neighbours; each later step keeps the best of the _BATCH refinement orders
  and narrows the bracket (:mod:`jaxrdp.accounting.order_search`, the same rules as the branch-and-bound
  search). ``state``: (step, best ε, its order, bracket lo, hi, open, go): ``open`` says a
  value that could matter was left open, ``go`` that another step is due."""
  step, best, best_alpha, lo, hi, is_open, _ = state
  k = orders.shape[0] - order_search.BATCH
  grid = orders[:k]
  usable = xp.isfinite(grid) & (grid > 1)
  inside = order_search.refinement_orders(lo, hi, xp)
  i = xp.argmin(eps[:k])
  eps_new = eps[k:]
  j = xp.argmin(eps_new)
  better = eps_new[j] < best
  first = step == 0
  best_alpha = xp.where(first, grid[i], xp.where(better, inside[j], best_alpha))
  best = xp.where(first, eps[i], xp.where(better, eps_new[j], best))
  start = order_search.bracket_of(grid, usable, best_alpha, xp)
  new = order_search.refined_bracket(lo, hi, inside, eps_new, xp)
  lo, hi = (xp.where(first, a, b) for a, b in zip(start, new))
  is_open = is_open | xp.where(first, xp.any(pending[:k]), xp.any(pending[k:]))
  refinable = xp.isfinite(best) & xp.isfinite(best_alpha) & (best_alpha > 1) & xp.any(usable)
  return step + 1, best, best_alpha, lo, hi, is_open, (step < refine_steps) & refinable


def _search_start(dtype):
  one = np.ones((), dtype)
  return (np.zeros((), np.int32), np.inf * one, np.nan * one, one, one, np.zeros((), bool),
          np.ones((), bool))


def _search_result(state, delta, xp):
  _, eps, best, _, _, is_open, _ = state
  found = xp.isfinite(best) & (best > 1) & xp.isfinite(eps)
  eps = xp.where(validation.in_domain("delta", delta), eps, xp.nan).astype(best.dtype)
  return eps, xp.where(found, best, xp.nan).astype(best.dtype), is_open


@functools.partial(compilation.jit, static_argnames=("refine_steps", "split"), work=_work)
def _grid_search(q, sigma, t, delta, orders, split, tables, refine_steps):
  """(ε, its order) of :func:`_search_epsilon` on a concrete grid (``orders``, ``split``,
  ``tables`` from :func:`_with_slots`), every step in one loop, with the per-order
  quadrature for whatever the sums and shared nodes leave open."""
  # A host grid becomes a graph constant here: when this function is inlined into an outer
  # trace (jax.jit(jax.vmap(f)), see jaxrdp._internal.compilation) it arrives as NumPy.
  orders = jnp.asarray(orders)

  def step(state):
    alphas = _search_orders(state, orders, jnp)
    eps, pending = _grid_values(q, sigma, t, delta, alphas, split, tables, fallback=True)
    return _search_update(state, eps, pending, orders, refine_steps, jnp)
  state = jax.tree_util.tree_map(jnp.asarray, _search_start(orders.dtype))
  return _search_result(loops.while_loop(lambda st: st[-1], step, state), delta, jnp)[:2]


def _concrete_epsilon(q, sigma, t, delta, grid, refine_order):
  """(ε, order) of :func:`_search_epsilon` where the grid is concrete (None otherwise): every
  grid order is evaluated (the exact sums and shared nodes make that cheaper than the branch
  and bound of the per-order quadrature), then the same refinement. For concrete inputs the
  steps run from the host (compiling a loop and the search's logic around the kernel costs
  XLA ~0.3 s more), each evaluation one call of the program of ``compute_rdp`` (values left
  open filled on the host, :func:`_concrete_epsilons`). Traced inputs: :func:`_grid_search`.
  Schedules of more than _BINNED_PHASES phases: :func:`_binned_search`, traced or not."""
  slotted = _with_slots(grid)
  if slotted is None:
    return None
  orders, split, tables = slotted
  steps = REFINE_STEPS if refine_order and grid.shape[0] >= 2 else 0
  if q.shape[0] > _BINNED_PHASES:   # traced or not: one program
    ascending = np.sort(grid)   # a window's orders ascend (one group of shared nodes)
    split, tables = _concrete_split(ascending)
    return _binned_search(q, sigma, t, delta, ascending, split, tables,
                          _WINDOW_REFINE_STEPS if steps else 0)
  if not validation.is_concrete((q, sigma, t, delta)):
    return _grid_search(q, sigma, t, delta, orders, split, tables, steps)
  state = _search_start(orders.dtype)
  while state[-1]:
    alphas = _search_orders(state, orders, np)
    eps = _concrete_epsilons(q, sigma, t, delta, alphas, split, tables)
    state = _search_update(state, eps, np.zeros(eps.shape, bool), orders, steps, np)
  eps, best, _ = _search_result(state, np.asarray(delta), np)
  return validation.to_device(eps), validation.to_device(best)


_BOUND_BINS = 64   # bins of phases whose bounds decide which grid orders a long schedule needs
_BINNED_PHASES = _BOUND_BINS   # schedules with more phases: _binned_search
_WINDOW = 16       # orders per step of _binned_search (one group of shared nodes)
_WINDOW_REFINE_STEPS = 4   # its refinement steps (the bracket shrinks 8.5x per step)


def _phase_bins(q, sigma, t):
  """(q, σ, T) of 2 * _BOUND_BINS pairs: the phases sorted by σ and cut into _BOUND_BINS equal
  bins (static sizes), each bin's steps at (its largest q, its smallest σ), then at (its
  smallest q, its largest σ). RDP is non-decreasing in q and non-increasing in σ (Mironov,
  Talwar, Zhang 2019), so the first half bounds the schedule's RDP from above at every
  order and the second from below. Phases with no steps take no part; a bin without steps
  is a neutral pair (q = 1/2, σ = 1, no steps)."""
  p, bins = q.shape[0], _BOUND_BINS
  size = -(-p // bins)
  order = jnp.argsort(sigma, stable=True)
  pad = lambda v, fill: jnp.concatenate([v[order], jnp.full((size * bins - p,), fill, v.dtype)])
  qs, ss, ts = (pad(v, f).reshape(bins, size) for v, f in ((q, 0.0), (sigma, 1.0), (t, 0.0)))
  live = ts > 0
  extreme = lambda v, fn, fill: fn(jnp.where(live, v, fill), axis=1)
  steps = jnp.sum(ts, axis=1)
  empty = steps == 0
  neutral = lambda v, fill: jnp.where(empty, fill, v)
  q_pairs = jnp.concatenate([neutral(extreme(qs, jnp.max, 0.0), 0.5),
                             neutral(extreme(qs, jnp.min, 1.0), 0.5)])
  s_pairs = jnp.concatenate([neutral(extreme(ss, jnp.min, jnp.inf), 1.0),
                             neutral(extreme(ss, jnp.max, 0.0), 1.0)])
  return q_pairs, s_pairs, jnp.concatenate([steps, steps])


@functools.partial(compilation.jit, static_argnames=("split", "refine_steps"))
def _binned_search(q, sigma, t, delta, grid, split, tables, refine_steps):
  """(ε, its order) of a long traced schedule on a concrete grid, in static shapes.

  The bounds of :func:`_phase_bins` give an upper and a lower bound of ε at every grid order
  (one evaluation of the grid for 2 * _BOUND_BINS pairs). Then one loop, each step evaluating
  every phase at _WINDOW orders (one group of shared nodes; a value it cannot certify is
  +inf, never smaller): first the grid orders whose lower bound is below the best ε found,
  _WINDOW at a time, smallest bound first (usually one step: they lie around the optimum),
  then ``refine_steps`` steps of _WINDOW equally spaced orders inside the bracket of the best
  order (:mod:`jaxrdp.accounting.order_search`'s rules). Every order left out has a lower
  bound at least the ε returned, and every ε returned is ε at an evaluated order."""
  k = grid.shape[0]
  grid = jnp.asarray(grid)
  bq, bs, bt = _phase_bins(q, sigma, t)
  rdp, pending = composition.rdp_of_steps(bq, bs, bt, grid, split, tables, fallback=False)
  half = _BOUND_BINS
  lower = _composed_epsilons(grid, jnp.where(pending[half:], 0.0, rdp[half:]), delta)
  usable = jnp.isfinite(grid) & (grid > 1)
  window = sampled_gaussian.OrderSplit(None, (tuple(range(_WINDOW)),))
  fractions = jnp.arange(1, _WINDOW + 1, dtype=grid.dtype) / (_WINDOW + 1)
  big = jnp.finfo(grid.dtype).max

  def body(state):
    best, alpha, lo, hi, known, refined = state
    candidates = ~known & usable & (lower < best)
    searching = jnp.any(candidates)
    key = jnp.where(candidates, jnp.clip(lower, -big, big), jnp.inf)
    pick = jnp.sort(lax.top_k(-key, _WINDOW)[1])   # the grid ascends: so do the orders
    inside = lo + (hi - lo) * fractions
    orders = jnp.where(searching, grid[pick], inside)
    r = composition.rdp_of_steps(q, sigma, t, orders, window, None, fallback=False)[0]
    eps = _composed_epsilons(orders, r, delta)
    eps = jnp.where(searching & ~candidates[pick], jnp.inf, eps)   # fillers of the last window
    j = jnp.argmin(eps)
    better = eps[j] < best
    best, alpha = jnp.where(better, eps[j], best), jnp.where(better, orders[j], alpha)
    start = order_search.bracket_of(grid, usable, alpha)
    points = jnp.concatenate([lo[None], inside, hi[None]])
    m = jnp.argmin(jnp.concatenate([jnp.full((1,), jnp.inf, eps.dtype), eps,
                                    jnp.full((1,), jnp.inf, eps.dtype)]))
    new = points[jnp.maximum(m - 1, 0)], points[jnp.minimum(m + 1, _WINDOW + 1)]
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
  best, alpha, *_ = loops.while_loop(cond, body, state)
  eps = jnp.where(validation.in_domain("delta", delta), best, jnp.nan)
  found = jnp.isfinite(alpha) & (alpha > 1) & jnp.isfinite(best)
  return eps, jnp.where(found, alpha, jnp.nan)




def _concrete_epsilons(q, sigma, t, delta, orders, split, tables):
  """ε (NaN as +inf) at each of the concrete ``orders`` for the schedule: one compiled program
  without the per-order quadrature (:func:`_grid_evaluation`); what it leaves open (rare) is
  filled on the host (:func:`jaxrdp.mechanisms.sampled_gaussian.fill_pending`: compiled only then) and
  converted again."""
  rdp, pending, eps = composition.by_order_parts(_grid_evaluation, (q, sigma, t, delta),
                                                 orders, split, tables)
  if pending.any():
    rdp = sampled_gaussian.fill_pending(rdp, pending, q, sigma, orders, t)
    eps = jax.jit(_composed_epsilons)(orders, rdp, delta)
  return np.asarray(eps)


def _composed_epsilons(orders, rdp, delta):
  eps = epsilon_at_orders(orders, jnp.sum(rdp, axis=0), delta)
  return jnp.where(jnp.isnan(eps), jnp.inf, eps)


@functools.partial(compilation.jit, static_argnames=("split",), work=_work)
def _grid_evaluation(q, sigma, t, delta, orders, split, tables):
  """(RDP per phase and order, which are left open, ε of the composition at each order) for
  a concrete grid: the exact sums and shared nodes, without the per-order quadrature."""
  rdp, pending = composition.rdp_of_steps(q, sigma, t, orders, split, tables, fallback=False)
  return rdp, pending, _composed_epsilons(orders, rdp, delta)   # rdp: only read when filled


@compilation.jit(static_argnames=("refine_order",))
def _search_epsilon(q, sigma, t, delta, grid, refine_order):
  """(ε, the order attaining it, NaN where no order is usable); ε is NaN for δ outside (0, 1)
  (under jit the eager checks do not run)."""
  steps = REFINE_STEPS if refine_order and grid.shape[0] >= 2 else 0
  eps, best = grid_epsilon(lambda alphas: schedule_rdp(q, sigma, t, alphas), grid, delta,
                           refine_steps=steps)
  finite = jnp.isfinite(grid) & (grid > 1)
  usable = finite.any() & jnp.isfinite(best) & (best > 1) & jnp.isfinite(eps)
  eps = jnp.where(validation.in_domain("delta", delta), eps, jnp.nan)
  return eps, jnp.where(usable, best, jnp.nan)


@jax.custom_jvp
def _envelope(eps, best, q, sigma, t, delta):
  """ε minimised over the orders, with the envelope-theorem derivative: the optimal order is
  held fixed, so only ε at that one order is differentiated (the grid's values never enter
  the derivative's graph, and a plain evaluation never computes it)."""
  del best, q, sigma, t, delta
  return eps


def _envelope_jvp(primals, tangents):
  eps, best, *args = primals
  _, _, *dots = tangents
  # Symbolic zeros: only the partial derivatives whose tangents are not known to be zero are
  # computed (jax.grad w.r.t. sigma alone needs one direction of the RDP's derivative, not
  # two, and its graph no batching over directions).
  wanted = tuple(not isinstance(d, jax.custom_derivatives.SymbolicZero) for d in dots)
  if not any(wanted):
    return eps, jnp.zeros_like(eps)
  grads = _concrete_gradient(best, *args, wanted=wanted)
  if grads is None:
    grads = _epsilon_gradient(best, *args, wanted=wanted)
  pairs = tuple((g, d) for g, d, w in zip(grads, dots, wanted) if w)
  return eps, _contract(*zip(*pairs)).astype(eps.dtype)


_envelope.defjvp(_envelope_jvp, symbolic_zeros=True)


@jax.jit
def _contract(grads, dots):
  """Σ <gradient, tangent>: one compiled linear map (eagerly, its transpose under jax.grad is
  one program too, instead of a dozen single operations each compiled on its own)."""
  return sum(jnp.sum(g * d) for g, d in zip(grads, dots))


@functools.partial(compilation.jit, static_argnames=("wanted",))
def _epsilon_gradient(best, q, sigma, t, delta, wanted=(True,) * 4):
  """d ε / d(q, σ, T, δ) at the fixed order ``best`` (any order, traced or not): zero where no
  order is usable, NaN where the RDP's derivative cannot be certified there. Forward mode, as
  :func:`_gradient_at`: phase i's RDP depends on (q_i, σ_i) alone, so the two directions
  (every q, every σ) are two tangents of one pass of
  :func:`jaxrdp.mechanisms.sampled_gaussian.rdp_tangent_at_order` over the phases stacked
  twice; only the ``wanted`` (static) directions are taken."""
  usable = jnp.isfinite(best) & (best > 1)
  alpha = jnp.where(usable, best, 2.0)
  n = q.shape[0]
  one, zero = jnp.ones_like(q), jnp.zeros_like(q)
  directions = [d for d, w in zip(((one, zero), (zero, one)), wanted[:2]) if w] or [(zero, zero)]
  stack = lambda v: jnp.concatenate([v] * len(directions))
  rdp, d_rdp, certified = sampled_gaussian.rdp_tangent_at_order(
      stack(q), stack(sigma), alpha, *(jnp.concatenate(d) for d in zip(*directions)))
  rdp, d_rdp = rdp[:n], iter(d_rdp.reshape(len(directions), n))
  d_q, d_sigma = (next(d_rdp) if w else zero for w in wanted[:2])
  total = jnp.sum(jnp.where(t == 0, 0.0, t * rdp))
  d_total, d_delta = jax.grad(lambda r, d: epsilon_at_orders(alpha[None], r, d)[0],
                              argnums=(0, 1))(total, delta)
  per_phase = lambda v: jnp.where(t == 0, 0.0, d_total * v)
  grads = (per_phase(t * d_q), per_phase(t * d_sigma), per_phase(rdp), d_delta)
  certified = jnp.all(certified | (stack(t) == 0))
  return tuple(jnp.where(usable, jnp.where(certified, g, jnp.nan), 0.0) for g in grads)


def _concrete_gradient(best, q, sigma, t, delta, wanted=(True,) * 4):
  """:func:`_epsilon_gradient` for concrete values at a usable order, through the split of that
  one order (the exact sum at an integer order, shared nodes at a fractional one up to 64,
  whose derivatives come from the same pass), so that the per-order quadrature is compiled
  only when a value is left open; None otherwise."""
  if not validation.is_concrete((best, q, sigma, t, delta)):
    return None
  alpha = np.asarray(best).reshape(1)
  if not (np.isfinite(alpha[0]) and alpha[0] > 1):
    return None
  split, tables = _concrete_split(alpha)
  q, sigma, t, delta = (np.asarray(v) for v in (q, sigma, t, delta))   # as _prepare_gradient's
  return _first_without_fallback(functools.partial(_gradient_at, split=split, wanted=wanted),
                                 alpha, q, sigma, t, delta, tables)


_LIKELY_ORDER = 1.5   # stands for any fractional order up to 64 (one shared-node group)


def _prepare_gradient(q, sigma, t, delta, grid):
  """Where ε is about to be differentiated eagerly (``jax.grad`` or ``jax.jvp`` of
  ``dpsgd_epsilon`` outside ``jax.jit``: some arguments carry tangents, their values are
  concrete), the derivative's program (:func:`_gradient_at`) is prepared before the search
  runs, so that it compiles in the background while the search's programs are traced and
  compiled, instead of after them. Its split depends on the order the search will find: it is
  prepared for a fractional order up to 64, the usual optimum on the default orders (93 of
  their 170 lie in (1, 11), a tenth apart); at another order the derivative compiles its own
  program afterwards, as without this, and this one is not used (the derivative is the
  same either way: the order is only known, and used, after the search). A traced ``grid``
  takes the traced search and its own derivative: nothing is prepared then."""
  wanted = tuple(isinstance(v, jax.core.Tracer) for v in (q, sigma, t, delta))
  if not any(wanted) or not validation.is_concrete(grid):
    return
  values = tuple(lax.stop_gradient(v) for v in (q, sigma, t, delta))
  if not validation.is_concrete(values):   # traced (jax.jit, jax.vmap): one graph, nothing to do
    return
  q, sigma, t, delta = (np.asarray(v) for v in values)
  alpha = np.full(1, _LIKELY_ORDER, q.dtype)
  split, tables = _concrete_split(alpha)
  _gradient_at.prepare(alpha, q, sigma, t, delta, tables, False, split=split, wanted=wanted)


@functools.partial(compilation.jit, static_argnames=("split", "fallback", "wanted"),
                   work=lambda arguments: arguments["q"].size)
def _gradient_at(alpha, q, sigma, t, delta, tables, fallback, split, wanted=(True,) * 4):
  """(d ε / d(q, σ, T, δ) at the one order ``alpha`` with its ``split``, open). Forward mode:
  phase i's RDP depends on (q_i, σ_i) alone, so two tangents (every q, every σ) give all its
  partial derivatives, whatever the number of phases, and the graph holds no transpose.
  ``wanted`` (static): which of the four are needed; only those directions are taken (the
  others are returned as zeros)."""
  def rdp_of(q_, s_):
    out = composition.rdp_of_steps(q_, s_, jnp.ones_like(q_), alpha, split, tables,
                                            fallback=fallback)
    rdp, pending = (out, jnp.zeros(out.shape, bool)) if fallback else out
    return rdp[:, 0], jnp.any(pending)
  one, zero = jnp.ones_like(q), jnp.zeros_like(q)
  directions = [d for d, w in zip(((one, zero), (zero, one)), wanted[:2]) if w]
  if len(directions) == 2:
    rdp, d_rdp, is_open = jax.vmap(
        lambda dq, ds: jax.jvp(rdp_of, (q, sigma), (dq, ds), has_aux=True),
        out_axes=(None, 0, None))(jnp.stack([one, zero]), jnp.stack([zero, one]))
  elif directions:
    rdp, d_rdp, is_open = jax.jvp(rdp_of, (q, sigma), directions[0], has_aux=True)
    d_rdp = [d_rdp]
  else:
    (rdp, is_open), d_rdp = rdp_of(q, sigma), []
  d_rdp = iter(d_rdp)
  d_q, d_sigma = (next(d_rdp) if w else zero for w in wanted[:2])
  total = jnp.sum(jnp.where(t == 0, 0.0, t * rdp))
  d_total, d_delta = jax.grad(lambda r, d: epsilon_at_orders(alpha, r, d)[0], argnums=(0, 1))(total, delta)
  per_phase = lambda v: jnp.where(t == 0, 0.0, d_total * v)
  return (per_phase(t * d_q), per_phase(t * d_sigma), per_phase(rdp), d_delta), is_open


def _safe_boundary(g, s0, s_min, s_max):
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
  a flag (a value it used was left open, see :func:`_grid_values`); ``open``: any flag.
  The steps are :func:`_boundary_point` and :func:`_boundary_update`, which
  :func:`_host_boundary` runs from the host instead.
  """
  def body(state):
    x = _boundary_point(state, s0, s_min, s_max, jnp)
    return _boundary_update(state, x, *g(x), s_min, s_max, jnp)
  state = loops.while_loop(lambda st: ~st[5] & (st[7] < _BOUNDARY_STEPS), body,
                         jax.tree_util.tree_map(jnp.asarray, _boundary_start(s0.dtype)))
  return state[1], state[6], state[8]


_BOUNDARY_STEPS = 200


def _boundary_start(dtype):
  """The state of :func:`_safe_boundary`: lo, hi, the interpolation weights at lo and hi,
  which end moved last, done, found, count, open."""
  inf = np.asarray(np.inf, dtype)
  false, zero = np.asarray(False), np.asarray(0, np.int32)
  return (-inf, inf, inf, -inf, zero, false, false, zero, false)


def _boundary_point(state, s0, s_min, s_max, xp):
  """The next point :func:`_safe_boundary` evaluates (``xp``: jax.numpy or numpy)."""
  lo, hi, f_lo, f_hi = state[:4]
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


def _boundary_update(state, x, gx, open_x, s_min, s_max, xp):
  """The state of :func:`_safe_boundary` after g(x) = gx (open_x: it used an open value)."""
  lo, hi, f_lo, f_hi, side, _, _, count, is_open = state
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
  side = xp.where(ok, -1, 1).astype(np.int32)
  return (lo, hi, new_f_lo, new_f_hi, side, done, found, count + 1, is_open | open_x)


def _host_boundary(g, s0, s_min, s_max, dtype):
  """:func:`_safe_boundary` with its steps run from the host: ``g`` (a host function of a
  NumPy scalar) evaluates a compiled program, the bracket's logic is NumPy. (s, found)."""
  state = _boundary_start(dtype)
  s0 = np.asarray(s0, dtype)
  while not state[5] and state[7] < _BOUNDARY_STEPS:
    x = _boundary_point(state, s0, s_min, s_max, np)
    state = _boundary_update(state, x, np.asarray(g(x), dtype), False, s_min, s_max, np)
  return state[1], state[6]


def _first_without_fallback(fn, *args):
  """fn(*args, fallback) for a function that returns (result, open): for concrete arguments
  first without the per-order quadrature (rarely needed, so rarely compiled), again with it
  only when a value was left open; inside a graph with it at once."""
  if validation.is_concrete(args):
    result, is_open = fn(*args, False)
    if not bool(is_open):
      return result
  return fn(*args, True)[0]


def calibrate_noise_multiplier(target_epsilon: jax.typing.ArrayLike, delta: jax.typing.ArrayLike,
                               sampling_rate: jax.typing.ArrayLike, steps: jax.typing.ArrayLike, *,
                               orders: jax.typing.ArrayLike | None = None,
                               accountant: str = "rdp") -> jax.Array:
  r"""Smallest noise multiplier σ in [1e-4, 1e8] whose ε is at most ``target_epsilon`` (safe side).

  ε is non-increasing in σ; the answer is found in log σ on the grid-order ε (so that it is
  reproducible with :func:`jaxrdp.compute_epsilon` on the same orders) by a bracketed,
  safeguarded regula falsi (Illinois) to a bracket of 1e-9 relative (typically ~10
  evaluations), and the returned σ is always a point where ε(σ) ≤ target was checked.
  ``sampling_rate`` and ``steps`` may be schedules (1-D); σ is then one multiplier for all
  phases. Jittable (and vmappable over targets). Eagerly, a target that no σ reaches raises
  ``ValueError``; under jit it gives NaN.

  Args:
    target_epsilon: the ε to reach, > 0.
    delta: δ in (0, 1).
    sampling_rate: q in [0, 1], a scalar or a 1-D schedule (one entry per phase).
    steps: steps ≥ 0, a scalar or a 1-D schedule (broadcasting with ``sampling_rate``).
    orders: the order grid (default :data:`jaxrdp.DEFAULT_ORDERS`).
    accountant: ``"rdp"`` (default) or ``"pld"`` (:func:`jaxrdp.pld_epsilon`: tight, so a
      smaller σ for the same guarantee; float64, eager calls only). The PLD search starts
      from the RDP answer (safe for PLD too) and returns a σ whose PLD ε, as
      ``dpsgd_epsilon(..., accountant="pld")`` computes it, was checked to be ≤ the target,
      within 1e-7 relative of the smallest such σ.

  Returns:
    σ, a scalar in the inputs' dtype (NaN under jit where no σ ≤ 1e8 reaches the target or
    an argument lies outside its range).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value), shapes that do not fit (named, with the shapes: the target and δ are scalars),
      or a target that no σ ≤ 1e8 reaches.
  """
  validation.check_all(target_epsilon=target_epsilon, sampling_rate=sampling_rate, steps=steps,
                       delta=delta)
  validation.check_scalar(target_epsilon=target_epsilon, delta=delta)
  validation.check_schedule(sampling_rate=sampling_rate, steps=steps)
  if use_pld(accountant, orders=orders):
    safe = calibrate_noise_multiplier(target_epsilon, delta, sampling_rate, steps)
    return _pld_calibration("noise_multiplier", target_epsilon, delta, safe,
                            sampling_rate=sampling_rate, steps=steps)
  q, _, t = schedule_phases(sampling_rate, 1.0, steps)
  grid = order_grid(orders, q.dtype)
  valid = validation.all_in_domains(target_epsilon=target_epsilon, delta=delta,
                                    sampling_rate=q, steps=t, orders=grid)
  target, delta = (validation.to_device(v, q.dtype) for v in (target_epsilon, delta))
  result = _calibrated(calibrate_sigma_unchecked, _calibrate_sigma_on_grid, target, delta, q, t, grid)
  if validation.is_concrete(result) and np.isnan(np.asarray(result)):
    raise ValueError(f"target_epsilon={float(target_epsilon)} is not reachable with any noise "
                     "multiplier up to 1e8 for this schedule and delta.")
  # Under jit, NaN for an argument outside its domain: the search would otherwise return an
  # end of its bracket or a σ for a meaningless target (σ = 1e-4 for δ > 1), a plausible
  # and unsafe answer.
  return validation.nan_where_invalid(valid, result)


def _calibrated(on_any_grid, on_concrete_grid, *args):
  """A calibration's search: ``on_concrete_grid`` (every order through the grid's split; the
  per-order quadrature only if a value is left open) where the grid (the last argument) is
  concrete, ``on_any_grid`` (branch and bound) where it is traced."""
  split = _concrete_split(args[-1])
  if split is None:
    return on_any_grid(*args)
  if validation.is_concrete(args):
    return _host_calibration(on_concrete_grid, *args)
  return _first_without_fallback(functools.partial(on_concrete_grid, split=split[0]), *args, split[1])


def _host_calibration(on_concrete_grid, target, delta, fixed, t, grid):
  """A calibration with concrete arguments: the bracket's steps run from the host
  (:func:`_host_boundary`), each ε one call of the program that dpsgd_epsilon's order search
  runs (:func:`_concrete_epsilons`, the grid with its slots; open values filled on the host),
  so that no search loop is compiled around the kernel and the two share one compilation.
  The same searches as :func:`_sigma_search` and :func:`_q_search`."""
  orders, split, tables = _with_slots(grid)
  k = grid.shape[0]
  dtype = fixed.dtype
  target_ = float(target)
  if on_concrete_grid is _calibrate_sigma_on_grid:
    value_of = lambda s: np.exp(s).astype(dtype)   # σ = e^s
    args_of = lambda v: (fixed, np.full(fixed.shape, v, dtype))   # host arrays, as schedule_phases
    s0, s_min, s_max = 0.0, math.log(_SIGMA_MIN), math.log(_SIGMA_MAX)
  else:
    value_of = lambda s: np.exp(-s).astype(dtype)   # q = e^-s
    args_of = lambda v: (np.full(fixed.shape, v, dtype), fixed)
    s0, s_min, s_max = math.log(100.0), 0.0, -math.log(_Q_MIN)

  def g(s):   # log(ε/target), non-increasing in s
    eps = _concrete_epsilons(*args_of(value_of(s)), t, delta, orders, split, tables)[:k]
    with np.errstate(divide="ignore"):
      return np.log(np.min(eps) / target_)
  s, found = _host_boundary(g, s0, s_min, s_max, dtype)
  return validation.to_device(value_of(s) if found else np.nan, dtype)


def _concrete_split(grid):
  """(split, tables) of a concrete grid (:func:`jaxrdp.mechanisms.sampled_gaussian.order_split`), None for
  a traced one."""
  split = sampled_gaussian.order_split(grid)
  return None if split is None else (split, sampled_gaussian.order_tables(grid, split))


def _sigma_search(target, delta, q, t, grid_epsilon_of):
  """The safe-side σ search on ε(σ) = grid_epsilon_of(σ) (returning (ε, open))."""
  def g(log_sigma):   # log(ε/target), non-increasing in σ
    eps, is_open = grid_epsilon_of(jnp.broadcast_to(jnp.exp(log_sigma), q.shape))
    return jnp.log(eps / target), is_open
  log_min, log_max = math.log(_SIGMA_MIN), math.log(_SIGMA_MAX)
  s, found, is_open = _safe_boundary(g, jnp.zeros((), q.dtype), log_min, log_max)
  return jnp.where(found, jnp.exp(s), jnp.nan), is_open


@compilation.jit
def calibrate_sigma_unchecked(target, delta, q, t, grid):
  """σ search with the grid ε of the branch-and-bound search (any grid, also traced)."""
  def eps_of(sigma):
    return grid_epsilon(lambda alphas: schedule_rdp(q, sigma, t, alphas), grid, delta)[0], False
  return _sigma_search(target, delta, q, t, eps_of)[0]


def _search_work(arguments):
  """Elements of one ε evaluation of a calibration: phases times orders (not the tables)."""
  phases = arguments["q"].size if "q" in arguments else arguments["sigma"].size
  return phases * arguments["grid"].size


@functools.partial(compilation.jit, static_argnames=("split", "fallback"), work=_search_work)
def _calibrate_sigma_on_grid(target, delta, q, t, grid, tables, fallback, split):
  """(σ, open): σ search with every order of a concrete grid evaluated through its ``split``
  (:func:`_grid_values`; the same ε as the branch and bound)."""
  def eps_of(sigma):
    eps, pending = _grid_values(q, sigma, t, delta, grid, split, tables, fallback)
    return jnp.min(eps), jnp.any(pending)
  return _sigma_search(target, delta, q, t, eps_of)


def calibrate_sampling_rate(target_epsilon: jax.typing.ArrayLike, delta: jax.typing.ArrayLike,
                            noise_multiplier: jax.typing.ArrayLike, steps: jax.typing.ArrayLike, *,
                            orders: jax.typing.ArrayLike | None = None,
                            accountant: str = "rdp") -> jax.Array:
  r"""Largest sampling rate q in (0, 1] whose ε is at most ``target_epsilon`` (safe side).

  ε is non-decreasing in q; bracketed regula falsi in log q on the grid-order ε, to a bracket
  of 1e-9 relative; the q returned was checked to meet the target. Returns 1 when even q = 1
  meets the target. Eagerly, a target no q > 1e-12 reaches raises ``ValueError``; NaN under jit.

  Args:
    target_epsilon: the ε to reach, > 0.
    delta: δ in (0, 1).
    noise_multiplier: σ ≥ 0, a scalar or a 1-D schedule (one entry per phase).
    steps: steps ≥ 0, a scalar or a 1-D schedule (broadcasting with ``noise_multiplier``).
    orders: the order grid (default :data:`jaxrdp.DEFAULT_ORDERS`).
    accountant: ``"rdp"`` (default) or ``"pld"`` (tight; float64, eager calls only; the q
      returned was checked with ``dpsgd_epsilon(..., accountant="pld")``, within 1e-7
      relative of the largest such q).

  Returns:
    q, a scalar in the inputs' dtype (NaN under jit where no q > 1e-12 reaches the target or
    an argument lies outside its range).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value), shapes that do not fit (named, with the shapes: the target and δ are scalars),
      or a target that no q > 1e-12 reaches.
  """
  validation.check_all(target_epsilon=target_epsilon, noise_multiplier=noise_multiplier,
                       steps=steps, delta=delta)
  validation.check_scalar(target_epsilon=target_epsilon, delta=delta)
  validation.check_schedule(noise_multiplier=noise_multiplier, steps=steps)
  if use_pld(accountant, orders=orders):
    safe = calibrate_sampling_rate(target_epsilon, delta, noise_multiplier, steps)
    return _pld_calibration("sampling_rate", target_epsilon, delta, safe,
                            noise_multiplier=noise_multiplier, steps=steps)
  _, sigma, t = schedule_phases(0.5, noise_multiplier, steps)
  grid = order_grid(orders, sigma.dtype)
  valid = validation.all_in_domains(target_epsilon=target_epsilon, delta=delta,
                                    noise_multiplier=sigma, steps=t, orders=grid)
  target, delta = (validation.to_device(v, sigma.dtype) for v in (target_epsilon, delta))
  result = _calibrated(_calibrate_q, _calibrate_q_on_grid, target, delta, sigma, t, grid)
  if validation.is_concrete(result) and np.isnan(np.asarray(result)):
    raise ValueError(f"target_epsilon={float(target_epsilon)} is not reachable with any sampling "
                     "rate >= 1e-12 for this noise multiplier, step count and delta.")
  # Under jit, NaN for an argument outside its domain: the search would otherwise return an
  # end of its bracket (q = 1 for δ > 1), a plausible answer.
  return validation.nan_where_invalid(valid, result)


def _q_search(target, delta, sigma, grid_epsilon_of):
  """The safe-side q search on ε(q) = grid_epsilon_of(q) (returning (ε, open))."""
  def g(neg_log_q):   # log(ε/target), non-increasing in -log q
    eps, is_open = grid_epsilon_of(jnp.broadcast_to(jnp.exp(-neg_log_q), sigma.shape))
    return jnp.log(eps / target), is_open
  s, found, is_open = _safe_boundary(g, jnp.asarray(math.log(100.0), sigma.dtype), 0.0,
                                     -math.log(_Q_MIN))
  return jnp.where(found, jnp.exp(-s), jnp.nan), is_open


@compilation.jit
def _calibrate_q(target, delta, sigma, t, grid):
  """q search with the grid ε of the branch-and-bound search (any grid, also traced)."""
  def eps_of(q):
    return grid_epsilon(lambda alphas: schedule_rdp(q, sigma, t, alphas), grid, delta)[0], False
  return _q_search(target, delta, sigma, eps_of)[0]


@functools.partial(compilation.jit, static_argnames=("split", "fallback"), work=_search_work)
def _calibrate_q_on_grid(target, delta, sigma, t, grid, tables, fallback, split):
  """(q, open): q search with every order of a concrete grid evaluated through its split."""
  def eps_of(q):
    eps, pending = _grid_values(q, sigma, t, delta, grid, split, tables, fallback)
    return jnp.min(eps), jnp.any(pending)
  return _q_search(target, delta, sigma, eps_of)


def calibrate_steps(target_epsilon: jax.typing.ArrayLike, delta: jax.typing.ArrayLike,
                    sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike, *,
                    max_steps: int = 10 ** 9,
                    orders: jax.typing.ArrayLike | None = None,
                    accountant: str = "rdp") -> jax.Array:
  r"""Largest whole number of steps whose ε is at most ``target_epsilon`` (safe side).

  ε is non-decreasing in the step count; integer bisection on [0, max_steps]. Returns 0 when
  not even one step meets the target (eagerly: ``ValueError``) and ``max_steps`` when all do.
  Constant (scalar) ``sampling_rate`` and ``noise_multiplier`` only.

  Args:
    target_epsilon: the ε to reach, > 0.
    delta: δ in (0, 1).
    sampling_rate: q in [0, 1], a scalar.
    noise_multiplier: σ ≥ 0, a scalar.
    max_steps: the largest step count searched, ≥ 1 (static).
    orders: the order grid (default :data:`jaxrdp.DEFAULT_ORDERS`).
    accountant: ``"rdp"`` (default) or ``"pld"`` (tight; float64, eager calls only; the
      count returned was checked with ``dpsgd_epsilon(..., accountant="pld")``).

  Returns:
    The step count, a scalar in the inputs' dtype (under jit: 0 where not even one step
    meets the target, NaN where an argument lies outside its range).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value), an argument that is not a scalar (named, with its shape), or a target that not
      even one step meets.
  """
  validation.check_all(target_epsilon=target_epsilon, sampling_rate=sampling_rate,
                       noise_multiplier=noise_multiplier, delta=delta)
  validation.check_scalar(target_epsilon=target_epsilon, delta=delta,
                          sampling_rate=sampling_rate, noise_multiplier=noise_multiplier)
  max_steps = validation.check_int("max_steps", max_steps, lo=1)
  if use_pld(accountant, orders=orders):
    try:
      safe = calibrate_steps(target_epsilon, delta, sampling_rate, noise_multiplier,
                             max_steps=max_steps)
    except ValueError:   # not one step under RDP; the tighter PLD may still allow some
      safe = 0.0
    steps = _pld_calibration("steps", target_epsilon, delta, safe, sampling_rate=sampling_rate,
                             noise_multiplier=noise_multiplier, max_steps=max_steps)
    if float(steps) == 0:
      raise ValueError(f"target_epsilon={float(target_epsilon)} is not reachable even with one "
                       "step.")
    return steps
  q, sigma, _ = schedule_phases(sampling_rate, noise_multiplier, 1.0)
  grid = order_grid(orders, q.dtype)
  valid = validation.all_in_domains(target_epsilon=target_epsilon, delta=delta,
                                    sampling_rate=q, noise_multiplier=sigma, orders=grid)
  split = _concrete_split(grid) or (None, None)
  if split[0] is not None and validation.is_concrete((q, sigma)):
    # The per-step RDP through the grid's split (the per-order quadrature only if needed).
    per_step = composition.rdp_curve(q, sigma, 1.0, grid)
  else:
    per_step = schedule_rdp(q, sigma, jnp.ones_like(q), grid)
  lo = _calibrate_steps(jnp.asarray(target_epsilon, q.dtype), jnp.asarray(delta, q.dtype),
                        per_step.reshape(grid.shape), grid, float(max_steps))
  if validation.is_concrete(lo) and float(lo) == 0:
    raise ValueError(f"target_epsilon={float(target_epsilon)} is not reachable even with one step.")
  # Under jit, NaN for an argument outside its domain (the bisection alone would say 0 steps,
  # which reads as "not even one step meets the target").
  return validation.nan_where_invalid(valid, lo)


@compilation.jit(static_argnames=("max_steps",))
def _calibrate_steps(target, delta, per_step, grid, max_steps):
  ok = lambda n: compute_epsilon(grid, per_step * n, delta)[0] <= target

  def body(_, bracket):
    lo, hi = bracket  # ok(lo) holds, ok(hi) does not (or hi = max + 1)
    mid = jnp.floor((lo + hi) / 2)
    good = ok(mid)
    return jnp.where(good, mid, lo), jnp.where(good, hi, mid)
  lo, hi = jnp.asarray(0.0, per_step.dtype), jnp.asarray(max_steps + 1, per_step.dtype)
  lo, _ = loops.fori_loop(0, 64, body, (lo, hi))
  return lo


# ---------------------------------------------------------------------------------------------
# Calibration with the PLD accountant.


def _pld_calibration(unknown, target, delta, safe, max_steps=None, **fixed):
  """The calibration of ``unknown`` (noise_multiplier, sampling_rate or steps) on the PLD ε.

  ``safe`` is the RDP calibration's answer: RDP's ε bounds the PLD's (both are upper bounds of
  the same ε, and the PLD's is the tight one), so it meets the target under PLD too and is
  one end of the bracket. The other end is found by steps of 25 % away from it until the
  target is missed (PLD typically needs 5–10 % less noise than RDP, so the bracket is narrow
  and its grid often has the rounded sizes of the answer's: fewer compilations). One grid, sized for the widest schedule of the bracket, serves every evaluation
  of the search (one compiled program: the value being calibrated is an argument, not a
  shape); the search is the safe-side regula falsi of :func:`_host_boundary` in log σ or
  log q, and a bisection for the step count. The answer is then checked with the grid that
  ``dpsgd_epsilon(..., accountant="pld")`` sizes for it, and moved toward ``safe`` by 1e-7
  relative (one step) until it meets the target there."""
  values = {k: np.asarray(v, np.float64) for k, v in fixed.items()}
  if not validation.is_concrete((target, delta, safe, values)):
    raise ValueError("calibration with accountant='pld' runs eagerly (its grid sizes depend on "
                     "the values); call it outside jax.jit.")
  target, delta, safe = float(target), float(delta), float(safe)
  as_schedule = {"noise_multiplier": lambda v: (values["sampling_rate"], v, values["steps"]),
                 "sampling_rate": lambda v: (v, values["noise_multiplier"], values["steps"]),
                 "steps": lambda v: (values["sampling_rate"], values["noise_multiplier"], v)}[unknown]
  # ε grows with q and T and falls with σ: "outward" is the direction that raises ε.
  outward = {"noise_multiplier": 0.8, "sampling_rate": 1.25, "steps": 1.25}[unknown]
  limit = {"noise_multiplier": _SIGMA_MIN, "sampling_rate": 1.0,
           "steps": float(max_steps or 0)}[unknown]
  clip = min if outward > 1 else max

  def epsilon(v, grid=None):
    q, sigma, t = pld.checked_phases(*as_schedule(np.float64(v)), "calibration with accountant='pld'")
    return float(pld.pld_epsilon_unchecked(q, sigma, t, np.float64(delta),
                                           pld.grid_of(q, sigma, t, grid)))

  far = safe
  while True:   # the bracket's far end: the first value (steps of 25 %) that misses the target
    nxt = clip(far * outward, limit)
    if unknown == "steps":   # whole counts, at least one more (1.25·far rounds down to far)
      nxt = float(min(max(math.floor(nxt), far + 1), limit))
    grid = pld.grid_of(*pld.checked_phases(*as_schedule(np.float64(nxt)), "calibration"), None)
    if nxt == far or epsilon(nxt, grid) > target:
      break
    far = nxt
  if nxt == far:   # the limit itself meets the target (q = 1, max_steps, σ = 1e-4)
    return validation.to_device(far, np.float64)
  near, far = far, nxt
  if unknown == "steps":
    lo, hi = near, far   # ok(lo), not ok(hi)
    while hi - lo > 1:
      mid = math.floor((lo + hi) / 2)
      lo, hi = (mid, hi) if epsilon(mid, grid) <= target else (lo, mid)
    answer, step = lo, lambda v: v - 1
  else:
    sign = 1.0 if unknown == "noise_multiplier" else -1.0   # s grows toward "ok"
    g = lambda s: math.log(epsilon(math.exp(sign * s), grid) / target)
    ends = sorted((sign * math.log(near), sign * math.log(far)))
    s, found = _host_boundary(g, np.float64(sign * math.log(near)), ends[0], ends[1], np.float64)
    answer = math.exp(sign * float(s)) if found else near
    step = lambda v: v * (1 + 1e-7) if unknown == "noise_multiplier" else v * (1 - 1e-7)
  for _ in range(64):   # the check with dpsgd_epsilon's own grid for the answer
    if epsilon(answer) <= target:
      return validation.to_device(answer, np.float64)
    answer = step(answer)
  return validation.to_device(safe, np.float64)
