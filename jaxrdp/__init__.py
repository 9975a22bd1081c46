"""jaxrdp: a JAX-native, differentiable Rényi differential privacy accountant.

Data flows one way: mechanisms (RDP curves) -> composition -> conversion to (ε, δ) ->
accounting, schedules and the optax transforms on top.
The library never changes ``jax_enable_x64``; it computes in the dtype it is given.
"""

from jaxrdp.accounting.calibration import (calibrate_noise_multiplier, calibrate_sampling_rate,
                                           calibrate_steps)
from jaxrdp.accounting.epsilon import dpsgd_epsilon
from jaxrdp.mechanisms.closed_form import rdp_sampled_gaussian_closed_form
from jaxrdp.accounting.composition import compute_rdp
from jaxrdp.accounting.conversion import compute_delta, compute_epsilon
from jaxrdp.mechanisms.gaussian import rdp_gaussian
from jaxrdp.mechanisms.laplace import rdp_laplace
from jaxrdp.training.microbatch import ClippedGradSum, clipped_grad_sum
from jaxrdp.accounting.orders import DEFAULT_ORDERS
from jaxrdp.accounting.pld import (PldGrid, mixture_of_gaussians_delta, mixture_of_gaussians_epsilon,
                                   mixture_of_gaussians_grid, pld_delta, pld_epsilon, pld_grid)
from jaxrdp.mechanisms.randomized_response import rdp_randomized_response
from jaxrdp.mechanisms.relative_gaussian import rdp_relative_gaussian
from jaxrdp.mechanisms.sampled_gaussian import log_a, rdp_sampled_gaussian
from jaxrdp.training.sampling import (fixed_sample, poisson_max_batch_size,
                                     poisson_overflow_probability, poisson_sample,
                                     poisson_truncation_delta)
from jaxrdp.accounting.schedules import (ScheduleResult, epsilon_trajectory, noisy_sgd_utility,
                                          optimize_schedule)
from jaxrdp.accounting.sweep import sweep, sweep_noise_multiplier
from jaxrdp.accounting.sweep_output import read_sweep
from jaxrdp.mechanisms.without_replacement import rdp_sampled_gaussian_without_replacement
from jaxrdp.mechanisms.zcdp import pure_dp_to_zcdp, rdp_tcdp, rdp_zcdp, zcdp_to_delta, zcdp_to_epsilon
from jaxrdp._internal.compilation import compiler_options

import importlib as _importlib

# The optax transforms and the audit (which import optax) load on first use: an accounting
# query does not pay for importing optax.
_LAZY = {
    **dict.fromkeys(("AuditResult", "audit_transform"), "jaxrdp.audit.canary"),
    "audit_statistics": "jaxrdp.audit.trials",
    **dict.fromkeys(("clopper_pearson_upper", "epsilon_lower_bound"), "jaxrdp.audit.bounds"),
    **dict.fromkeys(("RelativeGaussianNoiseState", "rdp_relative_gaussian_descent",
                     "relative_gaussian_noise"), "jaxrdp.training.relative_gaussian_transform"),
    **dict.fromkeys(("differentially_private_aggregate", "dpsgd"), "jaxrdp.training.transform"),
    "DifferentiallyPrivateAggregateState": "jaxrdp.training.state",
    **dict.fromkeys(("privacy_spent", "rdp_spent"), "jaxrdp.training.spent"),
}


def __getattr__(name):
  module = _LAZY.get(name)
  if module is None:
    raise AttributeError(f"module 'jaxrdp' has no attribute {name!r}")
  value = getattr(_importlib.import_module(module), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_LAZY))


# The one place the version is written: pyproject.toml reads this literal (setuptools' `attr`,
# resolved from the source without importing jaxrdp, so building needs no jax). Keep it a plain
# string assignment.
__version__ = "1.0.0"

__all__ = [
    "audit_statistics",
    "audit_transform",
    "AuditResult",
    "calibrate_noise_multiplier",
    "calibrate_sampling_rate",
    "calibrate_steps",
    "clipped_grad_sum",
    "ClippedGradSum",
    "clopper_pearson_upper",
    "compute_delta",
    "compute_epsilon",
    "compiler_options",
    "compute_rdp",
    "DEFAULT_ORDERS",
    "differentially_private_aggregate",
    "DifferentiallyPrivateAggregateState",
    "dpsgd",
    "dpsgd_epsilon",
    "epsilon_lower_bound",
    "epsilon_trajectory",
    "fixed_sample",
    "log_a",
    "optimize_schedule",
    "noisy_sgd_utility",
    "mixture_of_gaussians_delta",
    "mixture_of_gaussians_epsilon",
    "mixture_of_gaussians_grid",
    "pld_delta",
    "pld_epsilon",
    "pld_grid",
    "PldGrid",
    "poisson_max_batch_size",
    "poisson_overflow_probability",
    "poisson_sample",
    "poisson_truncation_delta",
    "privacy_spent",
    "pure_dp_to_zcdp",
    "rdp_gaussian",
    "rdp_laplace",
    "rdp_randomized_response",
    "rdp_relative_gaussian",
    "rdp_relative_gaussian_descent",
    "rdp_sampled_gaussian",
    "rdp_sampled_gaussian_closed_form",
    "rdp_sampled_gaussian_without_replacement",
    "rdp_spent",
    "rdp_tcdp",
    "rdp_zcdp",
    "read_sweep",
    "relative_gaussian_noise",
    "RelativeGaussianNoiseState",
    "ScheduleResult",
    "sweep",
    "sweep_noise_multiplier",
    "zcdp_to_delta",
    "zcdp_to_epsilon",
]
