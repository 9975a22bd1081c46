"""jaxrdp: a JAX-native, differentiable Rényi differential privacy accountant.

Data flows one way: mechanisms (RDP curves) -> composition -> conversion to (ε, δ).
The library never changes ``jax_enable_x64``; it computes in the dtype it is given.
"""

from jaxrdp.accounting import (calibrate_noise_multiplier, calibrate_sampling_rate,
                                calibrate_steps, dpsgd_epsilon)
from jaxrdp.composition import compute_rdp
from jaxrdp.conversion import compute_delta, compute_epsilon
from jaxrdp.gaussian import rdp_gaussian
from jaxrdp.laplace import rdp_laplace
from jaxrdp.orders import DEFAULT_ORDERS
from jaxrdp.randomized_response import rdp_randomized_response
from jaxrdp.sampled_gaussian import log_a, rdp_sampled_gaussian
from jaxrdp.zcdp import pure_dp_to_zcdp, rdp_tcdp, rdp_zcdp, zcdp_to_delta, zcdp_to_epsilon

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_ORDERS",
    "calibrate_noise_multiplier",
    "calibrate_sampling_rate",
    "calibrate_steps",
    "compute_delta",
    "compute_epsilon",
    "compute_rdp",
    "dpsgd_epsilon",
    "log_a",
    "pure_dp_to_zcdp",
    "rdp_gaussian",
    "rdp_laplace",
    "rdp_randomized_response",
    "rdp_sampled_gaussian",
    "rdp_tcdp",
    "rdp_zcdp",
    "zcdp_to_delta",
    "zcdp_to_epsilon",
]
