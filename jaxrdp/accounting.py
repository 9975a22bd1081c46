r"""ε of a DP-SGD training schedule, differentiable, and calibration of σ, q or the step count.

A schedule is a sequence of phases; phase i runs ``steps[i]`` steps of the Poisson-sampled
Gaussian mechanism at ``sampling_rate[i]`` and ``noise_multiplier[i]``. RDP composes by
addition (Mironov 2017, Prop. 1), so the schedule's RDP at order α is
:math:`\sum_i T_i\,\varepsilon_{q_i,\sigma_i}(\alpha)`, and ε is its conversion to
(ε, δ)-DP (:func:`jaxrdp.compute_epsilon`, minimised over the orders).

Optimal order: after the grid, the order is refined continuously (golden-section search on
the bracket around the best grid order; the conversion is smooth in α). The result is the
minimum of the grid value and the refined value: never looser than the grid, and never below
the true RDP-based value, since every order gives a valid bound. Gradients follow the
envelope theorem: the optimal order is held fixed (exact, since ε is minimised over it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxrdp import _validation
from jaxrdp.composition import compute_rdp
from jaxrdp.conversion import compute_epsilon
from jaxrdp.orders import DEFAULT_ORDERS

_GOLDEN_STEPS = 24        # golden-section steps refining the order (bracket shrinks 0.618^24)
_CALIBRATION_STEPS = 48   # bisection steps in log space: relative precision ~1e-13
_SIGMA_MIN, _SIGMA_MAX = 1e-4, 1e8   # noise multipliers searched


def _phases(sampling_rate, noise_multiplier, steps):
  q = _validation.as_float_array(sampling_rate)
  sigma = _validation.as_float_array(noise_multiplier)
  t = _validation.as_float_array(steps)
  dtype = jnp.result_type(q, sigma, t)
  for name, v in (("sampling_rate", q), ("noise_multiplier", sigma), ("steps", t)):
    if v.ndim > 1:
      raise ValueError(f"{name} must be a scalar or a 1-D schedule, got shape {v.shape}.")
  try:
    shape = jnp.broadcast_shapes(q.shape, sigma.shape, t.shape)
  except ValueError:
    raise ValueError("sampling_rate, noise_multiplier and steps must broadcast to one schedule; "
                     f"got shapes {q.shape}, {sigma.shape}, {t.shape}.") from None
  shape = shape or (1,)
  return tuple(jnp.broadcast_to(v.astype(dtype), shape) for v in (q, sigma, t))


def _check_schedule(sampling_rate, noise_multiplier, steps, delta=None):
  _validation.check_range("sampling_rate", sampling_rate, lo=0.0, hi=1.0)
  _validation.check_range("noise_multiplier", noise_multiplier, lo=0.0)
  _validation.check_range("steps", steps, lo=0.0)
  if delta is not None:
    _validation.check_range("delta", delta, lo=0.0, hi=1.0, lo_open=True, hi_open=True)


def _orders(orders, dtype):
  orders = DEFAULT_ORDERS if orders is None else orders
  _validation.check_range("orders", orders, lo=1.0, allow_inf=True)
  return jnp.asarray(orders, dtype)


def _schedule_rdp(q, sigma, t, orders):
  """Σ_i T_i RDP_i at each order (orders of any shape)."""
  rdp = compute_rdp(q, sigma, t, orders.reshape(-1))
  return jnp.sum(rdp, axis=0).reshape(orders.shape)


def _epsilon_at(q, sigma, t, delta, alpha):
  """Improved conversion at one order α > 1 (Balle et al. 2020, Thm. 21)."""
  r = _schedule_rdp(q, sigma, t, alpha[None])[0]
  eps, _ = compute_epsilon(alpha[None], r[None], delta)
  return eps


def dpsgd_epsilon(sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
                  steps: jax.typing.ArrayLike, delta: jax.typing.ArrayLike, *,
                  orders: jax.typing.ArrayLike | None = None,
                  refine_order: bool = True) -> jax.Array:
  r"""ε of DP-SGD with Poisson sampling, for a constant or phased schedule.

  Args:
    sampling_rate: q, a scalar or a 1-D array (one entry per phase), in [0, 1].
    noise_multiplier: σ, scalar or 1-D, ≥ 0.
    steps: steps per phase, scalar or 1-D, ≥ 0. The three broadcast to one schedule.
    delta: δ in (0, 1).
    orders: the order grid (default :data:`jaxrdp.DEFAULT_ORDERS`).
    refine_order: refine the best grid order continuously (never looser than the grid).

  Returns:
    ε (a scalar in the inputs' dtype). Jittable; differentiable with respect to
    ``sampling_rate``, ``noise_multiplier`` (every entry of a schedule), ``steps`` and
    ``delta``, with exact envelope gradients at the optimal order.

  References:
    Abadi et al. 2016 (DP-SGD); Mironov, Talwar, Zhang 2019 (RDP of the sampled Gaussian);
    Balle et al. 2020, Thm. 21 (conversion).
  """
  _check_schedule(sampling_rate, noise_multiplier, steps, delta)
  q, sigma, t = _phases(sampling_rate, noise_multiplier, steps)
  grid = _orders(orders, q.dtype)
  return _dpsgd_epsilon(q, sigma, t, jnp.asarray(delta, q.dtype), grid, refine_order)


@functools.partial(jax.jit, static_argnames=("refine_order",))
def _dpsgd_epsilon(q, sigma, t, delta, grid, refine_order):
  rdp = _schedule_rdp(q, sigma, t, grid)
  eps_grid, order = compute_epsilon(grid, rdp, delta)
  if not refine_order or grid.shape[0] < 2:
    return eps_grid
  # Bracket: the grid neighbours of the best grid order (finite orders > 1 only).
  finite = jnp.isfinite(grid) & (grid > 1)
  below = jnp.max(jnp.where(finite & (grid < order), grid, -jnp.inf))
  above = jnp.min(jnp.where(finite & (grid > order), grid, jnp.inf))
  lo = jnp.where(jnp.isfinite(below), below, jnp.minimum(order, 1 + 1e-3))
  hi = jnp.where(jnp.isfinite(above), above, order)
  lo, hi = lax.stop_gradient(lo), lax.stop_gradient(hi)
  q_, s_, t_, d_ = (lax.stop_gradient(v) for v in (q, sigma, t, delta))
  f = lambda a: _epsilon_at(q_, s_, t_, d_, a)
  ratio = 0.6180339887498949
  a1 = hi - ratio * (hi - lo)
  a2 = lo + ratio * (hi - lo)

  def body(_, state):
    lo, hi, a1, a2, f1, f2 = state
    left = f1 <= f2  # minimum in [lo, a2]
    new_lo = jnp.where(left, lo, a1)
    new_hi = jnp.where(left, a2, hi)
    new_a1 = jnp.where(left, new_hi - ratio * (new_hi - new_lo), a2)
    new_a2 = jnp.where(left, a1, new_lo + ratio * (new_hi - new_lo))
    probe = jnp.where(left, new_a1, new_a2)
    fp = f(probe)
    return (new_lo, new_hi, new_a1, new_a2, jnp.where(left, fp, f2), jnp.where(left, f1, fp))

  state = (lo, hi, a1, a2, f(a1), f(a2))
  state = lax.fori_loop(0, _GOLDEN_STEPS, body, state)
  best_alpha = lax.stop_gradient(jnp.where(state[4] <= state[5], state[2], state[3]))
  ok = finite.any() & (order > 1) & jnp.isfinite(order)
  # Envelope: ε at the (fixed) refined order, differentiated in the schedule and δ.
  eps_refined = _epsilon_at(q, sigma, t, delta, jnp.where(ok, best_alpha, 2.0))
  return jnp.where(ok & (eps_refined < eps_grid), eps_refined, eps_grid)


def _bisect_log(pred_ok, lo, hi, steps):
  """Bisection in log space: pred_ok(hi) holds, pred_ok(lo) does not; returns (lo, hi)."""
  def body(_, bracket):
    lo, hi = bracket
    mid = jnp.sqrt(lo * hi)
    ok = pred_ok(mid)
    return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)
  return lax.fori_loop(0, steps, body, (lo, hi))


def calibrate_noise_multiplier(target_epsilon: jax.typing.ArrayLike, delta: jax.typing.ArrayLike,
                               sampling_rate: jax.typing.ArrayLike, steps: jax.typing.ArrayLike, *,
                               orders: jax.typing.ArrayLike | None = None) -> jax.Array:
  r"""Smallest noise multiplier σ in [1e-4, 1e8] whose ε is at most ``target_epsilon`` (safe side).

  ε is non-increasing in σ; the answer is found by bisection in log σ on the grid-order ε (so
  that it is reproducible with :func:`jaxrdp.compute_epsilon` on the same orders), to a
  relative precision far below 1e-6, and the returned σ always satisfies ε(σ) ≤ target.
  ``sampling_rate`` and ``steps`` may be schedules (1-D); σ is then one multiplier for all
  phases. Jittable (and vmappable over targets). Eagerly, a target that no σ reaches raises
  ``ValueError``; under jit it gives NaN.
  """
  _validation.check_range("target_epsilon", target_epsilon, lo=0.0, lo_open=True)
  _check_schedule(sampling_rate, 1.0, steps, delta)
  q, _, t = _phases(sampling_rate, 1.0, steps)
  grid = _orders(orders, q.dtype)
  result = _calibrate_sigma(jnp.asarray(target_epsilon, q.dtype), jnp.asarray(delta, q.dtype), q, t, grid)
  if _validation.is_concrete(result) and bool(jnp.isnan(result)):
    raise ValueError(f"target_epsilon={float(target_epsilon)} is not reachable with any noise "
                     "multiplier up to 1e8 for this schedule and delta.")
  return result


@jax.jit
def _calibrate_sigma(target, delta, q, t, grid):
  eps_of = lambda s: compute_epsilon(grid, _schedule_rdp(q, jnp.broadcast_to(s, q.shape), t, grid), delta)[0]
  ok = lambda s: eps_of(s) <= target
  # Bracket [lo, hi] with ok(hi) and not ok(lo): hi grows by 4x until private enough.
  lo = jnp.asarray(_SIGMA_MIN, q.dtype)
  hi = lax.while_loop(lambda h: ~ok(h) & (h < _SIGMA_MAX), lambda h: h * 4,
                      jnp.asarray(1.0, q.dtype))
  _, hi_b = _bisect_log(ok, lo, hi, _CALIBRATION_STEPS)
  result = jnp.where(ok(lo), lo, hi_b)
  return jnp.where(ok(hi), result, jnp.nan)


def calibrate_sampling_rate(target_epsilon: jax.typing.ArrayLike, delta: jax.typing.ArrayLike,
                            noise_multiplier: jax.typing.ArrayLike, steps: jax.typing.ArrayLike, *,
                            orders: jax.typing.ArrayLike | None = None) -> jax.Array:
  r"""Largest sampling rate q in (0, 1] whose ε is at most ``target_epsilon`` (safe side).

  ε is non-decreasing in q; bisection in log q on the grid-order ε. Returns 1 when even q = 1
  meets the target. Eagerly, a target no q > 1e-12 reaches raises ``ValueError``; NaN under jit.
  """
  _validation.check_range("target_epsilon", target_epsilon, lo=0.0, lo_open=True)
  _check_schedule(0.5, noise_multiplier, steps, delta)
  _, sigma, t = _phases(0.5, noise_multiplier, steps)
  grid = _orders(orders, sigma.dtype)
  result = _calibrate_q(jnp.asarray(target_epsilon, sigma.dtype), jnp.asarray(delta, sigma.dtype), sigma, t, grid)
  if _validation.is_concrete(result) and bool(jnp.isnan(result)):
    raise ValueError(f"target_epsilon={float(target_epsilon)} is not reachable with any sampling "
                     "rate >= 1e-12 for this noise multiplier, step count and delta.")
  return result


@jax.jit
def _calibrate_q(target, delta, sigma, t, grid):
  eps_of = lambda q: compute_epsilon(grid, _schedule_rdp(jnp.broadcast_to(q, sigma.shape), sigma, t, grid), delta)[0]
  ok = lambda q: eps_of(q) <= target
  one = jnp.asarray(1.0, sigma.dtype)
  floor = jnp.asarray(1e-12, sigma.dtype)
  # Bisection keeps ok(lo) true and ok(hi) false: swap roles via the predicate's negation.
  lo_b, hi_b = _bisect_log(lambda qq: ~ok(qq), floor, one, _CALIBRATION_STEPS)
  result = jnp.where(ok(one), one, lo_b)
  return jnp.where(ok(floor), result, jnp.nan)


def calibrate_steps(target_epsilon: jax.typing.ArrayLike, delta: jax.typing.ArrayLike,
                    sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike, *,
                    max_steps: int = 10 ** 9,
                    orders: jax.typing.ArrayLike | None = None) -> jax.Array:
  r"""Largest whole number of steps whose ε is at most ``target_epsilon`` (safe side).

  ε is non-decreasing in the step count; integer bisection on [0, max_steps]. Returns 0 when
  not even one step meets the target (eagerly: ``ValueError``) and ``max_steps`` when all do.
  Constant (scalar) ``sampling_rate`` and ``noise_multiplier`` only.
  """
  _validation.check_range("target_epsilon", target_epsilon, lo=0.0, lo_open=True)
  _check_schedule(sampling_rate, noise_multiplier, 1.0, delta)
  q, sigma, _ = _phases(sampling_rate, noise_multiplier, 1.0)
  if q.shape != (1,):
    raise ValueError("calibrate_steps takes a constant sampling_rate and noise_multiplier.")
  grid = _orders(orders, q.dtype)
  lo = _calibrate_steps(jnp.asarray(target_epsilon, q.dtype), jnp.asarray(delta, q.dtype), q, sigma,
                        grid, float(max_steps))
  if _validation.is_concrete(lo) and float(lo) == 0:
    raise ValueError(f"target_epsilon={float(target_epsilon)} is not reachable even with one step.")
  return lo


@functools.partial(jax.jit, static_argnames=("max_steps",))
def _calibrate_steps(target, delta, q, sigma, grid, max_steps):
  per_step = _schedule_rdp(q, sigma, jnp.ones_like(q), grid)
  ok = lambda n: compute_epsilon(grid, per_step * n, delta)[0] <= target

  def body(_, bracket):
    lo, hi = bracket  # ok(lo) holds, ok(hi) does not (or hi = max + 1)
    mid = jnp.floor((lo + hi) / 2)
    good = ok(mid)
    return jnp.where(good, mid, lo), jnp.where(good, hi, mid)
  lo, hi = jnp.asarray(0.0, q.dtype), jnp.asarray(max_steps + 1, q.dtype)
  lo, _ = lax.fori_loop(0, 64, body, (lo, hi))
  return lo
