r"""The PLD's loss grid and one step's pessimistic discretised PLD on it.

:class:`PldGrid` holds the static sizes; the constants here (grid limits, Chernoff orders,
block sizes, float64 rounding) are shared by the other modules of :mod:`jaxrdp.accounting.pld`.
:func:`step_pmfs` discretises one step of the Poisson-sampled Gaussian in both directions by
"connect the dots" (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022, Alg. 1; see the
package docstring).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import loops

DEFAULT_INTERVAL = 1e-4      # Δ, dp_accounting's PLDAccountant default
DEFAULT_TAIL_MASS = 1e-15    # the composed tail mass the window may leave out (added to δ)
MAX_BINS = 1 << 24           # largest FFT circle / step PMF (≈ 0.5 GiB of float64 work arrays)
MAX_ELEMENTS = 1 << 27       # phases × directions × points of a work array (1 GiB): per chunk
_Z = 10.0                    # a step's loss range covers x ∈ [−Zσ, 1 + Zσ] (mass outside ≈ 1e-23)
_LAMBDAS = 2.0 ** (np.arange(-12, 33) / 2)   # Chernoff orders λ of the window and its tail bound
_LOWER_TAIL_MASS = 1e-12     # the composed mass below the window aimed at (wraps to its top)
_WRAP_NATS = 16.0   # the wrapped mass aimed at when reading ε or δ: at most e^{−16} δ (~1e-7 δ)
_BLOCK = 64                  # points per block of the moment-generating function's upper bound
_READ_BLOCK = 512            # points per block of the two-level search for ε (divides ``bins``)
_SQRT_HALF = math.sqrt(0.5)
_U = float(np.finfo(np.float64).eps) / 2          # unit roundoff of float64
_SMALLEST_NORMAL = float(np.finfo(np.float64).tiny)
_MASS_FLOOR = 1e-280         # added to every point of the composed PMF (see :func:`_composed`)
_STRIDE = 8                  # the truncation's replace-one term is discretised on every 8th point


class PldGrid(NamedTuple):
  """The static shape of a PLD computation (hashable; pass it to a jitted function as is).

  Attributes:
    interval: Δ, the spacing of the loss grid.
    pmf_bins: points of one step's discretised PLD.
    bins: points of the FFT circle and of the composed PLD's window.
    tail_mass: the composed mass above the window aimed at (its Chernoff bound is added to δ).
  """
  interval: float
  pmf_bins: int
  bins: int
  tail_mass: float


class Lattice(NamedTuple):
  """A :class:`PldGrid` as the graph computes on it (:func:`lattice`): its sizes (static) and
  its values, which may be arguments of the program (one program serves every interval and
  tail mass on grids of the same sizes), with the transcendental functions of them taken on
  the host (``math``): the same values whether the graph gets them as constants (a user's
  ``jax.jit`` with a static grid, where XLA might fold them its own way) or as arguments.

  Attributes:
    interval: Δ.
    log_tail_mass: log of the grid's tail mass.
    decay: e^{−Δ}.
    rise: 1 − e^{−Δ}.
    factors: (_BLOCK, λ) the factors e^{−λ(_BLOCK − 1 − j)Δ} of the moment-generating
      function's block sums at every Chernoff order λ of :data:`_LAMBDAS`
      (:func:`jaxrdp.accounting.pld.convolution._log_mgf`).
    points: the grid's ``pmf_bins`` as a value: the points of a step's PMF that can hold mass,
      which the composition's rounding bounds count. (The composition program gets step PMFs
      computed by the other program zero-padded to ``bins``/4^k points, so that it serves
      every ``pmf_bins`` up to that length: :func:`jaxrdp.accounting.pld.readout._query`.)
    pmf_bins, bins: as in :class:`PldGrid` (static: array shapes); ``pmf_bins`` is the length
      of the step PMFs' arrays.
  """
  interval: Any
  log_tail_mass: Any
  decay: Any
  rise: Any
  factors: Any
  points: Any
  pmf_bins: int
  bins: int


@functools.lru_cache(maxsize=64)
def _interval_values(interval: float, tail_mass: float) -> tuple:
  # The factors e^{−λ(l_top − l_j)} of a block's points below its top (within an ulp or two:
  # the block sums they weigh allow 256 u, :func:`convolution._log_mgf`), with NumPy: values
  # of the program, the same in every program, and no program of their own to compile.
  below_top = (_BLOCK - 1 - np.arange(_BLOCK)) * np.float64(interval)
  factors = np.exp(-below_top[:, None] * _LAMBDAS)
  factors.flags.writeable = False
  scalars = (interval, math.log(tail_mass), math.exp(-interval), -math.expm1(-interval))
  return tuple(np.float64(v) for v in scalars) + (factors,)


def lattice(grid: PldGrid) -> tuple[tuple, tuple[int, int]]:
  """(values, sizes) of ``grid``: the float64 values of :class:`Lattice`, computed here, on the
  host (``math``, and ``jax.numpy`` on concrete values for the factors), and its static sizes;
  ``Lattice(*values, *sizes)`` in the graph."""
  values = _interval_values(float(grid.interval), float(grid.tail_mass))
  return values + (np.float64(grid.pmf_bins),), (grid.pmf_bins, grid.bins)


# ---------------------------------------------------------------------------------------------
# One step: the discretised PLD of the Poisson-sampled Gaussian mechanism.


def _log_ratio(x, q, sigma, xp=jnp):
  """log(1 − q + q·r(x)), r(x) = exp((2x − 1)/(2σ²)): the remove direction's privacy loss,
  as a log-sum-exp (no overflow of r, exact at q = 0 and q = 1)."""
  with np.errstate(divide="ignore"):
    return xp.logaddexp(xp.log1p(-q), xp.log(q) + (2.0 * x - 1.0) / (2.0 * sigma**2))


def _x_of_loss(u, q, sigma):
  """The standardised thresholds (x/σ, (x − 1)/σ) of the inverse x(u) of the remove
  direction's loss, −∞ where u ≤ log(1 − q) (no x has so small a loss) and +∞ above every
  loss when q = 0. Both branches of every ``where`` are finite, so gradients are NaN-free."""
  positive_q = q > 0
  q_safe = jnp.where(positive_q, q, 1.0)
  arg = jnp.expm1(u) + q_safe            # e^u − (1 − q)
  reachable = arg > 0
  x = sigma**2 * (jnp.log(jnp.where(reachable, arg, 1.0)) - jnp.log(q_safe)) + 0.5
  finite = reachable & positive_q
  # q = 0: the loss is 0 with probability one; thresholds at ±∞ on either side of it.
  edge = jnp.where(positive_q, -jnp.inf, jnp.where(u >= 0, jnp.inf, -jnp.inf))
  x = jnp.where(finite, x, 0.0)
  return jnp.where(finite, x / sigma, edge), jnp.where(finite, (x - 1.0) / sigma, edge)


def _replace_loss(x, q, s, xp=jnp):
  """The privacy loss of the replace-one pair of the truncation term (:func:`step_pmfs`) at
  x: log(P_R(x)/Q_R(x)), P_R = (1 − q)·N(0, s²) + q·N(1, s²), Q_R = (1 − q)·N(0, s²) +
  q·N(−1, s²); odd and increasing in x."""
  return _log_ratio(x, q, s, xp) - _log_ratio(-x, q, s, xp)


def _asinh_of_exp(v):
  """asinh(e^v) for any v (no overflow: v + log(1 + √(1 + e^{−2v})) for v > 0); 0 at −∞."""
  big = v > 0
  vb = jnp.where(big, v, 0.0)
  return jnp.where(big, vb + jnp.log1p(jnp.sqrt(1.0 + jnp.exp(-2.0 * vb))),
                   jnp.arcsinh(jnp.exp(jnp.where(big, 0.0, v))))


def _replace_x_of_loss(u, q, s):
  r"""The standardised thresholds ((x + 1)/s, x/s, (x − 1)/s) of the inverse x(u) of
  :func:`_replace_loss`. With A = e^{1/(2s²)}(1 − q)/q, multiplying
  e^u·Q_R(x) = P_R(x) through by e^{−x/s² − u/2}/(q e^{−1/(2s²)}) gives
  2 sinh(x/s² − u/2) = 2A sinh(u/2), so x = s²(u/2 + asinh(A sinh(u/2))) (dp_accounting's
  ``GaussianPrivacyLoss`` inverse for REPLACE, reflected), taken in logarithms (A overflows
  at small s). q = 0 (no loss): thresholds at ∓∞ on either side of u = 0."""
  positive_q = q > 0
  q_safe = jnp.where(positive_q, q, 0.5)
  log_a = 0.5 / s**2 + jnp.log1p(-q_safe) - jnp.log(q_safe)      # −inf at q = 1
  half = 0.5 * jnp.abs(u)
  moving = half > 0
  h = jnp.where(moving, half, 1.0)
  log_sinh = h + jnp.log(-jnp.expm1(-2.0 * h)) - math.log(2.0)
  arcsinh = jnp.where(moving, _asinh_of_exp(log_a + log_sinh), 0.0)
  x = s**2 * (0.5 * u + jnp.sign(u) * arcsinh)
  edge = jnp.where(u >= 0, jnp.inf, -jnp.inf)
  x = jnp.where(positive_q, x, 0.0)
  return tuple(jnp.where(positive_q, (x + c) / s, edge) for c in (1.0, 0.0, -1.0))


def _replace_range(w, q, s, log_tail_mass, xp=jnp):
  """The loss L_R(X) at the top of the range x ∈ [−X, X] of the truncation's replace-one term
  that its PMF covers (symmetric about 0). X = 1 + z·s reaches as far as the term's mass
  above it, at most w·e^{−z²/2}/2 (a Gaussian tail bound on both of its components), is at
  most tail_mass·1e-6 per step (that mass is counted as infinite loss: sound, and within
  the tail mass over up to 10⁶ steps), and never beyond z = Z; the mass below −X is rounded
  up to the PMF's first point (sound, and below loss 0 where it adds nothing to δ of one
  step)."""
  with np.errstate(divide="ignore"):
    excess = xp.log(w) + math.log(5e5) - log_tail_mass
  positive = excess > 0
  z = xp.where(positive, xp.sqrt(2 * xp.where(positive, excess, 1.0)), 0.0)
  return _replace_loss(1.0 + xp.minimum(z, _Z) * s, q, s, xp)


def _start_index(q, sigma, grid, add, truncation=None):
  """First grid index of a step's PMF: the loss at the end of x ∈ [−Zσ, 1 + Zσ] where it is
  smallest, rounded down (mass below it is rounded up to it); with ``truncation``
  (1 − w, w, q_c) the replace-one term's range [−L_R, L_R] (:func:`_replace_range`) too."""
  low = jnp.where(add, -_log_ratio(1.0 + _Z * sigma, q, sigma), _log_ratio(-_Z * sigma, q, sigma))
  if truncation is not None:
    _, w, qc = truncation
    low = jnp.minimum(low, -_replace_range(w, qc, sigma / 2, grid.log_tail_mass))
  return jnp.floor(low / grid.interval).astype(jnp.int64)


def _tail_pair(z):
  """Φ(z) and 1 − Φ(z), each from one erfc of |z| (its own tail)."""
  far = 0.5 * lax.erfc(jnp.abs(z) * _SQRT_HALF)
  return jnp.where(z < 0, far, 1.0 - far), jnp.where(z < 0, 1.0 - far, far)


def _rising(z, lower, upper):
  """Mass between consecutive thresholds z_k < z_{k+1} (last axis), from the tail each
  interval lies in."""
  return jnp.where(z[..., :-1] > 0, upper[..., :-1] - upper[..., 1:],
                   lower[..., 1:] - lower[..., :-1])


def _falling(z, lower, upper):
  """Mass between consecutive thresholds z_k > z_{k+1} (last axis)."""
  return jnp.where(z[..., 1:] > 0, upper[..., 1:] - upper[..., :-1],
                   lower[..., :-1] - lower[..., 1:])


def _replace_masses(z, lower, upper, q):
  """(P-mass, Q-mass) of each loss interval [l_k, l_{k+1}] under the replace-one pair of
  :func:`_replace_loss` (x rises with l), and the P-mass below l_0 and above the last point,
  from the thresholds ``z`` of :func:`_replace_x_of_loss` (stacked) and their
  :func:`_tail_pair`."""
  gm, g0, g1 = _rising(z, lower, upper)
  p_mass = (1 - q) * g0 + q * g1
  q_mass = (1 - q) * g0 + q * gm
  below = (1 - q[..., 0]) * lower[1, ..., 0] + q[..., 0] * lower[2, ..., 0]
  above = (1 - q[..., 0]) * upper[1, ..., -1] + q[..., 0] * upper[2, ..., -1]
  return p_mass, q_mass, below, above


def step_pmfs(q, sigma, grid, truncation=None):
  """One step's pessimistic discretised PLD, for each phase and both directions.

  Args:
    q, sigma: the phases' sampling rates and noise multipliers (1-D, float64).
    grid: the :class:`Lattice` (Δ, e^{−Δ}, 1 − e^{−Δ}; ``pmf_bins`` points, static).
    truncation: None (Poisson sampling), or (1 − w, w, q_c) per phase for truncated Poisson
      sampling (:func:`jaxrdp.accounting.pld.truncation.truncation_weights`, each weight an
      upper bound): the step's pair is then the mixture, with weight w, of the replace-one
      pair at (q_c, σ/2) (:func:`_replace_loss`, the same in both directions) and, with
      weight 1 − w, the Poisson pair (Gaussian mechanism with truncated Poisson sampling,
      arXiv 2508.15089; dp_accounting's ``from_truncated_subsampled_gaussian_mechanism``).
      A mixture of pairs whose component is known is a pair whose PLD is the mixture of the
      PLDs, and the mixture of dominating pairs dominates it: the replace-one term is
      discretised on every :data:`_STRIDE`-th point (spacing _STRIDE·Δ), the Poisson term on
      every point, and the two PMFs mixed.

  Returns:
    (start, pmf, above): for direction (remove, add) × phase, the first point's index (the
    points are l_k = (start + k)Δ), the mass at each point (connect the dots; losses below the
    first point rounded up to it) and the mass above the last point (infinite loss). Shapes
    (2, P), (2, P, pmf_bins), (2, P).
  """
  interval, pmf_bins = grid.interval, grid.pmf_bins
  add = jnp.array([[False], [True]])                               # (direction, phase)
  start = _start_index(q, sigma, grid, add, truncation)
  losses = (start[..., None] + jnp.arange(pmf_bins)) * interval    # (2, P, K)
  # The add direction's loss l is the remove one's −l at the same x (and P, Q swapped).
  z0, z1 = _x_of_loss(jnp.where(add[..., None], -losses, losses), q[:, None], sigma[:, None])
  z = jnp.stack([z0, z1])
  if truncation is None:
    lower, upper = _tail_pair(z)
  else:   # the replace-one term's thresholds (below) through the same error functions
    coarse = losses[..., ::_STRIDE]
    zr = jnp.stack(_replace_x_of_loss(coarse, truncation[2][:, None], sigma[:, None] / 2))
    tails = _tail_pair(jnp.concatenate([z.reshape(-1), zr.reshape(-1)]))
    lower, upper = (v[:z.size].reshape(z.shape) for v in tails)
    r_lower, r_upper = (v[z.size:].reshape(zr.shape) for v in tails)
  # Mass of each loss interval [l_k, l_{k+1}] under N(0, σ²) and N(1, σ²): x grows with k in the
  # remove direction, falls in the add one; differences taken in the interval's own tail.
  g0, g1 = jnp.where(add[..., None], _falling(z, lower, upper), _rising(z, lower, upper))
  qq = q[:, None]
  mixture = (1 - qq) * g0 + qq * g1
  p_mass = jnp.where(add[..., None], g0, mixture)
  q_mass = jnp.where(add[..., None], mixture, g0)
  below = jnp.where(add, upper[0, ..., 0],
                    (1 - q) * lower[0, ..., 0] + q * lower[1, ..., 0])
  above = jnp.where(add, lower[0, ..., -1],
                    (1 - q) * upper[0, ..., -1] + q * upper[1, ..., -1])
  pmf = _split(p_mass, q_mass, losses, grid.decay, grid.rise).at[..., 0].add(below)
  if truncation is None:
    return start, pmf, above
  # The replace-one term on every _STRIDE-th point: its weight w is small, so a coarser
  # discretisation (still a dominating pair) costs little tightness and few error functions.
  keep, w, qc = truncation
  r_p, r_q, r_below, r_above = _replace_masses(zr, r_lower, r_upper, qc[:, None])
  decay = grid.decay ** _STRIDE
  r_pmf = _split(r_p, r_q, coarse, decay, 1.0 - decay).at[..., 0].add(r_below)
  r_pmf = jnp.pad(r_pmf[..., None], [(0, 0)] * 3 + [(0, _STRIDE - 1)]).reshape(pmf.shape)
  return start, keep[:, None] * pmf + w[:, None] * r_pmf, keep * above + w * r_above


def _split(p_mass, q_mass, losses, decay, rise):
  """The connect-the-dots PMF on the points ``losses`` (spacing d, e^{−d} = ``decay``,
  1 − e^{−d} = ``rise``) from each interval's P- and Q-mass: interval k's P-mass p goes
  a to l_k and p − a to l_{k+1}, keeping its Q-mass: a e^{−l_k} + (p − a) e^{−l_{k+1}} =
  Q-mass (Doroshenko et al. 2022, Alg. 1)."""
  left = (q_mass * jnp.exp(losses[..., :-1]) - p_mass * decay) / rise
  left = jnp.clip(left, 0.0, p_mass)
  pad = [(0, 0)] * (left.ndim - 1)
  return jnp.pad(left, pad + [(0, 1)]) + jnp.pad(p_mass - left, pad + [(1, 0)])


# ---------------------------------------------------------------------------------------------
# One step of the mixture-of-Gaussians mechanism.

_NEWTON_STEPS = 96   # most Newton iterations of the mixture's inverse loss (then flagged)


def _mixture_exponents(x, sigma, c, p, xp=jnp):
  """log p_i + (2 c_i x − c_i²)/(2σ²) for each component (the trailing axis of ``c``, ``p``;
  x, σ broadcast against it with a trailing axis added): −inf where p_i = 0."""
  positive = p > 0
  with np.errstate(divide="ignore"):
    log_p = xp.where(positive, xp.log(xp.where(positive, p, 1.0)), -xp.inf)
  s2 = (sigma**2)[..., None]
  return log_p + (2 * c * x[..., None] - c**2) / (2 * s2)


def _mixture_loss(x, sigma, c, p, xp=jnp):
  """The remove direction's loss L(x) = log Σ_i p_i e^{(2c_i x − c_i²)/(2σ²)} of the pair
  P = Σ_i p_i N(c_i, σ²), Q = N(0, σ²) (convex and non-decreasing in x for c_i ≥ 0)."""
  e = _mixture_exponents(x, sigma, c, p, xp)
  top = xp.max(e, axis=-1)   # finite: some p_i > 0
  return xp.log(xp.sum(xp.exp(e - top[..., None]), axis=-1)) + top


def _mixture_value_and_slope(x, sigma, c, p, components=None):
  """(log Σ_i p_i e^{a_i(x)}, its derivative in x) over the components (all, or where
  ``components`` is True), a_i(x) = (2c_i x − c_i²)/(2σ²): one log-sum-exp and its softmax
  (the max taken out without a derivative)."""
  e = _mixture_exponents(x, sigma, c, p)
  if components is not None:
    e = jnp.where(components, e, -jnp.inf)
  top = lax.stop_gradient(jnp.max(e, axis=-1, keepdims=True))
  weights = jnp.exp(e - top)
  total = jnp.sum(weights, axis=-1)
  return jnp.log(total) + top[..., 0], jnp.sum(weights * c, axis=-1) / total / sigma**2


def _mixture_x_of_loss(u, sigma, c, p, final_step=True):
  r"""(x(u), converged): the inverse of :func:`_mixture_loss` by Newton's method from above.

  L is convex and increasing where it exceeds its infimum L₋ = log Σ_{c_i = 0} p_i (−∞
  without a zero sensitivity): no x has a loss u ≤ L₋ (x = −∞ there). The iteration starts at
  x₀ = σ²(u − log p_*)/c_* + c_*/2, where the largest sensitivity's term alone reaches u
  (L(x₀) ≥ u); Newton's steps on a convex increasing function then stay above the root and
  decrease to it (quadratically near it), until no point moves by more than 4 ulps (or
  :data:`_NEWTON_STEPS` steps). ``converged``: |L(x) − u| within 64 ulps of the terms (a
  point that is not makes the caller's ε +inf)."""
  star = jnp.argmax(jnp.where(p > 0, c, -1.0), axis=-1)
  c_star = jnp.take_along_axis(c, star[..., None], axis=-1)[..., 0]
  p_star = jnp.take_along_axis(p, star[..., None], axis=-1)[..., 0]
  reachable = (u > _mixture_floor(c, p)) & (c_star > 0)
  floor = _mixture_floor(c, p)
  s2 = sigma**2
  c_safe = jnp.where(c_star > 0, c_star, 1.0)
  u_safe = jnp.where(reachable, u, floor + 1.0)
  u_safe = jnp.where(jnp.isfinite(u_safe), u_safe, 0.0)
  x0 = s2 * (u_safe - jnp.log(p_star)) / c_safe + c_safe / 2

  def newton(x):
    value, slope = _mixture_value_and_slope(x, sigma, c, p)
    step = (value - u_safe) / jnp.where(slope > 0, slope, 1.0)
    return x - jnp.where(slope > 0, jnp.maximum(step, 0.0), 0.0)

  def moving(carry):
    i, x, moved = carry
    return (i < _NEWTON_STEPS) & moved

  def iterate(carry):
    i, x, _ = carry
    nxt = newton(x)
    return i + 1, nxt, jnp.any(x - nxt > 4 * _U * (1.0 + jnp.abs(x)))

  _, x, _ = loops.while_loop(moving, iterate, (0, lax.stop_gradient(x0), jnp.bool_(True)))
  x = jnp.where(reachable, x, -jnp.inf)
  if not final_step:
    return x, reachable
  return _mixture_finish(x, u, sigma, c, p)


_STRIDE_NEWTON = 64   # the mixture's inverse is solved on every 64th grid point, then refined
_REFINE_STEPS = 2     # Newton steps from the interpolated start at the other points


def _positive_part(u, c, p):
  """w(u) = log(e^u − p₀) with p₀ = Σ_{c_i = 0} p_i: the target of the positive components'
  log-sum-exp G(x) = log Σ_{c_i > 0} p_i e^{(2c_i x − c_i²)/(2σ²)} (L(x) = u ⇔ G(x) = w(u)).
  G has no flat asymptote (its slope is at least min_{c_i > 0} c_i/σ²): Newton's method
  converges on it from any nearby start. −inf where u ≤ log p₀ (no x)."""
  zero = jnp.sum(jnp.where(c == 0, p, 0.0), axis=-1)
  held = zero > 0
  gap = jnp.log(jnp.where(held, zero, 1.0)) - u                  # log p₀ − u
  above = gap < 0
  inside = jnp.log(-jnp.expm1(jnp.where(above, gap, -1.0)))
  return jnp.where(held, jnp.where(above, u + inside, -jnp.inf), u)


def _mixture_x_on_grid(u, sigma, c, p):
  """:func:`_mixture_x_of_loss` for rows of losses along the last axis (uniform, monotone,
  longer than 4·:data:`_STRIDE_NEWTON`): the loop of Newton's method runs on every
  _STRIDE_NEWTON-th point and on the 2·_STRIDE_NEWTON points around the place where a row
  crosses the loss's infimum (below it no x exists, and near it x falls without bound); every
  other point starts from the linear interpolation, in w(u) (:func:`_positive_part`),
  between its segment's ends and takes :data:`_REFINE_STEPS` Newton steps on G(x) = w(u).
  x(w) is concave (the inverse of a convex increasing function), so the interpolation starts
  at or below the root, the first step lands above it and the others descend to it. Every
  point's residual is checked as in :func:`_mixture_x_of_loss` (``converged``)."""
  k = u.shape[-1]
  step = _STRIDE_NEWTON
  if k <= 4 * step:
    return _mixture_x_of_loss(u, sigma, c, p)
  segments = -(-k // step)
  coarse_at = np.concatenate([np.arange(0, k, step), [k - 1]])
  n = coarse_at.size
  # The window around the crossing of the infimum (at the row's start where there is none).
  reachable = u > _mixture_floor(c, p)[..., None]
  crossing = jnp.argmax(reachable != reachable[..., :1], axis=-1)
  first = jnp.clip(crossing - step, 0, k - 2 * step)
  window = first[..., None] + jnp.arange(2 * step)                       # (..., 2S)
  at = jnp.concatenate([jnp.broadcast_to(coarse_at, u.shape[:-1] + (n,)), window], axis=-1)
  x_slow, _ = _mixture_x_of_loss(jnp.take_along_axis(u, at, axis=-1), sigma, c, p,
                                 final_step=False)
  x_c = x_slow[..., :n]
  w = _positive_part(u, c, p)
  w_c = jnp.concatenate([w[..., ::step], w[..., -1:]], axis=-1)

  def spread(v):
    """v[..., j] at every point of segment j (a broadcast: no gather, fused with its use)."""
    wide = jnp.broadcast_to(v[..., None], v.shape + (step,))
    return wide.reshape(v.shape[:-1] + (segments * step,))[..., :k]
  left, right = spread(x_c[..., :-1]), spread(x_c[..., 1:])
  w_left, w_right = spread(w_c[..., :-1]), spread(w_c[..., 1:])
  both = jnp.isfinite(left) & jnp.isfinite(right) & (w_right != w_left) & jnp.isfinite(w)
  span = jnp.where(both, w_right - w_left, 1.0)
  frac = jnp.where(both, (jnp.where(both, w, 0.0) - jnp.where(both, w_left, 0.0)) / span, 0.0)
  left0 = jnp.where(both, left, 0.0)
  x = left0 + frac * (jnp.where(both, right, 0.0) - left0)
  positive = c > 0
  w_safe = jnp.where(both, w, 0.0)
  for _ in range(_REFINE_STEPS):   # Newton on G(x) = w: its slope is bounded below
    value, slope = _mixture_value_and_slope(x, sigma, c, p, positive)
    x = x - (value - w_safe) / slope
  x = jnp.where(both, x, -jnp.inf)
  # The coarse points and the window, from the loop (selects: no scatter).
  i = np.arange(k)
  x = jnp.where(i % step == 0, left, jnp.where(i == k - 1, x_c[..., -1:], x))
  offset = i - first[..., None]
  looped = jnp.take_along_axis(x_slow[..., n:], jnp.clip(offset, 0, 2 * step - 1), axis=-1)
  x = jnp.where((offset >= 0) & (offset < 2 * step), looped, x)
  return _mixture_finish(x, u, sigma, c, p)


def _mixture_finish(x, u, sigma, c, p):
  """(x, converged) after the search: one more Newton step, taken with gradients (the
  implicit function theorem: x'(θ) = −∂_θL/∂_xL at the root), and the residual check."""
  reachable = jnp.isfinite(x)
  x0 = lax.stop_gradient(jnp.where(reachable, x, 0.0))
  u_safe = jnp.where(reachable, u, 0.0)
  value, slope = _mixture_value_and_slope(x0, sigma, c, p)
  x1 = x0 - (value - u_safe) / jnp.where(slope > 0, slope, 1.0)
  residual = jnp.abs(_mixture_loss(x1, sigma, c, p) - u_safe)
  scale = jnp.abs(u_safe) + jnp.max(jnp.abs(_mixture_exponents(x1, sigma, c, p)) * (p > 0),
                                    axis=-1) + 1.0
  unreachable = u <= _mixture_floor(c, p)
  converged = unreachable | (reachable & (residual <= 64 * _U * scale))
  return jnp.where(reachable, x1, -jnp.inf), converged


def _mixture_floor(c, p):
  """The infimum of the loss, log Σ_{c_i = 0} p_i (−inf without a zero sensitivity)."""
  zero = jnp.sum(jnp.where(c == 0, p, 0.0), axis=-1)
  return jnp.where(zero > 0, jnp.log(jnp.where(zero > 0, zero, 1.0)), -jnp.inf)


def _mixture_range(sigma, c, p, xp=jnp):
  """(lowest, highest) loss of the remove direction over x ∈ [−Zσ, c_max + Zσ]."""
  top = xp.max(c, axis=-1)
  return (_mixture_loss(-_Z * sigma, sigma, c, p, xp),
          _mixture_loss(top + _Z * sigma, sigma, c, p, xp))


def mixture_step_pmfs(sigma, c, p, grid):
  """One step's pessimistic discretised PLD of the mixture-of-Gaussians mechanism, for each
  phase and both directions (as :func:`step_pmfs`; Choquette-Choo, Ganesh, Steinke, Thakurta
  2023, arXiv 2310.15526; dp_accounting's ``MixtureGaussianPrivacyLoss``):

  * remove: P = Σ_i p_i N(c_i, σ²), Q = N(0, σ²), L(x) = log Σ_i p_i e^{(2c_i x − c_i²)/(2σ²)};
  * add: P = N(0, σ²), Q = Σ_i p_i N(c_i, σ²), the loss −L(x) at the same x.

  L is monotone, so each loss interval is an interval of x between the inverses
  (:func:`_mixture_x_of_loss`), and its masses are differences of Gaussian CDFs, split by
  connect the dots as the Poisson case. ``sigma`` (P,), ``c``, ``p`` (P, m): sensitivities
  c_i ≥ 0 and their probabilities (summing to one). Returns (start, pmf, above) as
  :func:`step_pmfs`; where an inverse did not converge, all of the phase's mass is put at
  infinite loss (above = 1: ε = +inf)."""
  interval, pmf_bins = grid.interval, grid.pmf_bins
  add = jnp.array([[False], [True]])
  low, high = _mixture_range(sigma, c, p)
  start = jnp.floor(jnp.where(add, -high, low) / interval).astype(jnp.int64)
  losses = (start[..., None] + jnp.arange(pmf_bins)) * interval                # (2, P, K)
  cc, pp = c[:, None, :], p[:, None, :]
  x, converged = _mixture_x_on_grid(jnp.where(add[..., None], -losses, losses),
                                    sigma[:, None], cc, pp)
  # Thresholds of Q = N(0, σ²) and of each component N(c_i, σ²): (1 + m, 2, P, K).
  shifts = jnp.concatenate([jnp.zeros_like(c[:, :1]), c], axis=-1)               # (P, 1 + m)
  finite = jnp.isfinite(x)[None]
  x = jnp.where(jnp.isfinite(x), x, 0.0)   # (no loss this small: no mass, a zero derivative)
  z = (x[None] - jnp.moveaxis(shifts, -1, 0)[:, None, :, None]) / sigma[:, None]
  z = jnp.where(finite, z, -jnp.inf)
  lower, upper = _tail_pair(z)
  masses = jnp.where(add[..., None], _falling(z, lower, upper), _rising(z, lower, upper))
  weights = jnp.moveaxis(p, -1, 0)[:, None, :, None]                             # (m, 1, P, 1)
  mixture = jnp.sum(weights * masses[1:], axis=0)
  gauss = masses[0]
  p_mass = jnp.where(add[..., None], gauss, mixture)
  q_mass = jnp.where(add[..., None], mixture, gauss)
  mix_lower = jnp.sum(weights[..., 0] * lower[1:, ..., 0], axis=0)
  mix_upper = jnp.sum(weights[..., 0] * upper[1:, ..., -1], axis=0)
  below = jnp.where(add, upper[0, ..., 0], mix_lower)
  above = jnp.where(add, lower[0, ..., -1], mix_upper)
  pmf = _split(p_mass, q_mass, losses, grid.decay, grid.rise).at[..., 0].add(below)
  # A phase whose inverse did not converge everywhere: all of its mass at infinite loss
  # (ε = +inf), never a value resting on an unconverged threshold.
  return start, pmf, jnp.where(jnp.all(converged, axis=-1), above, 1.0)
