r"""The derivative of a DP-SGD schedule's ε: the envelope theorem at the optimal order.

ε is the minimum over the orders of the conversion of the schedule's RDP, so its derivative
is that of the conversion at the optimal order, held fixed (:func:`_envelope`, a custom JVP
around the order search's result: the grid's values never enter the derivative's graph). The
RDP at that order is differentiated in forward mode, every phase at once: through the split
of that one order for concrete values (:func:`_concrete_gradient`, :func:`_gradient_at`,
whose program :func:`_prepare_gradient` compiles while the search runs), on shared nodes
otherwise (:func:`_epsilon_gradient`). Also the two concrete-grid helpers that the search
and the calibrations share: :func:`_concrete_split` and :func:`_first_without_fallback`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import loops
from jaxrdp._internal import validation
from jaxrdp.accounting import composition
from jaxrdp.mechanisms import sampled_gaussian
from jaxrdp.accounting.conversion import epsilon_at_orders, epsilon_partials


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
  grads = gradient_at_order(best, *args, wanted=wanted, eps=eps)
  pairs = tuple((g, d) for g, d, w in zip(grads, dots, wanted) if w)
  return eps, _contract(*zip(*pairs)).astype(eps.dtype)


_envelope.defjvp(_envelope_jvp, symbolic_zeros=True)


def gradient_at_order(best, q, sigma, t, delta, wanted, eps=None):
  """d ε / d(q, σ, T, δ) at the fixed order ``best`` along the ``wanted`` directions: through
  that order's split for concrete values (:func:`_concrete_gradient`), else on shared nodes
  (:func:`_epsilon_gradient`, as a function of the primals alone). ``eps``: ε there, where the
  caller has it (the search's result: the derivative's program then holds no conversion)."""
  grads = _concrete_gradient(best, q, sigma, t, delta, wanted=wanted, eps=eps)
  if grads is None:
    with_eps = eps is not None
    grads = loops.of_primals(lambda *a: _epsilon_gradient(
        *a[:5], wanted=wanted, eps=a[5] if with_eps else None))(
            best, q, sigma, t, delta, *((eps,) if with_eps else ()))
  return grads


@jax.jit
@loops.without_nested_jit
def _contract(grads, dots):
  """Σ <gradient, tangent>: one compiled linear map (eagerly, its transpose under jax.grad is
  one program too, instead of a dozen single operations each compiled on its own)."""
  return sum(jnp.sum(g * d) for g, d in zip(grads, dots))


@functools.partial(compilation.jit, static_argnames=("wanted",))
def _epsilon_gradient(best, q, sigma, t, delta, wanted=(True,) * 4, eps=None):
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
  if len(directions) == 2:
    tangent = [jnp.concatenate(d) for d in zip(*directions)]
  else:   # one direction (or none): the other is not differentiated at all
    tangent = [None if not wanted[i] else one for i in range(2)]
  rdp, d_rdp, certified = sampled_gaussian.rdp_tangent_at_order(stack(q), stack(sigma), alpha,
                                                                *tangent)
  rdp, d_rdp = rdp[:n], iter(d_rdp.reshape(len(directions), n))
  d_q, d_sigma = (next(d_rdp) if w else zero for w in wanted[:2])
  return _masked(usable, jnp.all(certified | (stack(t) == 0)),
                 _chain(alpha, t, delta, rdp, d_q, d_sigma, eps))


def _chain(alpha, t, delta, rdp, d_q, d_sigma, eps=None):
  """d ε / d(q, σ, T, δ) at the order ``alpha`` (finite, > 1) from each phase's RDP per step
  there and its partial derivatives per step: the chain rule through Σ_i T_i RDP_i and the
  conversion (:func:`jaxrdp.accounting.conversion.epsilon_partials`; a phase without steps
  adds nothing). ``eps``: ε at that order where the caller has it (the search's result)."""
  alpha = jnp.reshape(alpha, ())
  total = jnp.sum(jnp.where(t == 0, 0.0, t * rdp))
  if eps is None:
    eps = epsilon_at_orders(alpha, total, delta)
  d_total, d_delta = epsilon_partials(alpha, eps, delta)
  per_phase = lambda v: jnp.where(t == 0, 0.0, d_total * v)
  return per_phase(t * d_q), per_phase(t * d_sigma), per_phase(rdp), d_delta


def _rdp_and_derivatives(rdp_of, q, sigma, t, wanted):
  """(T·RDP (n, m), its derivatives (k, n, m) along the k wanted directions of every q and of
  every σ) of ``rdp_of(q, sigma, t)`` (T·RDP per phase (n,) and order (m,)), in forward mode:
  phase i's RDP depends on (q_i, σ_i) alone, so one pass over the phases stacked k times, copy
  c moving along the c-th wanted direction, gives all of them. A direction not wanted is not
  taken, in the kernel's loop either (``jax.grad`` with respect to σ alone: one copy of the
  phases, not two, and no derivative along q traced: the 30-phase ``value_and_grad`` runs in
  half the time, and ``jax.grad`` of ε compiles 92 kernels, not 100)."""
  moving = [i for i in (0, 1) if wanted[i]]
  n = q.shape[0]
  copies = len(moving)
  stack = lambda v: jnp.concatenate([v] * copies) if copies > 1 else v
  primals = [stack(q), stack(sigma)]
  unit = lambda i: jnp.concatenate([jnp.full((n,), float(i == j), q.dtype) for j in moving])

  def along(*values):
    args = list(primals)
    for i, v in zip(moving, values):
      args[i] = v
    return rdp_of(*args, stack(t))
  r, d_r = jax.jvp(along, tuple(primals[i] for i in moving), tuple(unit(i) for i in moving))
  return r[:n], d_r.reshape((copies, n) + r.shape[1:])


def _search_gradient(eps, best, q, sigma, t, delta, rdp, d_rdp, wanted):
  """d ε / d(q, σ, T, δ) at the order ``best``, where the search found ε = ``eps``, from T·RDP
  per phase there and its derivatives along the ``wanted`` directions (as
  :func:`_epsilon_gradient`): zero where no order is usable, NaN where a value was not
  certified."""
  usable = jnp.isfinite(best) & (best > 1)
  live = t > 0
  per_step = lambda v: jnp.where(live, v / jnp.where(live, t, 1.0), 0.0)
  d_rdp = iter(d_rdp)
  zero = jnp.zeros_like(q)
  d_q, d_sigma = (per_step(next(d_rdp)) if w else zero for w in wanted[:2])
  return _masked(usable, jnp.all(jnp.isfinite(rdp) | ~live),
                 _chain(jnp.where(usable, best, 2.0), t, delta, per_step(rdp), d_q, d_sigma, eps))


def _masked(usable, certified, grads):
  """The gradients where an order is usable and every value at it certified; 0 where no order
  is usable, NaN where a value is not certified."""
  return tuple(jnp.where(usable, jnp.where(certified, g, jnp.nan), 0.0) for g in grads)


def _concrete_gradient(best, q, sigma, t, delta, wanted=(True,) * 4, eps=None):
  """:func:`_epsilon_gradient` for concrete values at a usable order, through the split of that
  one order (the exact sum at an integer order, shared nodes at a fractional one up to 64,
  whose derivatives come from the same pass), so that the per-order quadrature is compiled
  only when a value is left open; None otherwise."""
  if not validation.is_concrete((best, q, sigma, t, delta, eps)):
    return None
  alpha = np.asarray(best).reshape(1)
  if not (np.isfinite(alpha[0]) and alpha[0] > 1):
    return None
  split, tables = _concrete_split(alpha)
  q, sigma, t, delta = (np.asarray(v) for v in (q, sigma, t, delta))   # as _prepare_gradient's
  eps = None if eps is None else np.asarray(eps, q.dtype)
  return _first_without_fallback(functools.partial(_gradient_at, split=split, wanted=wanted,
                                                   eps=eps),
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
  prepare_gradient(*values, wanted=wanted)


def prepare_gradient(q, sigma, t, delta, wanted):
  """Compiles in the background the program of ε's derivative along the ``wanted`` (static)
  directions of (q, σ, T, δ) for these concrete phases, at a fractional order up to 64
  (:func:`_prepare_gradient`), unless it is compiled already: for a caller that knows a
  derivative of this shape is coming (:func:`jaxrdp.optimize_schedule`'s first iteration),
  so that it compiles while other work runs."""
  q, sigma, t, delta = (np.asarray(v) for v in (q, sigma, t, delta))
  alpha = np.full(1, _LIKELY_ORDER, q.dtype)
  split, tables = _concrete_split(alpha)
  _gradient_at.prepare(alpha, q, sigma, t, delta, tables, False, split=split,
                       wanted=tuple(wanted), eps=np.zeros((), q.dtype))   # (ε: the search's)


@functools.partial(compilation.jit, static_argnames=("split", "fallback", "wanted"),
                   work=lambda arguments: arguments["q"].size)
def _gradient_at(alpha, q, sigma, t, delta, tables, fallback, split, wanted=(True,) * 4,
                 eps=None):
  """(d ε / d(q, σ, T, δ) at the one order ``alpha`` with its ``split``, open). Forward mode:
  phase i's RDP depends on (q_i, σ_i) alone, so two tangents (every q, every σ) give all its
  partial derivatives, whatever the number of phases, and the graph holds no transpose.
  ``wanted`` (static): which of the four are needed; only those directions are taken (the
  others are returned as zeros). ``eps``: ε at the order (the search's), or None: converted
  here (:func:`_chain`)."""
  def rdp_of(q_, s_):
    out = composition.rdp_of_steps(q_, s_, jnp.ones_like(q_), alpha, split, tables,
                                            fallback=fallback)
    rdp, pending = (out, jnp.zeros(out.shape, bool)) if fallback else out
    return rdp[:, 0], jnp.any(pending)
  one, zero = jnp.ones_like(q), jnp.zeros_like(q)
  directions = [d for d, w in zip(((one, zero), (zero, one)), wanted[:2]) if w]
  if len(directions) == 2:   # one direction per copy of the phases (the nested grids carry one)
    n = q.shape[0]
    rdp, d_rdp, is_open = jax.jvp(rdp_of, (jnp.concatenate([q, q]), jnp.concatenate([sigma, sigma])),
                                  (jnp.concatenate([one, zero]), jnp.concatenate([zero, one])),
                                  has_aux=True)
    rdp, d_rdp = rdp[:n], d_rdp.reshape(2, n)
  elif directions:
    rdp, d_rdp, is_open = jax.jvp(rdp_of, (q, sigma), directions[0], has_aux=True)
    d_rdp = [d_rdp]
  else:
    (rdp, is_open), d_rdp = rdp_of(q, sigma), []
  d_rdp = iter(d_rdp)
  d_q, d_sigma = (next(d_rdp) if w else zero for w in wanted[:2])
  return _chain(alpha, t, delta, rdp, d_q, d_sigma, eps), is_open


def _first_without_fallback(fn, *args):
  """fn(*args, fallback) for a function that returns (result, open): for concrete arguments
  first without the per-order quadrature (rarely needed, so rarely compiled), again with it
  only when a value was left open; inside a graph with it at once."""
  if validation.is_concrete(args):
    result, is_open = fn(*args, False)
    if not bool(is_open):
      return result
  return fn(*args, True)[0]


def _concrete_split(grid):
  """(split, tables) of a concrete grid (:func:`jaxrdp.mechanisms.sampled_gaussian.order_split`), None for
  a traced one."""
  split = sampled_gaussian.order_split(grid)
  return None if split is None else (split, sampled_gaussian.order_tables(grid, split))
