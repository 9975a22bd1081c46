"""Derivatives at the edges of the domain, where the value is finite (q = 1, alpha = 1, small sigma).

At q = 1 and alpha = 1 a closed form takes over from the quadrature; each must carry the
derivative of the curve it ends (the one-sided derivative at q = 1, the edge of [0, 1]), not
that of a constant. Below sigma ~ 0.035 the derivatives need as many nodes as the values.
Float64 (tests/conftest.py switches x64 on).
"""

import math

import jax
import mpmath as mp
import numpy as np
import pytest

import jaxrdp


def _left_difference(f, x, h):
  """Second-order one-sided difference (3 f(x) - 4 f(x - h) + f(x - 2h)) / (2h): error O(h^2)."""
  return (3 * float(f(x)) - 4 * float(f(x - h)) + float(f(x - 2 * h))) / (2 * h)


def _right_difference(f, x, h):
  return (-3 * float(f(x)) + 4 * float(f(x + h)) - float(f(x + 2 * h))) / (2 * h)


def _kl_and_slope_mpmath(q, sigma, dps=30):
  r"""(K1, (K2 - K1^2)/2) with :math:`K_n = E_{\mu_0}[(1+x)\log^n(1+x)]`, x = q(L - 1), by mpmath
  quadrature. From :math:`A_\alpha = E_{\mu_0}[(1+x)e^{\beta\log(1+x)}] = 1 + \beta K_1 +
  \beta^2 K_2/2 + O(\beta^3)` (β = α − 1): K1 = KL(μ‖μ0) = d log A/dα at α = 1, and
  (K2 − K1²)/2 = d RDP/dα at α = 1 (half the variance of the privacy loss under μ)."""
  with mp.workdps(dps):
    q, sigma = mp.mpf(q), mp.mpf(sigma)
    z0 = mp.mpf(0.5) + sigma ** 2 * mp.log((1 - q) / q)   # where q L = 1 - q
    cuts = sorted({-10 * sigma, mp.mpf(0), mp.mpf(0.5), mp.mpf(1), mp.mpf(2), 1 + 10 * sigma}
                  | ({z0} if -10 * sigma < z0 < 1 + 10 * sigma else set()))

    def moment(n):
      def f(z):
        p = 1 - q + q * mp.e ** ((2 * z - 1) / (2 * sigma ** 2))
        return mp.npdf(z, 0, sigma) * p * mp.log(p) ** n
      return mp.quad(f, [-mp.inf] + cuts + [mp.inf])
    k1, k2 = moment(1), moment(2)
    return float(k1), float((k2 - k1 ** 2) / 2)


# --- q = 1: the one-sided derivative of the Gaussian mechanism's closed form -------------------

def _slopes_at_q_one(sigma, alpha):
  """d log A/dq and d RDP/dq as q -> 1-: alpha (1 - e^-t) and (alpha/sigma^2)(1 - e^-t)/t,
  t = (alpha - 1)/sigma^2 (from E_{mu0}[L^k] = e^{k(k-1)/(2 sigma^2)}; 1/sigma^2 at alpha = 1)."""
  t = (alpha - 1) / sigma ** 2
  rate = -math.expm1(-t) / t if t else 1.0
  return -alpha * math.expm1(-t), alpha / sigma ** 2 * rate


@pytest.mark.parametrize("sigma,alpha", [(1.0, 2.5), (0.8, 1.5), (2.0, 8.0), (1.0, 2.0)])
def test_log_a_q_derivative_at_q_one_is_the_left_derivative(sigma, alpha):
  # Tolerances: closed form 1e-13; the limit q -> 1- (the gradient at 1 - 1e-9, where the
  # quadrature runs) 1e-7; a second-order left difference (h = 1e-5) 1e-6.
  grad = jax.grad(jaxrdp.log_a)
  want, _ = _slopes_at_q_one(sigma, alpha)
  got = float(grad(1.0, sigma, alpha))
  assert abs(got - want) <= 1e-13 * want, (got, want)
  assert abs(got - float(grad(1 - 1e-9, sigma, alpha))) <= 1e-7 * want
  assert abs(got - _left_difference(lambda q: jaxrdp.log_a(q, sigma, alpha), 1.0, 1e-5)) <= 1e-6 * want


def test_compute_rdp_q_derivative_at_q_one_is_the_left_derivative():
  # Every path of the grid: exact sums (integer orders), shared nodes (fractional), the per-order
  # kernel (alpha = 1). Tolerance 1e-13 against the closed form, 1e-7 against the limit.
  sigma, orders = 1.3, np.array([1.0, 1.5, 2.0, 2.5, 8.0, 32.0])
  jac = jax.jacfwd(lambda q: jaxrdp.compute_rdp(q, sigma, 1, orders))
  want = np.array([_slopes_at_q_one(sigma, a)[1] for a in orders])
  np.testing.assert_allclose(jac(1.0), want, rtol=1e-13)
  np.testing.assert_allclose(jac(1 - 1e-9), want, rtol=1e-7)


@pytest.mark.parametrize("jit", [False, True])
def test_dpsgd_epsilon_q_gradient_at_q_one_is_the_left_derivative(jit):
  # Envelope derivative at the optimal order vs a second-order left difference of epsilon
  # itself (h = 1e-5; the order found moves with q): relative tolerance 1e-5.
  eps = lambda q: jaxrdp.dpsgd_epsilon(q, 1.0, 100, 1e-5)
  grad = jax.jit(jax.grad(eps)) if jit else jax.grad(eps)
  got = float(grad(1.0))
  want = _left_difference(eps, 1.0, 1e-5)
  assert want > 100 and abs(got - want) <= 1e-5 * want, (got, want)


# --- small sigma: the derivative certified wherever the value is ------------------------------

@pytest.mark.parametrize("jit", [False, True])
def test_dpsgd_epsilon_sigma_gradient_at_small_sigma(jit):
  # epsilon ~ 1e4 at an order just above 1 (1.0018 at sigma = 0.02): the value came from nodes
  # the derivative's quadrature could not match (257 per window), and the gradient was 0.
  # Central difference with h = 1e-6 sigma: relative tolerance 1e-5.
  eps = lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 100, 1e-5)
  grad = jax.jit(jax.grad(eps)) if jit else jax.grad(eps)
  for sigma in (0.02, 0.03):
    got = float(grad(sigma))
    h = 1e-6 * sigma
    want = (float(eps(sigma + h)) - float(eps(sigma - h))) / (2 * h)
    assert want < -1e5 and abs(got - want) <= 1e-5 * abs(want), (sigma, got, want)


# --- alpha = 1: the KL divergence and its slope ----------------------------------------------

@pytest.mark.parametrize("q,sigma", [(0.01, 1.0), (0.1, 1.0), (0.5, 0.5)])
def test_alpha_derivatives_at_order_one(q, sigma):
  # d log A/d alpha at alpha = 1 is KL(mu || mu0) (log A_1 = 0, dA/d alpha = E_mu0[(1+x) log(1+x)]),
  # also the RDP at alpha = 1; d RDP/d alpha there is (K2 - K1^2)/2. References: mpmath
  # (_kl_and_slope_mpmath), relative tolerance 1e-10; second-order right differences
  # (h = 1e-5), 1e-6.
  kl, slope = _kl_and_slope_mpmath(q, sigma)
  log_a = lambda a: jaxrdp.log_a(q, sigma, a)
  rdp = lambda a: jaxrdp.rdp_sampled_gaussian(q, sigma, a)
  assert float(log_a(1.0)) == 0.0
  d_log_a = float(jax.grad(log_a)(1.0))
  d_rdp = float(jax.grad(rdp)(1.0))
  assert abs(d_log_a - kl) <= 1e-10 * kl, (d_log_a, kl)
  assert abs(float(rdp(1.0)) - kl) <= 1e-10 * kl
  assert abs(d_rdp - slope) <= 1e-10 * slope, (d_rdp, slope)
  assert abs(d_log_a - _right_difference(log_a, 1.0, 1e-5)) <= 1e-6 * kl
  assert abs(d_rdp - _right_difference(rdp, 1.0, 1e-5)) <= 1e-6 * slope


def test_alpha_derivative_at_order_one_in_the_closed_forms():
  # q = 1: log A = alpha (alpha - 1)/(2 sigma^2), slope 1/(2 sigma^2) at alpha = 1 (the KL of
  # two Gaussians); q = 0: log A = 0 at every order.
  grad = jax.grad(jaxrdp.log_a, argnums=2)
  assert float(grad(1.0, 2.0, 1.0)) == 1 / 8
  assert float(grad(0.0, 2.0, 1.0)) == 0.0
