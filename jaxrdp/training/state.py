r"""The state of :func:`jaxrdp.differentially_private_aggregate`, its phase log, and jaxrdp 0.1.0's.

:class:`DifferentiallyPrivateAggregateState` is (key, count, accountant, phases): the noise
key as raw key data, the step count, the RDP accountant
(:class:`jaxrdp.training.accountant.RdpAccountantState`) and, with ``pld_phases=K``, the
:class:`PhaseLog` of the run's (q, σ) phases for the PLD accountant. Its leaves come in the
order of jaxrdp 0.1.0's flat state, so 0.1.0 checkpoints saved as leaves restore as they are;
:func:`state_from_0_1_0` converts the other forms, and :func:`_check_state` refuses a 0.1.0
state, whatever form it was restored in, with a ``TypeError`` that says how to convert it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import jax
import jax.numpy as jnp

from jaxrdp.training import accountant as rdp_accountant


class DifferentiallyPrivateAggregateState(NamedTuple):
  """State of :func:`differentially_private_aggregate`: noise key and RDP accountant.

  Flattened, its leaves are those of jaxrdp 0.1.0's flat state, in the same order (key, count,
  orders, rdp, rdp_compensation, sampling_rate, noise_multiplier, step_rdp, segment_steps): a
  0.1.0 checkpoint saved as leaves restores with
  ``jax.tree.unflatten(jax.tree.structure(opt.init(params)), leaves)``. Built from 0.1.0's 9
  fields instead (positionally, or by their names) it raises a ``TypeError`` naming
  :func:`state_from_0_1_0`, which converts them.

  Attributes:
    key: raw PRNG key data (uint32), split at every step.
    count: int32, steps taken; schedules are evaluated at it.
    accountant: the RDP accountant, a :class:`jaxrdp.training.accountant.RdpAccountantState`
      (orders, rdp, rdp_compensation, mechanism = (sampling_rate, noise_multiplier) of the
      current segment, step_rdp, segment_steps); read it with :func:`rdp_spent`.
    phases: None (no leaves), or with ``pld_phases=K`` the :class:`PhaseLog` of the run's
      (q, σ) phases, which ``privacy_spent(..., accountant="pld")`` composes.
    truncation: None, or with ``sampling="truncated_poisson"`` the :class:`Truncation` of the
      batches (static: no leaves), which :func:`jaxrdp.privacy_spent` accounts.
  """
  key: jax.Array
  count: jax.Array
  accountant: rdp_accountant.RdpAccountantState
  phases: "PhaseLog | None" = None
  truncation: "Truncation | None" = None


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class Truncation:
  """Truncated Poisson sampling of a run: ``dataset_size`` examples, batches of more than
  ``max_batch_size`` cut to that many (:func:`jaxrdp.poisson_sample`). A static part of the
  state (no leaves: the same under ``jax.jit``, and in the tree structure of a checkpoint)."""
  dataset_size: int
  max_batch_size: int


class PhaseLog(NamedTuple):
  """The (q, σ) phases of a run, for the PLD accountant: K slots, filled in order.

  Attributes:
    sampling_rate, noise_multiplier: float64 (K,), each phase's (q, σ); unused slots q = 0.
    steps: int32 (K,), the steps taken in each phase (0 in unused slots).
    used: int32, the slots filled.
    overflowed: bool, a new phase found no free slot (the PLD of the run is then unknown).
  """
  sampling_rate: jax.Array
  noise_multiplier: jax.Array
  steps: jax.Array
  used: jax.Array
  overflowed: jax.Array


def _phase_log(capacity: int) -> PhaseLog:
  zeros = jnp.zeros((capacity,), jnp.float64)
  return PhaseLog(zeros, zeros + 1.0, jnp.zeros((capacity,), jnp.int32),
                  jnp.zeros((), jnp.int32), jnp.zeros((), bool))


def _log_step(log: PhaseLog, q, sigma) -> PhaseLog:
  """One more step at (q, σ): the last phase's count grows if (q, σ) is its own, else a new
  phase opens in the next slot (or the log is marked overflowed)."""
  q, sigma = jnp.asarray(q, jnp.float64), jnp.asarray(sigma, jnp.float64)
  last = jnp.maximum(log.used - 1, 0)
  same = (log.used > 0) & (log.sampling_rate[last] == q) & (log.noise_multiplier[last] == sigma)
  full = log.used >= log.steps.shape[0]
  slot = jnp.where(same, last, jnp.minimum(log.used, log.steps.shape[0] - 1))
  write = same | ~full
  return PhaseLog(
      sampling_rate=jnp.where(write, log.sampling_rate.at[slot].set(q), log.sampling_rate),
      noise_multiplier=jnp.where(write, log.noise_multiplier.at[slot].set(sigma),
                                 log.noise_multiplier),
      steps=jnp.where(write, log.steps.at[slot].add(1), log.steps),
      used=jnp.where(same | full, log.used, log.used + 1),
      overflowed=log.overflowed | (~same & full))


# jaxrdp 0.1.0's flat state: its fields in leaf order, their number of dimensions, and whether
# they are integers (raw key data, step counts). The nested state has the same leaves.
_FIELDS_0_1_0 = ("key", "count", "orders", "rdp", "rdp_compensation", "sampling_rate",
                 "noise_multiplier", "step_rdp", "segment_steps")
_NDIM_0_1_0 = (1, 0, 1, 1, 1, 0, 0, 1, 0)
_INTEGER_0_1_0 = (True, True, False, False, False, False, False, False, True)
_HOW_TO_CONVERT = (
    "jaxrdp 0.1.0's flat DifferentiallyPrivateAggregateState is now (key, count, accountant). "
    "Convert it with jaxrdp.training.transform.state_from_0_1_0(old), or restore a checkpoint's "
    "flattened leaves (same order as in 0.1.0) with "
    "jax.tree.unflatten(jax.tree.structure(opt.init(params)), leaves).")


_namedtuple_new = DifferentiallyPrivateAggregateState.__new__


@functools.wraps(_namedtuple_new)
def _new_refusing_0_1_0(cls, *args, **kwargs):
  """The NamedTuple's constructor, refusing 0.1.0's fields with the way to convert them.

  0.1.0 users restored a flat checkpoint as ``type(state)(*leaves)`` (or ``**fields``); with
  the nested state that is 9 arguments for 4 fields, and the bare arity error of the
  NamedTuple would not say how to convert them. (``jax.tree.unflatten`` passes the 4 fields.)
  """
  legacy = sorted(set(kwargs) & set(_FIELDS_0_1_0[2:]))
  if (len(args) == len(_FIELDS_0_1_0) and not kwargs) or legacy:
    given = f"the keywords {legacy}" if legacy else f"{len(args)} positional arguments"
    raise TypeError(f"DifferentiallyPrivateAggregateState takes (key, count, accountant, "
                    f"phases=None, truncation=None); got {given}: a jaxrdp 0.1.0 state's fields "
                    f"{list(_FIELDS_0_1_0)}. {_HOW_TO_CONVERT}")
  return _namedtuple_new(cls, *args, **kwargs)


# A NamedTuple cannot define __new__ in its body; set after the class is made.
DifferentiallyPrivateAggregateState.__new__ = _new_refusing_0_1_0


def _fields_0_1_0(x) -> tuple | None:
  """The 9 leaves of ``x`` in 0.1.0's order if ``x`` has the form of a 0.1.0 state (a mapping
  with its field names, an object with its fields, or a tuple/list of its 9 arrays); else None."""
  if isinstance(x, DifferentiallyPrivateAggregateState):
    return None
  if isinstance(x, Mapping):
    return tuple(x[f] for f in _FIELDS_0_1_0) if set(x) == set(_FIELDS_0_1_0) else None
  if tuple(getattr(type(x), "_fields", ())) == _FIELDS_0_1_0:
    return tuple(x)
  if type(x) in (tuple, list) and len(x) == len(_FIELDS_0_1_0) and all(
      hasattr(v, "shape") and len(v.shape) == n for v, n in zip(x, _NDIM_0_1_0)):
    return tuple(x)
  return None


def _describe(x) -> str:
  if isinstance(x, Mapping):
    return f"a {type(x).__name__} with keys {list(x)}"
  if type(x) in (tuple, list):
    return f"a {type(x).__name__} of {len(x)} elements"
  return type(x).__name__


def state_from_0_1_0(old: Any) -> DifferentiallyPrivateAggregateState:
  """The :class:`DifferentiallyPrivateAggregateState` of a state saved by jaxrdp 0.1.0.

  0.1.0's state was flat: ``(key, count, orders, rdp, rdp_compensation, sampling_rate,
  noise_multiplier, step_rdp, segment_steps)``; it is now ``(key, count, accountant)`` with the
  same leaves in the same order, so a checkpoint of flattened leaves needs no conversion:
  ``jax.tree.unflatten(jax.tree.structure(opt.init(params)), leaves)``. This converts the
  other forms: a state dict keyed by the field names (as serialization libraries write
  NamedTuples), the 9 arrays as a tuple or list, or an object with those fields. The values
  are kept exactly (the counts as int32); the transform continues the accounting from them.

  Args:
    old: a 0.1.0 state in one of the forms above.

  Returns:
    The equivalent :class:`DifferentiallyPrivateAggregateState`.

  Raises:
    TypeError: ``old`` is none of these forms, or a field has the wrong kind of dtype.
    ValueError: a field has the wrong number of dimensions, the RDP fields differ in shape
      from ``orders``, or a float64 field cannot be restored without x64 (rounding the
      accumulated RDP to float32 could lower it).
  """
  leaves = _fields_0_1_0(old)
  if leaves is None:
    raise TypeError("old must be a jaxrdp 0.1.0 DifferentiallyPrivateAggregateState: a mapping "
                    f"with the keys {list(_FIELDS_0_1_0)}, an object with these fields, or a "
                    f"tuple or list of these 9 arrays in this order; got {_describe(old)}.")
  arrays = []
  for name, x, ndim, integer in zip(_FIELDS_0_1_0, leaves, _NDIM_0_1_0, _INTEGER_0_1_0):
    x = np.asarray(x)
    if x.ndim != ndim:
      raise ValueError(f"old.{name} must have {ndim} dimension(s), got shape {x.shape}.")
    if integer != bool(np.issubdtype(x.dtype, np.integer)):
      raise TypeError(f"old.{name} must have an {'integer' if integer else 'floating'} dtype, "
                      f"got {x.dtype}.")
    if not integer and jax.dtypes.canonicalize_dtype(x.dtype) != x.dtype:
      raise ValueError(f"old.{name} is {x.dtype}, which needs jax_enable_x64 (converting it "
                       "could round the accumulated RDP down).")
    arrays.append(x if name == "key" else x.astype(np.int32) if integer else x)
  key, count, orders, rdp, compensation, q, sigma, step_rdp, steps = arrays
  for name, x in (("rdp", rdp), ("rdp_compensation", compensation), ("step_rdp", step_rdp)):
    if x.shape != orders.shape:
      raise ValueError(f"old.{name} must have the shape of old.orders, {orders.shape}; got "
                       f"{x.shape}.")
  return DifferentiallyPrivateAggregateState(
      key=jnp.asarray(key), count=jnp.asarray(count),
      accountant=rdp_accountant.RdpAccountantState(
          orders=jnp.asarray(orders), rdp=jnp.asarray(rdp),
          rdp_compensation=jnp.asarray(compensation),
          mechanism=(jnp.asarray(q), jnp.asarray(sigma)), step_rdp=jnp.asarray(step_rdp),
          segment_steps=jnp.asarray(steps)))


def _check_state(state, dtype=None) -> None:
  """TypeError unless ``state`` is a DifferentiallyPrivateAggregateState (naming 0.1.0's
  forms); ValueError if its accountant's dtype is not ``dtype`` (when given)."""
  if not isinstance(state, DifferentiallyPrivateAggregateState):
    if _fields_0_1_0(state) is not None:
      raise TypeError(f"got a jaxrdp 0.1.0 state ({_describe(state)}) where a "
                      f"DifferentiallyPrivateAggregateState was expected. {_HOW_TO_CONVERT}")
    raise TypeError("state must be the DifferentiallyPrivateAggregateState made by this "
                    f"transform's init, got {_describe(state)}.")
  if not isinstance(state.accountant, rdp_accountant.RdpAccountantState):
    raise TypeError("state.accountant must be a jaxrdp.training.accountant.RdpAccountantState, "
                    f"got {_describe(state.accountant)}.")
  if dtype is not None and state.accountant.rdp.dtype != dtype:
    raise ValueError(f"state's accountant is {state.accountant.rdp.dtype}, this transform's "
                     f"accountant_dtype is {dtype}: build the transform with "
                     f"accountant_dtype={state.accountant.rdp.dtype} to continue it (a cast "
                     "could round the accumulated RDP down).")
