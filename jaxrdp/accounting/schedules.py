r"""Noise schedules designed by gradient under an (ε, δ) budget.

Problem: given a schedule of phases (phase i runs :math:`T_i` steps at sampling rate
:math:`q_i` and noise multiplier :math:`\sigma_i`) and a differentiable *utility proxy*
:math:`U(\sigma, q)` to minimise (for example a weighted sum of per-step noise variances),

.. math:: \min_{\sigma} U(\sigma, q) \quad\text{subject to}\quad
          \varepsilon_\delta(\sigma, q, T) \le \varepsilon^\star .

Method (projection by a common scale). The schedule is parametrised by its *shape*
:math:`\theta = \log \tilde\sigma` and one scale :math:`u`: :math:`\sigma = e^{u}\tilde\sigma`.
Since ε decreases strictly in a common factor on every σ, each shape has exactly one scale
:math:`u(\theta)` with :math:`h(u, \theta) = \log\varepsilon(e^{u}\tilde\sigma) -
\log\varepsilon^\star = 0`: the constraint is always active and every iterate sits on the
budget's boundary. The optimiser (any optax transformation, Adam by default) minimises
:math:`U(e^{u(\theta)}\tilde\sigma(\theta))` over the shape alone; the gradient through the
implicit scale is the implicit-function theorem,
:math:`du/d\theta = -(\partial h/\partial\theta)/(\partial h/\partial u)`, with ε's gradient
from :func:`jaxrdp.dpsgd_epsilon` (exact envelope gradients at the optimal order). The scale
follows the shape by one Newton step in :math:`u` per iteration (warm-started; ε is close to a
power law in σ, so Newton in log-log coordinates converges in a few steps).

Safety: the iterates use the grid-order ε (fast); the returned schedule is re-scaled by
bisection on the refined ε of :func:`jaxrdp.dpsgd_epsilon` so that its ε is **at most** the
target (within 1e-10 relative of it), and that ε is returned with it.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import deprecation
from jaxrdp._internal import validation
from jaxrdp.accounting import envelope
from jaxrdp.accounting import pld
from jaxrdp.accounting.dpsgd import dpsgd_epsilon_unchecked, order_grid, schedule_phases
from jaxrdp.accounting.epsilon import epsilon_and_gradient, use_pld
from jaxrdp.accounting import schedule_steps
from jaxrdp.accounting.schedule_steps import FAMILIES, design_in_graph, parametrisation

_PROJECTION_STEPS = 60   # at most this many evaluations of the final safe re-scaling
DESIGNS = ("noise_multiplier", "sampling_rate", "both")


class ScheduleResult(NamedTuple):
  """What :func:`optimize_schedule` returns.

  Attributes:
    noise_multiplier: the optimised σ of each phase (ε ≤ target).
    sampling_rate: q of each phase (as given, broadcast to the phases; designed with
      ``design="sampling_rate"`` or ``"both"``).
    steps: steps of each phase (as given).
    epsilon: :func:`jaxrdp.dpsgd_epsilon` of the result, ≤ ``target_epsilon``.
    utility: the utility proxy at the result.
    history: the utility proxy after each iteration (on the budget boundary).
  """
  noise_multiplier: jax.Array
  sampling_rate: jax.Array
  steps: jax.Array
  epsilon: jax.Array
  utility: jax.Array
  history: np.ndarray


@deprecation.positional_in_old_order("utility", "noise_multiplier", "sampling_rate", "steps")
def optimize_schedule(utility: Callable[[jax.Array, jax.Array], jax.Array], *,
                      sampling_rate: jax.typing.ArrayLike,
                      noise_multiplier: jax.typing.ArrayLike,
                      steps: jax.typing.ArrayLike,
                      target_epsilon: float, delta: float,
                      optimizer: optax.GradientTransformation | None = None,
                      num_iterations: int = 200,
                      orders: jax.typing.ArrayLike | None = None,
                      callback: Callable[[int, float], None] | None = None,
                      design: str = "noise_multiplier",
                      accountant: str = "rdp", key: jax.Array | None = None,
                      pld_grid: pld.PldGrid | None = None, family: str = "phases",
                      degree: int = 2) -> ScheduleResult:
  r"""The noise schedule minimising ``utility`` whose DP-SGD ε is at most ``target_epsilon``.

  **Changed in 1.0:** the schedule is given in :func:`jaxrdp.dpsgd_epsilon`'s order (q, σ, T)
  (0.1.0: ``optimize_schedule(utility, noise_multiplier, sampling_rate, steps, ...)``). For this
  release it is keyword-only, ``optimize_schedule(utility, sampling_rate=q,
  noise_multiplier=σ0, steps=T, target_epsilon=..., delta=...)``; a positional call is read in
  the 0.1.0 order (σ before q), as before, and warns (``DeprecationWarning``). The next release
  takes ``(utility, sampling_rate, noise_multiplier, steps)`` by position. ``utility`` is still
  called as ``utility(noise_multiplier, sampling_rate)``, the order of :class:`ScheduleResult`'s
  fields: a callback's argument order cannot be changed without silently changing its meaning.

  Args:
    utility: ``utility(noise_multiplier, sampling_rate) -> scalar``, differentiable in
      ``noise_multiplier`` (an array with one entry per phase); smaller is better. It must
      reward less noise (otherwise the budget is not the binding constraint).
    sampling_rate: q per phase (scalar or 1-D), in (0, 1]; kept fixed unless ``design``
      says otherwise (then the initial schedule).
    noise_multiplier: the initial schedule (its shape is what is optimised; its scale is set
      by the budget), scalar or 1-D, > 0.
    steps: steps per phase (scalar or 1-D), ≥ 0; kept fixed.
    target_epsilon: the ε budget, > 0.
    delta: δ in (0, 1).
    optimizer: an optax transformation acting on log σ (default ``optax.adam(0.05)``).
    num_iterations: optimiser iterations.
    orders: RDP orders (default :data:`jaxrdp.DEFAULT_ORDERS`).
    callback: called as ``callback(iteration, utility)`` after each iteration (1-based, the
      utility proxy on the budget boundary): progress reports, early logging.
    design: what is optimised (:data:`DESIGNS`): ``"noise_multiplier"`` (the default: the
      shape of σ, q fixed), ``"sampling_rate"`` (the shape of q, that is of the expected batch
      size, with the expected number of gradient evaluations :math:`\sum_i T_i q_i` held at
      its initial value; σ's shape fixed, its scale set by the budget) or ``"both"``. q is
      parametrised as :math:`q_i = Q e^{\phi_i} / \sum_j T_j e^{\phi_j}` with
      :math:`Q = \sum_i T_i q_i^{(0)}`, capped at 1 (a phase at the cap holds fewer
      evaluations than the parametrisation: the count is then at most the initial one).
      ``utility`` must then be differentiable in ``sampling_rate`` too.
    accountant: the budget's accountant: ``"rdp"`` (the default; exact RDP, the refined
      order) or ``"pld"`` (the privacy-loss distribution, :func:`jaxrdp.pld_epsilon`: tight,
      float64, whole steps; ``orders`` does not apply). Every iterate and the result are
      held to the budget by that accountant.
    key: for a *stochastic* utility (a training run with fresh noise and batches each
      iteration: a stochastic gradient of the expected utility, not the gradient of one fixed
      draw): a PRNG key; ``utility`` is then called as ``utility(noise_multiplier,
      sampling_rate, key)`` with a fresh key each iteration (``jax.random.fold_in(key, i)``;
      the reported ``utility`` with the last). None (the default): ``utility`` is
      deterministic and takes two arguments.
    family: how the shapes of σ and q (those ``design`` moves) are parametrised, with x_i the
      midpoint of phase i's steps as a fraction of all steps (:data:`FAMILIES`):
      ``"phases"`` (the default: each phase's log σ and log q free), ``"exponential"``
      (log σ_i = log σ0_i + a·x_i: σ, and q, change by a constant factor per step; one
      parameter each) or ``"polynomial"`` (log σ_i = log σ0_i + Σ_{k=1..degree} a_k x_i^k). The
      constant term is the budget's scale (σ) or the gradient count's normalisation (q). A
      family with many phases gives a smooth schedule of few parameters.
    degree: the polynomial family's degree, ≥ 1 (``"exponential"`` is degree 1).
    pld_grid: with ``accountant="pld"``, the PLD's static grid sizes (:func:`jaxrdp.pld_grid`,
      made for the widest schedule the design may reach: the smallest σ, e.g. the initial
      schedule scaled to reach the budget at half its σ). Required inside ``jax.jit``; given
      eagerly, the design runs as under ``jax.jit``. Every iterate and the result are then
      accounted on this grid (the result's ε is ``dpsgd_epsilon(..., accountant="pld",
      pld_grid=pld_grid)``; a schedule too wide for the grid gets a larger, still valid ε).

  Returns:
    A :class:`ScheduleResult`; ``epsilon`` ≤ ``target_epsilon`` always holds.

  **Inside** ``jax.jit`` (any argument traced: the budget, the schedule, δ, the key; or
  ``pld_grid`` given) the whole design is one JAX function (:func:`schedule_steps.\
design_in_graph`): the same step in a ``lax.scan`` (after five Newton steps onto the budget's
  boundary, where eager calls solve for it), the safe re-scaling by the calibrations' root
  finder in the graph (the scale to 1e-9, ε a few ulps below the target), ``history`` a JAX
  array, and ``callback`` called from the graph. Invalid values give NaN there, and so does a
  budget no scale in e^±40 meets (eagerly a ValueError).

  Method: projection by a common scale with implicit gradients (module docstring).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value), or shapes that do not fit (named, with the shapes).
    TypeError: an argument that is not real-valued; ``accountant="pld"`` with traced
      arguments and no ``pld_grid``.
  """
  if not callable(utility):
    raise TypeError(f"utility must be a callable utility(noise_multiplier, sampling_rate), got "
                    f"{type(utility).__name__}.")
  if callback is not None and not callable(callback):
    raise TypeError(f"callback must be a callable callback(iteration, utility) or None, got "
                    f"{type(callback).__name__}.")
  validation.check_all(target_epsilon=target_epsilon, sampling_rate=sampling_rate, steps=steps,
                       delta=delta)
  validation.check("positive_noise_multiplier", noise_multiplier, name="noise_multiplier")
  validation.check_scalar(target_epsilon=target_epsilon, delta=delta)
  num_iterations = validation.check_int("num_iterations", num_iterations, lo=0)
  validation.check_choice("design", design, DESIGNS)
  validation.check_choice("family", family, FAMILIES)
  degree = validation.check_int("degree", degree, lo=1)
  by_pld = use_pld(accountant, pld_grid=pld_grid, orders=orders)
  if key is not None:   # an int seed or a legacy key as a key (TypeError / ValueError else)
    raw, impl = validation.canonical_key(key)
    key = raw if impl is None else jax.random.wrap_key_data(raw, impl=impl)
  in_graph = pld_grid is not None or not validation.is_concrete(
      (sampling_rate, noise_multiplier, steps, target_epsilon, delta, orders, key))
  if in_graph:
    return _optimize_in_graph(utility, sampling_rate, noise_multiplier, steps, target_epsilon,
                              delta, optimizer, num_iterations, orders, callback, design,
                              by_pld, key, pld_grid, family, degree)
  q, sigma0, t = schedule_phases(sampling_rate, noise_multiplier, steps)
  _check_schedule(q, t, design)
  dtype = q.dtype
  if by_pld:   # the PLD's own checks: float64, whole steps (ValueError / TypeError)
    q, sigma0, t = pld.checked_phases(sampling_rate, noise_multiplier, steps, "the PLD accountant")
  grid = order_grid(orders, dtype)
  delta = validation.to_device(delta, dtype)   # strongly typed, as dpsgd_epsilon passes it
  epsilon = _epsilon_of(by_pld, t, delta, grid)
  log_target = jnp.log(jnp.asarray(target_epsilon, dtype))
  import optax   # here, not at import: an accounting query does not pay for importing optax
  optimizer = optax.adam(0.05) if optimizer is None else optimizer

  shape, unpack = parametrisation(sigma0, q, t, design, family, degree)
  if not by_pld and num_iterations:
    # The iterations' derivative of ε (along σ, and q where it moves) compiles in the
    # background while the scale is solved for and the step is compiled (~0.5 s less).
    envelope.prepare_gradient(q, sigma0, t, delta, wanted=(shape[1] is not None, True, False,
                                                           False))
  # The host loop's glue compiled as a whole each (eagerly, every operation of it would be a
  # program of its own to compile: ~25 ms each on a 2-core CPU, ~0.3 s in all).
  unpacked, scaled = jax.jit(unpack), jax.jit(_scaled)
  # Start on the boundary: solve for the scale of the initial shape exactly.
  theta, q = unpacked(shape)
  u = _safe_scale(theta, jnp.zeros((), dtype), q, epsilon, target_epsilon, t, by_pld, scaled)
  step = _make_step(utility, optimizer, unpack, epsilon, t, by_pld, shape[1] is not None,
                    None if by_pld else (delta, grid))
  opt_state = jax.jit(optimizer.init)(shape)   # (one program, not one per operation)
  history = []
  for iteration in range(1, int(num_iterations) + 1):
    draw = None if key is None else jax.random.fold_in(key, iteration)
    shape, u, opt_state, value = step(shape, u, opt_state, log_target, draw)
    history.append(float(value))
    if callback is not None:
      callback(iteration, history[-1])
  theta, q = unpacked(shape)
  if num_iterations:   # (without iterations the shape, and so the scale, is the initial one)
    u = _safe_scale(theta, u, q, epsilon, target_epsilon, t, by_pld, scaled)
  sigma = scaled(u, theta)
  eps = epsilon(q, sigma)
  if not float(eps) <= target_epsilon:  # the bisection keeps the safe side; this cannot fail
    raise RuntimeError(f"internal error: projected schedule has epsilon {float(eps)} > target.")
  final = (jax.jit(utility)(sigma, q) if key is None
           else jax.jit(utility)(sigma, q, jax.random.fold_in(key, int(num_iterations))))
  return ScheduleResult(sigma, q, t, eps, final, np.asarray(history))


def _check_schedule(q, t, design):
  """Where the phases are known: a schedule that spends privacy and, where q is designed (in
  log q), q > 0 in every phase with steps (ValueError otherwise; NaN in a graph)."""
  if not validation.is_concrete((q, t)):
    return
  if not bool(np.any((np.asarray(q) > 0) & (np.asarray(t) > 0))):
    raise ValueError("the schedule spends no privacy (every phase has sampling_rate = 0 or "
                     "steps = 0): there is nothing to optimise.")
  if design != "noise_multiplier" and not bool(np.all((np.asarray(q) > 0) | (np.asarray(t) == 0))):
    raise ValueError(f"design={design!r} needs sampling_rate in (0, 1] in every phase with "
                     f"steps (its shape is optimised in log q); got sampling_rate "
                     f"{np.asarray(q).tolist()} with steps {np.asarray(t).tolist()}.")


def _optimize_in_graph(utility, sampling_rate, noise_multiplier, steps, target, delta, optimizer,
                       num_iterations, orders, callback, design, by_pld, key, pld_grid, family,
                       degree):
  """:func:`optimize_schedule` as one JAX function (:func:`schedule_steps.design_in_graph`):
  the arguments are checked (eagerly, where known), invalid values give NaN."""
  if by_pld:
    if pld_grid is None:
      raise TypeError("optimize_schedule(accountant='pld') inside jax.jit needs pld_grid= "
                      "(jaxrdp.pld_grid(...) of the widest schedule the design may reach, "
                      "computed outside): the PLD's array sizes cannot be read from traced values.")
    q, sigma0, t = pld.checked_phases(sampling_rate, noise_multiplier, steps, "the PLD accountant")
  else:
    q, sigma0, t = schedule_phases(sampling_rate, noise_multiplier, steps)
  _check_schedule(q, t, design)
  dtype = q.dtype
  grid = order_grid(orders, dtype)
  moves_q = design != "noise_multiplier"
  valid = validation.combine_masks(
      validation.all_in_domains(sampling_rate=q, positive_noise_multiplier=sigma0, steps=t,
                                delta=delta, target_epsilon=target, orders=grid),
      jnp.any((q > 0) & (t > 0)), jnp.all((q > 0) | (t == 0)) if moves_q else True)
  if by_pld:
    valid = validation.combine_masks(valid, jnp.all(t == jnp.floor(t)))
  delta = validation.to_device(delta, dtype)
  import optax   # here, not at import: an accounting query does not pay for importing optax
  optimizer = optax.adam(0.05) if optimizer is None else optimizer
  target = jnp.asarray(target, dtype)
  shape, unpack = parametrisation(sigma0, q, t, design, family, degree)
  sigma, q, eps, final, history = design_in_graph(
      utility, optimizer, shape, unpack, _epsilon_of(by_pld, t, delta, grid), target,
      num_iterations, key=key, pld_grid=pld_grid, callback=callback)
  return ScheduleResult(*validation.nan_where_invalid(valid, (sigma, q, t, eps, final, history)))


def _epsilon_of(by_pld, t, delta, grid):
  """``epsilon(q, σ, refine=True, pld_grid=None)``: ε of the schedule with steps ``t`` by the
  budget's accountant; RDP at the refined order, or at the grid orders (``refine=False``, the
  iterations' cheaper value: never below the refined one); PLD on ``pld_grid`` (static sizes,
  for a compiled step) or sized from the arguments."""
  if by_pld:
    return lambda q, sigma, refine=True, pld_grid=None: pld.pld_epsilon(q, sigma, t, delta,
                                                                        pld_grid=pld_grid)
  return lambda q, sigma, refine=True, pld_grid=None: dpsgd_epsilon_unchecked(q, sigma, t, delta,
                                                                              grid, refine)


_PLD_MARGIN = 0.8   # the iterations' PLD grid is sized for σ this many times the iterate's


def _make_step(utility, optimizer, unpack, epsilon, t, by_pld, moves_q, rdp=None):
  """One iteration on the shape (:func:`schedule_steps.step_parts`): ε and its gradient in
  (σ, q) taken eagerly, so that they run the accountant's own compiled programs (compiled with
  the dispatch layer's options, and kept across iterations and calls of the same shapes); the
  scale's Newton step and the optimiser's step compiled as a plain ``jax.jit`` with XLA's
  default options (it holds the user's utility, whose cost jaxrdp cannot know: a training run
  differentiated through compiles a little faster with the dispatch layer's options and runs
  many times slower). With the PLD the grid's static sizes are those of the iterate with σ
  scaled by _PLD_MARGIN, kept while every iterate's ε is finite on them and sized again
  otherwise (the result's ε is the PLD sized from its own values: the grid only serves the
  iterations). With the RDP (``rdp``: δ and the order grid) the boundary's ε and gradient are
  the search's and the envelope's own calls (:func:`jaxrdp.accounting.epsilon.\
epsilon_and_gradient`), the same numbers as ``jax.value_and_grad`` of log ε without its
  eager dispatch (~4 ms an iteration): ∂h = ∂ε · (1/ε), as JAX's transposition forms it."""
  at, boundary, advance = schedule_steps.step_parts(utility, optimizer, unpack, epsilon, moves_q)
  at, advance = jax.jit(at), jax.jit(advance)
  sized = {}
  if rdp is not None:
    delta, grid = rdp

    def boundary(sigma, q, pld_grid):
      del pld_grid
      eps, grads = epsilon_and_gradient(q, sigma, t, delta, grid, False,
                                        (moves_q, True, False, False))
      return on_log_scale(eps, grads[1], grads[0] if moves_q else None)

    @jax.jit
    def on_log_scale(eps, d_sigma, d_q):   # (one program, not three operations an iteration)
      inverse = 1.0 / eps
      return jnp.log(eps), (d_sigma * inverse,
                            jnp.zeros_like(d_sigma) if d_q is None else d_q * inverse)

  def step(shape, u, opt_state, log_target, key):
    sigma, q = at(shape, u)
    for _ in range(2):   # a grid too small for this iterate (ε = inf on it): size it again
      if by_pld and "grid" not in sized:
        sized["grid"] = pld.pld_grid(q, _PLD_MARGIN * sigma, t)
      h, (h_sigma, h_q) = boundary(sigma, q, sized.get("grid"))
      if not by_pld or bool(jnp.isfinite(h)):
        break
      sized.pop("grid")
    return advance(shape, u, opt_state, log_target, key, h, h_sigma, h_q)[0]
  return step


def _scaled(u, theta):
  """σ = e^{u + θ}: the schedule of shape θ at scale u."""
  return jnp.exp(u + theta)


def _safe_scale(theta, u_guess, q, epsilon, target, t=None, by_pld=False, scaled=_scaled):
  """The scale u with ε(e^u e^θ) ≤ target within 1e-10 relative (safe side), ``epsilon`` the
  budget's accountant (:func:`_epsilon_of`; RDP at the refined order). With the PLD
  (``by_pld``, steps ``t``) the search runs on one grid sized for the smallest scale it has
  reached (one compiled program, not one per scale), then again from the point found with
  the grid sized from each scale's own values (as the result's ε is read).

  Safeguarded regula falsi (Illinois) on g(u) = log ε − log target, decreasing in u: few
  evaluations of one compiled function, and the returned point always has g ≤ 0. ``scaled``:
  σ of (u, θ) (:func:`_scaled`, compiled by the host driver).
  """
  sized = {}   # PLD: one grid for the search, sized for the smallest scale yet (with a margin)

  def grid_for(u):
    if by_pld and not sized.get("u", math.inf) <= u:
      sized["u"] = u - 0.1
      sized["grid"] = pld.pld_grid(q, scaled(scale(sized["u"]), theta), t)
    return sized.get("grid")

  # The scale as a strongly typed scalar, as the host driver passes it to ``scaled`` (a Python
  # float, weakly typed, would compile a program of its own).
  scale = lambda u: np.asarray(u, theta.dtype)

  def g(u, own_grid=False):
    eps = float(epsilon(q, scaled(scale(u), theta),
                        pld_grid=None if own_grid else grid_for(u)))
    return math.log(eps / target) if eps > 0 else -math.inf

  def solve(u_guess, own_grid, step=0.01, tol=1e-10):
    # The bracket [hi - 2 step, hi + step] around the guess, widened by steps growing 8-fold up
    # to 0.5. From the first PLD search's point the second brackets within 1e-6: its scales'
    # own grids are then the same sizes (one compiled program, not one per scale).
    # A point passed while widening upwards is the bracket's lower end.
    widen = lambda k: min(0.5, 2 * step * 8.0 ** k)
    hi = float(u_guess) + step if math.isfinite(float(u_guess)) else step
    g_hi, k, lo = g(hi, own_grid), 0, None
    while g_hi > 0:
      if not hi <= 40:
        raise ValueError(f"target_epsilon={target} cannot be met by scaling this schedule "
                         "(noise multipliers up to e^40 times the initial ones).")
      lo, g_lo = hi, g_hi
      hi, k = hi + widen(k), k + 1
      g_hi = g(hi, own_grid)
    if lo is None:
      lo, k = hi - 2 * step, 0
      g_lo = g(lo, own_grid)
    while g_lo <= 0 and lo > -40:
      hi, g_hi = lo, g_lo
      lo, k = lo - widen(k), k + 1
      g_lo = g(lo, own_grid)
    if g_lo <= 0:
      return lo   # even e^-40 meets the target
    side, true_g_hi = 0, g_hi   # g_lo, g_hi below are interpolation weights (Illinois-halved)
    for _ in range(_PROJECTION_STEPS):
      if true_g_hi > -tol or hi - lo < 1e-13:
        break
      x = hi - g_hi * (hi - lo) / (g_hi - g_lo) if math.isfinite(g_hi) else 0.5 * (lo + hi)
      if not lo < x < hi:
        x = 0.5 * (lo + hi)
      g_x = g(x, own_grid)
      if g_x <= 0:
        hi, g_hi, true_g_hi = x, g_x, g_x
        g_lo = g_lo / 2 if side == -1 else g_lo
        side = -1
      else:
        lo, g_lo = x, g_x
        g_hi = g_hi / 2 if side == 1 else g_hi
        side = 1
    return hi

  # PLD: the search on one grid (to 1e-6: the second search starts there), then again from
  # there on the grid the result's ε is read on.
  if by_pld:
    hi = solve(solve(u_guess, False, tol=1e-6), True, step=1e-6)
  else:
    hi = solve(u_guess, False)
  return jnp.asarray(hi, q.dtype)


def noisy_sgd_utility(steps: jax.typing.ArrayLike, learning_rate: jax.typing.ArrayLike, *,
                      l2_norm_clip: float, dataset_size: int,
                      curvature: float) -> Callable[[jax.Array, jax.Array], jax.Array]:
  r"""An analytic utility for :func:`optimize_schedule`: the variance the injected noise leaves
  in the final iterate of noisy SGD, from the user's learning-rate schedule and clipping norm.

  Model (its assumptions): DP-SGD as :func:`jaxrdp.differentially_private_aggregate` runs it
  adds :math:`\mathcal N(0, s_t^2 I)` to the mean gradient at step t, with
  :math:`s_t = \sigma_t C / (q_t N)` (clipping norm C, dataset size N, the sum divided by the
  expected batch size :math:`q_t N`). On a quadratic loss of curvature μ along each direction
  (near a minimum: the noise's effect there, not the speed of the descent), step t's noise
  reaches the final iterate damped by :math:`\prod_{s>t}(1 - \eta_s \mu)`, so the noise's
  share of its variance per coordinate is

  .. math:: U(\sigma, q) = \sum_t \eta_t^2 \Big(\frac{\sigma_t C}{q_t N}\Big)^2
            \prod_{s>t} (1 - \eta_s\mu)^2 = \sum_i W_i \Big(\frac{\sigma_i C}{q_i N}\Big)^2,

  :math:`W_i` the sum of the step weights over phase i. Left out: the sampling noise of the
  batch (of order :math:`(1-q)/(qN)` times the gradients' spread, small beside the injected
  noise at the σ of DP training) and the clipping bias; μ stands for the curvature of the
  directions that matter at the end of training (a knob: larger μ forgets early noise
  faster and moves the budget later). Smaller is better, as :func:`optimize_schedule` wants.

  Args:
    steps: steps per phase (scalar or 1-D), the schedule's ``steps``.
    learning_rate: η per step: a scalar, a 1-D array with one entry per step of the whole run,
      or a callable ``learning_rate(step)`` (an optax schedule) evaluated at steps 0, 1, ….
    l2_norm_clip: C > 0.
    dataset_size: N ≥ 1.
    curvature: μ ≥ 0 with η_t μ < 2 at every step (the quadratic is stable).

  Returns:
    ``utility(noise_multiplier, sampling_rate) -> scalar``, differentiable in both.

  Raises:
    ValueError: an argument outside its range (named, with the range and the value), or a
      learning-rate array whose length is not the number of steps.
  """
  validation.check("steps", steps)
  validation.check("positive_l2_norm_clip", l2_norm_clip, name="l2_norm_clip")
  validation.check("curvature", curvature)
  validation.check_scalar(l2_norm_clip=l2_norm_clip, curvature=curvature)
  validation.check_schedule(steps=steps)
  dataset_size = validation.check_int("dataset_size", dataset_size, lo=1)
  t = np.asarray(steps, np.float64).reshape(-1)
  if not np.all(t == np.round(t)):
    raise ValueError(f"steps must be whole numbers here (one weight per step), got {steps!r}.")
  counts = t.astype(np.int64)
  total = int(counts.sum())
  if callable(learning_rate):
    eta = np.asarray([learning_rate(i) for i in range(total)], np.float64)
  else:
    validation.check("step_size", learning_rate, name="learning_rate")
    eta = np.asarray(learning_rate, np.float64)
    if eta.ndim == 0:
      eta = np.full((total,), float(eta))
  validation.check("step_size", eta, name="learning_rate")
  if eta.shape != (total,):
    raise ValueError(f"learning_rate must be a scalar, a callable or one value per step "
                     f"({total} steps), got shape {eta.shape}.")
  factor = 1.0 - eta * float(curvature)
  if not np.all(np.abs(factor) < 1.0 + 1e-12):
    raise ValueError(f"curvature * learning_rate must lie in [0, 2] at every step (a stable "
                     f"quadratic), got curvature={curvature!r} with learning rates up to "
                     f"{eta.max()!r}.")
  # damping of step i's noise by the later steps: prod_{s > i} (1 - eta_s mu)^2 (in logs)
  log_f2 = np.log(np.maximum(factor * factor, np.finfo(np.float64).tiny))
  later = np.concatenate([np.cumsum(log_f2[::-1])[::-1][1:], [0.0]]) if total else log_f2
  weights = eta * eta * np.exp(later)
  phase = np.repeat(np.arange(counts.size), counts)
  per_phase = np.bincount(phase, weights=weights, minlength=counts.size)
  scale = float(l2_norm_clip) / dataset_size

  def utility(noise_multiplier, sampling_rate):
    w = jnp.asarray(per_phase, jnp.result_type(noise_multiplier, float))
    ratio = noise_multiplier * scale / sampling_rate
    return jnp.sum(w * ratio * ratio)
  return utility


@compilation.on_host
def epsilon_trajectory(sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
                       steps: jax.typing.ArrayLike, delta: float, at_steps: jax.typing.ArrayLike, *,
                       orders: jax.typing.ArrayLike | None = None) -> jax.Array:
  r"""ε after the first ``n`` steps of a phased schedule, for each ``n`` in ``at_steps``.

  The first ``n`` steps of a schedule are the phases truncated at ``n``:
  :math:`T_i(n) = \min(T_i, \max(0, n - \sum_{j<i} T_j))`. Each value is
  :func:`jaxrdp.dpsgd_epsilon` of that prefix (refined order).

  Args:
    sampling_rate: q in [0, 1], a scalar or a 1-D schedule (one entry per phase).
    noise_multiplier: σ ≥ 0, a scalar or a 1-D schedule.
    steps: steps per phase ≥ 0, a scalar or a 1-D schedule (the three broadcast).
    delta: δ in (0, 1).
    at_steps: step counts n ≥ 0 at which to report ε (any shape).
    orders: the order grid (default :data:`jaxrdp.DEFAULT_ORDERS`).

  Returns:
    ε after each of ``at_steps``, shape ``at_steps.shape``, in the inputs' dtype. Under
    ``jax.jit`` NaN where an argument lies outside its range (only in its place for an entry
    of ``at_steps``).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the value),
      or shapes that do not fit (named, with the shapes).
  """
  validation.check_all(sampling_rate=sampling_rate, noise_multiplier=noise_multiplier,
                       steps=steps, delta=delta)
  validation.check("steps", at_steps, name="at_steps")
  validation.check_scalar(delta=delta)
  q, sigma, t = schedule_phases(sampling_rate, noise_multiplier, steps)
  grid = order_grid(orders, q.dtype)
  # Under jit the checks above do not see the values: NaN everywhere for a schedule, δ or
  # grid outside its domain, and in its own place for an invalid entry of at_steps (the
  # prefixes would otherwise be clipped to a valid schedule: ε = 0 for T < 0 or NaN).
  valid = validation.combine_masks(
      validation.all_in_domains(sampling_rate=q, noise_multiplier=sigma, steps=t, delta=delta,
                                orders=grid),
      validation.domain_mask("steps", at_steps))
  at = jnp.asarray(at_steps, q.dtype).reshape(-1)   # any shape: flat here, reshaped at the end
  delta = validation.to_device(delta, q.dtype)
  if validation.is_concrete(grid):   # one compiled program, the grid a constant of it
    eps = _trajectory(q, sigma, t, delta, at, orders=tuple(grid.tolist()))
  else:
    eps = _trajectory_of(q, sigma, t, delta, at, grid)
  return validation.nan_where_invalid(valid, eps.reshape(jnp.shape(at_steps)))


def _trajectory_of(q, sigma, t, delta, at, grid):
  """ε after each of ``at`` steps: every prefix is a schedule of the same phases, so
  dpsgd_epsilon's own search batched over the prefixes (its vmap flattens the prefixes'
  phases into one kernel call)."""
  starts = jnp.cumsum(t) - t
  prefix = jnp.clip(at[:, None] - starts[None, :], 0.0, t[None, :])
  return jax.vmap(lambda tt: dpsgd_epsilon_unchecked(q, sigma, tt, delta, grid, True))(prefix)


@functools.partial(compilation.jit, static_argnames=("orders",))
def _trajectory(q, sigma, t, delta, at, orders):
  """:func:`_trajectory_of` on the concrete grid ``orders`` (a tuple: static), compiled as one
  program (eagerly, vmap would otherwise run the search's steps one operation at a time)."""
  return _trajectory_of(q, sigma, t, delta, at, np.asarray(orders, q.dtype))
