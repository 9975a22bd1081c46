r"""ε of a DP-SGD training schedule, differentiable.

A schedule is a sequence of phases; phase i runs ``steps[i]`` steps of the Poisson-sampled
Gaussian mechanism at ``sampling_rate[i]`` and ``noise_multiplier[i]``. RDP composes by
addition (Mironov 2017, Prop. 1), so the schedule's RDP at order α is
:math:`\sum_i T_i\,\varepsilon_{q_i,\sigma_i}(\alpha)`, and ε is its conversion to
(ε, δ)-DP (:func:`jaxrdp.compute_epsilon`, minimised over the orders).

Optimal order: after the grid, the order is refined continuously (equally spaced orders in
the bracket around the best grid order, step by step; the conversion is smooth and unimodal
in α there). The result is the minimum of the grid value and the refined value: never looser
than the grid, and never below the true RDP-based value, since every order gives a valid
bound. Gradients follow the envelope theorem: the optimal order is held fixed (exact, since
ε is minimised over it; :mod:`jaxrdp.accounting.envelope`).

How it is evaluated: on a concrete grid (the default) every grid order goes through the exact
sums and the shared nodes (:func:`jaxrdp.mechanisms.sampled_gaussian.log_a_and_rdp_at_orders`),
and each refinement step evaluates one row of shared nodes (:func:`_slot_width`: 32 orders
per step on the default grid; three steps where ε is close to a parabola around its minimum,
at most six: :func:`jaxrdp.accounting.order_search.model_windows`). For concrete inputs the steps run from the host
(:func:`jaxrdp.accounting.order_search.search_update`, the grid and the refinement's
slots in one program); for traced ones in one loop that evaluates one row of shared nodes
per step, the grid's rows first (:func:`_grid_search`; the exact sums are evaluated once, before it): the
same orders in the same rows, so the same ε. Long schedules (more than 64
phases), traced or not, evaluate each phase only at the grid orders that bounds from the
phases binned by σ leave in play or, refining, in two windows of 8 orders placed by a
stand-in schedule and a model of log R (:mod:`jaxrdp.accounting.long_schedules`: one program
with static shapes). Calibrations (:mod:`jaxrdp.accounting.calibration`) run
their safe-side search on the full evaluation, and the envelope gradient is taken at the one
optimal order: through its own split for concrete values, and for traced ones (up to 64
phases) in the search's own loop, whose rows then carry the derivative
(:func:`_searched_epsilon`: a derivative's graph holds one copy of the kernel). The per-order quadrature is compiled only when
something is left open (then it fills just those values). A traced grid uses the branch and
bound of :mod:`jaxrdp.accounting.order_search` with the per-order quadrature and its own
refinement (steps of 8 orders): the same ε to ~1e-11.
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
from jaxrdp.accounting import samplers
from jaxrdp.accounting.order_search import grid_epsilon
from jaxrdp.accounting.conversion import epsilon_at_orders
from jaxrdp.accounting.conversion import composed_epsilons as _composed_epsilons
from jaxrdp.accounting.long_schedules import (_BINNED_PHASES, _WINDOW_REFINE_STEPS,
                                              _binned_search, grid_ends)
from jaxrdp.accounting.envelope import (_concrete_split, _contract, _envelope,
                                        _epsilon_gradient, _prepare_gradient, gradient_at_order,
                                        _rdp_and_derivatives, _search_gradient)
from jaxrdp.accounting.orders import DEFAULT_ORDERS

REFINE_STEPS = 6   # the branch and bound's refinement steps of order_search.BATCH = 8 orders
                  # (the bracket shrinks 4.5x per step); a concrete grid's: refinement_steps


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


@compilation.on_host
def dpsgd_epsilon(sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
                  steps: jax.typing.ArrayLike, delta: jax.typing.ArrayLike, *,
                  orders: jax.typing.ArrayLike | None = None,
                  refine_order: bool = True, method: str = "improved",
                  accountant: str = "rdp", pld_grid: pld.PldGrid | None = None,
                  sampling: str = "poisson", neighboring: str | None = None,
                  dataset_size: int | None = None, max_batch_size=None) -> jax.Array:
  r"""ε of DP-SGD, for a constant or phased schedule; Poisson sampling unless ``sampling`` says.

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
    sampling: how the batches are drawn (:mod:`jaxrdp.accounting.samplers`): ``"poisson"``
      (the default; add/remove neighbours), ``"fixed"`` (batches of exactly q·n examples drawn
      without replacement; replace-one neighbours, so the sum of clipped gradients moves by
      up to 2C: RDP of Wang, Balle, Kasiviswanathan 2019, Thm. 27, at σ/2, the best grid
      order; RDP accountant only) or ``"shuffle"`` (a permutation per epoch cut into batches of
      q·n; replace-one: one Gaussian mechanism at σ/2 per epoch an example takes part in, no
      amplification claimed; both accountants), or ``"truncated_poisson"`` (Poisson batches
      of more than ``max_batch_size`` examples cut to that many, chosen uniformly, as
      :func:`jaxrdp.poisson_sample` draws them: tight with ``accountant="pld"``; RDP adds the
      overflows' probability to δ, see :mod:`jaxrdp.accounting.samplers`).
    neighboring: ``"add_or_remove"`` or ``"replace_one"``: the relation ε is about, to state
      it explicitly (the default is the sampler's; the other is a ``ValueError``).
    dataset_size: n, with ``sampling="shuffle"`` (epochs have ⌊n/B⌋ steps of B = q·n
      examples, q·n a whole number) or ``"truncated_poisson"`` (required there, and only
      there).
    max_batch_size: B, the largest batch of ``"truncated_poisson"`` (an int, or one per
      phase; required there, and only there).

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
  samplers.check_sampling(sampling, neighboring, dataset_size, accountant, max_batch_size,
                          truncation=True)
  if sampling == "shuffle":
    samplers.check_batches(sampling_rate, dataset_size)
  if use_pld(accountant, orders=orders, refine_order=refine_order, method=method,
              pld_grid=pld_grid):
    if sampling == "truncated_poisson":
      return pld.pld_epsilon(sampling_rate, noise_multiplier, steps, delta, pld_grid=pld_grid,
                             dataset_size=dataset_size, max_batch_size=max_batch_size)
    if sampling == "shuffle":   # the Gaussian mechanisms of the epochs (q = 1)
      q, sigma, t = schedule_phases(sampling_rate, noise_multiplier, steps)
      valid = samplers.whole_batches(q, dataset_size)
      eps = pld.pld_epsilon(*samplers.shuffle_schedule(q, sigma, t, dataset_size), delta,
                            pld_grid=pld_grid)
      return validation.nan_where_invalid(valid, eps)
    return pld.pld_epsilon(sampling_rate, noise_multiplier, steps, delta, pld_grid=pld_grid)
  q, sigma, t = schedule_phases(sampling_rate, noise_multiplier, steps)
  grid = order_grid(orders, q.dtype)
  # Under jit the checks above do not see the values: an argument outside its domain gives
  # NaN (the RDP of an invalid q or σ is NaN, which the order search would skip as no
  # information and report +inf or the other phases' ε).
  valid = validation.all_in_domains(sampling_rate=q, noise_multiplier=sigma, steps=t,
                                    delta=delta, orders=grid)
  delta = validation.to_device(delta, q.dtype)
  if sampling == "fixed":
    eps = samplers.fixed_epsilon(q, sigma, t, delta, grid, n_max=samplers.max_order(grid),
                                 method=method)
    return validation.nan_where_invalid(valid, eps)
  if sampling == "shuffle":
    valid = validation.combine_masks(valid, samplers.whole_batches(q, dataset_size))
    eps = samplers.shuffle_epsilon(q, sigma, t, delta, grid, dataset_size=dataset_size,
                                   method=method, refine=bool(refine_order))
    return validation.nan_where_invalid(valid, eps)
  if method == "classic":
    epsilon_at = lambda d: jnp.min(epsilon_at_orders(
        grid, jnp.sum(composition.rdp_curve(q, sigma, t, grid), axis=0), d, method))
  else:
    epsilon_at = lambda d: dpsgd_epsilon_unchecked(q, sigma, t, d, grid, refine_order)
  if sampling == "truncated_poisson":
    if q.shape[0] != np.size(max_batch_size) and np.size(max_batch_size) != 1:
      raise ValueError(f"max_batch_size must be an int or one per phase ({q.shape[0]}); got "
                       f"{np.size(max_batch_size)} values.")
    overflow = samplers.overflow_mass(q, t, dataset_size, max_batch_size)
    eps = samplers.additive_epsilon(epsilon_at, delta, overflow)
  else:
    eps = epsilon_at(delta)
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
  spec = _traced_search(sg(q), sg(sigma), sg(t), sg(delta), grid, refine_order)
  if spec is not None:   # the search and the gradient in one loop (_searched_epsilon)
    return _searched_epsilon(q, sigma, t, delta, spec)
  _prepare_gradient(q, sigma, t, delta, grid)
  eps, best = _epsilon_and_order(sg(q), sg(sigma), sg(t), sg(delta), grid, refine_order)
  return _envelope(eps, best, q, sigma, t, delta)


def _epsilon_and_order(q, sigma, t, delta, grid, refine_order):
  """(ε, its order): :func:`_concrete_epsilon` where the grid is concrete, else the branch and
  bound of :func:`_search_epsilon`."""
  found = _concrete_epsilon(q, sigma, t, delta, grid, refine_order)
  return found if found is not None else _search_epsilon(q, sigma, t, delta, grid, refine_order)


def epsilon_and_gradient(q, sigma, t, delta, grid, refine_order, wanted):
  """(ε, (dε/dq, dε/dσ, dε/dT, dε/dδ)) of :func:`dpsgd_epsilon_unchecked` for concrete phases
  and a concrete grid, the derivatives along the ``wanted`` directions (static; the others
  are not computed): the order search and the envelope gradient at the order found, the two
  calls :func:`_envelope`'s rule makes. ``jax.value_and_grad`` of dpsgd_epsilon_unchecked
  computes the same numbers through JAX's eager differentiation, whose per-operation dispatch
  costs ~4 ms more per call: a host loop that takes many derivatives (the eager
  :func:`jaxrdp.optimize_schedule`) calls this instead."""
  eps, best = _epsilon_and_order(q, sigma, t, delta, grid, refine_order)
  return eps, gradient_at_order(best, q, sigma, t, delta, wanted, eps=eps)


def _traced_search(q, sigma, t, delta, grid, refine_order):
  """(grid as a tuple, dtype name): where :func:`_concrete_epsilon` would run
  :func:`_grid_search` or :func:`_binned_search` on traced values with refinement (a concrete
  grid split into exact sums and shared nodes); None otherwise."""
  if (validation.is_concrete((q, sigma, t, delta)) or not validation.is_concrete(grid)
      or not refine_order or grid.shape[0] < 2 or sampled_gaussian.order_split(grid) is None):
    return None
  return tuple(float(a) for a in np.asarray(grid)), np.dtype(grid.dtype).name


@functools.lru_cache(maxsize=64)
def _search_arguments(spec):
  """(grid, split, tables and brackets, refinement steps) of :func:`_grid_search` for ``spec``."""
  grid = np.asarray(spec[0], spec[1])
  orders, _, tables = _with_slots(grid)
  steps = refinement_steps(orders.shape[0] - grid.shape[0])
  return grid, sampled_gaussian.order_split(grid), (tables, order_search.grid_brackets(grid)), steps


def _spec_search(q, sigma, t, delta, spec, wanted=None):
  """:func:`_grid_search` on the grid of ``spec`` (:func:`_traced_search`), or
  :func:`_binned_search` on it sorted for schedules of more than _BINNED_PHASES phases."""
  if q.shape[0] <= _BINNED_PHASES:
    grid, split, tables, steps = _search_arguments(spec)
    return _grid_search(q, sigma, t, delta, grid, split, tables, steps, wanted=wanted)
  ascending = np.sort(np.asarray(spec[0], spec[1]))
  split, tables = _concrete_split(ascending)
  return _binned_search(q, sigma, t, delta, ascending, split, (tables, grid_ends(ascending)),
                        _WINDOW_REFINE_STEPS, wanted=wanted)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4,))
def _searched_epsilon(q, sigma, t, delta, spec):
  """ε of :func:`_spec_search` on the grid of ``spec`` (:func:`_traced_search`), with its
  envelope derivative taken in the same loop (one copy of the kernel in a derivative's
  graph: the search's, carrying the derivative along the wanted directions)."""
  return _spec_search(q, sigma, t, delta, spec)[0]


def _searched_epsilon_jvp(spec, primals, tangents):
  wanted = tuple(not isinstance(d, jax.custom_derivatives.SymbolicZero) for d in tangents)
  search = lambda *args, **kwargs: loops.of_primals(
      lambda *a: _spec_search(*a, spec, **kwargs))(*args)
  if not any(wanted):
    eps = search(*primals)[0]
    return eps, jnp.zeros_like(eps)
  # In the search's loop: a short schedule's derivatives along q or σ (T or δ only need no
  # derivative of the RDP); a long schedule's unless along q, which costs each of its windows
  # ~60 % more than the values (the derivative along σ ~12 %, about the one pass at the order
  # found that it saves; 10,000 phases). Otherwise the gradient at the order found.
  if wanted[0] or wanted[1] if primals[0].shape[0] <= _BINNED_PHASES else not wanted[0]:
    eps, _, grads = search(*primals, wanted=wanted)
  else:
    eps, best = search(*primals)
    grads = loops.of_primals(lambda *a: _epsilon_gradient(*a[:5], wanted=wanted, eps=a[5]))(
        best, *primals, eps)
  pairs = tuple((g, d) for g, d, w in zip(grads, tangents, wanted) if w)
  return eps, _contract(*zip(*pairs)).astype(eps.dtype)


_searched_epsilon.defjvp(_searched_epsilon_jvp, symbolic_zeros=True)


def _slot_width(split):
  """Orders per refinement step on a concrete grid with ``split``: one row of shared nodes as
  wide as the grid's longest group (its rows are padded to that width in any case), at least
  order_search.BATCH. A step narrows the bracket (width + 1)/2 times."""
  return max([len(g) for g in split.shared] + [order_search.BATCH])


def refinement_steps(count):
  """The most steps of ``count`` orders each that the refinement takes: enough that ordinary
  steps, which narrow the bracket (count + 1)/2 times, narrow the grid's bracket
  order_search.SHRINK times, and one more (a model step whose window missed the optimum,
  :func:`jaxrdp.accounting.order_search.model_windows`). The refinement ends earlier once the
  bracket is that narrow: the optimal order to ~1e-6 of a grid spacing (model steps narrow it
  ~(count + 1)/(2 ZOOM) times: three steps of 32 orders where ε is close to a parabola). The
  envelope gradient needs that where ε's σ-derivative changes fast with the order (orders
  just above 1, at small σ: 1.6e8 per unit of α at σ = 0.03)."""
  return 1 + math.ceil(math.log(order_search.SHRINK) / math.log((count + 1) / 2) - 1e-9)


def _with_slots(grid):
  """(orders, split, tables) for a concrete grid: the grid followed by the refinement's slots
  (:func:`_slot_width`; placeholders here), with the split of the grid plus the slots as one
  more shared-node group; None for a traced grid. Every step of the eager search evaluates
  this one program: the grid and the slots together."""
  split = sampled_gaussian.order_split(grid)
  if split is None:
    return None
  k = grid.shape[0]
  width = _slot_width(split)
  orders = np.concatenate([np.asarray(grid), np.linspace(1.5, 2.5, width, dtype=grid.dtype)])
  return (orders, sampled_gaussian.OrderSplit(split.sums, split.shared + (tuple(range(k, k + width)),)),
          sampled_gaussian.order_tables(grid, split))


def _work(arguments):
  """Elements of one evaluation of the grid: phases times orders."""
  return arguments["q"].size * arguments["orders"].size


def _grid_values(q, sigma, t, delta, orders, split, tables, fallback):
  """ε (NaN as +inf) at each of ``orders`` for the schedule, and which orders were left open
  (only without ``fallback``, which leaves out the per-order quadrature)."""
  out = composition.rdp_of_steps(q, sigma, t, orders, split, tables, fallback=fallback)
  rdp, pending = (out, jnp.zeros(out.shape, bool)) if fallback else out
  return _composed_epsilons(orders, rdp, delta), jnp.any(pending, axis=0)


@functools.partial(compilation.jit, static_argnames=("refine_steps", "split", "wanted"),
                   work=_work)
def _grid_search(q, sigma, t, delta, orders, split, tables, refine_steps, wanted=None):
  """(ε, its order) of the search of :func:`_concrete_epsilon` on a concrete grid ``orders``
  with its ``split`` and ``tables`` (the kernel's, and the grid's brackets), in one loop
  that evaluates one row of shared nodes per step: the grid's groups first, one per step
  (each padded to the width of the longest with its last order, as :func:`jaxrdp.mechanisms.sampled_gaussian` lays them out), then the
  refinement's orders (:func:`_slot_width`). Every other grid order (the exact sums of the
  integer orders, and the per-order quadrature for any order outside the split's groups) is
  evaluated once, outside the loop (a kernel inside a loop also compiles ~1.5x slower). The
  loop holds one copy of the kernel, each step one row per phase (under ``jax.vmap``, per
  phase and batch entry: a quarter of the rows that grid and slots together would take). The
  same orders, in the same rows, as the eager search
  (:func:`jaxrdp.accounting.order_search.search_update` decides both), so the same ε.

  ``wanted`` (static, with refinement): which of the partial derivatives d ε / d(q, σ, T, δ)
  to return as well (:func:`jaxrdp.accounting.envelope._epsilon_gradient`'s), taken in the
  same loop: every step evaluates the row with its derivative along the wanted directions
  (the nested grids carry it, :func:`jaxrdp.mechanisms.sampled_gaussian.shared_levels.\
_log_j_levels`), and one more step evaluates the optimal order found (a derivative's graph
  then holds one copy of the kernel, not a second for the derivative)."""
  tables, brackets = tables   # the kernel's tables; order_search.grid_brackets of the grid
  brackets = tuple(jnp.asarray(b) for b in brackets)
  # A host grid becomes a graph constant here: when this function is inlined into an outer
  # trace (jax.jit(jax.vmap(f)), see jaxrdp._internal.compilation) it arrives as NumPy.
  grid = jnp.asarray(orders)
  k = grid.shape[0]
  width = _slot_width(split)
  in_rows = np.zeros(k, bool)
  for g in split.shared:
    in_rows[list(g)] = True
  outside = np.flatnonzero(~in_rows)
  # Each grid order's place among (the values outside the loop, the rows' values).
  source = np.zeros(k, int)
  source[outside] = np.arange(outside.size)
  for r, g in enumerate(split.shared):
    source[list(g)] = outside.size + r * width + np.arange(len(g))
  # The grid's rows; no groups: one row whose values are not read.
  rows = (grid[np.array([g + (g[-1],) * (width - len(g)) for g in split.shared])]
          if split.shared else jnp.full((1, width), 2.0, grid.dtype))
  n_rows = rows.shape[0]
  if outside.size:
    renumber = np.cumsum(~in_rows) - 1
    sums = tuple((tuple(int(i) for i in renumber[list(p)]), top) for p, top in split.sums)
    eps_outside, _ = _grid_values(q, sigma, t, delta, grid[outside],
                                  sampled_gaussian.OrderSplit(sums, ()), tables, fallback=True)
  else:
    eps_outside = jnp.zeros((0,), grid.dtype)
  at_grid = lambda row_eps: jnp.concatenate([eps_outside, row_eps.reshape(-1)])[source]
  row_split = lambda count: sampled_gaussian.OrderSplit(
      (), tuple(tuple(range(r * width, (r + 1) * width)) for r in range(count)))
  values = lambda alphas, count, args=(q, sigma, t, delta): _grid_values(
      *args, alphas, row_split(count), (), fallback=True)[0]
  state = jax.tree_util.tree_map(jnp.asarray, order_search.search_start(grid.dtype))
  if refine_steps == 0:   # the grid's rows at once: no loop around the kernel
    row_eps = values(rows.reshape(-1), n_rows)
    state = order_search.search_update(
        state, jnp.concatenate([at_grid(row_eps), row_eps[:width]]), jnp.zeros(k + width, bool),
        grid, refine_steps, jnp, brackets)
    return order_search.search_result(state, delta, jnp)[:2]

  directions = [i for i in (0, 1) if wanted and wanted[i]]

  def evaluate(alphas, args):   # ε at the row's orders; with ``wanted``, T·RDP and its
    if not directions:          # derivatives
      return values(alphas, 1, args), None, None
    rdp_of = lambda q_, s_, t_: composition.rdp_of_steps(q_, s_, t_, alphas, row_split(1), (),
                                                         fallback=True)
    rdp, d_rdp = _rdp_and_derivatives(rdp_of, *args[:3], wanted)
    return _composed_epsilons(alphas, rdp, args[3]), rdp, d_rdp

  def step(carry):
    state, row_eps = carry[:2]
    row = state.step.astype(np.int32)
    filling = row < n_rows
    inside = order_search.refinement_orders(*state.bracket, count=width)
    searching = state.go[0] > 0   # else: the extra step at the optimal order (with ``wanted``)
    # The row's index as it is (never negative): a row past the last (refinement steps) is
    # clamped by the slice, whose result is then not used; a clamp or a wrap of negative
    # indices (jnp's indexing, lax's default) was a kernel of its own.
    alphas = jnp.where(filling, lax.dynamic_index_in_dim(rows, row, keepdims=False,
                                                         allow_negative_indices=False), inside)
    if directions:
      alphas = jnp.where(searching, alphas, jnp.where(jnp.isfinite(state.order), state.order,
                                                      2.0))
    # The schedule through a barrier with the step (loops.in_body): what the step computes
    # from it alone stays in the body's kernels (δ, often a constant, stays one).
    eps, rdp, d_rdp = evaluate(alphas, loops.in_body((q, sigma, t), row) + (delta,))
    # The row's values put in place by a select over the rows: under jax.vmap, where the step
    # is batched, a dynamic update is a scatter (five kernels); past the last row, none is hit.
    new_eps = jnp.where(np.arange(n_rows)[:, None] == row, eps, row_eps)
    new = order_search.search_update(state, jnp.concatenate([at_grid(new_eps), eps]),
                                     jnp.zeros(k + width, bool), grid, refine_steps, jnp,
                                     brackets, n_rows, active=searching if directions else True,
                                     slots=alphas)
    if not directions:
      return new, new_eps
    # The extra step comes after the search's end (filling is over: new_eps is row_eps) and
    # leaves its result as it was (``active``); it is the loop's last, so the values it
    # evaluates are those the loop ends with: the loop goes on while the step before searched.
    return new, new_eps, rdp[:, 0], d_rdp[:, :, 0], state.go
  # The rows' ε start as placeholders: no step reads a row before it is filled (the search
  # takes the grid's best order once every row is), so the rows' orders serve, a constant
  # (zeros would be a kernel of their own to compile).
  carry = (state, rows)
  if directions:   # T·RDP and its derivatives at the optimal order, and whether they are in.
    # Every step overwrites the first two (the last step's are the result), so they start as
    # placeholders of their shape: σ's own buffer where it has that shape (a zero array is a
    # kernel of its own to compile; σ is the usual variable, a buffer already).
    d_shape = (len(directions),) + q.shape
    carry += (sigma, sigma[None] if d_shape[0] == 1 else jnp.zeros(d_shape, q.dtype),
              jnp.ones((1,), np.int32))
  # The condition reads an array of shape (1,), a flag of the state: a condition on a scalar
  # costs compile time (:func:`jaxrdp._internal.loops.while_loop`).
  cond = (lambda c: c[-1][0] > 0) if directions else (lambda c: c[0].go[0] > 0)
  out = loops.while_loop(cond, step, carry, batched_as=(q, sigma, t, delta))
  result = order_search.search_result(out[0], delta, jnp)[:2]
  if not directions:
    return result
  return result + (_search_gradient(*result, q, sigma, t, delta, out[2], out[3], wanted),)


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
  n = orders.shape[0] - grid.shape[0]
  steps = refinement_steps(n) if refine_order and grid.shape[0] >= 2 else 0
  if q.shape[0] > _BINNED_PHASES:   # traced or not: one program
    ascending = np.sort(grid)   # a window's orders ascend (one group of shared nodes)
    split, tables = _concrete_split(ascending)
    return _binned_search(q, sigma, t, delta, ascending, split,
                          (tables, grid_ends(ascending)),
                          _WINDOW_REFINE_STEPS if steps else 0)
  grid = np.asarray(grid)
  brackets = order_search.grid_brackets(grid)
  if not validation.is_concrete((q, sigma, t, delta)):
    return _grid_search(q, sigma, t, delta, grid, sampled_gaussian.order_split(grid),
                        (tables, brackets), steps)
  state = order_search.search_start(orders.dtype)
  while state.go[0] > 0:
    alphas = order_search.search_orders(state, orders, n, np)
    eps = _concrete_epsilons(q, sigma, t, delta, alphas, split, tables)
    state = order_search.search_update(state, eps, np.zeros(eps.shape, bool), grid, steps, np,
                                       brackets, slots=alphas[grid.shape[0]:])
  eps, best, _ = order_search.search_result(state, np.asarray(delta), np)
  return validation.to_device(eps), validation.to_device(best)


def _concrete_epsilons(q, sigma, t, delta, orders, split, tables):
  """ε (NaN as +inf) at each of the concrete ``orders`` for the schedule: one compiled program
  without the per-order quadrature (:func:`_grid_evaluation`); what it leaves open (rare) is
  filled on the host (:func:`jaxrdp.mechanisms.sampled_gaussian.fill_pending`: compiled only then) and
  converted again. δ is made a strongly typed scalar of the phases' dtype (a Python float,
  weakly typed, would key a program of its own)."""
  delta = np.asarray(delta, q.dtype)
  rdp, pending, eps = composition.by_order_parts(_grid_evaluation, (q, sigma, t, delta),
                                                 orders, split, tables)
  if pending.any():
    rdp = sampled_gaussian.fill_pending(rdp, pending, q, sigma, orders, t)
    eps = jax.jit(_composed_epsilons)(orders, rdp, delta)
  return np.asarray(eps)


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
