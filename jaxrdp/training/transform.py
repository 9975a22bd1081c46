r"""DP-SGD as optax transforms, with a Rényi-DP accountant in the optimizer state.

:func:`differentially_private_aggregate` takes the first three positional arguments of
``optax.contrib.differentially_private_aggregate`` (clipping norm, noise multiplier, and the
seed's position, which takes a PRNG key; an int is still accepted) plus two required keywords,
``sampling_rate`` and ``expected_batch_size``, without which the accountant could not know the
mechanism: a call written for optax stops with a ``TypeError`` naming them. It implements
DP-SGD with Poisson sampling (Abadi et al. 2016, Alg. 1):

.. math:: \tilde g_t = \frac{1}{b}\Big(\sum_{i \in B_t} \mathrm{clip}_C(g_i) + \mathcal N(0, \sigma^2 C^2 I)\Big),

with b the public ``expected_batch_size`` (= q N). Dividing by the realised batch size |B_t|
would leak it; dividing by the padded size would change the scale with padding.

Each step is one Poisson-sampled Gaussian mechanism with sampling rate q and noise multiplier
σ (L2 sensitivity C, noise std σC), so the state accumulates its RDP,
:math:`\sum_t \varepsilon_{q_t,\sigma_t}(\alpha)` at every order (Mironov 2017, Prop. 1;
per-step RDP from :func:`jaxrdp.compute_rdp`, exact, Mironov, Talwar, Zhang 2019), and
:func:`privacy_spent` converts it to (ε, δ) (:func:`jaxrdp.compute_epsilon`).

Accountant design (nearly free per step, no float32 drift): the state's ``accountant`` is a
:class:`jaxrdp.training.accountant.RdpAccountantState`, advanced by the pure
:func:`jaxrdp.training.accountant.step` with the mechanism θ = (q, σ).

* It keeps the current *segment*: the (q, σ) of the last step, its per-step RDP
  vector, and the number of steps taken with it. A step with the same (q, σ) only
  increments the counter; the accumulated RDP is ``closed + steps · step_rdp``, one rounding
  instead of one per step. When (q, σ) changes (a schedule), the segment is closed into
  ``closed`` by Kahan (compensated) summation (Kahan 1965; error O(ε_mach), independent of
  the number of segments) and the RDP kernel runs once for the new value, inside
  ``lax.cond``. Constant q and σ given as numbers are computed once per transform, outside
  the step graph (no cache outlives the transform).
* The accountant's dtype is float32, or float64 when x64 is enabled (the canonical float);
  ``accountant_dtype`` overrides it. The conversion to ε rounds RDP up by the kernel's
  error bound, which also covers the accumulation's few ulps.
* Under ``jit``, invalid hyperparameter values (from schedules or traced arguments: a value
  outside its range, or NaN) give NaN updates. An invalid sampling rate (outside (0, 1],
  q = 0 included) or noise multiplier also makes the step's RDP NaN at every order, so the
  accumulated RDP (:func:`rdp_spent`) stays NaN from then on; the conversion skips NaN
  orders, so :func:`privacy_spent` reports ε = +inf: never a smaller ε. An RDP that cannot
  be computed at some order is NaN there and that order is skipped likewise.

The PRNG key is stored as raw key data (uint32) so that the state is a pytree of plain
arrays (checkpointable with NumPy); it is split every step and never reused. The state's
leaves come in the order of jaxrdp 0.1.0's flat state, so checkpoints of 0.1.0 saved as leaves
still restore (see :func:`state_from_0_1_0` for the other forms).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple, Union

import numpy as np
import jax
import jax.numpy as jnp
import optax

from jaxrdp._internal import validation
from jaxrdp.accounting import pld
from jaxrdp.accounting.composition import rdp_curve
from jaxrdp.accounting.epsilon import use_pld
from jaxrdp.accounting.conversion import compute_epsilon
from jaxrdp.training import accountant as rdp_accountant
from jaxrdp.training.microbatch import ClippedGradSum, batch_size_of, clip_and_sum
from jaxrdp.accounting.orders import DEFAULT_ORDERS

ScalarOrSchedule = Union[float, jax.typing.ArrayLike, Callable[[jax.Array], jax.typing.ArrayLike]]


class DifferentiallyPrivateAggregateState(NamedTuple):
  """State of :func:`differentially_private_aggregate`: noise key and RDP accountant.

  Flattened, its leaves are those of jaxrdp 0.1.0's flat state, in the same order (key, count,
  orders, rdp, rdp_compensation, sampling_rate, noise_multiplier, step_rdp, segment_steps): a
  0.1.0 checkpoint saved as leaves restores with
  ``jax.tree.unflatten(jax.tree.structure(opt.init(params)), leaves)``.

  Attributes:
    key: raw PRNG key data (uint32), split at every step.
    count: int32, steps taken; schedules are evaluated at it.
    accountant: the RDP accountant, a :class:`jaxrdp.training.accountant.RdpAccountantState`
      (orders, rdp, rdp_compensation, mechanism = (sampling_rate, noise_multiplier) of the
      current segment, step_rdp, segment_steps); read it with :func:`rdp_spent`.
    phases: None (no leaves), or with ``pld_phases=K`` the :class:`PhaseLog` of the run's
      (q, σ) phases, which ``privacy_spent(..., accountant="pld")`` composes.
  """
  key: jax.Array
  count: jax.Array
  accountant: rdp_accountant.RdpAccountantState
  phases: "PhaseLog | None" = None


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


def _value(x, count):
  return x(count) if callable(x) else x


def _is_fixed(x) -> bool:
  """A value known now (not a schedule, not a tracer): its RDP can be computed once."""
  return not callable(x) and validation.is_concrete(x)


# Each hyperparameter's entry of jaxrdp._internal.domains.DOMAINS; concrete values are checked
# eagerly, schedules at every eager evaluation.
_DOMAIN_OF = {"l2_norm_clip": "l2_norm_clip", "noise_multiplier": "noise_multiplier",
              "sampling_rate": "positive_sampling_rate",
              "expected_batch_size": "expected_batch_size"}


def _checked(name, x, domain):
  """Range check of a concrete scalar (schedules are checked where they are evaluated)."""
  if x is None:
    raise TypeError(f"{name} is required (got None).")
  if not callable(x):
    validation.check(domain, x, name=name)
    if jnp.ndim(x) != 0:
      raise ValueError(f"{name} must be a scalar or a schedule (callable of the step count); "
                       f"got shape {jnp.shape(x)}.")
  return x


def _accountant_dtype(accountant_dtype):
  if accountant_dtype is None:
    return jnp.result_type(float)  # float32, or float64 when x64 is enabled
  dtype = jnp.dtype(accountant_dtype)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"accountant_dtype must be a floating dtype, got {dtype}.")
  if jax.dtypes.canonicalize_dtype(dtype) != dtype:
    raise ValueError(f"accountant_dtype={dtype} is not available: enable jax_enable_x64 for "
                     "float64 (jaxrdp never changes that flag).")
  return dtype


def differentially_private_aggregate(
    l2_norm_clip: ScalarOrSchedule,
    noise_multiplier: ScalarOrSchedule,
    key: jax.Array | int | None,
    *,
    sampling_rate: ScalarOrSchedule,
    expected_batch_size: ScalarOrSchedule,
    orders: jax.typing.ArrayLike | None = None,
    accountant_dtype: Any = None,
    pld_phases: int = 0,
) -> optax.GradientTransformationExtraArgs:
  r"""Clip per-example gradients, sum, add Gaussian noise once, divide by the expected batch size.

  ``updates`` are per-example gradients (every leaf with a leading batch axis, as from
  ``jax.vmap(jax.grad(loss), in_axes=(None, 0))``), or a :class:`jaxrdp.ClippedGradSum`
  (from :func:`jaxrdp.clipped_grad_sum`, microbatched), which is only noised. The update
  function takes an optional ``mask`` (bool[B], False = padding; e.g. from
  :func:`jaxrdp.poisson_sample`): ``tx.update(per_example_grads, state, params, mask=mask)``.
  Padding contributes exactly zero, even when its gradients are NaN or inf.

  Per step t (``count``): clip every example to global L2 norm :math:`C_t`, sum in at least
  float32, add :math:`\mathcal N(0, (\sigma_t C_t)^2 I)` once, divide by :math:`b_t`
  (``expected_batch_size``), return in the gradients' dtype (the parameters' dtype for a
  ``ClippedGradSum`` when ``params`` is given). The accountant adds the RDP of one
  Poisson-sampled Gaussian step at :math:`(q_t, \sigma_t)`.

  Only valid as the FIRST transform of a chain, with batches drawn by Poisson sampling at
  rate ``sampling_rate`` (:func:`jaxrdp.poisson_sample`); otherwise the accounted ε does not
  describe the training run.

  Schedules are checked where they are evaluated: eagerly, a value outside its range raises
  ``ValueError``; under ``jit`` that step's updates are NaN, and for a sampling rate or noise
  multiplier outside its range its RDP is NaN at every order (so :func:`privacy_spent` gives
  ε = +inf from then on). A sampling rate of 0 is such a value: it draws no batch, and is
  not accounted as a step that spends nothing.

  Args:
    l2_norm_clip: C ≥ 0, the per-example clipping norm, or a schedule ``count -> C``.
    noise_multiplier: σ ≥ 0 (noise std σC), or a schedule. σ = 0 is a non-private run (ε = ∞).
    key: a PRNG key (``jax.random.key``, or a legacy uint32 key) or an int seed. Required.
    sampling_rate: q in (0, 1], the Poisson sampling rate, or a schedule.
    expected_batch_size: b > 0, the public divisor (q times the dataset size), or a schedule.
    orders: Rényi orders of the accountant (default :data:`jaxrdp.DEFAULT_ORDERS`).
    accountant_dtype: dtype of the accountant (default: float64 under x64, else float32).
    pld_phases: K ≥ 0 (static). With K > 0 the state also logs up to K (q, σ) phases of the
      run (:class:`PhaseLog`, needs float64), so that ``privacy_spent(..., accountant="pld")``
      accounts schedules, not only constant (q, σ). Default 0: no log, and the state's
      leaves are jaxrdp 0.1.0's.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs` whose state is a
    :class:`DifferentiallyPrivateAggregateState`; read ε with :func:`privacy_spent`.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued, or a key that is neither a PRNG key nor
      an int seed.

  References:
    Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, Alg. 1; Mironov,
    "Rényi Differential Privacy", 2017, Prop. 1; Mironov, Talwar, Zhang, "Rényi Differential
    Privacy of the Sampled Gaussian Mechanism", arXiv:1908.10530, 2019.
  """
  raw_key, impl = validation.canonical_key(key)
  hyper = {"l2_norm_clip": l2_norm_clip, "noise_multiplier": noise_multiplier,
           "sampling_rate": sampling_rate, "expected_batch_size": expected_batch_size}
  for name, x in hyper.items():
    _checked(name, x, _DOMAIN_OF[name])
  dtype = _accountant_dtype(accountant_dtype)
  if (isinstance(pld_phases, (jax.Array, np.ndarray)) and validation.is_concrete(pld_phases)
      and pld_phases.ndim == 0 and jnp.issubdtype(pld_phases.dtype, jnp.integer)):
    pld_phases = int(pld_phases)   # optax.inject_hyperparams turns the int into an array
  pld_phases = validation.check_int("pld_phases", pld_phases, lo=0)
  if pld_phases and not jax.config.jax_enable_x64:
    raise TypeError("pld_phases > 0 logs the phases for the PLD accountant, which computes in "
                    "float64: enable 64-bit JAX (jax.config.update('jax_enable_x64', True)).")
  orders = DEFAULT_ORDERS if orders is None else orders
  validation.check("orders", orders)
  if not validation.is_concrete(orders):
    raise TypeError("orders must be concrete (a NumPy array or list), not a traced value.")
  orders = np.asarray(orders, dtype=dtype)
  if orders.ndim != 1:
    raise ValueError(f"orders must be 1-D, got shape {orders.shape}.")
  fixed = _is_fixed(sampling_rate) and _is_fixed(noise_multiplier)

  def rdp_now(q, sigma):
    """Per-step RDP of concrete (q, σ), computed now (eagerly), as a read-only NumPy array."""
    if dtype == jnp.result_type(float):
      # Python floats take the canonical dtype (and share the kernel's compilation with
      # compute_rdp calls on Python numbers). q and σ were checked where they were read.
      return rdp_at(float(np.asarray(q)), float(np.asarray(sigma)))
    return rdp_at(float(np.asarray(q, dtype)), float(np.asarray(sigma, dtype)))

  # Per transform (no cache outlives it): an eager schedule that returns to earlier values
  # does not recompute them.
  @functools.lru_cache(maxsize=256)
  def rdp_at(q: float, sigma: float) -> np.ndarray:
    if dtype != jnp.result_type(float):
      q, sigma = np.asarray(q, dtype), np.asarray(sigma, dtype)  # exact: q came from dtype
    # Evaluated now even when the transform is built or first used inside a traced function
    # (outside a trace the context changes nothing).
    with jax.ensure_compile_time_eval():
      value = np.asarray(rdp_curve(q, sigma, 1, orders), dtype)
    value.setflags(write=False)
    return value

  @functools.lru_cache(maxsize=None)
  def fixed_step_rdp():
    """Per-step RDP of constant (q, σ), computed once, outside any step graph."""
    return rdp_now(sampling_rate, noise_multiplier)

  def segment_rdp(q, sigma):
    """Per-step RDP of a new segment: now for concrete (q, σ), else in the caller's graph."""
    if validation.is_concrete((q, sigma)):
      return rdp_now(q, sigma)
    return rdp_curve(q, sigma, 1, orders).astype(dtype)

  def init_fn(params):
    del params
    count = jnp.zeros((), jnp.int32)
    for name, x in hyper.items():
      if callable(x):  # schedules: check the first value when it is concrete
        _checked(f"{name}(0)", x(count), _DOMAIN_OF[name])
    if fixed:
      fixed_step_rdp()  # compute now, eagerly, rather than in the first traced update
    return DifferentiallyPrivateAggregateState(
        key=jnp.asarray(raw_key), count=count,
        accountant=rdp_accountant.init(orders, num_parameters=2, dtype=dtype),
        phases=_phase_log(pld_phases) if pld_phases else None)

  def update_fn(updates, state, params=None, mask=None, **extra_args):
    del extra_args
    _check_state(state, dtype)
    now = {name: _value(x, state.count) for name, x in hyper.items()}
    for name, x in now.items():
      _checked(name, x, _DOMAIN_OF[name])
    clip, sigma = now["l2_norm_clip"], now["noise_multiplier"]
    q, divisor = now["sampling_rate"], now["expected_batch_size"]
    leaves, treedef, out_dtypes, clip_ok = _clipped_sums(updates, clip, mask, params)
    base = jax.random.wrap_key_data(state.key, impl=impl) if impl else (
        jax.random.wrap_key_data(state.key))
    next_key, noise_key = jax.random.split(base)
    noised = _noised_means(leaves, noise_key, sigma, clip, divisor)
    # Under jit the eager checks do not run: invalid values give NaN updates.
    q_ok = validation.in_domain("positive_sampling_rate", jnp.asarray(q))
    ok = (validation.in_domain("l2_norm_clip", jnp.asarray(clip))
          & validation.in_domain("noise_multiplier", jnp.asarray(sigma))
          & validation.in_domain("expected_batch_size", jnp.asarray(divisor)) & q_ok & clip_ok)
    noised = [jnp.where(ok, y, jnp.nan).astype(out) for y, out in zip(noised, out_dtypes)]
    # A rate outside (0, 1] is accounted as NaN, as an invalid σ is (the kernel's NaN): q = 0
    # lies in the kernel's [0, 1] and would add an RDP of 0, a step that spends nothing.
    q = jnp.where(q_ok, q, jnp.nan)
    # One Poisson-sampled Gaussian step at θ = (q, σ). A state whose orders differ from this
    # transform's (a foreign checkpoint) gets NaN RDP there (order skipped), never a wrong number.
    accountant = rdp_accountant.step(state.accountant, (q, sigma),
                                     fixed_step_rdp() if fixed else segment_rdp, orders=orders)
    new_state = DifferentiallyPrivateAggregateState(
        key=jax.random.key_data(next_key), count=optax.safe_int32_increment(state.count),
        accountant=accountant,
        phases=None if state.phases is None else _log_step(state.phases, q, sigma))
    return jax.tree.unflatten(treedef, noised), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _clipped_sums(updates, clip, mask, params):
  """(leaves, treedef, output dtypes, whether the clip is valid) of the clipped gradient sum:
  per-example gradients are clipped to ``clip`` and summed (padding masked out); a
  :class:`jaxrdp.ClippedGradSum` was clipped already (at most at ``clip``, checked) and is
  only promoted to at least float32."""
  if not isinstance(updates, ClippedGradSum):
    g_leaves, treedef = jax.tree.flatten(updates)
    _check_per_example(g_leaves, treedef, params)
    out_dtypes = [jnp.result_type(x) for x in g_leaves]
    return jax.tree.leaves(clip_and_sum(updates, clip, mask)), treedef, out_dtypes, True
  if mask is not None:
    raise ValueError("mask must be None when updates is a ClippedGradSum (the mask was "
                     "applied by clipped_grad_sum).")
  validation.check("l2_norm_clip", updates.l2_norm_clip, name="ClippedGradSum.l2_norm_clip")
  if validation.is_concrete((updates.l2_norm_clip, clip)) and not (
      float(updates.l2_norm_clip) <= float(clip)):
    raise ValueError(f"the ClippedGradSum was clipped at {float(updates.l2_norm_clip)}, above "
                     f"this transform's l2_norm_clip={float(clip)}: the noise would be too small.")
  leaves, treedef = jax.tree.flatten(updates.grad_sum)
  if params is not None:
    p_leaves, p_treedef = jax.tree.flatten(params)
    if p_treedef != treedef:
      raise ValueError("ClippedGradSum.grad_sum must have the structure of params; got "
                       f"{treedef} and {p_treedef}.")
    out_dtypes = [jnp.result_type(p) for p in p_leaves]
  else:
    out_dtypes = [jnp.result_type(x) for x in leaves]
  leaves = [jnp.asarray(x).astype(jnp.promote_types(jnp.result_type(x), jnp.float32))
            for x in leaves]
  return leaves, treedef, out_dtypes, updates.l2_norm_clip <= clip


def _noised_means(leaves, key, sigma, clip, divisor):
  """(sum + N(0, (σC)^2 I)) / divisor for each leaf, in the leaf's dtype (at least float32):
  one independent key per leaf."""
  keys = jax.random.split(key, len(leaves))
  cast = lambda v, x: jnp.asarray(v, x.dtype)
  return [(x + cast(sigma, x) * cast(clip, x) * jax.random.normal(k, x.shape, x.dtype))
          / cast(divisor, x) for x, k in zip(leaves, keys)]


def _check_per_example(leaves, treedef, params):
  batch = batch_size_of(leaves)
  if params is None:
    return
  p_leaves, p_treedef = jax.tree.flatten(params)
  if p_treedef != treedef:
    raise ValueError(f"per-example gradients must have the structure of params; got {treedef} "
                     f"and {p_treedef}.")
  for g, p in zip(leaves, p_leaves):
    if jnp.shape(g) != (batch,) + jnp.shape(p):
      raise ValueError("per-example gradients must have shape (batch,) + parameter shape on every "
                       f"leaf; got {jnp.shape(g)} for a parameter of shape {jnp.shape(p)}. "
                       "Unbatched gradients are not accepted (clipping needs each example).")


def dpsgd(learning_rate: optax.ScalarOrSchedule, l2_norm_clip: ScalarOrSchedule,
          noise_multiplier: ScalarOrSchedule, key: jax.Array | int | None, *,
          sampling_rate: ScalarOrSchedule, expected_batch_size: ScalarOrSchedule,
          momentum: float | None = None, nesterov: bool = False,
          orders: jax.typing.ArrayLike | None = None,
          accountant_dtype: Any = None, pld_phases: int = 0) -> optax.GradientTransformationExtraArgs:
  r"""DP-SGD: :func:`differentially_private_aggregate`, optional momentum, learning rate.

  The same chain as ``optax.contrib.dpsgd`` (aggregate → ``optax.trace`` → learning rate), with
  Poisson-sampling semantics, a padding ``mask`` and the accountant; ``key`` replaces optax's
  int ``seed`` (an int is still accepted). Read ε with ``jaxrdp.privacy_spent(opt_state, δ)``.

  Args:
    learning_rate: a float or an optax schedule.
    l2_norm_clip, noise_multiplier, key, sampling_rate, expected_batch_size, orders,
    accountant_dtype, pld_phases: as in :func:`differentially_private_aggregate`.
    momentum: decay of ``optax.trace``; None for plain SGD.
    nesterov: Nesterov momentum.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued, or a key that is neither a PRNG key nor
      an int seed.

  References:
    Abadi et al., CCS 2016 (DP-SGD); see :func:`differentially_private_aggregate`.
  """
  # optax accepts anything here; a NaN would only show up as NaN parameters after a step.
  if learning_rate is None or not callable(learning_rate):
    validation.check("learning_rate", learning_rate)
  if momentum is not None:
    validation.check("momentum", momentum)
  return optax.chain(
      differentially_private_aggregate(
          l2_norm_clip, noise_multiplier, key, sampling_rate=sampling_rate,
          expected_batch_size=expected_batch_size, orders=orders,
          accountant_dtype=accountant_dtype, pld_phases=pld_phases),
      optax.trace(decay=momentum, nesterov=nesterov) if momentum is not None else optax.identity(),
      optax.scale_by_learning_rate(learning_rate),
  )


def _find_accountant(opt_state) -> DifferentiallyPrivateAggregateState:
  is_state = lambda x: (isinstance(x, DifferentiallyPrivateAggregateState)
                        or _fields_0_1_0(x) is not None)
  found = [x for x in jax.tree.leaves(opt_state, is_leaf=is_state) if is_state(x)]
  for x in found:
    _check_state(x)
  if not found:
    raise ValueError("opt_state contains no DifferentiallyPrivateAggregateState: was the "
                     "optimizer built with jaxrdp.differentially_private_aggregate or jaxrdp.dpsgd?")
  if len(found) > 1:
    raise ValueError(f"opt_state contains {len(found)} DifferentiallyPrivateAggregateStates; "
                     "pass the one to report (e.g. opt_state[0]).")
  return found[0]


def rdp_spent(opt_state) -> tuple[jax.Array, jax.Array]:
  r"""(orders, RDP) accumulated so far by the accountant found anywhere in ``opt_state``.

  .. math:: \mathrm{RDP}(\alpha) = \sum_t \varepsilon_{q_t, \sigma_t}(\alpha) = \text{closed segments} + n \cdot \varepsilon_{q, \sigma}(\alpha)

  Args:
    opt_state: an optimizer state (nested tuples, NamedTuples, dicts, optax wrapper states)
      holding exactly one :class:`DifferentiallyPrivateAggregateState`.

  Returns:
    ``(orders, rdp)``, both of shape (K,), in the accountant's dtype.

  Raises:
    ValueError: ``opt_state`` holds no such state, or more than one.
    TypeError: it holds a state in jaxrdp 0.1.0's flat form (the message says how to convert
      it, see :func:`state_from_0_1_0`).
  """
  return rdp_accountant.accumulated_rdp(_find_accountant(opt_state).accountant)


def privacy_spent(opt_state, delta: jax.typing.ArrayLike, *,
                  orders: jax.typing.ArrayLike | None = None, accountant: str = "rdp",
                  pld_grid: pld.PldGrid | None = None) -> tuple[jax.Array, jax.Array]:
  r"""(ε, order): the (ε, δ)-DP guarantee of the training so far.

  Finds the single :class:`DifferentiallyPrivateAggregateState` in ``opt_state`` (error if
  there is none or more than one) and converts its accumulated RDP with
  :func:`jaxrdp.compute_epsilon` (improved conversion, rounded up, minimised over orders).
  Jittable. If batches were drawn by truncated Poisson sampling, add the truncation's δ
  (:func:`jaxrdp.poisson_truncation_delta`) to the reported δ.

  Args:
    opt_state: the optimizer state.
    delta: δ in (0, 1) (a scalar or an array of δ values).
    orders: optional subset of the accountant's orders to minimise over (each must be one of
      them); default: all of them. Under ``jax.jit`` (no check) an order outside [1, inf]
      gives NaN, and an order in range that is not one of them is skipped: ε = +inf when
      none of ``orders`` is.
    accountant: ``"rdp"`` (default: the state's accumulated RDP) or ``"pld"``: the tight ε
      of the run by its privacy-loss distribution (:func:`jaxrdp.pld_epsilon`; float64).
      A transform built with ``pld_phases=K`` logs its (q, σ) phases and any schedule of up
      to K phases is accounted. Without the log the state keeps only the current (q, σ) and
      its step count (closed segments are summed as RDP): a run at constant (q, σ) is
      accounted exactly, and after a change of (q, σ) the PLD is refused with a ValueError
      (NaN under ``jax.jit``), as is an overflowed log. Under ``jax.jit`` with a traced state,
      pass ``pld_grid`` (:func:`jaxrdp.pld_grid`).
    pld_grid: the static grid sizes for ``accountant="pld"`` under ``jax.jit``.

  Returns:
    ``(epsilon, order)``. ε = +inf for a non-private run (σ = 0). With ``accountant="pld"``
    the order is NaN (there is none).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued, or ``opt_state`` holding a state in
      jaxrdp 0.1.0's flat form (the message says how to convert it).

  References:
    Balle et al., AISTATS 2020, Thm. 21; Mironov 2017, Prop. 1 and 3.
  """
  if use_pld(accountant, orders=orders, pld_grid=pld_grid):
    return _pld_spent(_find_accountant(opt_state), delta, pld_grid)
  state_orders, rdp = rdp_spent(opt_state)
  if orders is not None:
    validation.check("orders", orders)
    wanted = jnp.atleast_1d(jnp.asarray(orders, state_orders.dtype))
    if wanted.ndim != 1:
      raise ValueError(f"orders must be a scalar or 1-D, got shape {wanted.shape}.")
    hit = wanted[:, None] == state_orders[None, :]
    if validation.is_concrete((hit,)) and not bool(jnp.all(jnp.any(hit, axis=1))):
      missing = np.asarray(wanted)[~np.asarray(jnp.any(hit, axis=1))]
      raise ValueError(f"orders {missing.tolist()} are not among the accountant's orders.")
    # Orders not asked for are marked NaN, which compute_epsilon skips.
    rdp = jnp.where(jnp.any(hit, axis=0), rdp, jnp.nan)
    # Under jit the checks above do not run. An order outside [1, inf] (NaN included) is an
    # invalid argument: NaN. A valid order that is not among the accountant's matches nothing
    # and is skipped like the orders not asked for (ε = +inf when none is left).
    return validation.nan_where_invalid(validation.all_in_domains(orders=wanted),
                                        compute_epsilon(state_orders, rdp, delta))
  return compute_epsilon(state_orders, rdp, delta)


def _pld_spent(state: DifferentiallyPrivateAggregateState, delta, grid):
  """(ε by the PLD, NaN): the phase log's schedule, or the accountant's single segment."""
  validation.check("delta", delta)
  if state.phases is not None:
    log = state.phases
    if validation.is_concrete(log.overflowed) and bool(log.overflowed):
      raise ValueError(f"the run has more (sampling_rate, noise_multiplier) phases than the "
                       f"{log.steps.shape[0]} its transform logs (pld_phases): build it with a "
                       "larger pld_phases, or use accountant='rdp'.")
    eps = pld.pld_epsilon(log.sampling_rate, log.noise_multiplier,
                          log.steps.astype(jnp.float64), delta, pld_grid=grid)
    return jnp.where(log.overflowed, jnp.nan, eps), jnp.asarray(jnp.nan, eps.dtype)
  account = state.accountant
  q, sigma = (jnp.asarray(v, jnp.float64) for v in account.mechanism)
  steps = account.segment_steps.astype(jnp.float64)
  one_segment = jnp.all(account.rdp == 0) & jnp.all(account.rdp_compensation == 0)
  if validation.is_concrete((account, one_segment)) and not bool(one_segment):
    raise ValueError("accountant='pld' needs the run's phases: this state changed "
                     "(sampling_rate, noise_multiplier) (a schedule) and keeps the earlier "
                     "phases only as RDP. Build the transform with pld_phases=K (it then logs "
                     "up to K phases), account the schedule with jaxrdp.dpsgd_epsilon(q_phases, "
                     "sigma_phases, steps_phases, delta, accountant='pld'), or use "
                     "accountant='rdp'.")
  no_steps = account.segment_steps == 0
  # Before the first step θ is NaN: a zero-step schedule at a placeholder (q, σ), ε = 0.
  q, sigma = jnp.where(no_steps, 0.0, q), jnp.where(no_steps, 1.0, sigma)
  eps = pld.pld_epsilon(q, sigma, steps, delta, pld_grid=grid)
  return jnp.where(one_segment, eps, jnp.nan), jnp.asarray(jnp.nan, eps.dtype)
