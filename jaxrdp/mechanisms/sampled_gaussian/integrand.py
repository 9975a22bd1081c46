r"""The integrand of the per-order quadrature, and where its nodes go.

Because :math:`E_{\mu_0}[L - 1] = 0`, with :math:`x = q(L-1)`,

.. math:: \frac{A_\alpha - 1}{\alpha - 1} = E_{\mu_0}\Big[\frac{(1+x)^\alpha - 1 - \alpha x}{\alpha - 1}\Big],

the expectation of a **non-negative** function (convexity of :math:`(1+x)^\alpha`), whose
logarithm :func:`_integrand` evaluates without cancellation (float32 included). At
:math:`\alpha = 1` the integrand becomes :math:`(1+x)\log(1+x) - x` and the same formula gives
the KL divergence (the RDP limit).

The integrand has at most three bumps (near 0, near 2, and the right mode of
:math:`z = \alpha p(z)`, :math:`p = qL/(1-q+qL)`), so nodes are placed in two windows found by
bracketed bisection (:func:`_modes`, :func:`_placement`); where the integrand is not
negligible between them, the two windows become the halves of one uniform grid. The windows
only decide where to look: they are not differentiated, and every result is still certified
(:mod:`jaxrdp.mechanisms.sampled_gaussian.quadrature`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxrdp._internal import loops
from jaxrdp.mechanisms.sampled_gaussian.common import (_HALF_WIDTH, _SERIES_RADIUS, _SERIES_TERMS,
                                                       _exp_floor, _log_exprel_nonpositive,
                                                       _softplus, _where)

_RATIO_CAP = 0.999        # N/P <= 0.95 wherever the direct branch is used
_BISECTION_STEPS = 40
_TAIL_STEPS = 24


def _integrand(center, offset, sigma, log_q, log1m_q, q, alpha):
  r"""(m, local): the log of the integrand :math:`\varphi_\sigma(z)\, g_\alpha(x)`, :math:`x = q(e^u - 1)`, :math:`u = (2z-1)/(2\sigma^2)`,

  where :math:`g_\alpha(x) = ((1+x)^\alpha - 1 - \alpha x)/(\alpha - 1) \ge 0`.

  Precision: :math:`-z^2/(2\sigma^2)` and :math:`\log g` are each huge near the right mode
  (:math:`\sim\alpha^2/\sigma^2`) while their sum is what matters. With the local power
  :math:`m \in \{0, 2, \alpha\}` of :math:`L = e^u` in :math:`g` (:math:`g \approx x^2` for
  small x, :math:`g \approx (qL)^\alpha` for large x), the identity
  :math:`-z^2/(2\sigma^2) + m u = m(m-1)/(2\sigma^2) - (z-m)^2/(2\sigma^2)` leaves only terms
  of the size of the result, which is what keeps float32 within 1e-5.

  :math:`g` itself, without cancellation beyond a factor ~12:

  * :math:`|x| \le \min(0.1, 1/(2\alpha))`: Taylor series
    :math:`g = \tfrac{\alpha}{2} x^2 \sum_j c_j x^j`, :math:`c_{j+1} = c_j (\alpha-2-j)/(j+3)`.
  * otherwise :math:`g = P - N` with :math:`0 \le N \le P`, in log space, :math:`\ell = \log(1+x)`,
    :math:`\beta = \alpha - 1`: for :math:`x > 0`,
    :math:`P = e^{\alpha\ell}\,\ell\,\mathrm{exprel}(-\beta\ell)`, :math:`N = x`; for :math:`x < 0`,
    :math:`P = -x`, :math:`N = -(1+x)\,\ell\,\mathrm{exprel}(\beta\ell)`.

  The node is :math:`z = \mathrm{center} + \mathrm{offset}`, passed in two parts so that
  :math:`z - m` keeps full precision when z is large (z ~ alpha ~ 4096 with sigma ~ 0.1 in
  float32). The log integrand is :math:`m(m-1)/(2\sigma^2) + \mathrm{local}`; the large
  constant is returned as m so that callers can sum relative to the constant of a reference
  power (:func:`_relative_to`), exactly.

  ``local`` is ``-inf`` where :math:`x = 0` exactly (the integrand's double zero at z = 1/2).
  """
  z = center + offset
  dtype = z.dtype
  s2 = sigma * sigma
  u = (2 * z - 1) / (2 * s2)
  beta = alpha - 1
  x_small = jnp.minimum(jnp.asarray(_SERIES_RADIUS, dtype), 0.5 / alpha)
  is_zero = u == 0
  u = _where(is_zero, jnp.ones_like(u), u)  # x = 0 is patched to -inf at the end
  positive = u > 0
  # log|x| = log q + max(u, 0) + log(1 - e^{-|u|}): no overflow for large u.
  log1m_exp = jnp.log(-jnp.expm1(-jnp.abs(u)))
  log_abs_x = log_q + jnp.maximum(u, 0) + log1m_exp
  small = log_abs_x <= jnp.log(x_small)

  # Series branch; a safe non-zero x where it is not taken (double-where).
  # |x| below e^-60 x_small changes the series sum by < 1e-26: clamp (no subnormals).
  # Clamps by where, not minimum/clip: at a tie those halve the derivative (a node can land
  # exactly on a branch's edge), where the one-sided derivative is the true one.
  log_x_small = jnp.log(x_small)
  x_ser = jnp.exp(jnp.maximum(_where(small, log_abs_x, log_x_small), log_x_small - 60))
  x_ser = _where(positive, x_ser, -x_ser)
  # One running product c_j x^j: |c_{j+1} x / c_j| <= 1/2, so it neither overflows nor
  # loses the coefficient to an underflowing power in float32.
  term = jnp.ones_like(x_ser)
  total = jnp.ones_like(x_ser)
  for j in range(_SERIES_TERMS):
    term = term * ((alpha - (2 + j)) * (x_ser * (1.0 / (j + 3))))
    total = total + term
  # 2 log|x| - m u (m = 2 for u > 0, m = 0 for u < 0) = 2 (log q + log(1 - e^{-|u|})).
  rest_series = (jnp.log(alpha / 2) + 2 * _where(small, log_q + log1m_exp, log_x_small)
                 + jnp.log(total))

  # Direct branch. ell = log(1+x); for u > 1 through ell - u = log q + softplus(logit(1-q) - u).
  ell_minus_u_big = log_q + _softplus(log1m_q - log_q - u)
  big = u > 1
  ell_moderate = jnp.log1p(q * jnp.expm1(_where(big, 1.0, u)))
  # Where the series is used, ell = 1 stands in (double-where): log|ell| and its derivative
  # 1/ell stay finite even when x underflows (tiny q), so no 0 * inf reaches the gradient.
  ell = _where(small, 1.0, _where(big, u + ell_minus_u_big, ell_moderate))
  ell_minus_u = _where(small, 0.0, _where(big, ell_minus_u_big, ell_moderate - u))
  abs_ell = jnp.abs(ell)
  abs_ell = _where(abs_ell > 0, abs_ell, jnp.finfo(dtype).tiny)
  # P and N share the factor |ell| exprel(-beta |ell|):
  #   x > 0: log P - alpha u = alpha (ell - u) + log|ell| + log exprel(-beta ell),  N = x;
  #   x < 0: P = -x,  log N = ell + log|ell| + log exprel(beta ell).
  shared = jnp.log(abs_ell) + _log_exprel_nonpositive(-beta * abs_ell)
  # For x > 0 two exact forms of log P - m u: m = alpha, alpha (ell - u) + shared, whose
  # Gaussian part m(m-1)/(2 s^2) - (z-m)^2/(2 s^2) is small near z = alpha; or m = 0,
  # alpha ell + shared, with Gaussian part -z^2/(2 s^2). Each node takes the form whose
  # largest term is smaller, so no two large terms cancel (what float32 needs).
  p_alpha = alpha * ell_minus_u + shared
  p_zero = alpha * ell + shared
  size_alpha = jnp.maximum(jnp.maximum(alpha * alpha, (z - alpha) ** 2) / (2 * s2), jnp.abs(alpha * ell_minus_u))
  size_zero = jnp.maximum(z * z / (2 * s2), jnp.abs(alpha * ell))
  use_alpha = size_alpha < size_zero
  m = _where(positive, _where(small, 2.0, _where(use_alpha, alpha, 0.0)), 0.0).astype(dtype)
  log_p_shifted = _where(positive, _where(use_alpha, p_alpha, p_zero), log_abs_x)
  log_p = _where(positive, p_zero, log_abs_x)
  log_n = _where(positive, log_abs_x, ell + shared)
  # In the series region N/P -> 1; the cap keeps the unused branch finite (NaN-free gradients).
  ratio = jnp.exp(jnp.clip(log_n - log_p, _exp_floor(dtype), math.log(_RATIO_CAP)))
  rest_direct = log_p_shifted + jnp.log1p(-ratio)

  rest = _where(small, rest_series, rest_direct)
  z_minus_m = (center - m) + offset
  local = rest - z_minus_m ** 2 / (2 * s2) - jnp.log(sigma) - 0.5 * math.log(2 * math.pi)
  return m, _where(is_zero, jnp.full_like(local, -jnp.inf), local)


def _relative_to(m, local, m_ref, sigma):
  """log integrand minus the reference constant m_ref (m_ref - 1)/(2 sigma^2), from the
  (m, local) pair of :func:`_integrand`: the two large constants cancel exactly."""
  return (m - m_ref) * (m + m_ref - 1) / (2 * sigma * sigma) + local


def _bisect(fn, lo, hi, steps):
  """Root of an increasing-through-zero ``fn`` on [lo, hi] with fn(lo) <= 0 <= fn(hi)."""
  def body(_, bracket):
    lo, hi = bracket
    mid = 0.5 * (lo + hi)
    neg = fn(mid) <= 0
    return _where(neg, mid, lo), _where(neg, hi, mid)
  lo, hi = loops.fori_loop(0, steps, body, (lo, hi))
  return 0.5 * (lo + hi)


def _modes(q_logit, sigma, alpha, steps=_BISECTION_STEPS):
  r"""Smallest and largest solutions of :math:`z = \alpha p(z)` and the local widths there.

  :math:`p(z) = \mathrm{sigmoid}((z - 1/2)/\sigma^2 + \mathrm{logit}\,q)` is the posterior
  weight of the shifted component. :math:`h(z) = z - \alpha p(z)` changes monotonicity only
  where :math:`p(1-p) = \sigma^2/\alpha` (two points at most), so each extreme root lies in a
  bracket where it is the only root and bisection finds it.
  """
  s2 = sigma * sigma
  z_center = 0.5 - s2 * q_logit  # where p = 1/2
  floor = _exp_floor(s2.dtype)
  ex = lambda v: v[..., None]
  # Both roots are bisected in one loop (last axis: right, left), one copy of h in the graph.
  p_of = lambda z: jax.nn.sigmoid(jnp.clip((z - ex(z_center)) / ex(s2), floor, -floor))
  h = lambda z: z - ex(alpha) * p_of(z)
  c = s2 / alpha
  has_turns = c < 0.25
  c_safe = _where(has_turns, c, 0.125)
  sq = jnp.sqrt(1 - 4 * c_safe)
  w_c = jnp.log((1 + sq) / 2) - jnp.log(2 * c_safe / (1 + sq))  # logit of the larger turn
  z_c1 = _where(has_turns, z_center - s2 * w_c, z_center)
  z_c2 = _where(has_turns, z_center + s2 * w_c, z_center)
  lo_all = jnp.minimum(0.0, z_c1) - 1.0
  hi_all = jnp.maximum(alpha, z_c2) + 1.0
  h_turns = h(jnp.stack([z_c2, z_c1], axis=-1))
  # Largest root: unique on [z_c2, hi] if h(z_c2) < 0, else unique on [lo, z_c1].
  right_in_upper = ~has_turns | (h_turns[..., 0] < 0)
  r_lo = _where(right_in_upper, _where(has_turns, z_c2, lo_all), lo_all)
  r_hi = _where(right_in_upper, hi_all, z_c1)
  # Smallest root: unique on [lo, z_c1] if h(z_c1) > 0, else unique on [z_c2, hi].
  left_in_lower = ~has_turns | (h_turns[..., 1] > 0)
  l_lo = _where(left_in_lower, lo_all, z_c2)
  l_hi = _where(left_in_lower, _where(has_turns, z_c1, hi_all), hi_all)
  roots = _bisect(h, jnp.stack([r_lo, l_lo], axis=-1), jnp.stack([r_hi, l_hi], axis=-1),
                  steps)
  p = p_of(roots)
  spread = ex(alpha) * p * (1 - p)
  curvature = 1 - spread / ex(s2)  # -(d^2/dz^2 log integrand) * sigma^2
  widths = ex(sigma) / jnp.sqrt(jnp.maximum(curvature, 1.0 / 64))
  # A root where the curvature vanishes (the left or right mode about to merge with the
  # antimode) is an inflection: there the log integrand falls cubically away from the other
  # mode, by |h''| t^3 / (6 sigma^2) with h'' = -alpha p(1-p)(1-2p)/sigma^4, so it has fallen
  # by _HALF_WIDTH^2/2 nats (what the quadratic width gives) within _HALF_WIDTH times `cubic`
  # (never below sigma, the width of the Gaussian factor and of the bumps at 0 and 2). Without
  # this cap such a root got the floor's width, 8 sigma, and a window too wide for 257 nodes
  # (+inf: q = 0.2595, sigma = 0.519, alpha = 2.1). Narrower windows stay sound: the edges
  # must still have decayed (_assess).
  skew = spread * jnp.abs(1 - 2 * p)
  drop = 3 * _HALF_WIDTH ** 2 * ex(s2) ** 3   # 6 sigma^6 * (_HALF_WIDTH^2 / 2)
  cubic = jnp.cbrt(drop / _where(skew > 0, skew, 1.0)) / _HALF_WIDTH
  widths = _where(skew > 0, jnp.maximum(jnp.minimum(widths, cubic), ex(sigma)), widths)
  z_right, z_left, w_right, w_left = roots[..., 0], roots[..., 1], widths[..., 0], widths[..., 1]
  return z_left, w_left, z_right, w_right


def _placement(q, sigma, alpha):
  """Quadrature windows [a0, a1], [b0, b1], whether they are merged, the reference power
  m_ref (see _integrand), as a tuple; not differentiated (windows only decide where to look).

  Window A holds the bumps of the integrand near z = 0 and z = 2 (the k = 0 and k = 2 terms
  of the binomial picture) and the left mode when it is a mode of its own; window B holds the
  right mode and the right tail. Where the integrand is not negligible between them, the two
  windows become the halves of one uniform grid. All probes of the integrand are evaluated in
  one call (an extra axis of 14 points).
  """
  sg = lax.stop_gradient
  q, sigma, alpha = sg(q), sg(sigma), sg(alpha)
  dtype = q.dtype
  log_q = jnp.log(q)
  log1m_q = jnp.log1p(-q)
  q_logit = log_q - log1m_q
  s2 = sigma * sigma
  z_left, w_left, z_right, w_right = _modes(q_logit, sigma, alpha)
  distinct = z_right - z_left > _HALF_WIDTH * (w_left + w_right)
  w_low = _where(z_left <= 2.0 + _HALF_WIDTH * w_left, w_left, sigma)
  lo_a = jnp.minimum(0.0, _where(distinct, z_left, 0.0)) - _HALF_WIDTH * w_low
  hi_a = jnp.maximum(2.0, _where(distinct, z_left, 2.0)) + _HALF_WIDTH * w_low
  lo_b = z_right - _HALF_WIDTH * w_right
  hi_b = z_right + _HALF_WIDTH * w_right

  # Probes: the modes and the bumps at 0 and 2; both inner window edges, 7 interior points of
  # the gap and the transition z0 (where p = 1/2) if it lies there.
  zero = jnp.zeros_like(q)
  z0 = jnp.clip(0.5 - s2 * q_logit, hi_a, jnp.maximum(lo_b, hi_a))
  ex = lambda v: v[..., None]
  # The gap's points in one broadcast (a list of seven would be seven kernels).
  gap = ex(hi_a) + ex(lo_b - hi_a) * (jnp.arange(1, 8, dtype=dtype) / 8)
  probes = jnp.concatenate([jnp.stack([z_right, z_left, zero, zero + 2.0, hi_a, lo_b, z0],
                                      axis=-1), gap], axis=-1)
  m, local = _integrand(probes, jnp.zeros_like(probes), ex(sigma), ex(log_q), ex(log1m_q),
                        ex(q), ex(alpha))
  at = lambda m_ref: _relative_to(m, local, ex(m_ref), ex(sigma))
  depth = 14.0 - math.log(float(jnp.finfo(dtype).eps))
  plain = at(zero)
  low = jnp.max(plain[..., 1:4], axis=-1)
  # Reference power: the integrand is summed relative to m_ref (m_ref - 1)/(2 s^2), the large
  # constant of its dominant bump, so that float32 keeps the bump's shape (see _integrand).
  m_ref = _where(plain[..., 0] > low, alpha, 2.0)
  values = at(m_ref)
  ref = jnp.max(values[..., :4], axis=-1)
  gap_top = jnp.max(values[..., 4:], axis=-1)
  # The (A-1) integrand can carry a heavier right shoulder than the modes' widths say (the
  # higher binomial bumps). It is bounded by A's integrand, log F = -z^2/(2 s^2) + alpha
  # log(1-q+qL) = alpha(alpha-1)/(2 s^2) - (z-alpha)^2/(2 s^2) + alpha (ell - u), which
  # decreases beyond its largest mode: bisect for where F is `depth` nats below the peak.
  def log_f(z):
    ell_minus_u = log_q + _softplus(log1m_q - log_q - (2 * z - 1) / (2 * s2))
    return ((alpha - m_ref) * (alpha + m_ref - 1) - (z - alpha) ** 2) / (2 * s2) + alpha * ell_minus_u
  log_norm = -jnp.log(sigma) - 0.5 * math.log(2 * math.pi)
  z_top = jnp.maximum(2.0, z_right)
  far = jnp.maximum(z_top, alpha) + 20 * sigma
  tail_end = _bisect(lambda z: ref - depth - (log_f(z) + log_norm), z_top, far, _TAIL_STEPS)
  hi_b = jnp.maximum(hi_b, tail_end)
  hi_a_alone = _where(distinct, hi_a, jnp.maximum(hi_a, tail_end))
  # Two windows only when the integrand is negligible between them; otherwise one merged
  # grid, which the certification then refines or rejects (+inf).
  merged = (lo_b <= hi_a) | ~(gap_top < ref - depth)
  hi_all = jnp.maximum(hi_a_alone, hi_b)
  mid = 0.5 * (lo_a + hi_all)
  a0, a1 = lo_a, _where(merged, mid, hi_a)
  b0, b1 = _where(merged, mid, lo_b), _where(merged, hi_all, hi_b)
  return (a0, a1, b0, b1, merged, m_ref)
