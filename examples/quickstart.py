"""jaxrdp quickstart: ε of DP-SGD runs, exact at every order, compared with dp_accounting.

Run:  python examples/quickstart.py   (about 7 s on a laptop CPU, most of it compilation)

Prints, for a few DP-SGD configurations (Poisson sampling rate q, noise multiplier σ, steps T,
δ), the ε and optimal order from jaxrdp, dp_accounting's RDP ε on its own order grid (when it
is installed), the derivative dε/dσ (jaxrdp's ε is differentiable), and the float32 result.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxrdp

CONFIGS = [  # (q, sigma, steps, delta)
    (0.01, 1.1, 10_000, 1e-5),
    (0.001, 0.8, 100_000, 1e-6),
    (0.1, 2.0, 1_000, 1e-5),
    (1.0, 5.0, 100, 1e-5),
]


def epsilon(q, sigma, steps, delta, orders=jaxrdp.DEFAULT_ORDERS):
  rdp = jaxrdp.compute_rdp(q, sigma, steps, orders)
  return jaxrdp.compute_epsilon(orders, rdp, delta)


def dp_accounting_epsilon(q, sigma, steps, delta):
  """dp_accounting's RDP accountant (its public API, its default orders)."""
  try:
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant
  except ImportError:
    return None
  event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
  return RdpAccountant().compose(event, steps).get_epsilon(delta)


def main():
  with jax.enable_x64(True):  # scoped: the library itself never changes the global flag
    print(f"jaxrdp {jaxrdp.__version__} on {jax.devices()[0].platform}, {len(jaxrdp.DEFAULT_ORDERS)} default orders\n")
    print(f"{'q':>7} {'sigma':>6} {'steps':>7} {'delta':>7} | {'eps':>8} {'order':>6} | "
          f"{'dp_acc':>8} | {'d eps/d sigma':>13} | {'eps (f32)':>9} | time")
    # dε/dσ of dpsgd_epsilon (the order refined off the grid): by the envelope theorem at the
    # optimal order; jax.jit(grad_sigma) works as well (it compiles one program for all of it).
    grad_sigma = jax.grad(jaxrdp.dpsgd_epsilon, argnums=1)
    for q, sigma, steps, delta in CONFIGS:
      start = time.perf_counter()
      eps, order = epsilon(q, sigma, steps, delta)
      eps = float(eps)
      elapsed = time.perf_counter() - start
      theirs = dp_accounting_epsilon(q, sigma, steps, delta)
      d_sigma = float(grad_sigma(q, sigma, steps, delta))
      eps32, _ = epsilon(jnp.float32(q), jnp.float32(sigma), steps, jnp.float32(delta),
                         orders=jaxrdp.DEFAULT_ORDERS.astype(np.float32))
      theirs_s = f"{theirs:8.4f}" if theirs is not None else "     n/a"
      print(f"{q:7g} {sigma:6g} {steps:7d} {delta:7g} | {eps:8.4f} {float(order):6g} | {theirs_s} | "
            f"{d_sigma:13.4f} | {float(eps32):9.4f} | {elapsed * 1e3:.0f} ms")
    print("\njaxrdp's RDP is exact at fractional orders (dp_accounting over-estimates there), so its ε\n"
          "is never larger than dp_accounting's on the same order grid, and never below the true\n"
          "RDP-based value.")


if __name__ == "__main__":
  main()
