r"""Closed-form RDP bound of the Poisson-sampled Gaussian mechanism (Mironov–Talwar–Zhang, Thm. 11).

Mironov, Talwar, Zhang (2019), "Rényi Differential Privacy of the Sampled Gaussian
Mechanism", arXiv:1908.10530, Sec. 3.2, Theorem 11 (built from Lemmas 9 and 10): if

* :math:`q \le 1/5`, :math:`\sigma \ge 4`, and, with :math:`L = \log\big(1 + \frac{1}{q(\alpha-1)}\big)`,
* (4) :math:`1 < \alpha \le \tfrac12\sigma^2 L - 2\log\sigma`,
* (5) :math:`\alpha \le \dfrac{\tfrac12\sigma^2 L^2 - \log 5 - 2\log\sigma}{L + \log(q\alpha) + 1/(2\sigma^2)}`,

then the sampled Gaussian mechanism with sampling rate q and noise multiplier σ is
:math:`(\alpha,\ 2q^2\alpha/\sigma^2)`-RDP.

(The seed text of the paper lost its displayed equations; conditions (4) and (5) are the ones
its proof uses: (4) with :math:`z_0 = \tfrac12 + \sigma^2 L` gives :math:`z_0 > 2\alpha`, and the
denominator of (5) is positive because :math:`L + \log(q\alpha) = \log(q\alpha + \alpha/(\alpha-1))`.
Independently, ``tests/test_closed_form.py`` checks the bound against the exact RDP on a dense
grid of the region, and ``tools/closed_form_tightness.py`` measures how loose it is.)

Everything outside the theorem's conditions is answered with ``+inf``: no guarantee is
claimed there, which is the safe reading of a conditional bound. The conditions are
evaluated with a safety margin of a few ulps of their terms, so a point that satisfies them
only through rounding is also answered with ``+inf``; ``q ≤ 1/5`` is checked against the
largest float not above 1/5 (the binary float nearest to 0.2 is slightly *above* 1/5, so
``q = 0.2`` lies outside). At α = 1 the KL divergence is bounded by the limit
:math:`2q^2/\sigma^2` (RDP is non-decreasing in α and the conditions hold for all α close to 1),
and q = 0 gives 0.
"""

from __future__ import annotations

import fractions
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxrdp._internal import validation

_MARGIN_ULPS = 16   # safety margin of the conditions, in ulps of the sum of their terms' sizes
_ROUND_UP_ULPS = 4  # 2q²α/σ² takes four roundings (≤ 2 ulps); the result is raised by this


def rdp_sampled_gaussian_closed_form(sampling_rate: jax.typing.ArrayLike,
                                     noise_multiplier: jax.typing.ArrayLike,
                                     orders: jax.typing.ArrayLike) -> jax.Array:
  r"""Theorem 11's bound 2q²α/σ² on the RDP of the Poisson-sampled Gaussian, +inf outside it.

  Broadcasts ``sampling_rate``, ``noise_multiplier`` and ``orders`` (as
  :func:`jaxrdp.rdp_sampled_gaussian`). Jittable, vmappable, differentiable (the gradient of
  2q²α/σ² where the bound applies, 0 where the result is +inf); computes in the floating dtype
  of its inputs. The bound is always at least the exact value
  ``rdp_sampled_gaussian(q, σ, α)``; it is within a small factor of it (see
  ``tools/closed_form_tightness.py``), and costs nothing to evaluate.

  Args:
    sampling_rate: q, the Poisson sampling probability, in [0, 1].
    noise_multiplier: σ, the noise standard deviation divided by the L2 sensitivity, ≥ 0.
    orders: Rényi orders α ≥ 1 (``inf`` allowed).

  Returns:
    :math:`2q^2\alpha/\sigma^2` (raised by 4 ulps for its own rounding) where
    :math:`0 < q \le 1/5`, :math:`\sigma \ge 4` and α satisfies conditions (4) and (5) of the
    theorem (see the module docstring); :math:`2q^2/\sigma^2` at α = 1 when q ≤ 1/5 and σ ≥ 4;
    0 where q = 0; +inf everywhere else (no guarantee claimed, including q = 0.2 as a binary
    float, which exceeds 1/5). Under ``jax.jit`` (where the eager range checks cannot run)
    q outside [0, 1], σ < 0, α < 1 or NaN give NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Mironov, Talwar, Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
    arXiv:1908.10530, Sec. 3.2, Theorem 11 (Lemmas 9 and 10).
  """
  validation.check("sampling_rate", sampling_rate)
  validation.check("noise_multiplier", noise_multiplier)
  validation.check("orders", orders)
  validation.check_broadcast(sampling_rate=sampling_rate, noise_multiplier=noise_multiplier,
                              orders=orders)
  q = validation.as_float_array(sampling_rate)
  sigma = validation.as_float_array(noise_multiplier)
  alpha = validation.as_float_array(orders)
  return _closed_form(q, sigma, alpha)


def _largest_float_at_most_one_fifth(dtype):
  fifth = np.asarray(0.2, dtype)
  # Compared exactly (as rationals): the float nearest to 0.2 lies above 1/5 in binary32 and
  # binary64 alike, so this steps down one ulp.
  if fractions.Fraction(float(fifth)) > fractions.Fraction(1, 5):
    fifth = np.nextafter(fifth, np.asarray(0, dtype))
  return float(fifth)


@jax.jit
def _closed_form(q, sigma, alpha):
  dtype = jnp.result_type(q, sigma, alpha)
  q, sigma, alpha = jnp.broadcast_arrays(q.astype(dtype), sigma.astype(dtype), alpha.astype(dtype))
  eps = float(jnp.finfo(dtype).eps)
  tiny = float(jnp.finfo(dtype).tiny)

  in_box = (q > 0) & (q <= _largest_float_at_most_one_fifth(dtype)) & (sigma >= 4)
  finite = jnp.isfinite(alpha) & jnp.isfinite(sigma)
  # Safe stand-ins (double-where): every branch below stays finite, so no NaN gradients.
  ok = in_box & finite
  q_s = jnp.where(ok, q, 0.1)
  s_s = jnp.where(ok, sigma, 4.0)
  a_s = jnp.where(ok & (alpha > 1), alpha, 2.0)

  # L = log(1 + 1/x), x = q(α − 1): log1p(1/x) for x ≥ 1; log1p(x) − log(x) for x < 1, a sum
  # of two positive terms (no cancellation) that does not overflow for tiny x. Where x
  # underflows, the clamp makes L smaller than the truth, which only tightens both conditions
  # (both slacks increase with L wherever (4) holds).
  x = jnp.maximum(q_s * (a_s - 1), tiny)
  big_x = x >= 1
  big_l = jnp.where(big_x, jnp.log1p(1 / jnp.where(big_x, x, 1.0)),
                    jnp.log1p(jnp.where(big_x, 0.5, x)) - jnp.log(jnp.where(big_x, 0.5, x)))
  s2 = s_s * s_s
  log_s = jnp.log(s_s)
  log5 = math.log(5.0)
  # (4): α ≤ σ²L/2 − 2 log σ.
  t1 = 0.5 * s2 * big_l
  slack4 = t1 - 2 * log_s - a_s
  size4 = t1 + 2 * jnp.abs(log_s) + a_s
  # (5): α (L + log(qα) + 1/(2σ²)) ≤ σ²L²/2 − log 5 − 2 log σ (the bracket is > 0, see above).
  log_qa = jnp.log(q_s * a_s)
  t2 = 0.5 * s2 * big_l * big_l
  denom = big_l + log_qa + 0.5 / s2
  slack5 = t2 - log5 - 2 * log_s - a_s * denom
  size5 = t2 + log5 + 2 * jnp.abs(log_s) + a_s * (big_l + jnp.abs(log_qa) + 0.5 / s2)
  margin = _MARGIN_ULPS * eps
  conditions = (slack4 > margin * size4) & (slack5 > margin * size5) & (denom > 0)
  holds = ok & ((alpha == 1) | ((alpha > 1) & conditions))

  a_b = jnp.where(alpha == 1, 1.0, a_s)
  bound = 2 * q_s * q_s * a_b / s2 * (1 + _ROUND_UP_ULPS * eps)
  out = jnp.where(holds, bound, jnp.inf)
  out = jnp.where(q == 0, 0.0, out)
  valid = (validation.in_domain("sampling_rate", q) & validation.in_domain("orders", alpha)
           & validation.in_domain("noise_multiplier", sigma))
  return jnp.where(valid, out, jnp.nan).astype(dtype)
