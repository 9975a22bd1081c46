r"""δ(ε) and ε(δ) read off the composed PLD, and the jitted kernels.

δ(ε) = p_∞ + Σ_k p_k (1 − e^{ε − l_k})₊ is a sum over the window's bins; ε(δ) is its root, in
closed form on the grid interval that holds it, ε = log((p_∞ + S₀ − δ)/S₁), whose derivative
is the implicit derivative of δ(ε) = δ (see the package docstring of
:mod:`jaxrdp.accounting.pld`). :func:`pld_epsilon_unchecked` and :func:`pld_delta_unchecked`
take the larger of the two directions' values.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import numerics
from jaxrdp.accounting.pld.convolution import _composed, _step, _sub_chunk
from jaxrdp.accounting.pld.discretisation import Lattice, _BLOCK, _READ_BLOCK, _U, lattice
from jaxrdp.accounting.pld.truncation import truncation_weights


def _delta_of(first, log_mass, p_inf, eps, interval):
  """δ(ε) = p_∞ + Σ_k p_k (1 − e^{ε − l_k})₊ on each direction's window (leading axis), from the
  masses' logarithms (no overflow however far the tilt was undone), raised by the rounding of
  a sum of n non-negative terms (relative (n − 1)u) and of its logarithm and exponential."""
  n = log_mass.shape[-1]
  losses = (first[:, None] + jnp.arange(n)) * interval
  above = losses > eps
  gap = jnp.where(above, eps - losses, -1.0)
  terms = jnp.where(above, log_mass + numerics.log(-jnp.expm1(gap)), -jnp.inf)
  return p_inf + jnp.exp(jax.nn.logsumexp(terms, axis=-1) + (2 * n + 16) * _U)


_DENSE_SUFFIX = 512   # the longest axis whose suffix sums are one masked m × m reduction
# (a read-out block's 512 points; beyond, in groups: m² work on ~10³ block sums as well cost a
# user's jax.jit ~30 % more run time, the groups ~0.1 s more compilation where they replace it)


def _suffix(log_terms):
  """log Σ_{j > k} e^{x_j} along the last axis (−inf past the end), without a scan (XLA:CPU
  compiles ``lax.cumlogsumexp``'s tree of reduce-windows as some ten kernels with a
  log-add-exp each). Up to :data:`_DENSE_SUFFIX` terms, every k's sum is one log-sum-exp of
  the terms after it (a masked m × m reduction); longer axes in groups of g ≥ √m terms, every
  k's sum one log-sum-exp of the terms after it in its group and the sums of the later groups
  (m·(g + m/g) work). Either way two log-sum-exp steps at most, chained."""
  m = log_terms.shape[-1]
  if m <= _DENSE_SUFFIX:
    after = np.arange(m)[None, :] > np.arange(m)[:, None]            # (k, j): j > k
    return _block_logsumexp(jnp.where(after, log_terms[..., None, :], -jnp.inf))
  size = math.isqrt(m - 1) + 1
  groups = -(-m // size)
  pad = [(0, 0)] * (log_terms.ndim - 1) + [(0, groups * size - m)]
  grouped = jnp.pad(log_terms, pad, constant_values=-jnp.inf)
  grouped = grouped.reshape(log_terms.shape[:-1] + (groups, size))       # (..., G, g)
  inside = np.arange(size)[None, :] > np.arange(size)[:, None]           # (k, j)
  later = np.arange(groups)[None, :] > np.arange(groups)[:, None]        # (group, other)
  sums = jnp.where(later, _block_logsumexp(grouped)[..., None, :], -jnp.inf)   # (..., G, G)
  terms = jnp.concatenate(
      [jnp.where(inside, grouped[..., None, :], -jnp.inf),
       jnp.broadcast_to(sums[..., None, :], grouped.shape + (groups,))], axis=-1)
  total = _block_logsumexp(terms)                                         # (..., G, g)
  return total.reshape(log_terms.shape[:-1] + (groups * size,))[..., :m]


def _block_logsumexp(x):
  """log Σ e^x over the last axis; −inf, with a zero derivative (no NaN), where every term is
  −inf."""
  top = lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  total = jnp.sum(jnp.exp(x - top), axis=-1)
  held = total > 0
  return jnp.where(held, jnp.log(jnp.where(held, total, 1.0)) + top[..., 0], -jnp.inf)


def _widened(log_sums):
  """(log S₀, log S₁), stacked on the leading axis, raised and lowered by the rounding of
  logarithms formed as a shift plus the log of a scaled sum, and of their log-sum-exp
  combinations: 4u(|log S| + 1) (u of the result's magnitude per step, an input's error
  passing through a log-sum-exp at most whole; at most four steps chained: a block's sum, the
  suffix over the blocks (:func:`_suffix`: up to two), the suffix inside the block added),
  which the terms' relative margin does not cover where |log S| is large. Without a
  derivative."""
  slack = lax.stop_gradient(
      4 * _U * (jnp.abs(jnp.where(jnp.isfinite(log_sums), log_sums, 0.0)) + 1.0))
  return log_sums + np.array([1.0, -1.0]).reshape((2,) + (1,) * (log_sums.ndim - 1)) * slack


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
  crosses the target. S₀ is rounded up and S₁ down by the rounding of a sum of n terms and of
  the logarithms (:func:`_widened`), which only raises δ(l_k), so the point found is never below
  the true one. ε is kept in [l_{k−1}, l_k], the interval the closed form
  ε = log((p_∞ + S₀(k) − δ)/S₁(k)) is exact on, and the closed form is rounded up."""
  d, n = log_mass.shape
  nb = n // _READ_BLOCK
  losses = (first[:, None] + jnp.arange(n)) * interval                # (d, n)
  margin = (2 * n + 16) * _U
  p_inf_0 = lax.stop_gradient(p_inf)
  # The terms of S₀ and of S₁ in blocks (2, d, nb, B), computed as one array (one kernel, no
  # copy), and each block's sum: read once, for the search and for the sums at the point found.
  blocks = jnp.where(np.arange(2).reshape(2, 1, 1) == 0, log_mass + margin,
                     log_mass - losses - margin).reshape(2, d, nb, _READ_BLOCK)
  block_sums = _block_logsumexp(blocks)                                 # (2, d, nb)
  after = _widened(_suffix(lax.stop_gradient(block_sums)))
  # δ at each block's last point; the first block whose last point meets δ holds the crossing.
  last = losses[:, _READ_BLOCK - 1::_READ_BLOCK]
  block = jnp.argmax(_delta_at(p_inf_0[:, None], after[0], after[1], last) <= delta, axis=-1)
  inside = jnp.take_along_axis(blocks, block[None, :, None, None], axis=2)[:, :, 0]   # (2, d, B)
  # S(k + 1) inside that block: its own suffix and the blocks beyond it.
  suffix = _widened(jnp.logaddexp(_suffix(lax.stop_gradient(inside)),
                                  jnp.take_along_axis(after, block[None, :, None], axis=2)))
  k_all = block[:, None] * _READ_BLOCK + jnp.arange(_READ_BLOCK)
  met = _delta_at(p_inf_0[:, None], suffix[0], suffix[1],
                  jnp.take_along_axis(losses, k_all, axis=1)) <= delta
  local = jnp.argmax(met, axis=-1)
  k = block * _READ_BLOCK + local
  found = jnp.any(met, axis=-1)
  # The bins k, k + 1, ... are those above ε ∈ (l_{k−1}, l_k]: ε in closed form there, with
  # S₀(k) and S₁(k) (differentiable) from the block's points from k on and the later blocks.
  from_k = jnp.arange(_READ_BLOCK) >= local[:, None]
  later = jnp.arange(nb) > block[:, None]
  log_s0, log_s1 = _widened(jax.nn.logsumexp(
      jnp.concatenate([jnp.where(from_k, inside, -jnp.inf),
                       jnp.where(later, block_sums, -jnp.inf)], axis=-1), axis=-1))
  s0 = jnp.exp(log_s0)
  # The closed form rounded up: the numerator by its three operations' rounding (within 3u
  # of p_∞ + S₀ + δ), ε by its logarithm's and difference's (u of each magnitude).
  sg = lax.stop_gradient
  numerator = p_inf + s0 - delta + sg(4 * _U * (p_inf + s0 + delta))
  ok = found & (numerator > 0) & (log_s1 > -jnp.inf)
  at_k = (first + k) * interval
  log_numerator = jnp.log(jnp.where(ok, numerator, 1.0))
  log_s1 = jnp.where(ok, log_s1, 0.0)
  eps = log_numerator - log_s1 + sg(4 * _U * (jnp.abs(log_numerator) + jnp.abs(log_s1) + 1.0))
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


def pld_epsilon_unchecked(q, sigma, t, delta, grid, truncation=None):
  """ε(δ) of the schedule (phase arrays q, σ, t of float64) on ``grid`` (a :class:`PldGrid`),
  the larger of the directions' (two programs, :func:`_query`).
  ``truncation``: None (Poisson sampling) or, per phase, (N, B, log C(N − 1, B), its error) of
  truncated Poisson sampling (:mod:`jaxrdp.accounting.pld.truncation`)."""
  return _query(_poisson_steps, (q, sigma, truncation), _epsilon_of_steps, (t, delta), grid)


def pld_delta_unchecked(q, sigma, t, epsilon, grid, truncation=None):
  """δ(ε) of the schedule, the larger of the directions' (as :func:`pld_epsilon_unchecked`)."""
  return _query(_poisson_steps, (q, sigma, truncation), _delta_of_steps, (t, epsilon), grid)


def mixture_epsilon_unchecked(sigma, c, p, t, delta, grid):
  """ε(δ) of a mixture-of-Gaussians schedule (σ, T (P,); sensitivities ``c``, probabilities
  ``p`` (P, m); float64) on ``grid``, the larger of the directions'."""
  return _query(_mixture_steps, (sigma, c, p), _epsilon_of_steps, (t, delta), grid)


def mixture_delta_unchecked(sigma, c, p, t, epsilon, grid):
  """δ(ε) of a mixture-of-Gaussians schedule (as :func:`mixture_epsilon_unchecked`)."""
  return _query(_mixture_steps, (sigma, c, p), _delta_of_steps, (t, epsilon), grid)


def _query(steps_program, steps_args, read_program, read_args, grid):
  """``read_program(steps_program(*steps_args, values), *read_args, values)`` on ``grid``, two
  programs (:func:`jaxrdp._internal.compilation.chained`): the phases' step PMFs, then their
  composition and read-out. The grid's interval and tail mass are values of both programs
  (:func:`lattice`: queries at several δ, whose grids aim at tail masses below each δ, or
  intervals compile once), its sizes static, each program's own: the first's the step's
  points (``pmf_bins``), the second's the circle (``bins``) and the length the step PMFs are
  zero-padded to between the two (:func:`_padded_length`), where the first computes them
  (the phases in one sub-chunk, :func:`jaxrdp.accounting.pld.convolution._sub_chunk`; else
  the second computes them in each of its sub-chunks). The second, ~3/4 of a first call's
  compilation, then serves every ``pmf_bins`` between two such lengths, and the first every
  ``bins`` (41 values of σ in [0.8, 1.6] at q = 0.01, T = 10,000, δ = 1e-5: 13 grids, 8
  programs of each kind; over the test suite's queries, 48 pairs of sizes, 30 and 23).
  Padding changes nothing computed: a zero mass tilts to zero, which the fold and the sums
  add exactly, and the rounding bounds count the grid's ``pmf_bins`` (:class:`Lattice`'s
  ``points``)."""
  values, sizes = lattice(grid)
  pmf_bins, bins = sizes
  kept = steps_args[0].shape[0] <= _sub_chunk(grid)   # step PMFs computed once, in the first
  length = _padded_length(pmf_bins, bins) if kept else pmf_bins
  return compilation.chained(steps_program, steps_args + (values,), read_program,
                             read_args + (values,), {"pmf_bins": pmf_bins, "kept": kept},
                             {"sizes": (length, bins)},
                             between=functools.partial(_padded, length=length))


def _padded_length(pmf_bins, bins):
  """The length step PMFs of ``pmf_bins`` points are padded to for a circle of ``bins``:
  ``bins``/4^k for the largest k that leaves at least ``pmf_bins`` points (whole blocks of
  :func:`jaxrdp.accounting.pld.convolution._log_mgf`); ``pmf_bins`` itself where it is not
  shorter than the circle (the fold wraps it). At most 4x the points (1.7x on average over
  the test suite's queries) in the parts of the composition that run on the PMFs' points
  (their tilt, its normalisation and the moment-generating function): none of the FFTs'."""
  if pmf_bins >= bins:
    return pmf_bins
  length = bins
  while length % 4 == 0 and length // 4 >= pmf_bins and (length // 4) % _BLOCK == 0:
    length //= 4
  return length


def _lattice_of(values, sizes):
  """The :class:`Lattice` in the graph. Its values pass a barrier: where they are constants (a
  user's ``jax.jit`` with a static grid) XLA cannot fold them into the arithmetic its own way
  (a division by Δ rewritten as a product with 1/Δ, which rounds differently), so that every
  program computes what the eager one, which gets them as arguments, computes."""
  return Lattice(*lax.optimization_barrier(values), *sizes)


def _padded(mech_and_steps, length):
  """(mechanism, step PMFs) with the PMFs (start, pmf, above), where computed, zero-padded to
  ``length`` points."""
  mech, steps = mech_and_steps
  if steps is None or steps[1].shape[-1] == length:
    return mech_and_steps
  start, pmf, above = steps
  widths = [(0, 0, 0)] * (pmf.ndim - 1) + [(0, length - pmf.shape[-1], 0)]
  return mech, (start, lax.pad(pmf, np.zeros((), pmf.dtype), widths), above)   # one primitive


# Each query is two programs (:func:`_query`): the phases' mechanism and step PMFs, which
# depend on the sampling scheme, then their composition and its read-out, which do not (the
# mechanism's kind is its tuple's length).


@compilation.jit(static_argnames=("pmf_bins", "kept"), work=_light)
def _poisson_steps(q, sigma, truncation, values, *, pmf_bins, kept=True):
  """(mechanism, step PMFs on ``pmf_bins`` points (None unless ``kept``: :func:`_query`)) of
  Poisson or truncated Poisson phases."""
  mech = (q, sigma) if truncation is None else (q, sigma) + truncation_weights(q, *truncation)
  return mech, (_step(mech, _step_lattice(values, pmf_bins)) if kept else None)


@compilation.jit(static_argnames=("pmf_bins", "kept"), work=_light)
def _mixture_steps(sigma, c, p, values, *, pmf_bins, kept=True):
  """(mechanism, step PMFs (as :func:`_poisson_steps`)) of mixture-of-Gaussians phases; no
  Poisson rate (q = 0): the directions differ, and the larger is taken."""
  mech = (jnp.zeros_like(sigma), sigma, c, p)
  return mech, (_step(mech, _step_lattice(values, pmf_bins)) if kept else None)


def _step_lattice(values, pmf_bins):
  """The :class:`Lattice` of the step PMFs' program: no circle (the step PMFs do not depend
  on it)."""
  return _lattice_of(values, (pmf_bins, None))


@compilation.jit(static_argnames=("sizes",), work=_light)
def _epsilon_of_steps(mech_and_steps, t, delta, values, *, sizes):
  mech, steps = mech_and_steps
  grid = _lattice_of(values, sizes)
  first, log_mass, p_inf = _composed(mech, t, grid, delta=delta, steps=steps)
  return _larger(_epsilon_of(first, log_mass, p_inf, delta, grid.interval), mech[0])


@compilation.jit(static_argnames=("sizes",), work=_light)
def _delta_of_steps(mech_and_steps, t, epsilon, values, *, sizes):
  mech, steps = mech_and_steps
  grid = _lattice_of(values, sizes)
  first, log_mass, p_inf = _composed(mech, t, grid, epsilon=epsilon, steps=steps)
  return jnp.minimum(_larger(_delta_of(first, log_mass, p_inf, epsilon, grid.interval),
                             mech[0]), 1.0)
