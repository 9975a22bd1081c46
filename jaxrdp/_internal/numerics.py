"""Elementary functions at their removable singularities, without cancellation.

The closed-form RDP curves (Laplace, randomized response) are of the form log(1 + S)/(α − 1)
with S → 0 as α → 1, and S itself is a difference of nearly equal exponentials. The helpers
below evaluate the pieces with full relative accuracy on the whole real line: a Taylor
polynomial where the argument is small (cut-offs chosen so that the truncation error, bounded
by the first omitted term, is below 1e-19 relative) and the direct formula elsewhere. Each
uses the double-where trick, so neither branch produces NaN values or NaN gradients.

Also the quadratures' shared building blocks (one copy for every mechanism): :func:`select`
(``where`` as one ``lax.select``), :func:`exp_floor` and a lean :func:`logsumexp`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

# log1p(x)/x = sum_k (-x)^k/(k+1), |x| <= 0.1: first omitted term 0.1^18/19 < 6e-20.
_LOG1P_CUT = 0.1
_LOG1P_COEFFS = tuple(1.0 / (k + 1) for k in range(18))
# (expm1(t) - t)/t = sum_{k>=1} t^k/(k+1)!, |t| <= 1: first omitted term 1/22! < 1e-21.
_EXPREL_CUT = 1.0
_EXPREL_COEFFS = tuple(1.0 / math.factorial(k + 2) for k in range(20))
# sinh(u)/u = sum_k u^(2k)/(2k+1)!, |u| <= 1: first omitted term 1/21! < 2e-20.
_SINHC_CUT = 1.0
_SINHC_COEFFS = tuple(1.0 / math.factorial(2 * k + 1) for k in range(10))


def log1p(x: jax.Array) -> jax.Array:
  """log(1 + x) for x > −1, accurate to ~2 ulps everywhere.

  XLA's float64 log1p on CPU is off by up to ~120 ulps for x in [−0.5, −0.3] (measured against
  mpmath; Kahan's fl(1 + x) − 1 correction cannot be used instead, XLA simplifies it to x). It
  is accurate for |x| < 1/4, and for |x| ≥ 1/4 log(1 + x) is: the rounding of 1 + x moves the
  log by at most eps/2, against |log(1 + x)| ≥ 0.22.
  """
  small = jnp.abs(x) < 0.25
  return jnp.where(small, jnp.log1p(jnp.where(small, x, 0.0)), jnp.log(1 + jnp.where(small, 1.0, x)))


def horner(x, coeffs):
  """sum_k coeffs[k] x^k."""
  acc = jnp.full_like(x, coeffs[-1])
  for c in reversed(coeffs[:-1]):
    acc = acc * x + c
  return acc


def log1p_over_x(x: jax.Array) -> jax.Array:
  """log(1 + x)/x for x > −1, equal to 1 at x = 0."""
  small = jnp.abs(x) <= _LOG1P_CUT
  x_small = jnp.where(small, x, 0.0)
  x_big = jnp.where(small, 1.0, x)
  return jnp.where(small, horner(-x_small, _LOG1P_COEFFS), log1p(x_big) / x_big)


def exprel_minus_one(t: jax.Array) -> jax.Array:
  """(e^t − 1 − t)/t = (e^t − 1)/t − 1, equal to 0 at t = 0 (sign of t, size ~t/2)."""
  small = jnp.abs(t) <= _EXPREL_CUT
  t_small = jnp.where(small, t, 0.0)
  t_big = jnp.where(small, 1.0, t)
  series = t_small * horner(t_small, _EXPREL_COEFFS)
  # |t| > 1: e^t - 1 and t differ by at least e^-1 of the larger, so at most ~2 bits are lost.
  return jnp.where(small, series, (jnp.expm1(t_big) - t_big) / t_big)


def expm1_minus_x(t: jax.Array) -> jax.Array:
  """e^t − 1 − t ≥ 0, without the cancellation of the direct formula near t = 0."""
  return t * exprel_minus_one(t)


def sinhc(u: jax.Array) -> jax.Array:
  """sinh(u)/u, equal to 1 at u = 0."""
  small = jnp.abs(u) <= _SINHC_CUT
  u_small = jnp.where(small, u, 0.0)
  u_big = jnp.where(small, 1.0, u)
  return jnp.where(small, horner(u_small * u_small, _SINHC_COEFFS), jnp.sinh(u_big) / u_big)


def select(condition, x, y):
  """``jnp.where(condition, x, y)`` for a boolean condition, as one ``lax.select``: the same
  broadcasting and dtype promotion, without jnp.where's nested ``jax.jit``, whose tracing (once
  per new combination of shapes) is a measurable part of a fresh process's first call."""
  dtype = jnp.result_type(x, y)
  shape = np.broadcast_shapes(np.shape(condition), np.shape(x), np.shape(y))

  def full(v, dt):
    if isinstance(v, (bool, int, float)):
      return lax.full(shape, v, dt)
    v = lax.convert_element_type(v, dt) if v.dtype != dt else v
    if v.shape == shape:
      return v
    return lax.broadcast_in_dim(v, shape, tuple(range(len(shape) - v.ndim, len(shape))))
  return lax.select(full(condition, np.bool_), full(x, dtype), full(y, dtype))


def exp_floor(dtype) -> float:
  """Smallest exponent whose exp is a normal number. Arguments of exp are clamped to it
  where a result below it is negligible: subnormal arithmetic is ~100x slower on CPUs."""
  return math.log(float(jnp.finfo(dtype).tiny)) + 1.0


def logsumexp(x: jax.Array, axis: int = -1) -> jax.Array:
  """log Σ exp over ``axis``; −inf when every entry is −inf. Lean (few kernels, for compile
  time); terms below e^−(~700) (float64; e^−(~86) in float32) of the largest are dropped rather
  than summed as subnormals, a change far below the rounding of the sum."""
  top = jnp.max(x, axis=axis, keepdims=True)
  top = lax.stop_gradient(select(jnp.isfinite(top), top, 0.0))
  floor = exp_floor(x.dtype)
  terms = jnp.exp(jnp.maximum(x - top, floor))
  terms = select(x - top >= floor, terms, 0.0)
  return jnp.log(jnp.sum(terms, axis=axis)) + jnp.squeeze(top, axis)
