"""Integer orders 2..64 of a concrete order grid: the exact binomial sum (MTZ 2019, Sec. 3.2).

compute_rdp sends them to ``_log_j_integer`` (a sum of non-negative terms) instead of the
quadrature. Checked against the same 60-digit mpmath references as the quadrature
(tests/data, tools/make_references.py; at integer orders the references are the exact binomial
sum in mpmath) at every reference point with an integer order in [2, 64], and against the
quadrature (an independent algorithm) on random points of the box q ∈ [1e-8, 0.99],
σ ∈ [0.2, 50].
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

import jaxrdp
from jaxrdp.mechanisms import sampled_gaussian
from jaxrdp.mechanisms.sampled_gaussian import integer_orders

F64_RTOL = 1e-12
F32_RTOL = 1e-5
GRAD_RTOL = 1e-8


def _integer_points(r):
  a = r["alpha"]
  keep = (a == np.round(a)) & (a >= 2) & (a <= 64) & (r["q"] > 0) & (r["q"] < 1)
  return {k: v[keep] for k, v in r.items()}


def _log_a_by_compute_rdp(q, sigma, alpha):
  """log A at each point through compute_rdp's order grid (the integer path): one call on
  the batch of points over the distinct orders, then each point's own order."""
  orders = np.unique(alpha)
  rdp = np.asarray(jaxrdp.compute_rdp(q, sigma, 1, orders.astype(np.asarray(q).dtype)))
  column = np.searchsorted(orders, alpha)
  return rdp[np.arange(len(alpha)), column].astype(np.float64) * (alpha - 1)


def test_the_split_of_a_grid():
  orders = np.array([1.0, 1.5, 2.0, 3.0, 64.0, 65.0, np.inf, 1.25, 70.5, 1024.0, 2048.0, 9.5])
  split = sampled_gaussian.order_split(orders)
  # Integer orders up to 4096 summed exactly, in buckets of the number of terms; fractional
  # orders in (1, 64] in ascending groups; 1, inf and 70.5 go to the per-order quadrature.
  assert split.sums == (((2, 3, 4), 64), ((5,), 256), ((9,), 1024), ((10,), 4096))
  # The orders' values are not part of the split (grids with the same structure share a
  # compiled program); their binomial tables are an argument.
  assert sampled_gaussian.order_split(orders + np.where(orders == 2.0, 1.0, 0.0)) == split
  # One table: each order's log-binomials cut into chunks of 65 terms (k = 0..64, 65..129,
  # ...), the last padded with -inf: 3 orders of one chunk, then 4, 16 and 64 chunks.
  (table,) = sampled_gaussian.order_tables(orders, split)
  assert table.shape == (3 + 4 + 16 + 64, 65)
  assert table[2, 32] == math.log(math.comb(64, 32)) and np.isneginf(table[0, 3])
  assert table[4, 0] == math.log(math.comb(65, 65)) and np.isneginf(table[4, 1])   # order 65
  last = 3 + 4 + 15   # order 1024's last chunk: k = 975..1039, of which 975..1024 are terms
  assert table[last, 48] == math.log(1024) and table[last, 49] == 0.0
  assert np.isneginf(table[last, 50])
  assert split.shared == ((7, 1), (11,))
  seen = []   # traced orders cannot be split
  jax.jit(lambda o: seen.append(sampled_gaussian.order_split(o)) or o)(jnp.ones(2))
  assert seen == [None]


def test_float64_matches_mpmath_at_integer_orders(log_a_reference):
  r = _integer_points(log_a_reference)
  assert len(r["q"]) > 50
  value = _log_a_by_compute_rdp(r["q"], r["sigma"], r["alpha"])
  err = np.abs(value - r["log_a"]) / np.abs(r["log_a"])
  assert err.max() <= F64_RTOL, err.max()
  assert np.all(value >= r["log_a"] * (1 - 128 * np.finfo(np.float64).eps))


def test_float32_matches_mpmath_at_integer_orders(log_a_reference_float32):
  r = _integer_points(log_a_reference_float32)
  normal = (r["log_a"] >= np.finfo(np.float32).tiny) & (r["log_a"] <= np.finfo(np.float32).max)
  r = {k: v[normal] for k, v in r.items()}
  assert len(r["q"]) > 50
  value = _log_a_by_compute_rdp(r["q"].astype(np.float32), r["sigma"].astype(np.float32), r["alpha"])
  err = np.abs(value - r["log_a"]) / r["log_a"]
  assert err.max() <= F32_RTOL, err.max()


def test_gradients_match_mpmath_at_integer_orders(log_a_reference):
  r = _integer_points(log_a_reference)

  def log_a(q, sigma, alpha):
    return jaxrdp.compute_rdp(q, sigma, 1, jnp.asarray([alpha]))[0] * (alpha - 1)

  for i in range(len(r["q"])):
    dq, ds = jax.grad(log_a, argnums=(0, 1))(r["q"][i], r["sigma"][i], float(r["alpha"][i]))
    assert abs(dq - r["dlog_a_dq"][i]) <= GRAD_RTOL * abs(r["dlog_a_dq"][i]), i
    assert abs(ds - r["dlog_a_dsigma"][i]) <= GRAD_RTOL * abs(r["dlog_a_dsigma"][i]), i


def test_sum_agrees_with_the_quadrature_on_random_points():
  rng = np.random.default_rng(7)
  q = np.exp(rng.uniform(np.log(1e-8), np.log(0.99), 400))
  sigma = np.exp(rng.uniform(np.log(0.2), np.log(50.0), 400))
  orders = np.arange(2.0, 65.0)
  summed = np.asarray(jaxrdp.compute_rdp(q, sigma, 1, orders))
  quadrature = np.asarray(jaxrdp.rdp_sampled_gaussian(q[:, None], sigma[:, None], orders[None, :]))
  assert np.all(np.isfinite(summed))
  both = np.isfinite(quadrature)
  assert both.mean() > 0.99
  np.testing.assert_allclose(summed[both], quadrature[both], rtol=F64_RTOL, atol=0)


def test_huge_sigma_gives_the_tiny_value_not_inf():
  # sigma^2 overflows (float64 above ~1.3e154, float32 above ~1.8e19): e^{k(k-1)/(2 sigma^2)} - 1
  # is then taken from log sigma. The true RDP, alpha q^2 / (2 sigma^2) to first order, is
  # below the smallest normal number here: the result must be ~0 (at most the kernel's floor,
  # a few times the smallest normal), not +inf.
  orders = np.arange(2.0, 9.0)
  for dtype, sigma in ((np.float64, 1e200), (np.float32, 1e25)):
    rdp = np.asarray(jaxrdp.compute_rdp(np.asarray(0.5, dtype), np.asarray(sigma, dtype), 1, orders.astype(dtype)))
    assert np.all(np.isfinite(rdp)) and np.all(rdp >= 0), (dtype, rdp)
    assert np.all(rdp <= 4 * np.finfo(dtype).tiny), (dtype, rdp)  # the softplus floor, e * tiny
  # Just below the overflow the first-order value is representable and matched.
  sigma = 1e150
  rdp = np.asarray(jaxrdp.compute_rdp(0.5, sigma, 1, orders))
  np.testing.assert_allclose(rdp, orders * 0.25 / (2 * sigma**2), rtol=1e-12)


def _mpmath_log_a_integer(q, sigma, alpha):
  """log A_alpha at an integer order by the exact binomial sum, 40 digits (MTZ 2019, Sec. 3.2)."""
  import mpmath
  with mpmath.workdps(40):
    q_, s_ = mpmath.mpf(float(q)), mpmath.mpf(float(sigma))
    a_minus_1 = mpmath.fsum(mpmath.binomial(alpha, k) * q_**k * (1 - q_)**(alpha - k)
                            * mpmath.expm1(k * (k - 1) / (2 * s_**2)) for k in range(2, alpha + 1))
    return float(mpmath.log1p(a_minus_1))


def test_quadrature_certificate_is_not_fooled_by_the_phase_of_the_grid():
  # At this point the 33-node rule happened to be ~exact on every second node, so
  # |T(h) - T(2h)| was tiny while T(h) was off by 3.9e-11 relative, and the certificate
  # accepted it. The quadrature (traced orders: log_a) now agrees with the exact sum; and on
  # random points of the same region to the accuracy goal.
  q, sigma = 0.00016329311176135195, 2.0724474613477297
  value = float(jaxrdp.log_a(q, sigma, 53.0))
  exact = _mpmath_log_a_integer(q, sigma, 53)
  assert abs(value - exact) <= 1e-13 * exact, (value, exact)
  rng = np.random.default_rng(11)
  qs = np.exp(rng.uniform(np.log(5e-5), np.log(6e-4), 40))
  sigmas = rng.uniform(1.8, 2.4, 40)
  alphas = rng.integers(48, 61, 40)
  values = np.asarray(jaxrdp.log_a(qs, sigmas, alphas.astype(float)))
  exact = np.array([_mpmath_log_a_integer(*p) for p in zip(qs, sigmas, alphas)])
  np.testing.assert_allclose(values, exact, rtol=F64_RTOL, atol=0)


def test_compute_rdp_under_jit_uses_the_exact_sum():
  # Under an outer jax.jit the orders, even a NumPy constant, are converted to a tracer; the
  # split must be taken from the orders as given (this point differs by 3.9e-11 otherwise).
  q, sigma, orders = 0.00016329311176135195, 2.0724474613477297, np.array([53.0])
  eager = np.asarray(jaxrdp.compute_rdp(q, sigma, 1, orders))
  jitted = np.asarray(jax.jit(lambda a, b: jaxrdp.compute_rdp(a, b, 1, orders))(q, sigma))
  exact = _mpmath_log_a_integer(q, sigma, 53) / 52
  np.testing.assert_allclose(eager, exact, rtol=1e-14)
  np.testing.assert_allclose(jitted, exact, rtol=1e-14)


def test_mixed_grid_keeps_the_order_of_its_entries():
  # Integer and fractional orders interleaved (and 1, inf): each entry equals the same order
  # computed alone.
  orders = np.array([3.0, 1.5, 1.0, 64.0, 2.0, np.inf, 70.0, 2.5])
  grid = np.asarray(jaxrdp.compute_rdp(0.02, 1.3, 10, orders))
  alone = np.array([float(jaxrdp.compute_rdp(0.02, 1.3, 10, np.array([a]))[0]) for a in orders])
  np.testing.assert_allclose(grid, alone, rtol=1e-14)
  assert np.isinf(grid[5]) and grid[2] > 0


# --- fractional orders of a concrete grid: the shared-node quadrature ---------------------

def _fractional_points(r):
  a = r["alpha"]
  keep = (a != np.round(a)) & (a > 1) & (a <= 64) & (r["q"] > 0) & (r["q"] < 1)
  return {k: v[keep] for k, v in r.items()}


def _shared_only(q, sigma, alpha):
  """log A at each point from the shared nodes alone (no per-order fallback), and whether the
  shared nodes certified it."""
  orders = np.unique(alpha)
  split = sampled_gaussian.order_split(orders)
  tables = sampled_gaussian.order_tables(orders, split)
  log_a, _, pending = jax.jit(lambda a, b: sampled_gaussian.log_a_and_rdp_at_orders(
      a, b, jnp.asarray(orders.astype(np.asarray(q).dtype)), split, tables, fallback=False))(q, sigma)
  column = np.searchsorted(orders, alpha)
  rows = np.arange(len(alpha))
  return np.asarray(log_a)[rows, column].astype(np.float64), ~np.asarray(pending)[rows, column]


def test_shared_nodes_match_mpmath_at_fractional_orders(log_a_reference):
  r = _fractional_points(log_a_reference)
  assert len(r["q"]) > 100
  value, certified = _shared_only(r["q"], r["sigma"], r["alpha"])
  assert certified.all(), certified.mean()   # the levels up to 4097 nodes certify all 172
  err = np.abs(value[certified] - r["log_a"][certified]) / np.abs(r["log_a"][certified])
  assert err.max() <= F64_RTOL, err.max()
  assert np.all(value[certified] >= r["log_a"][certified] * (1 - 128 * np.finfo(np.float64).eps))
  # Through compute_rdp (the per-order kernel fills what the shared nodes leave open).
  whole = _log_a_by_compute_rdp(r["q"], r["sigma"], r["alpha"])
  err = np.abs(whole - r["log_a"]) / np.abs(r["log_a"])
  assert err.max() <= F64_RTOL, err.max()


def test_shared_nodes_float32_match_mpmath(log_a_reference_float32):
  r = _fractional_points(log_a_reference_float32)
  normal = (r["log_a"] >= np.finfo(np.float32).tiny) & (r["log_a"] <= np.finfo(np.float32).max)
  r = {k: v[normal] for k, v in r.items()}
  assert len(r["q"]) > 100
  value, certified = _shared_only(r["q"].astype(np.float32), r["sigma"].astype(np.float32), r["alpha"])
  assert certified.mean() > 0.95, certified.mean()
  err = np.abs(value[certified] - r["log_a"][certified]) / r["log_a"][certified]
  assert err.max() <= F32_RTOL, err.max()


def test_open_entries_are_filled_the_same_eagerly_and_under_jit_vmap():
  # Tiny sigma: the shared nodes, even refined to 4097 nodes, leave entries open at
  # sigma = 0.01; 1 and 70.5 always are (inf is closed form). Eager calls fill them on the
  # host, traced calls inside the graph: same values.
  orders = np.array([1.0, 1.3, 2.0, 2.7, 5.5, 9.9, 33.3, 70.5, np.inf, 128.0])
  q = np.array([0.3, 0.01, 1e-4, 0.5])
  sigma = np.array([0.25, 0.35, 0.6, 0.01])
  eager = np.asarray(jaxrdp.compute_rdp(q, sigma, 1, orders))
  split = sampled_gaussian.order_split(orders)
  tables = sampled_gaussian.order_tables(orders, split)
  pending = np.asarray(jax.jit(lambda a, b: sampled_gaussian.log_a_and_rdp_at_orders(
      a, b, jnp.asarray(orders), split, tables, fallback=False)[2])(q, sigma))
  assert pending[:, [0, 7]].all() and pending.sum() > 8   # the fallback is exercised
  # Under jax.jit(jax.vmap): the fallback inside the graph (one compiled program; plain
  # jax.jit runs the same code without the batching rule).
  mapped = np.asarray(jax.jit(jax.vmap(lambda a, b: jaxrdp.compute_rdp(a, b, 1, orders)))(q, sigma))
  np.testing.assert_array_equal(np.isfinite(mapped), np.isfinite(eager))
  np.testing.assert_allclose(mapped, eager, rtol=1e-12)
  # Both equal the per-order kernel wherever it certifies a value; they certify more at
  # sigma = 0.01 (exact sums, refined shared nodes), never less.
  per_order = np.asarray(jaxrdp.rdp_sampled_gaussian(q[:, None], sigma[:, None], orders[None, :]))
  finite = np.isfinite(per_order)
  assert np.all(np.isfinite(eager[finite]))
  np.testing.assert_allclose(eager[finite], per_order[finite], rtol=1e-12)
  # The entries left open by the shared nodes are the per-order kernel's, +inf included.
  np.testing.assert_array_equal(np.isfinite(eager[pending]), finite[pending])


def test_gradients_through_the_shared_nodes_match_the_per_order_kernel():
  orders = np.array([1.5, 2.5, 7.25])
  f = lambda q, s: jnp.sum(jaxrdp.compute_rdp(q, s, 100, orders))
  g = lambda q, s: jnp.sum(100 * jaxrdp.rdp_sampled_gaussian(q, s, orders))
  for q, s in ((0.01, 1.1), (0.3, 2.0)):
    np.testing.assert_allclose(jax.grad(f, argnums=(0, 1))(q, s), jax.grad(g, argnums=(0, 1))(q, s),
                               rtol=1e-10)


def test_shared_node_tangents_match_mpmath_at_fractional_orders(log_a_reference):
  # Without the per-order fallback, derivatives come from the shared nodes themselves (the
  # same pass as the value): d log A / dq and d log A / d sigma against the mpmath reference
  # at every certified fractional point, under jit (one compiled program).
  r = _fractional_points(log_a_reference)
  orders = np.unique(r["alpha"])
  split = sampled_gaussian.order_split(orders)
  tables = sampled_gaussian.order_tables(orders, split)
  column = np.searchsorted(orders, r["alpha"])
  rows = np.arange(len(column))

  def log_a(q, sigma):
    out = sampled_gaussian.log_a_and_rdp_at_orders(q, sigma, jnp.asarray(orders), split, tables,
                                                   fallback=False)
    return out[0][rows, column], out[2][rows, column]

  def tangents(q, sigma):   # both directions in one batched pass (one copy of the kernel)
    one, zero = jnp.ones_like(q), jnp.zeros_like(q)
    (value, pending), (d, _) = jax.vmap(
        lambda dq_, ds_: jax.jvp(log_a, (q, sigma), (dq_, ds_)), out_axes=((None, None), 0))(
            jnp.stack([one, zero]), jnp.stack([zero, one]))
    return value, pending, d[0], d[1]

  value, pending, dq, ds = (np.asarray(v) for v in jax.jit(tangents)(r["q"], r["sigma"]))
  certified = ~pending
  assert certified.mean() > 0.8, certified.mean()
  for got, want in ((dq, r["dlog_a_dq"]), (ds, r["dlog_a_dsigma"])):
    err = np.abs(got[certified] - want[certified]) / np.abs(want[certified])
    assert err.max() <= GRAD_RTOL, err.max()
  assert np.all(dq[pending] == 0) and np.all(np.isinf(value[pending]))


def test_a_node_on_a_branch_edge_keeps_its_whole_derivative():
  # A node exactly at u = (2z - 1)/(2 sigma^2) = 1, where the integrand's log(1 + x) switches
  # formulas: d ell/dz must be the true q e^u/(1 - q + q e^u)/sigma^2 there. A clamp written
  # with minimum() gives half of it at the tie (the shared nodes' d log A/d sigma was 14 % low
  # at q = 0.999, sigma = 1 when the grid put a node on it).
  q, sigma = 0.999, 1.0
  z = jnp.asarray([1.5, 1.5 - 1e-3, 1.5 + 1e-3])   # u = 1 exactly, and either side
  ell = lambda z_: sampled_gaussian._grid_nodes(
      z_, jnp.float64(0.5 / sigma ** 2), jnp.log(q), jnp.log1p(-q), jnp.float64(q))["ell"]
  with jax.enable_x64(True):
    z = z.astype(jnp.float64)
    _, d_ell = jax.jvp(ell, (z,), (jnp.ones_like(z),))
    u = (2 * np.asarray(z) - 1) / (2 * sigma ** 2)
    want = q * np.exp(u) / (1 - q + q * np.exp(u)) / sigma ** 2
    np.testing.assert_allclose(np.asarray(d_ell), want, rtol=1e-12)


def test_a_large_batch_at_the_default_orders_matches_mpmath_and_small_batches(log_a_reference):
  # 64+ pairs at the default orders (302 chunks of terms gathered from 64 of per-pair terms):
  # the per-pair terms are then computed once before the gather (integer_orders._computed_once,
  # above _GATHERED_ONCE gathered terms), below it in the gather's kernel. The same values up
  # to rounding: the two forms' kernels contract different multiply-adds, and near q = 1 the
  # terms' exponents (k log(q / (1 - q)) + α log(1 - q), ~4,000 each at order 320) carry
  # ~1e-12 of it (1e-13 at orders up to 64).
  r = _integer_points(log_a_reference)
  orders = np.asarray(jaxrdp.DEFAULT_ORDERS)
  r = {k: v[np.isin(r["alpha"], orders)] for k, v in r.items()}
  reps = -(-64 // len(r["q"]))
  q, sigma, alpha, ref = (np.tile(r[k], reps) for k in ("q", "sigma", "alpha", "log_a"))
  assert len(q) * 302 * 65 >= integer_orders._GATHERED_ONCE > 8 * 302 * 65
  column = np.searchsorted(orders, alpha)
  whole = np.asarray(jaxrdp.compute_rdp(q, sigma, 1, orders))
  value = whole[np.arange(len(q)), column] * (alpha - 1)
  err = np.abs(value - ref) / np.abs(ref)
  assert err.max() <= F64_RTOL, err.max()
  small = np.concatenate([np.asarray(jaxrdp.compute_rdp(q[i:i + 8], sigma[i:i + 8], 1, orders))
                          for i in range(0, len(q), 8)])
  np.testing.assert_allclose(whole, small, rtol=2e-12, atol=0)
