"""jaxrdp: a JAX-native, differentiable Rényi differential privacy accountant.

Data flows one way: mechanisms (RDP curves) -> composition -> conversion to (ε, δ).
The library never changes ``jax_enable_x64``; it computes in the dtype it is given.
"""

from jaxrdp.composition import compute_rdp
from jaxrdp.conversion import compute_delta, compute_epsilon
from jaxrdp.orders import DEFAULT_ORDERS
from jaxrdp.sampled_gaussian import log_a, rdp_sampled_gaussian

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_ORDERS",
    "compute_delta",
    "compute_epsilon",
    "compute_rdp",
    "log_a",
    "rdp_sampled_gaussian",
]
