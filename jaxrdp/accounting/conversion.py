r"""From an RDP curve to (ε, δ)-DP, minimised over the orders.

Two conversions, for a mechanism that is :math:`(\alpha, r_\alpha)`-RDP at each order:

* **improved** (default): Balle, Barthe, Gaboardi, Hsu, Sato (2020), Thm. 21 = Canonne,
  Kamath, Steinke (2020), Prop. 12 (the equation dp_accounting cites as "2001.05990 Eq. 20"),

  .. math:: \varepsilon = r_\alpha + \log(1 - 1/\alpha) - \frac{\log\delta + \log\alpha}{\alpha - 1},
            \qquad \log\delta = (\alpha-1)(r_\alpha - \varepsilon + \log(1-1/\alpha)) - \log\alpha;

* **classic**: Mironov (2017), Prop. 3, :math:`\varepsilon = r_\alpha + \log(1/\delta)/(\alpha-1)`.

Both also use the bound through the KL divergence, valid at every order since
:math:`D_1 \le D_\alpha`: :math:`\delta \le \sqrt{1 - e^{-r_\alpha}}` gives ε = 0 whenever
:math:`\delta^2 \ge 1 - e^{-r_\alpha}`.

Rounding never makes ε or δ smaller than the truth: the RDP values are raised by the
kernel's error allowance before converting (float64: 4096 ulps, 9.1e-13, above the worst
float64 error seen across compilations — 952 ulps for one point compiled for 8 CPU devices,
≤ 100 ulps on one device; float32: 2e-3, above the worst float32 errors measured, 1.1e-4 on
20,000 random points of the parameter box, 1.8e-4 at one point of a sweep and 7.3e-4 at
q = 2.0e-7, σ = 5.76, α = 1024, which occur where log A is small but α²/σ² is large), and the
result is raised by a few more ulps for the
conversion's own rounding. float32 ε is therefore conservative by up to ~2e-3 relative; use
float64 for the tightest reported ε.

Orders that give no information are skipped rather than allowed to poison the minimum:
NaN orders or NaN RDP values count as +inf; α = ∞ uses the limit ε = r_∞ (dp_accounting's
argmin picks the NaN it computes there and reports ε = 0). Every branch is computed with
safe stand-ins so that the result is differentiable in ``rdp`` without NaN gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrdp._internal import compilation
from jaxrdp._internal import numerics
from jaxrdp._internal import validation

METHODS = ("improved", "classic")   # the conversions of compute_epsilon's ``method``
_RDP_ULPS = 4096            # relative accuracy assumed of float64 RDP values, in units of eps
_RDP_REL_ERROR_FLOAT32 = 2e-3     # ... and of float32 ones (see the module docstring)
_OUTPUT_ULPS = 8            # rounding allowance of the conversion formulas, in units of eps


def _round_up(rdp):
  """RDP raised by its assumed relative error, so that every later step is on the safe side."""
  finfo = jnp.finfo(rdp.dtype)
  rel = _RDP_REL_ERROR_FLOAT32 if finfo.bits <= 32 else _RDP_ULPS * float(finfo.eps)
  return rdp * (1 + rel)


def _check_curve(orders, rdp):
  validation.check("curve_orders", orders, name="orders")
  validation.check("rdp", rdp)
  orders = validation.as_float_array(orders)
  rdp = validation.as_float_array(rdp)
  if orders.ndim != 1 or rdp.ndim < 1 or rdp.shape[-1] != orders.shape[0]:
    raise ValueError("orders must be 1-D and rdp must end with an axis of the same length; got "
                     f"orders.shape={orders.shape}, rdp.shape={rdp.shape}.")
  dtype = jnp.result_type(orders, rdp)
  return orders.astype(dtype), rdp.astype(dtype)


def _best_over_orders(values, orders):
  """(min over the last axis, the order attaining it); NaN-free gradient to the argmin."""
  idx = jnp.argmin(values, axis=-1)[..., None]
  best = jnp.take_along_axis(values, idx, axis=-1)[..., 0]
  order = jnp.take_along_axis(jnp.broadcast_to(orders, values.shape), idx, axis=-1)[..., 0]
  return best, order


def _check_method(method):
  validation.check_choice("method", method, METHODS)


@compilation.on_host
def compute_epsilon(orders: jax.typing.ArrayLike, rdp: jax.typing.ArrayLike,
                    delta: jax.typing.ArrayLike, *, method: str = "improved"
                    ) -> tuple[jax.Array, jax.Array]:
  r"""Smallest ε over the orders such that the RDP curve implies (ε, δ)-DP.

  Args:
    orders: 1-D array of K orders ≥ 1 (``inf`` and NaN allowed; NaN orders are skipped).
    rdp: RDP values, shape ``(..., K)``, ≥ 0.
    delta: δ in (0, 1), broadcasting against ``rdp.shape[:-1]``.
    method: ``"improved"`` (Balle et al. 2020 Thm. 21 / Canonne–Kamath–Steinke 2020 Prop. 12)
      or ``"classic"`` (Mironov 2017 Prop. 3).

  Returns:
    ``(epsilon, order)``: ε ≥ 0 and the order that attains it, each of shape
    ``broadcast(rdp.shape[:-1], delta.shape)``. ε is +inf when no order gives a finite bound.
    Under ``jax.jit`` both are NaN where δ, or an order or RDP value of the curve, lies
    outside its range (NaN entries of the curve are allowed: skipped).
    Differentiable with respect to ``rdp`` (the gradient flows to the optimal order). A pair,
    as dp_accounting's ``compute_epsilon`` and TF Privacy's ``get_privacy_spent`` return: a
    caller that holds an RDP curve chooses its order grid, and the binding order shows whether
    the grid was wide enough (an order at the end of the grid means it was not).
    :func:`jaxrdp.dpsgd_epsilon` returns ε alone.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Balle, Barthe, Gaboardi, Hsu, Sato, "Hypothesis testing interpretations and Rényi
    differential privacy", AISTATS 2020, Thm. 21; Canonne, Kamath, Steinke, "The discrete
    Gaussian for differential privacy", 2020, Prop. 12; Mironov, "Rényi differential privacy",
    2017, Prop. 3.
  """
  _check_method(method)
  orders, rdp = _check_curve(orders, rdp)
  validation.check("delta", delta)
  validation.check_broadcast(**{"rdp.shape[:-1]": jax.ShapeDtypeStruct(rdp.shape[:-1], rdp.dtype), "delta": delta})
  delta = validation.as_float_array(delta).astype(rdp.dtype)
  return _epsilon_and_order(orders, rdp, delta, method)


@compilation.jit(static_argnames=("method",))
def _epsilon_and_order(orders, rdp, delta, method):
  """compute_epsilon after its checks, as one compiled program: run operation by operation,
  a first call compiled each of its ~40 operations on its own (1.6 s in a fresh process)."""
  eps = epsilon_at_orders(orders, rdp, delta[..., None], method)
  best, order = _best_over_orders(eps, orders)
  valid = validation.in_domain("delta", delta) & _valid_curve(orders, rdp)
  return jnp.where(valid, best, jnp.nan), jnp.where(valid, order, jnp.nan)


def _valid_curve(orders, rdp):
  """Under jit, where the eager checks do not run: each curve (the last axis) whose orders and
  values lie in their domains. NaN entries are allowed (skipped as no information), but the
  conversion would skip a negative order or RDP value just as silently, and a negative RDP
  value, read as a tighter guarantee, gives a plausible, wrong ε or δ (0 for RDP -1)."""
  return (jnp.all(validation.in_domain("curve_orders", orders))
          & jnp.all(validation.in_domain("rdp", rdp), axis=-1))


def epsilon_at_orders(orders, rdp, delta, method="improved"):
  """ε implied at each order separately (broadcasting; no minimum, no argument checks): the
  internal form of :func:`compute_epsilon`, for callers that take the minimum themselves.
  Raised for the conversion's own rounding, so min over orders equals compute_epsilon's ε."""
  usable = ~jnp.isnan(orders) & ~jnp.isnan(rdp) & (orders >= 1)
  finite_order = jnp.isfinite(orders) & (orders > 1)
  a = jnp.where(finite_order, orders, 2.0)
  r = jnp.where(usable & jnp.isfinite(rdp), _round_up(rdp), 0.0)
  log_delta = jnp.log(delta)
  if method == "improved":
    eps = r + numerics.log1p(-1 / a) - (log_delta + jnp.log(a)) / (a - 1)
  else:
    eps = r - log_delta / (a - 1)
  inf = jnp.full_like(eps, jnp.inf)
  eps = jnp.where(finite_order, eps, jnp.where(jnp.isinf(orders), r, inf))  # alpha = inf: eps = r
  # KL bound: delta >= sqrt(1 - exp(-r)) already gives (0, delta)-DP.
  kl_enough = jnp.isfinite(rdp) & (delta * delta + jnp.expm1(-r) >= 0)
  eps = jnp.where(kl_enough, jnp.zeros_like(eps), eps)
  eps = jnp.where(jnp.isinf(rdp), inf, eps)
  eps = jnp.where(usable, eps, inf)
  return jnp.maximum(eps, 0.0) * (1 + _OUTPUT_ULPS * jnp.finfo(eps.dtype).eps)


def epsilon_partials(order, eps, delta):
  r"""(∂ε/∂r, ∂ε/∂δ) of :func:`epsilon_at_orders` (the improved conversion) at one finite
  order α > 1, where it gave ``eps``: in closed form rather than by differentiating it, so
  that a derivative's graph holds none of its logarithms (each an XLA kernel of its own on a
  scalar). Where ε > 0 (and finite), ε = (1 + u)(r(1 + ρ) + log(1 − 1/α) − (log δ + log α)/(α − 1))
  with ρ the RDP's rounding allowance and u the output's: ∂ε/∂r = (1 + u)(1 + ρ),
  ∂ε/∂δ = −(1 + u)/((α − 1) δ). Elsewhere both are 0, as JAX's derivative of the same
  function gives them: ε = 0 (the KL bound, or a negative value clipped) and ε = +inf (an
  infinite RDP) are constant in r and δ there."""
  dtype = eps.dtype
  finfo = jnp.finfo(dtype)
  rel = _RDP_REL_ERROR_FLOAT32 if finfo.bits <= 32 else _RDP_ULPS * float(finfo.eps)
  inflate = 1 + _OUTPUT_ULPS * finfo.eps
  live = (eps > 0) & jnp.isfinite(eps)
  d_r = jnp.where(live, inflate * (1 + rel), 0.0).astype(dtype)
  d_delta = jnp.where(live, -inflate / (order - 1) / jnp.where(live, delta, 1.0), 0.0)
  return d_r, d_delta.astype(dtype)


@compilation.on_host
def compute_delta(orders: jax.typing.ArrayLike, rdp: jax.typing.ArrayLike,
                  epsilon: jax.typing.ArrayLike, *, method: str = "improved"
                  ) -> tuple[jax.Array, jax.Array]:
  r"""Smallest δ over the orders such that the RDP curve implies (ε, δ)-DP.

  Args:
    orders: 1-D array of K orders ≥ 1 (``inf`` and NaN allowed; NaN orders are skipped).
    rdp: RDP values, shape ``(..., K)``, ≥ 0.
    epsilon: ε ≥ 0, broadcasting against ``rdp.shape[:-1]``.
    method: ``"improved"`` or ``"classic"``, as in :func:`compute_epsilon`.

  Returns:
    ``(delta, order)``: δ in [0, 1] and the order that attains it. Under ``jax.jit`` both are
    NaN where ε, or an order or RDP value of the curve, lies outside its range (NaN entries of
    the curve are allowed: skipped).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    As :func:`compute_epsilon`; the KL bound δ ≤ √(1 − e^{−r}) as in dp_accounting.
  """
  _check_method(method)
  orders, rdp = _check_curve(orders, rdp)
  validation.check("epsilon", epsilon)
  validation.check_broadcast(**{"rdp.shape[:-1]": jax.ShapeDtypeStruct(rdp.shape[:-1], rdp.dtype), "epsilon": epsilon})
  eps = validation.as_float_array(epsilon).astype(rdp.dtype)[..., None]
  return _delta_and_order(orders, rdp, eps, method)


@compilation.jit(static_argnames=("method",))
def _delta_and_order(orders, rdp, eps, method):
  """compute_delta after its checks, as one compiled program (see :func:`_epsilon_and_order`)."""
  usable = ~jnp.isnan(orders) & ~jnp.isnan(rdp) & (orders >= 1)
  finite_order = jnp.isfinite(orders) & (orders > 1)
  a = jnp.where(finite_order, orders, 2.0)
  r_finite = jnp.isfinite(rdp) & usable
  r = jnp.where(r_finite, _round_up(rdp), 1.0)
  inf = jnp.full(jnp.broadcast_shapes(r.shape, eps.shape), jnp.inf, r.dtype)
  # KL bound, 0.5 log(1 - e^{-r}); -inf at r = 0.
  r_pos = jnp.where(r > 0, r, 1.0)
  log_kl = jnp.where(r > 0, 0.5 * jnp.log(-jnp.expm1(-r_pos)), -inf)
  gap = r - eps
  if method == "improved":
    log_rdp = (a - 1) * (gap + numerics.log1p(-1 / a)) - jnp.log(a)
  else:
    log_rdp = (a - 1) * gap
  # alpha = inf: delta = 0 when r <= eps, no bound otherwise.
  log_inf_order = jnp.where(gap <= 0, -inf, inf)
  log_rdp = jnp.where(finite_order, log_rdp, jnp.where(jnp.isinf(orders), log_inf_order, inf))
  log_delta = jnp.minimum(log_kl, log_rdp)
  log_delta = jnp.where(jnp.isinf(eps) & r_finite, -inf, log_delta)
  log_delta = jnp.where(r_finite, log_delta, inf)
  best, order = _best_over_orders(log_delta, orders)
  # Under jit: a negative or NaN ε, or a curve outside its domain, gives NaN.
  bad = ~(validation.in_domain("epsilon", eps[..., 0]) & _valid_curve(orders, rdp))
  # Rounding allowance of log(delta) itself (absolute, in units of eps times its size).
  best = best + _OUTPUT_ULPS * jnp.finfo(best.dtype).eps * (1 + jnp.abs(jnp.where(jnp.isfinite(best), best, 0.0)))
  return jnp.where(bad, jnp.nan, jnp.minimum(jnp.exp(best), 1.0)), jnp.where(bad, jnp.nan, order)


def composed_epsilons(orders, rdp, delta):
  """ε at each of ``orders`` of the RDP summed over the leading (phase) axis of ``rdp``, NaN
  as +inf (no information: a search skips it)."""
  eps = epsilon_at_orders(orders, jnp.sum(rdp, axis=0), delta)
  return jnp.where(jnp.isnan(eps), jnp.inf, eps)
