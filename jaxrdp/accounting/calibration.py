r"""Calibration of σ, q or the step count of DP-SGD to a target ε, on the safe side.

Each calibration searches the ε of :mod:`jaxrdp.accounting.epsilon` on the order grid (so
that its answer is reproducible with :func:`jaxrdp.compute_epsilon`): σ and q by the
bracketed regula falsi of :mod:`jaxrdp.accounting.roots` in log σ or log q, the step count by
integer bisection, and every answer returned is a point where ε ≤ target was checked. On a
concrete grid every order goes through the grid's split (the per-order quadrature only where
a value is left open), with the steps run from the host for concrete arguments
(:func:`_host_calibration`); a traced grid takes the branch and bound. With
``accountant="pld"`` the RDP answer is one end of a search on the PLD's ε
(:func:`_pld_calibration`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import loops
from jaxrdp._internal import validation
from jaxrdp.accounting import composition
from jaxrdp.accounting.composition import schedule_phases
from jaxrdp.accounting import pld
from jaxrdp.accounting import samplers
from jaxrdp.accounting.order_search import grid_epsilon
from jaxrdp.accounting.conversion import compute_epsilon
from jaxrdp.accounting.envelope import _concrete_split, _first_without_fallback
from jaxrdp.accounting.epsilon import (_concrete_epsilons, _grid_values, _with_slots, dpsgd_epsilon,
                                       dpsgd_epsilon_unchecked,
                                       order_grid,
                                       schedule_rdp, use_pld)
from jaxrdp.accounting.roots import _host_boundary, _safe_boundary

_SIGMA_MIN, _SIGMA_MAX = 1e-4, 1e8   # noise multipliers searched
_Q_MIN = 1e-12                       # smallest sampling rate searched


@compilation.on_host
def calibrate_noise_multiplier(target_epsilon: jax.typing.ArrayLike, delta: jax.typing.ArrayLike,
                               sampling_rate: jax.typing.ArrayLike, steps: jax.typing.ArrayLike, *,
                               orders: jax.typing.ArrayLike | None = None,
                               accountant: str = "rdp", sampling: str = "poisson",
                               neighboring: str | None = None,
                               dataset_size: int | None = None,
                               max_batch_size=None) -> jax.Array:
  r"""Smallest noise multiplier σ in [1e-4, 1e8] whose ε is at most ``target_epsilon`` (safe side).

  ε is non-increasing in σ; the answer is found in log σ on the grid-order ε (so that it is
  reproducible with :func:`jaxrdp.compute_epsilon` on the same orders) by a bracketed,
  safeguarded regula falsi (Illinois) to a bracket of 1e-9 relative (typically ~10
  evaluations), and the returned σ is always a point where ε(σ) ≤ target was checked.
  ``sampling_rate`` and ``steps`` may be schedules (1-D); σ is then one multiplier for all
  phases. Jittable (and vmappable over targets). Eagerly, a target that no σ reaches raises
  ``ValueError``; under jit it gives NaN. With the RDP accountant and Poisson sampling,
  differentiable (``jax.grad``, ``jax.jvp``; first order) in the target, δ, the sampling rate
  and the steps, by the implicit function theorem at the answer: dσ/dx = −(∂ε/∂x)/(∂ε/∂σ).

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
    sampling, neighboring, dataset_size, max_batch_size: how the batches are drawn, as in
      :func:`jaxrdp.dpsgd_epsilon` (``"fixed"``: the same search on its ε; ``"shuffle"``: twice
      the σ of the epochs' Gaussian mechanisms, :mod:`jaxrdp.accounting.samplers`;
      ``"truncated_poisson"``: a host search on its ε by either accountant, eager calls only).

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
  samplers.check_sampling(sampling, neighboring, dataset_size, accountant, max_batch_size,
                          truncation=True)
  if sampling == "truncated_poisson":   # from the Poisson answer (cut batches only add to ε)
    start = calibrate_noise_multiplier(target_epsilon, delta, sampling_rate, steps)
    return _pld_calibration("noise_multiplier", target_epsilon, delta, start,
                            truncation=(dataset_size, max_batch_size), accountant=accountant,
                            orders=orders, sampling_rate=sampling_rate, steps=steps)
  if sampling == "shuffle":   # σ/2 is the epochs' Gaussian σ: calibrate that one (q = 1)
    samplers.check_batches(sampling_rate, dataset_size)
    q, _, t = schedule_phases(sampling_rate, 1.0, steps)
    valid = samplers.whole_batches(q, dataset_size)
    _, _, epochs = samplers.shuffle_schedule(q, jnp.ones_like(q), t, dataset_size)
    sigma = calibrate_noise_multiplier(target_epsilon, delta, 1.0, epochs, orders=orders,
                                       accountant=accountant)
    return validation.nan_where_invalid(valid, 2 * sigma)
  if use_pld(accountant, orders=orders):
    safe = calibrate_noise_multiplier(target_epsilon, delta, sampling_rate, steps)
    return _pld_calibration("noise_multiplier", target_epsilon, delta, safe,
                            sampling_rate=sampling_rate, steps=steps)
  q, _, t = schedule_phases(sampling_rate, 1.0, steps)
  return _rdp_calibration("noise_multiplier", target_epsilon, delta, q, t, orders,
                          "with any noise multiplier up to 1e8 for this schedule and delta",
                          sampling)


def _rdp_calibration(unknown, target_epsilon, delta, fixed, t, orders, unreachable,
                     sampling="poisson"):
  """The RDP calibration of ``unknown`` ("noise_multiplier" or "sampling_rate") after the
  public function's checks, ``fixed`` (the other of the two) and ``t`` as phase arrays.
  Eagerly, ValueError where no value reaches the target (``unreachable`` says what was
  searched); under jit NaN there, and NaN for an argument outside its domain: the search would
  otherwise return an end of its bracket or an answer for a meaningless target (σ = 1e-4 or
  q = 1 for δ > 1), a plausible and unsafe number."""
  grid = order_grid(orders, fixed.dtype)
  other = "sampling_rate" if unknown == "noise_multiplier" else "noise_multiplier"
  valid = validation.all_in_domains(target_epsilon=target_epsilon, delta=delta, steps=t,
                                    orders=grid, **{other: fixed})
  target, delta = (validation.to_device(v, fixed.dtype) for v in (target_epsilon, delta))
  if sampling == "fixed":
    result = _calibrate_fixed(target, delta, fixed, t, grid, unknown=unknown,
                              n_max=samplers.max_order(grid))
  else:
    result = _implicit(unknown, grid)(target, delta, fixed, t)
  if validation.is_concrete(result) and np.isnan(np.asarray(result)):
    raise ValueError(f"target_epsilon={float(target_epsilon)} is not reachable {unreachable}.")
  return validation.nan_where_invalid(valid, result)


def _implicit(unknown, grid):
  """:func:`_calibrated` as a function of (target, δ, fixed, t), differentiated by the
  implicit function theorem: the answer v solves ε(v) = target (ε the grid-order ε the
  search reads, :func:`jaxrdp.accounting.epsilon.dpsgd_epsilon_unchecked` without refinement),
  so dv = (d target − ∂ε/∂δ dδ − ∂ε/∂fixed · d fixed − ∂ε/∂t · dt) / (dε/dv), with ε's
  envelope partial derivatives at v (v is one value for all phases: dε/dv sums the phases').
  Linear in the tangents (reverse mode transposes it; differentiating the search itself
  cannot be: its loop runs until the bracket closes). 0 where the answer is an end of the
  searched range with ε below the target there (q = 1, σ = 1e-4: it stays put), NaN where no
  answer was found; a second derivative is NaN (:func:`jaxrdp._internal.loops.of_primals`)."""
  sign, _, s_min, s_max = _SEARCHES[unknown]
  ends = sorted(math.exp(sign * s) for s in (s_min, s_max))
  @jax.custom_jvp
  def solve(target, delta, fixed, t):
    return _calibrated(unknown, target, delta, fixed, t, grid)

  def epsilon(value, delta, fixed, t):
    q, sigma = _phases(unknown, fixed, jnp.broadcast_to(value, fixed.shape))
    return dpsgd_epsilon_unchecked(q, sigma, t, delta, grid, False)

  @solve.defjvp
  def _(primals, tangents):
    target, delta, fixed, t = primals
    d_target, d_delta, d_fixed, d_t = tangents
    value = loops.of_primals(solve)(*primals)
    grads = loops.of_primals(jax.grad(epsilon, argnums=(0, 1, 2, 3)))(value, delta, fixed, t)
    return value, _implicit_tangent(value, grads, tangents, tuple(ends))
  return solve


@functools.partial(jax.jit, static_argnums=(3,))
def _implicit_tangent(value, grads, tangents, ends):
  """dv of :func:`_implicit` from ε's partial derivatives ``grads`` = (dε/dv, ∂ε/∂δ, ∂ε/∂fixed,
  ∂ε/∂t) at the answer ``value`` and the tangents of (target, δ, fixed, t); 0 at an end of
  the searched range ``ends``. One program (under an eager ``jax.grad`` its dozen operations
  were programs of their own, each compiled on first use)."""
  d_value, d_eps_delta, d_eps_fixed, d_eps_t = grads
  d_target, d_delta, d_fixed, d_t = tangents
  moved = (d_target - d_eps_delta * d_delta - jnp.sum(d_eps_fixed * d_fixed)
           - jnp.sum(d_eps_t * d_t))
  at_end = (value <= ends[0]) | (value >= ends[1])
  return jnp.where(at_end, 0.0, moved / jnp.where(at_end, 1.0, d_value))


def _calibrated(unknown, target, delta, fixed, t, grid):
  """The search for ``unknown`` ("noise_multiplier" or "sampling_rate", the other of the
  two ``fixed``): every order through the grid's split (the per-order quadrature only if a
  value is left open) where the grid (the last argument) is concrete, the branch and bound
  (:func:`_calibrate_any_grid`) where it is traced."""
  split = _concrete_split(grid)
  if split is None:
    return _calibrate_any_grid(target, delta, fixed, t, grid, unknown=unknown)
  args = (target, delta, fixed, t, grid)
  if validation.is_concrete(args):
    return _host_calibration(unknown, *args)
  on_grid = functools.partial(_calibrate_on_grid, split=split[0], unknown=unknown)
  return _first_without_fallback(on_grid, *args, split[1])


# The searched variable s of each calibration: (the value is e^(sign·s), s0, s_min, s_max):
# σ in log σ, q in −log q; ε is non-increasing in s for both.
_SEARCHES = {"noise_multiplier": (1.0, 0.0, math.log(_SIGMA_MIN), math.log(_SIGMA_MAX)),
             "sampling_rate": (-1.0, math.log(100.0), 0.0, -math.log(_Q_MIN))}


def _phases(unknown, fixed, value):
  """(q, σ) of a calibration's schedule at ``value`` of the ``unknown`` (``fixed`` the other)."""
  return (fixed, value) if unknown == "noise_multiplier" else (value, fixed)


def _host_calibration(unknown, target, delta, fixed, t, grid):
  """A calibration with concrete arguments: the bracket's steps run from the host
  (:func:`_host_boundary`), each ε one call of the program that dpsgd_epsilon's order search
  runs (:func:`_concrete_epsilons`, the grid with its slots; open values filled on the host),
  so that no search loop is compiled around the kernel and the two share one compilation.
  The same search as :func:`_search`."""
  orders, split, tables = _with_slots(grid)
  k = grid.shape[0]
  dtype = fixed.dtype
  target_ = float(target)
  sign, s0, s_min, s_max = _SEARCHES[unknown]
  value_of = lambda s: np.exp(sign * s).astype(dtype)

  def g(s):   # log(ε/target), non-increasing in s
    value = np.full(fixed.shape, value_of(s), dtype)   # host arrays, as schedule_phases
    eps = _concrete_epsilons(*_phases(unknown, fixed, value), t, delta, orders, split, tables)[:k]
    with np.errstate(divide="ignore"):
      return np.log(np.min(eps) / target_)
  s, found = _host_boundary(g, s0, s_min, s_max, dtype)
  return validation.to_device(value_of(s) if found else np.nan, dtype)


def _search(unknown, target, fixed, grid_epsilon_of, batched_as):
  """(value, open): the safe-side search (:func:`_safe_boundary`) for the ``unknown`` on
  ε(value) = grid_epsilon_of(value), which returns (ε, open) and depends on ``batched_as``."""
  sign, s0, s_min, s_max = _SEARCHES[unknown]

  def g(s):   # log(ε/target), non-increasing in s
    eps, is_open = grid_epsilon_of(jnp.broadcast_to(jnp.exp(sign * s), fixed.shape))
    return jnp.log(eps / target), is_open
  s, found, is_open = _safe_boundary(g, jnp.asarray(s0, fixed.dtype), s_min, s_max, batched_as)
  return jnp.where(found, jnp.exp(sign * s), jnp.nan), is_open


@compilation.jit(static_argnames=("unknown",))
def _calibrate_any_grid(target, delta, fixed, t, grid, unknown):
  """The search with the grid ε of the branch-and-bound search (any grid, also traced)."""
  def eps_of(value):
    q, sigma = _phases(unknown, fixed, value)
    return grid_epsilon(lambda alphas: schedule_rdp(q, sigma, t, alphas), grid, delta)[0], False
  return _search(unknown, target, fixed, eps_of, (target, delta, fixed, t, grid))[0]


@compilation.jit(static_argnames=("unknown", "n_max"))
def _calibrate_fixed(target, delta, fixed, t, grid, unknown, n_max):
  """The search on the ε of fixed-size batches (:func:`jaxrdp.accounting.samplers.fixed_epsilon`,
  every order of the grid)."""
  def eps_of(value):
    q, sigma = _phases(unknown, fixed, value)
    return samplers.fixed_epsilon(q, sigma, t, delta, grid, n_max), False
  return _search(unknown, target, fixed, eps_of, (target, delta, fixed, t, grid))[0]


def calibrate_sigma_unchecked(target, delta, q, t, grid):
  """σ search with the grid ε of the branch-and-bound search (any grid, also traced)."""
  return _calibrate_any_grid(target, delta, q, t, grid, unknown="noise_multiplier")


def _search_work(arguments):
  """Elements of one ε evaluation of a calibration: phases times orders (not the tables)."""
  return arguments["fixed"].size * arguments["grid"].size


@functools.partial(compilation.jit, static_argnames=("split", "fallback", "unknown"),
                   work=_search_work)
def _calibrate_on_grid(target, delta, fixed, t, grid, tables, fallback, split, unknown):
  """(value, open): the search with every order of a concrete grid evaluated through its
  ``split`` (:func:`_grid_values`; the same ε as the branch and bound)."""
  def eps_of(value):
    q, sigma = _phases(unknown, fixed, value)
    eps, pending = _grid_values(q, sigma, t, delta, grid, split, tables, fallback)
    return jnp.min(eps), jnp.any(pending)
  return _search(unknown, target, fixed, eps_of, (target, delta, fixed, t))


@compilation.on_host
def calibrate_sampling_rate(target_epsilon: jax.typing.ArrayLike, delta: jax.typing.ArrayLike,
                            noise_multiplier: jax.typing.ArrayLike, steps: jax.typing.ArrayLike, *,
                            orders: jax.typing.ArrayLike | None = None,
                            accountant: str = "rdp", sampling: str = "poisson",
                            neighboring: str | None = None, dataset_size: int | None = None,
                            max_batch_size=None) -> jax.Array:
  r"""Largest sampling rate q in (0, 1] whose ε is at most ``target_epsilon`` (safe side).

  ε is non-decreasing in q; bracketed regula falsi in log q on the grid-order ε, to a bracket
  of 1e-9 relative; the q returned was checked to meet the target. Returns 1 when even q = 1
  meets the target. Eagerly, a target no q > 1e-12 reaches raises ``ValueError``; NaN under jit.
  With the RDP accountant and Poisson sampling, differentiable (first order) in the target,
  δ, σ and the steps, as :func:`calibrate_noise_multiplier` (0 where q = 1 is the answer).

  Args:
    target_epsilon: the ε to reach, > 0.
    delta: δ in (0, 1).
    noise_multiplier: σ ≥ 0, a scalar or a 1-D schedule (one entry per phase).
    steps: steps ≥ 0, a scalar or a 1-D schedule (broadcasting with ``noise_multiplier``).
    orders: the order grid (default :data:`jaxrdp.DEFAULT_ORDERS`).
    accountant: ``"rdp"`` (default) or ``"pld"`` (tight; float64, eager calls only; the q
      returned was checked with ``dpsgd_epsilon(..., accountant="pld")``, within 1e-7
      relative of the largest such q).
    sampling, neighboring: ``"poisson"`` or ``"fixed"`` (the batch size q·n of fixed-size
      batches, rounded down to a whole number of examples by the caller), as in
      :func:`jaxrdp.dpsgd_epsilon`. Shuffled batches depend on q only through the epochs:
      calibrate the steps (:func:`calibrate_steps`) instead.
    dataset_size, max_batch_size: ``sampling="truncated_poisson"`` (both required there, and
      only there): a host search on its ε by either accountant, eager calls only.

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
  samplers.check_sampling(sampling, neighboring, 1 if sampling == "shuffle" else dataset_size,
                          accountant, max_batch_size, truncation=True)
  if sampling == "truncated_poisson":   # from the Poisson answer (cut batches only add to ε)
    start = calibrate_sampling_rate(target_epsilon, delta, noise_multiplier, steps)
    return _pld_calibration("sampling_rate", target_epsilon, delta, start,
                            truncation=(dataset_size, max_batch_size), accountant=accountant,
                            orders=orders, noise_multiplier=noise_multiplier, steps=steps)
  if sampling == "shuffle":
    raise ValueError("calibrate_sampling_rate does not offer sampling='shuffle': its ε depends on "
                     "the batch size only through the number of epochs; calibrate the steps "
                     "(calibrate_steps) or the noise multiplier instead.")
  if use_pld(accountant, orders=orders):
    safe = calibrate_sampling_rate(target_epsilon, delta, noise_multiplier, steps)
    return _pld_calibration("sampling_rate", target_epsilon, delta, safe,
                            noise_multiplier=noise_multiplier, steps=steps)
  _, sigma, t = schedule_phases(0.5, noise_multiplier, steps)
  return _rdp_calibration("sampling_rate", target_epsilon, delta, sigma, t, orders,
                          "with any sampling rate >= 1e-12 for this noise multiplier, step count "
                          "and delta", sampling)


@compilation.on_host
def calibrate_steps(target_epsilon: jax.typing.ArrayLike, delta: jax.typing.ArrayLike,
                    sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike, *,
                    max_steps: int = 10 ** 9,
                    orders: jax.typing.ArrayLike | None = None,
                    accountant: str = "rdp", sampling: str = "poisson",
                    neighboring: str | None = None,
                    dataset_size: int | None = None, max_batch_size=None) -> jax.Array:
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
    sampling, neighboring, dataset_size, max_batch_size: how the batches are drawn, as in
      :func:`jaxrdp.dpsgd_epsilon` (``"shuffle"``: whole epochs of ⌊n/B⌋ steps, the most that
      the epochs' Gaussian mechanisms allow, capped at ``max_steps``; ``"truncated_poisson"``:
      a host search on its ε by either accountant, eager calls only).

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
  samplers.check_sampling(sampling, neighboring, dataset_size, accountant, max_batch_size,
                          truncation=True)
  if sampling == "truncated_poisson":   # from the Poisson answer (cut batches only add to ε)
    try:
      start = calibrate_steps(target_epsilon, delta, sampling_rate, noise_multiplier,
                              max_steps=max_steps)
    except ValueError:
      start = 0.0
    steps = _pld_calibration("steps", target_epsilon, delta, start, max_steps=max_steps,
                             truncation=(dataset_size, max_batch_size), accountant=accountant,
                             orders=orders, sampling_rate=sampling_rate,
                             noise_multiplier=noise_multiplier)
    if float(steps) == 0:
      raise ValueError(f"target_epsilon={float(target_epsilon)} is not reachable even with one "
                       "step.")
    return steps
  if sampling == "shuffle":
    samplers.check_batches(sampling_rate, dataset_size)
    q, sigma, _ = schedule_phases(sampling_rate, noise_multiplier, 1.0)
    epochs = calibrate_steps(target_epsilon, delta, 1.0, sigma[0] / 2, max_steps=max_steps,
                             orders=orders, accountant=accountant)   # one step per epoch
    steps = jnp.minimum(epochs * samplers.steps_per_epoch(q[0], dataset_size), max_steps)
    return validation.nan_where_invalid(samplers.whole_batches(q, dataset_size), steps)
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
  if sampling == "fixed":
    per_step = samplers.fixed_rdp(q, sigma, jnp.ones_like(q), grid, samplers.max_order(grid))
  elif split[0] is not None and validation.is_concrete((q, sigma)):
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


def _pld_calibration(unknown, target, delta, safe, max_steps=None, truncation=None,
                     accountant="pld", orders=None, **fixed):
  """The calibration of ``unknown`` (noise_multiplier, sampling_rate or steps) on the PLD ε,
  or with ``truncation`` ((N, B) of truncated Poisson sampling) on that sampler's ε by
  ``accountant``.

  ``safe`` is the RDP calibration's answer: RDP's ε bounds the PLD's (both are upper bounds of
  the same ε, and the PLD's is the tight one), so it meets the target under PLD too and is
  one end of the bracket. The other end is found by steps of 25 % away from it until the
  target is missed (PLD typically needs 5–10 % less noise than RDP, so the bracket is narrow
  and its grid often has the rounded sizes of the answer's: fewer compilations). With
  truncation the start (the Poisson answer) may miss the target instead (cut batches only add
  to ε): the steps of 25 % then go the other way until it is met. One grid, sized for the
  widest schedule of the bracket, serves every evaluation of the search (one compiled
  program: the value being calibrated is an argument, not a shape); the search is the
  safe-side regula falsi of :func:`_host_boundary` in log σ or log q, and a bisection for the
  step count. The answer is then checked with the grid that ``dpsgd_epsilon(...,
  accountant="pld")`` sizes for it, and moved toward ``safe`` by 1e-7 relative (one step)
  until it meets the target there."""
  values = {k: np.asarray(v, np.float64) for k, v in fixed.items()}
  if not validation.is_concrete((target, delta, safe, values)):
    raise ValueError(f"calibration with accountant={accountant!r}"
                     f"{'' if truncation is None else ' of truncated Poisson batches'} runs "
                     "eagerly (its grid sizes depend on the values); call it outside jax.jit.")
  target, delta, safe = float(target), float(delta), float(safe)
  as_schedule = {"noise_multiplier": lambda v: (values["sampling_rate"], v, values["steps"]),
                 "sampling_rate": lambda v: (v, values["noise_multiplier"], values["steps"]),
                 "steps": lambda v: (values["sampling_rate"], values["noise_multiplier"], v)}[unknown]
  # ε grows with q and T and falls with σ: "outward" is the direction that raises ε.
  outward = {"noise_multiplier": 0.8, "sampling_rate": 1.25, "steps": 1.25}[unknown]
  limit = {"noise_multiplier": _SIGMA_MIN, "sampling_rate": 1.0,
           "steps": float(max_steps or 0)}[unknown]
  inner_limit = {"noise_multiplier": _SIGMA_MAX, "sampling_rate": _Q_MIN, "steps": 0.0}[unknown]
  clip = min if outward > 1 else max
  sizes = {} if truncation is None else {"dataset_size": truncation[0],
                                         "max_batch_size": truncation[1]}

  def grid_for(v):
    if accountant != "pld":
      return None
    phases = pld.checked_phases(*as_schedule(np.float64(v)), "calibration")
    host, _ = pld.truncation_of(*(truncation or (None, None)), phases[2].shape[0])
    return pld.grid_of(*phases, None, np.float64(delta), host)

  def epsilon(v, grid=None):
    if accountant != "pld":   # truncated Poisson batches by RDP: dpsgd_epsilon's account
      return float(dpsgd_epsilon(*as_schedule(np.float64(v)), np.float64(delta), orders=orders,
                                 sampling="truncated_poisson", **sizes))
    q, sigma, t = pld.checked_phases(*as_schedule(np.float64(v)), "calibration with accountant='pld'")
    host, graph = pld.truncation_of(*(truncation or (None, None)), t.shape[0])
    return float(pld.pld_epsilon_unchecked(q, sigma, t, np.float64(delta),
                                           pld.grid_of(q, sigma, t, grid, np.float64(delta), host),
                                           graph))

  grid = grid_for(safe)
  if epsilon(safe, grid) > target:   # (truncation) the start misses: step inward until met
    far = safe
    while True:
      nxt = (max if outward > 1 else min)(far / outward, inner_limit)
      if unknown == "steps":
        nxt = float(max(min(math.ceil(nxt), far - 1), 0))
      if epsilon(nxt, grid) <= target:
        break
      if nxt == far:
        raise ValueError(f"target_epsilon={target} is not reachable by calibrating "
                         f"{unknown.replace('_', ' ')} (truncated Poisson batches"
                         f"{', RDP: the overflows alone exceed delta' if accountant != 'pld' else ''}).")
      far = nxt
    near = nxt
  else:
    far = safe
    while True:   # the bracket's far end: the first value (steps of 25 %) that misses the target
      nxt = clip(far * outward, limit)
      if unknown == "steps":   # whole counts, at least one more (1.25·far rounds down to far)
        nxt = float(min(max(math.floor(nxt), far + 1), limit))
      grid = grid_for(nxt)
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
  safe = near
  for _ in range(64):   # the check with dpsgd_epsilon's own grid for the answer
    if epsilon(answer) <= target:
      return validation.to_device(answer, np.float64)
    answer = step(answer)
  return validation.to_device(safe, np.float64)
