r"""Zero-concentrated and truncated concentrated DP: their RDP curves and (ε, δ) conversions.

* (ξ, ρ)-zCDP (Bun–Steinke 2016, Def. 1.1) is RDP with ε(α) = ξ + ρα at every α > 1; the
  Gaussian mechanism is ρ = 1/(2σ²)-zCDP and ε-DP implies ε²/2-zCDP (BS16 Prop. 1.4).
* (ρ, ω)-tCDP (Bun, Dwork, Rothblum, Steinke 2018, Def. 1) is RDP with ε(α) = ρα for
  1 < α < ω and no guarantee (+inf) from ω on.
* ρ-zCDP implies (ε, δ)-DP with ε = ρ + 2√(ρ log(1/δ)) (BS16 Prop. 1.3, "simple"), or with
  the tight conversion of Canonne, Kamath, Steinke 2020 (Cor. 13): with β = α − 1,

  .. math:: \varepsilon = \inf_{\alpha>1}\ \alpha\rho + \log(1 - 1/\alpha) - \frac{\log\delta + \log\alpha}{\alpha-1},
  .. math:: \log\delta = \inf_{\alpha>1}\ (\alpha-1)(\alpha\rho-\varepsilon) + \alpha\log(1-1/\alpha) - \log(\alpha-1).

Both infima are found exactly. Differentiating the first gives ρ + (log δ + log α)/β², so its
minimiser is the unique root of the increasing function ρβ² + log1p(β) − log(1/δ); the second
is convex in α with derivative ρ(2α − 1) + log(1 − 1/α) − ε, also increasing. Each root is
found in v = log β by a fixed number of safeguarded Newton steps (a Newton step when it stays
inside the current bracket, a bisection step otherwise; the bracket comes from closed-form
bounds on the logarithms, see :func:`_epsilon_bracket` and :func:`_delta_bracket`), which is
jittable and converges to machine precision well within the step budget. The result is the
formula *evaluated* at the β found — a valid bound at any β — raised by its own rounding
allowance, so it is never below the exact infimum. Gradients flow through the formula with β
held fixed (by the envelope theorem the dependence through β vanishes at the minimum).

As in :func:`jaxrdp.compute_epsilon`, the KL bound (D₁ ≤ ρ, and δ ≤ √(1 − e^{−ρ}) of the total
variation, which gives ε = 0) is used as well, so ε = 0 when δ² ≥ 1 − e^{−ρ}.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from jaxrdp._internal import deprecation
from jaxrdp._internal import loops
from jaxrdp._internal import numerics
from jaxrdp._internal import validation

_METHODS = ("tight", "simple")
_NEWTON_STEPS = 64        # bisection alone would shrink a 700-wide bracket in v below 1e-16
_OUTPUT_ULPS = 8          # rounding allowance of the conversion formulas, in units of eps


def pure_dp_to_zcdp(epsilon: jax.typing.ArrayLike) -> jax.Array:
  r"""ρ = ε²/2: an ε-DP mechanism is ρ-zCDP.

  Args:
    epsilon: ε ≥ 0 (``inf`` allowed).

  Returns:
    ε²/2. Under ``jax.jit`` a negative or NaN ε gives NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Bun, Steinke, "Concentrated differential privacy: simplifications, extensions, and lower
    bounds", TCC 2016, arXiv:1605.02065, Prop. 1.4.
  """
  validation.check("epsilon", epsilon)
  eps = validation.as_float_array(epsilon)
  return jnp.where(validation.in_domain("epsilon", eps), 0.5 * eps * eps, jnp.nan)


@deprecation.positional_in_old_order("rho", "orders", "xi")
def rdp_zcdp(rho: jax.typing.ArrayLike, orders: jax.typing.ArrayLike, *,
             xi: jax.typing.ArrayLike = 0.0) -> jax.Array:
  r"""RDP curve ε(α) = ξ + ρα of a (ξ, ρ)-zCDP mechanism.

  Broadcasts ``rho``, ``orders`` and ``xi``. At α = 1 the value is ξ + ρ (the limit, which
  bounds the KL divergence); at α = ∞ it is +inf, or ξ when ρ = 0.

  **Changed in 1.0:** ``xi`` is keyword-only, so that the orders are the last positional
  argument as in every ``rdp_*`` curve: ``rdp_zcdp(rho, orders, xi=ξ)``. For this release the
  0.1.0 form ``rdp_zcdp(rho, orders, xi)`` still means the same and warns
  (``DeprecationWarning``).

  Args:
    rho: ρ ≥ 0.
    orders: Rényi orders α ≥ 1 (``inf`` allowed).
    xi: ξ ≥ 0 (default 0: ρ-zCDP).

  Returns:
    ξ + ρα. Under ``jax.jit`` negative or NaN ρ or ξ, or α < 1, give NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Bun, Steinke (2016), arXiv:1605.02065, Def. 1.1; as dp_accounting's ``ZCDpEvent``.
  """
  validation.check("rho", rho)
  validation.check("orders", orders)
  validation.check("xi", xi)
  validation.check_broadcast(rho=rho, orders=orders, xi=xi)
  rho, alpha, xi = _common_dtype(rho, orders, xi)
  finite = jnp.isfinite(alpha)
  out = xi + rho * jnp.where(finite, alpha, 1.0)
  # D_inf = lim D_alpha <= xi when rho = 0.
  out = jnp.where(finite, out, jnp.where(rho == 0, xi, jnp.inf))
  valid = (validation.in_domain("rho", rho) & validation.in_domain("xi", xi)
           & validation.in_domain("orders", alpha))
  return jnp.where(valid, out, jnp.nan)


def rdp_tcdp(rho: jax.typing.ArrayLike, omega: jax.typing.ArrayLike,
             orders: jax.typing.ArrayLike) -> jax.Array:
  r"""RDP curve of a (ρ, ω)-tCDP mechanism: ρα for α < ω, +inf for α ≥ ω.

  Broadcasts ``rho``, ``omega`` and ``orders``. At α = 1 the value is ρ. For ρ = 0 the curve
  is 0 at every order (D_α = 0 at one α > 1 means the two distributions are equal).

  Args:
    rho: ρ ≥ 0.
    omega: ω > 1 (``inf`` allowed: then this is ρ-zCDP).
    orders: Rényi orders α ≥ 1 (``inf`` allowed).

  Returns:
    The curve. Under ``jax.jit`` negative or NaN ρ, ω ≤ 1 or α < 1 give NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Bun, Dwork, Rothblum, Steinke, "Composable and versatile privacy via truncated CDP",
    STOC 2018, Def. 1.
  """
  validation.check("rho", rho)
  validation.check("omega", omega)
  validation.check("orders", orders)
  validation.check_broadcast(rho=rho, omega=omega, orders=orders)
  rho, omega, alpha = _common_dtype(rho, omega, orders)
  out = rho * jnp.where(jnp.isfinite(alpha), alpha, 1.0)
  out = jnp.where(alpha < omega, out, jnp.inf)
  out = jnp.where(rho == 0, 0.0, out)
  valid = (validation.in_domain("rho", rho) & validation.in_domain("omega", omega)
           & validation.in_domain("orders", alpha))
  return jnp.where(valid, out, jnp.nan)


def zcdp_to_epsilon(rho: jax.typing.ArrayLike, delta: jax.typing.ArrayLike, *,
                    method: str = "tight") -> jax.Array:
  r"""Smallest ε such that ρ-zCDP implies (ε, δ)-DP.

  Args:
    rho: ρ ≥ 0.
    delta: δ in (0, 1); broadcasts against ``rho``.
    method: ``"tight"`` (Canonne–Kamath–Steinke 2020, Cor. 13, minimised exactly over
      α > 1, see the module docstring) or ``"simple"`` (Bun–Steinke 2016, Prop. 1.3,
      ρ + 2√(ρ log(1/δ)), always ≥ the tight value).

  Returns:
    ε ≥ 0 (0 when ρ = 0). The tight value is never below the exact infimum: it is the bound
    at an admissible α, raised by its rounding allowance. Differentiable in ρ and δ (the
    ``"simple"`` gradient in ρ is +inf at ρ = 0, the true one-sided derivative). Under
    ``jax.jit`` negative or NaN ρ, or δ outside (0, 1), give NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Canonne, Kamath, Steinke, "The discrete Gaussian for differential privacy", NeurIPS 2020,
    arXiv:2004.00010, Cor. 13; Bun, Steinke (2016), arXiv:1605.02065, Prop. 1.3.
  """
  _check_method(method)
  validation.check("rho", rho)
  validation.check("delta", delta)
  validation.check_broadcast(rho=rho, delta=delta)
  rho, delta = _common_dtype(rho, delta)
  return _zcdp_to_epsilon(rho, delta, method)


def zcdp_to_delta(rho: jax.typing.ArrayLike, epsilon: jax.typing.ArrayLike) -> jax.Array:
  r"""Smallest δ such that ρ-zCDP implies (ε, δ)-DP (the tight conversion).

  Args:
    rho: ρ ≥ 0.
    epsilon: ε ≥ 0 (``inf`` allowed); broadcasts against ``rho``.

  Returns:
    δ in [0, 1]: the minimum over α > 1 of Canonne–Kamath–Steinke's bound (see the module
    docstring) and of the KL bound √(1 − e^{−ρ}), never below the exact value. 0 when ρ = 0
    or ε = ∞. Under ``jax.jit`` negative or NaN ρ or ε give NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Canonne, Kamath, Steinke (2020), arXiv:2004.00010, Cor. 13.
  """
  validation.check("rho", rho)
  validation.check("epsilon", epsilon)
  validation.check_broadcast(rho=rho, epsilon=epsilon)
  rho, eps = _common_dtype(rho, epsilon)
  return _zcdp_to_delta(rho, eps)


def _check_method(method):
  validation.check_choice("method", method, _METHODS)


def _common_dtype(*args):
  arrays = [validation.as_float_array(a) for a in args]
  dtype = jnp.result_type(*arrays)
  return jnp.broadcast_arrays(*[a.astype(dtype) for a in arrays])


def _safeguarded_newton(fn, lo, hi, x0):
  """Root of the increasing ``fn`` in [lo, hi]: Newton inside the bracket, else bisection.

  Needs fn(lo) ≤ 0 ≤ fn(hi) for the bracket to hold the root; if it does not, the iterate
  still stays in [lo, hi], which is all the callers need (they evaluate a bound there).
  """
  def body(_, state):
    lo, hi, x = state
    f, df = jax.jvp(fn, (x,), (jnp.ones_like(x),))
    left = f <= 0
    lo = jnp.where(left, x, lo)
    hi = jnp.where(left, hi, x)
    step = x - f / jnp.where(df > 0, df, 1.0)
    ok = (df > 0) & (step >= lo) & (step <= hi)
    return lo, hi, jnp.where(ok, step, 0.5 * (lo + hi))

  _, _, x = loops.fori_loop(0, _NEWTON_STEPS, body, (lo, hi, x0))
  return x


def _epsilon_bracket(rho, lam):
  """Bounds on v = log β for the root of ρβ² + log1p(β) = λ.

  log1p(β) ≤ β puts the root above the positive root of ρβ² + β = λ; each of ρβ² = λ and
  log1p(β) = λ alone puts it below.
  """
  beta_lo = 2 * lam / (1 + jnp.sqrt(1 + 4 * rho * lam))
  beta_hi = jnp.minimum(jnp.sqrt(lam / rho), jnp.expm1(lam))
  return _clamped_logs(beta_lo, beta_hi)


def _clamped_logs(beta_lo, beta_hi):
  """log of the bracket, kept where e^v, e^{2v} and their reciprocals are finite (at extreme
  ρ the true root may lie outside; the bound is then evaluated at the nearest end, still valid)."""
  finfo = jnp.finfo(beta_lo.dtype)
  v_min = math.log(float(finfo.tiny))
  v_max = 0.5 * math.log(float(finfo.max))
  v_lo = jnp.clip(jnp.log(beta_lo), v_min, v_max)
  v_hi = jnp.clip(jnp.log(beta_hi), v_min, v_max)
  return jnp.minimum(v_lo, v_hi), v_hi


@functools.partial(jax.jit, static_argnames=("method",))
def _zcdp_to_epsilon(rho, delta, method):
  valid = validation.in_domain("rho", rho) & validation.in_domain("delta", delta)
  positive = valid & (rho > 0)
  r = jnp.where(positive, rho, 1.0)
  lam = -jnp.log(jnp.where(valid, delta, 0.5))
  ulp = _OUTPUT_ULPS * jnp.finfo(r.dtype).eps
  if method == "simple":
    # sqrt(rho) * sqrt(lambda), not sqrt(rho * lambda): at rho = 0 the gradient in rho is the
    # one-sided +inf and the gradient in delta is 0, not inf * 0 = NaN.
    rv = jnp.where(valid, rho, 1.0)
    eps = (rv + 2 * jnp.sqrt(rv) * jnp.sqrt(lam)) * (1 + ulp)
    return jnp.where(valid, eps, jnp.nan)

  r_stop = jax.lax.stop_gradient(r)
  lam_stop = jax.lax.stop_gradient(lam)
  v_lo, v_hi = _epsilon_bracket(r_stop, lam_stop)
  # In v, rho e^{2v} + softplus(v) - lambda is increasing and convex: Newton from the
  # right end never overshoots.
  stationarity = lambda v: r_stop * jnp.exp(2 * v) + jnp.logaddexp(0.0, v) - lam_stop
  v = jax.lax.stop_gradient(_safeguarded_newton(stationarity, v_lo, v_hi, v_hi))
  beta = jnp.exp(v)
  log1p_beta = numerics.log1p(beta)
  # CKS Cor. 13 at alpha = 1 + beta: alpha rho + log(1 - 1/alpha) - (log delta + log alpha)/beta.
  t1 = (1 + beta) * r
  t2 = -numerics.log1p(1 / beta)
  t3 = (lam - log1p_beta) / beta
  allowance = ulp * (jnp.abs(t1) + jnp.abs(t2) + (lam + log1p_beta) / beta)
  eps = jnp.maximum(t1 + t2 + t3 + allowance, 0.0)
  # KL bound: delta >= sqrt(1 - e^{-rho}) already gives (0, delta)-DP (tested with delta
  # rounded down and rho up, so that rounding cannot claim it where it does not hold).
  kl_enough = delta * delta * (1 - ulp) + jnp.expm1(-r * (1 + ulp)) >= 0
  eps = jnp.where(kl_enough | ~positive, 0.0, eps)
  return jnp.where(valid, eps, jnp.nan)


def _delta_bracket(rho, eps, dtype):
  """Bounds on v = log β for the root of ρ(2β + 1) − log1p(1/β) = ε.

  With x = 1/β, 2x/(2 + x) ≤ log1p(x) ≤ x: the root lies below the positive root of
  2ρβ² + (ρ − ε)β − 1 = 0 and above (w − 1)/2 where ρw² − εw − 2 = 0. When that lower bound is
  not positive, the smallest normal number is used (the root is then tiny, or ρ is so large
  that δ = 1 anyway).
  """
  b = rho - eps
  root8rho = jnp.sqrt(8 * rho)
  disc = jnp.hypot(b, root8rho)
  beta_hi = jnp.where(b >= 0, 2 / (b + disc), (disc - b) / (4 * rho))
  w = (eps + jnp.hypot(eps, root8rho)) / (2 * rho)
  beta_lo = jnp.where(w > 1, 0.5 * (w - 1), jnp.finfo(dtype).tiny)
  return _clamped_logs(beta_lo, beta_hi)


@jax.jit
def _zcdp_to_delta(rho, eps):
  valid = validation.in_domain("rho", rho) & validation.in_domain("epsilon", eps)
  positive = valid & (rho > 0) & jnp.isfinite(eps)
  r = jnp.where(positive, rho, 1.0)
  e = jnp.where(positive, eps, 0.0)
  ulp = _OUTPUT_ULPS * jnp.finfo(r.dtype).eps

  r_stop = jax.lax.stop_gradient(r)
  e_stop = jax.lax.stop_gradient(e)
  v_lo, v_hi = _delta_bracket(r_stop, e_stop, r.dtype)
  derivative = lambda v: r_stop * (2 * jnp.exp(v) + 1) - jnp.logaddexp(0.0, -v) - e_stop
  v = jax.lax.stop_gradient(_safeguarded_newton(derivative, v_lo, v_hi, v_hi))
  beta = jnp.exp(v)
  # CKS Cor. 13 at alpha = 1 + beta:
  # log delta = beta (alpha rho - eps) + alpha log(1 - 1/alpha) - log beta.
  alpha_rho = (1 + beta) * r
  t1 = beta * (alpha_rho - e)
  t2 = -(1 + beta) * numerics.log1p(1 / beta)
  t3 = -v
  allowance = ulp * (1 + beta * (alpha_rho + e) + jnp.abs(t2) + jnp.abs(t3))
  log_delta = t1 + t2 + t3 + allowance
  # KL bound sqrt(1 - e^{-rho}), in logs, rounded up.
  log_kl = 0.5 * jnp.log(-jnp.expm1(-r)) + ulp
  delta = jnp.minimum(jnp.exp(jnp.minimum(log_delta, log_kl)), 1.0)
  delta = jnp.where(positive, delta, 0.0)
  return jnp.where(valid, delta, jnp.nan)
