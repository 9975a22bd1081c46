r"""RDP of the Gaussian mechanism (Mironov 2017, Prop. 7 and Cor. 3).

For a query of L2 sensitivity Δ released with noise N(0, σ²Δ²) (σ the noise multiplier),

.. math:: D_\alpha\big(N(0, \sigma^2) \,\|\, N(1, \sigma^2)\big) = \frac{\alpha}{2\sigma^2}.

This is the Poisson-sampled Gaussian mechanism at q = 1 (``rdp_sampled_gaussian(1, σ, α)``
gives the same value), and ρ-zCDP with ρ = 1/(2σ²).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrdp._internal import validation


def rdp_gaussian(noise_multiplier: jax.typing.ArrayLike, orders: jax.typing.ArrayLike) -> jax.Array:
  r"""RDP ε(α) = α/(2σ²) of one application of the Gaussian mechanism.

  Broadcasts ``noise_multiplier`` against ``orders`` (for a batch of σ times a 1-D array of
  orders, pass ``sigma[:, None]``). Jittable, vmappable, differentiable; computes in the
  floating dtype of its inputs.

  Args:
    noise_multiplier: σ, the noise standard deviation divided by the L2 sensitivity, ≥ 0.
    orders: Rényi orders α ≥ 1 (``inf`` allowed).

  Returns:
    α/(2σ²); at α = 1 the KL divergence 1/(2σ²); +inf at α = ∞ or σ = 0. Under ``jax.jit``
    (where the eager range checks cannot run) σ < 0, α < 1 or NaN give NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Mironov, "Rényi differential privacy", CSF 2017, arXiv:1702.07476, Prop. 7 and Cor. 3
    (Table II).
  """
  validation.check("noise_multiplier", noise_multiplier)
  validation.check("orders", orders)
  validation.check_broadcast(noise_multiplier=noise_multiplier, orders=orders)
  sigma = validation.as_float_array(noise_multiplier)
  alpha = validation.as_float_array(orders)
  return _rdp_gaussian(sigma, alpha)


@jax.jit
def _rdp_gaussian(sigma, alpha):
  dtype = jnp.result_type(sigma, alpha)
  sigma, alpha = jnp.broadcast_arrays(sigma.astype(dtype), alpha.astype(dtype))
  finite = (sigma > 0) & jnp.isfinite(alpha)
  s = jnp.where(finite, sigma, 1.0)
  a = jnp.where(finite, alpha, 1.0)
  out = jnp.where(finite, a / (2 * s * s), jnp.inf)
  valid = validation.in_domain("noise_multiplier", sigma) & validation.in_domain("orders", alpha)
  return jnp.where(valid, out, jnp.nan)
