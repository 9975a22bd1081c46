r"""The public functions of the PLD accountant: checks, sizes from concrete values, float64.

:func:`pld_epsilon` and :func:`pld_delta` check their arguments eagerly, size the grid where
the parameters are concrete (or take ``pld_grid=``, from :func:`pld_grid`), run the kernels of
:mod:`jaxrdp.accounting.pld.readout` and give NaN under ``jax.jit`` where an argument is
invalid.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import validation
from jaxrdp.accounting import composition
from jaxrdp.accounting.pld.discretisation import DEFAULT_INTERVAL, DEFAULT_TAIL_MASS, PldGrid
from jaxrdp.accounting.pld.readout import (mixture_delta_unchecked, mixture_epsilon_unchecked,
                                           pld_delta_unchecked, pld_epsilon_unchecked)
from jaxrdp.accounting.pld.sizing import _checked_grid, _host_values, grid_for, grid_of, mixture_grid_for
from jaxrdp.accounting.pld.truncation import log_choose


def truncation_of(dataset_size, max_batch_size, phases):
  """(host, graph) descriptions of truncated Poisson sampling of ``dataset_size`` examples in
  batches of at most ``max_batch_size`` (an int or one per phase; checked by the caller), or
  (None, None) for Poisson sampling. Either neighbour of the dataset may hold the example, so
  N of the others are counted (the larger neighbour: dp_accounting's ``dataset_size`` is
  N + 1; the probability that the others fill a batch grows with their number): host
  (N + 1, B per phase) for :func:`grid_for`, graph (N + 1, B, log C(N, B), its error) per
  phase (float64) for the kernels."""
  if dataset_size is None:
    return None, None
  n = int(dataset_size) + 1
  b = np.broadcast_to(np.asarray(max_batch_size, np.int64), (phases,))
  pairs = [log_choose(n - 1, int(v)) for v in b]
  graph = (np.full(phases, float(n)), b.astype(np.float64),
           np.array([p[0] for p in pairs], np.float64), np.array([p[1] for p in pairs], np.float64))
  return (n, b), tuple(jnp.asarray(v) for v in graph)


def pld_grid(sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
             steps: jax.typing.ArrayLike, *, interval: float = DEFAULT_INTERVAL,
             tail_mass: float = DEFAULT_TAIL_MASS,
             delta: jax.typing.ArrayLike | None = None, dataset_size: int | None = None,
             max_batch_size=None) -> PldGrid:
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
    delta: the δ (a scalar, or an array of the δs) that ε will be read at, if known: the
      window then reaches only as far below ε as the tilted composition needs (about half
      the points, and half the time, on 10⁴–10⁵ steps; the same ε to ~1e-7 relative), and
      the tail mass is at most δ/1000: the grid ``pld_epsilon`` sizes for itself. ε read at
      another δ, and δ(ε) at any ε, stay valid bounds (looser where ε lies far below the
      window).
    dataset_size, max_batch_size: truncated Poisson sampling (as :func:`pld_epsilon`): the
      grid then also fits the replace-one term of its steps.

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
  if delta is not None:
    validation.check("delta", delta)
  values = [_host_values(v) for v in (sampling_rate, noise_multiplier, steps)]
  if delta is not None:
    values.append(_host_values(delta))
  if any(v is None for v in values):
    raise TypeError("pld_grid needs concrete parameters (it sets array shapes); call it "
                    "outside jax.jit.")
  _check_truncation(dataset_size, max_batch_size)
  phases = np.broadcast_shapes(*(np.shape(v) for v in values[:3]), (1,))[-1]
  host, _ = truncation_of(dataset_size, max_batch_size, phases)
  return grid_for(*values[:3], interval=float(interval), tail_mass=float(tail_mass),
                  delta=values[3] if delta is not None else None, truncation=host)


def _check_truncation(dataset_size, max_batch_size):
  """Both sizes or neither (ValueError), each an int ≥ 1 (TypeError, ValueError)."""
  if (dataset_size is None) != (max_batch_size is None):
    raise ValueError("truncated Poisson sampling needs both dataset_size and max_batch_size; got "
                     f"dataset_size={dataset_size!r}, max_batch_size={max_batch_size!r}.")
  if dataset_size is not None:
    validation.check_int("dataset_size", dataset_size, lo=1)
    validation.check_ints("max_batch_size", max_batch_size, lo=1)


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


def _valid(q, sigma, t, other, other_domain):
  """The jit-side mask: every argument in its domain and T whole (NaN otherwise)."""
  return (jnp.all(validation.in_domain("sampling_rate", q))
          & jnp.all(validation.in_domain("noise_multiplier", sigma))
          & jnp.all(validation.in_domain("steps", t)) & jnp.all(t == jnp.floor(t))
          & validation.in_domain(other_domain, other))


@compilation.on_host
def pld_epsilon(sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
                steps: jax.typing.ArrayLike, delta: jax.typing.ArrayLike, *,
                pld_grid: PldGrid | None = None, dataset_size: int | None = None,
                max_batch_size=None) -> jax.Array:
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
    dataset_size, max_batch_size: truncated Poisson sampling (both, or neither): each of the
      N = ``dataset_size`` examples joins a batch with probability q, and a batch of more
      than B = ``max_batch_size`` (an int, or one per phase) is cut to B of them chosen
      uniformly at random (:func:`jaxrdp.poisson_sample`). Each step is then the mixture of
      the Poisson pair and, with the probability w that the other examples alone fill a
      batch, the replace-one pair at σ/2 and the rate q_c at which the example is in a cut
      batch (arXiv 2508.15089; dp_accounting's ``TruncatedSubsampledGaussianDpEvent``, whose
      ``dataset_size`` counts the example: N + 1 here, since a neighbour may add one).

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
                   delta, pld_grid, dataset_size, max_batch_size)


@compilation.on_host
def pld_delta(sampling_rate: jax.typing.ArrayLike, noise_multiplier: jax.typing.ArrayLike,
              steps: jax.typing.ArrayLike, epsilon: jax.typing.ArrayLike, *,
              pld_grid: PldGrid | None = None, dataset_size: int | None = None,
              max_batch_size=None) -> jax.Array:
  r"""δ(ε) of DP-SGD with Poisson sampling by its privacy-loss distribution: the larger of the
  two directions' hockey-stick divergences δ(ε) = p_∞ + Σ_k p_k (1 − e^{ε − l_k})₊, never
  below the true δ (the same PLD as :func:`pld_epsilon`).

  Args:
    sampling_rate: q in [0, 1], a scalar or a 1-D schedule (one entry per phase).
    noise_multiplier: σ ≥ 0, scalar or 1-D.
    steps: steps per phase, whole numbers ≥ 0, scalar or 1-D.
    epsilon: ε ≥ 0.
    pld_grid: the static sizes (:func:`pld_grid`); required inside ``jax.jit``.
    dataset_size, max_batch_size: truncated Poisson sampling, as :func:`pld_epsilon`.

  Returns:
    δ in [0, 1], a float64 scalar. Jittable, vmappable, differentiable in q, σ and ε. NaN
    under jit for invalid arguments.

  Raises:
    ValueError: as :func:`pld_epsilon`. TypeError: float32 arguments.
  """
  return _evaluate(pld_delta_unchecked, sampling_rate, noise_multiplier, steps, "epsilon",
                   epsilon, pld_grid, dataset_size, max_batch_size)


def _evaluate(kernel, sampling_rate, noise_multiplier, steps, name, value, given_grid,
              dataset_size=None, max_batch_size=None):
  """``kernel(q, σ, T, value, grid, truncation)`` after the public checks (``name``: "delta"
  or "epsilon"), NaN under jit where an argument is invalid."""
  validation.check_all(sampling_rate=sampling_rate, noise_multiplier=noise_multiplier,
                       steps=steps)
  validation.check(name, value)   # "delta" or "epsilon", entries of the domain table
  validation.check_scalar(**{name: value})
  _check_truncation(dataset_size, max_batch_size)
  q, sigma, t = checked_phases(sampling_rate, noise_multiplier, steps, "the PLD accountant")
  if max_batch_size is not None and np.size(max_batch_size) not in (1, t.shape[0]):
    raise ValueError(f"max_batch_size must be an int or one per phase ({t.shape[0]}); got "
                     f"{np.size(max_batch_size)} values.")
  host, truncation = truncation_of(dataset_size, max_batch_size, t.shape[0])
  grid = grid_of(q, sigma, t, given_grid, value if name == "delta" else None, host)
  value = validation.to_device(value, np.float64)
  result = kernel(q, sigma, t, value, grid, truncation)
  if validation.is_concrete((q, sigma, t, value)):   # checked above: raised where invalid
    return result
  return _masked(result, q, sigma, t, value, name)


@functools.partial(jax.jit, static_argnums=(5,))
def _masked(result, q, sigma, t, other, other_domain):
  """``result``, NaN where an argument is invalid (:func:`_valid`): one program, also where
  the arguments are an eager ``jax.grad``'s or ``jax.vmap``'s tracers (op by op, the mask
  compiled some twenty programs of its own: ~0.3 s of a first eager gradient)."""
  return jnp.where(_valid(q, sigma, t, other, other_domain), result, jnp.nan)


# ---------------------------------------------------------------------------------------------
# The mixture of Gaussians.


@compilation.on_host
def mixture_of_gaussians_epsilon(standard_deviation: jax.typing.ArrayLike,
                                 sensitivities: jax.typing.ArrayLike,
                                 probabilities: jax.typing.ArrayLike,
                                 steps: jax.typing.ArrayLike, delta: jax.typing.ArrayLike, *,
                                 pld_grid: PldGrid | None = None) -> jax.Array:
  r"""ε(δ) of the mixture-of-Gaussians mechanism composed ``steps`` times, by its PLD.

  The mechanism outputs N(0, s²) on one dataset and Σ_i p_i N(c_i, s²) on its neighbour
  (dp_accounting's ``MixtureOfGaussiansDpEvent(s, c, p)``, add/remove neighbours): the
  building block of amplification by cyclic Poisson sampling and of banded matrix
  mechanisms, whose vector mixture is dominated by the scalar one with each sensitivity
  vector replaced by its norm (Choquette-Choo, Ganesh, Steinke, Thakurta 2023, arXiv
  2310.15526, Cor. 4.7). Poisson sampling at rate q is c = (0, 1), p = (1 − q, q), s = σ.
  The PLD is discretised pessimistically and composed as :func:`pld_epsilon`'s (the larger
  of the two directions): never below the true ε, within the discretisation's allowance
  above it (within 1e-6 of dp_accounting's ``PLDAccountant`` on the tested box).

  Args:
    standard_deviation: s > 0, a scalar or one per phase.
    sensitivities: c_i ≥ 0, shape (m,) or (phases, m); at least one positive with positive
      probability.
    probabilities: p_i in [0, 1], the same shape, summing to one (within 1e-9; normalised).
    steps: whole numbers ≥ 0, a scalar or one per phase.
    delta: δ in (0, 1).
    pld_grid: the static sizes (:func:`mixture_of_gaussians_grid`); required inside
      ``jax.jit``.

  Returns:
    ε, a float64 scalar (+inf where δ is below the mass of infinite loss). Jittable,
    vmappable, differentiable in s, c, p and δ. NaN under jit for invalid arguments.

  Raises:
    ValueError: an argument outside its range (named, with the range and the value),
      probabilities that do not sum to one, no positive sensitivity, shapes that do not fit.
    TypeError: float32 arguments (float64 only).

  References:
    Choquette-Choo, Ganesh, Steinke, Thakurta, "Privacy Amplification for Matrix
    Mechanisms", ICLR 2024 (arXiv 2310.15526); Doroshenko et al. 2022 (connect the dots).
  """
  return _mixture_evaluate(mixture_epsilon_unchecked, standard_deviation, sensitivities,
                           probabilities, steps, "delta", delta, pld_grid)


@compilation.on_host
def mixture_of_gaussians_delta(standard_deviation: jax.typing.ArrayLike,
                               sensitivities: jax.typing.ArrayLike,
                               probabilities: jax.typing.ArrayLike,
                               steps: jax.typing.ArrayLike, epsilon: jax.typing.ArrayLike, *,
                               pld_grid: PldGrid | None = None) -> jax.Array:
  r"""δ(ε) of the mixture-of-Gaussians mechanism composed ``steps`` times, by its PLD: the
  same PLD as :func:`mixture_of_gaussians_epsilon`, never below the true δ.

  Args:
    standard_deviation, sensitivities, probabilities, steps, pld_grid: as in
      :func:`mixture_of_gaussians_epsilon`.
    epsilon: ε ≥ 0.

  Returns:
    δ in [0, 1], a float64 scalar (NaN under jit for invalid arguments).

  Raises:
    ValueError, TypeError: as :func:`mixture_of_gaussians_epsilon`.
  """
  return _mixture_evaluate(mixture_delta_unchecked, standard_deviation, sensitivities,
                           probabilities, steps, "epsilon", epsilon, pld_grid)


def mixture_of_gaussians_grid(standard_deviation: jax.typing.ArrayLike,
                              sensitivities: jax.typing.ArrayLike,
                              probabilities: jax.typing.ArrayLike,
                              steps: jax.typing.ArrayLike, *, interval: float = DEFAULT_INTERVAL,
                              tail_mass: float = DEFAULT_TAIL_MASS,
                              delta: jax.typing.ArrayLike | None = None) -> PldGrid:
  """The grid sizes of :func:`mixture_of_gaussians_epsilon` for concrete parameters (as
  :func:`pld_grid`): pass it as ``pld_grid=`` inside ``jax.jit``.

  Args:
    standard_deviation, sensitivities, probabilities, steps: as in
      :func:`mixture_of_gaussians_epsilon` (concrete).
    interval, tail_mass, delta: as in :func:`pld_grid`.

  Returns:
    A :class:`PldGrid`.

  Raises:
    ValueError: an argument outside its range, or a PLD too wide for :data:`MAX_BINS`.
    TypeError: traced parameters (call it outside ``jax.jit``).
  """
  sigma, c, p, t, _ = _mixture_phases(standard_deviation, sensitivities, probabilities, steps)
  validation.check("pld_interval", interval, name="interval")
  validation.check("tail_mass", tail_mass)
  if delta is not None:
    validation.check("delta", delta)
  values = [_host_values(v) for v in (sigma, c, p, t)]
  if any(v is None for v in values):
    raise TypeError("mixture_of_gaussians_grid needs concrete parameters (it sets array "
                    "shapes); call it outside jax.jit.")
  return mixture_grid_for(*values, interval=float(interval), tail_mass=float(tail_mass),
                          delta=None if delta is None else _host_values(delta))


def _mixture_phases(standard_deviation, sensitivities, probabilities, steps):
  """Checked float64 phases: s and T (P,), c and p (P, m), p normalised (eagerly: ValueError
  where p does not sum to one within 1e-9, or no positive sensitivity has a positive
  probability), and whether every phase's p summed to one (the jit side's mask)."""
  validation.check_all(standard_deviation=standard_deviation, sensitivities=sensitivities,
                       probabilities=probabilities, steps=steps)
  arguments = (standard_deviation, sensitivities, probabilities, steps)
  # Each argument on the host where it is concrete (an eager JAX operation compiles a program
  # of its own: under an eager jax.grad in s, c, p and T stay NumPy).
  xp = lambda v: np if validation.is_concrete(v) else jnp
  sigma, c, p, t = (np.asarray(v) if xp(v) is np else validation.as_float_array(v)
                    for v in arguments)
  if c.ndim not in (1, 2) or c.shape != p.shape:
    raise ValueError(f"sensitivities and probabilities must have one shape, (m,) or (phases, m); "
                     f"got {c.shape} and {p.shape}.")
  c, p = (xp(v).atleast_2d(v) for v in (c, p))
  sigma, t = (xp(v).atleast_1d(v) for v in (sigma, t))
  if sigma.ndim > 1 or t.ndim > 1:
    raise ValueError(f"standard_deviation and steps must be scalars or 1-D (one per phase); got "
                     f"shapes {sigma.shape} and {t.shape}.")
  try:
    phases = np.broadcast_shapes(sigma.shape, t.shape, c.shape[:1])[0]
  except ValueError:
    raise ValueError(f"standard_deviation {sigma.shape}, steps {t.shape} and sensitivities "
                     f"{c.shape} do not describe one schedule of phases.") from None
  if (any(jnp.result_type(v) != jnp.float64 for v in (sigma, c, p))
      and not jax.config.jax_enable_x64):
    raise TypeError("the mixture-of-Gaussians PLD computes in float64 only: enable 64-bit JAX "
                    "(jax.config.update('jax_enable_x64', True)).")
  sigma, t = (xp(v).broadcast_to(xp(v).asarray(v, np.float64), (phases,)) for v in (sigma, t))
  c, p = (xp(v).broadcast_to(xp(v).asarray(v, np.float64), (phases, c.shape[1])) for v in (c, p))
  total = xp(p).sum(p, axis=-1, keepdims=True)
  if validation.is_concrete((c, p, t)):
    host_c, host_p, host_t, host_total = (np.asarray(v) for v in (c, p, t, total))
    if np.any(np.abs(host_total - 1.0) > 1e-9):
      raise ValueError(f"probabilities must sum to one (within 1e-9) in every phase; got sums "
                       f"{host_total.ravel().tolist()}.")
    if not np.all(np.any((host_c > 0) & (host_p > 0), axis=-1)):
      raise ValueError("sensitivities must hold a positive value with a positive probability in "
                       "every phase (else the mechanism reveals nothing: nothing to account).")
    if np.any(host_t != np.floor(host_t)):
      raise ValueError("steps must be whole numbers for the PLD accountant.")
  if validation.is_concrete((c, p, t)):   # checked above
    return sigma, c, p / total, t, True
  close = xp(total).abs(total - 1.0) <= 1e-9
  return sigma, c, p / total, t, xp(close).all(close)


def _mixture_valid(sigma, c, p, t, other, other_domain):
  """The jit-side mask of :func:`_mixture_evaluate` (NaN where False)."""
  return (jnp.all(validation.in_domain("standard_deviation", sigma))
          & jnp.all(validation.in_domain("sensitivities", c))
          & jnp.all(validation.in_domain("probabilities", p))
          & jnp.all(validation.in_domain("steps", t)) & jnp.all(t == jnp.floor(t))
          & jnp.all(jnp.any((c > 0) & (p > 0), axis=-1))
          & validation.in_domain(other_domain, other))


def _mixture_evaluate(kernel, standard_deviation, sensitivities, probabilities, steps, name,
                      value, given_grid):
  """``kernel(s, c, p, T, value, grid)`` after the public checks, NaN under jit where an
  argument is invalid (or the probabilities do not sum to one)."""
  validation.check(name, value)
  validation.check_scalar(**{name: value})
  sigma, c, p, t, sums = _mixture_phases(standard_deviation, sensitivities, probabilities, steps)
  if given_grid is not None:
    grid = _checked_grid(given_grid)
  else:
    values = [_host_values(v) for v in (sigma, c, p, t)]
    if any(v is None for v in values):
      raise ValueError("the PLD accountant's array sizes depend on the parameters' values, "
                       "which are traced here (inside jax.jit): pass pld_grid=jaxrdp."
                       "mixture_of_gaussians_grid(...) computed outside.")
    known = _host_values(value) if name == "delta" else None
    grid = mixture_grid_for(*values, delta=known)
  value = validation.to_device(value, np.float64)
  result = kernel(sigma, c, p, t, value, grid)
  if validation.is_concrete((sigma, c, p, t, value)):
    return result
  return _mixture_masked(result, sigma, c, p, t, value, sums, name)


@functools.partial(jax.jit, static_argnums=(7,))
def _mixture_masked(result, sigma, c, p, t, other, sums, other_domain):
  """``result``, NaN where an argument is invalid or the probabilities do not sum to one
  (:func:`_mixture_valid`; one program, as :func:`_masked`)."""
  return jnp.where(_mixture_valid(sigma, c, p, t, other, other_domain) & sums, result, jnp.nan)
