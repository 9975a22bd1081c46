"""Design a decaying-noise DP-SGD schedule by gradient, at the same ε as a constant σ.

Setting: Poisson sampling at q = 0.01 for T = 3,000 steps (30 phases of 100 steps), δ = 1e-5.
Baseline: constant noise multiplier σ = 1.0, whose ε is the budget.

Utility proxy (smaller is better): the variance that the injected noise leaves in the final
iterate of noisy gradient descent on a strongly convex quadratic. With step size η and
curvature μ, noise added at step t is damped by (1 − ημ)^(2(T − t)) ≈ e^(−2ημ(T − t)) by the
end, so (normalised, with 2ημT = 3)

    U(σ) = Σ_t w_t σ_t² / Σ_t w_t,     w_t = exp(−3 (T − t) / T),

the per-step noise variance weighted towards late steps (w rises from 0.05 to 1). jaxrdp.optimize_schedule minimises U over the shape
of the schedule while keeping ε exactly at the budget (scale projection, implicit gradients),
and returns a schedule whose ε is at most the budget.

Run:  python examples/optimize_schedule.py [--out schedule.png] [--iterations 150]

About 11 s (15 s of CPU) on a laptop CPU with the defaults, most of it compiling the first
iteration and the plot's ε curves; it prints a line per stage and every 30 iterations.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxrdp


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="optimize_schedule.png", help="plot file (PNG)")
  parser.add_argument("--iterations", type=int, default=150)
  parser.add_argument("--phases", type=int, default=30)
  parser.add_argument("--steps-per-phase", type=int, default=100)
  parser.add_argument("--sampling-rate", type=float, default=0.01)
  parser.add_argument("--sigma", type=float, default=1.0, help="the constant baseline σ")
  parser.add_argument("--delta", type=float, default=1e-5)
  args = parser.parse_args(argv)

  with jax.enable_x64(True):
    k, n = args.phases, args.steps_per_phase
    steps = jnp.full((k,), float(n))
    q = jnp.full((k,), args.sampling_rate)
    constant = jnp.full((k,), args.sigma)
    total = k * n
    mid = (jnp.arange(k) + 0.5) * n                # middle step of each phase
    weight = steps * jnp.exp(-3.0 * (total - mid) / total)   # w_t summed over each phase

    def utility(sigma, _q):
      return jnp.sum(weight * sigma ** 2) / jnp.sum(weight)

    budget = float(jaxrdp.dpsgd_epsilon(q, constant, steps, args.delta))
    print(f"budget (constant sigma={args.sigma}): epsilon = {budget:.5f} at delta = {args.delta}; "
          f"optimising {k} phases for {args.iterations} iterations (the first compiles)",
          flush=True)
    start = time.perf_counter()

    def progress(iteration, value):
      if iteration == 1 or iteration % max(1, args.iterations // 5) == 0:
        print(f"  iteration {iteration:4d}/{args.iterations}: U = {value:.5f} "
              f"({time.perf_counter() - start:.1f} s)", flush=True)

    result = jaxrdp.optimize_schedule(utility, sampling_rate=q, noise_multiplier=constant,
                                      steps=steps, target_epsilon=budget, delta=args.delta,
                                      num_iterations=args.iterations, callback=progress)
    base_u, opt_u = float(utility(constant, q)), float(result.utility)
    print(f"optimised schedule: epsilon = {float(result.epsilon):.5f} "
          f"(<= budget: {bool(result.epsilon <= budget)})")
    print(f"utility proxy U: constant {base_u:.5f}, optimised {opt_u:.5f} "
          f"({100 * (1 - opt_u / base_u):.1f}% lower)")
    print("sigma per phase: first %.3f, middle %.3f, last %.3f" % (
        float(result.noise_multiplier[0]), float(result.noise_multiplier[k // 2]),
        float(result.noise_multiplier[-1])))

    print("epsilon after t steps of both schedules, for the plot ...", flush=True)
    at = np.linspace(n / 2, total, 40)
    eps_const = jaxrdp.epsilon_trajectory(q, constant, steps, args.delta, at)
    eps_opt = jaxrdp.epsilon_trajectory(q, result.noise_multiplier, steps, args.delta, at)
    _plot(args.out, np.arange(k) * n, np.asarray(constant), np.asarray(result.noise_multiplier),
          at, np.asarray(eps_const), np.asarray(eps_opt), base_u, opt_u, total, args.delta)
  print(f"wrote {args.out}")
  return dict(budget=budget, epsilon=float(result.epsilon), constant_utility=base_u,
              optimised_utility=opt_u)


def _plot(out, starts, constant, optimised, at, eps_const, eps_opt, base_u, opt_u, total, delta):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  edges = np.append(starts, total)
  # baseline=None: no risers down to σ = 0 at the ends.
  left.stairs(constant, edges, baseline=None, label=f"constant (U = {base_u:.3f})")
  left.stairs(optimised, edges, baseline=None, label=f"optimised (U = {opt_u:.3f})")
  left.set(xlabel="step", ylabel="noise multiplier σ", title="schedules")
  left.legend()
  right.plot(at, eps_const, label="constant")
  right.plot(at, eps_opt, label="optimised")
  right.set(xlabel="step", ylabel=f"ε at δ = {delta:g}", title="ε after t steps")
  right.legend()
  fig.tight_layout()
  fig.savefig(out, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
