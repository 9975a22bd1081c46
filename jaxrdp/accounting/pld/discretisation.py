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
    pmf_bins, bins: as in :class:`PldGrid`.
  """
  interval: Any
  log_tail_mass: Any
  decay: Any
  rise: Any
  factors: Any
  pmf_bins: int
  bins: int


@jax.jit
def _factors(interval):
  below_top = (_BLOCK - 1 - np.arange(_BLOCK)) * interval
  return jnp.exp(-below_top[:, None] * jnp.asarray(_LAMBDAS))


@functools.lru_cache(maxsize=64)
def _interval_values(interval: float, tail_mass: float) -> tuple:
  with jax.ensure_compile_time_eval():   # evaluated now, also when called inside a trace
    # (one compiled program, not one per operation)
    factors = np.array(_factors(np.float64(interval)), np.float64)
  factors.flags.writeable = False
  scalars = (interval, math.log(tail_mass), math.exp(-interval), -math.expm1(-interval))
  return tuple(np.float64(v) for v in scalars) + (factors,)


def lattice(grid: PldGrid) -> tuple[tuple, tuple[int, int]]:
  """(values, sizes) of ``grid``: the float64 values of :class:`Lattice`, computed here, on the
  host (``math``, and ``jax.numpy`` on concrete values for the factors), and its static sizes;
  ``Lattice(*values, *sizes)`` in the graph."""
  return _interval_values(float(grid.interval), float(grid.tail_mass)), (grid.pmf_bins, grid.bins)


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


def step_pmfs(q, sigma, grid):
  """One step's pessimistic discretised PLD, for each phase and both directions.

  Args:
    q, sigma: the phases' sampling rates and noise multipliers (1-D, float64).
    grid: the :class:`Lattice` (Δ, e^{−Δ}, 1 − e^{−Δ}; ``pmf_bins`` points, static).

  Returns:
    (start, pmf, above): for direction (remove, add) × phase, the first point's index (the
    points are l_k = (start + k)Δ), the mass at each point (connect the dots; losses below the
    first point rounded up to it) and the mass above the last point (infinite loss). Shapes
    (2, P), (2, P, pmf_bins), (2, P).
  """
  interval, pmf_bins = grid.interval, grid.pmf_bins
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
  left = (q_mass * jnp.exp(losses[..., :-1]) - p_mass * grid.decay) / grid.rise
  left = jnp.clip(left, 0.0, p_mass)
  pad = [(0, 0), (0, 0)]
  pmf = jnp.pad(left, pad + [(0, 1)]) + jnp.pad(p_mass - left, pad + [(1, 0)])
  return start, pmf.at[..., 0].add(below), above
