"""RDP -> (epsilon, delta) conversions (Balle et al. 2020 Thm 21 / CKS 2020 Prop 12; Mironov 2017 Prop 3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa
from hypothesis import given, settings, strategies as st

import jaxrdp

DP_ORDERS = np.array([1 + x / 10 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024])


def test_pure_dp_hand_computed_value():
  # dp_accounting's test_compute_epsilon_delta_pure_dp: constant RDP 1.1 at orders 2..32.
  orders = np.arange(2, 33, dtype=float)
  rdp = np.full_like(orders, 1.1)
  eps, order = jaxrdp.compute_epsilon(orders, rdp, 1e-5)
  assert float(eps) == pytest.approx(1.32783806176, abs=1e-10)
  assert float(order) == 32
  delta, order = jaxrdp.compute_delta(orders, rdp, 1.32783806176)
  assert float(delta) == pytest.approx(1e-5, rel=1e-8)
  assert float(order) == 32


def test_gaussian_calibrated_to_eps_one():
  # dp_accounting's test_compute_epsilon_delta_gaussian: sigma = 4.530877117 gives exactly
  # (1, 1e-6)-DP with 99,000 orders starting at alpha = 1.0.
  orders = np.array([0.001 * i for i in range(1000, 100000)])
  rdp = jaxrdp.compute_rdp(1.0, 4.530877117, 1, orders)
  assert float(jaxrdp.compute_epsilon(orders, rdp, 1e-6)[0]) == pytest.approx(1.0, abs=1e-7)
  assert float(jaxrdp.compute_delta(orders, rdp, 1.0)[0]) == pytest.approx(1e-6, rel=1e-6)


@pytest.mark.parametrize("q,sigma,steps,delta,dp_value", [
    (0.01, 1.1, 10_000, 1e-5, 5.6320), (0.001, 0.8, 100_000, 1e-6, 3.1878),
    (0.1, 2.0, 1_000, 1e-5, 8.9470), (1.0, 5.0, 100, 1e-5, 10.7255)])
def test_dp_sgm_epsilon_at_most_dp_accounting(q, sigma, steps, delta, dp_value):
  # ../shared/notes/anchors.md: dp_accounting's RDP epsilon. jaxrdp's DEFAULT_ORDERS contain
  # dp_accounting's and its fractional-order RDP is exact (not over-estimated): never looser.
  orders = jaxrdp.DEFAULT_ORDERS
  eps, _ = jaxrdp.compute_epsilon(orders, jaxrdp.compute_rdp(q, sigma, steps, orders), delta)
  theirs, _ = dpa.compute_epsilon(DP_ORDERS, dpa._compute_rdp_poisson_subsampled_gaussian(q, sigma, DP_ORDERS) * steps, delta)
  assert float(eps) <= theirs * (1 + 1e-12)
  assert float(eps) == pytest.approx(dp_value, abs=5e-3)


def test_agrees_with_dp_accounting_on_the_same_curve():
  rng = np.random.default_rng(3)
  for _ in range(20):
    rdp = rng.uniform(0, 3, size=len(DP_ORDERS)) * rng.uniform(0.01, 2)
    for delta in (1e-3, 1e-6, 1e-10):
      theirs, theirs_order = dpa.compute_epsilon(DP_ORDERS, rdp, delta)
      ours, order = jaxrdp.compute_epsilon(DP_ORDERS, rdp, delta)
      # dp_accounting skips orders <= 1.01 (none here) and uses the same formula.
      assert float(ours) == pytest.approx(theirs, rel=1e-12, abs=1e-14)
      d_theirs, _ = dpa.compute_delta(DP_ORDERS, rdp, 1.0)
      assert float(jaxrdp.compute_delta(DP_ORDERS, rdp, 1.0)[0]) == pytest.approx(d_theirs, rel=1e-10)


def test_infinite_order_does_not_zero_epsilon():
  # dp_accounting reports eps = 0 when alpha = inf is in the list (NaN picked by argmin).
  orders = np.array([2.0, 8.0, np.inf])
  rdp = np.asarray(jaxrdp.compute_rdp(0.1, 1.0, 100, orders))
  assert np.isposinf(rdp[-1])
  eps, order = jaxrdp.compute_epsilon(orders, rdp, 1e-5)
  eps_finite, _ = jaxrdp.compute_epsilon(orders[:2], rdp[:2], 1e-5)
  assert float(eps) == float(eps_finite) > 0
  assert np.isfinite(float(order))


def test_infinite_order_with_finite_rdp_is_pure_dp():
  # A pure eps0-DP mechanism has RDP eps0 at alpha = inf: the limit of the conversion is eps0.
  eps, order = jaxrdp.compute_epsilon(np.array([2.0, np.inf]), np.array([5.0, 0.5]), 1e-5)
  assert float(eps) == pytest.approx(0.5, rel=1e-12) and float(eps) >= 0.5 and np.isposinf(float(order))
  delta, _ = jaxrdp.compute_delta(np.array([2.0, np.inf]), np.array([5.0, 0.5]), 0.5001)
  assert float(delta) == 0.0


def test_nan_orders_are_skipped():
  orders = np.array([2.0, np.nan, 8.0])
  rdp = np.array([0.1, np.nan, 0.5])
  eps, order = jaxrdp.compute_epsilon(orders, rdp, 1e-5)
  ref, _ = jaxrdp.compute_epsilon(orders[[0, 2]], rdp[[0, 2]], 1e-5)
  assert float(eps) == float(ref) and not np.isnan(float(order))


def test_order_one_uses_only_the_kl_bound():
  # At alpha = 1 only delta >= sqrt(1 - e^{-KL}) helps; otherwise eps = inf there.
  assert np.isposinf(float(jaxrdp.compute_epsilon(np.array([1.0]), np.array([0.5]), 1e-5)[0]))
  assert float(jaxrdp.compute_epsilon(np.array([1.0]), np.array([1e-4]), 0.5)[0]) == 0.0


def test_classic_conversion_is_mironov_prop3_and_looser():
  orders = jnp.asarray(DP_ORDERS)
  rdp = jaxrdp.compute_rdp(0.01, 1.1, 10_000, orders)
  eps_c, order_c = jaxrdp.compute_epsilon(orders, rdp, 1e-5, method="classic")
  i = int(np.argmin(np.asarray(rdp) + np.log(1e5) / (DP_ORDERS - 1)))
  # Equal up to the conversion's upward rounding: RDP raised by 4096 ulps, output by 8 ulps.
  exact = float(rdp[i]) + np.log(1e5) / (DP_ORDERS[i] - 1)
  assert exact <= float(eps_c) <= exact * (1 + 1e-12)
  assert float(eps_c) > float(jaxrdp.compute_epsilon(orders, rdp, 1e-5)[0])
  d_c, _ = jaxrdp.compute_delta(orders, rdp, float(eps_c), method="classic")
  assert float(d_c) == pytest.approx(1e-5, rel=1e-9)


def test_batched_curves_and_deltas():
  orders = jnp.asarray(DP_ORDERS)
  rdp = jaxrdp.compute_rdp(jnp.asarray([0.01, 0.02]), 1.1, 1000, orders)
  eps, order = jaxrdp.compute_epsilon(orders, rdp, jnp.asarray([[1e-5], [1e-6]]))
  assert eps.shape == (2, 2) and order.shape == (2, 2)
  for i, d in enumerate((1e-5, 1e-6)):
    for j in range(2):
      assert float(eps[i, j]) == float(jaxrdp.compute_epsilon(orders, rdp[j], d)[0])


def test_jittable_and_differentiable_in_rdp():
  orders = jnp.asarray(DP_ORDERS)
  rdp = jaxrdp.compute_rdp(0.01, 1.1, 10_000, orders)
  eps, order = jax.jit(jaxrdp.compute_epsilon)(orders, rdp, 1e-5)
  assert float(eps) == float(jaxrdp.compute_epsilon(orders, rdp, 1e-5)[0])
  grad = jax.grad(lambda r: jaxrdp.compute_epsilon(orders, r, 1e-5)[0])(rdp)
  # Envelope: d eps / d rdp is 1 at the optimal order and 0 elsewhere.
  assert float(grad.sum()) == pytest.approx(1.0, rel=1e-12) and int(np.sum(np.asarray(grad) != 0)) == 1
  assert np.all(np.isfinite(np.asarray(jax.grad(lambda r: jaxrdp.compute_delta(orders, r, 2.0)[0])(rdp))))


@settings(max_examples=40, deadline=None)
@given(st.floats(1e-4, 0.9), st.floats(0.5, 8.0), st.integers(1, 10**5), st.floats(-12, -2))
def test_epsilon_delta_round_trip(q, sigma, steps, log10_delta):
  orders = jnp.asarray(DP_ORDERS)
  rdp = jaxrdp.compute_rdp(q, sigma, steps, orders)
  delta = 10.0 ** log10_delta
  eps, _ = jaxrdp.compute_epsilon(orders, rdp, delta)
  if not np.isfinite(float(eps)):
    return
  delta2, _ = jaxrdp.compute_delta(orders, rdp, eps)
  if float(eps) == 0.0:
    assert float(delta2) <= delta * (1 + 1e-9)
  else:
    assert float(delta2) == pytest.approx(delta, rel=1e-6)


def test_float32_margin_covers_the_worst_float32_rdp_seen():
  # q = 2.0e-7, sigma = 5.76, alpha = 1024 (float32-exact inputs): float32 RDP is 5.6e-4
  # (exact sum) and 7.3e-4 (per-order quadrature) below float64, more than the 5e-4 margin
  # used before; the margin now covers it.
  from jaxrdp.accounting import conversion
  q, sigma, order = np.float32(2.036286e-07), np.float32(5.763365), np.float32(1024.0)
  r64 = float(jaxrdp.rdp_sampled_gaussian(np.float64(q), np.float64(sigma), np.float64(order)))
  for r32 in (jaxrdp.rdp_sampled_gaussian(q, sigma, order),
              jaxrdp.compute_rdp(q, sigma, 1, np.array([order]))[0]):
    assert float(r32) * (1 + conversion._RDP_REL_ERROR_FLOAT32) >= r64


def test_float32_epsilon_is_never_below_float64():
  # Rounding must not lower epsilon: float32 results sit above the float64 ones (by at most
  # the float32 safety margin on the RDP, 2e-3, plus its error).
  rng = np.random.default_rng(5)
  n = 200
  q = (10 ** rng.uniform(-5, 0, n)).astype(np.float32)
  sigma = (10 ** rng.uniform(-0.3, 1.3, n)).astype(np.float32)
  steps = rng.integers(1, 10 ** 5, n).astype(np.float32)
  delta = (10 ** rng.uniform(-10, -3, n)).astype(np.float32)
  o64 = jnp.asarray(jaxrdp.DEFAULT_ORDERS)
  eps32, _ = jaxrdp.compute_epsilon(o64.astype(jnp.float32), jaxrdp.compute_rdp(q, sigma, steps, o64.astype(jnp.float32)), delta)
  eps64, _ = jaxrdp.compute_epsilon(o64, jaxrdp.compute_rdp(q.astype(float), sigma.astype(float), steps.astype(float), o64),
                                    delta.astype(float))
  eps32, eps64 = np.asarray(eps32, np.float64), np.asarray(eps64)
  finite = np.isfinite(eps64) & (eps64 > 0)
  assert finite.sum() > 150
  assert np.all(eps32[finite] >= eps64[finite])
  assert np.all(eps32[finite] <= eps64[finite] * (1 + 3e-3))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_closed_form_partials_are_the_conversions_derivative(dtype):
  # epsilon_partials (used by the envelope gradient) against JAX's derivative of the
  # conversion itself, at orders and RDP values where eps is positive, where the KL bound or
  # the clip at 0 makes it 0, and where the RDP is +inf.
  from jaxrdp.accounting.conversion import epsilon_at_orders, epsilon_partials
  eps_of = lambda a, r, d: epsilon_at_orders(a, r, d)
  cases = [(a, r, d) for a in (1.01, 1.5, 2.0, 7.3, 64.0, 4096.0)
           for r in (0.0, 1e-12, 1e-3, 0.5, 3.0, 250.0, np.inf)
           for d in (1e-10, 1e-5, 0.3)]
  zero_seen = positive_seen = 0
  for a, r, d in cases:
    a, r, d = (jnp.asarray(v, dtype) for v in (a, r, d))
    eps = eps_of(a, r, d)
    want = jax.grad(eps_of, argnums=(1, 2))(a, r, d)
    got = epsilon_partials(a, eps, d)
    for g, w in zip(got, want):
      assert g.dtype == w.dtype == dtype
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=4 * np.finfo(dtype).eps,
                                 err_msg=f"alpha={a}, rdp={r}, delta={d}")
    zero_seen += float(eps) == 0
    positive_seen += 0 < float(eps) < np.inf
  assert zero_seen and positive_seen   # both regimes were checked
