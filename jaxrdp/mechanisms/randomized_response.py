r"""RDP of binary randomized response (Mironov 2017, Prop. 5).

A predicate is reported truthfully with probability p ∈ [1/2, 1] and flipped otherwise; the
mechanism is t-DP with t = log(p/(1−p)). With β = α − 1, Mironov's Prop. 5 reads

.. math:: \varepsilon(\alpha) = \frac{1}{\beta}\log\big(p^\alpha(1-p)^{1-\alpha} + (1-p)^\alpha p^{1-\alpha}\big)
          = \frac{1}{\beta}\log\big(p\,e^{\beta t} + (1-p)\,e^{-\beta t}\big),

with limits ε(1) = (2p − 1)·t (the KL divergence) and ε(∞) = t (Table II). The same curve is
the tight RDP of any t-DP mechanism (it is the worst case; see Steinke's note "Tight RDP & zCDP
bounds from pure DP", 2024, Thm. 4).

Two exact rewritings avoid cancellation (t is computed as log1p((2p−1)/(1−p)), in which
2p − 1 and 1 − p are exact in floating point for p ∈ [1/2, 1]):

* far branch, βt > 1 (no overflow; ε ≥ 0.3 t there, so adding t loses nothing):

  .. math:: \varepsilon(\alpha) = t + \frac{1}{\beta}\log1p\big((1-p)\,\mathrm{expm1}(-2\beta t)\big);

* near branch, βt ≤ 1 (α → 1 without 0/0, and p → 1/2 without cancellation):
  p e^{βt} + (1−p) e^{−βt} = 1 + S with S = (2p−1) sinh(βt) + 2 sinh²(βt/2) ≥ 0 a sum of
  non-negative terms, and

  .. math:: \varepsilon(\alpha) = R\cdot\frac{\log(1+\beta R)}{\beta R}, \qquad
            R = \frac{S}{\beta} = t\Big((2p-1)\,\frac{\sinh\beta t}{\beta t}
                + \frac{\beta t}{2}\Big(\frac{\sinh(\beta t/2)}{\beta t/2}\Big)^2\Big),

  which at β = 0 is exactly (2p − 1)·t.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrdp._internal import numerics
from jaxrdp._internal import validation


def rdp_randomized_response(p: jax.typing.ArrayLike, orders: jax.typing.ArrayLike) -> jax.Array:
  r"""RDP ε(α) of binary randomized response that tells the truth with probability ``p``.

  Broadcasts ``p`` against ``orders``. Jittable, vmappable, differentiable in ``p`` and
  ``orders`` (also at α = 1 and p = 1/2); computes in the floating dtype of its inputs.

  Args:
    p: probability of reporting the true bit, in [0.5, 1] (p < 1/2 is the same mechanism as
      1 − p with the output relabelled; pass ``max(p, 1 - p)``).
    orders: Rényi orders α ≥ 1 (``inf`` allowed).

  Returns:
    ε(α) as in the module docstring: (2p − 1)·log(p/(1−p)) at α = 1, log(p/(1−p)) at α = ∞,
    0 at every order for p = 1/2 and +inf at every order for p = 1. Under ``jax.jit`` (where
    the eager range checks cannot run) p outside [0.5, 1], α < 1 or NaN give NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Mironov, "Rényi differential privacy", CSF 2017, arXiv:1702.07476, Prop. 5 and Table II.
  """
  validation.check("p", p)
  validation.check("orders", orders)
  validation.check_broadcast(p=p, orders=orders)
  p = validation.as_float_array(p)
  alpha = validation.as_float_array(orders)
  return _rdp_randomized_response(p, alpha)


@jax.jit
def _rdp_randomized_response(p, alpha):
  dtype = jnp.result_type(p, alpha)
  p, alpha = jnp.broadcast_arrays(p.astype(dtype), alpha.astype(dtype))
  inside = (p > 0.5) & (p < 1)
  ps = jnp.where(inside, p, 0.75)
  gap = 2 * ps - 1        # exact
  lie = 1 - ps            # exact
  t = numerics.log1p(gap / lie)
  finite_order = jnp.isfinite(alpha) & (alpha >= 1)
  beta = jnp.where(finite_order, alpha, 2.0) - 1
  near = beta * t <= 1

  bn = jnp.where(near, beta, 0.0)
  u = bn * t
  half = 0.5 * u
  r = t * (gap * numerics.sinhc(u) + half * jnp.square(numerics.sinhc(half)))
  near_value = r * numerics.log1p_over_x(bn * r)

  bf = jnp.where(near, 1.0, beta)
  far_value = t + numerics.log1p(lie * jnp.expm1(-2 * bf * t)) / bf

  out = jnp.where(near, near_value, far_value)
  out = jnp.where(jnp.isinf(alpha), t, out)
  out = jnp.where(p == 0.5, 0.0, out)
  out = jnp.where(p == 1, jnp.inf, out)
  valid = validation.in_domain("p", p) & validation.in_domain("orders", alpha)
  return jnp.where(valid, out, jnp.nan)
