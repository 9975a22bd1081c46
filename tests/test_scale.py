"""Large inputs run in bounded memory (chunks of the kernel) and give the same numbers."""

import numpy as np
import pytest

import jaxrdp
from jaxrdp.mechanisms import sampled_gaussian


def test_chunked_equals_unchunked():
  # More than one chunk (with padding) versus pieces that each fit in a single chunk.
  n = 2 * sampled_gaussian._CHUNK + 123
  rng = np.random.default_rng(0)
  q = 10 ** rng.uniform(-5, 0, n)
  sigma = 10 ** rng.uniform(-0.5, 1.5, n)
  alpha = 1 + 10 ** rng.uniform(-2, 2.5, n)
  whole = np.asarray(jaxrdp.log_a(q, sigma, alpha))
  piece = sampled_gaussian._CHUNK // 2
  parts = np.concatenate([np.asarray(jaxrdp.log_a(q[i:i + piece], sigma[i:i + piece], alpha[i:i + piece]))
                          for i in range(0, n, piece)])
  np.testing.assert_allclose(whole, parts, rtol=1e-13)  # same nodes; only summation order differs
  assert np.all(np.isfinite(whole))


@pytest.mark.slow   # ~10 s; `pytest -m slow` (bench_scale.py measures the same case)
def test_hundred_thousand_orders_from_one():
  # dp_accounting's own tests use 99,000 orders starting at alpha = 1.0.
  orders = np.linspace(1.0, 100.0, 100_000)
  rdp = np.asarray(jaxrdp.compute_rdp(0.01, 1.1, 1000, orders))
  assert rdp.shape == (100_000,) and np.all(np.isfinite(rdp))
  assert np.all(np.diff(rdp) >= -1e-12 * rdp[1:])  # non-decreasing in the order
  eps, order = jaxrdp.compute_epsilon(orders, rdp, 1e-5)
  coarse, _ = jaxrdp.compute_epsilon(jaxrdp.DEFAULT_ORDERS[jaxrdp.DEFAULT_ORDERS <= 100],
                                     jaxrdp.compute_rdp(0.01, 1.1, 1000, jaxrdp.DEFAULT_ORDERS[jaxrdp.DEFAULT_ORDERS <= 100]), 1e-5)
  assert float(eps) <= float(coarse) * (1 + 1e-12)
