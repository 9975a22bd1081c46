r"""The trials of a canary audit: the transform run in the "absent" and "present" worlds.

"Absent": the canary is masked out at every step. "Present": at each step it is included
independently with probability ``sampling_rate`` (:func:`jaxrdp.poisson_sample`). Every trial
runs the transform from a fresh state with its own key (``jax.vmap`` over keys, in chunks),
and records per step a statistic of the released update: by default its projection on the
canary gradient's direction (the Neyman–Pearson statistic of the Gaussian mechanism with the
other examples fixed). See :mod:`jaxrdp.audit.canary` for the method and the test.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Union

import numpy as np
import jax
import jax.numpy as jnp
import optax

from jaxrdp._internal import loops
from jaxrdp._internal import validation
from jaxrdp.audit.bounds import _check_count, _check_probability
from jaxrdp.training.microbatch import batch_size_of, check_mask
from jaxrdp.training.sampling import poisson_sample
from jaxrdp.training.state import DifferentiallyPrivateAggregateState

TransformOrFactory = Union[optax.GradientTransformation,
                           Callable[[jax.Array], optax.GradientTransformation]]


def _canary_direction(per_example_grads, canary_index):
  """v = g_c / ||g_c||, the unit direction of the canary's gradient (at least float32)."""
  leaves = [jnp.asarray(g)[canary_index] for g in jax.tree.leaves(per_example_grads)]
  acc = [jnp.promote_types(x.dtype, jnp.float32) for x in leaves]
  norm = math.sqrt(sum(float(jnp.sum(jnp.square(x.astype(d)))) for x, d in zip(leaves, acc)))
  if not (math.isfinite(norm) and norm > 0):
    raise ValueError("the canary's gradient (per_example_grads at canary_index) must be finite "
                     f"and nonzero to define the default statistic; its norm is {norm}.")
  return [x.astype(d) / jnp.asarray(norm, d) for x, d in zip(leaves, acc)]


def _projection(updates, direction):
  """<updates, v> summed over the leaves, in at least float32."""
  return sum(jnp.vdot(a.astype(jnp.promote_types(a.dtype, v.dtype)), v)
             for a, v in zip(jax.tree.leaves(updates), direction))


def _replace_key(state, key_data):
  is_state = lambda x: isinstance(x, DifferentiallyPrivateAggregateState)
  return jax.tree.map(lambda s: s._replace(key=key_data) if is_state(s) else s, state,
                      is_leaf=is_state)


@functools.lru_cache(maxsize=16)
def _trial_runner(tx_or_factory, statistic, canary_index, sampling_rate, num_steps, chunk):
  """Jitted (grads, params, mask, init_state, keys, inclusion_keys, present, direction) -> (stats, included).

  ``keys``, ``inclusion_keys`` and ``present`` (bool) have one entry per trial (both worlds
  stacked); ``present`` is data, not a static flag, so both worlds share one compilation.
  Cached, so that auditing the same transform again (another δ, confidence or key) does not
  compile again."""
  factory = None if isinstance(tx_or_factory, optax.GradientTransformation) else tx_or_factory

  def run(grads, params, mask, init_state, trial_keys, inclusion_keys, present, direction):
    def trial(args):
      trial_key, inclusion_key, world = args
      if factory is None:
        tx = tx_or_factory
        state = _replace_key(init_state, jax.random.key_data(trial_key))
      else:
        tx = factory(trial_key)
        state = tx.init(params)
      step_keys = jax.random.split(inclusion_key, num_steps)
      sampled = jax.vmap(lambda k: poisson_sample(k, 1, sampling_rate, 1)[1][0])(step_keys)
      included = sampled & world

      def step(state, inc):
        updates, state = tx.update(grads, state, params, mask=mask.at[canary_index].set(inc))
        s = jnp.asarray(_projection(updates, direction) if statistic is None else statistic(updates))
        if s.shape != ():
          raise ValueError(f"statistic must return a scalar per step, got shape {s.shape}.")
        return state, s.astype(jnp.promote_types(s.dtype, jnp.float32))

      _, stats = loops.scan(step, state, included)
      return stats, included

    xs = (trial_keys, inclusion_keys, present)
    if trial_keys.shape[0] == chunk:
      return jax.vmap(trial)(xs)
    # Trial counts are padded to a multiple of the chunk: lax.map then compiles one body.
    return loops.map(trial, xs, batch_size=chunk)

  return jax.jit(run)


def _check_inputs(per_example_grads, canary_index, num_trials, num_steps, sampling_rate,
                  trials_per_batch, mask):
  leaves = jax.tree.leaves(per_example_grads)
  batch = batch_size_of(leaves)
  if isinstance(canary_index, (bool, np.bool_)) or not isinstance(canary_index, (int, np.integer)):
    raise TypeError(f"canary_index must be an int, got {canary_index!r}.")
  if not 0 <= canary_index < batch:
    raise ValueError(f"canary_index must lie in [0, {batch}) (the batch size of "
                     f"per_example_grads), got {canary_index}.")
  if isinstance(num_trials, (bool, np.bool_)) or not isinstance(num_trials, (int, np.integer)):
    raise TypeError(f"num_trials must be an int, got {num_trials!r}.")
  if num_trials < 2:
    raise ValueError(f"num_trials must be >= 2 (half of the trials choose the threshold, half "
                     f"evaluate it), got {num_trials}.")
  _check_count("num_steps", num_steps, lo=1)
  _check_count("trials_per_batch", trials_per_batch, lo=1)
  _check_probability("sampling_rate", sampling_rate, "positive_sampling_rate")
  return batch, check_mask(mask, batch)


def audit_statistics(tx_or_factory: TransformOrFactory, per_example_grads: Any,
                     canary_index: int, *, num_trials: int, key: jax.Array | int,
                     sampling_rate: float, num_steps: int = 1, params: Any = None,
                     mask: jax.typing.ArrayLike | None = None,
                     statistic: Callable[[Any], jax.Array] | None = None,
                     trials_per_batch: int = 1024) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Run the transform ``num_trials`` times in each world; return the per-step statistics.

  The trials of :func:`audit_transform` (see the module docstring), without the test.
  Deterministic given ``key``; the per-trial transform keys are
  ``jax.random.split(k, num_trials)`` for ``k`` the first ("absent") or second ("present") of
  ``jax.random.split(key, 3)``, the third drives the canary's inclusion.

  Args:
    tx_or_factory, per_example_grads, canary_index, num_trials, key, sampling_rate, num_steps,
    params, mask, statistic, trials_per_batch: as in :func:`audit_transform`.

  Returns:
    ``(absent, present, included)``: float arrays of shape (num_trials, num_steps) holding the
    statistic of each step's update in each world, and the bool array of the canary's
    inclusion in the "present" world.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.
  """
  batch, mask = _check_inputs(per_example_grads, canary_index, num_trials, num_steps,
                              sampling_rate, trials_per_batch, mask)
  raw_key, impl = validation.canonical_key(key)
  base = jax.random.wrap_key_data(raw_key, impl=impl) if impl else jax.random.wrap_key_data(raw_key)
  k_absent, k_present, k_inclusion = jax.random.split(base, 3)
  if statistic is None:
    direction = _canary_direction(per_example_grads, canary_index)
  elif not callable(statistic):
    raise TypeError(f"statistic must be a callable (updates -> scalar) or None, got {statistic!r}.")
  else:
    direction = None
  if params is None:
    params = jax.tree.map(lambda g: jnp.zeros(jnp.shape(g)[1:], jnp.result_type(g)),
                          per_example_grads)
  if isinstance(tx_or_factory, optax.GradientTransformation):
    init_state = tx_or_factory.init(params)
    found = [s for s in jax.tree.leaves(
        init_state, is_leaf=lambda x: isinstance(x, DifferentiallyPrivateAggregateState))
             if isinstance(s, DifferentiallyPrivateAggregateState)]
    if len(found) != 1:
      raise ValueError("tx_or_factory: a built transform must hold exactly one "
                       f"DifferentiallyPrivateAggregateState (found {len(found)}); for another "
                       "transform pass a factory key -> transform.")
    if jax.random.key_data(k_absent).shape != found[0].key.shape:
      raise ValueError(f"key: its implementation's key data has shape "
                       f"{jax.random.key_data(k_absent).shape}, the transform's {found[0].key.shape}; "
                       "use keys of the same PRNG implementation.")
  elif callable(tx_or_factory):
    init_state = None
  else:
    raise TypeError("tx_or_factory must be an optax.GradientTransformation or a callable "
                    f"key -> GradientTransformation, got {type(tx_or_factory).__name__}.")
  # Both worlds in one call: trials [0, N) absent, [N, 2N) present, padded to whole chunks.
  total = 2 * num_trials
  chunk = min(trials_per_batch, total)
  padded = -(-total // chunk) * chunk
  pad = lambda k: jnp.concatenate([k, jnp.repeat(k[:1], padded - total, axis=0)])  # discarded
  trial_keys = pad(jnp.concatenate([jax.random.split(k_absent, num_trials),
                                    jax.random.split(k_present, num_trials)]))
  inclusion_keys = jax.random.split(k_inclusion, num_trials)
  inclusion_keys = pad(jnp.concatenate([inclusion_keys, inclusion_keys]))
  present = jnp.arange(padded) >= num_trials
  config = (tx_or_factory, statistic, int(canary_index), float(np.asarray(sampling_rate)),
            int(num_steps), chunk)
  try:
    hash(config)
    run = _trial_runner(*config)
  except TypeError:  # an unhashable transform or statistic: not cached
    run = _trial_runner.__wrapped__(*config)
  stats, included = run(per_example_grads, params, mask, init_state, trial_keys, inclusion_keys,
                        present, direction)
  stats, included = np.asarray(stats, np.float64), np.asarray(included)
  absent, present = stats[:num_trials], stats[num_trials:total]
  included = included[num_trials:total]
  return absent, present, included
