r"""RDP of the Laplace mechanism (Mironov 2017, Prop. 6 and Cor. 2).

For a query of L1 sensitivity Δ released with Laplace noise of scale bΔ, let ε₀ = 1/b (the
mechanism is ε₀-DP). With β = α − 1, Mironov's Prop. 6 reads

.. math:: \varepsilon(\alpha) = \frac{1}{\beta}\log\Big(\frac{\alpha}{2\alpha-1}e^{\beta\varepsilon_0}
          + \frac{\beta}{2\alpha-1}e^{-\alpha\varepsilon_0}\Big)
          = \varepsilon_0 + \frac{1}{\beta}\log\Big(1 + \beta\,
            \frac{\mathrm{expm1}(-(2\alpha-1)\varepsilon_0)}{2\alpha-1}\Big),

with limits ε(1) = ε₀ + e^{−ε₀} − 1 (the KL divergence) and ε(∞) = ε₀.

The second form ("far" branch, used when βε₀ > 1) loses nothing there: ε ≥ 0.3 ε₀ and the
log1p argument lies in (−1/2, 0]. Near α = 1 or for small ε₀ both forms cancel (ε ≈ αε₀²/2
is a small difference of O(ε₀) terms, and the log is 0/0 at α = 1). The "near" branch
(βε₀ ≤ 1) rewrites the argument of the log as 1 + S with, writing φ(t) = e^t − 1 − t ≥ 0,

.. math:: S = \frac{(\beta+1)\,\varphi(\beta\varepsilon_0) + \beta\,\varphi(-\alpha\varepsilon_0)}{2\beta+1}
          \qquad(\text{the first-order terms } \pm\beta\alpha\varepsilon_0 \text{ cancel exactly}),

a sum of non-negative terms, and divides by β analytically, φ(βε₀)/β = ε₀·ψ(βε₀) with
ψ(t) = φ(t)/t:

.. math:: \varepsilon(\alpha) = R \cdot \frac{\log(1 + \beta R)}{\beta R}, \qquad
          R = \frac{S}{\beta} = \frac{(\beta+1)\,\varepsilon_0\,\psi(\beta\varepsilon_0)
              + \varphi(-\alpha\varepsilon_0)}{2\beta+1}.

At β = 0 this is exactly φ(−ε₀) = ε₀ + e^{−ε₀} − 1, so α = 1 needs no special case and the
gradient in α is smooth through it. ψ, φ and log1p(x)/x come from :mod:`jaxrdp._internal.numerics`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrdp._internal import numerics
from jaxrdp._internal import validation


def rdp_laplace(scale: jax.typing.ArrayLike, orders: jax.typing.ArrayLike) -> jax.Array:
  r"""RDP ε(α) of one application of the Laplace mechanism.

  Broadcasts ``scale`` against ``orders``. Jittable, vmappable, differentiable in ``scale``
  and ``orders`` (also at α = 1); computes in the floating dtype of its inputs. Accurate to a
  few ulps of the result at every order, including α → 1, α → ∞ and tiny or huge ε₀.

  Args:
    scale: b, the Laplace scale divided by the L1 sensitivity, ≥ 0 (ε₀ = 1/b).
    orders: Rényi orders α ≥ 1 (``inf`` allowed).

  Returns:
    ε(α) as in the module docstring: ε₀ + e^{−ε₀} − 1 at α = 1, ε₀ at α = ∞, +inf for
    b = 0. Under ``jax.jit`` (where the eager range checks cannot run) b < 0, α < 1 or NaN
    give NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Mironov, "Rényi differential privacy", CSF 2017, arXiv:1702.07476, Prop. 6, Cor. 2 and
    Table II (the α = 1 and α = ∞ limits).
  """
  validation.check("scale", scale)
  validation.check("orders", orders)
  validation.check_broadcast(scale=scale, orders=orders)
  b = validation.as_float_array(scale)
  alpha = validation.as_float_array(orders)
  return _rdp_laplace(b, alpha)


@jax.jit
def _rdp_laplace(b, alpha):
  dtype = jnp.result_type(b, alpha)
  b, alpha = jnp.broadcast_arrays(b.astype(dtype), alpha.astype(dtype))
  eps0 = 1 / jnp.where(b > 0, b, 1.0)
  finite_order = jnp.isfinite(alpha) & (alpha >= 1)
  beta = jnp.where(finite_order, alpha, 2.0) - 1
  near = beta * eps0 <= 1

  # Near branch (beta * eps0 <= 1): a sum of non-negative terms, no division by beta.
  bn = jnp.where(near, beta, 0.0)
  # (beta+1)/(2beta+1) and 1/(2beta+1) written so that neither overflows for huge beta.
  inv = 1 / (2 * bn + 1)
  r = ((0.5 + 0.5 * inv) * eps0 * numerics.exprel_minus_one(bn * eps0)
       + inv * numerics.expm1_minus_x(-(bn + 1) * eps0))
  near_value = r * numerics.log1p_over_x(bn * r)

  # Far branch (beta * eps0 > 1): Mironov's form, its log1p argument in (-1/2, 0].
  bf = jnp.where(near, 1.0, beta)
  c = jnp.expm1(-(2 * bf + 1) * eps0) / (2 * bf + 1)
  far_value = eps0 + c * numerics.log1p_over_x(bf * c)

  out = jnp.where(near, near_value, far_value)
  out = jnp.where(jnp.isinf(alpha), eps0, out)
  out = jnp.where(b == 0, jnp.inf, out)
  valid = validation.in_domain("scale", b) & validation.in_domain("orders", alpha)
  return jnp.where(valid, out, jnp.nan)
