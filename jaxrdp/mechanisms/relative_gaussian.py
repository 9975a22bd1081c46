r"""RDP of the Relative Gaussian Mechanism (Hendrikx, Mangold, Bellet 2024).

A query :math:`R : \mathcal{D} \to \mathbb{R}^d` has :math:`(\eta, R_{rel})`-relative L2
sensitivity when :math:`\|R(D) - R(D')\| \le \eta \|R(D)\| + R_{rel}` for all neighbours, in
both directions. The mechanism releases

.. math:: R(D) + (\gamma \|R(D)\| + \sigma)\, N(0, I_d), \qquad \sigma \ge \gamma R_{rel} / \eta,

(noise standard deviation affine in the output norm, as in the authors' code). Its exact RDP,
the supremum of :math:`D_\alpha` over all admissible pairs of outputs, is (derivation in
``docs/relative_gaussian.md``; β = α − 1, κ = (1 + η)² − 1 = η(2 + η))

.. math:: \varepsilon(\alpha) = \frac{\alpha\,\eta^2}{2\gamma^2 (1 - \beta\kappa)}
          + \frac{d}{2}\Big[\frac{-\log(1 - \beta\kappa)}{\beta} - 2\log(1 + \eta)\Big]

for :math:`\alpha < (1+\eta)^2/(2\eta + \eta^2)` (i.e. βκ < 1) and +∞ otherwise. The supremum
is attained by collinear outputs :math:`R(D) = (1 + \eta) R(D') + R_{rel} R(D')/\|R(D')\|`,
where the noise of the first output is (1 + η) times larger: both the mean
term and the variance term of the Gaussian Rényi divergence are maximal at that same ratio.
It depends on neither σ nor R_rel (given σ ≥ γR_rel/η), only on (α, η, γ, d).

Numerics. The bracket is written as a sum of non-negative terms,
``κ·T(βκ) + η² + 2·(η − log(1 + η))`` with ``T(x) = (−log(1 − x) − x)/x``, and both ``T`` and
``η − log1p(η)`` are evaluated through the atanh series (no cancellation near 0). Near the
pole the rounding of βκ is bounded and 1 − βκ is lowered by that bound, and the result is
raised by 16 ulps (plus the smallest normal number, for underflow), so that the value returned
is never below the exact value at the given (floating-point) inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrdp._internal import deprecation
from jaxrdp._internal import numerics
from jaxrdp._internal import validation

# S(v) = sum_k v^k/(2k+3), the tail of atanh(w) = w + w^3 S(w^2). Used for v <= 1/9, where the
# first omitted term (1/9)^20/43 < 2e-21 is below float64 resolution.
_ATANH_TAIL_COEFFS = tuple(1.0 / (2 * k + 3) for k in range(20))
_SERIES_CUT_X = 0.5    # T(x): series for x <= 1/2, i.e. w = x/(2 - x) <= 1/3
_SERIES_CUT_ETA = 1.0  # eta - log1p(eta): series for eta <= 1, i.e. z = eta/(2 + eta) <= 1/3
# |fl(beta * kappa) - beta * kappa| <= ~4 u (beta * kappa) = 2 eps (beta * kappa); lowered by twice that.
_DEN_ULPS = 4
_OUTPUT_ULPS = 16


def _atanh_tail(v):
  return numerics.horner(v, _ATANH_TAIL_COEFFS)


def _neg_log1m_minus_x_over_x(x, den_lo):
  r"""T(x) = (−log(1 − x) − x)/x ≥ 0 for 0 ≤ x < 1 (T(0) = 0), with 1 − x ≥ ``den_lo`` > 0.

  With w = x/(2 − x), −log(1 − x) = 2 atanh(w) and x = 2w/(1 + w), so
  T = w + w²(1 + w) S(w²): a sum of non-negative terms. For x > 1/2 the direct formula loses
  at most ~2 bits (−log(1 − x) ≥ log 2 against x ≤ 1); it uses the lowered ``den_lo`` so that
  the pole is approached from above.
  """
  small = x <= _SERIES_CUT_X
  xs = jnp.where(small, x, 0.0)
  w = xs / (2 - xs)
  series = w + w * w * (1 + w) * _atanh_tail(w * w)
  xb = jnp.where(small, 1.0, x)
  db = jnp.where(small, 0.5, den_lo)
  direct = (-jnp.log(db) - xb) / xb
  return jnp.where(small, series, direct)


def _eta_minus_log1p(eta):
  r"""η − log(1 + η) ≥ 0 for η ≥ 0, without cancellation near 0.

  With z = η/(2 + η), log(1 + η) = 2 atanh(z) and η = 2z/(1 − z), so
  η − log(1 + η) = 2z²/(1 − z) − 2z³ S(z²); the subtracted term is at most z/3 of the first.
  """
  small = eta <= _SERIES_CUT_ETA
  es = jnp.where(small, eta, 0.0)
  z = es / (2 + es)
  series = 2 * z * z / (1 - z) - 2 * z * z * z * _atanh_tail(z * z)
  eb = jnp.where(small, 2.0, eta)
  direct = eb - numerics.log1p(eb)
  return jnp.where(small, series, direct)


@deprecation.positional_in_old_order("alpha", "eta", "gamma", "dim", renamed={"alpha": "orders"})
def rdp_relative_gaussian(*, eta: jax.typing.ArrayLike, gamma: jax.typing.ArrayLike,
                          dim: jax.typing.ArrayLike, orders: jax.typing.ArrayLike) -> jax.Array:
  r"""Exact RDP ε(α) of one release of the Relative Gaussian Mechanism.

  .. math:: \varepsilon(\alpha) = \sup_{u, v \text{ admissible}}
            D_\alpha\big(N(u, s_u^2 I_d) \,\|\, N(v, s_v^2 I_d)\big)
            = \frac{\alpha\eta^2}{2\gamma^2(1 - \beta\kappa)}
            + \frac{d}{2}\Big[\frac{-\log(1 - \beta\kappa)}{\beta} - 2\log(1 + \eta)\Big],

  with :math:`s_u = \gamma\|u\| + \sigma`, β = α − 1, κ = η(2 + η); "admissible" means
  :math:`\|u - v\| \le \min(\eta\|u\| + R_{rel}, \eta\|v\| + R_{rel})` and σ ≥ γR_rel/η. The
  value is the supremum (sound and tight), not merely a bound: it is attained by
  :math:`u = (1 + \eta) v` when σ = γR_rel/η, and approached as ‖v‖ → ∞ when σ > γR_rel/η.

  All arguments broadcast against each other. Jittable, vmappable, differentiable in α, η, γ;
  computes in the floating dtype of ``orders``, ``eta`` and ``gamma`` (``dim`` is cast to it).

  **Changed in 1.0:** the orders come last, as in every ``rdp_*`` curve, and are named
  ``orders`` (0.1.0: ``rdp_relative_gaussian(alpha, eta, gamma, dim)``). For this release the
  arguments are keyword-only, ``rdp_relative_gaussian(eta=η, gamma=γ, dim=d, orders=α)``; a
  positional call is read in the 0.1.0 order, as before, and warns (``DeprecationWarning``), as
  does the keyword ``alpha``. The next release takes ``(eta, gamma, dim, orders)`` by position.

  Args:
    eta: η > 0, the multiplicative part of the relative L2 sensitivity.
    gamma: γ > 0, the noise standard deviation per unit of output norm.
    dim: d, the dimension of the released vector (positive integer).
    orders: Rényi orders α ≥ 1 (``inf`` allowed; α = 1 gives the KL divergence).

  Returns:
    ε(α) ≥ 0, rounded up (never below the exact value at the given inputs); +inf for
    α ≥ (1 + η)²/(2η + η²), where the Rényi divergence is infinite. At α = 1:
    η²/(2γ²) + (d/2)(2η + η² − 2 log(1 + η)). Under ``jax.jit`` (where the eager checks cannot
    run) α < 1, η ≤ 0, γ ≤ 0, non-finite η or γ, d < 1, non-integer d or NaN give NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Hendrikx, Mangold, Bellet, "The Relative Gaussian Mechanism and its Application to Private
    Gradient Descent", AISTATS 2024, arXiv:2308.15250, Def. 2, Def. 3 and Thm. 1 (the
    condition on α). The Gaussian Rényi divergence: Gil, Alajaji, Linder, "Rényi divergence
    measures for commonly used univariate continuous distributions", Information Sciences
    2013. Derivation of the supremum: ``docs/relative_gaussian.md``.
  """
  validation.check("eta", eta)
  validation.check("gamma", gamma)
  validation.check("dim", dim)
  validation.check("orders", orders)
  validation.check_broadcast(eta=eta, gamma=gamma, dim=dim, orders=orders)
  if validation.is_concrete(dim):   # on the host: under an outer jit, jnp would trace a constant
    d = np.asarray(dim)
    if not bool(np.all(d == np.floor(d))):
      raise ValueError(f"dim must be a positive integer; got {dim!r}.")
  a = validation.as_float_array(orders)
  e = validation.as_float_array(eta)
  g = validation.as_float_array(gamma)
  dtype = jnp.result_type(a, e, g)
  d = jnp.asarray(dim).astype(dtype)
  return _rdp_relative_gaussian(a.astype(dtype), e.astype(dtype), g.astype(dtype), d)


@jax.jit
def _rdp_relative_gaussian(alpha, eta, gamma, dim):
  alpha, eta, gamma, dim = jnp.broadcast_arrays(alpha, eta, gamma, dim)
  eps = jnp.finfo(alpha.dtype).eps
  valid = (validation.in_domain("orders", alpha) & validation.in_domain("eta", eta)
           & validation.in_domain("gamma", gamma) & validation.in_domain("dim", dim)
           & (dim == jnp.floor(dim)))
  finite_alpha = jnp.isfinite(alpha)
  a = jnp.where(valid & finite_alpha, alpha, 1.0)
  e = jnp.where(valid, eta, 1.0)
  g = jnp.where(valid, gamma, 1.0)
  dd = jnp.where(valid, dim, 1.0)
  kappa = e * (2 + e)          # (1 + eta)^2 - 1, the range of the variance ratio minus one
  x = (a - 1) * kappa          # 1 - x = s_alpha^2 / s_v^2 at the worst pair (s_u = (1 + eta) s_v)
  # 1 - x is exact for x >= 1/2 (Sterbenz); x itself carries <= ~2 eps relative error, which
  # can only be covered by lowering the denominator (the function has a pole at x = 1).
  den_lo = (1 - x) - _DEN_ULPS * eps * x
  pole = den_lo <= 0
  den = jnp.where(pole, 1.0, den_lo)
  ratio = e / g
  mean_term = a * ratio * ratio / (2 * den)
  bracket = (kappa * _neg_log1m_minus_x_over_x(jnp.where(pole, 0.0, x), den)
             + e * e + 2 * _eta_minus_log1p(e))
  # + smallest normal: terms that underflow (η/γ or η below ~1e-19 in float32) are still covered.
  out = (mean_term + 0.5 * dd * bracket) * (1 + _OUTPUT_ULPS * eps) + jnp.finfo(alpha.dtype).tiny
  out = jnp.where(pole | ~finite_alpha, jnp.inf, out)
  return jnp.where(valid, out, jnp.nan)
