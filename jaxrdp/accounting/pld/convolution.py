r"""Composition by FFT of exponentially tilted PMFs, the window it is read on, and the bounds on
its rounding.

The T-fold convolution of each step's discretised PLD (:func:`discretisation.step_pmfs`) on a
circle of ``bins`` points, tilted at the Chernoff order of the tail being read so that the FFT's
rounding is relative to δ; every point is raised by a certified bound on that rounding
(:func:`_composed`; Koskela, Jälkö, Honkela 2020; Higham 2002, Thm. 24.2). See the package
docstring of :mod:`jaxrdp.accounting.pld`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import loops
from jaxrdp._internal import numerics
from jaxrdp.accounting.pld.discretisation import (MAX_ELEMENTS, Lattice, _BLOCK, _LAMBDAS,
                                                  _MASS_FLOOR, _SMALLEST_NORMAL, _U,
                                                  _WRAP_NATS, _Z, mixture_step_pmfs, step_pmfs)


def _usable(lam, interval):
  """Which Chernoff orders λ > 0 are usable at this Δ (which may be traced: one program serves
  every interval): those with λ·Δ·(_BLOCK − 1) ≤ 700, so that every factor e^{−λ(l_top − l_j)}
  inside a block of :func:`_log_mgf` is a normal float64 (no term underflows to 0 while a
  larger one of its block is kept). The others get K(λ) = +∞ (:func:`_log_mgf`): no
  information, never chosen by a minimum over λ."""
  return lam * interval * (_BLOCK - 1) <= 700.0


def _weighted(t, x):
  """t·x, exactly 0 where t = 0 (a phase without steps adds nothing, whatever x is)."""
  return jnp.where(t > 0, t * jnp.where(t > 0, x, 0.0), 0.0)


def _log_mgf(pmf, start, grid):
  """An upper bound on K(λ) = log Σ_k p_k e^{λ l_k} at the Chernoff orders :data:`_LAMBDAS`, in
  logs (λ·l overflows and underflows both ways): per block of :data:`_BLOCK` points,
  Σ_j p_j e^{−λ(l_top − l_j)} is a matrix product with factors in [e^{−700}, 1], and the blocks
  are combined by log-sum-exp. It bounds the mass above the window, so it must not round low:
  each block sum is raised by the rounding of a 64-term dot product of non-negative terms
  and of its factors (NumPy's exponentials, within 2 u each: 256 u relative in all) and by
  64 flushed subnormal products (64 × 2⁻¹⁰²² absolute) where the block holds any mass, and the
  exponent by the rounding of λ·l_top; the log-sum-exp of the blocks by their count times u
  (a sum of m non-negative terms, in any order, is within (m − 1)u of it: Higham 2002, §4.2;
  the logarithm's own rounding, u·|K|, is the caller's 1e-10·|K|), counting the blocks of
  ``grid.points`` (blocks of zero padding hold no mass: their terms are exactly 0).
  No derivative flows (it places the window, bounds a negligible tail and picks the tilt).
  Leading axes of ``pmf`` and ``start`` are batch axes; the λ axis is appended."""
  pmf = lax.stop_gradient(pmf)
  interval = grid.interval
  lam = jnp.asarray(_LAMBDAS, pmf.dtype)
  blocks = pmf.reshape(pmf.shape[:-1] + (-1, _BLOCK))
  sums = blocks @ grid.factors                                     # (..., blocks, λ)
  held = jnp.max(blocks, axis=-1, keepdims=True) > 0
  sums = jnp.where(held, sums * (1.0 + 256 * _U) + _BLOCK * _SMALLEST_NORMAL, 0.0)
  block_top = (start[..., None] + _BLOCK * jnp.arange(1, blocks.shape[-2] + 1) - 1) * interval
  exponent = lam * block_top[..., None]
  log_sums = jnp.where(held, jnp.log(jnp.where(held, sums, 1.0)), -jnp.inf)
  k = (jax.nn.logsumexp(log_sums + exponent + 4 * _U * jnp.abs(exponent), axis=-2)
       + (grid.points / _BLOCK + 16) * _U + 1e-12)   # the blocks that can hold mass
  return jnp.where(_usable(lam, interval), k, jnp.inf)


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
  exponent = jnp.where(positive, numerics.log(jnp.where(positive, pmf, 1.0)), -jnp.inf) + (
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
  log(|f_i| + η_i), with η_i a bound on |f_i|'s error at every frequency, taken as Σ t_i
  (max(log|f_i|, log η_i) + min(|f_i|, η_i)/max(|f_i|, η_i)) ≥ it (log(1 + x) ≤ x: no second
  logarithm per frequency), and Σ t_i (|log|f_i|| + |upper_i| + 12), which scales the rounding of the
  logarithms, arguments and their multiples by t (2e-11 rad at t = 5·10⁴, as any exp(t·log f)
  carries; the arguments are :func:`numerics.atan2`'s, within 4.5e-16, and their sines and
  cosines :func:`numerics.sincos`', within 2.1e-16 and reduced with an error of at most
  u·|t·arg|, all within the 12 u per unit of t)."""
  t = t[:, None]
  square = f.real**2 + f.imag**2
  nonzero = square > 0
  log_modulus = jnp.where(nonzero, 0.5 * numerics.log(jnp.where(nonzero, square, 1.0)), 0.0)
  angle = numerics.atan2(jnp.where(nonzero, f.imag, 0.0), jnp.where(nonzero, f.real, 1.0))
  modulus = lax.stop_gradient(jnp.sqrt(square))
  eta = eta[..., None]
  larger, smaller = jnp.maximum(modulus, eta), jnp.minimum(modulus, eta)
  log_larger = jnp.maximum(jnp.where(nonzero, lax.stop_gradient(log_modulus), -jnp.inf),
                           jnp.log(eta))
  upper = log_larger + smaller / larger
  rounding = jnp.abs(lax.stop_gradient(log_modulus)) + jnp.abs(lax.stop_gradient(upper)) + 12.0
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


def _pmf_rounding(mech, start, c, lam, grid):
  """A bound on the relative rounding error of every point of one step's tilted PMF. Each mass
  is a difference of two Gaussian tail functions at thresholds z = x/σ whose rounding is
  about u·(|z| + σ·(|l| + |log q|)), over intervals Δz ≥ Δ·σ wide (the loss has slope ≤ 1/σ²
  in x); the connect-the-dots split divides by 1 − e^{−Δ}; the tilt e^{log p + λl − c} adds
  u·(|log p| + λ|l| + |c|). With a safety factor of 32 over these first-order estimates.

  With truncation (``mech`` = (q, σ, 1 − w, w, q_c)), the replace-one term's thresholds
  (x ± 1)/s, s = σ/2, with x = s²(u/2 + asinh(A sinh(u/2))) and log A = 1/(2s²) +
  log((1 − q_c)/q_c), round by about u·s·(|l| + |log A|) + u·(2 + Zs)/s: the larger of the
  two terms' spreads is charged, and the mixing adds a few u."""
  q, sigma = mech[:2]
  sigma_safe = jnp.where(sigma > 0, sigma, 1.0)
  q_safe = jnp.where(q > 0, q, 1.0)
  reach = (jnp.abs(start) + grid.points) * grid.interval
  spread = jnp.where(q > 0, (_Z / sigma_safe + reach + jnp.abs(jnp.log(q_safe)) + 2.0)
                     / grid.interval, 0.0)
  if len(mech) == 4:   # a mixture: thresholds (x − c_i)/σ, x from Newton (64 ulps of its terms)
    c, p = mech[2], mech[3]
    c_max = jnp.max(c, axis=-1)
    held = p > 0
    log_p_min = jnp.min(jnp.where(held, jnp.log(jnp.where(held, p, 1.0)), 0.0), axis=-1)
    terms = reach + jnp.abs(log_p_min) + c_max * (c_max + _Z * sigma_safe) / sigma_safe**2
    spread = ((_Z + c_max) / sigma_safe + 3.0 * terms + 2.0) / grid.interval
  if len(mech) == 5:
    qc = mech[4]
    s = sigma_safe / 2
    inner = (qc > 0) & (qc < 1)
    qc_safe = jnp.where(inner, qc, 0.5)
    log_a = 0.5 / s**2 + jnp.abs(jnp.log(qc_safe)) + jnp.abs(jnp.log1p(-qc_safe))
    replace = (s * (reach + log_a) + (2.0 + _Z * s) / s + 2.0) / grid.interval
    spread = jnp.maximum(spread, jnp.where(qc > 0, replace, 0.0)) + 4.0
  tilt = 745.0 + lam * reach + jnp.abs(c)
  return jnp.minimum(32 * _U * (1.0 + spread + tilt), 1.0)


def _step(mech, grid):
  """:func:`step_pmfs` of the phases' mechanism ``mech`` ((q, σ), or (q, σ, 1 − w, w, q_c) for
  truncated Poisson sampling) on the grid, computed once where it is used twice (a barrier
  keeps XLA from recomputing its error functions inside each consumer's fusion)."""
  if len(mech) == 4:   # (0, σ, c, p): a mixture of Gaussians
    return lax.optimization_barrier(mixture_step_pmfs(*mech[1:], grid))
  return lax.optimization_barrier(step_pmfs(mech[0], mech[1], grid, mech[2:] or None))


def _moment_sums(mech, t, grid, steps=None):
  """What the phases contribute to the window, summed over them (a leading axis (remove, add)
  on each): Σ t_i K_i(λ) (an upper bound), Σ t_i log(1 − p_∞,i) and the offset Σ t_i start_i
  of the composed grid. ``steps``: the phases' :func:`_step`, where already computed."""
  start, pmf, above = _step(mech, grid) if steps is None else steps
  k = _log_mgf(pmf, start, grid)
  return (jnp.sum(_weighted(t[:, None], k), axis=-2)
          + 1e-10 * jnp.sum(_weighted(t[:, None], jnp.abs(k)), axis=-2),
          jnp.sum(_weighted(t, jnp.log1p(-above)), axis=-1),
          jnp.sum(jnp.where(t > 0, t.astype(jnp.int64) * start, 0), axis=-1))


def _spectrum_sums(mech, t, lam, grid, steps=None):
  """What the phases contribute to the tilted composition (a leading axis (remove, add) on
  each): the sums of :func:`_log_spectrum` of the tilted, folded PMFs' spectra, Σ t_i c_i
  with a bound on its rounding, and Σ t_i log(1 + ρ_i) with ρ_i the relative rounding of step
  i's masses (:func:`_pmf_rounding`): the exact composition of the exact PMFs is at most
  Π_i(1 + ρ_i)^{t_i} times that of the computed ones, point by point (convolution is monotone
  in non-negative inputs)."""
  start, pmf, _ = _step(mech, grid) if steps is None else steps
  tilted, c = _tilt(pmf, start, grid.interval, lam[:, None])
  folded = _fold(tilted, grid.bins)
  # |f_k|'s error: the FFT's (Higham 2002, Thm. 24.2: ‖δf‖₂ ≤ log₂n·η/(1 − log₂n·η)·‖f‖₂ with
  # η ≈ 6u, ‖f‖₂ = √n‖p̃‖₂, a bound at every frequency; 16u per level here) and tilted masses
  # flushed below the smallest normal.
  levels = math.ceil(math.log2(grid.bins))
  norm = jnp.sqrt(jnp.sum(lax.stop_gradient(folded) ** 2, axis=-1))
  eta = 16 * _U * levels * math.sqrt(grid.bins) * norm + grid.points * _SMALLEST_NORMAL
  sums = _log_spectrum(jnp.fft.rfft(folded), t, eta)
  rho = _pmf_rounding(mech, start, c, lam[:, None], grid)
  return sums + (jnp.sum(_weighted(t, c), axis=-1), jnp.sum(_weighted(t, jnp.abs(c)), axis=-1),
                 jnp.sum(_weighted(t, jnp.log1p(rho)), axis=-1))


def _phase_chunk(grid: Lattice) -> int:
  """Phases whose step PMFs are computed once and kept for all passes: as many as keep them
  within MAX_ELEMENTS, 2 × ``pmf_bins`` each (longer schedules recompute them in each pass)."""
  return max(1, MAX_ELEMENTS // (2 * grid.pmf_bins))


def _sub_chunk(grid: Lattice) -> int:
  """Phases processed together in a pass over the phases: as many as keep one work array
  within _SUB_ELEMENTS (a pass holds ~15 of them per phase, its derivative ~50)."""
  return max(1, _SUB_ELEMENTS // (2 * max(grid.bins, grid.pmf_bins)))


_SUB_ELEMENTS = 1 << 22   # directions × phases × points of a work array in one sub-chunk

# Padding phases (t = 0: they add nothing; finite values): (q, σ, 1 − w, w, q_c) of Poisson and
# truncated Poisson phases, (0, σ, c, p) of mixtures of Gaussians.
_PADDING = {2: (0.0, 1.0), 5: (0.0, 1.0, 1.0, 0.0, 0.0), 4: (0.0, 1.0, 1.0, 1.0)}


def _split(mech, t, size):
  """The phases' mechanism and step counts in sub-chunks of ``size`` phases (a leading axis),
  padded with phases of no steps."""
  pad = -t.shape[0] % size
  return tuple(jnp.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1),
                       constant_values=c).reshape((-1, size) + v.shape[1:])
               for v, c in zip(mech + (t,), _PADDING[len(mech)] + (0.0,)))


def _split_steps(split, grid):
  """:func:`_step` of each sub-chunk of ``split`` (:func:`_split`), on the same leading axis:
  one sub-chunk at a time, each recomputed rather than kept for the derivative (its work arrays
  are several times the PMFs it returns)."""
  step = jax.checkpoint(lambda phases: _step(phases[:-1], grid))
  return loops.scan(lambda _, phases: (None, step(phases)), None, split)[1]


def _over_phases(sums, mech, t, grid, *extra, steps=None):
  """``sums(mech, t, *extra, grid, steps)`` summed over the phases: at once where they fit in
  one sub-chunk (:func:`_sub_chunk`; ``steps`` their :func:`_step`, or None), else sub-chunk
  by sub-chunk in a ``lax.scan``, each under ``jax.checkpoint`` (memory bounded by a
  sub-chunk's work arrays, value and derivative alike; ``mech`` and ``t`` then come from
  :func:`_split`, ``steps`` from :func:`_split_steps` or None: computed in each sub-chunk).
  Padding phases have t = 0 and add nothing; boolean parts are or-ed."""
  if t.ndim == 1:
    return sums(mech, t, *extra, grid, steps)
  part = jax.checkpoint(lambda phases, steps: sums(phases[:-1], phases[-1], *extra, grid, steps))
  def add(total, chunk):
    new = part(*chunk)
    return jax.tree.map(lambda a, b: a | b if a.dtype == bool else a + b, total, new), None
  chunks = (mech + (t,), steps)
  shapes = jax.eval_shape(part, *jax.tree.map(lambda v: v[0], chunks))
  zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)   # one copy of the body
  return loops.scan(add, zero, chunks)[0]


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


_TILT_RTOL = 1e-6   # the relative move of ε that the rounding at a lowered tilt may cost alone


def _tilt_order(k_total, lam, width, t_total, grid, delta=None, epsilon=None):
  """The tilts the composition is computed at, shape (2, directions), and whether the second
  differs from the first anywhere (else it need not be composed).

  The Chernoff order λ* for reading δ(ε) (that of P(L ≥ ε): argmin K(λ) − λε) or ε(δ) (that
  of the quantile at δ: argmin (K(λ) − log δ)/λ) puts the tilted composition's mass where δ is
  read, so the FFT's rounding is small next to it; but where the window is too narrow for it,
  mass wraps around the circle (below), and a lower order λ_w keeps that mass small. Any λ
  gives the same PLD and a sound bound, and each has cases where it is the tighter (λ* alone:
  up to 3.5 % above dp_accounting on short schedules; λ_w alone: 3.3e-4 on 30,000 steps at
  δ = 1e-8). So: λ* where λ_w = λ*; λ_w alone where the rounding it costs is negligible (by
  the estimate below, ε moves by at most _TILT_RTOL relative); else both, and
  :func:`_composed` keeps the smaller mass of the two at each point.

  The circle wraps the mass above the window onto its bottom, W = ``width`` lower, where
  undoing the tilt weighs it e^{λW} too much. That mass lands above the ε read where its loss
  exceeds ε + W, so it adds at most e^{λW} P(L > ε + W) ≤ e^{λW + K(ν) − ν(ε + W)} (any ν > λ)
  to δ(ε): sound (it only adds), but loose where it reaches δ, as with a large tilt on a
  window sized for the untilted tails (short schedules, heavy upper tails). λ_w is the
  largest order up to λ* whose bound is at most e^{−_WRAP_NATS} δ (ε estimated as the Chernoff
  quantile less 4/λ*, δ(ε) as its Chernoff bound), the smallest order where none is (tilting
  then hardly matters: the untilted wrapped mass is the tail's, below tail_mass). The bound is
  loose where the orders above λ* see the far tail poorly (long schedules), hence λ* beside it.

  The rounding at a tilt λ: the tilted composition's points carry an error of about
  u·(16·log₂n + 4·(T + 64)) (:func:`_spectrum_error`, measured: within 8x above), and undoing
  the tilt scales the points above ε by e^{K(λ) − λl}, so δ(ε) moves by about that error times
  e^{K(λ) − λε}/(λΔ), and ε by about that over λ*·δ (the slope of δ(ε) near ε) — a heuristic
  (8x above on the cases measured), deciding tightness only."""
  if epsilon is None:
    objective = (k_total - jnp.log(delta)) / lam
  else:
    objective = k_total - lam * epsilon
  objective = jnp.where(jnp.isnan(objective), jnp.inf, objective)
  best = jnp.argmin(objective, axis=-1)
  lam_star = lam[best]
  if epsilon is None:
    reach = jnp.min(objective, axis=-1) - 4.0 / lam_star        # ε, from below
    log_delta = jnp.log(delta) * jnp.ones_like(reach)
  else:
    reach = jnp.broadcast_to(epsilon, lam_star.shape)
    log_delta = jnp.min(objective, axis=-1)                      # δ(ε), from above
  tail = k_total - lam * (reach[:, None] + width)   # log of P(L > ε + W)'s bound at ν = λ
  tail = jnp.where(jnp.isnan(tail), jnp.inf, tail)
  above = jnp.concatenate([lax.cummin(tail, axis=tail.ndim - 1, reverse=True)[:, 1:],
                           jnp.full(tail.shape[:-1] + (1,), jnp.inf, tail.dtype)], axis=-1)
  ok = ((lam * width + above <= log_delta[:, None] - _WRAP_NATS)
        & (jnp.arange(lam.shape[0]) <= best[:, None]))
  index = jnp.where(jnp.any(ok, axis=-1),
                    jnp.max(jnp.where(ok, jnp.arange(lam.shape[0]), -1), axis=-1), 0)
  lam_w = lam[index]
  error = math.log(_U * 16 * math.ceil(math.log2(grid.bins))) + jnp.log1p(
      4 * (t_total + 64) / (16 * math.ceil(math.log2(grid.bins))))
  moved = (error + jnp.take_along_axis(k_total, index[:, None], axis=-1)[:, 0]
           - lam_w * reach - jnp.log(lam_w * grid.interval))
  # ε moves by about (δ's move / δ) / (λ* ε): λ_w alone where that is at most _TILT_RTOL.
  allowed = log_delta + jnp.log(jnp.maximum(lam_star * reach, 1.0)) + math.log(_TILT_RTOL)
  cheap = jnp.where(jnp.isnan(moved), False, moved <= allowed)
  same = lam_w == lam_star
  first = jnp.where(same | cheap, lam_w, lam_star)
  return lax.stop_gradient(jnp.stack([first, lam_w])), jnp.any(~(same | cheap))


def _composed(mech, t, grid, *, delta=None, epsilon=None, steps=None):
  """Both directions' composed PLDs on their windows, certified against rounding.

  Returns (first, log_mass, p_inf) with a leading axis (remove, add): the window's first
  point's index (its points are (first + k)Δ, k < bins), the logarithm of an upper bound on the
  mass at each point, and the infinite-loss mass (the steps' own, and the Chernoff bound on the
  composed mass above the window). The composition is that of the PMFs tilted at the Chernoff
  order of the tail being read (``delta`` for ε(δ), ``epsilon`` for δ(ε); :func:`_tilt`), and
  where the window is too narrow for that order, also at a lower one (:func:`_tilt_order`; the
  smaller of the two bounds kept at each point); every
  point of the tilted composition is raised by the bound of :func:`_spectrum_error` on the
  FFT's rounding, then by the factor Π_i(1 + ρ_i)^{t_i} for the PMFs' own, as the tilt is undone (in logarithms: e^{Σ t_i c_i − λ l} may overflow where nothing is read), so
  the window's masses are never below the exact composition's. Mass the circle wraps onto the
  window only adds to it: from above the window at a smaller loss (that mass is also counted
  in p_∞), from below at a loss W higher, its weight scaled by e^{−λW} (the tilt undone at the
  wrong place), which δ(ε) does not owe as long as the window starts at or below ε: with
  ``epsilon`` the window is moved down to start there where it would not; ε(δ) read inside
  the window lies above its start, and is its start otherwise (a bound,
  :func:`jaxrdp.accounting.pld.readout._epsilon_of`). ``steps``: :func:`_step` of ``mech``,
  where already computed (the phases in one sub-chunk, :func:`_sub_chunk`: what this
  computes once, before its passes, else in each sub-chunk); its PMFs may be zero-padded to
  any length up to ``bins`` (a multiple of _BLOCK): ``grid.points`` counts the step's own
  points."""
  interval, bins = grid.interval, grid.bins
  lam = jnp.asarray(_LAMBDAS, t.dtype)
  phases = t.shape[0]
  # One pass for the window and the tilts, one for the tilted spectra at each tilt: the step
  # PMFs computed once (in sub-chunks) where they fit in MAX_ELEMENTS, else in each pass.
  if phases <= _sub_chunk(grid):
    steps = _step(mech, grid) if steps is None else steps
  else:   # sub-chunks of equal size, as few as fit: fewer than one padding phase per chunk
    chunks = -(-phases // _sub_chunk(grid))
    mech_and_t = _split(mech, t, -(-phases // chunks))
    steps = _split_steps(mech_and_t, grid) if phases <= _phase_chunk(grid) else None
    mech, t = mech_and_t[:-1], mech_and_t[-1]
  k_total, log_finite, offset = _over_phases(_moment_sums, mech, t, grid, steps=steps)
  tilts, both = _tilt_order(k_total, lam, bins * interval, jnp.sum(_weighted(t, 1.0)), grid,
                            delta, epsilon)                               # (2 tilts, 2)
  # The window's top: the Chernoff quantile of the composed loss at tail_mass.
  quantile = jnp.min((k_total - grid.log_tail_mass) / lam, axis=-1)
  # (No finite mass at all: K = −∞ and any window will do; clipped so the index stays valid.)
  quantile = jnp.clip(jnp.where(jnp.isnan(quantile), 0.0, quantile), -1e6, 1e6)
  top = jnp.ceil(quantile / interval).astype(jnp.int64)
  first = top - bins + 1
  if epsilon is not None:
    # δ(ε) counts the mass above ε: the window starts at or below ε (one point lower against
    # the rounding of ε/Δ), so that none of it is left below the window, where the circle
    # would wrap it onto the top at a fraction e^{−λW} of its weight. The top then comes down
    # with it, and the Chernoff bound on the mass above it (p_∞ below) follows.
    below = jnp.floor(jnp.clip(jnp.where(jnp.isnan(epsilon), 0.0, epsilon) / interval,
                               -1e6 / interval, 1e6 / interval)).astype(jnp.int64) - 1
    first = jnp.minimum(first, below)
    top = first + bins - 1
  # The circle's point first - offset (mod bins) becomes the window's first: a rotation by
  # s points, i.e. the phase 2πks/n at frequency k, added to the angles (no pass over the
  # points; ks mod n exact in integers, its phase within 2u of 2π, the +8 u below).
  shift = jnp.mod(first - offset, bins)
  frequencies = np.arange(bins // 2 + 1, dtype=np.int64)
  losses = (first[:, None] + jnp.arange(bins)) * interval

  def composed_at(tilt):
    """The log of the bound on each window point's mass, composed at ``tilt`` (2,)."""
    (log_modulus, angle, vanishes, log_upper, rounding, c_total, c_magnitude,
     log_relative) = _over_phases(_spectrum_sums, mech, t, grid, tilt, steps=steps)
    turn = jnp.mod(frequencies * shift[:, None], bins).astype(angle.dtype)
    modulus = jnp.where(vanishes, 0.0, jnp.exp(log_modulus))
    sin, cos = numerics.sincos(angle + turn * (2 * math.pi / bins))
    spectrum = lax.complex(modulus * cos, modulus * sin)
    tilted = jnp.fft.irfft(spectrum, n=bins)                              # (2, bins)
    log_modulus = jnp.where(vanishes, -jnp.inf, lax.stop_gradient(log_modulus))
    # The phase sums above are added in an order XLA chooses: each within (P + 1)u of the sum
    # of its terms' magnitudes whatever the order (Higham 2002, §4.2: γ_{P−1}, and the t-fold
    # multiples), which ``rounding`` bounds (|arg| ≤ π < 12); zeros of padding phases add
    # exactly. The upper bounds' sum is raised by it, and the product's allowance widened.
    order = (phases + 1) * rounding
    floor = lax.stop_gradient(_spectrum_error(log_modulus, log_upper + _U * order,
                                              rounding + order + 8.0, tilted))
    window = jnp.maximum(tilted, 0.0) + floor[:, None]
    # The tilt undone at each point: e^{Σ t_i c_i − λ l_k}, the exponent raised by its rounding.
    exponent = c_total[:, None] - tilt[:, None] * losses
    exponent = exponent + 4 * _U * (c_magnitude[:, None] + jnp.abs(tilt[:, None] * losses)
                                    + jnp.abs(exponent)) * (phases + 2)
    exponent = exponent + log_relative[:, None] * (1.0 + 1e-6)
    return numerics.log(window) + exponent

  # Each tilt's masses bound the exact composition's point by point, and so does the smaller
  # of the two; the second tilt is composed only where some direction needs it (one trace of
  # the composition either way: a loop of two, the second pass a lax.cond whose predicate,
  # under vmap, is any lane's; a lane that did not ask composes its first tilt again).
  # Differentiated, each pass is recomputed in the reverse pass (jax.checkpoint) rather than
  # stacking its ~180 intermediate arrays per pass through the loop: jax.grad of a 1,000-step
  # ε 100 -> 52 ms warm, its program 563 -> 299 kernels (compiled in 3.2 s instead of 4.0 s).
  # Phases in sub-chunks are each recomputed already (_over_phases): the pass keeps only the
  # window's arrays then, and is not recomputed as a whole (~1 s less to compile).
  pass_of = composed_at if t.ndim > 1 else jax.checkpoint(composed_at)

  def smaller(best, tilt_and_needed):
    tilt, needed = tilt_and_needed
    mass = lax.cond(loops.any_lane(needed), pass_of,
                    lambda _: jnp.full_like(best, jnp.inf), tilt)
    return jnp.minimum(best, mass), None
  needed = jnp.stack([jnp.bool_(True), both])
  log_mass, _ = loops.scan(smaller, jnp.full((2, bins), jnp.inf, losses.dtype),
                           (tilts, needed))
  log_tail = jnp.min(k_total - lam * (top[:, None] + 1) * interval, axis=-1)  # above the window
  # p_∞ raised by the rounding of the phases' sum of t_i log(1 − p_∞,i) and of each p_∞,i.
  p_inf = (-jnp.expm1(log_finite) + jnp.exp(log_tail)) * (1.0 + 4 * _U * (phases + 16))
  return first, log_mass, p_inf
