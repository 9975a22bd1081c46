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
* Every result is certified: the error of the rule is estimated from its differences with
  the rules on every second and every fourth node and the known convergence rate
  (:func:`_assess`: two grid phases, so that a coarse rule that is exact by accident cannot
  vouch for the fine one), and the
  integrand must have decayed at the window edges. Elements that fail get twice the nodes
  (only the new midpoints are evaluated, only for those elements), up to 4097 per window
  (more than 257 only below sigma ~ 0.035, where the strip of analyticity, of half-width
  pi sigma^2, is narrower than their spacing; as many as the finest grid of the shared
  nodes below, whose derivatives take 129 nodes only and otherwise this kernel: where the
  shared nodes certify a value, its derivative must be certified too, not left zero); a
  result that still fails is returned as ``+inf`` (a valid, if useless, upper bound), never as
  a smaller number.
* Derivatives (any of q, sigma, alpha; jvp and vjp) are the same quadrature applied to the
  integrand's derivative, accumulated on the nodes of the primal computation itself, at the
  level each element reached (:func:`_log_j`): no second pass.

How it is organised for compilation and batching: the integrand is traced three times per
graph — once for the placement probes (all at once, an extra axis), once for the first level
and once inside the refinement loop, whose body refines any level one block of midpoints at a
time (static shapes). The kernel works on flat arrays; under :func:`jax.vmap` a batching rule
(:func:`jax.custom_batching.custom_vmap`) flattens the batch into the same flat kernel, so
``vmap(f)(q, sigma)`` runs exactly the code of ``f(q_array, sigma_array)``.

A concrete grid of orders (:func:`log_a_and_rdp_at_orders`, used by ``compute_rdp`` and
``sweep``) is cheaper: integer orders up to 4096 are the exact binomial sum
(:func:`_log_j_integer`), and fractional orders up to 64 share one grid of nodes per (q, sigma)
and group of orders (:func:`_log_j_levels`: the logarithms of the integrand once per node,
two exponentials and one expm1 per (node, order); every second node first, the midpoints
level by level only where needed, all in one loop with the integrand traced once; derivatives
on one grid of nodes in the same pass, :func:`_log_j_shared`), certified per order in the
same way; the per-order kernel above computes whatever is left.
"""

from __future__ import annotations

import functools
import math
import threading

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import loops
from jaxrdp._internal import numerics
from jaxrdp._internal import validation

_BLOCK = 32               # intervals per window at level 0; midpoints per refinement block
_LEVELS = 8               # levels 0..7: 33, 65, ..., 4097 nodes per window, as many as the
                          # shared grid's finest (small sigma; see the module docstring)
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
_LOG_HALF = math.log(0.5)

_where = numerics.select
_exp_floor = numerics.exp_floor
_logsumexp = numerics.logsumexp


def _pow2(k):
  """2**k for a float array of small integers k, exactly (XLA's float64 exp2 is not: on CPU
  exp2(3.) = 8 - 2e-15, which would break the block counters of the refinement loops)."""
  return jnp.ldexp(jnp.ones_like(k), k.astype(jnp.int32))


def _log_exprel_nonpositive(t):
  """log((e^t - 1)/t) for t <= 0: the ratio lies in (0, 1], so nothing overflows.

  Near t = 0 (alpha -> 1, where t = -(alpha - 1)|ell|) the Taylor polynomial
  t/2 + t^2/24 (next term t^4/2880: below 1e-15 of the value for |t| <= 1e-4): it has the
  derivative 1/2 at t = 0, which a constant 0 there would drop (the alpha-derivative of
  log A at alpha = 1), and the direct form's derivative e^t/(e^t - 1) - 1/t cancels
  catastrophically as t -> 0."""
  direct = t < -1e-4
  t_safe = _where(direct, t, -1.0)
  return _where(direct, jnp.log(jnp.expm1(t_safe) / t_safe), t * (0.5 + t / 24))


def _softplus(x):
  """log(1 + e^x), stable; cheaper than jax.nn.softplus on CPU. Below e^-(~700) in float64
  (e^-(~86) in float32) it returns that floor instead of a subnormal: an absolute change far
  below the rounding of anything it is added to."""
  return jnp.maximum(x, 0) + jnp.log1p(jnp.exp(jnp.maximum(-jnp.abs(x), _exp_floor(x.dtype))))


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


def _sum_with_mean(v, dv, axis):
  """(log sum exp of v, the exp(v)-weighted mean of dv) over ``axis`` (dv has one more,
  trailing axis: the three parameters). dv is None when no derivative is carried."""
  log_sum = _logsumexp(v, axis=axis)
  if dv is None:
    return log_sum, None
  weight = jnp.exp(v - jnp.expand_dims(_where(jnp.isfinite(log_sum), log_sum, 0.0), axis))
  weight = _where(jnp.isfinite(v), weight, 0.0)
  dv = _where(jnp.isfinite(v)[..., None], dv, 0.0)
  return log_sum, jnp.sum(weight[..., None] * dv, axis=axis - 1 if axis < 0 else axis)


def _add_with_mean(l1, d1, l2, d2):
  """log(e^l1 + e^l2) and the weighted mean of the two derivatives (None stays None)."""
  total = jnp.logaddexp(l1, l2)
  if d1 is None:
    return total, None
  safe = _where(jnp.isfinite(total), total, 0.0)
  w1 = _where(jnp.isfinite(l1), jnp.exp(l1 - safe), 0.0)[..., None]
  w2 = _where(jnp.isfinite(l2), jnp.exp(l2 - safe), 0.0)[..., None]
  return total, w1 * d1 + w2 * d2


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
  probes = jnp.stack([z_right, z_left, zero, zero + 2.0, hi_a, lo_b, z0]
                     + [hi_a + (lo_b - hi_a) * (k / 8) for k in range(1, 8)], axis=-1)
  ex = lambda v: v[..., None]
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


def _rates(h, sigma):
  r"""(:math:`\rho_h`, :math:`\rho_h\rho_{2h}`): the factors by which halving the step h and
  2h shrinks the trapezoidal error (see :func:`_assess`)."""
  s2 = sigma * sigma
  log_rate = lambda step: jnp.maximum(-math.pi ** 2 * s2 / step, -1.5 * math.pi ** 2 * s2 / (step * step))
  log_rho = log_rate(h)
  return jnp.exp(log_rho), jnp.exp(log_rho + log_rate(2 * h))


def _assess(log_t, log_t_coarse, log_t_coarser, edge, shift, rho, rho_pair, alpha, log_beta=None):
  r"""True where the rule's result cannot be certified to _ERROR_TOL_ULPS ulps of log A.

  For an integrand analytic in the strip :math:`|\Im z| < d`, the trapezoidal error behaves
  as :math:`C e^{-2\pi d/h}`: halving h multiplies it by :math:`\rho = e^{-\pi d/h}`.
  Here :math:`d = \pi\sigma^2` (the branch point of :math:`\log(1+x)` at
  :math:`z_0 + i\pi\sigma^2`); the Gaussian factor converges faster
  (:math:`\rho = e^{-1.5\pi^2\sigma^2/h^2}`), so the larger rho is a safe rate.

  The error of a rule oscillates with the phase of the grid against the integrand's bumps
  (:math:`E_h \cos(2\pi c/h)`), so one difference :math:`|T(h) - T(2h)|` can be small by
  accident: the coarse rule happens to be exact while the fine one is not (seen: 3.9e-11
  accepted as 32 ulps). Two differences at consecutive phases cannot both be: with
  :math:`\theta = \pi c/h`, :math:`|T(h)-T(2h)| \approx E_{2h}|\cos\theta|` and
  :math:`|T(2h)-T(4h)| \approx E_{4h}|\cos(\theta/2)|`, and :math:`\max(|\cos\theta|,
  |\cos(\theta/2)|) \ge 1/2`. So the error of T(h) is estimated as
  :math:`\max(\rho_h |T(h)-T(2h)|,\ \rho_h\rho_{2h} |T(2h)-T(4h)|)/(1-\rho_h)`, doubled
  (``rho``, ``rho_pair``: :math:`\rho_h` and :math:`\rho_h\rho_{2h}`, from :func:`_rates`).
  The gap is judged on log A (what is returned): :math:`d\log A/\log A = s\, d\log J` with
  :math:`s = \mathrm{sigmoid}(\ell)/\mathrm{softplus}(\ell) \le 1`, :math:`\ell = \log(\beta J)`.
  The integrand must also have decayed at the window edges.
  """
  sg = lax.stop_gradient
  log_t, log_t_coarse, log_t_coarser = sg(log_t), sg(log_t_coarse), sg(log_t_coarser)
  edge, rho, rho_pair = sg(edge), sg(rho), sg(rho_pair)
  log_j = log_t + sg(shift)  # sums are relative to the reference constant `shift`
  dtype = log_j.dtype
  eps = float(jnp.finfo(dtype).eps)
  alpha = sg(alpha)
  log_beta = _log_beta(alpha) if log_beta is None else sg(log_beta)
  log_beta_j = log_beta + log_j
  tiny_j = log_beta_j < -20
  lbj_safe = _where(tiny_j, 0.0, log_beta_j)
  sensitivity = _where(tiny_j | (alpha <= 1), 1.0, jax.nn.sigmoid(lbj_safe) / _softplus(lbj_safe))
  gap = jnp.abs(log_t - log_t_coarse) * rho
  gap_before = jnp.abs(log_t_coarse - log_t_coarser) * rho_pair
  # error <= tol with error = 2 max(gap, gap_before) sensitivity / (1 - rho), written without
  # the division (a per-row division would be a kernel of its own); rho = 1 fails, and so does
  # NaN (an -inf - -inf gap).
  bound = 2 * jnp.maximum(gap, gap_before) * sensitivity
  certified = (bound <= _ERROR_TOL_ULPS * eps * (1 - rho)) & (rho < 1)
  edge_ok = edge - log_t < math.log(eps) - 4
  return ~certified | ~edge_ok | ~jnp.isfinite(log_j)


def _beta_or_one(alpha):
  """alpha - 1, and 1 where alpha <= 1 (so that its logarithm is finite where it is not used)."""
  return _where(alpha > 1, alpha - 1, 1.0)


def _log_beta(alpha):
  """log(alpha - 1), 0 at alpha <= 1 (where it is not used)."""
  return jnp.log(_beta_or_one(alpha))


def _reference_constant(m_ref, sigma):
  return m_ref * (m_ref - 1) / (2 * sigma * sigma)


def _node_values(place, q, sigma, alpha, fraction, with_grad):
  """The integrand (relative to the reference constant) at the nodes center + half * fraction
  of both windows: shape (n, 2, k) for ``fraction`` of shape (k,) or (n, k); with
  ``with_grad``, also its derivatives in (q, sigma, alpha) at fixed nodes, shape (n, 2, k, 3)."""
  a0, a1, b0, b1, _, m_ref = place
  center = jnp.stack([0.5 * (a0 + a1), 0.5 * (b0 + b1)], axis=-1)[..., None]
  half = jnp.stack([0.5 * (a1 - a0), 0.5 * (b1 - b0)], axis=-1)[..., None]
  fraction = fraction if fraction.ndim == 1 else fraction[:, None, :]
  offset = half * fraction
  ex = lambda v: v[:, None, None]

  def values(q_, s_, a_):
    m, local = _integrand(center, offset, ex(s_), ex(jnp.log(q_)), ex(jnp.log1p(-q_)), ex(q_), ex(a_))
    return _relative_to(m, local, ex(m_ref), ex(s_))

  if not with_grad:
    return values(q, sigma, alpha), None
  basis = jnp.eye(3, dtype=q.dtype)
  one = jnp.ones_like(q)
  tangent = lambda e: jax.jvp(values, (q, sigma, alpha), (e[0] * one, e[1] * one, e[2] * one))
  v, dv = jax.vmap(tangent, out_axes=(None, -1))(basis)
  return v, dv


def _first_level(place, q, sigma, alpha, with_grad):
  """The rule with _BLOCK + 1 nodes per window: per-window log sums (n, 2) and derivative
  means (n, 2, 3) or None, the edge value and whether the result fails certification."""
  a0, a1, b0, b1, merged, m_ref = place
  dtype = q.dtype
  fraction = (2 * jnp.arange(_BLOCK + 1, dtype=dtype) - _BLOCK) / _BLOCK
  v, dv = _node_values(place, q, sigma, alpha, fraction, with_grad)
  log_h = jnp.log(jnp.stack([a1 - a0, b1 - b0], axis=-1) / _BLOCK)
  idx = jnp.arange(_BLOCK + 1)
  end_weight = _where((idx == 0) | (idx == _BLOCK), _LOG_HALF, 0.0).astype(dtype)
  log_t, d_t = _sum_with_mean(v + end_weight, dv, axis=-1)
  log_t = log_t + log_h
  coarse = _logsumexp(v[..., ::2] + end_weight[::2], axis=-1) + log_h + math.log(2)
  coarser = _logsumexp(v[..., ::4] + end_weight[::4], axis=-1) + log_h + math.log(4)
  first, last = v[..., 0] + log_h, v[..., -1] + log_h
  inner = _where(merged, -jnp.inf, jnp.maximum(last[:, 0], first[:, 1]))  # shared midpoint is interior
  edge = jnp.maximum(jnp.maximum(first[:, 0], last[:, 1]), inner)
  total = jnp.logaddexp(log_t[:, 0], log_t[:, 1])
  shift = _reference_constant(m_ref, sigma)
  step = jnp.maximum(a1 - a0, b1 - b0) / _BLOCK
  total_coarse = jnp.logaddexp(coarse[:, 0], coarse[:, 1])
  failed = _assess(total, total_coarse, jnp.logaddexp(coarser[:, 0], coarser[:, 1]), edge, shift,
                   *_rates(step, sigma), alpha)
  return log_t, d_t, edge, failed, total_coarse


def _refine(place, q, sigma, alpha, log_t, d_t, edge, failed, total_coarse, with_grad):
  """Halve the step of the failed elements until certified or at the last level.

  One ``while_loop`` whose body evaluates one block of _BLOCK new midpoints per window for up
  to _REFINE_BATCH pending elements (compacted): level l (1.._LEVELS-1) takes 2^(l-1) blocks,
  then T(h/2) = T(h)/2 + (h/2) sum(midpoints) is assessed against T(h) and T(2h)
  (``total_coarse``: T(2h) of level 0). Static shapes, one
  copy of the integrand; the cost follows what the parameters demand. The per-element state
  is one packed matrix (one gather and one scatter per step: few kernels to compile).
  Returns (log_t, d_t, failed)."""
  size = q.shape[0]
  dtype = q.dtype
  batch = max(1, min(size, _REFINE_BATCH))
  a0, a1, b0, b1, _, m_ref = place
  # Columns: a0 a1 b0 b1 m_ref q sigma alpha edge | level block failed older | log_t(2) acc(2) |
  # d_t(6) d_acc(6); `older` is the total of the level before the current one.
  n_grad = 0 if d_t is None else 6
  fixed = jnp.stack([a0, a1, b0, b1, m_ref, q, sigma, alpha, edge], axis=-1)
  counters = jnp.stack([jnp.ones_like(q), jnp.zeros_like(q), failed.astype(dtype), total_coarse],
                       axis=-1)
  sums = jnp.concatenate([log_t, jnp.full_like(log_t, -jnp.inf)], axis=-1)
  parts = [fixed, counters, sums]
  if d_t is not None:
    parts += [d_t.reshape(size, 6), jnp.zeros((size, 6), dtype)]
  packed = jnp.concatenate(parts, axis=-1)
  within = jnp.arange(_BLOCK, dtype=dtype) + 0.5

  def body(state):
    packed, pending = state
    # Pending elements first (a stable sort is cheaper to compile than jnp.nonzero).
    idx = jnp.argsort(~pending, stable=True)[:batch]
    valid = pending[idx]
    rows = packed[idx]
    a0_, a1_, b0_, b1_, m_ref_, q_, s_, a_, edge_, level, block, failed_, older = (
        rows[:, i] for i in range(13))
    old, acc = rows[:, 13:15], rows[:, 15:17]
    d_old = d_acc = None
    if n_grad:
      d_old, d_acc = rows[:, 17:23].reshape(-1, 2, 3), rows[:, 23:29].reshape(-1, 2, 3)
    pl = (a0_, a1_, b0_, b1_, None, m_ref_)
    coarse_intervals = _BLOCK * _pow2(level - 1)
    j = (_BLOCK * block)[:, None] + within
    fraction = (2 * j - coarse_intervals[:, None]) / coarse_intervals[:, None]
    v, dv = _node_values(pl, q_, s_, a_, fraction, with_grad)
    blk, d_blk = _sum_with_mean(v, dv, axis=-1)
    acc, d_acc = _add_with_mean(acc, d_acc, blk, d_blk)
    last_block = block == _pow2(level - 1) - 1
    # Level complete: T(h/2) = T(h)/2 + (h/2) * sum over the new midpoints.
    widths = jnp.stack([a1_ - a0_, b1_ - b0_], axis=-1)
    log_half_h = jnp.log(widths / (2 * coarse_intervals[:, None]))
    new, d_new = _add_with_mean(old + _LOG_HALF, d_old, acc + log_half_h, d_acc)
    total_new = jnp.logaddexp(new[:, 0], new[:, 1])
    total_old = jnp.logaddexp(old[:, 0], old[:, 1])
    step = jnp.max(widths, axis=-1) / (2 * coarse_intervals)
    still = _assess(total_new, total_old, older, edge_, _reference_constant(m_ref_, s_),
                    *_rates(step, s_), a_)
    done = last_block & (~still | (level == _LEVELS - 1))
    col = last_block[:, None]
    out = [rows[:, :9],
           jnp.stack([_where(last_block, level + 1, level), _where(last_block, 0.0, block + 1),
                      _where(last_block, still.astype(dtype), failed_),
                      _where(last_block, total_old, older)], axis=-1),
           _where(col, new, old), _where(col, -jnp.inf, acc)]
    if n_grad:
      out += [_where(col, d_new.reshape(-1, 6), d_old.reshape(-1, 6)),
              _where(col, 0.0, d_acc.reshape(-1, 6))]
    write = _where(valid, idx, size)  # out-of-range writes are dropped
    packed = packed.at[write].set(jnp.concatenate(out, axis=-1), mode="drop")
    return packed, pending.at[write].set(~done, mode="drop")

  packed, _ = loops.while_loop(lambda st: jnp.any(st[1]), body, (packed, failed))
  d_t = packed[:, 17:23].reshape(size, 2, 3) if n_grad else None
  return packed[:, 13:15], d_t, packed[:, 11] > 0


def _log_j_flat(q, sigma, alpha, with_grad):
  """log J = log((A_alpha - 1)/(alpha - 1)) on flat arrays of generic parameters (0 < q < 1,
  sigma > 0, 1 <= alpha < inf), +inf where it cannot be certified; with ``with_grad`` also
  d log J / d(q, sigma, alpha), shape (n, 3), on the same nodes."""
  if q.shape[0] > _BATCH:
    # The whole pipeline one batch at a time: working memory of one batch for any size.
    return _in_row_blocks(lambda xs: _log_j_flat(*xs, with_grad), _BATCH, q, sigma, alpha)
  place = _placement(q, sigma, alpha)
  # The first level in chunks: its (n, 2, nodes) arrays stay small.
  log_t, d_t, edge, failed, total_coarse = _in_row_blocks(
      lambda xs: _first_level(xs[:6], *xs[6:], with_grad), _CHUNK, *place, q, sigma, alpha)
  log_t, d_t, failed = _refine(place, q, sigma, alpha, log_t, d_t, edge, failed, total_coarse,
                               with_grad)
  m_ref = place[-1]
  shift = _reference_constant(m_ref, sigma)
  total, d_total = _add_with_mean(log_t[:, 0], None if d_t is None else d_t[:, 0],
                                  log_t[:, 1], None if d_t is None else d_t[:, 1])
  log_j = _where(failed, jnp.inf, total + shift)
  if not with_grad:
    return log_j
  # The reference constant m_ref (m_ref - 1)/(2 sigma^2) is added back: its sigma-derivative.
  d_shift = jnp.stack([jnp.zeros_like(shift), -2 * shift / sigma, jnp.zeros_like(shift)], axis=-1)
  grads = _where(failed[:, None], 0.0, d_total + d_shift)
  return log_j, grads


_PRIMAL = threading.local()   # .skip: the next custom_vmap primal traced is a placeholder


def _placeholder_primal():
  """True once after :func:`_rule_only_when_batched` asked for it (and then False)."""
  skip = getattr(_PRIMAL, "skip", False)
  _PRIMAL.skip = False
  return skip


def _rule_only_when_batched(kernel):
  """``kernel`` (a :func:`jax.custom_batching.custom_vmap` whose primal returns a placeholder
  when :func:`_placeholder_primal` says so) called so that, on values being batched by
  :func:`jax.vmap`, the primal is not traced: custom_vmap traces it for the unbatched shapes
  before the batching rule replaces it, which would trace the whole kernel twice. The
  placeholder (NaN of the output's shape) is never evaluated: the rule's result replaces it."""
  @functools.wraps(kernel)
  def call(*args):
    if not any(compilation.batched(x) for x in jax.tree_util.tree_leaves(args)):
      return kernel(*args)
    _PRIMAL.skip = True
    try:
      return kernel(*args)
    finally:
      _PRIMAL.skip = False
  return call


def _flat_kernel(with_grad):
  """_log_j_flat for flat inputs, with a batching rule that flattens any vmapped batch into
  the same flat kernel (so jax.vmap never batches its loops)."""
  @jax.custom_batching.custom_vmap
  def kernel(q, sigma, alpha):
    if _placeholder_primal():
      nan = jnp.full(q.shape, jnp.nan, q.dtype)
      return (nan, jnp.full(q.shape + (3,), jnp.nan, q.dtype)) if with_grad else nan
    return _log_j_flat(q, sigma, alpha, with_grad)

  @kernel.def_vmap
  def _rule(axis_size, in_batched, q, sigma, alpha):
    args = [x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)
            for x, b in zip((q, sigma, alpha), in_batched)]
    shape = args[0].shape
    out = kernel(*(x.reshape(-1) for x in args))
    out = jax.tree_util.tree_map(lambda v: v.reshape(shape + v.shape[1:]), out)
    return out, jax.tree_util.tree_map(lambda _: True, out)

  return _rule_only_when_batched(kernel)


_KERNEL = _flat_kernel(False)
_KERNEL_WITH_GRAD = _flat_kernel(True)


@jax.custom_jvp
def _log_j(q, sigma, alpha):
  """log J = log((A_alpha - 1)/(alpha - 1)) on flat arrays; +inf where it cannot be certified."""
  return _KERNEL(q, sigma, alpha)


@_log_j.defjvp
def _log_j_jvp(primals, tangents):
  # The windows do not depend on the parameters (they only decide where to look), so d log J
  # is the quadrature of the integrand's derivative on the same nodes, at the level each
  # element reached; the kernel accumulates it alongside the value (one pass). The tangent is
  # linear in the inputs' tangents, so JAX transposes it for reverse mode.
  log_j, grads = _KERNEL_WITH_GRAD(*primals)
  tangent = sum(grads[..., i] * t for i, t in enumerate(tangents))
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

  Raises:
    ValueError: (eagerly) an argument outside its range, or arguments that do not broadcast.

  References:
    Mironov, Talwar, Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
    arXiv:1908.10530, Sec. 3 (definition of A_α; Sec. 3.3 numerically stable computation).
  """
  validation.check("sampling_rate", q, name="q")
  validation.check("noise_multiplier", sigma, name="sigma")
  validation.check("orders", alpha, name="alpha")
  validation.check_broadcast(q=q, sigma=sigma, alpha=alpha)
  return log_a_and_rdp(q, sigma, alpha)[0]


def rdp_sampled_gaussian(q: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
                         orders: jax.typing.ArrayLike) -> jax.Array:
  r"""RDP ε(α) = log A_α / (α − 1) of one step of the Poisson-sampled Gaussian mechanism.

  ``orders`` may contain 1 (the KL divergence, the limit α → 1, computed without dividing by
  zero: the kernel integrates :math:`(A_\alpha - 1)/(\alpha - 1)` directly) and ``inf``
  (+inf unless q = 0). Broadcasts ``q``, ``noise_multiplier`` and ``orders``.

  Args:
    q: sampling rate in [0, 1].
    noise_multiplier: σ, noise standard deviation / L2 sensitivity, >= 0.
    orders: Rényi orders >= 1 (``inf`` allowed).

  Returns:
    The RDP at each order, broadcast shape, in the inputs' floating dtype.

  Raises:
    ValueError: (eagerly) an argument outside its range, or arguments that do not broadcast.

  References:
    Mironov, Talwar, Zhang (2019), arXiv:1908.10530, Sec. 3; Mironov (2017), Def. 3.
  """
  validation.check("sampling_rate", q, name="q")
  validation.check("noise_multiplier", noise_multiplier)
  validation.check("orders", orders)
  validation.check_broadcast(q=q, noise_multiplier=noise_multiplier, orders=orders)
  return log_a_and_rdp(q, noise_multiplier, orders)[1]


def log_a_and_rdp(q, sigma, alpha):
  """(log A, RDP) without argument checks: the internal entry point (validate at the public
  boundary, then call this). Converts to floating arrays and broadcasts. Concrete inputs are
  broadcast and flattened on the host and padded to :func:`jaxrdp._internal.compilation.bucket` elements
  (generic stand-ins), so that eager calls of any shape share a few compiled programs."""
  q = validation.as_float_array(q)
  sigma = validation.as_float_array(sigma)
  alpha = validation.as_float_array(alpha)
  if not validation.is_concrete((q, sigma, alpha)):
    return _log_a_and_rdp_jit(q, sigma, alpha)
  dtype = jnp.result_type(q, sigma, alpha)
  if q.ndim == 0 and sigma.ndim == 0 and alpha.ndim == 1:
    on_grid = _on_concrete_grid(q, sigma, alpha, dtype)
    if on_grid is not None:
      return on_grid
  arrays = np.broadcast_arrays(*(np.asarray(v, dtype) for v in (q, sigma, alpha)))
  shape, n = arrays[0].shape, arrays[0].size
  if n == 0 or n > compilation.BUCKET_MAX:
    return _log_a_and_rdp_jit(*(jnp.asarray(v) for v in arrays))
  size = compilation.bucket(n)
  flat = [np.concatenate([v.reshape(-1), np.full(size - n, fill, dtype)])
          for v, fill in zip(arrays, (0.5, 1.0, 2.0))]
  out = _log_a_and_rdp_jit(*flat)
  return tuple(jnp.asarray(np.asarray(v)[:n].reshape(shape)) for v in out)


def _on_concrete_grid(q, sigma, orders, dtype):
  """(log A, RDP) of one (q, sigma) at a concrete 1-D grid of orders through the exact sums
  and shared nodes (:func:`log_a_and_rdp_at_orders`), as ``compute_rdp`` computes it, when
  they cover every order and certify every value (None otherwise: the caller then takes the
  per-order quadrature, so no value is left +inf that it would compute). A first call then
  compiles those instead of the per-order quadrature (about half the time for dp_accounting's
  grid)."""
  split = order_split(orders)
  covered = sum(len(p) for p, _ in split.sums) + sum(len(g) for g in split.shared)
  if covered != orders.shape[0]:
    return None
  log_a_value, rdp, pending = _on_grid_jit(
      np.asarray(q, dtype)[None], np.asarray(sigma, dtype)[None], np.asarray(orders, dtype),
      split, order_tables(orders, split))
  if np.asarray(pending).any():
    return None
  return log_a_value[0], rdp[0]


@functools.partial(compilation.jit, static_argnames=("split",),
                   work=lambda arguments: arguments["orders"].size)   # not the tables' size
def _on_grid_jit(q, sigma, orders, split, tables):
  return log_a_and_rdp_at_orders(q, sigma, orders, split, tables, fallback=False)


@compilation.jit
def _log_a_and_rdp_jit(q, sigma, alpha):
  dtype = jnp.result_type(q, sigma, alpha)
  q, sigma, alpha = jnp.broadcast_arrays(q.astype(dtype), sigma.astype(dtype), alpha.astype(dtype))
  shape = q.shape
  if q.size == 0:
    return q, q
  log_a_value, rdp = _terms(q.reshape(-1), sigma.reshape(-1), alpha.reshape(-1))
  return log_a_value.reshape(shape), rdp.reshape(shape)


def _generic(q, sigma, alpha):
  """Where the kernel is needed (0 < q < 1, sigma > 0, 1 <= alpha < inf), and the parameters
  with safe stand-ins elsewhere (double-where: NaN-free gradients)."""
  generic = (q > 0) & (q < 1) & (sigma > 0) & jnp.isfinite(alpha) & (alpha >= 1)
  return (generic, _where(generic, q, 0.5), _where(generic, sigma, 1.0),
          _where(generic, alpha, 2.0))


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
    the KL's slope, at :math:`\alpha = 1`); added as :math:`(q - \mathrm{sg}(q))` times it.

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
  # q = 1: the closed form plus (q - stop_gradient(q)) times the one-sided slopes above, from a
  # finite 1/(2 sigma^2) (where sigma^2 underflows the value is +inf and 0 * inf would be NaN).
  inv_fin = _where(jnp.isfinite(inv_2s2), inv_2s2, 0.5)
  t = 2 * (a_fin - 1) * inv_fin
  t_nonzero = t != 0
  t_safe = _where(t_nonzero, t, 1.0)
  one_minus_e = -jnp.expm1(-t)
  rate = _where(t_nonzero, -jnp.expm1(-t_safe) / t_safe, 1.0)   # (1 - e^-t)/t, 1 at t = 0
  dq = q - lax.stop_gradient(q)
  log_a_q1 = a_fin * (a_fin - 1) * inv_2s2 + dq * (a_fin * one_minus_e)
  rdp_q1 = a_fin * inv_2s2 + dq * (2 * a_fin * inv_fin * rate)

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


# --- a concrete grid of orders: exact sums at integer orders, shared nodes at fractional ones ---

_MAX_INTEGER_ORDER = 4096    # integer orders up to this are summed exactly (O(alpha) terms)
_SUM_BUCKETS = (64, 256, 1024, 4096)   # orders up to each are summed over k <= it
_SUM_ELEMENTS = 1 << 24      # terms per step of the summation (bounds memory)
_SHARED_MAX_ORDER = 64.0     # fractional orders up to this share one grid of nodes per group
_SHARED_GROUP = 32           # orders per group (one window and one set of nodes per pair)
_SHARED_SPAN = 4.0           # a group's orders lie in [a, max(2 a, a + _SHARED_SPAN)]
_SHARED_INTERVALS = 128      # intervals of the shared grid
_SHARED_ELEMENTS = 1 << 20   # (row, order, node) elements per step (bounds memory)
_FALLBACK_BATCH = 256        # (pair, order) elements of the per-order quadrature per step


class OrderSplit(tuple):
  """Static description of a concrete 1-D order grid (hashable: a static jit argument).

  ``sums``: tuples ``(positions, k_max)`` of integer orders in [2, 4096], summed exactly,
  one tuple per bucket of _SUM_BUCKETS (k_max: the bucket's end; the orders' values stay
  dynamic, with their binomial coefficients from :func:`order_tables`); ``shared``: tuples of
  positions of fractional orders in (1, 64], ascending, each one group of the shared-node
  quadrature. Every other position (1, inf, NaN, larger orders) goes to the per-order
  quadrature."""

  def __new__(cls, sums, shared):
    return super().__new__(cls, (sums, shared))

  @property
  def sums(self):
    return self[0]

  @property
  def shared(self):
    return self[1]


def order_split(orders):
  """:class:`OrderSplit` of a concrete 1-D order array; None when ``orders`` is traced."""
  if isinstance(orders, jax.core.Tracer):
    return None
  # Remembered per grid: searches and calibrations ask for it at every call.
  return _order_split(np.asarray(orders, np.float64).reshape(-1).tobytes())


@functools.lru_cache(maxsize=64)
def _order_split(key):
  a = np.frombuffer(key, np.float64)
  with np.errstate(invalid="ignore"):
    integer = (a == np.round(a)) & (a >= 2) & (a <= _MAX_INTEGER_ORDER)
    shared = (a > 1) & (a <= _SHARED_MAX_ORDER) & ~integer & np.isfinite(a)
  sums = []
  for lo, hi in zip((2,) + tuple(b + 1 for b in _SUM_BUCKETS[:-1]), _SUM_BUCKETS):
    pos = np.nonzero(integer & (a >= lo) & (a <= hi))[0]
    if pos.size:
      sums.append((tuple(int(i) for i in pos), hi))
  groups, current = [], []
  for i in np.nonzero(shared)[0][np.argsort(a[shared], kind="stable")]:
    if current and (len(current) == _SHARED_GROUP
                    or a[i] > max(2 * a[current[0]], a[current[0]] + _SHARED_SPAN)):
      groups.append(tuple(current))
      current = []
    current.append(int(i))
  if current:
    groups.append(tuple(current))
  return OrderSplit(tuple(sums), tuple(groups))


def order_tables(orders, split):
  """The log-binomial tables of the exact sums of :func:`order_split` (one float64 array per
  bucket, (orders in it, k_max + 1)), from the concrete ``orders``; None without a split.
  Passed as an argument, so that grids with the same split share one compiled program."""
  if split is None:
    return None
  a = np.asarray(orders, np.float64).reshape(-1)
  return tuple(_log_binomials(tuple(int(v) for v in a[np.asarray(pos)]), k_max)
               for pos, k_max in split.sums)


def _log_expm1_of_square(k, log_sigma, inv_s2):
  """log(e^c - 1) for c = k(k-1)/(2 sigma^2), k >= 2 (from log sigma and 1/sigma^2). Where
  c is below 1e-8 it is log c + c/2 (within 1e-17 relative), with log c taken from log
  sigma: for huge sigma c underflows (float64 above ~1e154, float32 above ~1e19), and
  e^c - 1 = 0 would make the result +inf instead of the tiny true value."""
  half = k * (k - 1) / 2   # k: a NumPy array (constants: no kernel of their own); exact
  c = half.astype(inv_s2.dtype) * inv_s2
  tiny = c < 1e-8
  log_c = np.log(half).astype(inv_s2.dtype) - 2 * log_sigma
  c_safe = _where(tiny, 1.0, c)
  return _where(tiny, log_c + c / 2, c_safe + jnp.log(-jnp.expm1(-c_safe)))


_SUM_CHUNK = 65   # terms per chunk of the exact sums (k = 0..64: one chunk for orders <= 64)


def _log_j_integer(per_pair, log1m_q, alphas, log_binoms):
  r"""log J = log((A_α − 1)/(α − 1)) for integer orders α >= 2, exactly:

  .. math:: A_\alpha - 1 = \sum_{k=2}^{\alpha} \binom{\alpha}{k} q^k (1-q)^{\alpha-k}
            \big(e^{k(k-1)/(2\sigma^2)} - 1\big),

  the binomial expansion of :math:`E_{\mu_0}[(1-q+qL)^\alpha]` with :math:`E_{\mu_0}[L^k] =
  e^{k(k-1)/(2\sigma^2)}` (Mironov, Talwar, Zhang 2019, Sec. 3.2) minus the same expansion of
  :math:`1 = (1-q+q)^\alpha`: a sum of non-negative terms, summed in log space, so nothing
  cancels (float32 too). ``per_pair``: :func:`_per_pair_terms` (n, >= K+1); ``log1m_q``:
  log(1 - q), shape (n, 1); ``alphas``: one array of orders per bucket (m_b,), ``log_binoms``:
  their log C(α, k), (m_b, K_b + 1), -inf unless 2 <= k <= α. Returns (n, Σ m_b), the buckets'
  orders in turn. The terms depend on (q, sigma, k) and on (alpha, k) separately: both parts
  are computed once and shared across orders / pairs.

  Every bucket's rows are cut into chunks of _SUM_CHUNK terms and all chunks of all buckets
  summed together (log-sum-exp per chunk, then over each order's chunks): one set of kernels
  for any number of buckets, where a set per bucket cost XLA a compilation each.
  """
  chunks, counts = [], []
  for alpha, log_binom in zip(alphas, log_binoms):
    m, width = log_binom.shape
    per_order = -(-width // _SUM_CHUNK)
    terms = log_binom[None] + per_pair[:, None, :width] + (log1m_q * alpha[None, :])[..., None]
    terms = _where(jnp.isfinite(log_binom)[None], terms, -jnp.inf)
    terms = jnp.pad(terms, ((0, 0), (0, 0), (0, per_order * _SUM_CHUNK - width)),
                    constant_values=-jnp.inf)
    chunks.append(terms.reshape(terms.shape[0], m * per_order, _SUM_CHUNK))
    counts += [per_order] * m
  terms = jnp.concatenate(chunks, axis=1) if len(chunks) > 1 else chunks[0]
  top = lax.stop_gradient(jnp.max(terms, axis=-1))
  has_terms = jnp.isfinite(top)   # false for a chunk of padding only (k beyond its order)
  top = _where(has_terms, top, 0.0)
  total = jnp.sum(jnp.exp(terms - top[..., None]), axis=-1)   # 0 for padding only
  alpha = jnp.concatenate(alphas) if len(alphas) > 1 else alphas[0]
  if max(counts) == 1:
    log_a_minus_1 = jnp.log(total) + top
  else:
    # Each order's chunks (n, m, most chunks; padded with a chunk of nothing), summed in
    # linear space relative to the largest of their tops: no logarithm of a partial sum is
    # rounded (in float32 that would cost ~|log A| ulps).
    # (Constant indices, the padding masked: a concatenation is a loop per piece.)
    starts = np.cumsum([0] + counts[:-1])
    index = np.array([[start + min(j, count - 1) for j in range(max(counts))]
                      for start, count in zip(starts, counts)])
    valid = np.arange(max(counts)) < np.array(counts)[:, None]
    chunk_top = _where(valid & has_terms[:, index], top[:, index], -jnp.inf)
    chunk_total = _where(valid, total[:, index], 0.0)
    top = jnp.max(chunk_top, axis=-1)   # finite: every order has terms
    weighted = chunk_total * jnp.exp(chunk_top - top[..., None])
    log_a_minus_1 = jnp.log(jnp.sum(weighted, axis=-1)) + top
  return log_a_minus_1 - jnp.log(alpha - 1)


@functools.lru_cache(maxsize=None)
def _log_binomials(orders, k_max):
  """log C(a, k) for each integer order a and 0 <= k <= k_max, -inf unless 2 <= k <= a
  (float64, each entry correctly rounded: C(a, k) is an exact integer)."""
  table = np.full((len(orders), k_max + 1), -np.inf)
  for row, a in enumerate(orders):
    c = a   # C(a, 1); then C(a, k + 1) = C(a, k) (a - k) / (k + 1), exactly in integers
    for k in range(2, a + 1):
      c = c * (a - k + 1) // k
      table[row, k] = math.log(c)
  table.flags.writeable = False
  return table


def _in_row_blocks(fn, rows, *arrays):
  """fn(tuple of arrays) on blocks of ``rows`` leading entries (lax.map), outputs
  concatenated: working memory of one block for any size."""
  n = arrays[0].shape[0]
  if n <= rows:
    return fn(arrays)
  n_blocks = -(-n // rows)
  pad = n_blocks * rows - n
  split = lambda v: jnp.concatenate([v, jnp.broadcast_to(v[:1], (pad,) + v.shape[1:])]).reshape(
      (n_blocks, rows) + v.shape[1:])
  out = loops.map(fn, tuple(split(v) for v in arrays))
  return jax.tree_util.tree_map(lambda v: v.reshape((n_blocks * rows,) + v.shape[2:])[:n], out)


def _pair_constants(q, sigma, sigma_raw):
  """(log q, log sigma), log(1 - q), (1/sigma^2, 1/(2 sigma_raw^2)) for the generic
  stand-ins q, sigma (n,) and sigma_raw (1/2 where sigma_raw = 0), shapes (n, 2), (n, 1),
  (n, 2): each function once on the columns it serves (:func:`_select_columns`). XLA computes
  each as a kernel of its own wherever it is used (an expensive function of a per-pair value
  that is broadcast), so three kernels rather than five."""
  wide = lambda v: jnp.broadcast_to(v[:, None], v.shape + (2,))
  s_raw = wide(_where(sigma_raw > 0, sigma_raw, 1.0))
  logs = jnp.log(_select_columns([wide(q), wide(sigma)]))
  reciprocals = 1 / _select_columns([wide(sigma * sigma), 2 * s_raw * s_raw])
  return logs, jnp.log1p(-q)[:, None], reciprocals


def _per_pair_terms(pair, k_max):
  """k log(q / (1 - q)) + log(e^{k(k-1)/(2 sigma^2)} - 1) for k = 0 .. k_max (k < 2 as k = 2:
  their binomial coefficients are -inf), shape (n, k_max + 1), from :func:`_pair_constants`;
  and log(1 - q), shape (n, 1)."""
  k = np.arange(k_max + 1, dtype=np.float64)
  (logs, log1m_q, reciprocals) = pair
  log_q, log_sigma, inv_s2 = logs[:, :1], logs[:, 1:], reciprocals[:, :1]
  per_pair = (k.astype(log_q.dtype) * (log_q - log1m_q)
              + _log_expm1_of_square(np.maximum(k, 2.0), log_sigma, inv_s2))
  return per_pair, log1m_q


def _integer_orders(pair, alphas, tables):
  """log J (n, m) at the integer orders of every bucket of the split for flat generic q,
  sigma given by their :func:`_pair_constants` ``pair`` (``alphas``: one array per
  bucket, ``tables``: their log-binomial tables (m_b, k_max + 1) from :func:`order_tables`),
  concatenated. The per-pair terms are computed once, up to the largest bucket."""
  tables = [t.astype(pair[0].dtype) for t in tables]
  k_max = max(t.shape[1] for t in tables) - 1

  def block(pairs):
    per_pair, log1m_q = _per_pair_terms(pairs, k_max)
    return _log_j_integer(per_pair, log1m_q, alphas, tables)

  terms = sum(t.shape[0] * t.shape[1] for t in tables)
  return _in_row_blocks(block, max(1, _SUM_ELEMENTS // terms), *pair)


def _grid_nodes(z, inv_2s2, log_q, log1m_q, q):
  """The order-independent part of the integrand at the nodes z (see :func:`_integrand`);
  ``inv_2s2``: 1/(2 sigma^2)."""
  dtype = z.dtype
  u = (2 * z - 1) * inv_2s2
  is_zero = u == 0
  u = _where(is_zero, jnp.ones_like(u), u)
  positive = u > 0
  big = u > 1
  # Functions applied once to two arguments each (selected side by side): XLA computes an
  # expensive function of values used in several places as a kernel of its own.
  pair = lambda a, b: _select_columns([jnp.broadcast_to(v[..., None], v.shape + (2,))
                                       for v in (a, b)])
  m = jnp.expm1(pair(-jnp.abs(u), _where(big, 1.0, u)))
  v = log1m_q - log_q - u   # softplus(v) = max(v, 0) + log1p(e^-|v|) (see _softplus)
  l = jnp.log1p(pair(jnp.exp(jnp.maximum(-jnp.abs(v), _exp_floor(dtype))), q * m[..., 1]))
  log_q1m = _where(is_zero, -jnp.inf, log_q + jnp.log(-m[..., 0]))
  log_abs_x = log_q1m + jnp.maximum(u, 0)
  ell_minus_u_big = log_q + (jnp.maximum(v, 0) + l[..., 0])
  # where, not minimum: a node exactly at u = 1 keeps its whole derivative (see _integrand).
  ell_moderate = l[..., 1]
  ell = _where(big, u + ell_minus_u_big, ell_moderate)
  abs_ell = jnp.abs(ell)
  abs_ell = _where(abs_ell > 0, abs_ell, jnp.finfo(dtype).tiny)
  log_abs_ell = jnp.log(abs_ell)
  # x, and for x < 0 N/P up to the factor exprel: (1 - |x|) |ell| / |x| = e^ell |ell| / |x|
  # (<= 1).
  log_radius = math.log(_SERIES_RADIUS)
  e = jnp.exp(pair(_where(log_abs_x <= log_radius, log_abs_x, log_radius),
                   jnp.minimum(ell, 0.0) + log_abs_ell - log_abs_x))
  x, ratio_neg = e[..., 0], e[..., 1]
  return dict(z=z, positive=positive, log_q1m=log_q1m, log_abs_x=log_abs_x, ell=ell,
              ell_minus_u=_where(big, ell_minus_u_big, ell_moderate - u), abs_ell=abs_ell,
              log_abs_ell=log_abs_ell, x=_where(positive, x, -x), ratio_neg=ratio_neg)


def _order_stack(alpha, axis=0):
  """alpha and its four per-order constants stacked along a new ``axis`` of size 5: alpha, the
  series radius x_s = min(0.1, 1/(2 alpha)) of :func:`_grid_terms`, log x_s, log(alpha/2), and
  log(alpha - 1) for :func:`_assess` (0 at alpha <= 1). Computed once per order, outside the
  loops over nodes, as one kernel: each function is applied once to the entries it serves
  (:func:`_select_columns`)."""
  alpha = jnp.expand_dims(alpha, axis)
  shape = list(alpha.shape)
  shape[axis] = 5
  a = jnp.broadcast_to(alpha, tuple(shape))
  one = jnp.ones_like(a)
  x_small = jnp.minimum(_SERIES_RADIUS, 0.5 / _select_columns([one, a, a, one, one], axis=axis))
  logs = jnp.log(_select_columns([a, x_small, x_small, a / 2, _beta_or_one(a)], axis=axis))
  return _select_columns([a, x_small, logs, logs, logs], axis=axis)


def _order_constants(alpha):
  """(x_s, log x_s, log(alpha/2), log(alpha - 1)) of :func:`_order_stack`."""
  stack = _order_stack(alpha)
  return stack[1], stack[2], stack[3], stack[4]


def _select_columns(columns, axis=-1):
  """The arrays ``columns`` (one shape, k entries along ``axis``) as one array whose entry i
  along ``axis`` is that of ``columns[i]``: one select each, so that XLA computes it as one
  kernel (a concatenation of computed pieces is a kernel per piece on CPUs).
  To compute expensive functions of per-row values in the same kernel, select their
  arguments first and apply each function to the whole selection (see :func:`_log_j_levels`):
  a function of a broadcast per-row value is moved before the broadcast by XLA, where it is
  a kernel of its own."""
  shape, axis = columns[0].shape, axis % columns[0].ndim
  # A NumPy constant: an iota would be a kernel of its own where it feeds a loop.
  column = np.arange(shape[axis]).reshape((-1,) + (1,) * (len(shape) - 1 - axis))
  out = columns[-1]
  for i in range(len(columns) - 2, -1, -1):
    out = _where(column == i, columns[i], out)
  return out


def _order_block(alphas):
  """(..., 5 g): the orders ``alphas`` (..., g) followed by each of their four
  :func:`_order_constants`, g columns each (one kernel)."""
  return _order_stack(alphas, axis=-2).reshape(alphas.shape[:-1] + (5 * alphas.shape[-1],))


def _grid_terms(nodes, inv_2s2, alpha, m_ref, exponent_only=False, constants=None):
  r"""The integrand of :func:`_integrand` at shared nodes, as exponent and multiplier:
  :math:`\varphi_\sigma(z) g_\alpha(x) = \sqrt{2\pi}\sigma\,
  e^{m_{ref}(m_{ref}-1)/(2\sigma^2)}\, e^{e}\, \mathrm{mult}` with ``mult`` >= 0 of order
  one. The same branches and local powers m as :func:`_integrand` (series with m = 2 or 0;
  P - N with m = alpha or 0), written so that each (node, order) costs two exponentials and
  one expm1 (the logarithms are per node): for x > 0, mult = exprel(-beta ell) -
  x e^{-alpha ell}/ell; for x < 0, mult = 1 - (1-|x|)|ell| exprel(-beta|ell|)/|x|; in the
  series region mult is the series' sum. ``inv_2s2``: 1/(2 sigma^2); ``m_ref``: the
  reference power (broadcasts).
  ``exponent_only``: the exponent alone (mult None), without tracing the multiplier.
  ``constants``: :func:`_order_constants` of ``alpha`` where already computed."""
  z, positive = nodes["z"], nodes["positive"]
  dtype = z.dtype
  beta = alpha - 1
  x_small, log_x_small, log_alpha_half, _ = (_order_constants(alpha) if constants is None
                                              else constants)
  small = nodes["log_abs_x"] <= log_x_small
  relative = lambda m: (m - m_ref) * (m + m_ref - 1) * inv_2s2
  ell, ell_minus_u, log_abs_ell = nodes["ell"], nodes["ell_minus_u"], nodes["log_abs_ell"]
  # Exponents. Series: g = (alpha/2) x^2 sum_j c_j x^j with m = 2 (x > 0) or 0.
  m_series = _where(positive, 2.0, 0.0).astype(dtype)
  e_series = (log_alpha_half + 2 * _where(small, nodes["log_q1m"], log_x_small)
              - (z - m_series) ** 2 * inv_2s2 + relative(m_series))
  size_alpha = jnp.maximum(jnp.maximum(alpha * alpha, (z - alpha) ** 2) * inv_2s2,
                           jnp.abs(alpha * ell_minus_u))
  size_zero = jnp.maximum(z * z * inv_2s2, jnp.abs(alpha * ell))
  e_pos = _where(size_alpha < size_zero,
                    relative(alpha) + alpha * ell_minus_u - (z - alpha) ** 2 * inv_2s2,
                    relative(0.0) + alpha * ell - z * z * inv_2s2) + log_abs_ell
  e_neg = relative(0.0) - z * z * inv_2s2 + nodes["log_abs_x"]
  e = _where(small, e_series, _where(positive, e_pos, e_neg))
  if exponent_only:
    return e, None
  # Multipliers. The series by Horner in the clipped x.
  coefficients = [jnp.ones_like(alpha)]
  for j in range(_SERIES_TERMS):
    coefficients.append(coefficients[-1] * ((alpha - (2 + j)) / (j + 3)))
  x = _where(small, nodes["x"], 0.0)   # |x| <= x_small there (where: see _integrand)
  series = coefficients[-1]
  for c in coefficients[-2::-1]:
    series = c + x * series
  # Direct: exprel(-beta |ell|), shared by both signs of x.
  abs_ell = _where(small, 1.0, nodes["abs_ell"])
  t = -beta * abs_ell
  exprel = jnp.expm1(t) / t
  mult_pos = exprel - jnp.exp(jnp.minimum(nodes["log_abs_x"] - alpha * ell - log_abs_ell, 0.0))
  mult_neg = 1 - nodes["ratio_neg"] * exprel
  mult = _where(small, series, _where(positive, mult_pos, mult_neg))
  return e, jnp.maximum(mult, 0.0)


def _shared_span(q, sigma, alphas, intervals=_SHARED_INTERVALS):
  r"""(lo, h): the shared grid of each row, [lo, lo + _SHARED_INTERVALS h] with
  lo = -_HALF_WIDTH sigma and hi = max(2, alpha_max) + (_HALF_WIDTH + 1) sigma, in closed form.

  Why it holds every order's integrand :math:`\varphi_\sigma(z) g_\alpha(x(z))`: its bumps lie
  in [0, max(2, alpha)] (near 0 and 2 where :math:`g \approx \tfrac{\alpha}{2}x^2`, and the right mode
  of :math:`z = \alpha p(z)`, :math:`p \le 1`), and outside they decay at least as fast as a
  Gaussian of standard deviation sigma: for :math:`z \le 0`, :math:`x \in (-q, 0)` and
  :math:`g(x) \le g(-q)` grows at most as z falls, so the integrand is at most
  :math:`\varphi_\sigma(z) g(-q)`; for :math:`z \ge \alpha`, the log-derivative of
  :math:`\varphi_\sigma(z)(1 - q + qL)^\alpha` is :math:`(\alpha p(z) - z)/\sigma^2 \le
  (\alpha - z)/\sigma^2`. Eleven standard deviations are a factor :math:`e^{-60}`. The window
  only places the nodes: every result is still certified, including the integrand's decay
  at both edges (:func:`_assess`), so a window too short for some (q, sigma) leaves that value
  open (for the per-order kernel), never smaller. No orders' modes are searched. Measured
  against the window around the bisected modes it replaced, on dp_accounting's grid for q in
  [1e-12, 1), sigma in [0.05, 2000] (645,000 values): 1,629 vs 1,624 left open in float64,
  612 vs 710 in float32, values within 1.4e-13; 2,000 pairs in the benchmark's box run as
  fast."""
  del q
  lo = -_HALF_WIDTH * sigma
  hi = jnp.maximum(alphas[:, -1], 2.0) + (_HALF_WIDTH + 1) * sigma
  return lo, (hi - lo) / intervals


def _reference_power(e_abs, inv_2s2, alpha):
  """(m_ref, ref): of m in {0, 2, alpha}, the power whose constant m(m-1)/(2 sigma^2) is
  nearest the peak of the exponents ``e_abs`` (absolute scale, nodes on the last axis), and
  the peak relative to that constant: the dominant terms are then summed relative to their
  own constant (see :func:`_integrand`), which is what keeps float32 exact. The peak only
  sets the scale of the sums (the log integrand changes by well under a nat between the
  nodes it is located on)."""
  peak = jnp.max(e_abs, axis=-1, keepdims=True)
  alpha = jnp.broadcast_to(alpha, peak.shape)
  distance = lambda m: jnp.abs(peak - m * (m - 1) * inv_2s2)
  d_zero, d_two = distance(jnp.zeros_like(peak)), distance(jnp.full_like(peak, 2.0))
  d_alpha = distance(alpha)
  # The first of the nearest (argmin's order: 0, 2, alpha).
  m_ref = _where((d_zero <= d_two) & (d_zero <= d_alpha), 0.0,
                    _where(d_two <= d_alpha, 2.0, alpha)).astype(peak.dtype)
  return m_ref, _where(jnp.isfinite(peak), peak - m_ref * (m_ref - 1) * inv_2s2, 0.0)


def _log_j_shared(q, sigma, alphas, tangents, intervals=_SHARED_INTERVALS):
  r"""log J (r, g) and its tangent on rows: flat generic q, sigma (r,), each row with its own
  ascending orders ``alphas`` (r, g), on one grid of ``intervals`` + 1 nodes per row
  (:func:`_shared_span`); +inf (tangent 0) where a value cannot be certified. The tangent (of
  q, sigma, alphas given by ``tangents``) is the quadrature of the integrand's derivative on
  the same nodes, in the same pass (window, reference power and scale held fixed, as in the
  per-order kernel: they decide where and relative to what to sum, not the value). The
  values alone take :func:`_log_j_levels`, which refines instead."""
  r, g = alphas.shape
  dtype = q.dtype
  sg = lax.stop_gradient
  q, sigma, alphas = sg(q), sg(sigma), sg(alphas)
  lo, h = _shared_span(q, sigma, alphas, intervals)
  i = jnp.arange(intervals + 1, dtype=dtype)
  ex = lambda v: v[:, None, None]
  z = ex(lo) + ex(h) * i
  inv_2s2 = lambda s_: ex(0.5 / (s_ * s_))
  nodes_of = lambda q_, s_: _grid_nodes(z, inv_2s2(s_), ex(jnp.log(q_)), ex(jnp.log1p(-q_)), ex(q_))
  nodes = nodes_of(q, sigma)
  alpha = alphas[..., None]
  coarse = max(4, intervals // 512)   # the peak located on every fourth node at most
  e_abs, _ = _grid_terms({k: v[..., ::coarse] for k, v in nodes.items()}, inv_2s2(sigma), alpha,
                         jnp.zeros_like(alpha), exponent_only=True)
  m_ref, ref = _reference_power(e_abs, inv_2s2(sigma), alpha)
  weight = _where((i == 0) | (i == intervals), 0.5, 1.0).astype(dtype)
  const = ref[..., 0] + (jnp.log(h) - 0.5 * math.log(2 * math.pi))[:, None]   # held fixed

  def log_j_of(q_, s_, a_):   # log J - const, and the summed values (relative to ref)
    e, mult = _grid_terms(nodes_of(q_, s_), inv_2s2(s_), a_[..., None], m_ref)
    values = jnp.exp(jnp.maximum(e - ref, _exp_floor(dtype))) * mult
    log_j = (jnp.log(jnp.sum(values * weight, axis=-1)) - jnp.log(s_)[:, None]
             + _reference_constant(m_ref[..., 0], s_[:, None]))
    return log_j, values

  log_j, d_log_j, values = jax.jvp(log_j_of, (q, sigma, alphas), tuple(tangents), has_aux=True)
  log_j = log_j + const
  shift = _reference_constant(m_ref[..., 0], sigma[:, None])
  base = const - jnp.log(sigma)[:, None]   # the rules' sums are relative to the shift
  rule = lambda every: jnp.log(jnp.sum(values[..., ::every] * weight[::every], axis=-1)) + base + math.log(every)
  edge = jnp.log(jnp.maximum(values[..., 0], values[..., -1])) + base
  failed = _assess(log_j - shift, rule(2), rule(4), edge, shift,
                   *_rates(h[:, None], sigma[:, None]), alphas)
  return _where(failed, jnp.inf, log_j), _where(failed, 0.0, d_log_j)


_TANGENT_INTERVALS = (_SHARED_INTERVALS, 16 * _SHARED_INTERVALS)   # grids of _shared_tangents


_FINE_ONLY = 1024   # (pair, order) elements up to which tangents take the 2049 nodes at once


def _on_finer_grid_where_open(run, open_of, elements):
  """``run(intervals)`` -> (log J, tangent) on 129 nodes, and where ``open_of(log J)`` says a
  value is left open, again on 2049 (a ``lax.cond``: run only then). Up to _FINE_ONLY
  ``elements`` on 2049 nodes at once: one copy of the kernel in the graph (the compile time
  of a second is worth far more than the run time of 16x the nodes on so few)."""
  if elements <= _FINE_ONLY:
    return run(_TANGENT_INTERVALS[1])
  first = run(_TANGENT_INTERVALS[0])
  return lax.cond(jnp.any(open_of(first[0])), lambda _: run(_TANGENT_INTERVALS[1]),
                  lambda _: first, None)


def _shared_tangents(q, sigma, alphas, groups, tangents):
  """(log J, its tangent) (n, m) of the orders of ``groups`` on shared nodes with tangents
  (:func:`_shared_values`), on the grids of :func:`_on_finer_grid_where_open`; +inf (tangent
  0) where even 2049 nodes cannot certify a value, and at every order outside ``groups``."""
  grouped = np.zeros(alphas.shape[0], bool)
  for g in groups:
    grouped[list(g)] = True
  run = lambda intervals: _shared_values(q, sigma, alphas, groups, tangents, intervals)
  if not groups:
    return run(_SHARED_INTERVALS)
  return _on_finer_grid_where_open(run, lambda log_j: ~jnp.isfinite(log_j[:, grouped]),
                                   q.shape[0] * int(grouped.sum()))


def rdp_tangent_at_order(q, sigma, alpha, dq, dsigma):
  r"""(RDP, its tangent along (``dq``, ``dsigma``), certified) of flat q, sigma (n,) at one
  order ``alpha`` (a scalar, traced or not), without argument checks: the derivative that the
  envelope theorem needs at the optimal order of a conversion (Mironov, Talwar, Zhang 2019,
  Sec. 3; the tangent is the quadrature of the integrand's derivative, as in
  :func:`_log_j_shared`), on the grids of :func:`_on_finer_grid_where_open`; ``certified`` is
  false where those could not certify the value (then +inf, tangent 0: a caller reports NaN).
  Integer and fractional orders alike, so that the graph holds one small kernel whatever the
  order turns out to be (the per-order kernel's derivative is ~5x its compile time)."""
  alpha = jnp.broadcast_to(jnp.asarray(alpha, q.dtype), q.shape)
  generic, q_g, s_g, a_g = _generic(q, sigma, alpha)
  zero = jnp.zeros_like(q)
  tangents = (_where(generic, dq, zero), _where(generic, dsigma, zero), zero[:, None])

  def run(intervals):   # one row per pair, with its own order
    log_j, d_log_j = _log_j_shared(q_g, s_g, a_g[:, None], tangents, intervals)
    return log_j[:, 0], d_log_j[:, 0]
  log_j, d_log_j = _on_finer_grid_where_open(run, lambda v: generic & ~jnp.isfinite(v),
                                             q.shape[0])
  rdp, d_rdp = jax.jvp(lambda q_, s_, l_: _terms(q_, s_, alpha, l_)[1], (q, sigma, log_j),
                       (dq, dsigma, d_log_j))
  return rdp, d_rdp, ~generic | jnp.isfinite(log_j)


_SHARED_LEVELS = 6   # levels after the first: 129, 257, ..., 4097 nodes
_LEVEL_NODES = _SHARED_INTERVALS // 2 + 1   # nodes per row and step of _log_j_levels
_LEVEL_ROWS = 512           # rows per step of _log_j_levels
_LEVEL_BLOCK_ROWS = 8192    # rows per call of _log_j_levels at most (bounds memory)


@functools.lru_cache(maxsize=None)
def _level_weights():
  """(65, 6) float64: the columns of the sums one step of :func:`_log_j_levels` takes over its
  65 nodes. Level 0 (the nodes lo + 2 h j, j = 0..64): the trapezoid rules on every node,
  every second and every fourth node (end weights 1/2); a refinement block (midpoints, the
  65th node is a dummy): the plain sum of the first 64; the first and the last value (the
  window's edges at level 0)."""
  j = np.arange(_LEVEL_NODES)
  ends = (j == 0) | (j == _LEVEL_NODES - 1)
  trapezoid = np.where(ends, 0.5, 1.0)
  columns = [trapezoid, trapezoid * (j % 2 == 0), trapezoid * (j % 4 == 0),
             (j < _LEVEL_NODES - 1).astype(float), (j == 0).astype(float),
             (j == _LEVEL_NODES - 1).astype(float)]
  table = np.stack(columns, axis=-1)
  table.flags.writeable = False
  return table


def _log_j_levels(q, sigma, orders):
  r"""log J (r, g) on rows: flat generic q, sigma (r,), each row with its own ascending orders
  and their constants ``orders`` (r, 5 g) (:func:`_order_block`), on nested grids of its span
  (:func:`_shared_span`); +inf where a value cannot be certified.

  Level 0 is every second node of the 129-node grid (65 nodes, step 2h); its trapezoid rule
  and those on every second and fourth of its nodes (33, 17) certify most rows (:func:`_assess`,
  as in the per-order kernel). A row with an order that level 0 cannot certify is refined
  level by level (129, 257, ..., 4097 nodes: T(h/2) = T(h)/2 + (h/2) * the sum of the new
  midpoints, relative to the same reference), until all its orders are certified or level
  _SHARED_LEVELS is done; the rules of the last three levels decide. The bumps move right with
  the order, and the certificate checks every order's own decay at the window's edges.

  One ``lax.while_loop`` does all of it, so the integrand is in the graph once (compile time):
  each step takes a compacted batch of up to _LEVEL_ROWS of the rows still pending and
  evaluates 65 nodes per row — the whole of level 0, or one block of 64 midpoints of a refinement level —
  with the order-independent part of the integrand (all its logarithms) once per node
  (:func:`_grid_nodes`) and two exponentials and one expm1 per (node, order)
  (:func:`_grid_terms`), summed in linear space relative to the peak located at level 0
  (:func:`_reference_power`, on every fourth node of the 129-node grid). The sums over the
  nodes are one contraction with :func:`_level_weights`."""
  r, g = orders.shape[0], orders.shape[1] // 5
  dtype = q.dtype
  sg = lax.stop_gradient
  q, sigma, orders = sg(q), sg(sigma), sg(orders)
  alphas = orders[:, :g]
  lo, h = _shared_span(q, sigma, alphas)
  cap = min(r, _LEVEL_ROWS)
  weights = jnp.asarray(_level_weights(), dtype)
  j = np.arange(_LEVEL_NODES).astype(dtype)   # constants (an iota would be a kernel)
  ex = lambda v: v[:, None, None]
  log_half_2pi = 0.5 * math.log(2 * math.pi)
  # One packed matrix (one gather per step, one scatter). Fixed per row: q sigma lo log q
  # log(1-q) log sigma 1/(2 sigma^2) | alphas and their constants (_order_constants). State per
  # row: level being built, its block, the blocks of the level, its step and log step, and the
  # rates of _assess at that step (exp(-pi^2 sigma^2/h), exp(-1.5 pi^2 sigma^2/h^2), whose max
  # is rho_h, and rho_2h; halving h squares the first, raises the second to the 4th power) |
  # per order: the midpoint sum so far, the sum and the rule of the last complete level, the
  # rule of the one before (all relative to ref), m_ref, ref, the edge value, log J, failed |
  # whether the row is pending. Everything the body needs per row is a column: no division, logarithm or exponential of a
  # row's scalars in the loop (each would be a kernel of its own, evaluated before the
  # broadcast over nodes and orders).
  n_fixed, n_counters = 7, 8
  width = n_fixed + 5 * g   # the fixed columns; then the state, then whether the row is pending
  # The matrix is one kernel: per-row columns computed by _select_columns, placed by padding
  # with zeros and adding (exact), with the orders' columns and a constant row.
  wide = lambda v, k: jnp.broadcast_to(v[:, None], (r, k))
  q_, s_ = wide(q, n_fixed), wide(sigma, n_fixed)
  x = _select_columns([q_, s_, wide(lo, n_fixed), q_, -q_, s_, s_])
  fixed = _select_columns([x, x, x, jnp.log(x), jnp.log1p(x), jnp.log(x), 0.5 / (x * x)])
  # The constant row: zero fixed columns; level 0, block 0, blocks 0.5, then the row's step
  # (level 0: every second node of the 129-node grid), log step and rates in columns 3 to 7;
  # per order: zeros, log J +inf, failed 1; pending 1.
  template = np.concatenate([np.zeros(width), [0.0, 0.0, 0.5], np.zeros(5), np.zeros(4 * g),
                             np.zeros(3 * g), np.full(g, np.inf), np.ones(g), [1.0]]).astype(dtype)
  # Step, log step, then the exponents of the rates at the step, (a, b) = (-pi^2 sigma^2/h,
  # -1.5 pi^2 sigma^2/h^2), and at twice the step, (a/2, b/4).
  step0, s2 = wide(2 * h, 6), wide(sigma * sigma, 6)
  a, b = -math.pi ** 2 * s2, -1.5 * math.pi ** 2 * s2
  x = (_select_columns([step0, step0, a, b, a, b])
       / _select_columns([jnp.ones_like(step0), jnp.ones_like(step0), step0, step0 * step0,
                          2 * step0, 4 * step0 * step0]))
  x = _select_columns([x, jnp.log(x), jnp.exp(x), jnp.exp(x), jnp.exp(x), jnp.exp(x)])
  rho_coarse = jnp.maximum(x[:, :5], x[:, 1:])   # column 4: max(e^(a/2), e^(b/4))
  per_row = _where(np.arange(5) == 4, rho_coarse, x[:, :5])
  pad = lambda v, start: jnp.pad(v, ((0, 0), (start, template.size - start - v.shape[1])))
  packed = pad(fixed, 0) + pad(orders, n_fixed) + pad(per_row, width + 3) + template
  cell = lambda m, k: m[:, n_counters + k * g:n_counters + (k + 1) * g]   # k-th per-order block

  compact = r > cap   # otherwise every row is in every step (no gather, no scatter)

  def body(carry):
    packed, left = carry
    pending = packed[:, -1] > 0
    if compact:
      # Pending rows first: a stable sort (compiles faster than jnp.nonzero) of the row numbers,
      # a constant (an iota would be a kernel of its own).
      order = lax.sort((~pending, np.arange(r, dtype=np.int32)), num_keys=1,
                       is_stable=True)[1][:cap]
      rows = packed[order]
      valid = rows[:, -1] > 0
      idx = _where(valid, order, r)
    else:   # the barrier keeps XLA from hoisting each per-order constant out of the loop
      rows = lax.optimization_barrier(packed)   # as a kernel of its own
    fx, st = rows[:, :width], rows[:, width:]
    q_, s_, lo_, log_q_, log1m_q_, log_s_, inv_2s2 = (fx[:, i] for i in range(n_fixed))
    alphas_, *constants = (fx[:, n_fixed + k * g:n_fixed + (k + 1) * g] for k in range(5))
    log_beta = constants[-1]
    constants = [v[..., None] for v in constants]
    level, blk, blocks, step, log_step, rate_a, rate_b, rho_coarse = (
        st[:, i] for i in range(n_counters))
    partial, total, log_t, older, m_ref_, ref_, edge, log_j, still_failed = (
        cell(st, k) for k in range(9))
    first = level == 0
    # Level 0: lo + step j; level >= 1 (step halved), block b: the midpoints
    # lo + step (128 b + 1 + 2 j).
    offset = _where(first, 0.0, step * (2 * (_LEVEL_NODES - 1) * blk + 1))
    z = ex(lo_) + ex(offset) + ex(_where(first, step, 2 * step)) * j
    nodes = _grid_nodes(z, ex(inv_2s2), ex(log_q_), ex(log1m_q_), ex(q_))
    alpha = alphas_[..., None]
    e_abs, _ = _grid_terms({k: v[..., ::2] for k, v in nodes.items()}, ex(inv_2s2), alpha,
                           jnp.zeros_like(alpha), exponent_only=True, constants=constants)
    m_new, ref_new = _reference_power(e_abs, ex(inv_2s2), alpha)
    m_ref_ = _where(first[:, None], m_new[..., 0], m_ref_)
    ref_ = _where(first[:, None], ref_new[..., 0], ref_)
    e, mult = _grid_terms(nodes, ex(inv_2s2), alpha, m_ref_[..., None], constants=constants)
    values = jnp.exp(jnp.maximum(e - ref_[..., None], _exp_floor(dtype))) * mult
    # The 65th node of a refinement block is a dummy: zero, so that it cannot reach the sums
    # even as inf or NaN (a weight of 0 would not stop those).
    values = _where(first[:, None, None] | (j < _LEVEL_NODES - 1), values, 0.0)
    sums = jnp.einsum("rgk,kc->rgc", values, weights, precision=lax.Precision.HIGHEST)
    shift = m_ref_ * (m_ref_ - 1) * inv_2s2[:, None]
    base = (ref_ - log_half_2pi - log_s_[:, None]) + log_step[:, None]   # log T = log(sum) + base
    partial = _where(first[:, None], 0.0, partial + sums[..., 3])
    complete = first | (blk == blocks - 1)
    new_total = _where(first[:, None], sums[..., 0], total + partial)
    # One logarithm of the four sums: the level's rule, at level 0 also the rules on every
    # second and fourth node and the larger edge value.
    # (Selected, not stacked: a stack is a loop per piece, each with its own logarithm.)
    log_sums = jnp.log(_select_columns(
        [jnp.broadcast_to(v[..., None], (cap, g, 4))
         for v in (new_total, sums[..., 1], sums[..., 2], jnp.maximum(sums[..., 4], sums[..., 5]))]
    )) + base[..., None]
    new_log_t = log_sums[..., 0]
    coarse = _where(first[:, None], log_sums[..., 1] + math.log(2), log_t)
    coarser = _where(first[:, None], log_sums[..., 2] + math.log(4), older)
    edge = _where(first[:, None], log_sums[..., 3], edge)
    rho = jnp.maximum(rate_a, rate_b)[:, None]
    still = _assess(new_log_t, coarse, coarser, edge, shift, rho, rho * rho_coarse[:, None],
                    alphas_, log_beta)
    was_failed = still_failed > 0
    newly = complete[:, None] & was_failed & ~still
    failed_now = was_failed & ~newly
    done = complete & (~jnp.any(failed_now, axis=-1) | (level == _SHARED_LEVELS))
    c = complete[:, None]
    # A completed level starts the next: twice the blocks, half the step.
    # The row's counters as one select (one kernel, not one per column): complete ->
    # (level + 1, 0, 2 blocks, step/2, log step - log 2, rate_a^2, rate_b^4, rho_h), else
    # (level, block + 1, blocks, step, log step, the same rates). All exact but the rates
    # (a few ulps per level: they only scale the error estimate).
    current = st[:, :n_counters]
    row = lambda *v: np.array(v, dtype)
    squared = current * current
    scaled = (current * row(1.0, 0.0, 2.0, 0.5, 1.0, 1.0, 1.0, 1.0)
              + row(1.0, 0.0, 0.0, 0.0, _LOG_HALF, 0.0, 0.0, 0.0))
    counters = _where(complete[:, None],
                      _select_columns([scaled] * 5 + [squared, squared * squared,
                                                      jnp.broadcast_to(rho, current.shape)]),
                      current + row(0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))
    # The per-order blocks as two selects over the block index (a stack is a loop per piece,
    # each with its own copy of the code the pieces share), the two that depend on the
    # certificate apart: a select computes every one of its candidates for every entry.
    select = lambda fields: _select_columns(
        [jnp.broadcast_to(f[:, None, :], (cap, len(fields), g)) for f in fields],
        axis=1).reshape(cap, len(fields) * g)
    plain = select([_where(c, 0.0, partial), _where(c, new_total, total),
                    _where(c, new_log_t, log_t), _where(c, coarse, older), m_ref_, ref_, edge])
    judged = select([_where(newly, new_log_t + shift, log_j), failed_now.astype(dtype)])
    out = jnp.concatenate([counters, plain, judged, (~done)[:, None].astype(dtype)], axis=-1)
    # The rows left pending, counted down here (read from the output, so that the test is not
    # compiled twice): the loop's condition is then one comparison, not a reduction over all
    # rows (kernels of their own).
    finished = out[:, -1] == 0
    if not compact:   # rows done before this step keep their state
      left = left - jnp.sum(pending & finished, dtype=np.int32)
      return lax.dynamic_update_slice(packed, _where(pending[:, None], out, st), (0, width)), left
    left = left - jnp.sum(valid & finished, dtype=np.int32)
    return packed.at[idx, width:].set(out, mode="drop"), left   # out-of-range writes are dropped

  packed, _ = loops.while_loop(lambda c: c[1] > 0, body, (packed, np.int32(r)))
  return cell(packed[:, width:], 7)


def _shared_values(q, sigma, alphas, groups, tangents=None, intervals=_SHARED_INTERVALS):
  """log J (n, m) of the orders of ``groups`` (static tuples of positions into ``alphas``, (m,))
  on shared nodes (:func:`_log_j_levels`), +inf at every other order; with ``tangents`` (of
  q, sigma (n,), alphas) values and tangents on one grid of 129 nodes (:func:`_log_j_shared`;
  tangents 0 where not certified)."""
  n, m = q.shape[0], alphas.shape[0]
  log_j = jnp.full((n, m), jnp.inf, q.dtype)
  if not groups:
    return log_j if tangents is None else (log_j, jnp.zeros_like(log_j))
  # One row per (pair, group), every group padded to the longest with its last order.
  width = max(len(g) for g in groups)
  index = np.array([g + (g[-1],) * (width - len(g)) for g in groups])
  n_groups = len(groups)
  as_rows = lambda q_, s_, a_: (jnp.repeat(q_, n_groups), jnp.repeat(s_, n_groups),
                                jnp.tile(a_, (n, 1)))
  if tangents is None:
    blocks = -(-(n * n_groups) // _LEVEL_BLOCK_ROWS)   # equal blocks: little padding
    shared = (_in_row_blocks(lambda xs: _log_j_levels(*xs), -(-(n * n_groups) // blocks),
                             *as_rows(q, sigma, _order_block(lax.stop_gradient(alphas)[index]))),)
  else:
    rows = max(1, _SHARED_ELEMENTS // (width * (intervals + 1)))
    shared = _in_row_blocks(lambda xs: _log_j_shared(*xs[:3], xs[3:], intervals), rows,
                            *as_rows(q, sigma, alphas[index]),
                            *as_rows(tangents[0], tangents[1], tangents[2][index]))
  # Each order's column among the rows' (pair, group, slot) values, or the fill column after
  # them: one gather with static indices (a scatter is a sequential loop on CPUs).
  source = np.full(m, n_groups * width)
  for k, g in enumerate(groups):
    source[np.asarray(g)] = k * width + np.arange(len(g))
  place = lambda v, fill: jnp.concatenate(
      [v.reshape(n, n_groups * width), jnp.full((n, 1), fill, q.dtype)], axis=1)[:, source]
  log_j = place(shared[0], jnp.inf)
  return log_j if tangents is None else (log_j, place(shared[1], 0.0))


def _quadrature_values(q, sigma, alphas, groups, fallback):
  """log J (n, m) for flat generic q, sigma (n,) and orders ``alphas`` (m,): the orders of
  ``groups`` (static tuples of positions) on shared nodes, then, with ``fallback``, the
  per-order kernel (:func:`_log_j`) at every other order, on compacted batches of
  _FALLBACK_BATCH elements (static shapes; nothing runs when nothing is left). Where the
  per-order kernel is in the graph anyway, it also computes the rare values the shared nodes
  could not certify; a grid whose orders all have shared nodes (or exact sums) leaves those
  +inf instead (sound: RDP is over-reported, never under-reported) and keeps the per-order
  kernel out of the graph, which would double the compile time. Without ``fallback`` all
  those values are left +inf."""
  n, m = q.shape[0], alphas.shape[0]
  all_shared = sum(len(g) for g in groups) == m
  log_j = _shared_values(q, sigma, alphas, groups)
  if not fallback or all_shared:
    return log_j
  size = n * m
  batch = min(size, _FALLBACK_BATCH)
  q_all, s_all, a_all = (jnp.broadcast_to(v, (n, m)).reshape(-1)
                         for v in (q[:, None], sigma[:, None], alphas[None, :]))

  def body(state):
    log_j, pending = state
    idx = jnp.nonzero(pending, size=batch, fill_value=size)[0]
    take = jnp.minimum(idx, size - 1)
    value = _KERNEL(q_all[take], s_all[take], a_all[take])
    return log_j.at[idx].set(value, mode="drop"), pending.at[idx].set(False, mode="drop")

  log_j = log_j.reshape(-1)
  log_j, _ = loops.while_loop(lambda st: jnp.any(st[1]), body, (log_j, ~jnp.isfinite(log_j)))
  return log_j.reshape(n, m)


@functools.lru_cache(maxsize=None)
def _quadrature_kernel(groups, fallback):
  """_quadrature_values for one static ``groups``, with a batching rule that flattens a
  vmapped batch of pairs into the same flat computation (vmap = arrays)."""
  @jax.custom_batching.custom_vmap
  def kernel(q, sigma, alphas):
    if _placeholder_primal():
      return jnp.full((q.shape[0], alphas.shape[0]), jnp.nan, q.dtype)
    return _quadrature_values(q, sigma, alphas, groups, fallback)

  @kernel.def_vmap
  def _rule(axis_size, in_batched, q, sigma, alphas):
    if in_batched[2]:   # orders that differ along the batch: no flattening
      fn = lambda q_, s_, a_: _quadrature_values(q_, s_, a_, groups, fallback)
      axes = tuple(0 if b else None for b in in_batched)
      return jax.vmap(fn, in_axes=axes)(q, sigma, alphas), True
    q, sigma = (x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)
                for x, b in zip((q, sigma), in_batched[:2]))
    out = kernel(q.reshape(-1), sigma.reshape(-1), alphas)
    return out.reshape(q.shape + out.shape[-1:]), True

  return _rule_only_when_batched(kernel)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _log_j_orders(q, sigma, alphas, groups, fallback):
  """log J (n, m) of flat generic q, sigma (n,) at the orders ``alphas`` (m,); +inf only where
  even the per-order kernel cannot certify a value (without ``fallback``: wherever the
  shared nodes did not)."""
  return _quadrature_kernel(groups, fallback)(q, sigma, alphas)


@_log_j_orders.defjvp
def _log_j_orders_jvp(groups, fallback, primals, tangents):
  if not fallback or sum(len(g) for g in groups) == primals[2].shape[0]:
    # Value and tangent on the shared nodes, in one pass (what is left open stays +inf): the
    # per-order kernel's derivative is not in the graph.
    return _shared_tangents(*primals, groups, tangents)
  # With the fallback, value and derivatives from the per-order kernel, which accumulates
  # the derivatives on its own nodes.
  n, m = primals[0].shape[0], primals[2].shape[0]
  flat = lambda vs: [jnp.broadcast_to(v, (n, m)).reshape(-1)
                     for v in (vs[0][:, None], vs[1][:, None], vs[2][None, :])]
  value, tangent = jax.jvp(_log_j, flat(primals), flat(tangents))
  return value.reshape(n, m), tangent.reshape(n, m)


def log_a_and_rdp_at_orders(q, sigma, orders, split=None, tables=None, fallback=True):
  """(log A, RDP) of shape ``q.shape + orders.shape`` for q, sigma of one (batch) shape and a
  1-D array of orders, without argument checks. ``split`` (:func:`order_split` of the
  concrete orders, static) sends integer orders up to 4096 to the exact binomial sum and
  groups of fractional orders up to 64 to the shared-node quadrature, the others to the
  per-order quadrature; without it every order goes to the per-order quadrature. ``tables``:
  :func:`order_tables` of the same orders and split.

  ``fallback=False`` (with a split) leaves out the per-order quadrature and returns a third
  output, the elements that need it (their log A and RDP are +inf meanwhile): a caller with
  concrete inputs computes those few afterwards (:func:`log_a_and_rdp`) and compiles the
  per-order kernel only when there are any."""
  if split is None:
    return _log_a_and_rdp_jit(q[..., None], sigma[..., None], orders)
  batch = q.shape
  dtype = jnp.result_type(q, sigma, orders)
  qf, sf = (v.reshape(-1).astype(dtype) for v in (q, sigma))
  tables = tuple(jnp.asarray(t, dtype) for t in tables or ())
  if any(compilation.batched(v) for v in (q, sigma)):   # under jax.vmap: flattened by its rule
    stacked = _at_orders_kernel(split, fallback)(qf, sf, orders.astype(dtype), tables)
  else:   # (the wrappers cost tracing and lowering time where they are not needed)
    stacked = _at_orders_flat(qf, sf, orders.astype(dtype), tables, split, fallback)
  shape = batch + orders.shape
  if fallback:
    return stacked[0].reshape(shape), stacked[1].reshape(shape)
  return stacked[0].reshape(shape), stacked[1].reshape(shape), (stacked[2] > 0).reshape(shape)


@functools.lru_cache(maxsize=None)
def _at_orders_kernel(split, fallback):
  """:func:`_at_orders_flat` for one static split, with a batching rule that flattens a
  vmapped batch of pairs into the same flat computation (so that ``jax.jit(jax.vmap(f))``
  traces and runs the code of ``f`` on whole arrays), and its derivatives those of the same
  code (``jax.custom_batching.custom_vmap`` has no reverse mode of its own)."""
  plain = lambda qf, sf, orders, tables: _at_orders_flat(qf, sf, orders, tables, split, fallback)

  @jax.custom_batching.custom_vmap
  def batched(qf, sf, orders, tables):
    if _placeholder_primal():
      return jnp.full((2 if fallback else 3, qf.shape[0], orders.shape[0]), jnp.nan, qf.dtype)
    return plain(qf, sf, orders, tables)

  @batched.def_vmap
  def _rule(axis_size, in_batched, qf, sf, orders, tables):
    if in_batched[2] or any(jax.tree_util.tree_leaves(in_batched[3])):
      axes = (0 if in_batched[0] else None, 0 if in_batched[1] else None,
              0 if in_batched[2] else None, tuple(0 if b else None for b in in_batched[3]))
      return jax.vmap(plain, in_axes=axes)(qf, sf, orders, tables), True
    qf, sf = (x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)
              for x, b in zip((qf, sf), in_batched[:2]))
    out = batched(qf.reshape(-1), sf.reshape(-1), orders, tables)
    out = out.reshape(out.shape[:1] + qf.shape + out.shape[-1:])
    return jnp.moveaxis(out, 1, 0), True

  call = _rule_only_when_batched(batched)

  @jax.custom_jvp
  def kernel(qf, sf, orders, tables):
    return call(qf, sf, orders, tables)

  @kernel.defjvp
  def _jvp(primals, tangents):
    return jax.jvp(plain, primals, tangents)

  return kernel


def _at_orders_flat(qf, sf, orders, tables, split, fallback):
  """(log A, RDP[, pending]) stacked, (2 or 3, n, m), for flat q, sigma (n,) and the orders
  (m,) of ``split``: see :func:`log_a_and_rdp_at_orders`."""
  dtype = qf.dtype
  generic = (qf > 0) & (qf < 1) & (sf > 0)
  qg, sg_ = _where(generic, qf, 0.5), _where(generic, sf, 1.0)
  pair = _pair_constants(qg, sg_, sf)   # per-pair logarithms and reciprocals, one kernel
  # log J of every order at the generic stand-ins, then one _terms for the whole grid: the
  # orders are taken in the split's order (the exact sums' buckets, then the rest) by one
  # gather, and the results put back by one.
  positions = [np.asarray(p, int) for p, _ in split.sums or ()]
  placed = np.concatenate(positions) if positions else np.zeros(0, int)
  rest = np.setdiff1d(np.arange(orders.shape[0]), placed)
  perm = np.concatenate([placed, rest])
  identity = bool(np.all(perm == np.arange(perm.size)))
  permuted = orders if identity else orders[perm]
  log_js, pendings = [], []
  if positions:
    starts = np.cumsum([0] + [p.size for p in positions])
    log_js.append(_integer_orders(pair, [permuted[a:b] for a, b in zip(starts[:-1], starts[1:])],
                                  tables))
    pendings.append(jnp.zeros((qf.shape[0], placed.size), bool))
  if rest.size:
    alphas = permuted[placed.size:]
    where_rest = {int(p): k for k, p in enumerate(rest)}
    groups = tuple(tuple(where_rest[p] for p in g) for g in split.shared)
    usable = jnp.isfinite(alphas) & (alphas >= 1)
    log_j = _log_j_orders(qg, sg_, _where(usable, alphas, 2.0), groups, fallback)
    log_js.append(log_j)
    pendings.append(generic[:, None] & usable[None, :] & ~jnp.isfinite(log_j))
  log_j = jnp.concatenate(log_js, axis=-1) if len(log_js) > 1 else log_js[0]
  log_a, rdp = _terms(qf[:, None], sf[:, None], permuted[None, :], log_j, pair[2][:, 1:])
  outputs = [log_a, rdp]
  if not fallback:
    pending = jnp.concatenate(pendings, axis=-1) if len(pendings) > 1 else pendings[0]
    outputs.append(pending.astype(dtype))
  stacked = jnp.stack(outputs)
  return stacked if identity else stacked[:, :, np.argsort(perm)]


def fill_pending(rdp, pending, q, sigma, orders, steps=1.0):
  """``rdp`` (batch + (K,), T steps) with its ``pending`` entries (from
  :func:`log_a_and_rdp_at_orders` with ``fallback=False``) computed by the per-order
  quadrature, on the host's concrete values: one call, its size padded to a power of two so
  that few shapes compile. q, sigma, steps broadcast to the batch; orders: (K,)."""
  rdp = np.array(rdp)
  index = np.nonzero(pending)
  take = lambda v: np.broadcast_to(np.asarray(v)[..., None], rdp.shape)[index]
  count = index[0].size
  size = max(64, 1 << (count - 1).bit_length())
  pad = lambda v, fill: np.concatenate([v, np.full(size - count, fill, v.dtype)])
  values = log_a_and_rdp(pad(take(q), 0.5), pad(take(sigma), 1.0),
                         pad(np.asarray(orders)[index[-1]], 2.0))[1]
  t = take(steps)
  rdp[index] = np.where(t == 0, 0.0, t * np.asarray(values)[:count])
  return jnp.asarray(rdp)
