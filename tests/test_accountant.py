"""The segment accountant (jaxrdp.training.accountant): its pure step, tested directly.

Reference values never come from the accountant: RDP of n steps is ``jaxrdp.compute_rdp``
with ``steps=n`` (composition by multiplication, Mironov 2017, Prop. 1) or the sum of its
per-step values; sums of float32 terms are checked against the float64 sum in NumPy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrdp
from jaxrdp.training import accountant
from jaxrdp.training.accountant import RdpAccountantState, _kahan_add

ORDERS = jaxrdp.DEFAULT_ORDERS
Q, SIGMA, DELTA = 0.01, 1.1, 1e-5


def _rdp_of_one_step(q, sigma):
  return jaxrdp.compute_rdp(q, sigma, 1, ORDERS)


def _eager(thetas, state=None):
  """The accountant after the steps ``thetas`` (a list of (q, σ)), eagerly."""
  state = accountant.init(ORDERS, 2) if state is None else state
  for theta in thetas:
    state = accountant.step(state, theta, _rdp_of_one_step, orders=ORDERS)
  return state


@jax.jit
def _jitted(state, qs, sigmas):
  """The accountant after the steps (qs[t], sigmas[t]) in a jitted lax.scan (lax.cond path)."""
  def body(s, theta):
    return accountant.step(s, theta, _rdp_of_one_step, orders=ORDERS), None
  return lax.scan(body, state, (qs, sigmas))[0]


# A schedule of 10 steps: segments 0-2 at (0.01, 2.0), 3-6 at (0.02, 1.0), 7-9 at (0.01, 2.0).
SCHEDULE_Q = np.array([0.01] * 3 + [0.02] * 4 + [0.01] * 3)
SCHEDULE_SIGMA = np.array([2.0] * 3 + [1.0] * 4 + [2.0] * 3)


# --------------------------------------------------------------------------- init


def test_a_new_accountant_has_no_rdp_and_no_segment():
  state = accountant.init(ORDERS, 2)
  np.testing.assert_array_equal(np.asarray(state.orders), ORDERS)
  assert all(np.isnan(float(x)) for x in state.mechanism) and len(state.mechanism) == 2
  assert int(state.segment_steps) == 0
  orders, rdp = accountant.accumulated_rdp(state)
  np.testing.assert_array_equal(np.asarray(rdp), np.zeros(len(ORDERS)))


def test_init_takes_the_dtype_given_and_checks_its_arguments():
  state = accountant.init(ORDERS, 2, dtype=jnp.float32)
  assert state.orders.dtype == state.rdp.dtype == state.step_rdp.dtype == jnp.float32
  assert state.mechanism[0].dtype == jnp.float32 and state.segment_steps.dtype == jnp.int32
  with pytest.raises(ValueError, match="orders must be 1-D"):
    accountant.init(np.ones((2, 3)) * 2, 2)
  with pytest.raises(ValueError, match="orders"):
    accountant.init([0.5, 2.0], 2)
  with pytest.raises(TypeError, match="dtype"):
    accountant.init(ORDERS, 2, dtype=jnp.int32)
  with pytest.raises(TypeError, match="num_parameters"):
    accountant.init(ORDERS, 2.0)


# --------------------------------------------------------------------------- segments


def test_steps_of_one_mechanism_stay_in_one_segment():
  state = _eager([(Q, SIGMA)] * 5)
  assert int(state.segment_steps) == 5
  np.testing.assert_array_equal(np.asarray(state.rdp), np.zeros(len(ORDERS)))  # nothing closed
  np.testing.assert_allclose(np.asarray(state.step_rdp),
                             np.asarray(jaxrdp.compute_rdp(Q, SIGMA, 1, ORDERS)), rtol=1e-13)


def test_accumulated_rdp_equals_compute_rdp_times_steps():
  state = _eager([(Q, SIGMA)] * 37)
  _, rdp = accountant.accumulated_rdp(state)
  np.testing.assert_allclose(np.asarray(rdp), np.asarray(jaxrdp.compute_rdp(Q, SIGMA, 37, ORDERS)),
                             rtol=1e-13)


def test_a_change_of_mechanism_closes_the_segment_and_opens_a_new_one():
  thetas = list(zip(SCHEDULE_Q.tolist(), SCHEDULE_SIGMA.tolist()))
  state = _eager(thetas[:3])
  state = accountant.step(state, thetas[3], _rdp_of_one_step, orders=ORDERS)
  # Closed: the 3 steps at (0.01, 2.0); open: 1 step at (0.02, 1.0).
  np.testing.assert_allclose(np.asarray(state.rdp - state.rdp_compensation),
                             np.asarray(jaxrdp.compute_rdp(0.01, 2.0, 3, ORDERS)), rtol=1e-13)
  assert int(state.segment_steps) == 1
  assert (float(state.mechanism[0]), float(state.mechanism[1])) == (0.02, 1.0)
  np.testing.assert_allclose(np.asarray(state.step_rdp),
                             np.asarray(jaxrdp.compute_rdp(0.02, 1.0, 1, ORDERS)), rtol=1e-13)


def test_a_schedule_accumulates_the_sum_of_its_per_step_rdp():
  state = _eager(list(zip(SCHEDULE_Q.tolist(), SCHEDULE_SIGMA.tolist())))
  expected = np.sum(np.asarray(jaxrdp.compute_rdp(SCHEDULE_Q, SCHEDULE_SIGMA, 1.0, ORDERS)), axis=0)
  np.testing.assert_allclose(np.asarray(accountant.accumulated_rdp(state)[1]), expected, rtol=1e-13)
  assert int(state.segment_steps) == 3  # the last segment, steps 7-9


def test_the_rdp_function_runs_once_per_segment():
  calls = []

  def rdp_fn(q, sigma):
    calls.append((float(q), float(sigma)))
    return _rdp_of_one_step(q, sigma)

  state = accountant.init(ORDERS, 2)
  for q, sigma in zip(SCHEDULE_Q.tolist(), SCHEDULE_SIGMA.tolist()):
    state = accountant.step(state, (q, sigma), rdp_fn, orders=ORDERS)
  assert calls == [(0.01, 2.0), (0.02, 1.0), (0.01, 2.0)]


def test_a_state_without_steps_opens_a_segment_even_at_its_recorded_mechanism():
  # A hand-made state that records (q, σ) but no step: the first step must not reuse its
  # (zero) step_rdp, which would account the step as free.
  state = accountant.init(ORDERS, 2)._replace(mechanism=(jnp.asarray(Q), jnp.asarray(SIGMA)))
  state = accountant.step(state, (Q, SIGMA), _rdp_of_one_step, orders=ORDERS)
  np.testing.assert_allclose(np.asarray(accountant.accumulated_rdp(state)[1]),
                             np.asarray(jaxrdp.compute_rdp(Q, SIGMA, 1, ORDERS)), rtol=1e-13)


def test_a_segment_is_closed_after_max_segment_steps_without_a_change():
  step_rdp = np.full(len(ORDERS), 0.125)
  full = accountant.init(ORDERS, 2)._replace(
      mechanism=(jnp.asarray(Q), jnp.asarray(SIGMA)), step_rdp=jnp.asarray(step_rdp),
      segment_steps=jnp.asarray(accountant._MAX_SEGMENT_STEPS, jnp.int32))
  state = accountant.step(full, (Q, SIGMA), step_rdp, orders=ORDERS)
  assert int(state.segment_steps) == 1
  np.testing.assert_array_equal(np.asarray(state.rdp), 2.0 ** 24 * step_rdp)  # exact: powers of 2
  np.testing.assert_array_equal(np.asarray(accountant.accumulated_rdp(state)[1]),
                                (2.0 ** 24 + 1) * step_rdp)


# --------------------------------------------------------------------------- Kahan


def test_compensated_sum_of_1e5_float32_terms_matches_float64():
  # The closed segments of a schedule are added by Kahan summation (one add per change);
  # the float32 accountant over 1e5 constant steps is tested in test_sharding.py (x64 off).
  x = np.random.default_rng(0).uniform(0.5, 1.5, size=(100_000, 4)).astype(np.float32)

  def body(carry, v):
    return _kahan_add(*carry, v), None

  zero = jnp.zeros((4,), jnp.float32)
  (total, comp), _ = jax.jit(lambda xs: lax.scan(body, (zero, zero), xs))(jnp.asarray(x))
  exact = np.sum(x.astype(np.float64), axis=0)
  np.testing.assert_allclose(np.asarray(total - comp, np.float64), exact, rtol=2e-7)
  naive = np.zeros(4, np.float32)
  for row in x[:20_000]:  # a plain float32 running sum is already off by > 1e-6 here
    naive += row
  assert np.max(np.abs(naive / np.sum(x[:20_000].astype(np.float64), axis=0) - 1)) > 1e-6
  # inf is carried without turning into NaN.
  t, c = _kahan_add(jnp.float32(1.0), jnp.float32(0.0), jnp.float32(np.inf))
  t, c = _kahan_add(t, c, jnp.float32(1.0))
  assert np.isinf(float(t)) and float(c) == 0.0


def test_closing_1e5_float32_segments_does_not_drift():
  # Every step has a new mechanism θ = t, so every step closes a segment: 1e5 Kahan additions
  # of float32 per-step values, compared with their float64 sum.
  orders = np.array([2.0, 8.0, 32.0, 128.0], np.float32)
  x = np.random.default_rng(1).uniform(0.5, 1.5, size=(100_000, 4)).astype(np.float32)
  thetas = np.arange(100_000, dtype=np.float32)  # exact in float32

  def body(state, xs):
    theta, step_rdp = xs
    return accountant.step(state, (theta,), step_rdp, orders=orders), None

  init = accountant.init(orders, 1, dtype=jnp.float32)
  state = jax.jit(lambda s, xs: lax.scan(body, s, xs)[0])(init, (jnp.asarray(thetas), jnp.asarray(x)))
  _, rdp = accountant.accumulated_rdp(state)
  assert rdp.dtype == jnp.float32 and int(state.segment_steps) == 1
  np.testing.assert_allclose(np.asarray(rdp, np.float64), np.sum(x.astype(np.float64), axis=0),
                             rtol=2e-7)


# --------------------------------------------------------------------------- never a smaller ε


def test_a_state_with_other_orders_gets_nan_there_never_a_number():
  other = ORDERS.copy()
  other[::2] += 0.25  # every other order differs
  state = accountant.init(other, 2)
  state = accountant.step(state, (Q, SIGMA), _rdp_of_one_step, orders=ORDERS)
  _, rdp = accountant.accumulated_rdp(state)
  rdp = np.asarray(rdp)
  assert np.all(np.isnan(rdp[::2]))
  expected = np.asarray(jaxrdp.compute_rdp(Q, SIGMA, 1, ORDERS))
  np.testing.assert_allclose(rdp[1::2], expected[1::2], rtol=1e-13)
  # The conversion skips the NaN orders: ε is the one of the matching orders alone.
  eps, _ = jaxrdp.compute_epsilon(other, rdp, DELTA)
  ref, _ = jaxrdp.compute_epsilon(ORDERS[1::2], expected[1::2], DELTA)
  assert float(eps) == pytest.approx(float(ref), rel=1e-12)


def test_an_invalid_mechanism_under_jit_gives_nan_rdp():
  qs = np.full(10, Q)
  qs[4] = -0.5  # invalid under jit: no error, NaN from the RDP kernel
  state = _jitted(accountant.init(ORDERS, 2), jnp.asarray(qs), jnp.full(10, SIGMA))
  _, rdp = accountant.accumulated_rdp(state)
  assert np.all(np.isnan(np.asarray(rdp)))
  eps, _ = jaxrdp.compute_epsilon(ORDERS, rdp, DELTA)
  assert np.isinf(float(eps))


def test_mismatched_orders_or_mechanism_are_refused():
  state = accountant.init(ORDERS, 2)
  with pytest.raises(ValueError, match="orders must have the shape"):
    accountant.step(state, (Q, SIGMA), _rdp_of_one_step, orders=ORDERS[:5])
  with pytest.raises(ValueError, match="mechanism must have 2 parameters"):
    accountant.step(state, (Q,), _rdp_of_one_step, orders=ORDERS)
  with pytest.raises(TypeError, match="mechanism must be a tuple"):
    accountant.step(state, Q, _rdp_of_one_step, orders=ORDERS)


# --------------------------------------------------------------------------- jit


def test_jit_and_eager_steps_agree():
  eager = _eager(list(zip(SCHEDULE_Q.tolist(), SCHEDULE_SIGMA.tolist())))
  jitted = _jitted(accountant.init(ORDERS, 2), jnp.asarray(SCHEDULE_Q), jnp.asarray(SCHEDULE_SIGMA))
  assert isinstance(jitted, RdpAccountantState)
  assert jax.tree.structure(jitted) == jax.tree.structure(eager)
  for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
    assert a.dtype == b.dtype
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13)


def test_a_constant_step_rdp_keeps_the_rdp_kernel_out_of_the_step_graph():
  state = accountant.init(ORDERS, 2)
  fixed = np.asarray(jaxrdp.compute_rdp(Q, SIGMA, 1, ORDERS))
  constant = jax.make_jaxpr(lambda s: accountant.step(s, (Q, SIGMA), fixed, orders=ORDERS))(state)
  computed = jax.make_jaxpr(
      lambda s: accountant.step(s, (Q, SIGMA), _rdp_of_one_step, orders=ORDERS))(state)
  assert "cond" not in str(constant)
  assert "cond" in str(computed)  # the kernel runs only when the segment changes
  out = accountant.step(state, (Q, SIGMA), fixed, orders=ORDERS)
  np.testing.assert_array_equal(np.asarray(out.step_rdp), fixed)


def test_under_vmap_the_rdp_kernel_stays_a_branch_and_each_lane_keeps_its_segment():
  # Training vmapped over runs with their own schedules batches θ, so whether it changed is
  # batched: without care jax.vmap turns the lax.cond into a select that runs the RDP kernel
  # at every step.
  # The branch must stay a cond (run where some lane's θ changed), and each lane's result must
  # be that lane's own run, also where lanes change θ at different steps.
  qs = np.stack([SCHEDULE_Q, np.full(10, 0.01), SCHEDULE_Q[::-1]])
  sigmas = np.stack([SCHEDULE_SIGMA, np.full(10, 2.0), SCHEDULE_SIGMA[::-1]])
  init = jax.vmap(lambda _: accountant.init(ORDERS, 2))(jnp.arange(3))
  batched = jax.vmap(_jitted)(init, jnp.asarray(qs), jnp.asarray(sigmas))
  for lane in range(3):
    alone = _eager(list(zip(qs[lane].tolist(), sigmas[lane].tolist())))
    for a, b in zip(jax.tree.leaves(alone), jax.tree.leaves(batched)):
      np.testing.assert_allclose(np.asarray(b)[lane], np.asarray(a), rtol=1e-13)
  one_step = jax.make_jaxpr(jax.vmap(
      lambda s, q, sigma: accountant.step(s, (q, sigma), _rdp_of_one_step, orders=ORDERS)))(
          init, jnp.asarray(qs[:, 0]), jnp.asarray(sigmas[:, 0]))
  assert "cond[" in str(one_step)
