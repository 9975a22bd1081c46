r"""The integrand at nodes shared by a group of orders, and the rule on one such grid.

Fractional orders up to 64 share one grid of nodes per (q, σ) and group of orders: the
window is in closed form (:func:`_shared_span`), the logarithms of the integrand are computed
once per node (:func:`_grid_nodes`), and each (node, order) costs two exponentials and one
expm1 (:func:`_grid_terms`), summed relative to the reference power nearest the peak
(:func:`_reference_power`) so that float32 keeps full precision. :func:`_log_j_shared` is
the certified rule on one grid with its tangent, on the same nodes and in the same pass (the
derivatives); values alone take the nested grids of
:mod:`jaxrdp.mechanisms.sampled_gaussian.shared_levels`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxrdp.mechanisms.sampled_gaussian.common import (_HALF_WIDTH, _SERIES_RADIUS, _SERIES_TERMS,
                                                       _exp_floor, _select_columns, _where)
from jaxrdp.mechanisms.sampled_gaussian.quadrature import (_assess, _beta_or_one, _rates,
                                                           _reference_constant)

_SHARED_INTERVALS = 128      # intervals of the shared grid


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
  per-order kernel: they decide where and relative to what to sum, not the value). A tangent
  given as None is zero: that argument is not differentiated at all (XLA does not drop
  products with a tangent of zeros: the graph and its compile time would hold them). The
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

  primals = (q, sigma, alphas)
  moving = [i for i, d in enumerate(tangents) if d is not None]

  def of_moving(*args):   # log_j_of of the arguments with a tangent, the others held
    full = list(primals)
    for i, v in zip(moving, args):
      full[i] = v
    return log_j_of(*full)
  if moving:
    log_j, d_log_j, values = jax.jvp(of_moving, tuple(primals[i] for i in moving),
                                     tuple(tangents[i] for i in moving), has_aux=True)
  else:
    log_j, values = log_j_of(*primals)
    d_log_j = jnp.zeros_like(log_j)
  log_j = log_j + const
  shift = _reference_constant(m_ref[..., 0], sigma[:, None])
  base = const - jnp.log(sigma)[:, None]   # the rules' sums are relative to the shift
  rule = lambda every: jnp.log(jnp.sum(values[..., ::every] * weight[::every], axis=-1)) + base + math.log(every)
  edge = jnp.log(jnp.maximum(values[..., 0], values[..., -1])) + base
  failed = _assess(log_j - shift, rule(2), rule(4), edge, shift,
                   *_rates(h[:, None], sigma[:, None]), alphas)
  return _where(failed, jnp.inf, log_j), _where(failed, 0.0, d_log_j)
