r"""The Rényi-DP accountant of a training run: a pytree state and a pure step function.

RDP composes by addition (Mironov 2017, Prop. 1): T adaptively chosen mechanisms whose step t
is :math:`(\alpha, \varepsilon_t(\alpha))`-RDP are, together, :math:`(\alpha, \sum_t
\varepsilon_t(\alpha))`-RDP at every order α. A training run repeats one mechanism for long
stretches (constant hyperparameters, or a schedule that changes them now and then), so the
accountant keeps the current *segment*: the parameters θ of the last step's mechanism (for
DP-SGD θ = (q, σ)), its per-step RDP :math:`\varepsilon_\theta(\alpha)`, and the number n of
steps taken with it. The closed segments are summed into S with Kahan's compensation c, and

.. math:: \mathrm{RDP}(\alpha) = \big(S(\alpha) - c(\alpha)\big) + n\,\varepsilon_\theta(\alpha).

* A step with the same θ only increments n: one rounding per segment (the product n·ε)
  instead of one addition per step, so a float32 accountant does not drift.
* A step with a new θ closes the segment, :math:`S \leftarrow S + n\,\varepsilon_\theta` by
  Kahan (compensated) summation (Kahan 1965: error O(ε_mach), independent of the number of
  segments), and computes :math:`\varepsilon_{\theta'}` once. A segment is also closed after
  :math:`2^{24}` steps, so that n stays exact in float32.
* Never a smaller ε: a per-step RDP that cannot be computed (e.g. invalid θ under ``jit``) is
  NaN, and so is every order of a state whose orders differ from those the per-step RDP is
  given at (a state from another accountant); :func:`jaxrdp.compute_epsilon` skips NaN orders
  and returns ε = +inf if none is left.

The state is a NamedTuple of arrays, so it lives in an optimizer state, goes through
``jax.jit`` and ``lax.scan``, and is checkpointed like any pytree; :func:`step` is pure.
:func:`jaxrdp.differentially_private_aggregate` keeps one in its state.

References:
  Mironov, "Rényi Differential Privacy", CSF 2017, arXiv:1702.07476, Prop. 1. Kahan, "Further
  remarks on reducing truncation errors", Comm. ACM 8(1), 1965.
"""

from __future__ import annotations

import functools
import operator
from typing import Callable, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
from jax import lax

from jaxrdp._internal import loops
from jaxrdp._internal import validation

StepRdp = Union[jax.typing.ArrayLike, Callable[..., jax.typing.ArrayLike]]

# Steps per segment before it is closed even without a change: keeps ``segment_steps`` exact
# when converted to float32 (2**24) and far from int32 overflow.
_MAX_SEGMENT_STEPS = 2 ** 24


class RdpAccountantState(NamedTuple):
  r"""State of the segment accountant (see the module docstring).

  Attributes:
    orders: the Rényi orders α, shape (K,).
    rdp: S, the RDP of the closed segments at each order, Kahan-summed, shape (K,).
    rdp_compensation: c, Kahan's compensation of ``rdp`` (the exact sum is ``rdp -
      rdp_compensation``), shape (K,).
    mechanism: θ, the parameters of the current segment's mechanism, a tuple of scalars (for
      DP-SGD ``(sampling_rate, noise_multiplier)``); NaN before the first step.
    step_rdp: :math:`\varepsilon_\theta(\alpha)`, the RDP of one step of the current segment,
      shape (K,).
    segment_steps: n, int32, the steps taken in the current segment.
  """
  orders: jax.Array
  rdp: jax.Array
  rdp_compensation: jax.Array
  mechanism: tuple[jax.Array, ...]
  step_rdp: jax.Array
  segment_steps: jax.Array


def init(orders: jax.typing.ArrayLike, num_parameters: int, dtype=None) -> RdpAccountantState:
  """An accountant that has taken no step.

  Args:
    orders: the Rényi orders α ≥ 1 (``inf`` allowed), 1-D.
    num_parameters: the number of parameters θ of the mechanism (2 for DP-SGD's (q, σ)).
    dtype: the accountant's floating dtype (default: float64 when x64 is enabled, else
      float32).

  Returns:
    An :class:`RdpAccountantState` with zero RDP and no segment (θ = NaN, so that the first
    :func:`step` opens one).

  Raises:
    ValueError: ``orders`` not 1-D or below 1, ``num_parameters`` negative, or ``dtype``
      float64 without x64.
    TypeError: ``dtype`` not a floating dtype, or ``num_parameters`` not an int.
  """
  dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"dtype must be a floating dtype, got {dtype}.")
  if jax.dtypes.canonicalize_dtype(dtype) != dtype:
    raise ValueError(f"dtype={dtype} is not available: enable jax_enable_x64 for float64 "
                     "(jaxrdp never changes that flag).")
  validation.check_int("num_parameters", num_parameters, lo=0)
  validation.check("orders", orders)
  orders = jnp.asarray(orders, dtype)
  if orders.ndim != 1:
    raise ValueError(f"orders must be 1-D, got shape {orders.shape}.")
  zeros = jnp.zeros(orders.shape, dtype)
  nan = jnp.full((), jnp.nan, dtype)
  return RdpAccountantState(
      orders=orders, rdp=zeros, rdp_compensation=zeros,
      mechanism=(nan,) * num_parameters, step_rdp=zeros,
      segment_steps=jnp.zeros((), jnp.int32))


def _kahan_add(total, compensation, x):
  """total + x with Kahan's compensation (the exact sum is ``total - compensation``).

  Infinite or NaN values are carried by ``total``; the compensation then stays 0 so that
  it never turns an infinite total into NaN."""
  y = x - compensation
  t = total + y
  c = (t - total) - y
  return t, jnp.where(jnp.isfinite(t) & jnp.isfinite(c), c, 0)


def step(state: RdpAccountantState, mechanism: Sequence[jax.typing.ArrayLike],
         step_rdp: StepRdp, *, orders: jax.typing.ArrayLike) -> RdpAccountantState:
  r"""The accountant after one more step, of the mechanism with parameters θ = ``mechanism``.

  If θ equals the current segment's, the segment gets one more step; otherwise the segment
  is closed (:math:`S \leftarrow S + n\,\varepsilon_\theta`, Kahan-summed) and a new one opens
  at θ with one step. Pure; works eagerly and under ``jax.jit`` / ``lax.scan``.

  Args:
    state: the accountant.
    mechanism: θ, the step's mechanism parameters, a sequence of scalars (as many as given
      to :func:`init`); cast to the accountant's dtype.
    step_rdp: :math:`\varepsilon_\theta` at ``orders``, the RDP of one step: an array (θ is
      constant: computed once, outside the step's graph), or a callable ``*θ -> array`` called
      only when θ changes (a Python branch for concrete values, ``lax.cond`` under a trace,
      a branch also under ``jax.vmap``).
    orders: the orders ``step_rdp`` is given at. At orders where the state's differ (a state
      from another accountant), the new segment's RDP is NaN: that order is skipped by the
      conversion to ε, never given a wrong value.

  Returns:
    The :class:`RdpAccountantState` after the step.

  Raises:
    ValueError: ``mechanism`` has another number of parameters than the state, or ``orders``
      another shape.
    TypeError: ``mechanism`` is not a tuple or list.
  """
  dtype = state.rdp.dtype
  if not isinstance(mechanism, (tuple, list)):
    raise TypeError(f"mechanism must be a tuple of the mechanism's parameters, got "
                    f"{type(mechanism).__name__}.")
  if len(mechanism) != len(state.mechanism):
    raise ValueError(f"mechanism must have {len(state.mechanism)} parameters (those of the "
                     f"state's segments), got {len(mechanism)}.")
  if jnp.shape(orders) != state.orders.shape:
    raise ValueError(f"orders must have the shape of the state's orders, {state.orders.shape}; "
                     f"got {jnp.shape(orders)}.")
  mechanism = tuple(jnp.asarray(x, dtype) for x in mechanism)
  # A state without steps opens a segment whatever θ is (not only because its θ is NaN).
  changed = functools.reduce(operator.or_, (new != old for new, old in zip(
      mechanism, state.mechanism)), state.segment_steps == 0)
  if not callable(step_rdp):
    new_step_rdp = jnp.where(changed, jnp.asarray(step_rdp, dtype), state.step_rdp)
  elif validation.is_concrete((changed,)):  # eager use: no cond to compile
    new_step_rdp = jnp.asarray(step_rdp(*mechanism), dtype) if bool(changed) else state.step_rdp
  else:   # computed only when θ changes, also under jax.vmap over runs with their own
    # schedules (θ batched): there the branch runs for the whole batch where any lane's θ
    # changed (loops.any_lane), and every lane keeps its own segment's value unless its θ did.
    new_step_rdp = lax.cond(
        loops.any_lane(changed),
        lambda: jnp.where(changed, jnp.asarray(step_rdp(*mechanism), dtype), state.step_rdp),
        lambda: state.step_rdp)
  new_step_rdp = jnp.where(state.orders == orders, new_step_rdp, jnp.nan)
  close = changed | (state.segment_steps >= _MAX_SEGMENT_STEPS)
  steps = state.segment_steps.astype(dtype)
  segment = jnp.where(close & (state.segment_steps > 0), steps * state.step_rdp, 0)
  rdp, compensation = _kahan_add(state.rdp, state.rdp_compensation, segment)
  return RdpAccountantState(
      orders=state.orders, rdp=rdp, rdp_compensation=compensation, mechanism=mechanism,
      step_rdp=new_step_rdp,
      segment_steps=jnp.where(close, 1, state.segment_steps + 1).astype(jnp.int32))


def accumulated_rdp(state: RdpAccountantState) -> tuple[jax.Array, jax.Array]:
  r"""(orders, RDP) of all the steps taken: :math:`(S - c) + n\,\varepsilon_\theta` at each order.

  Args:
    state: the accountant.

  Returns:
    ``(orders, rdp)``, both of shape (K,), in the accountant's dtype.
  """
  steps = state.segment_steps.astype(state.step_rdp.dtype)
  current = jnp.where(state.segment_steps > 0, steps * state.step_rdp, 0)
  return state.orders, (state.rdp - state.rdp_compensation) + current
