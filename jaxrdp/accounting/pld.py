r"""Tight accounting: the privacy-loss distribution (PLD) of Poisson-sampled Gaussian DP-SGD.

For a pair of distributions (P, Q), the privacy loss is L = log(P(X)/Q(X)) with X ~ P, and the
hockey-stick divergence is δ(ε) = E_P[(1 − e^{ε − L})₊] (+ P's mass where Q is zero, "infinite
loss"). The loss of a composition is the sum of the losses of its steps, so its distribution
is the convolution of theirs (Koskela, Jälkö, Honkela 2020; Meiser, Mohammadi 2018); every
(ε, δ) guarantee of DP-SGD follows from it, with nothing lost to a conversion, which is what
makes a PLD accountant tighter than RDP.

One step of DP-SGD with Poisson sampling at rate q and noise multiplier σ (sensitivity 1), in
the two directions of add/remove adjacency (Zhu, Dong, Wang 2022, Thm. 11; dp_accounting's
``from_gaussian_mechanism`` with ``sampling_prob``):

* remove: P = (1 − q)·N(0, σ²) + q·N(1, σ²), Q = N(0, σ²), L(x) = log(1 − q + q·r(x));
* add:    P = N(0, σ²), Q = (1 − q)·N(0, σ²) + q·N(1, σ²), L(x) = −log(1 − q + q·r(x)),

with r(x) = exp((2x − 1)/(2σ²)). L is monotone in x, so the probability of a loss interval is
a difference of Gaussian CDFs at the inverse x(u) = σ²·log((e^u − (1 − q))/q) + 1/2: a smooth
function of (q, σ) on a fixed loss grid. The reported δ is the larger of the two directions'.

Discretisation, pessimistic ("connect the dots", Doroshenko, Ghazi, Kamath, Kumar, Manurangsi
2022, Alg. 1): on the grid l_k = kΔ, the P-mass of each interval [l_k, l_{k+1}] is split between
its two ends so that both its P-mass and its Q-mass (Q = e^{−L}·P) are preserved. The original
pair is a post-processing of the split one (map a point at l_k back to the original points in
proportion to what they gave it: the same map for P and Q, since every point at l_k has the
same ratio P/Q = e^{l_k}), so the split pair dominates it: its δ(ε) is ≥ the true δ(ε) at every
ε, also after composition. Losses below the grid are rounded up to its first point (moving mass
to a larger loss only increases δ), and mass above it is counted as infinite loss.

Composition: the T-fold convolution is computed by FFT on a circle of ``bins`` points:
folding each step's PMF modulo ``bins`` and convolving circularly gives the composed PMF
folded modulo ``bins`` (exactly). It is read off on the window of ``bins`` points whose top
lies above the composed loss's upper tail: a Chernoff bound, min_λ exp(Σ_i T_i K_i(λ) − λu),
with K_i the log-moment-generating function of step i's discretised loss, bounds the mass
above the window, and that bound is added to the infinite-loss mass (so mass that wrapped
around from above cannot lower δ). Mass below the window wraps to its top: a larger loss,
so only a looser δ. Negative values from rounding in the FFT are set to zero.

ε(δ) and δ(ε): δ(ε) = p_∞ + Σ_k p_k (1 − e^{ε − l_k})₊ is a sum over bins; ε(δ) is its root,
in closed form on the grid interval that holds it: with S₀ = Σ_{l_k > ε} p_k and
S₁ = Σ_{l_k > ε} p_k e^{−l_k} fixed there, ε = log((p_∞ + S₀ − δ)/S₁). Its derivative with
respect to q and σ (through the bin probabilities, the FFT and this formula, the interval held
fixed) is the implicit derivative of δ(ε) = δ_target: no search loop is differentiated.

Precision: float64 only. The connect-the-dots split recovers a difference of order Δ·P_k
from two numbers of size P_k (about four digits lost at Δ = 1e-4), and the FFT spreads
rounding of 1e-16 of the total mass over every bin, against δ of 1e-5 to 1e-10: float32
cannot resolve either, and is refused.

Grid sizes are static (they set array shapes): :func:`pld_grid` chooses them from concrete
parameters (the loss range of one step, the composed loss's Chernoff quantiles at
``tail_mass``). A grid too small for the parameters it is used with still gives a valid,
looser bound (more infinite-loss mass, a higher ε), never a smaller one.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import loops
from jaxrdp._internal import validation
from jaxrdp.accounting import composition

DEFAULT_INTERVAL = 1e-4      # Δ, dp_accounting's PLDAccountant default
DEFAULT_TAIL_MASS = 1e-15    # the composed tail mass the window may leave out (added to δ)
MAX_BINS = 1 << 24           # largest FFT circle / step PMF (≈ 0.5 GiB of float64 work arrays)
MAX_ELEMENTS = 1 << 27       # phases × directions × points of a work array (1 GiB): per chunk
_Z = 10.0                    # a step's loss range covers x ∈ [−Zσ, 1 + Zσ] (mass outside ≈ 1e-23)
_LAMBDAS = 2.0 ** (np.arange(-12, 33) / 2)   # Chernoff orders λ of the window and its tail bound
_LOWER_TAIL_MASS = 1e-12     # the composed mass below the window aimed at (wraps to its top)
_BLOCK = 64                  # points per block of the moment-generating function's upper bound
_READ_BLOCK = 512            # points per block of the two-level search for ε (divides ``bins``)
_SQRT_HALF = math.sqrt(0.5)
_U = float(np.finfo(np.float64).eps) / 2          # unit roundoff of float64
_SMALLEST_NORMAL = float(np.finfo(np.float64).tiny)
_MASS_FLOOR = 1e-280         # added to every point of the composed PMF (see :func:`_composed`)


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


def _start_index(q, sigma, interval, add):
  """First grid index of a step's PMF: the loss at the end of x ∈ [−Zσ, 1 + Zσ] where it is
  smallest, rounded down (mass below it is rounded up to it)."""
  low = jnp.where(add, -_log_ratio(1.0 + _Z * sigma, q, sigma), _log_ratio(-_Z * sigma, q, sigma))
  return jnp.floor(low / interval).astype(jnp.int64)


def step_pmfs(q, sigma, interval, pmf_bins):
  """One step's pessimistic discretised PLD, for each phase and both directions.

  Args:
    q, sigma: the phases' sampling rates and noise multipliers (1-D, float64).
    interval: Δ. pmf_bins: the number of points (static).

  Returns:
    (start, pmf, above): for direction (remove, add) × phase, the first point's index (the
    points are l_k = (start + k)Δ), the mass at each point (connect the dots; losses below the
    first point rounded up to it) and the mass above the last point (infinite loss). Shapes
    (2, P), (2, P, pmf_bins), (2, P).
  """
  add = jnp.array([[False], [True]])                               # (direction, phase)
  start = _start_index(q, sigma, interval, add)
  losses = (start[..., None] + jnp.arange(pmf_bins)) * interval    # (2, P, K)
  # The add direction's loss l is the remove one's −l at the same x (and P, Q swapped).
  z0, z1 = _x_of_loss(jnp.where(add[..., None], -losses, losses), q[:, None], sigma[:, None])
  # Φ(z) and 1 − Φ(z) of both Gaussians' thresholds, from one erfc of |z| (its own tail).
  z = jnp.stack([z0, z1])
  far = 0.5 * lax.erfc(jnp.abs(z) * _SQRT_HALF)
  lower, upper = jnp.where(z < 0, far, 1.0 - far), jnp.where(z < 0, 1.0 - far, far)
  # Mass of each loss interval [l_k, l_{k+1}] under N(0, σ²) and N(1, σ²): x grows with k in the
  # remove direction, falls in the add one; differences taken in the interval's own tail.
  rising = jnp.where(z[..., :-1] > 0, upper[..., :-1] - upper[..., 1:],
                     lower[..., 1:] - lower[..., :-1])
  falling = jnp.where(z[..., 1:] > 0, upper[..., 1:] - upper[..., :-1],
                      lower[..., :-1] - lower[..., 1:])
  g0, g1 = jnp.where(add[..., None], falling, rising)
  qq = q[:, None]
  mixture = (1 - qq) * g0 + qq * g1
  p_mass = jnp.where(add[..., None], g0, mixture)
  q_mass = jnp.where(add[..., None], mixture, g0)
  below = jnp.where(add, upper[0, ..., 0],
                    (1 - q) * lower[0, ..., 0] + q * lower[1, ..., 0])
  above = jnp.where(add, lower[0, ..., -1],
                    (1 - q) * upper[0, ..., -1] + q * upper[1, ..., -1])
  # Split interval k's P-mass p between its ends, a at l_k and p − a at l_{k+1}, keeping its
  # Q-mass: a e^{−l_k} + (p − a) e^{−l_{k+1}} = Q-mass (Doroshenko et al. 2022, Alg. 1).
  left = (q_mass * jnp.exp(losses[..., :-1]) - p_mass * math.exp(-interval)) / -math.expm1(
      -interval)
  left = jnp.clip(left, 0.0, p_mass)
  pad = [(0, 0), (0, 0)]
  pmf = jnp.pad(left, pad + [(0, 1)]) + jnp.pad(p_mass - left, pad + [(1, 0)])
  return start, pmf.at[..., 0].add(below), above


# ---------------------------------------------------------------------------------------------
# Composition by FFT of exponentially tilted PMFs, and the window it is read on.


def _lambdas(interval: float) -> np.ndarray:
  """The Chernoff orders λ > 0 usable at this Δ: those with λ·Δ·(_BLOCK − 1) ≤ 700, so that
  every factor e^{−λ(l_top − l_j)} inside a block of :func:`_log_mgf` is a normal float64
  (no term underflows to 0 while a larger one of its block is kept)."""
  return _LAMBDAS[_LAMBDAS * interval * (_BLOCK - 1) <= 700.0]


def _weighted(t, x):
  """t·x, exactly 0 where t = 0 (a phase without steps adds nothing, whatever x is)."""
  return jnp.where(t > 0, t * jnp.where(t > 0, x, 0.0), 0.0)


def _log_mgf(pmf, start, interval):
  """An upper bound on K(λ) = log Σ_k p_k e^{λ l_k} at the Chernoff orders :func:`_lambdas`, in
  logs (λ·l overflows and underflows both ways): per block of :data:`_BLOCK` points,
  Σ_j p_j e^{−λ(l_top − l_j)} is a matrix product with factors in [e^{−700}, 1], and the blocks
  are combined by log-sum-exp. It bounds the mass above the window, so it must not round low:
  each block sum is raised by the rounding of a 64-term dot product of non-negative terms
  (256 u relative) and by 64 flushed subnormal products (64 × 2⁻¹⁰²² absolute) where the block
  holds any mass, and the exponent by the rounding of λ·l_top. No derivative flows (it places
  the window, bounds a negligible tail and picks the tilt). Leading axes of ``pmf`` and
  ``start`` are batch axes; the λ axis is appended."""
  pmf = lax.stop_gradient(pmf)
  lam = jnp.asarray(_lambdas(interval), pmf.dtype)
  below_top = (_BLOCK - 1 - jnp.arange(_BLOCK)) * interval
  blocks = pmf.reshape(pmf.shape[:-1] + (-1, _BLOCK))
  sums = blocks @ jnp.exp(-below_top[:, None] * lam)               # (..., blocks, λ)
  held = jnp.max(blocks, axis=-1, keepdims=True) > 0
  sums = jnp.where(held, sums * (1.0 + 256 * _U) + _BLOCK * _SMALLEST_NORMAL, 0.0)
  block_top = (start[..., None] + _BLOCK * jnp.arange(1, blocks.shape[-2] + 1) - 1) * interval
  exponent = lam * block_top[..., None]
  log_sums = jnp.where(held, jnp.log(jnp.where(held, sums, 1.0)), -jnp.inf)
  return (jax.nn.logsumexp(log_sums + exponent + 4 * _U * jnp.abs(exponent), axis=-2)
          + 1e-12)


def _tilt(pmf, start, interval, lam):
  """The PMF tilted by e^{λ l}: p̃_k = p_k e^{λ l_k − c}, c = log Σ_k p_k e^{λ l_k} (so p̃ sums to
  one), and c. Composition commutes with tilting (the tilt of a sum of losses is the product of
  the tilts), so the composed PMF is the composed p̃ times e^{Σ t_i c_i − λ l}: rounding errors
  of the FFT, absolute and of the order of the total mass, become errors relative to
  e^{Σ t_i c_i − λ l}, which is of the order of δ near the ε that δ is read at when λ is the
  Chernoff order of that tail. Computed as exp(log p + λ l − c) ≤ 1: no overflow; p = 0 gives
  0 (with a zero derivative). ``lam`` broadcasts against ``pmf``'s leading axes."""
  losses = (start[..., None] + jnp.arange(pmf.shape[-1])) * interval
  positive = pmf > 0
  exponent = jnp.where(positive, jnp.log(jnp.where(positive, pmf, 1.0)), -jnp.inf) + (
      lam[..., None] * losses)
  c = lax.stop_gradient(jax.nn.logsumexp(exponent, axis=-1))
  finite = jnp.isfinite(c)
  c = jnp.where(finite, c, 0.0)
  tilted = jnp.where(positive & finite[..., None],
                     jnp.exp(jnp.where(positive, exponent, 0.0) - c[..., None]), 0.0)
  return tilted, c


def _log_spectrum(f, t, eta):
  """Σ_i t_i·log f_i over the phase axis (−2), as (Σ t_i log|f_i|, Σ t_i arg f_i, whether a
  factor with t_i > 0 is 0), for complex f and integer-valued t ≥ 0: the product of powers
  Π_i f_i^{t_i} is then exp of the first times e^{i·second} (for integer t the branch of arg
  does not matter), one exponential, sine and cosine per frequency however many phases (real
  log, exp, sin and cos also vectorise where complex ones do not), with finite derivatives.

  With it, what bounds the product's rounding (see :func:`_spectrum_error`): Σ t_i
  log(|f_i| + η_i), with η_i a bound on |f_i|'s error at every frequency, and
  Σ t_i (|log|f_i|| + 8), which scales the rounding of the logarithms, arguments and their
  multiples by t (2e-11 rad at t = 5·10⁴, as any exp(t·log f) carries)."""
  t = t[:, None]
  square = f.real**2 + f.imag**2
  nonzero = square > 0
  log_modulus = jnp.where(nonzero, 0.5 * jnp.log(jnp.where(nonzero, square, 1.0)), 0.0)
  angle = jnp.arctan2(jnp.where(nonzero, f.imag, 0.0), jnp.where(nonzero, f.real, 1.0))
  modulus = lax.stop_gradient(jnp.sqrt(square))
  upper = jnp.log(modulus + eta[..., None])
  rounding = jnp.abs(lax.stop_gradient(log_modulus)) + 8.0
  return (jnp.sum(_weighted(t, log_modulus), axis=-2), jnp.sum(_weighted(t, angle), axis=-2),
          jnp.any(~nonzero & (t > 0), axis=-2),
          jnp.sum(_weighted(t, upper), axis=-2), jnp.sum(_weighted(t, rounding), axis=-2))


def _fold(pmf, bins):
  """The PMF's points folded onto a circle of ``bins`` points (point k at k mod bins)."""
  k = pmf.shape[-1]
  if k <= bins:
    return jnp.pad(pmf, [(0, 0)] * (pmf.ndim - 1) + [(0, bins - k)])
  laps = -(-k // bins)
  padded = jnp.pad(pmf, [(0, 0)] * (pmf.ndim - 1) + [(0, laps * bins - k)])
  return padded.reshape(pmf.shape[:-1] + (laps, bins)).sum(axis=-2)


def _pmf_rounding(q, sigma, start, c, lam, grid):
  """A bound on the relative rounding error of every point of one step's tilted PMF. Each mass
  is a difference of two Gaussian tail functions at thresholds z = x/σ whose rounding is
  about u·(|z| + σ·(|l| + |log q|)), over intervals Δz ≥ Δ·σ wide (the loss has slope ≤ 1/σ²
  in x); the connect-the-dots split divides by 1 − e^{−Δ}; the tilt e^{log p + λl − c} adds
  u·(|log p| + λ|l| + |c|). With a safety factor of 32 over these first-order estimates."""
  sigma_safe = jnp.where(sigma > 0, sigma, 1.0)
  q_safe = jnp.where(q > 0, q, 1.0)
  reach = (jnp.abs(start) + grid.pmf_bins) * grid.interval
  spread = (_Z / sigma_safe + reach + jnp.abs(jnp.log(q_safe)) + 2.0) / grid.interval
  tilt = 745.0 + lam * reach + jnp.abs(c)
  return jnp.minimum(32 * _U * (1.0 + jnp.where(q > 0, spread, 0.0) + tilt), 1.0)


def _step(q, sigma, grid):
  """:func:`step_pmfs` on the grid, computed once where it is used twice (a barrier keeps XLA
  from recomputing its error functions inside each consumer's fusion)."""
  return lax.optimization_barrier(step_pmfs(q, sigma, grid.interval, grid.pmf_bins))


def _moment_sums(q, sigma, t, grid, steps=None):
  """What the phases contribute to the window, summed over them (a leading axis (remove, add)
  on each): Σ t_i K_i(λ) (an upper bound), Σ t_i log(1 − p_∞,i) and the offset Σ t_i start_i
  of the composed grid. ``steps``: the phases' :func:`_step`, where already computed."""
  start, pmf, above = _step(q, sigma, grid) if steps is None else steps
  k = _log_mgf(pmf, start, grid.interval)
  return (jnp.sum(_weighted(t[:, None], k), axis=-2)
          + 1e-10 * jnp.sum(_weighted(t[:, None], jnp.abs(k)), axis=-2),
          jnp.sum(_weighted(t, jnp.log1p(-above)), axis=-1),
          jnp.sum(jnp.where(t > 0, t.astype(jnp.int64) * start, 0), axis=-1))


def _spectrum_sums(q, sigma, t, lam, grid, steps=None):
  """What the phases contribute to the tilted composition (a leading axis (remove, add) on
  each): the sums of :func:`_log_spectrum` of the tilted, folded PMFs' spectra, Σ t_i c_i
  with a bound on its rounding, and Σ t_i log(1 + ρ_i) with ρ_i the relative rounding of step
  i's masses (:func:`_pmf_rounding`): the exact composition of the exact PMFs is at most
  Π_i(1 + ρ_i)^{t_i} times that of the computed ones, point by point (convolution is monotone
  in non-negative inputs)."""
  start, pmf, _ = _step(q, sigma, grid) if steps is None else steps
  tilted, c = _tilt(pmf, start, grid.interval, lam[:, None])
  folded = _fold(tilted, grid.bins)
  # |f_k|'s error: the FFT's (Higham 2002, Thm. 24.2: ‖δf‖₂ ≤ log₂n·η/(1 − log₂n·η)·‖f‖₂ with
  # η ≈ 6u, ‖f‖₂ = √n‖p̃‖₂, a bound at every frequency; 16u per level here) and tilted masses
  # flushed below the smallest normal.
  levels = math.ceil(math.log2(grid.bins))
  norm = jnp.sqrt(jnp.sum(lax.stop_gradient(folded) ** 2, axis=-1))
  eta = 16 * _U * levels * math.sqrt(grid.bins) * norm + grid.pmf_bins * _SMALLEST_NORMAL
  sums = _log_spectrum(jnp.fft.rfft(folded), t, eta)
  rho = _pmf_rounding(q, sigma, start, c, lam[:, None], grid)
  return sums + (jnp.sum(_weighted(t, c), axis=-1), jnp.sum(_weighted(t, jnp.abs(c)), axis=-1),
                 jnp.sum(_weighted(t, jnp.log1p(rho)), axis=-1))


def _phase_chunk(grid: PldGrid) -> int:
  """Phases processed together: as many as keep the work arrays within MAX_ELEMENTS."""
  return max(1, MAX_ELEMENTS // (2 * max(grid.bins, grid.pmf_bins)))


def _over_phases(sums, q, sigma, t, grid, *extra, steps=None):
  """``sums(q, σ, t, *extra, grid)`` summed over the phases: at once (with the phases'
  :func:`_step` ``steps`` where given), or for schedules with more phases than
  :func:`_phase_chunk`, chunk by chunk in a ``lax.scan`` (bounded memory; padding phases have
  t = 0 and add nothing; boolean parts are or-ed)."""
  chunk = _phase_chunk(grid)
  if q.shape[0] <= chunk:
    return sums(q, sigma, t, *extra, grid, steps)
  pad = -q.shape[0] % chunk
  padded = [jnp.pad(v, (0, pad), constant_values=c).reshape(-1, chunk)
            for v, c in ((q, 0.0), (sigma, 1.0), (t, 0.0))]
  def add(total, phases):
    part = sums(*phases, *extra, grid)
    return jax.tree.map(lambda a, b: a | b if a.dtype == bool else a + b, total, part), None
  first_part = sums(*(v[0] for v in padded), *extra, grid)
  total, _ = loops.scan(add, first_part, tuple(v[1:] for v in padded))
  return total


def _spectrum_error(log_modulus, log_upper, rounding, composed):
  """A bound on the absolute error of every point of the tilted composed PMF.

  At frequency k the computed Π_i f_i^{t_i} differs from the exact product by at most
  Π_i(|f_i| + η_i)^{t_i} − Π_i|f_i|^{t_i} (the inputs' errors: |Π a_i − Π b_i| ≤
  Π(|b_i| + |a_i − b_i|) − Π|b_i|) plus |Π_i f_i^{t_i}|·(e^{2r} − 1) with r = u·Σ t_i(|log|f_i|| + 8)
  (the rounding of the logarithms, arguments and their t-fold multiples), and a point of the
  inverse FFT is 1/n times a sum over all n frequencies (the half spectrum counted twice).
  The inverse FFT's own rounding adds at most log₂n·16u·‖p‖₂ at any point (Higham, Thm. 24.2)."""
  n = composed.shape[-1]
  exact = jnp.exp(log_modulus)
  per_frequency = (jnp.exp(log_upper) - exact + exact * jnp.expm1(2 * _U * rounding)
                   + 8 * _U * jnp.exp(log_upper))
  spectral = 2.0 / n * jnp.sum(per_frequency, axis=-1)
  inverse = 16 * _U * math.ceil(math.log2(n)) * jnp.sqrt(jnp.sum(composed**2, axis=-1))
  return (spectral + inverse) * (1.0 + 1e-6) + _MASS_FLOOR


def _tilt_order(k_total, lam, delta=None, epsilon=None):
  """The tilt λ for reading δ(ε) (the Chernoff order of P(L ≥ ε): argmin K(λ) − λε) or ε(δ)
  (that of the quantile at δ: argmin (K(λ) − log δ)/λ); any λ gives the same PLD, this one
  puts the tilted composition's mass where δ is read."""
  if epsilon is None:
    objective = (k_total - jnp.log(delta)) / lam
  else:
    objective = k_total - lam * epsilon
  best = jnp.argmin(jnp.where(jnp.isnan(objective), jnp.inf, objective), axis=-1)
  return lax.stop_gradient(lam[best])


def _composed(q, sigma, t, grid, *, delta=None, epsilon=None):
  """Both directions' composed PLDs on their windows, certified against rounding.

  Returns (first, log_mass, p_inf) with a leading axis (remove, add): the window's first
  point's index (its points are (first + k)Δ, k < bins), the logarithm of an upper bound on the
  mass at each point, and the infinite-loss mass (the steps' own, and the Chernoff bound on the
  composed mass above the window). The composition is that of the PMFs tilted at the Chernoff
  order of the tail being read (``delta`` for ε(δ), ``epsilon`` for δ(ε); :func:`_tilt`); every
  point of the tilted composition is raised by the bound of :func:`_spectrum_error` on the
  FFT's rounding, then by the factor Π_i(1 + ρ_i)^{t_i} for the PMFs' own, as the tilt is undone (in logarithms: e^{Σ t_i c_i − λ l} may overflow where nothing is read), so
  the window's masses are never below the exact composition's. Mass the circle wraps onto the
  window only adds to it (at a larger loss from below, at a smaller one from above the
  window, whose mass is also counted in p_∞)."""
  interval, bins = grid.interval, grid.bins
  lam = jnp.asarray(_lambdas(interval), q.dtype)
  # One pass for the window and the tilt, one for the tilted spectra: the step PMFs computed
  # once where all phases fit in one chunk.
  steps = _step(q, sigma, grid) if q.shape[0] <= _phase_chunk(grid) else None
  k_total, log_finite, offset = _over_phases(_moment_sums, q, sigma, t, grid, steps=steps)
  tilt = _tilt_order(k_total, lam, delta, epsilon)                        # (2,)
  (log_modulus, angle, vanishes, log_upper, rounding, c_total, c_magnitude,
   log_relative) = _over_phases(_spectrum_sums, q, sigma, t, grid, tilt, steps=steps)
  modulus = jnp.where(vanishes, 0.0, jnp.exp(log_modulus))
  spectrum = lax.complex(modulus * jnp.cos(angle), modulus * jnp.sin(angle))
  tilted = jnp.fft.irfft(spectrum, n=bins)                                # (2, bins)
  log_modulus = jnp.where(vanishes, -jnp.inf, lax.stop_gradient(log_modulus))
  floor = lax.stop_gradient(_spectrum_error(log_modulus, log_upper, rounding, tilted))
  upper = jnp.maximum(tilted, 0.0) + floor[:, None]
  # The window's top: the Chernoff quantile of the composed loss at tail_mass.
  quantile = jnp.min((k_total - math.log(grid.tail_mass)) / lam, axis=-1)
  # (No finite mass at all: K = −∞ and any window will do; clipped so the index stays valid.)
  quantile = jnp.clip(jnp.where(jnp.isnan(quantile), 0.0, quantile), -1e6, 1e6)
  top = jnp.ceil(quantile / interval).astype(jnp.int64)
  first = top - bins + 1
  window = jax.vmap(jnp.roll)(upper, -jnp.mod(first - offset, bins))
  # The tilt undone at each point: e^{Σ t_i c_i − λ l_k}, the exponent raised by its rounding.
  losses = (first[:, None] + jnp.arange(bins)) * interval
  exponent = c_total[:, None] - tilt[:, None] * losses
  exponent = exponent + 4 * _U * (c_magnitude[:, None] + jnp.abs(tilt[:, None] * losses)
                                  + jnp.abs(exponent)) * (q.shape[0] + 2)
  exponent = exponent + log_relative[:, None] * (1.0 + 1e-6)
  log_tail = jnp.min(k_total - lam * (top[:, None] + 1) * interval, axis=-1)  # above the window
  # p_∞ raised by the rounding of the phases' sum of t_i log(1 − p_∞,i) and of each p_∞,i.
  p_inf = (-jnp.expm1(log_finite) + jnp.exp(log_tail)) * (1.0 + 4 * _U * (q.shape[0] + 16))
  return first, jnp.log(window) + exponent, p_inf


def _delta_of(first, log_mass, p_inf, eps, interval):
  """δ(ε) = p_∞ + Σ_k p_k (1 − e^{ε − l_k})₊ on each direction's window (leading axis), from the
  masses' logarithms (no overflow however far the tilt was undone), raised by the rounding of
  a sum of n non-negative terms (relative (n − 1)u) and of its logarithm and exponential."""
  n = log_mass.shape[-1]
  losses = (first[:, None] + jnp.arange(n)) * interval
  above = losses > eps
  gap = jnp.where(above, eps - losses, -1.0)
  terms = jnp.where(above, log_mass + jnp.log(-jnp.expm1(gap)), -jnp.inf)
  return p_inf + jnp.exp(jax.nn.logsumexp(terms, axis=-1) + (2 * n + 16) * _U)


def _suffix(log_terms):
  """log Σ_{j > k} e^{x_j} along the last axis (−inf past the end)."""
  tail = lax.cumlogsumexp(log_terms, axis=log_terms.ndim - 1, reverse=True)
  pad = [(0, 0)] * (log_terms.ndim - 1) + [(0, 1)]
  return jnp.pad(tail[..., 1:], pad, constant_values=-jnp.inf)


def _delta_at(p_inf, log_s0, log_s1, losses):
  """δ(l_k) = p_∞ + S₀ − e^{l_k}·S₁ with S₀ = Σ_{j>k} p_j and S₁ = Σ_{j>k} p_j e^{−l_j} given by
  their logarithms, as p_∞ + S₀·(1 − e^{l_k + log S₁ − log S₀}) (no cancellation; each term of
  S₁ e^{l_k} is below its term of S₀, so the exponent is ≤ 0 up to rounding, clipped there)."""
  held = log_s0 > -jnp.inf
  ratio = jnp.minimum(jnp.where(held, losses + log_s1 - log_s0, 0.0), 0.0)
  return p_inf + jnp.where(held, jnp.exp(log_s0) * -jnp.expm1(ratio), 0.0)


def _epsilon_of(first, log_mass, p_inf, delta, interval):
  """The smallest ε ≥ 0 with δ(ε) ≤ δ on each direction's window (leading axis; +inf where
  p_∞ ≥ δ), from the masses' logarithms, in closed form on the grid interval that holds it;
  differentiable in the masses and δ (the implicit derivative).

  δ at a grid point is δ(l_k) = p_∞ + S₀(k+1) − e^{l_k}·S₁(k+1), with suffix sums
  S₀(j) = Σ_{i≥j} p_i and S₁(j) = Σ_{i≥j} p_i e^{−l_i}, kept as logarithms (log-sum-exp: no
  overflow or underflow however wide the window or far the tilt was undone) and found in two
  levels: at the ends of blocks of :data:`_READ_BLOCK` points, then inside the block where δ
  crosses the target. S₀ is rounded up and S₁ down by the rounding of a sum of n terms, which
  only raises δ(l_k), so the point found is never below the true one. ε is kept in
  [l_{k−1}, l_k], the interval the closed form ε = log((p_∞ + S₀(k) − δ)/S₁(k)) is exact on, so
  no rounding can move it below l_{k−1}."""
  d, n = log_mass.shape
  nb = n // _READ_BLOCK
  index = jnp.arange(n)
  losses = (first[:, None] + index) * interval                        # (d, n)
  margin = (2 * n + 16) * _U
  log_mass_0 = lax.stop_gradient(log_mass)
  p_inf_0 = lax.stop_gradient(p_inf)
  pair = jnp.stack([log_mass_0 + margin, log_mass_0 - losses - margin])   # (S₀|S₁, d, n)
  blocks = pair.reshape(2, d, nb, _READ_BLOCK)
  after = _suffix(jax.nn.logsumexp(blocks, axis=-1))                # (2, d, nb)
  # δ at each block's last point; the first block whose last point meets δ holds the crossing.
  last = losses[:, _READ_BLOCK - 1::_READ_BLOCK]
  block = jnp.argmax(_delta_at(p_inf_0[:, None], after[0], after[1], last) <= delta, axis=-1)
  inside = jnp.take_along_axis(blocks, block[None, :, None, None], axis=2)[:, :, 0]  # (2, d, B)
  beyond = jnp.take_along_axis(after, block[None, :, None], axis=2)                  # (2, d, 1)
  suffix = jnp.logaddexp(_suffix(inside), beyond)                   # S(k + 1) inside the block
  k_all = block[:, None] * _READ_BLOCK + jnp.arange(_READ_BLOCK)
  met = _delta_at(p_inf_0[:, None], suffix[0], suffix[1],
                  jnp.take_along_axis(losses, k_all, axis=1)) <= delta
  k = block * _READ_BLOCK + jnp.argmax(met, axis=-1)
  found = jnp.any(met, axis=-1)
  # The bins k, k + 1, ... are those above ε ∈ (l_{k−1}, l_k]: ε in closed form there.
  mask = index >= k[:, None]
  log_s0 = jax.nn.logsumexp(jnp.where(mask, log_mass, -jnp.inf), axis=-1) + margin
  log_s1 = jax.nn.logsumexp(jnp.where(mask, log_mass - losses, -jnp.inf), axis=-1) - margin
  numerator = p_inf + jnp.exp(log_s0) - delta
  ok = found & (numerator > 0) & (log_s1 > -jnp.inf)
  at_k = (first + k) * interval
  eps = jnp.log(jnp.where(ok, numerator, 1.0)) - jnp.where(ok, log_s1, 0.0)
  # Not in closed form: δ ≤ p_∞ (ε = +inf), or δ met at the first point (ε at or below it:
  # that point, a bound).
  below = jnp.where(k > 0, at_k - interval, -jnp.inf)   # l_{k−1}: δ(l_{k−1}) > δ was found
  eps = jnp.where(ok, jnp.clip(eps, below, at_k), jnp.where(found, at_k, jnp.inf))
  return jnp.maximum(eps, 0.0)


def _light(arguments):
  """Eager calls compile with the CPU options of :mod:`jaxrdp._internal.compilation` (about
  1 s less to compile, ~1.5x the run time on a 10⁵-point grid): a single query's wait is
  mostly compilation. Inside a user's ``jax.jit`` the default options apply."""
  return 0


def _larger(per_direction, q):
  """The larger of the (remove, add) values, and its derivative. At q = 1 (every phase) the two
  directions are the same Gaussian pair, equal but for rounding; the remove direction's is
  taken. Below 1 the add direction's loss moves with q as e^l (its ε falls steeply), so the
  remove direction is the larger there and its derivative is the one-sided derivative in q at
  q = 1 (``jnp.max`` would average the two, an argmax follow the rounding)."""
  return jnp.where(jnp.all(q == 1), per_direction[0], per_direction[jnp.argmax(per_direction)])


@compilation.jit(static_argnames=("grid",), work=_light)
def pld_epsilon_unchecked(q, sigma, t, delta, grid):
  """ε(δ) of the schedule (phase arrays q, σ, t of float64), the larger of the directions'."""
  first, log_mass, p_inf = _composed(q, sigma, t, grid, delta=delta)
  return _larger(_epsilon_of(first, log_mass, p_inf, delta, grid.interval), q)


@compilation.jit(static_argnames=("grid",), work=_light)
def pld_delta_unchecked(q, sigma, t, epsilon, grid):
  """δ(ε) of the schedule, the larger of the directions'."""
  first, log_mass, p_inf = _composed(q, sigma, t, grid, epsilon=epsilon)
  return jnp.minimum(_larger(_delta_of(first, log_mass, p_inf, epsilon, grid.interval), q), 1.0)


# ---------------------------------------------------------------------------------------------
# Grid sizes, on the host, from concrete parameters.


def _fast_size(n: int, multiple: int = 1) -> int:
  """The smallest multiple of ``multiple`` (a power of two) that is ≥ n and whose quotient is
  2^a·3^b·5^c·7^d with b ≤ 2 and d ≤ 1: fast FFT lengths (higher powers of 3 run about
  twice as slow on XLA's CPU FFT: 15.7 ms for 2^11·3^5 against 7.0 ms for the 3 % longer
  2^12·5^3), at most a few percent above n."""
  m = max(1, -(-int(n) // multiple))
  while True:
    r, counts = m, {}
    for p in (2, 3, 5, 7):
      while r % p == 0:
        r //= p
        counts[p] = counts.get(p, 0) + 1
    if r == 1 and counts.get(3, 0) <= 2 and counts.get(7, 0) <= 1:
      return m * multiple
    m += 1


def _host_window(q, sigma, t, tail_mass):
  """Chernoff quantiles (lower at :data:`_LOWER_TAIL_MASS`, upper at ``tail_mass``) of one
  schedule's composed loss (phase arrays), both directions, from a quadrature of each step's
  loss on 1025 points, all phases at once (a size estimate only: the bound used for δ is
  computed in the graph from the discretised PMFs)."""
  lam = np.concatenate([-_LAMBDAS[::-1], _LAMBDAS])
  q, sigma, t = (v[:, None] for v in (q, sigma, t))
  x = -_Z * sigma + (1 + 2 * _Z * sigma) * np.linspace(0.0, 1.0, 1025)      # (P, n)
  log_weight = np.log((x[:, 1:2] - x[:, :1]) / (sigma * math.sqrt(2 * math.pi)))
  log_phi0 = -0.5 * (x / sigma) ** 2 + log_weight
  log_phi1 = -0.5 * ((x - 1) / sigma) ** 2 + log_weight
  with np.errstate(divide="ignore"):
    log_mix = np.logaddexp(np.log1p(-q) + log_phi0, np.log(q) + log_phi1)
  loss = _log_ratio(x, q, sigma, np)
  lows, highs = [], []
  for log_p, l in ((log_mix, loss), (log_phi0, -loss)):     # remove, add
    e = log_p[:, None, :] + lam[None, :, None] * l[:, None, :]    # (P, λ, n)
    top = e.max(axis=-1, keepdims=True)
    k = (top + np.log(np.exp(e - top).sum(axis=-1, keepdims=True)))[..., 0]
    k_total = np.sum(t * k, axis=0)
    highs.append(np.min(((k_total - math.log(tail_mass)) / lam)[lam > 0]))
    lows.append(np.max(((k_total - math.log(_LOWER_TAIL_MASS)) / lam)[lam < 0]))
  return min(lows), max(highs)


def _step_range(q, sigma):
  """The widest loss range, over phases and directions, of a step's PMF."""
  lo_remove = _log_ratio(-_Z * sigma, q, sigma, np)
  hi_remove = _log_ratio(1 + _Z * sigma, q, sigma, np)
  lo_add = -_log_ratio(1 + _Z * sigma, q, sigma, np)
  hi_add = -_log_ratio(-_Z * sigma, q, sigma, np)
  return float(np.max(np.maximum(hi_remove - lo_remove, hi_add - lo_add), initial=0.0))


def grid_for(q, sigma, t, interval=DEFAULT_INTERVAL, tail_mass=DEFAULT_TAIL_MASS) -> PldGrid:
  """The grid for concrete schedules (NumPy arrays broadcasting to (..., phases); leading
  axes are separate schedules, and the grid fits each), or a ValueError naming the size it
  would need when that exceeds :data:`MAX_BINS`. Phases with q = 0, T = 0 (no loss) or σ = 0
  (infinite loss: ε = ∞ on any grid) take no room."""
  q, sigma, t = (np.atleast_1d(np.asarray(v, np.float64)) for v in (q, sigma, t))
  shape = np.broadcast_shapes(q.shape, sigma.shape, t.shape)
  q, sigma, t = (np.broadcast_to(v, shape).reshape(-1, shape[-1]) for v in (q, sigma, t))
  pmf_bins, bins = 2, 1
  for row in zip(q, sigma, t):
    used = (row[0] > 0) & (row[1] > 0) & (row[2] > 0)
    if not np.any(used):
      continue
    qi, si, ti = (v[used] for v in row)
    pmf_bins = max(pmf_bins, int(math.ceil(_step_range(qi, si) / interval)) + 2)
    low, high = _host_window(qi, si, ti, tail_mass)
    # A margin of 5 % and 64 points: the graph's window top (from the discretised PMFs) may
    # sit slightly above the estimate's.
    bins = max(bins, int(math.ceil((high - low) / interval * 1.05)) + 64)
  bins = _fast_size(bins, _READ_BLOCK)
  for name, n in (("pmf_bins", pmf_bins), ("bins", bins)):
    if n > MAX_BINS:
      raise ValueError(
          f"the PLD of this schedule needs {n:,} grid points ({name}) at interval {interval:g}, "
          f"more than the {MAX_BINS:,} allowed; use a larger interval (about "
          f"{interval * n / MAX_BINS:.2g}) or accountant='rdp'.")
  return PldGrid(float(interval), _fast_size(pmf_bins, _BLOCK), bins, float(tail_mass))


# ---------------------------------------------------------------------------------------------
# The public functions: checks, sizes from concrete values, float64.


def _host_values(x):
  """``x``'s values on the host where they are known: a concrete array, or the values under a
  ``jax.grad`` / ``jax.vmap`` tracer (its primal or batched values, when those are concrete:
  eager differentiation and vectorisation). None inside ``jax.jit``. The tracer classes'
  attributes are not public; if they change this returns None and a grid must be passed."""
  for _ in range(16):
    if not isinstance(x, jax.core.Tracer):
      try:
        return np.asarray(x, np.float64)
      except (TypeError, ValueError):
        return None    # e.g. the jaxpr variable behind a jax.jit tracer
    x = getattr(x, "primal", getattr(x, "val", None))
  return None


def pld_grid(sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
             steps: jax.typing.ArrayLike, *, interval: float = DEFAULT_INTERVAL,
             tail_mass: float = DEFAULT_TAIL_MASS) -> PldGrid:
  r"""The grid sizes of a PLD computation, from concrete parameters.

  Pass the result as ``pld_grid=`` to :func:`pld_epsilon` (or ``dpsgd_epsilon(...,
  accountant="pld")``) inside ``jax.jit``, where the parameters are traced and the sizes (array
  shapes) cannot be read from them. A grid fits every schedule whose steps' loss ranges and
  composed loss are no wider than those of the schedules it was made for: for a family of
  schedules, make it for the widest (smallest σ, largest q and T) or pass the whole family
  (arrays of any shape; the last axis is the phases, leading axes are schedules).
  A schedule wider than its grid still gets a valid, looser ε (more mass counted as infinite
  loss), never a smaller one.

  Args:
    sampling_rate, noise_multiplier, steps: a schedule (scalars or 1-D phase arrays), or
      schedules (arrays whose last axis is the phases), broadcasting against each other.
    interval: Δ, the spacing of the loss grid, in (0, 1] (dp_accounting's
      ``value_discretization_interval``; default 1e-4, its PLDAccountant's).
    tail_mass: the composed mass above the window aimed at, in (0, 1) (its bound is added to
      δ, so keep it well below the δ the grid will be read at: at most δ/1000 for a tight ε;
      grids sized by ``pld_epsilon`` itself take min(1e-15, δ/1000)).

  Returns:
    A :class:`PldGrid` (hashable, static under ``jax.jit``).

  Raises:
    ValueError: an argument outside its range, or a schedule whose PLD would need more than
      :data:`MAX_BINS` points at this interval (the message names the interval that fits).
  """
  validation.check_all(sampling_rate=sampling_rate, noise_multiplier=noise_multiplier,
                       steps=steps)
  validation.check("pld_interval", interval, name="interval")
  validation.check("tail_mass", tail_mass)
  values = [_host_values(v) for v in (sampling_rate, noise_multiplier, steps)]
  if any(v is None for v in values):
    raise TypeError("pld_grid needs concrete parameters (it sets array shapes); call it "
                    "outside jax.jit.")
  return grid_for(*values, interval=float(interval), tail_mass=float(tail_mass))


def checked_phases(sampling_rate, noise_multiplier, steps, what):
  """Checked float64 phase arrays (q, σ, T), T whole numbers (eagerly)."""
  q, sigma, t = composition.schedule_phases(sampling_rate, noise_multiplier, steps)
  if q.dtype != np.float64:
    raise TypeError(
        f"{what} computes in float64 only, got {np.dtype(q.dtype).name} arguments: float32 cannot "
        "resolve the PLD's bin masses (see jaxrdp.accounting.pld). Enable 64-bit JAX "
        "(jax.config.update('jax_enable_x64', True)) or use accountant='rdp'.")
  if validation.is_concrete(t) and np.any(np.asarray(t) != np.floor(np.asarray(t))):
    raise ValueError(f"steps must be whole numbers for the PLD accountant; got "
                     f"{np.asarray(t)[np.asarray(t) != np.floor(np.asarray(t))].ravel()[0]!r}.")
  return q, sigma, t


def grid_of(q, sigma, t, given, delta=None):
  """The grid passed, or one sized from the parameters' values where they are known; a
  ValueError where one phase's work arrays would exceed :data:`MAX_ELEMENTS`. A sized grid
  for reading ε at a known δ leaves at most δ/1000 above its window (the default tail mass,
  1e-15, would otherwise add a δ-sized term where δ is that small)."""
  if given is not None:
    return _fits(q.shape[-1], _checked_grid(given))
  values = [_host_values(v) for v in (q, sigma, t)]
  if any(v is None for v in values):
    raise ValueError(
        "the PLD accountant's array sizes depend on the parameters' values, which are traced "
        "here (inside jax.jit): pass pld_grid=jaxrdp.pld_grid(sampling_rate, noise_multiplier, "
        "steps) computed outside, for the widest schedule the function will see.")
  tail_mass = DEFAULT_TAIL_MASS
  known = None if delta is None else _host_values(delta)
  if known is not None and np.size(known) and np.all(known > 0):
    tail_mass = min(tail_mass, 1e-3 * float(np.min(known)))
  return _fits(q.shape[-1], grid_for(*values, tail_mass=tail_mass))


def _checked_grid(grid) -> PldGrid:
  """A PldGrid whose fields are usable: made by :func:`pld_grid`, or by hand with the same
  constraints (a TypeError or ValueError naming the field otherwise)."""
  if not isinstance(grid, PldGrid):
    raise TypeError(f"pld_grid must be a PldGrid (from jaxrdp.pld_grid), got {grid!r}.")
  validation.check("pld_interval", grid.interval, name="pld_grid.interval")
  validation.check("tail_mass", grid.tail_mass, name="pld_grid.tail_mass")
  for name, multiple in (("pmf_bins", _BLOCK), ("bins", _READ_BLOCK)):
    value = getattr(grid, name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
      raise TypeError(f"pld_grid.{name} must be an int, got {value!r}.")
    if value < multiple or value % multiple:
      raise ValueError(f"pld_grid.{name} must be a positive multiple of {multiple}, got {value}; "
                       "make grids with jaxrdp.pld_grid.")
  return grid


def _fits(phases: int, grid: PldGrid) -> PldGrid:
  """The grid, or a ValueError if even one phase's work arrays exceed MAX_ELEMENTS (more
  phases are processed in chunks that fit, see :func:`_composed`)."""
  del phases
  elements = 2 * max(grid.bins, grid.pmf_bins)
  if elements > MAX_ELEMENTS:
    raise ValueError(
        f"the PLD would need work arrays of {elements:,} elements (2 directions x "
        f"{max(grid.bins, grid.pmf_bins):,} points), more than the {MAX_ELEMENTS:,} allowed: "
        "use a larger interval (jaxrdp.pld_grid(..., interval=...)) or accountant='rdp'.")
  return grid


def _valid(q, sigma, t, other, other_domain):
  """The jit-side mask: every argument in its domain and T whole (NaN otherwise)."""
  return (jnp.all(validation.in_domain("sampling_rate", q))
          & jnp.all(validation.in_domain("noise_multiplier", sigma))
          & jnp.all(validation.in_domain("steps", t)) & jnp.all(t == jnp.floor(t))
          & validation.in_domain(other_domain, other))


def pld_epsilon(sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
                steps: jax.typing.ArrayLike, delta: jax.typing.ArrayLike, *,
                pld_grid: PldGrid | None = None) -> jax.Array:
  r"""ε(δ) of DP-SGD with Poisson sampling by its privacy-loss distribution (tight accounting).

  The larger ε of the add and the remove direction, each from the pessimistic
  (connect-the-dots) discretisation of its PLD, composed over the schedule by FFT (see the
  module docstring): never below the true ε of the mechanism, within the discretisation's
  allowance above it (at the default Δ = 1e-4, within 0.01 % of dp_accounting's
  ``PLDAccountant`` on the tested box).

  Args:
    sampling_rate: q in [0, 1], a scalar or a 1-D schedule (one entry per phase).
    noise_multiplier: σ ≥ 0, scalar or 1-D.
    steps: steps per phase, whole numbers ≥ 0, scalar or 1-D.
    delta: δ in (0, 1).
    pld_grid: the static sizes (:func:`pld_grid`); default: sized from the parameters, which
      must then be concrete (eager calls, and eager ``jax.grad`` / ``jax.vmap``). Required
      inside ``jax.jit``.

  Returns:
    ε, a float64 scalar (+inf when δ is below the mass of infinite loss). Jittable,
    vmappable, differentiable in q, σ (every phase's) and δ: the bin masses are smooth in
    (q, σ) on the fixed grid, and ε is in closed form on the grid interval that holds it
    (the implicit derivative of δ(ε) = δ). NaN under jit for invalid arguments.

  Raises:
    ValueError: an argument outside its range, non-integer steps, a schedule too wide for
      :data:`MAX_BINS`, or traced parameters without ``pld_grid``.
    TypeError: float32 arguments (float64 only: enable ``jax_enable_x64``).

  References:
    Koskela, Jälkö, Honkela, AISTATS 2020 (FFT accountant); Doroshenko, Ghazi, Kamath, Kumar,
    Manurangsi, PETS 2022 (connect the dots); Zhu, Dong, Wang, AISTATS 2022, Thm. 11
    (the dominating pairs of the Poisson-subsampled Gaussian).
  """
  return _evaluate(pld_epsilon_unchecked, sampling_rate, noise_multiplier, steps, "delta",
                   delta, pld_grid)


def pld_delta(sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
              steps: jax.typing.ArrayLike, epsilon: jax.typing.ArrayLike, *,
              pld_grid: PldGrid | None = None) -> jax.Array:
  r"""δ(ε) of DP-SGD with Poisson sampling by its privacy-loss distribution: the larger of the
  two directions' hockey-stick divergences δ(ε) = p_∞ + Σ_k p_k (1 − e^{ε − l_k})₊, never
  below the true δ (the same PLD as :func:`pld_epsilon`).

  Args:
    sampling_rate: q in [0, 1], a scalar or a 1-D schedule (one entry per phase).
    noise_multiplier: σ ≥ 0, scalar or 1-D.
    steps: steps per phase, whole numbers ≥ 0, scalar or 1-D.
    epsilon: ε ≥ 0.
    pld_grid: the static sizes (:func:`pld_grid`); required inside ``jax.jit``.

  Returns:
    δ in [0, 1], a float64 scalar. Jittable, vmappable, differentiable in q, σ and ε. NaN
    under jit for invalid arguments.

  Raises:
    ValueError: as :func:`pld_epsilon`. TypeError: float32 arguments.
  """
  return _evaluate(pld_delta_unchecked, sampling_rate, noise_multiplier, steps, "epsilon",
                   epsilon, pld_grid)


def _evaluate(kernel, sampling_rate, noise_multiplier, steps, name, value, given_grid):
  """``kernel(q, σ, T, value, grid)`` after the public checks (``name``: "delta" or
  "epsilon"), NaN under jit where an argument is invalid."""
  validation.check_all(sampling_rate=sampling_rate, noise_multiplier=noise_multiplier,
                       steps=steps)
  validation.check(name, value)   # "delta" or "epsilon", entries of the domain table
  validation.check_scalar(**{name: value})
  q, sigma, t = checked_phases(sampling_rate, noise_multiplier, steps, "the PLD accountant")
  grid = grid_of(q, sigma, t, given_grid, value if name == "delta" else None)
  value = validation.to_device(value, np.float64)
  result = kernel(q, sigma, t, value, grid)
  return jnp.where(_valid(q, sigma, t, value, name), result, jnp.nan)
