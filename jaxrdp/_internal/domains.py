"""The allowed values of every real-valued argument: one table, read by every check.

:data:`DOMAINS` is the only place where a range is written. It drives the eager checks
(:func:`jaxrdp._internal.validation.check`: ``ValueError`` naming the argument, the interval
and the value), the masks under ``jax.jit`` (:func:`in_domain`: NaN where the eager check
would have raised) and the command line's flag types (``jaxrdp.cli.main``). Both sides use
:func:`inside`, so they cannot disagree.

A name that means different things in different places has one entry per meaning: the
accountant's ``sampling_rate`` is in [0, 1] (q = 0 samples nobody, RDP 0), while a rate that
draws batches (``positive_sampling_rate``) is in (0, 1].
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Domain:
  """The interval [lo, hi] (ends open as asked; None: unbounded). ``allow_inf``: ±inf count as
  inside where no bound excludes them; ``allow_nan``: NaN counts as inside (no information)."""
  lo: float | None = None
  hi: float | None = None
  lo_open: bool = False
  hi_open: bool = False
  allow_inf: bool = False
  allow_nan: bool = False

  def interval(self) -> str:
    """As the library's messages write it: ``[0.0, 1.0]``, ``(0.0, inf]``."""
    left = "(" if self.lo_open else "["
    right = ")" if self.hi_open else "]"
    return (f"{left}{'-inf' if self.lo is None else self.lo}, "
            f"{'inf' if self.hi is None else self.hi}{right}")


_UNIT = Domain(0.0, 1.0)
_OPEN_UNIT = Domain(0.0, 1.0, lo_open=True, hi_open=True)
_NON_NEGATIVE = Domain(0.0)
_POSITIVE = Domain(0.0, lo_open=True)
_ORDER = Domain(1.0, allow_inf=True)

DOMAINS: dict[str, Domain] = {
    # --- the accountant (Mironov 2017; Mironov, Talwar, Zhang 2019) ---
    "sampling_rate": _UNIT,                    # q; also log_a's q and sweep's sampling_rates
    "noise_multiplier": _NON_NEGATIVE,         # σ = 0: no noise, RDP +inf
    "steps": _NON_NEGATIVE,                    # T, real (ε is differentiated in it)
    "orders": _ORDER,                          # α = 1: KL divergence; α = inf allowed
    "delta": _OPEN_UNIT,
    "epsilon": Domain(0.0, allow_inf=True),    # a privacy loss (ε = inf: no guarantee)
    "target_epsilon": _POSITIVE,               # a budget to reach
    # A curve read by compute_epsilon / compute_delta: NaN entries carry no information and
    # are skipped.
    "curve_orders": Domain(1.0, allow_inf=True, allow_nan=True),
    "rdp": Domain(0.0, allow_inf=True, allow_nan=True),
    # optimize_schedule works in log σ; the CLI refuses σ = 0 (ε = inf) as a mistake.
    "positive_noise_multiplier": _POSITIVE,
    # --- the PLD accountant (jaxrdp.accounting.pld) ---
    "pld_interval": Domain(0.0, 1.0, lo_open=True),   # Δ, the loss grid's spacing
    "tail_mass": _OPEN_UNIT,                   # composed mass the window may leave out
    # the mixture of Gaussians (arXiv 2310.15526): N(0, s²) against Σ_i p_i N(c_i, s²)
    "standard_deviation": _POSITIVE,
    "sensitivities": _NON_NEGATIVE,
    "probabilities": _UNIT,
    # --- other mechanisms ---
    "scale": _NON_NEGATIVE,                    # Laplace b
    "p": Domain(0.5, 1.0),                     # randomized response: truth with probability p
    "rho": _NON_NEGATIVE,                      # zCDP / tCDP ρ
    "xi": _NON_NEGATIVE,                       # zCDP ξ
    "omega": Domain(1.0, lo_open=True, allow_inf=True),   # tCDP ω
    "eta": _POSITIVE,                          # relative Gaussian η
    "gamma": _POSITIVE,                        # relative Gaussian γ
    "dim": Domain(1.0),                        # relative Gaussian d (an integer, checked apart)
    "relative_sigma": _NON_NEGATIVE,           # relative Gaussian noise σ
    "r_rel": _NON_NEGATIVE,                    # relative Gaussian clipping ratio
    # --- training ---
    "positive_sampling_rate": Domain(0.0, 1.0, lo_open=True),   # a rate that draws batches
    "l2_norm_clip": _NON_NEGATIVE,
    "expected_batch_size": _POSITIVE,          # the divisor of the noisy sum
    "learning_rate": Domain(),                 # any finite number (optax's sign convention)
    "step_size": _NON_NEGATIVE,                # a descent's learning rate in a utility model
    "positive_l2_norm_clip": _POSITIVE,
    "curvature": _NON_NEGATIVE,                # a quadratic's curvature (noisy_sgd_utility)
    "momentum": Domain(),
    "max_overflow_probability": _UNIT,
    "overflow_probability": Domain(0.0, 1.0, hi_open=True),
    # --- audit ---
    "significance": _OPEN_UNIT,                # a test's level α
    "confidence": _OPEN_UNIT,
    # --- the command line ---
    "count": Domain(1.0),                      # whole numbers of things: steps, examples
    "epochs": _POSITIVE,
}


def inside(domain: Domain, x):
  """Elementwise: ``x`` lies in ``domain``. Comparisons only, so the same code runs on NumPy
  arrays (the eager checks), JAX arrays and tracers (the masks) and Python numbers; a
  comparison with NaN is false, so NaN is outside unless ``allow_nan``."""
  lo, lo_open = (domain.lo, domain.lo_open) if domain.lo is not None else (
      -math.inf, not domain.allow_inf)
  hi, hi_open = (domain.hi, domain.hi_open) if domain.hi is not None else (
      math.inf, not domain.allow_inf)
  ok = (x > lo) if lo_open else (x >= lo)
  if hi_open or hi != math.inf:   # x <= inf holds for every number the first test let in
    ok = ok & ((x < hi) if hi_open else (x <= hi))
  if domain.allow_nan:
    ok = ok | (x != x)   # NaN (jnp.isnan is this comparison)
  return ok


def in_domain(name: str, x):
  """The jit-side mask of ``DOMAINS[name]``: where it is false a function returns NaN (never a
  plausible number), as its eager check would have raised."""
  return inside(DOMAINS[name], x)
