"""DP-SGD transforms (jaxrdp.training.transform): noise, clipping, masking, keys, the accountant, errors.

Reference values never come from the transform itself: clipping is recomputed in NumPy, the
noise is tested against its distribution (chi-square), and the accountant against
``jaxrdp.compute_rdp`` (composition by multiplication or by summing per-step values) and
``jaxrdp.compute_epsilon``; optax.contrib.dpsgd is the reference for the noiseless chain.
"""

import io
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest
from jax import lax
from scipy import stats

import jaxrdp
from jaxrdp.training.microbatch import ClippedGradSum, clipped_grad_sum
from jaxrdp.training.accountant import RdpAccountantState
from jaxrdp.training.transform import (DifferentiallyPrivateAggregateState,
                              differentially_private_aggregate, dpsgd, privacy_spent, rdp_spent,
                              state_from_0_1_0)

ORDERS = jaxrdp.DEFAULT_ORDERS
Q, SIGMA, DELTA = 0.01, 1.1, 1e-5


def _agg(clip=1.0, sigma=SIGMA, key=0, q=Q, b=10.0, **kw):
  return differentially_private_aggregate(clip, sigma, key, sampling_rate=q, expected_batch_size=b, **kw)


def _params():
  return {"w": jnp.zeros((3, 2)), "b": jnp.zeros((2,))}


def _grads(batch, seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(scale * rng.normal(size=(batch, 3, 2))),
          "b": jnp.asarray(scale * rng.normal(size=(batch, 2)))}


def _np_clipped_sum(grads, clip, mask=None):
  """Independent NumPy reference: Σ_i m_i g_i min(1, C/||g_i||)."""
  w, b = np.asarray(grads["w"], np.float64), np.asarray(grads["b"], np.float64)
  mask = np.ones(len(w), bool) if mask is None else np.asarray(mask)
  out_w, out_b = np.zeros(w.shape[1:]), np.zeros(b.shape[1:])
  for i in range(len(w)):
    if not mask[i]:
      continue
    norm = np.sqrt(np.sum(w[i] ** 2) + np.sum(b[i] ** 2))
    f = min(1.0, clip / norm) if norm > 0 else 1.0
    out_w += f * w[i]
    out_b += f * b[i]
  return {"w": out_w, "b": out_b}


# --------------------------------------------------------------------------- noise


def test_noise_standard_deviation_is_sigma_times_clip_over_expected_batch_size():
  # Zero gradients: the update is pure noise N(0, (σC/b)²) per coordinate. With n coordinates,
  # Σ (x b / σC)² ~ χ²(n); two-sided acceptance region with total false-failure rate 1e-6.
  n, clip, sigma, b = 20_000, 0.5, 2.0, 4.0
  tx = _agg(clip, sigma, key=jax.random.key(7), b=b)
  params = {"x": jnp.zeros((n,), jnp.float32)}
  updates, _ = tx.update({"x": jnp.zeros((3, n), jnp.float32)}, tx.init(params), params)
  z = np.asarray(updates["x"], np.float64) * b / (sigma * clip)
  stat = np.sum(z ** 2)
  assert stats.chi2.ppf(5e-7, n) < stat < stats.chi2.isf(5e-7, n)
  # Mean zero: Σ z ~ N(0, n); |Σ z| / √n < 5 fails with probability 5.7e-7.
  assert abs(np.sum(z)) / np.sqrt(n) < 5.0
  assert updates["x"].dtype == jnp.float32


def test_noise_of_several_leaves_and_dtypes_is_one_draw_each_independent_and_standard():
  # standard_normals draws once per dtype and cuts the draw into the leaves: every leaf gets
  # its shape and dtype (scalars and empty leaves too), the leaves' noise is not one stream
  # repeated, the two dtypes' draws come from different keys, and all of it is N(0, 1):
  # Σ z² ~ χ²(n) (two-sided, false-failure rate 1e-6) and |Σ z|/√n < 5 (5.7e-7).
  from jaxrdp.training.noise import standard_normals
  with jax.enable_x64(True):
    leaves = [jax.ShapeDtypeStruct(s, d) for s, d in (
        ((40, 25), jnp.float32), ((), jnp.float32), ((0, 3), jnp.float32), ((1000,), jnp.float32),
        ((40, 25), jnp.float64), ((1000,), jnp.float64))]
    noise = standard_normals(jax.random.key(5), leaves)
    assert [(z.shape, z.dtype) for z in noise] == [(x.shape, x.dtype) for x in leaves]
    again = standard_normals(jax.random.key(5), leaves)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(noise, again))
    first = np.asarray(noise[0], np.float64).ravel()
    assert not np.allclose(first, np.asarray(noise[3], np.float64)[:first.size])
    assert not np.allclose(first, np.asarray(noise[4]).ravel(), atol=1e-3)
    z = np.concatenate([np.asarray(v, np.float64).ravel() for v in noise])
    n = z.size
    assert stats.chi2.ppf(5e-7, n) < np.sum(z ** 2) < stats.chi2.isf(5e-7, n)
    assert abs(np.sum(z)) / np.sqrt(n) < 5.0


def test_noise_draws_are_bounded_and_a_large_leaf_draws_alone():
  # A shared draw holds at most 2^20 entries (small leaves packed in order, per dtype); a leaf
  # of 2^20 entries or more draws alone, in its own shape (where it is sharded, each device
  # draws its part): the draw for it is jax.random.normal's for its key and shape.
  from jaxrdp.training import noise as noise_module
  big = 1 << 20
  leaves = [jax.ShapeDtypeStruct(s, jnp.float32) for s in
            [(600, 1000), (10,), (500, 1000), (1024, 1024), (3,), (big + 1,)]]
  assert noise_module._groups(leaves) == [[0, 1], [2, 4], [3], [5]]
  z = noise_module.standard_normals(jax.random.key(2), leaves)
  keys = jax.random.split(jax.random.key(2), 4)
  np.testing.assert_array_equal(np.asarray(z[3]),
                                np.asarray(jax.random.normal(keys[2], (1024, 1024), jnp.float32)))
  assert [v.shape for v in z] == [x.shape for x in leaves]
  assert not np.allclose(np.asarray(z[0]).ravel()[:1000], np.asarray(z[2]).ravel()[:1000])


def test_bfloat16_gradients_accumulate_and_draw_noise_in_float32():
  tx = _agg(1.0, SIGMA, key=3)
  params = {"x": jnp.zeros((64,), jnp.bfloat16)}
  g32 = jnp.asarray(np.random.default_rng(0).normal(size=(5, 64)), jnp.float32).astype(jnp.bfloat16)
  out16, _ = tx.update({"x": g32}, tx.init(params), params)
  params32 = {"x": jnp.zeros((64,), jnp.float32)}
  out32, _ = tx.update({"x": g32.astype(jnp.float32)}, tx.init(params32), params32)
  assert out16["x"].dtype == jnp.bfloat16
  # bf16 result = float32 computation (same bf16-representable inputs, same key) cast once.
  np.testing.assert_array_equal(np.asarray(out16["x"], np.float32),
                                np.asarray(out32["x"].astype(jnp.bfloat16), np.float32))


def test_sigma_zero_is_non_private_clipped_mean_over_expected_batch_size():
  grads = _grads(4, scale=3.0)
  mask = jnp.array([True, True, False, True])
  tx = _agg(1.0, 0.0, b=10.0)
  params = _params()
  updates, state = jax.jit(tx.update)(grads, tx.init(params), params, mask=mask)
  ref = _np_clipped_sum(grads, 1.0, mask)
  for k in ref:  # divided by the public b = 10, not by the 3 real or 4 padded examples
    np.testing.assert_allclose(np.asarray(updates[k]), ref[k] / 10.0, rtol=1e-12, atol=1e-15)
  eps, _ = privacy_spent(state, DELTA)
  assert np.isinf(float(eps))


# --------------------------------------------------------------------------- clipping and masks


def test_each_example_is_clipped_to_the_global_norm():
  params = _params()
  tx = _agg(1.5, 0.0, b=1.0)
  big = _grads(1, seed=1, scale=10.0)
  out, _ = tx.update(big, tx.init(params), params)
  total = np.sqrt(sum(np.sum(np.asarray(v) ** 2) for v in out.values()))
  assert total == pytest.approx(1.5, rel=1e-12)  # exactly C, direction kept
  np.testing.assert_allclose(np.asarray(out["w"]) / np.asarray(big["w"][0]),
                             np.full((3, 2), 1.5 / np.sqrt(sum(np.sum(np.asarray(v) ** 2) for v in big.values()))))
  small = _grads(1, seed=2, scale=0.1)  # norm < C: unchanged
  out, _ = tx.update(small, tx.init(params), params)
  np.testing.assert_allclose(np.asarray(out["b"]), np.asarray(small["b"][0]), rtol=1e-12)
  mixed = _grads(6, seed=3, scale=0.8)
  out, _ = tx.update(mixed, tx.init(params), params)
  ref = _np_clipped_sum(mixed, 1.5)
  for k in ref:
    np.testing.assert_allclose(np.asarray(out[k]), ref[k], rtol=1e-12)


def test_masked_nan_and_inf_padding_contributes_exactly_zero():
  params = _params()
  tx = _agg(1.0, SIGMA, key=11)
  real = _grads(5, seed=4)
  pad = {"w": jnp.full((3, 3, 2), jnp.nan).at[1].set(jnp.inf), "b": jnp.full((3, 2), -jnp.inf)}
  padded = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), real, pad)
  mask = jnp.arange(8) < 5
  step = jax.jit(tx.update)
  out_padded, s_padded = step(padded, tx.init(params), params, mask=mask)
  out_real, s_real = step(real, tx.init(params), params)
  for k in out_real:
    assert np.all(np.isfinite(np.asarray(out_padded[k])))
    np.testing.assert_allclose(np.asarray(out_padded[k]), np.asarray(out_real[k]), rtol=1e-13, atol=1e-15)
  np.testing.assert_array_equal(np.asarray(s_padded.key), np.asarray(s_real.key))


def test_unmasked_non_finite_example_is_dropped_not_propagated():
  params = _params()
  tx = _agg(1.0, 0.0, b=1.0)
  grads = _grads(3, seed=5)
  bad = jax.tree.map(lambda g: g.at[1].set(jnp.nan), grads)
  out, _ = tx.update(bad, tx.init(params), params)
  ref = _np_clipped_sum(grads, 1.0, np.array([True, False, True]))
  for k in ref:
    np.testing.assert_allclose(np.asarray(out[k]), ref[k], rtol=1e-12)


# --------------------------------------------------------------------------- keys


def test_noise_is_fresh_at_every_step_and_keys_never_repeat():
  params = {"x": jnp.zeros((16,))}
  tx = _agg(1.0, 1.0, key=jax.random.key(5), b=1.0)

  def body(state, _):
    updates, new_state = tx.update({"x": jnp.zeros((2, 16))}, state, params)
    return new_state, (updates["x"], state.key)

  _, (noise, keys) = jax.jit(lambda s: lax.scan(body, s, None, length=64))(tx.init(params))
  noise, keys = np.asarray(noise), np.asarray(keys)
  assert len({row.tobytes() for row in noise}) == 64
  assert len({tuple(k) for k in keys}) == 64
  # Deterministic given the key; a different key gives different noise.
  again, _ = tx.update({"x": jnp.zeros((2, 16))}, tx.init(params), params)
  np.testing.assert_array_equal(np.asarray(again["x"]), noise[0])
  other = _agg(1.0, 1.0, key=jax.random.key(6), b=1.0)
  diff, _ = other.update({"x": jnp.zeros((2, 16))}, other.init(params), params)
  assert not np.array_equal(np.asarray(diff["x"]), noise[0])


def test_typed_key_legacy_key_and_int_seed_give_the_same_stream():
  params = {"x": jnp.zeros((8,))}
  outs = []
  for key in (jax.random.key(42), jax.random.PRNGKey(42), 42):
    tx = _agg(1.0, 1.0, key=key, b=1.0)
    u, _ = tx.update({"x": jnp.zeros((1, 8))}, tx.init(params), params)
    outs.append(np.asarray(u["x"]))
  np.testing.assert_array_equal(outs[0], outs[1])
  np.testing.assert_array_equal(outs[0], outs[2])


# --------------------------------------------------------------------------- the accountant


def test_accountant_equals_compute_rdp_times_steps_in_a_scan():
  params = _params()
  opt = dpsgd(0.1, 1.0, SIGMA, jax.random.key(0), sampling_rate=Q, expected_batch_size=10.0,
              momentum=0.9)
  grads = _grads(4)

  def body(carry, _):
    p, s = carry
    u, s = opt.update(grads, s, p, mask=jnp.array([True, True, True, False]))
    return (optax.apply_updates(p, u), s), None

  (_, state), _ = jax.jit(lambda c: lax.scan(body, c, None, length=37))((params, opt.init(params)))
  orders, rdp = rdp_spent(state)
  expected = np.asarray(jaxrdp.compute_rdp(Q, SIGMA, 37, ORDERS))
  np.testing.assert_allclose(np.asarray(orders), ORDERS)
  np.testing.assert_allclose(np.asarray(rdp), expected, rtol=1e-13)
  eps, order = privacy_spent(state, DELTA)
  eps_ref, order_ref = jaxrdp.compute_epsilon(ORDERS, expected, DELTA)
  assert float(eps) == pytest.approx(float(eps_ref), rel=1e-12)
  assert float(order) == float(order_ref)
  deltas = np.array([1e-5, 1e-7])
  eps_many, _ = privacy_spent(state, deltas)
  np.testing.assert_allclose(np.asarray(eps_many),
                             np.asarray(jaxrdp.compute_epsilon(ORDERS, expected, deltas)[0]), rtol=1e-12)
  # Under jit too, and on a subset of orders (integer ones only).
  eps_jit, _ = jax.jit(privacy_spent)(state, DELTA)
  assert float(eps_jit) == pytest.approx(float(eps_ref), rel=1e-12)
  integer = np.isin(ORDERS, np.arange(2.0, 64.0))
  eps_int, _ = privacy_spent(state, DELTA, orders=ORDERS[integer])
  ref_int, _ = jaxrdp.compute_epsilon(ORDERS[integer], expected[integer], DELTA)
  assert float(eps_int) == pytest.approx(float(ref_int), rel=1e-12)


def test_schedules_accumulate_the_sum_of_per_step_rdp():
  steps = 10
  sigma_s = lambda c: jnp.where(c < 4, 2.0, 1.0)
  q_s = lambda c: jnp.where(c < 6, 0.01, 0.02)
  b_s = lambda c: jnp.where(c < 6, 10.0, 20.0)
  clip_s = lambda c: 1.0 + 0.1 * c
  tx = differentially_private_aggregate(clip_s, sigma_s, 0, sampling_rate=q_s, expected_batch_size=b_s)
  params = _params()
  grads = _grads(3, scale=5.0)

  def body(state, _):
    u, state = tx.update(grads, state, params)
    return state, u

  state, updates = jax.jit(lambda s: lax.scan(body, s, None, length=steps))(tx.init(params))
  t = np.arange(steps)
  qs = np.where(t < 6, 0.01, 0.02)
  sigmas = np.where(t < 4, 2.0, 1.0)
  expected = np.sum(np.asarray(jaxrdp.compute_rdp(qs, sigmas, 1.0, ORDERS)), axis=0)
  np.testing.assert_allclose(np.asarray(rdp_spent(state)[1]), expected, rtol=1e-13)
  assert int(state.accountant.segment_steps) == 4 and int(state.count) == steps  # segments 0-3, 4-5, 6-9
  # The clip schedule is applied: with these large gradients every example is clipped, so
  # the noiseless part is the reference sum at C_t; check the step count went through.
  eps, _ = privacy_spent(state, DELTA)
  ref, _ = jaxrdp.compute_epsilon(ORDERS, expected, DELTA)
  assert float(eps) == pytest.approx(float(ref), rel=1e-12)


def test_clip_schedule_is_evaluated_at_the_step_count():
  params = _params()
  tx = differentially_private_aggregate(lambda c: 0.5 * (c + 1), 0.0, 0, sampling_rate=Q,
                                        expected_batch_size=1.0)
  grads = _grads(2, scale=10.0)
  state = tx.init(params)
  for c in range(3):
    out, state = tx.update(grads, state, params)
    ref = _np_clipped_sum(grads, 0.5 * (c + 1))
    np.testing.assert_allclose(np.asarray(out["w"]), ref["w"], rtol=1e-12)


# --------------------------------------------------------------------------- optax integration


def test_noiseless_dpsgd_matches_optax_contrib_dpsgd_with_full_batches():
  # σ = 0 and b = B: both are clip → mean → momentum → learning rate.
  params = _params()
  ours = dpsgd(0.3, 1.0, 0.0, 0, sampling_rate=0.5, expected_batch_size=6.0, momentum=0.9)
  theirs = optax.contrib.dpsgd(0.3, 1.0, 0.0, 0, momentum=0.9)
  s1, s2 = ours.init(params), theirs.init(params)
  p1 = p2 = params
  for i in range(3):
    g = _grads(6, seed=10 + i, scale=0.7)
    u1, s1 = ours.update(g, s1, p1)
    u2, s2 = theirs.update(g, s2, p2)
    p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
  for k in p1:
    np.testing.assert_allclose(np.asarray(p1[k]), np.asarray(p2[k]), rtol=1e-10, atol=1e-14)


def test_jit_and_eager_updates_agree():
  params = _params()
  opt = dpsgd(0.1, 1.0, SIGMA, 3, sampling_rate=Q, expected_batch_size=10.0)
  g = _grads(4, seed=8)
  mask = jnp.array([True, False, True, True])
  u1, s1 = opt.update(g, opt.init(params), params, mask=mask)
  u2, s2 = jax.jit(opt.update)(g, opt.init(params), params, mask=mask)
  for k in u1:
    np.testing.assert_allclose(np.asarray(u1[k]), np.asarray(u2[k]), rtol=1e-13, atol=1e-16)
  np.testing.assert_array_equal(np.asarray(s1[0].key), np.asarray(s2[0].key))


def test_privacy_spent_finds_the_accountant_in_nested_states():
  params = _params()
  injected = optax.inject_hyperparams(
      dpsgd, static_args=("key", "sampling_rate", "expected_batch_size"))(
          learning_rate=0.1, l2_norm_clip=1.0, noise_multiplier=SIGMA, key=0, sampling_rate=Q,
          expected_batch_size=10.0)
  state = injected.init(params)
  for _ in range(2):
    _, state = injected.update(_grads(3), state, params)
  expected = np.asarray(jaxrdp.compute_rdp(Q, SIGMA, 2, ORDERS))
  np.testing.assert_allclose(np.asarray(rdp_spent(state)[1]), expected, rtol=1e-13)
  nested = {"model": [optax.EmptyState(), (state, None)], "step": jnp.zeros(())}
  eps, _ = privacy_spent(nested, DELTA)
  assert float(eps) == pytest.approx(float(jaxrdp.compute_epsilon(ORDERS, expected, DELTA)[0]), rel=1e-12)


def test_checkpoint_round_trip_continues_the_same_noise_and_accounting():
  params = _params()
  opt = dpsgd(0.1, 1.0, SIGMA, jax.random.key(9), sampling_rate=Q, expected_batch_size=10.0,
              momentum=0.5)
  step = jax.jit(opt.update)
  grads = [_grads(3, seed=20 + i) for i in range(6)]
  state = opt.init(params)
  straight = []
  for g in grads:
    u, state = step(g, state, params)
    straight.append(u)
  final_straight = state

  state = opt.init(params)
  for g in grads[:3]:
    _, state = step(g, state, params)
  buf = io.BytesIO()
  leaves, treedef = jax.tree.flatten(state)
  np.savez(buf, *[np.asarray(x) for x in leaves])
  blob, tree_blob = buf.getvalue(), pickle.dumps(treedef)
  del state
  loaded = np.load(io.BytesIO(blob))
  restored = jax.tree.unflatten(pickle.loads(tree_blob),
                                [jnp.asarray(loaded[f"arr_{i}"]) for i in range(len(loaded.files))])
  assert isinstance(restored[0], DifferentiallyPrivateAggregateState)
  for i, g in enumerate(grads[3:]):
    u, restored = step(g, restored, params)
    for k in u:
      np.testing.assert_array_equal(np.asarray(u[k]), np.asarray(straight[3 + i][k]))
  assert float(privacy_spent(restored, DELTA)[0]) == float(privacy_spent(final_straight, DELTA)[0])


def _sigma_schedule(c):
  return jnp.where(c < 2, 2.0, SIGMA)


def _leaves_0_1_0_after_3_steps(seed):
  """The 9 leaves jaxrdp 0.1.0 checkpointed after 3 steps of _sigma_schedule, in its order.

  0.1.0's flat state was (key, count, orders, rdp, rdp_compensation, sampling_rate,
  noise_multiplier, step_rdp, segment_steps). After steps 0-1 at σ = 2 and step 2 at σ = 1.1:
  the closed segment holds 2 ε(q, 2) (Kahan-added to 0: no compensation), the open one 1 step
  at (q, 1.1); the key was split once per step (the first half kept)."""
  key = jax.random.key(seed)
  for _ in range(3):
    key, _ = jax.random.split(key)
  return [np.asarray(jax.random.key_data(key)), np.int32(3), ORDERS,
          2 * np.asarray(jaxrdp.compute_rdp(Q, 2.0, 1, ORDERS)), np.zeros(len(ORDERS)),
          np.float64(Q), np.float64(SIGMA), np.asarray(jaxrdp.compute_rdp(Q, SIGMA, 1, ORDERS)),
          np.int32(1)]


def test_a_0_1_0_checkpoint_of_flat_leaves_restores_and_continues_the_same_run():
  params = _params()
  tx = differentially_private_aggregate(1.0, _sigma_schedule, 9, sampling_rate=Q,
                                        expected_batch_size=10.0)
  step = jax.jit(tx.update)
  grads = [_grads(3, seed=40 + i) for i in range(6)]
  straight, state = [], tx.init(params)
  for g in grads:
    u, state = step(g, state, params)
    straight.append(u)

  buf = io.BytesIO()  # the 0.1.0 checkpoint, written as flat leaves with NumPy
  np.savez(buf, *_leaves_0_1_0_after_3_steps(seed=9))
  loaded = np.load(io.BytesIO(buf.getvalue()))
  leaves = [loaded[f"arr_{i}"] for i in range(9)]
  restored = jax.tree.unflatten(jax.tree.structure(tx.init(params)), leaves)
  assert isinstance(restored.accountant, RdpAccountantState)
  assert int(restored.accountant.segment_steps) == 1 and float(restored.accountant.mechanism[1]) == SIGMA
  for i, g in enumerate(grads[3:]):
    u, restored = step(g, restored, params)
    for k in u:  # the same key: the same noise as the uninterrupted run
      np.testing.assert_array_equal(np.asarray(u[k]), np.asarray(straight[3 + i][k]))
  # The same accounting: 2 steps at σ = 2 and 4 at σ = 1.1, as computed by compute_rdp.
  expected = (np.asarray(jaxrdp.compute_rdp(Q, 2.0, 2, ORDERS))
              + np.asarray(jaxrdp.compute_rdp(Q, SIGMA, 4, ORDERS)))
  np.testing.assert_allclose(np.asarray(rdp_spent(restored)[1]), expected, rtol=1e-13)
  np.testing.assert_allclose(np.asarray(rdp_spent(restored)[1]), np.asarray(rdp_spent(state)[1]),
                             rtol=1e-13)
  assert float(privacy_spent(restored, DELTA)[0]) == pytest.approx(
      float(privacy_spent(state, DELTA)[0]), rel=1e-12)


def test_a_0_1_0_state_in_another_form_is_refused_with_how_to_convert_it():
  params = _params()
  tx = differentially_private_aggregate(1.0, _sigma_schedule, 9, sampling_rate=Q,
                                        expected_batch_size=10.0)
  leaves = _leaves_0_1_0_after_3_steps(seed=9)
  names = ("key", "count", "orders", "rdp", "rdp_compensation", "sampling_rate",
           "noise_multiplier", "step_rdp", "segment_steps")
  state_dict = dict(zip(names, leaves))  # as serialization libraries write a NamedTuple
  for old in (state_dict, tuple(leaves)):
    with pytest.raises(TypeError, match=r"0\.1\.0 state.*state_from_0_1_0.*jax\.tree\.unflatten"):
      tx.update(_grads(3), old, params)
    with pytest.raises(TypeError, match=r"0\.1\.0.*state_from_0_1_0"):
      privacy_spent({"opt": [old]}, DELTA)
    with pytest.raises(TypeError, match=r"0\.1\.0.*state_from_0_1_0"):
      rdp_spent(old)
  # The converter gives the state that the flat leaves restore to, and it continues the run.
  converted = state_from_0_1_0(state_dict)
  unflattened = jax.tree.unflatten(jax.tree.structure(tx.init(params)), leaves)
  assert jax.tree.structure(converted) == jax.tree.structure(unflattened)
  for a, b in zip(jax.tree.leaves(converted), jax.tree.leaves(unflattened)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jnp.result_type(a) == jnp.result_type(b)
  _, after = tx.update(_grads(3), state_from_0_1_0(tuple(leaves)), params)
  assert int(after.count) == 4 and int(after.accountant.segment_steps) == 2


def test_state_from_0_1_0_names_what_it_cannot_convert():
  leaves = _leaves_0_1_0_after_3_steps(seed=0)
  with pytest.raises(TypeError, match="got a list of 8 elements"):
    state_from_0_1_0(leaves[:8])
  with pytest.raises(TypeError, match="keys"):
    state_from_0_1_0({"key": leaves[0], "count": leaves[1]})
  bad = list(leaves)
  bad[3] = bad[3][:5]
  with pytest.raises(ValueError, match=r"old\.rdp must have the shape of old\.orders"):
    state_from_0_1_0(bad)
  bad = list(leaves)
  bad[1] = np.float64(3.0)
  with pytest.raises(TypeError, match=r"old\.count must have an integer dtype"):
    state_from_0_1_0(bad)


def test_a_state_of_another_accountant_dtype_is_refused():
  params = _params()
  state = _agg(accountant_dtype=jnp.float32).init(params)
  with pytest.raises(ValueError, match="accountant_dtype=float32"):
    _agg().update(_grads(2), state, params)


# --------------------------------------------------------------------------- microbatching


def _linear_loss(params, example):
  x, y = example
  return 0.5 * (jnp.dot(x, params["w"][:, 0]) + params["b"][0] - y) ** 2


def test_microbatched_clipped_sum_equals_the_per_example_reference():
  rng = np.random.default_rng(30)
  params = {"w": jnp.asarray(rng.normal(size=(3, 2))), "b": jnp.asarray(rng.normal(size=(2,)))}
  x = rng.normal(size=(7, 3)) * 2
  y = rng.normal(size=(7,))
  x[5:] = np.nan  # padding rows: NaN data, NaN loss, NaN gradient
  mask = jnp.arange(7) < 5
  batch = (jnp.asarray(x), jnp.asarray(y))
  result = jax.jit(lambda p, b, m: clipped_grad_sum(_linear_loss, p, b, 1.0, mask=m,
                                                    microbatch_size=3))(params, batch, mask)
  # Analytic per-example gradients, clipped in NumPy.
  w, b0 = np.asarray(params["w"]), float(params["b"][0])
  gw, gb = np.zeros((7, 3, 2)), np.zeros((7, 2))
  for i in range(5):
    r = x[i] @ w[:, 0] + b0 - y[i]
    gw[i, :, 0] = r * x[i]
    gb[i, 0] = r
  ref = _np_clipped_sum({"w": gw, "b": gb}, 1.0, np.arange(7) < 5)
  for k in ref:
    np.testing.assert_allclose(np.asarray(result.grad_sum[k]), ref[k], rtol=1e-12, atol=1e-15)
  # The transform given the clipped sum adds the same noise as given per-example gradients.
  tx = _agg(1.0, SIGMA, key=4)
  per_example = jax.vmap(jax.grad(_linear_loss), in_axes=(None, 0))(params, batch)
  u1, s1 = tx.update(result, tx.init(params), params)
  u2, s2 = tx.update(per_example, tx.init(params), params, mask=mask)
  for k in u1:
    np.testing.assert_allclose(np.asarray(u1[k]), np.asarray(u2[k]), rtol=1e-12, atol=1e-15)
  np.testing.assert_allclose(np.asarray(rdp_spent(s1)[1]), np.asarray(rdp_spent(s2)[1]))


def test_a_sum_clipped_above_the_transform_clip_is_refused():
  params = _params()
  tx = _agg(1.0, SIGMA)
  sums = ClippedGradSum(jax.tree.map(jnp.zeros_like, params), jnp.asarray(2.0))
  with pytest.raises(ValueError, match="clipped at 2.0"):
    tx.update(sums, tx.init(params), params)
  with pytest.raises(ValueError, match="mask"):
    tx.update(sums._replace(l2_norm_clip=jnp.asarray(1.0)), tx.init(params), params,
              mask=jnp.ones((1,), bool))
  out, _ = jax.jit(tx.update)(sums, tx.init(params), params)  # under jit: NaN, not a number
  assert np.all(np.isnan(np.asarray(out["w"])))


@pytest.mark.parametrize("microbatch_size", [None, 3])
def test_clipped_grad_sum_under_jit_gives_nan_for_a_clip_outside_its_domain(microbatch_size):
  # The eager call raises (test_bad_input.py); under jit a clip of -1 gave sums scaled by -1,
  # and NaN or ±inf unclipped sums: plausible gradients. Now NaN, the valid clip unchanged.
  params = _params()
  batch = (jnp.ones((5, 3)), jnp.zeros((5,)))
  summed = jax.jit(lambda c: clipped_grad_sum(_linear_loss, params, batch, c,
                                              microbatch_size=microbatch_size).grad_sum)
  for clip in (-1.0, np.nan, np.inf, -np.inf):
    out = summed(clip)
    assert all(np.all(np.isnan(np.asarray(x))) for x in jax.tree.leaves(out)), clip
  eager = clipped_grad_sum(_linear_loss, params, batch, 1.0, microbatch_size=microbatch_size)
  for k, x in summed(1.0).items():
    np.testing.assert_allclose(np.asarray(x), np.asarray(eager.grad_sum[k]), rtol=1e-12)


# --------------------------------------------------------------------------- errors


def test_errors_name_the_argument():
  params = _params()
  with pytest.raises(TypeError, match="key is required"):
    differentially_private_aggregate(1.0, 1.0, None, sampling_rate=Q, expected_batch_size=1.0)
  with pytest.raises(TypeError, match="key"):
    differentially_private_aggregate(1.0, 1.0, "seed", sampling_rate=Q, expected_batch_size=1.0)
  for b in (0.0, -3.0):
    with pytest.raises(ValueError, match="expected_batch_size"):
      _agg(b=b)
  with pytest.raises(ValueError, match="l2_norm_clip"):
    _agg(clip=-1.0)
  with pytest.raises(ValueError, match="noise_multiplier"):
    _agg(sigma=-0.5)
  for q in (0.0, 1.5, np.nan):
    with pytest.raises(ValueError, match="sampling_rate"):
      _agg(q=q)
  with pytest.raises(ValueError, match=r"l2_norm_clip\(0\)"):
    _agg(clip=lambda c: -1.0).init(params)
  with pytest.raises(TypeError, match="accountant_dtype"):
    _agg(accountant_dtype=jnp.int32)
  with pytest.raises(TypeError, match="sampling_rate is required"):
    differentially_private_aggregate(1.0, 1.0, 0, sampling_rate=None, expected_batch_size=1.0)

  tx = _agg()
  state = tx.init(params)
  with pytest.raises(ValueError, match="leading batch axis"):
    tx.update({"w": jnp.zeros((4, 3, 2)), "b": jnp.zeros((5, 2))}, state, params)
  with pytest.raises(ValueError, match="batch axis"):
    tx.update({"w": jnp.zeros((3, 2)), "b": jnp.zeros(())}, state, None)
  square = {"w": jnp.zeros((2, 3)), "b": jnp.zeros((2,))}  # unbatched grads share a leading 2
  with pytest.raises(ValueError, match=r"\(batch,\) \+ parameter shape"):
    tx.update(square, tx.init(square), square)
  with pytest.raises(ValueError, match="mask must have shape"):
    jax.jit(tx.update)(_grads(4), state, params, mask=jnp.ones((5,), bool))
  with pytest.raises(TypeError, match="mask must be a boolean"):
    tx.update(_grads(4), state, params, mask=jnp.ones((4,)))
  with pytest.raises(ValueError, match="no DifferentiallyPrivateAggregateState"):
    privacy_spent(optax.sgd(0.1).init(params), DELTA)
  with pytest.raises(ValueError, match="2 DifferentiallyPrivateAggregateStates"):
    privacy_spent((state, state), DELTA)
  with pytest.raises(ValueError, match="not among the accountant's orders"):
    privacy_spent(state, DELTA, orders=[2.5, 3.14159])


def test_privacy_spent_under_jit_gives_nan_for_orders_outside_their_domain():
  # Eagerly such orders raise. Under jit, orders 0, NaN and -inf matched no order of the
  # accountant and were skipped, giving ε = +inf; an invalid argument gives NaN. A valid order
  # that is not among the accountant's is still skipped (the docstring): ε = +inf.
  params = _params()
  tx = _agg(orders=[2.0, 8.0])
  _, state = tx.update(_grads(4), tx.init(params), params)
  spent = jax.jit(lambda o: privacy_spent(state, DELTA, orders=o))
  for bad in (0.0, np.nan, -np.inf, 0.5):
    eps, order = spent(jnp.array([2.0, bad]))
    assert np.isnan(float(eps)) and np.isnan(float(order)), bad
  eps, _ = spent(jnp.array([3.0]))
  assert float(eps) == np.inf
  eps, order = spent(jnp.array([2.0, 3.0]))
  eps_ref, order_ref = privacy_spent(state, DELTA, orders=[2.0])
  assert (float(eps), float(order)) == (float(eps_ref), float(order_ref))


def test_invalid_scheduled_values_under_jit_give_nan_updates():
  params = _params()
  tx = differentially_private_aggregate(lambda c: jnp.where(c >= 1, -1.0, 1.0), SIGMA, 0,
                                        sampling_rate=Q, expected_batch_size=10.0)
  step = jax.jit(tx.update)
  u, state = step(_grads(2), tx.init(params), params)
  assert np.all(np.isfinite(np.asarray(u["w"])))
  u, state = step(_grads(2), state, params)
  assert np.all(np.isnan(np.asarray(u["w"])))


@pytest.mark.parametrize("name,bad", [("sampling_rate", 0.0), ("sampling_rate", 1.5),
                                      ("sampling_rate", np.nan), ("noise_multiplier", -1.0)])
def test_a_schedule_leaving_its_domain_under_jit_gives_nan_updates_and_nan_rdp(name, bad):
  # q = 0 is in the accountant's [0, 1] but not a rate that draws batches, (0, 1]: a step at
  # it is invalid like σ < 0, not a free step (its RDP would be 0 and ε would stop growing).
  valid = {"sampling_rate": Q, "noise_multiplier": SIGMA}
  schedule = lambda c: jnp.where(c >= 1, bad, valid[name])
  tx = _agg(**{"q" if name == "sampling_rate" else "sigma": schedule})
  params = _params()
  step = jax.jit(tx.update)
  u, state = step(_grads(2), tx.init(params), params)
  assert np.all(np.isfinite(np.asarray(u["w"])))
  assert np.isfinite(float(privacy_spent(state, DELTA)[0]))
  for _ in range(2):
    u, state = step(_grads(2), state, params)
    assert np.all(np.isnan(np.asarray(u["w"]))) and np.all(np.isnan(np.asarray(u["b"])))
    assert np.all(np.isnan(np.asarray(rdp_spent(state)[1])))
    assert float(privacy_spent(state, DELTA)[0]) == np.inf   # every order skipped: never finite
  with pytest.raises(ValueError, match=name):   # eagerly, the schedule's value is checked
    tx.update(_grads(2), state, params)
