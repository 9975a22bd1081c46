"""Low-precision gradients: the DP aggregate sums and adds noise in float32, and casts once.

jax_privacy's "sharp edges" (and optax.contrib, which draws bf16 noise for bf16 gradients):
clipping sums and Gaussian noise must be computed in at least float32. The references here are
the same transform run on the float32 values of the same gradients (same key), exact
arithmetic done by hand, and the noise distribution N(0, (σC/b)²).
"""

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from scipy import stats

import jaxrdp
from jaxrdp.training.microbatch import clipped_grad_sum


def _agg(clip, sigma, b, key=0):
  return jaxrdp.differentially_private_aggregate(clip, sigma, key, sampling_rate=0.01,
                                                 expected_batch_size=b)


def test_bfloat16_update_is_the_float32_computation_cast_once():
  """Under jit, with clipping active and NaN padding masked out: the bf16 update equals the
  float32 update of the same (exactly representable) gradients with the same key, cast once."""
  dtype = jnp.bfloat16
  rng = np.random.default_rng(0)
  grads = {"w": jnp.asarray(rng.normal(size=(12, 40, 3)), dtype),
           "b": jnp.asarray(rng.normal(size=(12, 3)), dtype)}
  grads = jax.tree.map(lambda g: g.at[10:].set(jnp.nan), grads)
  mask = jnp.arange(12) < 10
  tx = _agg(3.0, 1.3, 4.0, key=jax.random.key(9))
  params = jax.tree.map(lambda g: jnp.zeros(g.shape[1:], dtype), grads)
  params32 = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  grads32 = jax.tree.map(lambda g: g.astype(jnp.float32), grads)  # exact: a wider format
  out, _ = jax.jit(tx.update)(grads, tx.init(params), params, mask=mask)
  out32, _ = jax.jit(tx.update)(grads32, tx.init(params32), params32, mask=mask)
  for k in out:
    assert out[k].dtype == dtype
    assert np.all(np.isfinite(np.asarray(out[k], np.float32)))
    np.testing.assert_array_equal(np.asarray(out[k], np.float32),
                                  np.asarray(out32[k].astype(dtype), np.float32))


def test_microbatched_sum_of_bfloat16_model_is_noised_in_float32_and_cast_to_the_params_dtype():
  """clipped_grad_sum of a bf16 model returns a float32 sum; the transform noises it in float32
  and returns the parameters' dtype: equal to the float32 result cast once."""
  rng = np.random.default_rng(1)
  params = {"w": jnp.asarray(rng.normal(size=(4,)), jnp.bfloat16)}
  x = jnp.asarray(rng.normal(size=(9, 4)), jnp.bfloat16)
  loss = lambda p, xi: jnp.sum(jnp.tanh(p["w"] * xi))
  summed = clipped_grad_sum(loss, params, x, 0.5, microbatch_size=4)
  assert summed.grad_sum["w"].dtype == jnp.float32
  tx = _agg(0.5, 1.1, 4.0, key=jax.random.key(4))
  out, _ = tx.update(summed, tx.init(params), params)
  out32, _ = tx.update(summed, tx.init(params), None)  # no params: the sum's float32
  assert out["w"].dtype == jnp.bfloat16 and out32["w"].dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(out["w"], np.float32),
                                np.asarray(out32["w"].astype(jnp.bfloat16), np.float32))


def test_bfloat16_clipped_sum_is_accumulated_in_float32():
  """200 examples of 1 + 2⁻⁷ (exact in bf16), 100 NaN padding rows, C = 2, σ = 0, b = 1.

  Exact sum 200 · 1.0078125 = 201.5625; bf16 spacing in [128, 256) is 1, so the float32 sum
  cast once is 202. Summing in bf16 loses the 2⁻⁷ parts once the partial sum passes 128 (the
  test checks that this naive sum differs, so the test can fail)."""
  g = jnp.concatenate([jnp.full((200, 1), 1 + 2 ** -7, jnp.bfloat16),
                       jnp.full((100, 1), jnp.nan, jnp.bfloat16)])
  mask = jnp.arange(300) < 200
  tx = _agg(2.0, 0.0, 1.0)
  params = {"x": jnp.zeros((1,), jnp.bfloat16)}
  out, _ = jax.jit(tx.update)({"x": g}, tx.init(params), params, mask=mask)
  assert out["x"].dtype == jnp.bfloat16
  assert float(out["x"][0]) == 202.0
  naive = ml_dtypes.bfloat16(0)
  for _ in range(200):
    naive = ml_dtypes.bfloat16(naive + ml_dtypes.bfloat16(1 + 2 ** -7))
  assert float(naive) != 202.0


def test_bfloat16_noise_is_drawn_in_float32_with_std_sigma_c_over_b():
  """Zero bf16 gradients, n = 50,000 coordinates, C = 1, σ = 2, b = 4: the update is
  N(0, (σC/b)²) = N(0, 0.25) rounded to bf16; z = 2 · update is exact.

  * Σ z² within the two-sided χ²(n) region of total false-failure rate 1e-6 (bf16 rounding
    changes E z² by ≲ 1e-5 relative, far inside the region's ±3 %);
  * |Σ z| / √n < 5 (false-failure rate 5.7e-7);
  * float32 noise has tails: P[|z| > 3.5] = 4.65e-4, so no such value among 50,000 has
    probability e^-23 ≈ 8e-11. Noise drawn in bf16 (8-bit uniforms) never exceeds |z| ≈ 2.9,
    checked below on jax.random.normal in bf16, so this part detects bf16 noise."""
  n = 50_000
  tx = _agg(1.0, 2.0, 4.0, key=jax.random.key(21))
  params = {"x": jnp.zeros((n,), jnp.bfloat16)}
  out, _ = jax.jit(tx.update)({"x": jnp.zeros((3, n), jnp.bfloat16)}, tx.init(params), params)
  assert out["x"].dtype == jnp.bfloat16
  z = 2.0 * np.asarray(out["x"], np.float64)
  assert stats.chi2.ppf(5e-7, n) < np.sum(z ** 2) < stats.chi2.isf(5e-7, n)
  assert abs(np.sum(z)) / math.sqrt(n) < 5.0
  assert np.sum(np.abs(z) > 3.5) >= 1
  bf16_noise = np.asarray(jax.random.normal(jax.random.key(21), (n,), jnp.bfloat16), np.float64)
  assert np.max(np.abs(bf16_noise)) < 3.0
