"""A jaxrdp 0.1.0 state, in whatever form a user restored it, is refused by the transform with the
``TypeError`` that names ``state_from_0_1_0`` (issue 35, "0.1.0 checkpoints").

0.1.0's state was one flat NamedTuple of 9 arrays (key, count, orders, rdp, rdp_compensation,
sampling_rate, noise_multiplier, step_rdp, segment_steps); it is now (key, count, accountant,
phases). Checkpoints come back as a dict keyed by the field names (serialization libraries), a
flat tuple or list of the 9 arrays, or the state type rebuilt from them positionally
(``type(state)(*[jnp.asarray(x) for x in ckpt])``, how 0.1.0 users restored) or by keywords.
The last two used to stop on the NamedTuple's bare arity error (or, for ``jnp.asarray`` over the
whole checkpoint, NumPy's "inhomogeneous shape"), which says nothing about converting.
"""

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrdp
from jaxrdp.training.transform import state_from_0_1_0

Q, SIGMA, DELTA = 0.01, 1.1, 1e-5
FIELDS = ("key", "count", "orders", "rdp", "rdp_compensation", "sampling_rate",
          "noise_multiplier", "step_rdp", "segment_steps")
HOW_TO_CONVERT = r"0\.1\.0.*state_from_0_1_0"


def _transform():
  return jaxrdp.differentially_private_aggregate(1.0, SIGMA, 0, sampling_rate=Q,
                                                 expected_batch_size=10.0)


def _params():
  return {"w": jnp.zeros((3, 2))}


def _grads():
  return {"w": jnp.ones((4, 3, 2))}


def _checkpoint_0_1_0():
  """The 9 arrays of a 0.1.0 state after one step at (Q, SIGMA), saved with ``np.savez`` and
  loaded back in 0.1.0's field order."""
  orders = np.asarray(jaxrdp.DEFAULT_ORDERS)
  step_rdp = np.asarray(jaxrdp.compute_rdp(Q, SIGMA, 1, orders))
  leaves = [np.asarray(jax.random.key_data(jax.random.key(0))), np.int32(1), orders,
            np.zeros_like(step_rdp), np.zeros_like(step_rdp), np.float64(Q), np.float64(SIGMA),
            step_rdp, np.int32(1)]
  buf = io.BytesIO()
  np.savez(buf, *leaves)
  loaded = np.load(io.BytesIO(buf.getvalue()))
  return [loaded[f"arr_{i}"] for i in range(len(FIELDS))]


# How a 0.1.0 checkpoint comes back: ``state`` is the 1.0 transform's own state (its type is
# what ``type(state)`` gives a user's restore code).
RESTORED = {
    "dict": lambda ckpt, state: dict(zip(FIELDS, ckpt)),
    "flat tuple": lambda ckpt, state: tuple(jnp.asarray(x) for x in ckpt),
    "list": lambda ckpt, state: list(ckpt),
    "positional NamedTuple": lambda ckpt, state: type(state)(*[jnp.asarray(x) for x in ckpt]),
    "NamedTuple by keywords": lambda ckpt, state: type(state)(
        **{name: jnp.asarray(x) for name, x in zip(FIELDS, ckpt)}),
}


@pytest.mark.parametrize("form", RESTORED)
def test_update_refuses_a_0_1_0_state_naming_state_from_0_1_0(form):
  tx, params = _transform(), _params()
  with pytest.raises(TypeError, match=HOW_TO_CONVERT):
    old = RESTORED[form](_checkpoint_0_1_0(), tx.init(params))  # the NamedTuple forms stop here
    tx.update(_grads(), old, params)


@pytest.mark.parametrize("form", RESTORED)
def test_jitted_update_refuses_a_0_1_0_state_naming_state_from_0_1_0(form):
  tx, params = _transform(), _params()
  with pytest.raises(TypeError, match=HOW_TO_CONVERT):
    old = RESTORED[form](_checkpoint_0_1_0(), tx.init(params))
    jax.jit(tx.update)(_grads(), old, params)


def test_the_positional_namedtuple_message_says_what_was_passed():
  tx, params = _transform(), _params()
  with pytest.raises(TypeError, match=r"takes \(key, count, accountant, phases=None, "
                                      r"truncation=None\); got 9 "
                                      r"positional arguments"):
    type(tx.init(params))(*[jnp.asarray(x) for x in _checkpoint_0_1_0()])


def test_the_namedtuple_still_builds_from_its_own_fields():
  # The refusal only catches 0.1.0's fields: positional and keyword construction of the 1.0
  # fields, jax.tree.unflatten and _replace are unchanged.
  tx, params = _transform(), _params()
  state = tx.init(params)
  rebuilt = type(state)(*state)
  assert jax.tree.structure(rebuilt) == jax.tree.structure(state)
  by_name = type(state)(key=state.key, count=state.count, accountant=state.accountant)
  assert jax.tree.structure(by_name) == jax.tree.structure(state)
  unflattened = jax.tree.unflatten(jax.tree.structure(state), jax.tree.leaves(state))
  assert isinstance(unflattened, type(state))
  assert int(state._replace(count=jnp.int32(5)).count) == 5
  with pytest.raises(TypeError, match="missing 1 required positional argument"):
    type(state)(state.key, state.count)


@pytest.mark.parametrize("form", ["dict", "flat tuple", "list"])
def test_each_container_form_converts_and_continues(form):
  tx, params = _transform(), _params()
  old = RESTORED[form](_checkpoint_0_1_0(), tx.init(params))
  _, after = tx.update(_grads(), state_from_0_1_0(old), params)
  assert int(after.count) == 2 and int(after.accountant.segment_steps) == 2
  expected = np.asarray(jaxrdp.compute_rdp(Q, SIGMA, 2, jaxrdp.DEFAULT_ORDERS))
  np.testing.assert_allclose(np.asarray(jaxrdp.rdp_spent(after)[1]), expected, rtol=1e-12)
