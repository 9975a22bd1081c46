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

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

DEFAULT_INTERVAL = 1e-4      # Δ, dp_accounting's PLDAccountant default
DEFAULT_TAIL_MASS = 1e-15    # the composed tail mass the window may leave out (added to δ)
MAX_BINS = 1 << 24           # largest FFT circle / step PMF (≈ 0.5 GiB of float64 work arrays)
_Z = 10.0                    # a step's loss range covers x ∈ [−Zσ, 1 + Zσ] (mass outside ≈ 1e-23)
_LAMBDAS = 2.0 ** np.arange(-5, 16)   # Chernoff orders λ of the window's tail bound
_BLOCK = 64                  # points per block of the moment-generating function's upper bound
_SQRT_HALF = math.sqrt(0.5)


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
# Composition by FFT, and the window it is read on.


def _log_mgf(pmf, start, interval):
  """K(λ) = log Σ_k p_k e^{λ l_k} at the Chernoff orders λ > 0, in logs (λ·l overflows and
  underflows both ways): per block of :data:`_BLOCK` points, Σ_j p_j e^{−λ(l_top − l_j)} is a
  matrix product with factors ≤ 1, and the blocks are combined by log-sum-exp. It places the
  window and bounds the mass above it, both discrete or negligible: no derivative flows.
  Leading axes of ``pmf`` and ``start`` are batch axes; the λ axis is appended."""
  pmf = lax.stop_gradient(pmf)
  lam = jnp.asarray(_LAMBDAS, pmf.dtype)
  below_top = (_BLOCK - 1 - jnp.arange(_BLOCK)) * interval
  blocks = pmf.reshape(pmf.shape[:-1] + (-1, _BLOCK))
  sums = blocks @ jnp.exp(-below_top[:, None] * lam)               # (..., blocks, λ)
  block_top = (start[..., None] + _BLOCK * jnp.arange(1, blocks.shape[-2] + 1) - 1) * interval
  positive = sums > 0
  log_sums = jnp.where(positive, jnp.log(jnp.where(positive, sums, 1.0)), -jnp.inf)
  return jax.nn.logsumexp(log_sums + lam * block_top[..., None], axis=-2)


def _power(f, t):
  """f**t for complex f and integer-valued t ≥ 0, as exp(t·log f) (for integer t the branch of
  the logarithm does not matter); 0 where f is 0, with a finite derivative."""
  nonzero = jnp.abs(f) > 0
  log_f = jnp.log(jnp.where(nonzero, f, 1.0))
  return jnp.where(nonzero | (t == 0), jnp.exp(t * log_f), 0.0)


def _fold(pmf, bins):
  """The PMF's points folded onto a circle of ``bins`` points (point k at k mod bins)."""
  k = pmf.shape[-1]
  if k <= bins:
    return jnp.pad(pmf, [(0, 0)] * (pmf.ndim - 1) + [(0, bins - k)])
  laps = -(-k // bins)
  padded = jnp.pad(pmf, [(0, 0)] * (pmf.ndim - 1) + [(0, laps * bins - k)])
  return padded.reshape(pmf.shape[:-1] + (laps, bins)).sum(axis=-2)


def _composed(q, sigma, t, grid):
  """Both directions' composed PLDs on their windows.

  Returns (first, window, p_inf) with a leading axis (remove, add): the window's first point's
  index (its points are (first + k)Δ, k < bins), the masses there, and the infinite-loss mass
  (the steps' own, and the Chernoff bound on the composed mass above the window)."""
  interval, bins = grid.interval, grid.bins
  start, pmf, above = step_pmfs(q, sigma, interval, grid.pmf_bins)
  steps = t.astype(jnp.int64)
  # Every step's PMF is folded from index 0; the composition is then offset by Σ_i T_i start_i.
  spectrum = jnp.prod(_power(jnp.fft.rfft(_fold(pmf, bins)), t[:, None]), axis=-2)
  composed = jnp.maximum(jnp.fft.irfft(spectrum, n=bins), 0.0)           # (2, bins)
  offset = jnp.sum(steps * start, axis=-1)
  # The window's top: the Chernoff quantile of the composed loss at tail_mass.
  k_total = jnp.sum(t[:, None] * _log_mgf(pmf, start, interval), axis=-2)   # (2, λ)
  lam = jnp.asarray(_LAMBDAS, k_total.dtype)
  quantile = jnp.min((k_total - math.log(grid.tail_mass)) / lam, axis=-1)
  # (No finite mass at all: K = −∞ and any window will do; clipped so the index stays valid.)
  quantile = jnp.clip(jnp.where(jnp.isnan(quantile), 0.0, quantile), -1e6, 1e6)
  top = jnp.ceil(quantile / interval).astype(jnp.int64)
  first = top - bins + 1
  window = jax.vmap(jnp.roll)(composed, -jnp.mod(first - offset, bins))
  log_tail = jnp.min(k_total - lam * (top[:, None] + 1) * interval, axis=-1)  # above the window
  log_finite = jnp.sum(t * jnp.log1p(-above), axis=-1)       # no step's loss infinite
  return first, window, -jnp.expm1(log_finite) + jnp.exp(log_tail)


def _delta_of(first, window, p_inf, eps, interval):
  """δ(ε) = p_∞ + Σ_k p_k (1 − e^{ε − l_k})₊ on each direction's window (leading axis)."""
  losses = (first[:, None] + jnp.arange(window.shape[-1])) * interval
  gap = jnp.where(losses > eps, eps - losses, 0.0)
  return p_inf + jnp.sum(window * -jnp.expm1(gap), axis=-1)


def _epsilon_of(first, window, p_inf, delta, interval):
  """The smallest ε ≥ 0 with δ(ε) ≤ δ on each direction's window (leading axis; +inf where
  p_∞ ≥ δ), in closed form on the grid interval that holds it; differentiable in the masses
  and δ (the implicit derivative)."""
  n = window.shape[-1]
  index = jnp.arange(n)
  losses = (first[:, None] + index) * interval
  # δ at every grid point: δ(l_k) = p_∞ + S₀(k+1) − e^{l_k − l_top}·S₁(k+1), with
  # S₀(j) = Σ_{i≥j} p_i and S₁(j) = Σ_{i≥j} p_i e^{l_top − l_i}. The exponent is capped at 700
  # (bins more than 700 below the top): a smaller S₁ only raises δ there, so the grid point
  # found is never below the true one, and the ε below never smaller.
  below_top = (n - 1 - index) * interval
  weight = jnp.exp(jnp.minimum(below_top, 700.0))
  w = lax.stop_gradient(window)
  sums = lax.cumsum(jnp.stack([w, w * weight]), axis=2, reverse=True)      # (S₀|S₁, dir, n)
  after = jnp.pad(sums[..., 1:], [(0, 0), (0, 0), (0, 1)])
  delta_at = lax.stop_gradient(p_inf)[:, None] + after[0] - after[1] / weight
  # The first grid point with δ(l_k) ≤ δ: ε lies in (l_{k−1}, l_k], and the bins k, k+1, ...
  # are those above it.
  k = jnp.argmax(delta_at <= delta, axis=-1)
  found = jnp.take_along_axis(delta_at, k[:, None], axis=-1)[:, 0] <= delta
  mask = index >= k[:, None]
  s0 = jnp.sum(jnp.where(mask, window, 0.0), axis=-1)
  s1 = jnp.sum(jnp.where(mask, window * weight, 0.0), axis=-1)
  numerator = p_inf + s0 - delta
  ok = found & (numerator > 0) & (s1 > 0) & (delta > p_inf)
  eps = (jnp.log(jnp.where(ok, numerator, 1.0)) - jnp.log(jnp.where(ok, s1, 1.0))
         + (first + n - 1) * interval)
  at_k = jnp.take_along_axis(losses, k[:, None], axis=-1)[:, 0]
  # Not in closed form: δ ≤ p_∞ (ε = +inf), or δ met at every point (ε at or below the
  # window's first point: that point, a bound).
  eps = jnp.where(ok, jnp.minimum(eps, at_k), jnp.where(delta > p_inf, at_k, jnp.inf))
  return jnp.maximum(eps, 0.0)


@functools.partial(jax.jit, static_argnames=("grid",))
def pld_epsilon_unchecked(q, sigma, t, delta, grid):
  """ε(δ) of the schedule (phase arrays q, σ, t of float64), the larger of the directions'."""
  first, window, p_inf = _composed(q, sigma, t, grid)
  return jnp.max(_epsilon_of(first, window, p_inf, delta, grid.interval))


@functools.partial(jax.jit, static_argnames=("grid",))
def pld_delta_unchecked(q, sigma, t, epsilon, grid):
  """δ(ε) of the schedule, the larger of the directions'."""
  first, window, p_inf = _composed(q, sigma, t, grid)
  return jnp.minimum(jnp.max(_delta_of(first, window, p_inf, epsilon, grid.interval)), 1.0)


# ---------------------------------------------------------------------------------------------
# Grid sizes, on the host, from concrete parameters.


def _fast_size(n: int) -> int:
  """The next size ≥ n of the form 2^k or 3·2^k (fast FFTs, few distinct compiled shapes)."""
  power = 1 << max(0, int(n) - 1).bit_length()
  return power * 3 // 4 if power * 3 // 4 >= n and power >= 4 else power


def _host_window(q, sigma, t, tail_mass):
  """Chernoff quantiles (lower, upper) at ``tail_mass`` of the composed loss, both
  directions, from a quadrature of each step's loss (a size estimate only: the bound used for
  δ is computed in the graph from the discretised PMFs)."""
  lam = np.concatenate([-_LAMBDAS[::-1], _LAMBDAS])
  lows, highs = [], []
  u = np.linspace(0.0, 1.0, 4097)
  for add in (False, True):
    k_total = np.zeros_like(lam)
    for qi, si, ti in zip(q, sigma, t):
      x = -_Z * si + (1 + 2 * _Z * si) * u
      dx = x[1] - x[0]
      log_phi0 = -0.5 * (x / si) ** 2
      log_phi1 = -0.5 * ((x - 1) / si) ** 2
      with np.errstate(divide="ignore"):
        log_mix = np.logaddexp(np.log1p(-qi) + log_phi0, np.log(qi) + log_phi1)
      loss = _log_ratio(x, qi, si, np)
      log_p, loss = (log_phi0, -loss) if add else (log_mix, loss)
      log_p = log_p + math.log(dx / (si * math.sqrt(2 * math.pi)))
      k = np.logaddexp.reduce(log_p[None, :] + lam[:, None] * loss[None, :], axis=1)
      k_total += ti * k
    bound = (k_total - math.log(tail_mass)) / lam
    highs.append(np.min(bound[lam > 0]))
    lows.append(np.max(bound[lam < 0]))
  return min(lows), max(highs)


def _step_range(q, sigma):
  """The widest loss range, over phases and directions, of a step's PMF."""
  lo_remove = _log_ratio(-_Z * sigma, q, sigma, np)
  hi_remove = _log_ratio(1 + _Z * sigma, q, sigma, np)
  lo_add = -_log_ratio(1 + _Z * sigma, q, sigma, np)
  hi_add = -_log_ratio(-_Z * sigma, q, sigma, np)
  return float(np.max(np.maximum(hi_remove - lo_remove, hi_add - lo_add)))


def grid_for(q, sigma, t, interval=DEFAULT_INTERVAL, tail_mass=DEFAULT_TAIL_MASS) -> PldGrid:
  """The grid for concrete phase arrays (NumPy), or a ValueError naming the size it would
  need when that exceeds :data:`MAX_BINS`."""
  q, sigma, t = (np.atleast_1d(np.asarray(v, np.float64)).reshape(-1) for v in (q, sigma, t))
  q, sigma, t = np.broadcast_arrays(q, sigma, t)
  pmf_bins = int(math.ceil(_step_range(q, sigma) / interval)) + 2
  low, high = _host_window(q, sigma, t, tail_mass)
  # A margin of 5 % and 64 points: the graph's window top (from the discretised PMFs) may sit
  # slightly above the estimate's.
  bins = _fast_size(int(math.ceil((high - low) / interval * 1.05)) + 64)
  for name, n in (("pmf_bins", pmf_bins), ("bins", bins)):
    if n > MAX_BINS:
      raise ValueError(
          f"the PLD of this schedule needs {n:,} grid points ({name}) at interval {interval:g}, "
          f"more than the {MAX_BINS:,} allowed; use a larger interval (about "
          f"{interval * n / MAX_BINS:.2g}) or accountant='rdp'.")
  return PldGrid(float(interval), _fast_size(max(pmf_bins, 128)), bins, float(tail_mass))
