r"""Grid sizes on the host, from concrete parameters.

The sizes of a :class:`PldGrid` are static (they set array shapes): :func:`grid_for` chooses
them from concrete schedules (the loss range of one step, the composed loss's Chernoff
quantiles at ``tail_mass``); :func:`grid_of` checks a grid passed by the user or sizes one from
the parameters' values where they are known.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from jaxrdp._internal import validation
from jaxrdp.accounting.pld.truncation import host_weights
from jaxrdp.accounting.pld.discretisation import (DEFAULT_INTERVAL, DEFAULT_TAIL_MASS, MAX_BINS,
                                                  MAX_ELEMENTS, PldGrid, _BLOCK, _LAMBDAS,
                                                  _LOWER_TAIL_MASS, _READ_BLOCK, _WRAP_NATS, _Z,
                                                  _log_ratio, _mixture_loss, _mixture_range,
                                                  _replace_loss, _replace_range)


def _fast_size(n: int, multiple: int = 1) -> int:
  """The smallest multiple of ``multiple`` (a power of two) that is ≥ n and whose quotient is
  1, 2 or 3, or 2^a·4, 2^a·5 or 2^a·6: three sizes per octave, at most a third above n. The
  sizes are the programs' shapes, so schedules whose needs fall in one bracket share their
  compiled programs (an eager call at a new σ, δ or T mostly reuses one: a program of the
  composition takes ~1 s to compile, ten to a hundred times its run); the FFT runs at most a
  third longer (about a tenth on average). Each is a fast FFT length (2^a·3 or 2^a·5; higher
  powers of 3 run about twice as slow on XLA's CPU FFT)."""
  m = max(1, -(-int(n) // multiple))
  if m <= 3:
    return m * multiple
  octave = 1 << (m.bit_length() - 3)   # m ∈ [4·octave, 8·octave)
  return next(c * octave for c in (4, 5, 6, 8) if c * octave >= m) * multiple


def _quadrature(log_p, loss, lam):
  """log Σ_x e^{log p(x) + λ L(x)} over the last axis, at each λ (an axis before it)."""
  e = log_p[:, None, :] + lam[None, :, None] * loss[:, None, :]    # (P, λ, n)
  top = e.max(axis=-1, keepdims=True)
  return (top + np.log(np.exp(e - top).sum(axis=-1, keepdims=True)))[..., 0]


def _log_normal(x, mean, s):
  """log of the N(mean, s²) density times the spacing of the points x (a Riemann sum)."""
  return -0.5 * ((x - mean) / s) ** 2 + np.log((x[:, 1:2] - x[:, :1]) / (s * math.sqrt(2 * math.pi)))


def _host_log_mgf(q, sigma, t, truncation=None):
  """(λ, K) of one schedule (phase arrays): the composed loss's log-moment-generating function
  K(λ) = Σ_i T_i log E e^{λ L_i} at λ = ±:data:`_LAMBDAS`, both directions (a leading axis
  (remove, add)), from a quadrature of each step's loss on 1025 points, all phases at once (a
  size estimate only: the bounds used for δ are computed in the graph from the discretised
  PMFs). With ``truncation`` (1 − w, w, q_c per phase) the mixture with the replace-one pair
  (the same in both directions)."""
  lam = np.concatenate([-_LAMBDAS[::-1], _LAMBDAS])
  q, sigma, t = (v[:, None] for v in (q, sigma, t))
  x = -_Z * sigma + (1 + 2 * _Z * sigma) * np.linspace(0.0, 1.0, 1025)      # (P, n)
  log_phi0 = _log_normal(x, 0.0, sigma)
  with np.errstate(divide="ignore"):
    log_mix = np.logaddexp(np.log1p(-q) + log_phi0, np.log(q) + _log_normal(x, 1.0, sigma))
  loss = _log_ratio(x, q, sigma, np)
  ks = [_quadrature(log_mix, loss, lam), _quadrature(log_phi0, -loss, lam)]   # remove, add
  if truncation is not None:
    keep, w, qc = (v[:, None] for v in truncation)
    s = sigma / 2
    x = (1 + _Z * s) * np.linspace(-1.0, 1.0, 1025)
    with np.errstate(divide="ignore"):
      log_r = np.logaddexp(np.log1p(-qc) + _log_normal(x, 0.0, s),
                           np.log(qc) + _log_normal(x, 1.0, s))
      k_r = _quadrature(log_r, _replace_loss(x, qc, s, np), lam)
      ks = [np.logaddexp(np.log(keep) + k, np.log(w) + k_r) for k in ks]
  return lam, np.stack([np.sum(t * k, axis=0) for k in ks])


def _host_window(lam, k_total, tail_mass):
  """Chernoff quantiles of the composed loss from :func:`_host_log_mgf`: the lower at
  :data:`_LOWER_TAIL_MASS` and the upper at ``tail_mass``, the widest over the directions."""
  positive, negative = lam > 0, lam < 0
  high = np.min((k_total[:, positive] - math.log(tail_mass)) / lam[positive], axis=-1)
  low = np.max((k_total[:, negative] - math.log(_LOWER_TAIL_MASS)) / lam[negative], axis=-1)
  return float(np.min(low)), float(np.max(high))



def _tilted_width(lam, k_total, high, delta, interval):
  """The window width W (in loss units) that reading ε at each ``delta`` needs, the widest over
  the δs and directions (host estimates from :func:`_host_log_mgf`'s K).

  The composition is tilted at the Chernoff order λ* of the quantile Q at δ (as
  :func:`jaxrdp.accounting.pld.convolution._tilt_order` picks it, on the orders
  :func:`~jaxrdp.accounting.pld.convolution._usable` allows at this Δ; the smallest whose
  objective is within 0.1 % of the best, in case the graph's K breaks a near tie the other
  way). On a circle of circumference W, tilted mass a lap away from a point l ≥ ε read is
  undone at l: from a lap below it arrives scaled by e^{−λ*W}, from a lap above by e^{λ*W}.
  With L = log(1/δ) and c = _WRAP_NATS, both stay below e^{−c}·δ where

  * W ≥ (L + c)/λ* (below: the mass is at most 1), and the window reaches W below Q;
  * W ≥ min over ν > λ* of (K(ν) − ν·ε' + L + c)/(ν − λ*) (above: P(L > ε' + W) ≤
    e^{K(ν) − ν(ε' + W)}), with ε' = Q − 4/λ* standing for ε (ε ≤ Q, and within a few 1/λ*
    of it).

  At most the untilted width (the caller's); where that is narrower than this, the graph
  also composes at a tilt low enough for the bound to hold again and keeps the smaller of the
  two results (:func:`jaxrdp.accounting.pld.convolution._tilt_order`; the bound is loose, and
  λ* is often the tighter). A width only changes how tight ε is, never its
  soundness: where ε lies above the window's start, what wraps onto the window only adds
  mass, and ε(δ) is read as the start otherwise (a valid bound; see
  :func:`jaxrdp.accounting.pld.readout._epsilon_of`)."""
  usable = (lam > 0) & (lam * interval * (_BLOCK - 1) <= 700.0)
  lam_pos, k_pos = lam[usable], k_total[:, usable]                 # (λ,), (2, λ)
  log_inv = -np.log(np.asarray(delta, np.float64).reshape(-1, 1, 1))   # (δ, 1, 1)
  objective = (k_pos + log_inv) / lam_pos                            # (δ, 2, λ)
  best = np.min(objective, axis=-1, keepdims=True)                   # Q, per δ and direction
  near = objective <= best + 1e-3 * (np.abs(best) + 1.0)
  lam_star = np.min(np.where(near, lam_pos, np.inf), axis=-1, keepdims=True)
  below = high - best + (log_inv + _WRAP_NATS) / lam_star
  eps = best - 4.0 / lam_star
  with np.errstate(divide="ignore", invalid="ignore"):
    above = np.min(np.where(lam_pos > lam_star,
                            (k_pos - lam_pos * eps + log_inv + _WRAP_NATS) / (lam_pos - lam_star),
                            np.inf), axis=-1, keepdims=True)
  return float(np.max(np.maximum(below, above)))


def _step_range(q, sigma, truncation=None, tail_mass=DEFAULT_TAIL_MASS):
  """The widest loss range, over phases and directions, of a step's PMF (with
  ``truncation``, the union with the replace-one term's [−L_R, L_R] at ``tail_mass``)."""
  lo_remove = _log_ratio(-_Z * sigma, q, sigma, np)
  hi_remove = _log_ratio(1 + _Z * sigma, q, sigma, np)
  lo_add = -_log_ratio(1 + _Z * sigma, q, sigma, np)
  hi_add = -_log_ratio(-_Z * sigma, q, sigma, np)
  if truncation is not None:
    top = _replace_range(truncation[1], truncation[2], sigma / 2, math.log(tail_mass), np)
    lo_remove, lo_add = np.minimum(lo_remove, -top), np.minimum(lo_add, -top)
    hi_remove, hi_add = np.maximum(hi_remove, top), np.maximum(hi_add, top)
  return float(np.max(np.maximum(hi_remove - lo_remove, hi_add - lo_add), initial=0.0))


def grid_for(q, sigma, t, interval=DEFAULT_INTERVAL, tail_mass=DEFAULT_TAIL_MASS,
             delta=None, truncation=None) -> PldGrid:
  """The grid for concrete schedules (NumPy arrays broadcasting to (..., phases); leading
  axes are separate schedules, and the grid fits each), or a ValueError naming the size it
  would need when that exceeds :data:`MAX_BINS`. Phases with q = 0, T = 0 (no loss) or σ = 0
  (infinite loss: ε = ∞ on any grid) take no room.

  The window reaches from the composed loss's upper quantile at ``tail_mass`` down to its
  lower quantile at :data:`_LOWER_TAIL_MASS`; with ``delta`` (the δ or δs that ε will be read
  at) only as far down as reading ε there needs (:func:`_tilted_width`, at most the former):
  fewer points, the same ε to ~1e-7 relative; the tail mass is then at most δ/1000 (a
  default of 1e-15 would otherwise add a δ-sized term where δ is that small). ``truncation``:
  (N, B) of truncated Poisson sampling (an int N, B per phase), or None."""
  if delta is not None:
    delta = np.asarray(delta, np.float64)
    tail_mass = min(float(tail_mass), 1e-3 * float(np.min(delta)))
  q, sigma, t = (np.atleast_1d(np.asarray(v, np.float64)) for v in (q, sigma, t))
  shape = np.broadcast_shapes(q.shape, sigma.shape, t.shape)
  q, sigma, t = (np.broadcast_to(v, shape).reshape(-1, shape[-1]) for v in (q, sigma, t))
  if truncation is not None:
    n, b = truncation
    b = np.broadcast_to(np.asarray(b, np.int64), shape).reshape(-1, shape[-1])
  def schedules():
    for i, row in enumerate(zip(q, sigma, t)):
      used = (row[0] > 0) & (row[1] > 0) & (row[2] > 0)
      if np.any(used):
        qi, si, ti = (v[used] for v in row)
        weights = None if truncation is None else host_weights(n, b[i][used], qi)
        yield (_step_range(qi, si, weights, tail_mass), *_host_log_mgf(qi, si, ti, weights))
  return _sized(schedules(), interval, tail_mass, delta)


def _sized(schedules, interval, tail_mass, delta) -> PldGrid:
  """The grid of schedules given as (step range, λ, K) each (:func:`grid_for`)."""
  pmf_bins, bins = 2, 1
  for step_range, lam, k_total in schedules:
    pmf_bins = max(pmf_bins, int(math.ceil(step_range / interval)) + 2)
    low, high = _host_window(lam, k_total, tail_mass)
    width = high - low
    if delta is not None:
      tilted = _tilted_width(lam, k_total, high, delta, interval)
      if np.isfinite(tilted) and tilted > 0:   # else (a degenerate K): the untilted window
        width = min(width, tilted)
    # A margin of 5 % and 64 points: the graph's window top (from the discretised PMFs) may
    # sit slightly above the estimate's.
    bins = max(bins, int(math.ceil(width / interval * 1.05)) + 64)
  bins = _fast_size(bins, _READ_BLOCK)
  for name, n in (("pmf_bins", pmf_bins), ("bins", bins)):
    if n > MAX_BINS:
      raise ValueError(
          f"the PLD of this schedule needs {n:,} grid points ({name}) at interval {interval:g}, "
          f"more than the {MAX_BINS:,} allowed; use a larger interval (about "
          f"{interval * n / MAX_BINS:.2g}) or accountant='rdp'.")
  return PldGrid(float(interval), _fast_size(pmf_bins, _BLOCK), bins, float(tail_mass))


def mixture_grid_for(sigma, c, p, t, interval=DEFAULT_INTERVAL, tail_mass=DEFAULT_TAIL_MASS,
                     delta=None) -> PldGrid:
  """The grid for concrete mixture-of-Gaussians schedules: σ and T (P,), sensitivities ``c``
  and probabilities ``p`` (P, m) (as :func:`grid_for`, one schedule)."""
  if delta is not None:
    delta = np.asarray(delta, np.float64)
    tail_mass = min(float(tail_mass), 1e-3 * float(np.min(delta)))
  sigma, c, p, t = (np.asarray(v, np.float64) for v in (sigma, c, p, t))
  used = t > 0
  if not np.any(used):
    return _sized(iter(()), interval, tail_mass, delta)
  sigma, c, p, t = sigma[used], c[used], p[used], t[used]
  low, high = _mixture_range(sigma, c, p, np)
  step_range = float(np.max(high - low))
  # K of each direction by a quadrature of the loss over x ∈ [−Zσ, c_max + Zσ].
  lam = np.concatenate([-_LAMBDAS[::-1], _LAMBDAS])
  s = sigma[:, None]
  x = -_Z * s + (np.max(c, axis=-1)[:, None] + 2 * _Z * s) * np.linspace(0.0, 1.0, 1025)
  loss = _mixture_loss(x, s, c[:, None, :], p[:, None, :], np)
  log_phi0 = _log_normal(x, 0.0, s)
  with np.errstate(divide="ignore"):
    log_mix = np.logaddexp.reduce(np.log(p)[:, None, :] + _log_normal_many(x, c, s), axis=-1)
  ks = [_quadrature(log_mix, loss, lam), _quadrature(log_phi0, -loss, lam)]
  k_total = np.stack([np.sum(t[:, None] * k, axis=0) for k in ks])
  return _sized(iter([(step_range, lam, k_total)]), interval, tail_mass, delta)


def _log_normal_many(x, c, s):
  """:func:`_log_normal` of each component N(c_i, s²): a trailing axis."""
  return -0.5 * ((x[..., None] - c[:, None, :]) / s[..., None]) ** 2 + np.log(
      (x[:, 1:2] - x[:, :1]) / (s * math.sqrt(2 * math.pi)))[..., None]


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


def grid_of(q, sigma, t, given, delta=None, truncation=None):
  """The grid passed, or one sized from the parameters' values where they are known (for
  reading ε at ``delta`` where that is known: :func:`grid_for`); a ValueError where one
  phase's work arrays would exceed :data:`MAX_ELEMENTS`."""
  if given is not None:
    return _fits(q.shape[-1], _checked_grid(given))
  values = [_host_values(v) for v in (q, sigma, t)]
  if any(v is None for v in values):
    raise ValueError(
        "the PLD accountant's array sizes depend on the parameters' values, which are traced "
        "here (inside jax.jit): pass pld_grid=jaxrdp.pld_grid(sampling_rate, noise_multiplier, "
        "steps) computed outside, for the widest schedule the function will see.")
  known = None if delta is None else _host_values(delta)
  if known is None or not np.size(known) or not np.all((known > 0) & (known < 1)):
    known = None
  return _fits(q.shape[-1], grid_for(*values, delta=known, truncation=truncation))


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
