"""log A_α against 60-digit mpmath references (tests/data/log_a_reference.json).

The references are produced by tools/make_references.py (two independent quadratures and,
at integer orders, the exact binomial sum; at least 20 correct digits). Parameter box:
q ∈ [0, 1] (tiny q down to 1e-10, q up to 1 − 1e-6), σ ∈ [0.1, 1e4], α ∈ (1, 4096],
integer and fractional orders.
"""

import jax
import jax.numpy as jnp
import numpy as np

import jaxrdp

F64_RTOL = 1e-12    # required: float64 relative error over the box
F32_RTOL = 1e-5     # required: float32 relative error where the value is a normal float32
GRAD_RTOL = 1e-8    # required: gradients w.r.t. q and sigma, float64


def _rel(x, ref):
  return np.abs(x - ref) / np.where(ref == 0, 1.0, np.abs(ref))


def test_float64_matches_mpmath_over_the_box(log_a_reference):
  r = log_a_reference
  value = np.asarray(jaxrdp.log_a(r["q"], r["sigma"], r["alpha"]))
  assert np.all(np.isfinite(value))
  err = _rel(value, r["log_a"])
  worst = int(np.argmax(err))
  assert err.max() <= F64_RTOL, (err.max(), r["q"][worst], r["sigma"][worst], r["alpha"][worst])


def test_float64_never_below_mpmath_by_more_than_rounding(log_a_reference):
  # Never under-report: where jaxrdp is below the truth it is so only at rounding level.
  r = log_a_reference
  value = np.asarray(jaxrdp.log_a(r["q"], r["sigma"], r["alpha"]))
  assert np.all(value >= r["log_a"] * (1 - 128 * np.finfo(np.float64).eps))  # 2.8e-14; conversions allow 256


def test_float32_matches_mpmath_over_the_box(log_a_reference_float32):
  # Inputs are exactly representable in float32; the references are computed at those values.
  r = log_a_reference_float32
  q32, s32, a32 = (r[k].astype(np.float32) for k in ("q", "sigma", "alpha"))
  assert np.all(q32.astype(np.float64) == r["q"])
  value = np.asarray(jaxrdp.log_a(q32, s32, a32))
  assert value.dtype == np.float32
  ref = r["log_a"]
  normal = (ref >= np.finfo(np.float32).tiny) & (ref <= np.finfo(np.float32).max)
  assert normal.sum() > 0.9 * len(ref)
  err = _rel(value.astype(np.float64)[normal], ref[normal])
  worst = int(np.argmax(err))
  assert err.max() <= F32_RTOL, (err.max(), q32[normal][worst], s32[normal][worst], a32[normal][worst])


def test_float32_never_below_mpmath_beyond_rounding(log_a_reference_float32):
  r = log_a_reference_float32
  value = np.asarray(jaxrdp.log_a(*(r[k].astype(np.float32) for k in ("q", "sigma", "alpha"))))
  normal = (r["log_a"] >= np.finfo(np.float32).tiny) & (r["log_a"] <= np.finfo(np.float32).max)
  assert np.all(value.astype(np.float64)[normal] >= r["log_a"][normal] * (1 - F32_RTOL))


def test_gradients_match_mpmath(log_a_reference):
  r = log_a_reference
  inside = (r["q"] > 0) & (r["q"] < 1)
  grad = jax.jit(jax.vmap(jax.grad(jaxrdp.log_a, argnums=(0, 1))))
  dq, ds = (np.asarray(g) for g in grad(jnp.asarray(r["q"]), jnp.asarray(r["sigma"]),
                                           jnp.asarray(r["alpha"])))
  assert np.all(np.isfinite(dq)) and np.all(np.isfinite(ds))
  assert _rel(dq, r["dlog_a_dq"])[inside].max() <= GRAD_RTOL
  assert _rel(ds, r["dlog_a_dsigma"])[inside].max() <= GRAD_RTOL


def test_envelope_tangents_match_mpmath_on_both_grids(log_a_reference):
  # rdp_tangent_at_order (the envelope gradient's derivative at the optimal order): up to
  # _FINE_PAIRS pairs on one 2049-node grid (every point, in batches of _FINE_PAIRS), more on
  # the nested grids with the derivative in the same pass (every point at once, tiled past
  # _FINE_PAIRS). Both against the mpmath derivatives, where the value is certified (every
  # point with α ≤ 64 here).
  from jaxrdp.mechanisms.sampled_gaussian import rdp_tangent_at_order, shared_values
  r = log_a_reference
  inside = (r["q"] > 0) & (r["q"] < 1) & (r["alpha"] <= 64)
  points = [r[k][inside] for k in ("q", "sigma", "alpha", "dlog_a_dq", "dlog_a_dsigma")]
  fine = shared_values._FINE_PAIRS
  batches = -(-points[0].size // fine)
  on_fine = [np.resize(v, (batches, fine)) for v in points]   # (the last batch wraps around)
  nested = [np.tile(v, -(-(fine + 1) // v.size))[None] for v in points]
  for grid, (q, s, a, *refs) in (("fine", on_fine), ("nested", nested)):
    one = jnp.ones(q.shape[1])
    assert (q.shape[1] > fine) == (grid == "nested")
    for name, dq, ds, ref in (("dlog_a_dq", one, None, refs[0]),
                              ("dlog_a_dsigma", None, one, refs[1])):
      # Each pair at its own order (the order broadcasts against the pairs).
      tangent = jax.jit(rdp_tangent_at_order)
      for i in range(q.shape[0]):
        rdp, d_rdp, certified = tangent(q[i], s[i], a[i], dq, ds)
        assert np.all(np.asarray(certified))
        assert _rel(np.asarray(d_rdp), ref[i] / (a[i] - 1)).max() <= GRAD_RTOL, (name, grid)
