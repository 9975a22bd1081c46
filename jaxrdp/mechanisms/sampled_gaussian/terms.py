r"""log A and the RDP from log J, with the special cases around the generic kernel.

The kernels compute log J = log((A_α − 1)/(α − 1)) for generic parameters
(0 < q < 1, σ > 0, 1 ≤ α < ∞, :func:`_generic`); :func:`_terms` turns it into
:math:`\log A = \log(1 + (\alpha - 1) J)` and :math:`\mathrm{RDP} = \log A/(\alpha - 1)` and
handles q = 0, q = 1, σ = 0, α = 1, α = ∞ and arguments outside their domain, with
double-where selects (NaN-free gradients) and the one-sided derivatives at α = 1 and q = 1.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrdp._internal import validation
from jaxrdp.mechanisms.sampled_gaussian.common import _softplus, _where
from jaxrdp.mechanisms.sampled_gaussian.quadrature import _log_j


def _generic(q, sigma, alpha):
  """Where the kernel is needed (0 < q < 1, sigma > 0, 1 <= alpha < inf), and the parameters
  with safe stand-ins elsewhere (double-where: NaN-free gradients)."""
  generic = (q > 0) & (q < 1) & (sigma > 0) & jnp.isfinite(alpha) & (alpha >= 1)
  return (generic, _where(generic, q, 0.5), _where(generic, sigma, 1.0),
          _where(generic, alpha, 2.0))


@jax.custom_jvp
def _q1_slopes(q, alpha, inv_2s2):
  """(0, 0), whose derivative along q is that of (log A, RDP) at q = 1 from below:
  (α(1 − e^{−t}), 2α/(2σ²)·(1 − e^{−t})/t), t = (α − 1)/σ² (:func:`_terms`); zero along α
  and σ (the terms are zero in value for every α, σ). A derivative rule, not
  (q − stop_gradient(q)) times the slopes: a derivative along σ or α alone then has no
  term for them (nor kernels to compile: each of the slopes' expm1 and division was one in
  ``jax.grad`` of ε along σ), and a value alone no arithmetic for them."""
  zero = jnp.zeros(jnp.broadcast_shapes(q.shape, alpha.shape, inv_2s2.shape),
                   jnp.result_type(q, alpha, inv_2s2))
  return zero, zero


@functools.partial(_q1_slopes.defjvp, symbolic_zeros=True)
def _q1_slopes_jvp(primals, tangents):
  q, alpha, inv_2s2 = primals
  out = _q1_slopes(q, alpha, inv_2s2)
  dq = tangents[0]
  if type(dq) is jax.custom_derivatives.SymbolicZero:
    return out, tuple(jnp.zeros_like(v) for v in out)
  t = 2 * (alpha - 1) * inv_2s2
  t_nonzero = t != 0
  t_safe = _where(t_nonzero, t, 1.0)
  one_minus_e = -jnp.expm1(-t)
  rate = _where(t_nonzero, one_minus_e / t_safe, 1.0)   # (1 - e^-t)/t, 1 at t = 0
  return out, (dq * (alpha * one_minus_e), dq * (2 * alpha * inv_2s2 * rate))


def _terms(q, sigma, alpha, log_j=None, inv_2s2=None):
  r"""Special cases around the generic kernel, with double-where for NaN-free gradients.
  ``log_j``: log J at the generic stand-ins of :func:`_generic` (default: the quadrature);
  ``inv_2s2``: 1/(2 sigma^2) where sigma > 0 (1/2 elsewhere), if already computed.

  Two special cases are constant in one argument at a single point, where a plain ``where``
  would also make their derivative in it zero; each is written as its value plus a term that
  is exactly zero in value and carries the derivative:

  * :math:`\alpha = 1` (:math:`\beta = \alpha - 1 = 0`): :math:`\log A = \log(1 + \beta J)`
    and :math:`\mathrm{RDP} = \log(1 + \beta J)/\beta`, with :math:`J = (A_\alpha - 1)/\beta`
    equal to :math:`\mathrm{KL}(\mu\,\|\,\mu_0)` at :math:`\alpha = 1`
    (:math:`\mu = (1-q)\mu_0 + q\mu_1`), so :math:`\partial_\alpha \log A|_{\alpha=1} = J` and
    :math:`\partial_\alpha \mathrm{RDP}|_{\alpha=1} = J' - J^2/2` (Taylor expansion of
    :math:`\log(1+\beta J)` in β; J' from the kernel).
  * :math:`q = 1`, the edge of the domain, where :math:`\log A = \alpha(\alpha-1)/(2\sigma^2)`
    does not depend on q: the one-sided derivative, the limit :math:`q \to 1^-` of
    :math:`\partial_q \log A = \alpha E_{\mu_0}[(1-q+qL)^{\alpha-1}(L-1)]/A`, is
    :math:`\alpha (E[L^\alpha] - E[L^{\alpha-1}])/E[L^\alpha] = \alpha(1 - e^{-t})`,
    :math:`t = (\alpha-1)/\sigma^2` (moments :math:`E_{\mu_0}[L^k] = e^{k(k-1)/(2\sigma^2)}`),
    so :math:`\partial_q \mathrm{RDP} = (\alpha/\sigma^2)(1 - e^{-t})/t` (:math:`1/\sigma^2`,
    the KL's slope, at :math:`\alpha = 1`); added as a term zero in value whose derivative
    along q is the slope (:func:`_q1_slopes`).

  References: Mironov, Talwar, Zhang (2019), arXiv:1908.10530, Sec. 3 (A_α and its moments).
  """
  generic, q_g, s_g, a_g = _generic(q, sigma, alpha)
  if log_j is None:
    log_j = _log_j(q_g, s_g, a_g)
  failed = ~jnp.isfinite(log_j)
  beta = a_g - 1
  beta_safe = _where(beta > 0, beta, 1.0)
  log_j_safe = _where(failed, 0.0, log_j)
  # At beta = 0, J is the KL divergence: log(1 + beta J) = beta J - (beta J)^2/2 + ..., so the
  # value beta J (= 0) and beta J - beta J^2/2 (= J) give the alpha-derivatives J and J' - J^2/2.
  # (kl_fin: an overflowing KL, sigma < ~1e-154, must not make 0 * inf = NaN of the zero terms.)
  kl = jnp.exp(_where(beta > 0, 0.0, log_j_safe))
  kl_fin = _where(jnp.isfinite(kl), kl, 0.0)
  log_a_gen = _where(beta > 0, _softplus(jnp.log(beta_safe) + log_j_safe), beta * kl_fin)
  rdp_gen = _where(beta > 0, log_a_gen / beta_safe, kl - beta * (0.5 * kl_fin) * kl_fin)
  inf = jnp.full_like(q, jnp.inf)
  log_a_gen = _where(failed, inf, log_a_gen)
  rdp_gen = _where(failed, inf, rdp_gen)

  if inv_2s2 is None:
    s_pos = _where(sigma > 0, sigma, 1.0)
    inv_2s2 = 1 / (2 * s_pos * s_pos)
  a_fin = _where(jnp.isfinite(alpha), alpha, 2.0)
  # q = 1: the closed form plus a term zero in value whose derivative along q is the one-sided
  # slopes above, from a finite 1/(2 sigma^2) (where sigma^2 underflows the value is +inf and
  # the slope would be 0 * inf = NaN).
  inv_fin = _where(jnp.isfinite(inv_2s2), inv_2s2, 0.5)
  slope_log_a, slope_rdp = _q1_slopes(q, a_fin, inv_fin)
  log_a_q1 = a_fin * (a_fin - 1) * inv_2s2 + slope_log_a
  rdp_q1 = a_fin * inv_2s2 + slope_rdp

  zero = jnp.zeros_like(q)
  blows_up = (sigma == 0) | ~jnp.isfinite(alpha)
  log_a_out = _where(q == 0, zero, _where(blows_up, inf, _where(q == 1, log_a_q1, log_a_gen)))
  rdp_out = _where(q == 0, zero, _where(blows_up, inf, _where(q == 1, rdp_q1, rdp_gen)))
  # A_1 = 1 exactly: log A vanishes at alpha = 1 whatever q and sigma. Every finite branch is
  # already 0 there (with its alpha-derivative); sigma = 0 and uncertified values are +inf
  # (and alpha (alpha - 1)/(2 sigma^2) is 0 * inf = NaN where sigma^2 underflows).
  log_a_out = _where((alpha == 1) & ~jnp.isfinite(log_a_out), zero, log_a_out)
  # Under jit the eager range checks do not run: out-of-range inputs give NaN, never a number.
  valid = (validation.in_domain("sampling_rate", q) & validation.in_domain("orders", alpha)
           & validation.in_domain("noise_multiplier", sigma))
  return _where(valid, log_a_out, jnp.nan), _where(valid, rdp_out, jnp.nan)
