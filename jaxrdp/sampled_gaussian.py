r"""Rényi DP of the Poisson-sampled Gaussian mechanism, exact for every real order.

Mironov, Talwar, Zhang (2019), "Rényi Differential Privacy of the Sampled Gaussian
Mechanism", arXiv:1908.10530, Section 3. With :math:`\mu_0 = N(0,\sigma^2)`,
:math:`L(z) = \mu_1(z)/\mu_0(z) = e^{(2z-1)/(2\sigma^2)}` and sampling rate :math:`q`,

.. math::  A_\alpha = E_{z\sim\mu_0}\big[(1 - q + q L(z))^\alpha\big],
           \qquad \mathrm{RDP}(\alpha) = \frac{\log A_\alpha}{\alpha - 1}.

How it is computed (one kernel for integer and fractional orders, any float dtype):

* Because :math:`E_{\mu_0}[L - 1] = 0`, with :math:`x = q(L-1)`,

  .. math:: \frac{A_\alpha - 1}{\alpha - 1} = E_{\mu_0}\Big[\frac{(1+x)^\alpha - 1 - \alpha x}{\alpha - 1}\Big],

  the expectation of a **non-negative** function (convexity of :math:`(1+x)^\alpha`). Summing
  non-negative terms cannot cancel, so :math:`A_\alpha - 1` keeps full relative precision even
  when it is :math:`10^{-30}` and even in float32; at :math:`\alpha = 1` the integrand becomes
  :math:`(1+x)\log(1+x) - x` and the same formula gives the KL divergence (the RDP limit).
* The expectation is a trapezoidal sum over :math:`z` in log space. For integrands analytic
  in a strip (here :math:`|\Im z| < \pi\sigma^2`, the branch point of :math:`\log(1+x)`), the
  trapezoidal rule converges exponentially in the number of nodes, at a known rate. The
  integrand has at most three bumps (near 0, near 2, and the right mode of
  :math:`z = \alpha p(z)`, :math:`p = qL/(1-q+qL)`), so nodes are placed in two windows found
  by bracketed bisection (:func:`_placement`).
* Every result is certified: the error of the rule is estimated from its difference with the
  rule on every second node and the known convergence rate (:func:`_assess`), and the
  integrand must have decayed at the window edges. Elements that fail get twice the nodes
  (only the new midpoints are evaluated, only for those elements: :func:`_multilevel`), up to
  257 per window; a result that still fails is returned as ``+inf`` (a valid, if useless,
  upper bound), never as a smaller number.
* Derivatives (any of q, sigma, alpha; jvp and vjp) are the same quadrature applied to the
  integrand's derivative, at the level each element reached (:func:`_log_j_jvp`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxrdp import _validation

_FIRST_NODES = 33         # nodes per window at level 0 (odd: the every-second-node check)
_LEVELS = 4               # levels 0..3: 33, 65, 129, 257 nodes per window
_REFINE_BATCH = 512       # elements refined at a time (compacted)
_ERROR_TOL_ULPS = 32      # accepted estimated relative error of log A, in units of eps
_SERIES_TERMS = 16        # Taylor terms of (1+x)^a - 1 - a x around x = 0 ...
_SERIES_RADIUS = 0.1      # ... used for |x| <= min(0.1, 1/(2 alpha)): terms shrink by >= 10x
_RATIO_CAP = 0.999        # N/P <= 0.95 wherever the direct branch is used
_BISECTION_STEPS = 40
_CHUNK = 4096             # elements per lax.map step at level 0 (bounds memory)
_BATCH = 65536            # elements per pass of the whole pipeline (bounds memory)
_TAIL_STEPS = 24
_HALF_WIDTH = 11.0        # window half-width in local standard deviations (e^{-60})


def _log_exprel_nonpositive(t):
  """log((e^t - 1)/t) for t <= 0: the ratio lies in (0, 1], so nothing overflows."""
  nonzero = t != 0
  t_safe = jnp.where(nonzero, t, -1.0)
  return jnp.where(nonzero, jnp.log(jnp.expm1(t_safe) / t_safe), 0.0)


def _exp_floor(dtype):
  """Smallest exponent whose exp is a normal number. Arguments of exp are clamped to it
  where a result below it is negligible: subnormal arithmetic is ~100x slower on CPUs."""
  return math.log(float(jnp.finfo(dtype).tiny)) + 1.0


def _softplus(x):
  """log(1 + e^x), stable; cheaper than jax.nn.softplus on CPU. Below e^-(~700) in float64
  (e^-(~86) in float32) it returns that floor instead of a subnormal: an absolute change far
  below the rounding of anything it is added to."""
  return jnp.maximum(x, 0) + jnp.log1p(jnp.exp(jnp.maximum(-jnp.abs(x), _exp_floor(x.dtype))))


def _log_integrand(center, offset, sigma, log_q, log1m_q, q, alpha, m_ref):
  r"""log of the integrand :math:`\varphi_\sigma(z)\, g_\alpha(x)`, :math:`x = q(e^u - 1)`, :math:`u = (2z-1)/(2\sigma^2)`,

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
  float32). The result is shifted by :math:`-m_{\rm ref}(m_{\rm ref}-1)/(2\sigma^2)` (the
  caller adds it back after summing), which cancels exactly at nodes whose m equals m_ref.

  Returns ``-inf`` where :math:`x = 0` exactly (the integrand's double zero at z = 1/2).
  """
  z = center + offset
  dtype = z.dtype
  s2 = sigma * sigma
  u = (2 * z - 1) / (2 * s2)
  beta = alpha - 1
  x_small = jnp.minimum(jnp.asarray(_SERIES_RADIUS, dtype), 0.5 / alpha)
  is_zero = u == 0
  u = jnp.where(is_zero, jnp.ones_like(u), u)  # x = 0 is patched to -inf at the end
  positive = u > 0
  # log|x| = log q + max(u, 0) + log(1 - e^{-|u|}): no overflow for large u.
  log1m_exp = jnp.log(-jnp.expm1(-jnp.abs(u)))
  log_abs_x = log_q + jnp.maximum(u, 0) + log1m_exp
  small = log_abs_x <= jnp.log(x_small)

  # Series branch; a safe non-zero x where it is not taken (double-where).
  # |x| below e^-60 x_small changes the series sum by < 1e-26: clamp (no subnormals).
  x_ser = jnp.exp(jnp.clip(log_abs_x, jnp.log(x_small) - 60, jnp.log(x_small)))
  x_ser = jnp.where(positive, x_ser, -x_ser)
  # One running product c_j x^j: |c_{j+1} x / c_j| <= 1/2, so it neither overflows nor
  # loses the coefficient to an underflowing power in float32.
  term = jnp.ones_like(x_ser)
  total = jnp.ones_like(x_ser)
  for j in range(_SERIES_TERMS):
    term = term * ((alpha - (2 + j)) * (x_ser * (1.0 / (j + 3))))
    total = total + term
  # 2 log|x| - m u (m = 2 for u > 0, m = 0 for u < 0) = 2 (log q + log(1 - e^{-|u|})).
  rest_series = jnp.log(alpha / 2) + 2 * jnp.minimum(log_q + log1m_exp, jnp.log(x_small)) + jnp.log(total)

  # Direct branch. ell = log(1+x); for u > 1 through ell - u = log q + softplus(logit(1-q) - u).
  ell_minus_u_big = log_q + _softplus(log1m_q - log_q - u)
  ell_moderate = jnp.log1p(q * jnp.expm1(jnp.minimum(u, 1.0)))
  big = u > 1
  # Where the series is used, ell = 1 stands in (double-where): log|ell| and its derivative
  # 1/ell stay finite even when x underflows (tiny q), so no 0 * inf reaches the gradient.
  ell = jnp.where(small, 1.0, jnp.where(big, u + ell_minus_u_big, ell_moderate))
  ell_minus_u = jnp.where(small, 0.0, jnp.where(big, ell_minus_u_big, ell_moderate - u))
  abs_ell = jnp.abs(ell)
  abs_ell = jnp.where(abs_ell > 0, abs_ell, jnp.finfo(dtype).tiny)
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
  m = jnp.where(positive, jnp.where(small, 2.0, jnp.where(use_alpha, alpha, 0.0)), 0.0).astype(dtype)
  log_p_shifted = jnp.where(positive, jnp.where(use_alpha, p_alpha, p_zero), log_abs_x)
  log_p = jnp.where(positive, p_zero, log_abs_x)
  log_n = jnp.where(positive, log_abs_x, ell + shared)
  # In the series region N/P -> 1; the cap keeps the unused branch finite (NaN-free gradients).
  ratio = jnp.exp(jnp.clip(log_n - log_p, _exp_floor(dtype), math.log(_RATIO_CAP)))
  rest_direct = log_p_shifted + jnp.log1p(-ratio)

  rest = jnp.where(small, rest_series, rest_direct)
  z_minus_m = (center - m) + offset
  gaussian = (((m - m_ref) * (m + m_ref - 1) - z_minus_m ** 2) / (2 * s2)
              - jnp.log(sigma) - 0.5 * math.log(2 * math.pi))
  out = gaussian + rest
  return jnp.where(is_zero, jnp.full_like(out, -jnp.inf), out)


def _bisect(fn, lo, hi, steps):
  """Root of an increasing-through-zero ``fn`` on [lo, hi] with fn(lo) <= 0 <= fn(hi)."""
  def body(_, bracket):
    lo, hi = bracket
    mid = 0.5 * (lo + hi)
    neg = fn(mid) <= 0
    return jnp.where(neg, mid, lo), jnp.where(neg, hi, mid)
  lo, hi = lax.fori_loop(0, steps, body, (lo, hi))
  return 0.5 * (lo + hi)


def _modes(q_logit, sigma, alpha):
  r"""Smallest and largest solutions of :math:`z = \alpha p(z)` and the local widths there.

  :math:`p(z) = \mathrm{sigmoid}((z - 1/2)/\sigma^2 + \mathrm{logit}\,q)` is the posterior
  weight of the shifted component. :math:`h(z) = z - \alpha p(z)` changes monotonicity only
  where :math:`p(1-p) = \sigma^2/\alpha` (two points at most), so each extreme root lies in a
  bracket where it is the only root and bisection finds it.
  """
  s2 = sigma * sigma
  z_center = 0.5 - s2 * q_logit  # where p = 1/2
  floor = _exp_floor(s2.dtype)
  p_of = lambda z: jax.nn.sigmoid(jnp.clip((z - z_center) / s2, floor, -floor))
  h = lambda z: z - alpha * p_of(z)
  c = s2 / alpha
  has_turns = c < 0.25
  c_safe = jnp.where(has_turns, c, 0.125)
  sq = jnp.sqrt(1 - 4 * c_safe)
  w_c = jnp.log((1 + sq) / 2) - jnp.log(2 * c_safe / (1 + sq))  # logit of the larger turn
  z_c1 = jnp.where(has_turns, z_center - s2 * w_c, z_center)
  z_c2 = jnp.where(has_turns, z_center + s2 * w_c, z_center)
  lo_all = jnp.minimum(0.0, z_c1) - 1.0
  hi_all = jnp.maximum(alpha, z_c2) + 1.0
  # Largest root: unique on [z_c2, hi] if h(z_c2) < 0, else unique on [lo, z_c1].
  right_in_upper = ~has_turns | (h(z_c2) < 0)
  r_lo = jnp.where(right_in_upper, jnp.where(has_turns, z_c2, lo_all), lo_all)
  r_hi = jnp.where(right_in_upper, hi_all, z_c1)
  z_right = _bisect(h, r_lo, r_hi, _BISECTION_STEPS)
  # Smallest root: unique on [lo, z_c1] if h(z_c1) > 0, else unique on [z_c2, hi].
  left_in_lower = ~has_turns | (h(z_c1) > 0)
  l_lo = jnp.where(left_in_lower, lo_all, z_c2)
  l_hi = jnp.where(left_in_lower, jnp.where(has_turns, z_c1, hi_all), hi_all)
  z_left = _bisect(h, l_lo, l_hi, _BISECTION_STEPS)

  def width(z):
    p = p_of(z)
    curvature = 1 - alpha * p * (1 - p) / s2  # -(d^2/dz^2 log integrand) * sigma^2
    return sigma / jnp.sqrt(jnp.maximum(curvature, 1.0 / 64))
  return z_left, width(z_left), z_right, width(z_right)


def _logsumexp(x, axis=-1):
  """log sum exp over ``axis``; -inf when every entry is -inf (lean version for CPU speed)."""
  top = jnp.max(x, axis=axis, keepdims=True)
  top = lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
  # Terms below e^-(~700) of the largest are dropped rather than summed as subnormals.
  terms = jnp.exp(jnp.maximum(x - top, _exp_floor(x.dtype)))
  terms = jnp.where(x - top >= _exp_floor(x.dtype), terms, 0.0)
  return jnp.log(jnp.sum(terms, axis=axis)) + jnp.squeeze(top, axis)


def _placement(q, sigma, alpha):
  """Quadrature windows [a0, a1], [b0, b1], whether they are merged, and the reference power
  m_ref (see _log_integrand); not differentiated (windows only decide where to look).

  Window A holds the bumps of the integrand near z = 0 and z = 2 (the k = 0 and k = 2 terms
  of the binomial picture) and the left mode when it is a mode of its own; window B holds the
  right mode and the right tail. Where the integrand is not negligible between them, the two
  windows become the halves of one uniform grid.
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
  w_low = jnp.where(z_left <= 2.0 + _HALF_WIDTH * w_left, w_left, sigma)
  lo_a = jnp.minimum(0.0, jnp.where(distinct, z_left, 0.0)) - _HALF_WIDTH * w_low
  hi_a = jnp.maximum(2.0, jnp.where(distinct, z_left, 2.0)) + _HALF_WIDTH * w_low
  lo_b = z_right - _HALF_WIDTH * w_right
  hi_b = z_right + _HALF_WIDTH * w_right

  zero = jnp.zeros_like(q)
  log_g_at = lambda z, m_ref=zero: _log_integrand(z, zero, sigma, log_q, log1m_q, q, alpha, m_ref)
  depth = 14.0 - math.log(float(jnp.finfo(dtype).eps))
  low = jnp.maximum(jnp.maximum(log_g_at(z_left), log_g_at(zero)), log_g_at(2 * jnp.ones_like(q)))
  # Reference power: the integrand is summed relative to m_ref (m_ref - 1)/(2 s^2), the large
  # constant of its dominant bump, so that float32 keeps the bump's shape (see _log_integrand).
  m_ref = jnp.where(log_g_at(z_right) > low, alpha, 2.0)
  ref = jnp.maximum(log_g_at(z_right, m_ref), jnp.maximum(
      jnp.maximum(log_g_at(z_left, m_ref), log_g_at(zero, m_ref)), log_g_at(2 * jnp.ones_like(q), m_ref)))
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
  hi_a_alone = jnp.where(distinct, hi_a, jnp.maximum(hi_a, tail_end))
  # Two windows only when the integrand is negligible between them: probed at both inner
  # edges, at 7 interior points and at the transition z0 (where p = 1/2) if it lies there.
  # Otherwise one merged grid, which the certification then refines or rejects (+inf).
  z0 = jnp.clip(0.5 - s2 * q_logit, hi_a, jnp.maximum(lo_b, hi_a))
  probes = [hi_a, lo_b, z0] + [hi_a + (lo_b - hi_a) * (k / 8) for k in range(1, 8)]
  gap_top = functools.reduce(jnp.maximum, [log_g_at(z, m_ref) for z in probes])
  gap_small = gap_top < ref - depth
  merged = (lo_b <= hi_a) | ~gap_small
  hi_all = jnp.maximum(hi_a_alone, hi_b)
  mid = 0.5 * (lo_a + hi_all)
  a0, a1 = lo_a, jnp.where(merged, mid, hi_a)
  b0, b1 = jnp.where(merged, mid, lo_b), jnp.where(merged, hi_all, hi_b)
  return (a0, a1, b0, b1, merged, m_ref)


def _window_sums(z0, z1, q, sigma, alpha, m_ref, num_nodes, midpoints=False):
  """Trapezoidal sums on [z0, z1] with ``num_nodes`` nodes: (log sum, log sum on every second
  node, log G at z0, log G at z1), each times the step and relative to the reference constant
  m_ref (m_ref - 1)/(2 sigma^2). With ``midpoints``, only the log sum over the
  ``num_nodes - 1`` midpoints (times the step). Elementwise over leading axes."""
  dtype = q.dtype
  expand = lambda v: v[..., None]
  n = num_nodes - 1
  j = jnp.arange(n if midpoints else num_nodes, dtype=dtype) + (0.5 if midpoints else 0.0)
  # Nodes as center + offset (offsets are small and exact), see _log_integrand.
  center = 0.5 * (z0 + z1)
  half = 0.5 * (z1 - z0)
  offset = expand(half) * ((2 * j - n) / n)
  log_h = jnp.log((z1 - z0) / n)
  log_g = _log_integrand(expand(center), offset, expand(sigma), expand(jnp.log(q)),
                         expand(jnp.log1p(-q)), expand(q), expand(alpha), expand(m_ref))
  if midpoints:
    return _logsumexp(log_g) + log_h
  idx = jnp.arange(num_nodes)
  end_weight = jnp.where((idx == 0) | (idx == num_nodes - 1), math.log(0.5), 0.0).astype(dtype)
  full = _logsumexp(log_g + end_weight) + log_h
  coarse = _logsumexp(log_g[..., ::2] + end_weight[::2]) + log_h + math.log(2)
  return full, coarse, log_g[..., 0] + log_h, log_g[..., -1] + log_h


def _assess(log_t, log_t_coarse, edge, shift, h, sigma, alpha):
  r"""True where the rule's result cannot be certified to _ERROR_TOL_ULPS ulps of log A.

  For an integrand analytic in the strip :math:`|\Im z| < d`, the trapezoidal error behaves
  as :math:`C e^{-2\pi d/h}`: halving h multiplies it by :math:`\rho = e^{-\pi d/h}`, so
  :math:`E(h) = \rho/(1-\rho)\,|T(h) - T(2h)|`. Here :math:`d = \pi\sigma^2` (the branch
  point of :math:`\log(1+x)` at :math:`z_0 + i\pi\sigma^2`); the Gaussian factor converges
  faster (:math:`\rho = e^{-1.5\pi^2\sigma^2/h^2}`), so the larger rho is a safe rate. The
  gap is judged on log A (what is returned): :math:`d\log A/\log A = s\, d\log J` with
  :math:`s = \mathrm{sigmoid}(\ell)/\mathrm{softplus}(\ell) \le 1`, :math:`\ell = \log(\beta J)`.
  The integrand must also have decayed at the window edges.
  """
  sg = lax.stop_gradient
  log_t, log_t_coarse, edge, h = sg(log_t), sg(log_t_coarse), sg(edge), sg(h)
  log_j = log_t + sg(shift)  # sums are relative to the reference constant `shift`
  dtype = log_j.dtype
  eps = float(jnp.finfo(dtype).eps)
  s2 = sg(sigma * sigma)
  log_rho = jnp.maximum(-math.pi ** 2 * s2 / h, -1.5 * math.pi ** 2 * s2 / (h * h))
  rho = jnp.exp(log_rho)
  beta = sg(alpha) - 1
  log_beta_j = jnp.log(jnp.where(beta > 0, beta, 1.0)) + log_j
  tiny_j = log_beta_j < -20
  lbj_safe = jnp.where(tiny_j, 0.0, log_beta_j)
  sensitivity = jnp.where(tiny_j | (beta <= 0), 1.0, jax.nn.sigmoid(lbj_safe) / _softplus(lbj_safe))
  error = jnp.abs(log_t - log_t_coarse) * sensitivity * rho / (1 - rho)
  edge_ok = edge - log_t < math.log(eps) - 4
  return ~(error <= _ERROR_TOL_ULPS * eps) | ~edge_ok | ~jnp.isfinite(log_j)


def _step(place, num_nodes):
  a0, a1, b0, b1 = place[:4]
  return jnp.maximum(a1 - a0, b1 - b0) / (num_nodes - 1)


def _quadrature(place, q, sigma, alpha, num_nodes):
  """(log J, failed) by the trapezoidal rule with ``num_nodes`` nodes on each window."""
  state = _first_level(place, q, sigma, alpha, num_nodes)
  return state[0], state[-1]


def _first_level(place, q, sigma, alpha, num_nodes):
  """(log J, log T_a, log T_b, edge, failed) with ``num_nodes`` nodes per window.

  log T_a, log T_b and edge are relative to the reference constant (see _window_sums)."""
  a0, a1, b0, b1, merged, m_ref = place
  fa, ca, first_a, last_a = _window_sums(a0, a1, q, sigma, alpha, m_ref, num_nodes)
  fb, cb, first_b, last_b = _window_sums(b0, b1, q, sigma, alpha, m_ref, num_nodes)
  log_t = jnp.logaddexp(fa, fb)
  inner = jnp.where(merged, -jnp.inf, jnp.maximum(last_a, first_b))  # shared midpoint is interior
  edge = jnp.maximum(jnp.maximum(first_a, last_b), inner)
  shift = _reference_constant(m_ref, sigma)
  failed = _assess(log_t, jnp.logaddexp(ca, cb), edge, shift, _step(place, num_nodes), sigma, alpha)
  return log_t + shift, fa, fb, edge, failed


def _reference_constant(m_ref, sigma):
  return m_ref * (m_ref - 1) / (2 * sigma * sigma)


def _rule_with_grad(place, q, sigma, alpha, num_nodes):
  """d log J / d(q, sigma, alpha) per element, shape (n, 3): windows held fixed."""
  def one(place_i, q_i, s_i, a_i):
    fn = lambda q_, s_, a_: _quadrature(place_i, q_, s_, a_, num_nodes)[0]
    return jnp.stack(jax.grad(fn, argnums=(0, 1, 2))(q_i, s_i, a_i))
  return jax.vmap(one)(place, q, sigma, alpha)


def _compacted(fn, mask, batch, arrays, outs):
  """Apply ``fn`` to the elements of ``arrays`` (pytree of flat arrays) where ``mask`` holds,
  ``batch`` at a time, writing its results into ``outs`` (a pytree of full-size arrays)."""
  size = mask.shape[0]

  def body(state):
    outs, pending = state
    (idx,) = jnp.nonzero(pending, size=batch, fill_value=0)
    valid = jnp.arange(batch) < jnp.sum(pending)
    new = fn(jax.tree_util.tree_map(lambda v: v[idx], arrays))
    idx_w = jnp.where(valid, idx, size)  # out-of-range writes are dropped
    outs = jax.tree_util.tree_map(lambda o, n: o.at[idx_w].set(n, mode="drop"), outs, new)
    return outs, pending.at[idx_w].set(False, mode="drop")

  outs, _ = lax.while_loop(lambda st: jnp.any(st[1]), body, (outs, mask))
  return outs


def _multilevel(q, sigma, alpha):
  """log J and the final level per element (flat arrays), +inf where never certified.

  Level 0 uses _FIRST_NODES nodes per window on every element (in chunks, for memory).
  Each further level halves the step by evaluating only the new midpoints, and only for the
  elements still uncertified (compacted, _REFINE_BATCH at a time): the cost follows what the
  parameters demand (small sigma needs more levels).
  """
  size = q.shape[0]
  place = _placement(q, sigma, alpha)
  first = lambda xs: _first_level(xs[0], *xs[1:], _FIRST_NODES)
  if size <= _CHUNK:
    log_j, log_ta, log_tb, edge, failed = first((place, q, sigma, alpha))
  else:
    n_chunks = -(-size // _CHUNK)
    pad = n_chunks * _CHUNK - size
    chunk = lambda v: jnp.concatenate([v, jnp.broadcast_to(v[:1], (pad,))]).reshape(n_chunks, _CHUNK)
    out = lax.map(first, jax.tree_util.tree_map(chunk, (place, q, sigma, alpha)))
    log_j, log_ta, log_tb, edge, failed = (v.reshape(-1)[:size] for v in out)
  level = jnp.zeros(size, jnp.int32)
  batch = max(1, min(size, _REFINE_BATCH))
  for lev in range(1, _LEVELS):
    nodes = (_FIRST_NODES - 1) * 2 ** lev + 1

    def refine(xs, nodes=nodes, lev=lev):
      (a0, a1, b0, b1, merged, m_ref), q_, s_, a_, lta, ltb, edge_ = xs
      # T(h/2) = T(h)/2 + (h/2) * sum over the new midpoints.
      coarse_nodes = (nodes + 1) // 2
      mid_a = _window_sums(a0, a1, q_, s_, a_, m_ref, coarse_nodes, midpoints=True)
      mid_b = _window_sums(b0, b1, q_, s_, a_, m_ref, coarse_nodes, midpoints=True)
      lta2 = jnp.logaddexp(lta, mid_a) - math.log(2)
      ltb2 = jnp.logaddexp(ltb, mid_b) - math.log(2)
      lt2 = jnp.logaddexp(lta2, ltb2)
      shift = _reference_constant(m_ref, s_)
      fl2 = _assess(lt2, jnp.logaddexp(lta, ltb), edge_, shift, _step((a0, a1, b0, b1), nodes), s_, a_)
      return lt2 + shift, lta2, ltb2, fl2, jnp.full(fl2.shape, lev, jnp.int32)

    log_j, log_ta, log_tb, failed, level = _compacted(
        refine, failed, batch, (place, q, sigma, alpha, log_ta, log_tb, edge),
        (log_j, log_ta, log_tb, failed, level))
  return jnp.where(failed, jnp.inf, log_j), level, place


@jax.custom_jvp
def _log_j(q, sigma, alpha):
  """log J = log((A_alpha - 1)/(alpha - 1)) on flat arrays; +inf where it cannot be certified."""
  return _multilevel(q, sigma, alpha)[0]


@_log_j.defjvp
def _log_j_jvp(primals, tangents):
  # The refinement loops are not reverse-differentiable; the derivative is: the windows do not
  # depend on the parameters (they only decide where to look), so d log J is the quadrature
  # of the integrand's derivative on the same nodes, at the level each element reached. The
  # tangent is linear in the inputs' tangents, so JAX transposes it for reverse mode.
  q, sigma, alpha = primals
  log_j, level, place = _multilevel(q, sigma, alpha)
  size = q.shape[0]
  batch = max(1, min(size, _REFINE_BATCH))
  grads = jnp.zeros((size, 3), q.dtype)
  # Elements certified at level 0 get the level-0 rule's derivative; the (few) refined ones
  # the finest rule's (at least as accurate as their own level; one graph instead of three
  # keeps compilation short).
  finest = (_FIRST_NODES - 1) * 2 ** (_LEVELS - 1) + 1
  for nodes, mask in ((_FIRST_NODES, level == 0), (finest, level > 0)):
    fn = lambda xs, nodes=nodes: _rule_with_grad(*xs, nodes)
    grads = _compacted(fn, mask & jnp.isfinite(log_j), batch, (place, q, sigma, alpha), grads)
  tangent = sum(grads[:, i] * t for i, t in enumerate(tangents))
  return log_j, tangent


def log_a(q: jax.typing.ArrayLike, sigma: jax.typing.ArrayLike,
          alpha: jax.typing.ArrayLike) -> jax.Array:
  r"""log A_α of the Poisson-sampled Gaussian mechanism (Mironov, Talwar, Zhang 2019, Sec. 3).

  .. math:: A_\alpha = E_{z\sim N(0,\sigma^2)}\big[(1-q+q\,e^{(2z-1)/(2\sigma^2)})^\alpha\big]

  Exact for integer and fractional orders (no absolute-value series, no truncation): the
  quadrature of the non-negative integrand of :math:`A_\alpha - 1` described in the module
  docstring, checked on every call. Broadcasts over its arguments; jittable, vmappable and
  differentiable in ``q``, ``sigma`` and ``alpha``; computes in the floating dtype of its
  inputs (float32 or float64).

  Args:
    q: sampling rate in [0, 1].
    sigma: noise multiplier (noise std / L2 sensitivity), >= 0.
    alpha: Rényi order, >= 1 (``inf`` allowed; A_1 = 1).

  Returns:
    log A_α, with the exact special cases q = 0 → 0, q = 1 → α(α−1)/(2σ²), σ = 0 or
    α = ∞ (with q > 0) → +inf. Where the quadrature cannot certify its accuracy the result is
    +inf, never a smaller value.

  References:
    Mironov, Talwar, Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
    arXiv:1908.10530, Sec. 3 (definition of A_α; Sec. 3.3 numerically stable computation).
  """
  _validation.check_range("q", q, lo=0.0, hi=1.0)
  _validation.check_range("sigma", sigma, lo=0.0)
  _validation.check_range("alpha", alpha, lo=1.0, allow_inf=True)
  _validation.check_broadcast(q=q, sigma=sigma, alpha=alpha)
  return _sampled_gaussian_terms(q, sigma, alpha)[0]


def rdp_sampled_gaussian(q: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
                         orders: jax.typing.ArrayLike) -> jax.Array:
  r"""RDP ε(α) = log A_α / (α − 1) of one step of the Poisson-sampled Gaussian mechanism.

  ``orders`` may contain 1 (the KL divergence, the limit α → 1, computed without dividing by
  zero: the kernel integrates :math:`(A_\alpha - 1)/(\alpha - 1)` directly) and ``inf``
  (+inf unless q = 0). Broadcasts ``q``, ``noise_multiplier`` and ``orders``.

  References:
    Mironov, Talwar, Zhang (2019), arXiv:1908.10530, Sec. 3; Mironov (2017), Def. 3.
  """
  _validation.check_range("q", q, lo=0.0, hi=1.0)
  _validation.check_range("noise_multiplier", noise_multiplier, lo=0.0)
  _validation.check_range("orders", orders, lo=1.0, allow_inf=True)
  _validation.check_broadcast(q=q, noise_multiplier=noise_multiplier, orders=orders)
  return _sampled_gaussian_terms(q, noise_multiplier, orders)[1]




def _sampled_gaussian_terms(q, sigma, alpha, num_nodes=None):
  q = _validation.as_float_array(q)
  sigma = _validation.as_float_array(sigma)
  alpha = _validation.as_float_array(alpha)
  return _sampled_gaussian_jit(q, sigma, alpha, num_nodes)


@functools.partial(jax.jit, static_argnames=("num_nodes",))
def _sampled_gaussian_jit(q, sigma, alpha, num_nodes=None):
  """(log A, RDP) with all special cases. Memory stays bounded for any size: the kernel's
  node-level work runs in chunks (level 0) or compacted batches (refinement, gradients)."""
  q = _validation.as_float_array(q)
  sigma = _validation.as_float_array(sigma)
  alpha = _validation.as_float_array(alpha)
  dtype = jnp.result_type(q, sigma, alpha)
  q, sigma, alpha = jnp.broadcast_arrays(q.astype(dtype), sigma.astype(dtype), alpha.astype(dtype))
  shape, size = q.shape, q.size
  if size == 0:
    return q, q
  flat = [v.reshape(-1) for v in (q, sigma, alpha)]
  if size <= _BATCH:
    log_a_value, rdp = _terms(*flat, num_nodes)
  else:
    # Whole pipeline (windows, rule, refinement) one batch at a time: the working memory is
    # that of one batch whatever the input size.
    n_batches = -(-size // _BATCH)
    pad = n_batches * _BATCH - size
    batched = [jnp.concatenate([v, jnp.broadcast_to(v[:1], (pad,))]).reshape(n_batches, _BATCH)
               for v in flat]
    log_a_value, rdp = lax.map(lambda xs: _terms(*xs, num_nodes), tuple(batched))
    log_a_value, rdp = log_a_value.reshape(-1)[:size], rdp.reshape(-1)[:size]
  return log_a_value.reshape(shape), rdp.reshape(shape)


def _terms(q, sigma, alpha, num_nodes):
  """Special cases around the generic kernel, with double-where for NaN-free gradients."""
  generic = (q > 0) & (q < 1) & (sigma > 0) & jnp.isfinite(alpha) & (alpha >= 1)
  q_g = jnp.where(generic, q, 0.5)
  s_g = jnp.where(generic, sigma, 1.0)
  a_g = jnp.where(generic, alpha, 2.0)
  if num_nodes is None:
    log_j = _log_j(q_g, s_g, a_g)
    failed = ~jnp.isfinite(log_j)
  else:  # one fixed rule (tests study its convergence)
    log_j, failed = _quadrature(_placement(q_g, s_g, a_g), q_g, s_g, a_g, num_nodes)
  beta = a_g - 1
  beta_safe = jnp.where(beta > 0, beta, 1.0)
  log_a_gen = jnp.where(beta > 0, _softplus(jnp.log(beta_safe) + log_j), 0.0)
  rdp_gen = jnp.where(beta > 0, log_a_gen / beta_safe, jnp.exp(jnp.where(beta > 0, 0.0, log_j)))
  inf = jnp.full_like(q, jnp.inf)
  log_a_gen = jnp.where(failed, inf, log_a_gen)
  rdp_gen = jnp.where(failed, inf, rdp_gen)

  s_pos = jnp.where(sigma > 0, sigma, 1.0)
  a_fin = jnp.where(jnp.isfinite(alpha), alpha, 2.0)
  log_a_q1 = a_fin * (a_fin - 1) / (2 * s_pos * s_pos)
  rdp_q1 = a_fin / (2 * s_pos * s_pos)

  zero = jnp.zeros_like(q)
  blows_up = (sigma == 0) | ~jnp.isfinite(alpha)
  log_a_out = jnp.where(q == 0, zero, jnp.where(blows_up, inf, jnp.where(q == 1, log_a_q1, log_a_gen)))
  rdp_out = jnp.where(q == 0, zero, jnp.where(blows_up, inf, jnp.where(q == 1, rdp_q1, rdp_gen)))
  # A_1 = 1 exactly: log A vanishes at alpha = 1 whatever q and sigma.
  log_a_out = jnp.where(alpha == 1, zero, log_a_out)
  # Under jit the eager range checks do not run: out-of-range inputs give NaN, never a number.
  invalid = ~((q >= 0) & (q <= 1) & (sigma >= 0) & (alpha >= 1))
  return jnp.where(invalid, jnp.nan, log_a_out), jnp.where(invalid, jnp.nan, rdp_out)
