r"""RDP of the Gaussian mechanism on a subset sampled without replacement (WBK 2019, Thm. 27).

Wang, Balle, Kasiviswanathan (2019), "Subsampled Rényi Differential Privacy and Analytical
Moments Accountant", AISTATS, arXiv:1808.00087. A subset of fixed size m = q·n is drawn
uniformly without replacement, neighbouring datasets differ by replacing one record (n is
public), and the Gaussian mechanism with noise multiplier σ (RDP ε(α) = α/(2σ²)) runs on the
subset. With :math:`g(i) = e^{(i-1)\varepsilon(i)} = e^{i(i-1)/(2\sigma^2)}` and its forward
differences :math:`\Delta^\ell = \sum_{i=0}^{\ell} (-1)^{\ell-i}\binom{\ell}{i} g(i)`, Theorem 27
(in the form dp_accounting implements) gives, for integer α ≥ 2,

.. math:: \varepsilon'(\alpha) \le \frac{1}{\alpha-1}\log\Big(1 + \sum_{i=2}^{\alpha} q^i \binom{\alpha}{i}
          \min\big\{4\sqrt{\Delta^{2\lfloor i/2\rfloor}\,\Delta^{2\lceil i/2\rceil}},\ 2g(i)\big\}\Big).

(At i = 2 the minimum is :math:`\min\{4(e^{\varepsilon(2)}-1), 2e^{\varepsilon(2)}\}`.) Other orders:

* fractional α > 2: Corollary 10 (the cumulant :math:`K(\alpha) = (\alpha-1)\varepsilon'(\alpha)` is
  convex), :math:`\varepsilon'(\alpha) \le ((1-t)K(\lfloor\alpha\rfloor) + tK(\lceil\alpha\rceil))/(\alpha-1)`,
  :math:`t = \alpha - \lfloor\alpha\rfloor`, a valid upper bound (as dp_accounting);
* 1 ≤ α ≤ 2: the same interpolation with K(1) = 0 gives ε'(2) on (1, 2]; at α = 1 (the KL
  divergence, where dp_accounting divides 0 by 0) ε'(2) is used too, valid because RDP is
  non-decreasing in α;
* α = ∞: +inf; q = 0: 0; q = 1: α/(2σ²) (the Gaussian mechanism itself, as dp_accounting).

How the forward differences are computed. The alternating sum cancels catastrophically (for
σ = 10 and ℓ = 64 its largest term exceeds Δ^ℓ by 7e27), and so does the difference table
dp_accounting builds in log space: its float64 result at q = 0.5, σ = 10, α = 128 is 1.9 times
the true bound, and at q = 0.5, σ = 5, α = 43 it is 6.8e-10 below it
(tests/test_without_replacement.py measures this). Only even orders are needed,
and they are moments with a positive integrand: with :math:`L = e^u`,
:math:`u \sim N(-s^2/2, s^2)`, :math:`s = 1/\sigma` (so that :math:`E[L^i] = g(i)`),
:math:`\Delta^\ell = E[(L-1)^\ell]`. Tilting by :math:`L^\ell` moves the mass where
:math:`(L-1)^\ell` lives and takes out the large factor exactly:

.. math:: \Delta^\ell = g(\ell)\, E_{v\sim N(m, s^2)}\big[(1-e^{-v})^\ell\big], \qquad m = (\ell - \tfrac12)s^2.

The integrand is entire, zero of order ℓ at v = 0, and log-concave on each half-line with
curvature ≥ 1/s², so it has one bump on each side (modes found by bisection, :func:`_modes`)
and falls by ≥ 50 nats within 10s of each mode. Each bump gets a window of ±10s with
:data:`_NODES` trapezoid nodes (spacing 0.16s); overlapping windows become the two halves of
one uniform grid through v = 0. The trapezoid rule converges geometrically for such
integrands; each value is accepted only if the rule on every second node agrees to
√eps/4 plus the rounding noise of the sums (the error then at least squares when the step
halves, so the full rule is within ~eps) and the integrand has vanished at the window edges.
A value that fails is replaced by +inf, so the minimum takes the other argument, 2g(i): still
Theorem 27's bound, only looser (in float64 no value failed on σ ∈ [0.05, 1e4], ℓ ≤ 1024).
Δ² = e^{s²} − 1 exactly.

Order limit. The sum has α terms, so the number of terms is static: it is the largest finite
order when ``orders`` is concrete (rounded up to a power of two, at most 4096), and
``max_order`` (default 1024) when ``orders`` is traced. Orders above it give +inf (no claim).
Above α = 256 dp_accounting keeps only the second argument of the minimum; here both are kept
(the same theorem, tighter: 10x at q = 0.01, σ = 10, α = 512).

Precision. Against a 50-digit mpmath evaluation of the theorem
(tools/make_wor_references.py) float64 agrees to 1.6e-14 relative and float32 to 1.5e-6
(worst measured; the tests use 1e-12 and 1e-5); over q ∈ [1e-6, 0.99], σ ∈ [0.1, 1000],
α ≤ 1024 float32 stays within 2.3e-5 of float64 (tested at 5e-5), inside the 2.5e-4 that
:func:`jaxrdp.compute_epsilon` allows for float32 RDP values. The binomial
coefficients are formed as :math:`\sum_{j<k}\log(n-j) - \log k!`, :math:`k = \min(i, n-i)`, not
as a difference of three log-gammas (which loses ~1e-4 in float32 at n = 256).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxrdp._internal import loops
from jaxrdp._internal import numerics
from jaxrdp._internal import validation

_TRACED_MAX_ORDER = 1024     # number of terms when ``orders`` is traced (no concrete maximum)
_CONCRETE_ORDER_CAP = 4096   # at most this many terms when it comes from concrete orders
_NODES = 129                 # trapezoid nodes per window (odd: the every-second-node check)
_WINDOW = 10.0               # window half-width in units of s = 1/σ (≥ 50 nats below the mode)
_BISECTION_STEPS = 64
_BUDGET = 1 << 22            # array elements per chunk (bounds memory for large inputs)


def rdp_sampled_gaussian_without_replacement(
    sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
    orders: jax.typing.ArrayLike, *, max_order: int | None = None) -> jax.Array:
  r"""RDP bound of the Gaussian mechanism on a fixed-size subset sampled without replacement.

  Theorem 27 of Wang, Balle, Kasiviswanathan (2019) at integer orders, Corollary 10 at
  fractional ones (see the module docstring); the accounting dp_accounting uses for a
  ``SampledWithoutReplacementDpEvent`` (replace-one neighbours), with the forward differences
  computed without cancellation. Broadcasts ``sampling_rate``, ``noise_multiplier`` and
  ``orders``. Jittable (``max_order`` is static), vmappable, differentiable; computes in the
  floating dtype of its inputs.

  Args:
    sampling_rate: q = m/n, the subset size over the dataset size, in [0, 1].
    noise_multiplier: σ, the noise standard deviation divided by the L2 sensitivity (of the
      function on the subset, replace-one), ≥ 0.
    orders: Rényi orders α ≥ 1 (``inf`` allowed).
    max_order: the largest order computed (a static int in [2, 65536]); larger orders give
      +inf. Default: the largest finite order, rounded up to a power of two and capped at
      4096, when ``orders`` is concrete; 1024 when it is traced.

  Returns:
    The RDP bound at each broadcast point: ε'(2) for 1 ≤ α ≤ 2, 0 where q = 0, α/(2σ²) where
    q = 1, +inf where α = ∞, α > max_order, or σ = 0 < q. Under ``jax.jit`` (where the eager
    range checks cannot run) q outside [0, 1], σ < 0, α < 1 or NaN give NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Wang, Balle, Kasiviswanathan, "Subsampled Rényi differential privacy and analytical
    moments accountant", AISTATS 2019, arXiv:1808.00087, Theorem 27 and Corollary 10;
    dp_accounting ``rdp_privacy_accountant._compute_rdp_sample_wor_gaussian``.
  """
  validation.check("sampling_rate", sampling_rate)
  validation.check("noise_multiplier", noise_multiplier)
  validation.check("orders", orders)
  validation.check_broadcast(sampling_rate=sampling_rate, noise_multiplier=noise_multiplier,
                              orders=orders)
  n_max = static_max_order(orders, max_order)
  q = validation.as_float_array(sampling_rate)
  sigma = validation.as_float_array(noise_multiplier)
  alpha = validation.as_float_array(orders)
  return without_replacement_unchecked(q, sigma, alpha, n_max)


def static_max_order(orders, max_order):
  if max_order is not None:
    if isinstance(max_order, bool) or not isinstance(max_order, (int, np.integer)):
      raise TypeError(f"max_order must be an int, got {type(max_order).__name__}.")
    if not 2 <= max_order <= 65536:
      raise ValueError(f"max_order must lie in [2, 65536]; got {max_order!r}.")
    return int(max_order)
  if not validation.is_concrete(orders):
    return _TRACED_MAX_ORDER
  values = np.asarray(orders, dtype=np.float64)
  finite = values[np.isfinite(values)]
  top = float(finite.max()) if finite.size else 2.0
  needed = max(2, int(math.ceil(min(top, _CONCRETE_ORDER_CAP))))
  return min(_CONCRETE_ORDER_CAP, 1 << (needed - 1).bit_length())


def _in_chunks(fn, arrays, chunk):
  """fn over the leading axis of the arrays (a tuple), ``chunk`` rows at a time."""
  size = arrays[0].shape[0]
  if size <= chunk:
    return fn(arrays)
  n_chunks = -(-size // chunk)
  pad = n_chunks * chunk - size
  split = lambda v: jnp.concatenate([v, jnp.broadcast_to(v[:1], (pad,) + v.shape[1:])]).reshape(
      (n_chunks, chunk) + v.shape[1:])
  out = loops.map(fn, tuple(split(v) for v in arrays))
  return jax.tree_util.tree_map(lambda v: v.reshape((n_chunks * chunk,) + v.shape[2:])[:size], out)


def _modes(ell, s2, m):
  r"""Distances of the two modes of :math:`(1-e^{-v})^\ell \varphi_s(v - m)` from v = 0.

  Right mode :math:`v = m + d`, :math:`d > 0` the root of :math:`d = \ell s^2/(e^{m+d}-1)`,
  in :math:`[0, s\sqrt\ell]`. Left mode :math:`v = -w`, :math:`w > 0` the root of
  :math:`m + w = \ell s^2/(1 - e^{-w})`, in :math:`[0, s\sqrt{2\ell} + 2\ell s^2]` (at the upper end
  the left side is the larger one: use :math:`1 - e^{-w} \ge \min(w/2, 1 - e^{-1})`). Both
  functions increase, so one bisection (on both brackets at once) finds the unique roots.
  """
  s = jnp.sqrt(s2)
  tiny = jnp.finfo(s2.dtype).tiny

  def increasing(x):
    d, w = x[..., 0], x[..., 1]
    right = d - ell * s2 / jnp.expm1(m + d)
    left = m + w - ell * s2 / -jnp.expm1(-jnp.maximum(w, tiny))
    return jnp.stack([right, left], axis=-1)

  def body(_, bracket):
    lo, hi = bracket
    mid = 0.5 * (lo + hi)
    below = increasing(mid) <= 0
    return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

  lo = jnp.zeros(m.shape + (2,), m.dtype)
  hi = jnp.stack([s * jnp.sqrt(ell), s * jnp.sqrt(2 * ell) + 2 * ell * s2], axis=-1)
  lo, hi = loops.fori_loop(0, _BISECTION_STEPS, body, (lo, hi))
  root = 0.5 * (lo + hi)
  return root[..., 0], root[..., 1]


def _log_integrand(center, offset, ell, s2, m):
  r""":math:`\ell\log|1-e^{-v}| - (v-m)^2/(2s^2)` at :math:`v - m = \mathrm{center} + \mathrm{offset}`.

  ``center`` is relative to m, so :math:`v - m` keeps full precision at the right mode even when
  m is large. :math:`\log|1 - e^{-v}| = \max(-v, 0) + \log(-\mathrm{expm1}(-|v|))` has no overflow
  for v ≪ 0. At v = 0 exactly the result is −inf (with a safe stand-in for the gradient).
  """
  delta = center + offset
  v = m + delta
  zero = v == 0
  v_safe = jnp.where(zero, 1.0, v)
  log_abs = jnp.maximum(-v_safe, 0.0) + jnp.log(-jnp.expm1(-jnp.abs(v_safe)))
  out = ell * log_abs - delta * delta / (2 * s2)
  return jnp.where(zero, -jnp.inf, out)


def _window_sums(center, half, ell, s2, m):
  """Trapezoid sums (log) on [center - half, center + half] relative to m: the full rule, the
  rule on every second node, and the log-integrand at both ends (times the step)."""
  x = lambda v: v[..., None]
  t = jnp.linspace(-1.0, 1.0, _NODES, dtype=s2.dtype)
  log_f = _log_integrand(x(center), x(half) * t, x(ell), x(s2), x(m))
  log_h = jnp.log(2 * half / (_NODES - 1))
  ends = jnp.zeros(_NODES, s2.dtype).at[0].set(math.log(0.5)).at[-1].set(math.log(0.5))
  full = numerics.logsumexp(log_f + ends, axis=-1) + log_h
  coarse = numerics.logsumexp(log_f[..., ::2] + ends[::2], axis=-1) + log_h + math.log(2.0)
  return full, coarse, log_f[..., 0] + log_h, log_f[..., -1] + log_h


def _log_even_moments(sigma, num):
  r"""log Δ^{2k} = log E[(L−1)^{2k}] for k = 1..num; shape ``sigma.shape + (num,)``.

  ``sigma`` must be positive and finite. +inf where the quadrature could not certify the value.
  """
  dtype = sigma.dtype
  eps = float(jnp.finfo(dtype).eps)
  ell = jnp.arange(2, 2 * num + 1, 2, dtype=dtype)
  s2 = (1 / (sigma * sigma))[..., None] * jnp.ones_like(ell)
  m = (ell - 0.5) * s2
  # Placement: not differentiated (the windows only decide where to look).
  sg = lax.stop_gradient
  ell_p, s2_p, m_p = sg(ell) * jnp.ones_like(m), sg(s2), sg(m)
  d, w = _modes(ell_p, s2_p, m_p)
  half = _WINDOW * jnp.sqrt(s2_p)
  merged = m_p + d + w <= 2 * half
  # Relative to m: right window centre d, left window centre -w - m; merged: [a, b] split in two.
  a, b = -w - m_p - half, d + half
  centers = jnp.stack([jnp.where(merged, 0.75 * a + 0.25 * b, -w - m_p),
                       jnp.where(merged, 0.25 * a + 0.75 * b, d)], axis=-1)
  both = lambda v: jnp.stack([v, v], axis=-1)
  full, coarse, first, last = _window_sums(centers, both(jnp.where(merged, 0.25 * (b - a), half)),
                                           both(ell * jnp.ones_like(m)), both(s2), both(m))
  log_t = jnp.logaddexp(full[..., 0], full[..., 1])
  log_coarse = jnp.logaddexp(coarse[..., 0], coarse[..., 1])
  inner = jnp.where(merged, -jnp.inf, jnp.maximum(last[..., 0], first[..., 1]))
  edge = jnp.maximum(jnp.maximum(first[..., 0], last[..., 1]), inner)
  # Accept when the rule on every second node agrees to sqrt(eps)/4: the trapezoid error on an
  # entire integrand at least squares when the step halves, so the full rule is within ~eps.
  # The tolerance also admits the rounding noise of the two sums (each node's log-integrand is
  # off by ~eps times its size, which matters in float32 for large ℓ).
  gap = jnp.abs(jnp.expm1(sg(log_coarse) - sg(log_t)))
  noise = 8 * eps * (sg(ell) * jnp.abs(jnp.log(sg(half))) + _WINDOW ** 2 + 1)
  certified = ((gap <= 0.25 * math.sqrt(eps) + noise) & (sg(edge) - sg(log_t) <= math.log(eps) - 10)
               & jnp.isfinite(log_t))
  log_r = log_t - 0.5 * jnp.log(s2) - 0.5 * math.log(2 * math.pi)
  log_delta = 0.5 * s2 * ell * (ell - 1) + log_r
  log_delta = jnp.where(certified, log_delta, jnp.inf)
  # Δ² = g(2) - 2g(1) + g(0) = e^{s²} - 1 exactly; log(e^x - 1) = x + log(1 - e^{-x}).
  x = s2[..., 0]
  return log_delta.at[..., 0].set(x + jnp.log(-jnp.expm1(-x)))


def _log_b(sigma, n_max):
  """log min{4 sqrt(Δ^{2⌊i/2⌋} Δ^{2⌈i/2⌉}), 2 g(i)} for i = 2..n_max; shape sigma.shape + (n_max - 1,)."""
  num = (n_max + 1) // 2
  log_delta = _log_even_moments(sigma, num)
  i = np.arange(2, n_max + 1)
  lo, hi = i // 2 - 1, (i + 1) // 2 - 1
  log_diff = math.log(4.0) + 0.5 * (log_delta[..., lo] + log_delta[..., hi])
  i_f = jnp.asarray(i, sigma.dtype)
  log_g = math.log(2.0) + i_f * (i_f - 1) / (2 * sigma * sigma)[..., None]
  return jnp.minimum(log_diff, log_g)


def _log_a_int(log_q, n, log_b, log_factorial):
  """log(1 + Σ_{i=2}^{n} q^i C(n, i) b_i) per row; n integer-valued, 2 ≤ n ≤ n_max.

  log_q, n: shape (E,); log_b: (E, n_max - 1); log_factorial: (n_max + 1,) = log k!.
  """
  n_max = log_b.shape[-1] + 1
  dtype = log_b.dtype
  j = jnp.arange(n_max, dtype=dtype)
  # Σ_{j<k} log(n - j) for k = 0..n_max (prefix sums; entries with j ≥ n are never read).
  log_falling = jnp.log(jnp.where(j < n[:, None], n[:, None] - j, 1.0))
  prefix = jnp.concatenate([jnp.zeros_like(n)[:, None], jnp.cumsum(log_falling, axis=-1)], axis=-1)
  i = jnp.arange(2, n_max + 1, dtype=dtype)
  inside = i <= n[:, None]
  k = jnp.where(inside, jnp.minimum(i, n[:, None] - i), 0.0).astype(jnp.int32)
  log_comb = jnp.take_along_axis(prefix, k, axis=-1) - log_factorial[k]
  log_terms = jnp.where(inside, i * log_q[:, None] + log_comb + log_b, -jnp.inf)
  return jax.nn.softplus(numerics.logsumexp(log_terms, axis=-1))


def _rdp_rows(q, alpha, rows, log_b, log_factorial):
  """Corollary 10 between ⌊α⌋ and ⌈α⌉ (α clipped to [2, n_max] by the caller)."""
  size = q.shape[0]
  n_f, n_c = jnp.floor(alpha), jnp.ceil(alpha)
  twice = lambda v: jnp.concatenate([v, v])
  k = _log_a_int(twice(jnp.log(q)), jnp.concatenate([n_f, n_c]), log_b[twice(rows)], log_factorial)
  t = alpha - n_f
  return ((1 - t) * k[:size] + t * k[size:]) / (alpha - 1)


@functools.partial(jax.jit, static_argnames=("n_max",))
def without_replacement_unchecked(q, sigma, alpha, n_max):
  dtype = jnp.result_type(q, sigma, alpha)
  q, sigma, alpha = q.astype(dtype), sigma.astype(dtype), alpha.astype(dtype)
  shape = jnp.broadcast_shapes(q.shape, sigma.shape, alpha.shape)
  size = math.prod(shape)
  if size == 0:
    return jnp.zeros(shape, dtype)

  # The forward differences depend on σ alone: computed once per entry of ``sigma``.
  sig = sigma.reshape(-1)
  sig_ok = (sig > 0) & jnp.isfinite(sig)
  sig_safe = jnp.where(sig_ok, sig, 1.0)
  num = (n_max + 1) // 2
  rows_per_chunk = max(1, _BUDGET // (num * 2 * _NODES))
  (log_b,) = _in_chunks(lambda xs: (_log_b(xs[0], n_max),), (sig_safe,), rows_per_chunk)

  rows = jnp.broadcast_to(jnp.arange(sig.shape[0]).reshape(sigma.shape), shape).reshape(-1)
  qf = jnp.broadcast_to(q, shape).reshape(-1)
  sf = jnp.broadcast_to(sigma, shape).reshape(-1)
  af = jnp.broadcast_to(alpha, shape).reshape(-1)

  generic = (qf > 0) & (qf < 1) & (sf > 0) & jnp.isfinite(sf) & (af >= 1) & (af <= n_max)
  q_g = jnp.where(generic, qf, 0.5)
  a_g = jnp.where(generic, jnp.clip(af, 2.0, float(n_max)), 2.0)
  log_factorial = jnp.asarray(np.cumsum(np.log(np.maximum(np.arange(n_max + 1), 1))), dtype)
  per_chunk = max(1, _BUDGET // (8 * n_max))
  (rdp,) = _in_chunks(
      lambda xs: (_rdp_rows(xs[0], xs[1], xs[2], log_b, log_factorial),),
      (q_g, a_g, rows), per_chunk)

  inf = jnp.full_like(rdp, jnp.inf)
  s_pos = jnp.where(sf > 0, sf, 1.0)
  a_fin = jnp.where(jnp.isfinite(af), af, 2.0)
  gaussian = jnp.where(jnp.isfinite(af) & (sf > 0), a_fin / (2 * s_pos * s_pos), inf)
  out = jnp.where(generic, rdp, inf)
  out = jnp.where(qf == 1, gaussian, out)
  out = jnp.where(qf == 0, 0.0, out)
  valid = (validation.in_domain("sampling_rate", qf)
           & validation.in_domain("noise_multiplier", sf) & validation.in_domain("orders", af))
  return jnp.where(valid, out, jnp.nan).reshape(shape)
