"""Behaviour of log_a / rdp_sampled_gaussian / compute_rdp beyond the reference points."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa
from hypothesis import given, settings, strategies as st

import jaxrdp

DP_ORDERS = np.array([1 + x / 10 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024])


# --- special cases (closed forms) -------------------------------------------------------------

def test_q_zero_is_zero():
  assert float(jaxrdp.log_a(0.0, 1.3, 7.5)) == 0.0
  assert np.all(np.asarray(jaxrdp.compute_rdp(0.0, 0.0, 10, [1.0, 2.5, np.inf])) == 0.0)


def test_q_one_is_the_gaussian_mechanism():
  # q = 1: log A = alpha (alpha - 1) / (2 sigma^2), RDP = alpha / (2 sigma^2) (Mironov 2017, Prop. 7).
  alpha = np.array([1.0, 1.5, 2.0, 37.25, 4096.0])
  np.testing.assert_allclose(jaxrdp.log_a(1.0, 0.7, alpha), alpha * (alpha - 1) / (2 * 0.49), rtol=1e-15)
  np.testing.assert_allclose(jaxrdp.compute_rdp(1.0, 0.7, 3, alpha), 3 * alpha / (2 * 0.49), rtol=1e-15)


def test_sigma_zero_and_alpha_inf_are_infinite():
  assert np.isposinf(float(jaxrdp.log_a(0.1, 0.0, 2.0)))
  assert np.isposinf(float(jaxrdp.log_a(0.1, 1.0, np.inf)))
  assert np.isposinf(float(jaxrdp.compute_rdp(0.1, 1.0, 1, np.inf)))


def test_order_one_is_the_kl_limit():
  # RDP at alpha = 1 is the KL divergence: the limit of RDP(alpha) as alpha -> 1 (no 0/0).
  for q, sigma in [(0.01, 1.0), (0.3, 0.8), (0.9, 3.0)]:
    kl = float(jaxrdp.compute_rdp(q, sigma, 1, 1.0))
    near = float(jaxrdp.compute_rdp(q, sigma, 1, 1.0 + 1e-7))
    assert np.isfinite(kl) and kl > 0
    assert abs(near - kl) / kl < 1e-5
  np.testing.assert_allclose(jaxrdp.compute_rdp(1.0, 2.0, 1, 1.0), 1 / 8, rtol=1e-15)


def test_zero_steps_spend_nothing_even_at_infinite_orders():
  np.testing.assert_array_equal(jaxrdp.compute_rdp(0.1, 1.0, 0, [2.0, np.inf]), [0.0, 0.0])


def _log_a_mpmath(q, sigma, alpha, dps=40):
  """log A_alpha by mpmath quadrature of its definition, E_{N(0, sigma^2)}[(1 - q + q L)^alpha]."""
  import mpmath as mp
  with mp.workdps(dps):
    q, sigma, alpha = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)
    f = lambda z: mp.npdf(z, 0, sigma) * (1 - q + q * mp.e ** ((2 * z - 1) / (2 * sigma ** 2))) ** alpha
    # Breakpoints at the bumps (near 0, 2 and the right mode, at most alpha) and their tails.
    cuts = sorted({-10 * sigma, mp.mpf(0), mp.mpf(1), mp.mpf(2), alpha, alpha + 10 * sigma})
    return float(mp.log(mp.quad(f, [-mp.inf] + cuts + [mp.inf])))


def _nearly_degenerate_modes(n, seed=3):
  """(q, sigma, alpha) where the smallest or largest root of h(z) = z - alpha p(z) is (nearly)
  an inflection: q solves h(z_turn) = 0 at a turn of h, then is moved by 1e-5 or 1e-3."""
  from scipy.optimize import brentq
  from scipy.special import expit
  rng = np.random.default_rng(seed)
  points = []
  while len(points) < n:
    sigma, alpha = rng.uniform(0.3, 5), rng.uniform(1.05, 64)
    s2 = sigma * sigma
    c = s2 / alpha
    if c >= 0.25:
      continue
    root = np.sqrt(1 - 4 * c)
    w = np.log((1 + root) / 2) - np.log(2 * c / (1 + root))
    for side in (-1, 1):
      def h_at_turn(q_logit):
        z = 0.5 - s2 * q_logit + side * s2 * w
        return z - alpha * expit(side * w)
      if h_at_turn(-40) * h_at_turn(40) > 0:
        continue
      q = expit(brentq(h_at_turn, -40, 40))
      if 1e-8 < q < 0.99:
        points += [(q * f, sigma, alpha) for f in (1 - 1e-3, 1 - 1e-5, 1, 1 + 1e-5, 1 + 1e-3)]
  return np.asarray(points[:n])


def test_nearly_degenerate_mode_is_certified():
  # Where a root of z = alpha p(z) is about to merge with the antimode, the log integrand is
  # flat there (an inflection) and its quadratic width was the floor's 8 sigma: the window was
  # too wide for 257 nodes and log A came back +inf (1 of 1.7e7 random GPU triples; ~1 % of
  # points near the merge). The cubic width keeps it certified, and exact.
  q, sigma, alpha = 0.2595268487930298, 0.5191839337348938, 2.1
  value = float(jaxrdp.log_a(q, sigma, alpha))
  reference = _log_a_mpmath(q, sigma, alpha)
  assert abs(value - reference) <= 1e-12 * reference, (value, reference)
  points = _nearly_degenerate_modes(3000)
  values = np.asarray(jaxrdp.log_a(points[:, 0], points[:, 1], points[:, 2]))
  assert np.all(np.isfinite(values)), points[~np.isfinite(values)][:5]
  for i in np.random.default_rng(0).choice(len(points), 4, replace=False):
    reference = _log_a_mpmath(*points[i])
    assert abs(values[i] - reference) <= 1e-12 * reference, (points[i], values[i], reference)


# --- agreement with dp_accounting -------------------------------------------------------------

def _grid():
  rng = np.random.default_rng(7)
  q = 10 ** rng.uniform(-4, np.log10(0.5), 40)
  sigma = rng.uniform(0.5, 5, 40)
  return q, sigma


def test_integer_orders_agree_with_dp_accounting():
  # dp_accounting's integer-order sum is exact up to its own float64 rounding, which is
  # absolute on log A = (alpha - 1) RDP (it sums A, not A - 1; up to ~1e-13 over long sums):
  # compare log A to 1e-12 relative or 1e-12 absolute, whichever is looser. (Exactness itself
  # is tested against mpmath in test_log_a_reference.py.)
  q, sigma = _grid()
  orders = np.array([2.0, 3, 5, 8, 16, 32, 63, 128, 256])
  ours = np.asarray(jaxrdp.compute_rdp(q, sigma, 1, orders)) * (orders - 1)
  for i in range(len(q)):
    theirs = dpa._compute_rdp_poisson_subsampled_gaussian(q[i], sigma[i], orders) * (orders - 1)
    tol = 1e-12 * np.maximum(theirs, 1.0)
    np.testing.assert_array_less(np.abs(ours[i] - theirs), tol)


def test_fractional_orders_never_exceed_dp_accounting():
  # dp_accounting sums absolute values of the signed series: an over-estimate. Exact values
  # are at most that (up to dp_accounting's own rounding of log A, ~1e-15 absolute).
  q, sigma = _grid()
  frac = DP_ORDERS[DP_ORDERS < 11]
  ours = np.asarray(jaxrdp.compute_rdp(q, sigma, 1, frac))
  strictly_below = 0
  for i in range(len(q)):
    theirs = dpa._compute_rdp_poisson_subsampled_gaussian(q[i], sigma[i], frac)
    assert np.all(ours[i] * (frac - 1) <= theirs * (frac - 1) + 1e-13)
    strictly_below += np.sum(ours[i] < theirs * (1 - 1e-9))
  assert strictly_below > 0  # the over-estimate is visible, and jaxrdp does not share it


def test_matches_dp_accounting_test_values():
  # dp_accounting's test_compute_rdp_poisson_sampled_gaussian (q=0.01, sigma=2.5, 50 steps):
  # values at integer orders are exact; at 1.5 and 2.5 dp_accounting over-estimates.
  orders = np.array([1.5, 2.5, 5, 50, 100, np.inf])
  expected = np.array([6.70579741e-04, 1.08548710e-03, 2.18075656e-03, 2.38460375e-02, 1.67416308e02, np.inf])
  ours = np.asarray(jaxrdp.compute_rdp(0.01, 2.5, 50, orders))
  np.testing.assert_allclose(ours[2:], expected[2:], rtol=1e-8)
  assert np.all(ours[:2] <= expected[:2] * (1 + 1e-8))


# --- transformations --------------------------------------------------------------------------

def test_jit_vmap_and_eager_agree():
  q, sigma = _grid()
  orders = jnp.asarray([1.5, 2.0, 7.3, 64.0])
  eager = jaxrdp.compute_rdp(q, sigma, 1, orders)
  jitted = jax.jit(jaxrdp.compute_rdp)(q, sigma, 1, orders)
  mapped = jax.vmap(lambda a, b: jaxrdp.compute_rdp(a, b, 1, orders))(q, sigma)
  np.testing.assert_allclose(jitted, eager, rtol=1e-14)
  np.testing.assert_allclose(mapped, eager, rtol=1e-14)


def test_jit_refines_shared_orders_at_small_sigma():
  # dp_accounting's grid has only exact and shared orders, so under jit no per-order kernel
  # follows the shared nodes: they refine (up to 4097 nodes) where 129 cannot certify, as at
  # sigma < 0.12 (these pairs need 1025 nodes and more). The values must be finite and equal
  # the eager call's, whose leftovers go to the per-order kernel on the host.
  q = jnp.asarray([3.4e-4, 0.033, 3.6e-5])
  sigma = jnp.asarray([0.064, 0.0897, 0.12])
  jitted = jax.jit(jaxrdp.compute_rdp)(q, sigma, 1, DP_ORDERS)
  eager = jaxrdp.compute_rdp(q, sigma, 1, DP_ORDERS)
  assert np.all(np.isfinite(jitted))
  np.testing.assert_allclose(jitted, eager, rtol=1e-12)


def test_nested_vmap_and_vmap_of_grad_reach_the_flat_kernel():
  # The batching rule flattens any vmap batch (nested, partly unbatched) into the flat kernel:
  # the values must equal the whole-array call, and per-element gradients the array gradient.
  q = jnp.asarray([0.01, 0.2, 1e-3])
  sigma = jnp.asarray([1.1, 2.0, 0.8])
  alpha = jnp.asarray([1.5, 4.0, 12.5, 64.0])
  # Both under jax.jit: the same compiler options, so the same flat kernel gives the same bits
  # (eager calls compile with faster-compiling options: equal to ~1 ulp).
  whole = jax.jit(jaxrdp.log_a)(q[:, None], sigma[:, None], alpha[None, :])
  nested = jax.jit(jax.vmap(jax.vmap(jaxrdp.log_a, in_axes=(None, None, 0)), in_axes=(0, 0, None)))(
      q, sigma, alpha)
  np.testing.assert_array_equal(nested, whole)
  np.testing.assert_allclose(jaxrdp.log_a(q[:, None], sigma[:, None], alpha[None, :]), whole,
                             rtol=1e-14)
  grads = jax.vmap(jax.grad(lambda s: jaxrdp.log_a(0.01, s, 4.7)))(sigma)
  array_grad = jax.grad(lambda s: jnp.sum(jaxrdp.log_a(0.01, s, 4.7)))(sigma)
  np.testing.assert_allclose(grads, array_grad, rtol=1e-14)


def test_jit_of_vmap_traces_each_kernel_once(monkeypatch):
  # Under jax.jit(jax.vmap(f)) the kernels with a batching rule are traced by the rule only,
  # for the flattened batch (not first for one unbatched element as well); their placeholder
  # primal (NaN) must never reach a result, also where only some arguments are batched. (A plain
  # vmap: test_jit_vmap_and_eager_agree.)
  # (Patched in the modules whose kernels look them up: curve and quadrature.)
  from jaxrdp.mechanisms.sampled_gaussian import curve, quadrature
  traced = {"shared": [], "per_order": []}
  shared, per_order = curve._quadrature_values, quadrature._log_j_flat
  monkeypatch.setattr(curve, "_quadrature_values",
                      lambda q, *a: traced["shared"].append(q.shape) or shared(q, *a))
  monkeypatch.setattr(quadrature, "_log_j_flat",
                      lambda q, *a: traced["per_order"].append(q.shape) or per_order(q, *a))
  q = jnp.asarray([0.01, 0.2, 1e-3, 0.05, 0.3])
  sigma = jnp.asarray([1.1, 2.0, 0.8, 3.0, 1.7])
  orders = jnp.asarray([1.5, 2.0, 7.3, 64.0])
  whole = jax.jit(lambda a, b: jaxrdp.compute_rdp(a, b, 1, orders))(q, sigma)
  assert traced["shared"] == [(5,)]
  traced["shared"].clear()
  # Newer JAX (0.11) reuses the kernel's trace for the same shapes across calls, which would
  # hide a second trace: start from empty caches, so that every trace of this call is counted.
  jax.clear_caches()
  mapped = jax.jit(jax.vmap(lambda a, b: jaxrdp.compute_rdp(a, b, 1, orders)))(q, sigma)
  assert traced["shared"] == [(5,)]
  np.testing.assert_array_equal(mapped, whole)
  half = jax.jit(jax.vmap(lambda a: jaxrdp.compute_rdp(a, 1.1, 1, orders)))(q)
  steps = jax.jit(jax.vmap(lambda t: jaxrdp.compute_rdp(0.01, 1.1, t, orders)))(jnp.arange(3.0))
  for got, want in ((half, jaxrdp.compute_rdp(q, 1.1, 1, orders)),
                    (steps, jaxrdp.compute_rdp(0.01, 1.1, jnp.arange(3.0), orders))):
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-14)
  # Derivatives of the batched form (the whole-grid rule's jvp): those of the whole-array call.
  total = lambda a, b: jnp.sum(jaxrdp.compute_rdp(a, b, 1, orders))
  want = jax.grad(total, argnums=(0, 1))(q, sigma)
  got = jax.jit(jax.vmap(jax.grad(total, argnums=(0, 1))))(q, sigma)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-12)
  alpha = jnp.asarray([70.5, 100.25])   # above the shared orders: the per-order kernel
  traced["per_order"].clear()
  jax.clear_caches()
  by_element = jax.jit(jax.vmap(jaxrdp.log_a, in_axes=(0, 0, None)))(q, sigma, alpha[0])
  assert traced["per_order"] == [(5,)]
  np.testing.assert_allclose(by_element, jaxrdp.log_a(q, sigma, alpha[0]), rtol=1e-14)


def test_a_kernel_in_a_loop_that_vmap_batches_is_traced_by_its_rule_only(monkeypatch):
  # lax.while_loop traces its body at the unbatched shapes before jax.vmap batches it: the
  # shared-node kernel in the ε search's loop (whose state vmap batches from the start) is
  # traced once, by its batching rule, for the whole batch (not first for one element), and
  # the values are those of each element's own jitted search.
  from jaxrdp.mechanisms.sampled_gaussian import curve
  traced = []
  shared = curve._quadrature_values
  monkeypatch.setattr(curve, "_quadrature_values",
                      lambda q, *a: traced.append(q.shape) or shared(q, *a))
  sigma = jnp.asarray([0.7, 1.1, 2.5])
  epsilon = lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 1000, 1e-5)
  jax.clear_caches()
  mapped = jax.jit(jax.vmap(epsilon))(sigma)
  assert traced == [(3,)]
  one = jax.jit(epsilon)
  np.testing.assert_array_equal(mapped, [one(s) for s in sigma])


def test_gradient_matches_finite_differences_in_alpha():
  # d log A / d alpha (fractional and integer orders alike), central differences, float64.
  for q, sigma, alpha in [(0.01, 1.1, 4.7), (0.2, 2.0, 3.0), (1e-3, 0.8, 12.5)]:
    g = float(jax.grad(jaxrdp.log_a, argnums=2)(q, sigma, alpha))
    h = 1e-5
    fd = (float(jaxrdp.log_a(q, sigma, alpha + h)) - float(jaxrdp.log_a(q, sigma, alpha - h))) / (2 * h)
    assert abs(g - fd) <= 1e-6 * abs(fd)


@pytest.mark.parametrize("q,sigma,alpha", [
    (1e-12, 1.0, 2.0), (1e-300, 2.0, 5.5), (1.0, 1.0, 3.5), (1 - 1e-12, 0.5, 2.5),
    (0.5, 1e4, 1.5), (0.1, 0.1, 4096.0), (0.01, 1.0, 1.0), (0.0, 1.0, 2.0)])
def test_gradients_are_finite_at_the_edges(q, sigma, alpha):
  grads = jax.grad(lambda *a: jaxrdp.compute_rdp(*a[:2], 1, a[2]), argnums=(0, 1, 2))(
      jnp.float64(q), jnp.float64(sigma), jnp.float64(alpha))
  assert all(np.isfinite(float(g)) for g in grads), grads


def test_float32_in_float32_out():
  out = jaxrdp.compute_rdp(jnp.float32(0.01), jnp.float32(1.1), 100, jnp.asarray([2.5, 8.0], jnp.float32))
  assert out.dtype == jnp.float32


def test_import_leaves_x64_alone():
  code = "import jax, jaxrdp; print(jax.config.jax_enable_x64)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"


# --- properties (hypothesis) --------------------------------------------------------------------

qs = st.floats(1e-6, 1.0)
sigmas = st.floats(0.3, 50.0)
alphas = st.floats(1.01, 300.0)


@settings(max_examples=40, deadline=None)
@given(qs, sigmas, alphas)
def test_log_a_is_non_negative(q, sigma, alpha):
  assert float(jaxrdp.log_a(q, sigma, alpha)) >= 0.0


@settings(max_examples=30, deadline=None)
@given(qs, sigmas, alphas, st.floats(1.0001, 1.5))
def test_rdp_non_decreasing_in_alpha(q, sigma, alpha, factor):
  r = np.asarray(jaxrdp.compute_rdp(q, sigma, 1, [alpha, alpha * factor]))
  assert r[1] >= r[0] * (1 - 1e-12)


@settings(max_examples=30, deadline=None)
@given(qs, sigmas, alphas, st.floats(1.0001, 2.0))
def test_monotone_in_q_and_sigma(q, sigma, alpha, factor):
  base = float(jaxrdp.log_a(q / factor, sigma, alpha))
  assert float(jaxrdp.log_a(q, sigma, alpha)) >= base * (1 - 1e-12)          # non-decreasing in q
  assert float(jaxrdp.log_a(q, sigma * factor, alpha)) <= float(jaxrdp.log_a(q, sigma, alpha)) * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(qs, sigmas, st.floats(1.05, 100.0), st.floats(0.02, 3.0))
def test_log_a_convex_in_alpha(q, sigma, alpha, step):
  # (alpha - 1) RDP(alpha) = log A_alpha is convex in alpha (a cumulant generating function).
  lo, mid, hi = np.asarray(jaxrdp.log_a(q, sigma, [alpha, alpha + step, alpha + 2 * step]))
  assert mid <= 0.5 * (lo + hi) + 1e-12 * hi


@pytest.mark.parametrize("path", ["top_k", "sort"])
def test_first_pending_takes_the_first_pending_entries_in_order(monkeypatch, path):
  # The refinement loops' compaction: the positions of the first `count` true entries,
  # ascending, then n; the float32 top-k keys and (from _TOP_K_ENTRIES entries on) the sort.
  from jaxrdp.mechanisms.sampled_gaussian import common
  if path == "sort":
    monkeypatch.setattr(common, "_TOP_K_ENTRIES", 1)
  rng = np.random.default_rng(7)
  cases = [rng.random(1000) < p for p in (0.0, 0.003, 0.3, 1.0)] + [np.arange(600) % 7 == 3]
  # A function of its own per path: jax.jit's cache would otherwise keep the first path's trace.
  first = jax.jit(lambda p, c: common._first_pending(p, c), static_argnums=1)
  for pending in cases:
    n = pending.size
    for count in (1, 5, 64, 256):
      expected = np.full(count, n)
      found = np.flatnonzero(pending)[:count]
      expected[:found.size] = found
      np.testing.assert_array_equal(np.asarray(first(jnp.asarray(pending), count)), expected)
