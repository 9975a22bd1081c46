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
from typing import Any, Callable, Union

import numpy as np
import jax
import jax.numpy as jnp
import optax

from jaxrdp._internal import validation
from jaxrdp.accounting import samplers
from jaxrdp.accounting.composition import rdp_curve
from jaxrdp.training import accountant as rdp_accountant
from jaxrdp.training.microbatch import ClippedGradSum, batch_size_of, clip_and_sum
from jaxrdp.training.noise import standard_normals
from jaxrdp.accounting.orders import DEFAULT_ORDERS
from jaxrdp.training.state import (DifferentiallyPrivateAggregateState, Truncation, _check_state,
                                   _log_step, _phase_log)
# Re-exported: user code imports the state and its reports from this module too
# (``from jaxrdp.training.transform import privacy_spent, state_from_0_1_0``).
from jaxrdp.training.state import PhaseLog, state_from_0_1_0  # noqa: F401
from jaxrdp.training.spent import privacy_spent, rdp_spent  # noqa: F401

ScalarOrSchedule = Union[float, jax.typing.ArrayLike, Callable[[jax.Array], jax.typing.ArrayLike]]


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
    sampling: str = "poisson",
    dataset_size: int | None = None,
    max_batch_size: int | None = None,
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
    sampling: how the batches are drawn: ``"poisson"`` (the default; :func:`jaxrdp.poisson_sample`)
      or ``"fixed"``: exactly B examples without replacement (:func:`jaxrdp.fixed_sample`),
      with ``sampling_rate`` = B/N and ``expected_batch_size`` = B; each step is then accounted
      for replace-one neighbours (Wang, Balle, Kasiviswanathan 2019, Thm. 27, at σ/2: a
      replacement moves the clipped sum by up to 2C; see
      :mod:`jaxrdp.accounting.samplers`). No PLD log (``pld_phases``) for fixed-size batches.
      Or ``"truncated_poisson"``: Poisson batches of ``dataset_size`` examples cut to at most
      ``max_batch_size`` chosen uniformly (:func:`jaxrdp.poisson_sample` with that
      ``max_batch_size`` and any ``max_overflow_probability``): the accountant adds each
      step's Poisson RDP as for ``"poisson"``, and :func:`privacy_spent` accounts the cut
      batches, tightly with ``accountant="pld"``.
    dataset_size, max_batch_size: N and M of ``sampling="truncated_poisson"`` (Python ints;
      required there, and only there).

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
  validation.check_choice("sampling", sampling, ("poisson", "truncated_poisson", "fixed"))
  truncation = _truncation(sampling, dataset_size, max_batch_size)
  if sampling == "fixed" and pld_phases:
    raise ValueError("pld_phases applies to sampling='poisson' and 'truncated_poisson' only: "
                     f"fixed-size batches have no PLD accountant (got pld_phases={pld_phases}).")
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
  step_curve = rdp_curve if sampling != "fixed" else functools.partial(
      _without_replacement_curve, n_max=samplers.max_order(orders))

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
      value = np.asarray(step_curve(q, sigma, 1, orders), dtype)
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
    return step_curve(q, sigma, 1, orders).astype(dtype)

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
        phases=_phase_log(pld_phases) if pld_phases else None, truncation=truncation)

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
        phases=None if state.phases is None else _log_step(state.phases, q, sigma),
        truncation=state.truncation)
    return jax.tree.unflatten(treedef, noised), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _truncation(sampling, dataset_size, max_batch_size) -> Truncation | None:
  """The :class:`Truncation` of ``sampling="truncated_poisson"`` (both sizes Python ints ≥ 1),
  None for the other samplers (which take neither size); ValueError or TypeError naming the
  argument otherwise."""
  if sampling != "truncated_poisson":
    for name, value in (("dataset_size", dataset_size), ("max_batch_size", max_batch_size)):
      if value is not None:
        raise ValueError(f"{name} applies to sampling='truncated_poisson' only; sampling="
                         f"{sampling!r} got {name}={value!r}.")
    return None
  for name, value in (("dataset_size", dataset_size), ("max_batch_size", max_batch_size)):
    if value is None:
      raise ValueError(f"sampling='truncated_poisson' needs {name} (N examples, batches of "
                       "more than max_batch_size cut to that many).")
  return Truncation(validation.check_int("dataset_size", dataset_size, lo=1),
                    validation.check_int("max_batch_size", max_batch_size, lo=1))


def _without_replacement_curve(q, sigma, steps, orders, n_max):
  """Per-step RDP of one step on a fixed-size batch at each of ``orders`` (replace-one: the
  bound at σ/2, :func:`jaxrdp.accounting.samplers.fixed_rdp`)."""
  one = lambda v: jnp.reshape(jnp.asarray(v, jnp.result_type(q, sigma)), (1,))
  return samplers.fixed_rdp(one(q), one(sigma), one(steps), jnp.asarray(orders), n_max)


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
  """(sum + N(0, (σC)^2 I)) / divisor for each leaf, in the leaf's dtype (at least float32).
  The noise is :func:`jaxrdp.training.noise.standard_normals` (shared draws)."""
  noise = standard_normals(key, leaves)
  cast = lambda v, x: jnp.asarray(v, x.dtype)
  return [(x + cast(sigma, x) * cast(clip, x) * noise[i]) / cast(divisor, x)
          for i, x in enumerate(leaves)]


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
          accountant_dtype: Any = None, pld_phases: int = 0,
          sampling: str = "poisson", dataset_size: int | None = None,
          max_batch_size: int | None = None) -> optax.GradientTransformationExtraArgs:
  r"""DP-SGD: :func:`differentially_private_aggregate`, optional momentum, learning rate.

  The same chain as ``optax.contrib.dpsgd`` (aggregate → ``optax.trace`` → learning rate), with
  Poisson-sampling semantics, a padding ``mask`` and the accountant; ``key`` replaces optax's
  int ``seed`` (an int is still accepted). Read ε with ``jaxrdp.privacy_spent(opt_state, δ)``.

  Args:
    learning_rate: a float or an optax schedule.
    l2_norm_clip, noise_multiplier, key, sampling_rate, expected_batch_size, orders,
    accountant_dtype, pld_phases, sampling, dataset_size, max_batch_size: as in
      :func:`differentially_private_aggregate`.
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
          accountant_dtype=accountant_dtype, pld_phases=pld_phases, sampling=sampling,
          dataset_size=dataset_size, max_batch_size=max_batch_size),
      optax.trace(decay=momentum, nesterov=nesterov) if momentum is not None else optax.identity(),
      optax.scale_by_learning_rate(learning_rate),
  )
