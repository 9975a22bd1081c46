r"""The iterations of :func:`jaxrdp.optimize_schedule`: one step, and the whole design in a graph.

A step (:func:`step_function`, made of the parts of :func:`step_parts`) moves the scale u onto
the budget's boundary by one Newton step in u on
:math:`h(u, \theta) = \log\varepsilon(e^{u}\tilde\sigma) - \log\varepsilon^\star`, then takes
the optimiser's step on the utility's total derivative along the boundary (the
implicit-function theorem, :math:`du/d\theta = -h_\theta / h_u`). The host driver in
:mod:`jaxrdp.accounting.schedules` calls the parts once per iteration (ε and its gradient
eagerly, the rest compiled); :func:`design_in_graph` runs the composed step in a ``lax.scan``
and the safe re-scaling in the calibrations' root finder
(:func:`jaxrdp.accounting.roots._safe_boundary`), so that the whole design is one JAX function:
it runs inside a user's ``jax.jit``, with traced budgets, schedules and keys.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxrdp._internal import loops
from jaxrdp.accounting.roots import _safe_boundary

FAMILIES = ("phases", "exponential", "polynomial")   # the shapes' forms (:func:`parametrisation`)
WARMUP_STEPS = 5   # Newton steps onto the boundary before the first optimiser step (in a graph)
_SCALE_RANGE = 40.0   # the safe scale is searched for in [-40, 40] (σ within e^±40 of the shape)


def rates_of(q0, t, count=None):
  """phi -> the sampling rates of the shape phi: q_i = Q e^phi_i / sum_j T_j e^phi_j with
  Q = sum_i T_i q0_i (the expected gradient count of the initial schedule, ``count`` where
  computed already), capped at 1; phi None: q0."""
  count = jnp.sum(t * q0) if count is None else count

  def rates(phi):
    if phi is None:
      return q0
    w = jnp.exp(phi - jnp.max(phi))
    return jnp.minimum(count * w / jnp.sum(t * w), 1.0)
  return rates


@functools.partial(jax.jit, static_argnames=("family", "degree"))
def _anchors(sigma0, q0, t, family, degree):
  """(θ0 = log σ0, φ0 = log q0 (0 where T = 0), the gradient count Σ T q0, the basis of the
  shapes' family (None for "phases")) of :func:`parametrisation`, one compiled program (the
  host driver's setup would otherwise compile each operation on its own)."""
  phi0 = jnp.log(jnp.where(t > 0, q0, 1.0))
  basis = None
  if family != "phases":
    ends = jnp.cumsum(t)
    x = (ends - 0.5 * t) / ends[-1]
    basis = jnp.stack([x ** k for k in range(1, (1 if family == "exponential" else degree) + 1)],
                      axis=-1)
  return jnp.log(sigma0), phi0, jnp.sum(t * q0), basis


def parametrisation(sigma0, q0, t, design, family="phases", degree=2):
  """(initial shape, unpack): the shape optimised, a pair (for σ, for q; None where held), and
  ``unpack(shape)`` -> (θ = log σ up to the scale, q). Per ``family``, with x_i the midpoint of
  phase i's steps as a fraction of all steps:

  * ``"phases"``: θ_i and φ_i free (φ: log q up to the count's normalisation,
    :func:`rates_of`);
  * ``"exponential"``: θ_i = θ0_i + a·x_i, φ_i = φ0_i + b·x_i (σ and q change by a constant
    factor per step);
  * ``"polynomial"``: θ_i = θ0_i + Σ_{k=1..degree} a_k x_i^k, and φ alike.

  The constant term is the budget's scale (σ) or the gradient count's normalisation (q).
  θ0 = log σ0 (``sigma0``: the initial noise multipliers)."""
  theta0, phi0, count, basis = _anchors(sigma0, q0, t, family, degree)
  rates = rates_of(q0, t, count)
  start = lambda v0: v0 if basis is None else jnp.zeros(basis.shape[-1], v0.dtype)
  shape = (start(theta0) if design != "sampling_rate" else None,
           start(phi0) if design != "noise_multiplier" else None)

  def unpack(shape):
    a, b = shape
    theta = theta0 if a is None else (a if basis is None else theta0 + basis @ a)
    phi = None if b is None else (b if basis is None else phi0 + basis @ b)
    return theta, rates(phi)
  return shape, unpack


def step_parts(utility, optimizer, unpack, epsilon, moves_q=True):
  """One iteration on the shape (:func:`parametrisation`, whose ``unpack`` gives θ and q) in
  three parts, ``(at, boundary, advance)``:

  * ``at(shape, u)`` -> (σ, q) = (e^{u + θ}, q) of the iterate;
  * ``boundary(σ, q, pld_grid)`` -> (h, (∂h/∂σ, ∂h/∂q)) with h = log ε(q, σ), ``epsilon`` the
    budget's accountant (:func:`jaxrdp.accounting.schedules._epsilon_of`) read at the grid
    orders (RDP) or on ``pld_grid`` (PLD); ∂h/∂q is zero unless ``moves_q``;
  * ``advance(shape, u, opt_state, log_target, key, h, h_sigma, h_q, learn=True)`` ->
    ((shape, u, opt_state, utility), whether ε was finite): the Newton step onto the boundary
    and the optimiser's step, ∂h/∂u and ∂h/∂shape by the chain rule through ``at``. ``learn``
    false (a traced bool): the Newton step only, the shape and the optimiser's state kept.

  :func:`step_function` composes them into one traced step; the host driver of
  :func:`jaxrdp.optimize_schedule` calls ``boundary`` eagerly (the accountant's own compiled
  programs, kept across calls) and compiles only ``at`` and ``advance``."""
  def at(shape, u):
    theta, q = unpack(shape)
    return jnp.exp(u + theta), q

  log_eps = lambda sigma, q, pld_grid: jnp.log(epsilon(q, sigma, refine=False, pld_grid=pld_grid))
  if moves_q:
    boundary = jax.value_and_grad(log_eps, argnums=(0, 1))
  else:
    def boundary(sigma, q, pld_grid):
      h, h_sigma = jax.value_and_grad(log_eps)(sigma, q, pld_grid)
      return h, (h_sigma, jnp.zeros_like(q))

  def utility_at(sigma, q, key):
    return utility(sigma, q) if key is None else utility(sigma, q, key)
  u_grad = jax.grad(lambda u, shape, key: utility_at(*at(shape, u), key), argnums=(0, 1))

  def advance(shape, u, opt_state, log_target, key, h, h_sigma, h_q, learn=True):
    _, pullback = jax.vjp(at, shape, u)
    h_shape, h_u = pullback((h_sigma, h_q))
    h_u = jnp.where(h_u < 0, h_u, -1.0)   # ε strictly decreases in the scale
    # Newton step onto the boundary, damped to a factor e^2 in σ; where ε is infinite or NaN
    # (a coarse order grid, tiny σ, a PLD grid too small) there is no Newton step: more
    # noise, by e^0.5.
    newton = u - (h - log_target) / h_u
    u = jnp.where(jnp.isfinite(newton), jnp.clip(newton, u - 2.0, u + 2.0), u + 0.5)
    dU_du, dU_dshape = u_grad(u, shape, key)
    # implicit-function theorem; no direction where it is not finite: keep the shape there
    total = lambda a, b: a - dU_du * b / h_u
    grad = jax.tree_util.tree_map(lambda a, b: jnp.where(jnp.isfinite(total(a, b)),
                                                         total(a, b), 0.0), dU_dshape, h_shape)
    updates, new_state = optimizer.update(grad, opt_state, shape)
    new_shape = jax.tree_util.tree_map(lambda p, d: (p + d).astype(p.dtype), shape, updates)
    if learn is not True:
      keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(learn, a, b), new, old)
      new_shape, new_state = keep(new_shape, shape), keep(new_state, opt_state)
    return (new_shape, u, new_state, utility_at(*at(new_shape, u), key)), jnp.isfinite(h)
  return at, boundary, advance


def step_function(utility, optimizer, unpack, epsilon, moves_q=True):
  """``step(shape, u, opt_state, log_target, key, pld_grid=None, learn=True)`` ->
  ((shape, u, opt_state, utility), whether ε was finite): :func:`step_parts` composed into one
  iteration (traced as one function)."""
  at, boundary, advance = step_parts(utility, optimizer, unpack, epsilon, moves_q)

  def step(shape, u, opt_state, log_target, key, pld_grid=None, learn=True):
    h, (h_sigma, h_q) = boundary(*at(shape, u), pld_grid)
    return advance(shape, u, opt_state, log_target, key, h, h_sigma, h_q, learn)
  return step


def safe_scale_in_graph(theta, u_guess, q, epsilon, target, pld_grid=None):
  """(u, ε there): the smallest scale u (to 1e-9) with ε(e^u e^θ) at most ``target`` by a few
  ulps, ε the budget's accountant at the refined order (or on ``pld_grid``), and that ε; NaN
  both where no u in [-40, 40] meets the target. The calibrations' safe-side root finder, in
  the graph: every point it returns was evaluated and met the target."""
  dtype = u_guess.dtype
  # A few ulps below the target: the same ε read on another path (eagerly, dpsgd_epsilon)
  # may differ in its last bits.
  log_target = jnp.log(target) + math.log1p(-16 * float(np.finfo(dtype).eps))

  def g(u):
    eps = epsilon(q, jnp.exp(u + theta), pld_grid=pld_grid).astype(dtype)
    return jnp.log(eps) - log_target, jnp.zeros((), bool), eps
  u, found, _, eps = _safe_boundary(g, u_guess, -_SCALE_RANGE, _SCALE_RANGE,
                                    batched_as=(theta, q, target), with_value=True)
  return jnp.where(found, u, jnp.nan), jnp.where(found, eps, jnp.nan)


def design_in_graph(utility, optimizer, shape, unpack, epsilon, target, num_iterations,
                    key=None, pld_grid=None, callback=None):
  """(σ, q, ε, utility, history) of :func:`jaxrdp.optimize_schedule` as one JAX function.

  From the initial ``shape`` (:func:`parametrisation`) at scale 0, WARMUP_STEPS Newton steps
  move the scale onto the budget's boundary (the host driver solves for it instead); then
  ``num_iterations`` steps of :func:`step_function` in a ``lax.scan`` (the same step the host
  driver compiles, with key ``fold_in(key, i)`` at iteration i), and the safe re-scaling of the
  result (:func:`safe_scale_in_graph`). ``callback(iteration, utility)`` is called from the
  graph (``jax.debug.callback``) after each iteration."""
  step = step_function(utility, optimizer, unpack, epsilon, moves_q=shape[1] is not None)
  theta0 = unpack(shape)[0]
  dtype = theta0.dtype
  log_target = jnp.log(jnp.asarray(target, dtype))
  report = None
  if callback is not None:
    def report(i, value):
      if int(i) >= 1:
        callback(int(i), float(value))

  def body(carry, i):
    shape, u, opt_state = carry
    draw = None if key is None else jax.random.fold_in(key, jnp.maximum(i, 0))
    (shape, u, opt_state, value), _ = step(shape, u, opt_state, log_target, draw,
                                           pld_grid=pld_grid, learn=i >= 1)
    if report is not None:
      jax.debug.callback(report, i, value)
    return (shape, u, opt_state), value

  iterations = jnp.arange(1 - WARMUP_STEPS, int(num_iterations) + 1)
  carry = (shape, jnp.zeros((), dtype), optimizer.init(shape))
  (shape, u, _), values = loops.scan(body, carry, iterations)
  theta, q = unpack(shape)
  u, eps = safe_scale_in_graph(theta, u, q, epsilon, target, pld_grid)
  sigma = jnp.exp(u + theta)
  last = None if key is None else jax.random.fold_in(key, int(num_iterations))
  final = utility(sigma, q) if key is None else utility(sigma, q, last)
  return sigma, q, eps, final, values[WARMUP_STEPS:]
