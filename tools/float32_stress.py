"""float32 vs float64 log A on random points of the parameter box (the figures in docs/trust.md).

Run:  PYTHONPATH=. python tools/float32_stress.py [--points 20000] [--seed 11]

The float64 kernel is itself within 2e-14 of 60-digit mpmath references
(tests/test_log_a_reference.py), so it serves as the reference here. Box: q log-uniform in
[1e-8, 1] (a fifth uniform in [0.5, 1)), sigma log-uniform in [0.1, 1e4], alpha half integers
(log-uniform in [2, 4096]) and half fractional (1 + 10^U(-3, log10 4095)); all inputs are
float32-exact. Prints the share within 1e-5 and the worst cases.
"""

import argparse

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)  # this script's choice; float32 inputs stay float32

import jaxrdp  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--points", type=int, default=20_000)
  parser.add_argument("--seed", type=int, default=11)
  args = parser.parse_args()
  rng = np.random.default_rng(args.seed)
  n = args.points
  q = (10 ** rng.uniform(-8, 0, n)).astype(np.float32)
  q[: n // 5] = rng.uniform(0.5, 1, n // 5).astype(np.float32)
  sigma = (10 ** rng.uniform(-1, 4, n)).astype(np.float32)
  alpha = np.where(rng.random(n) < 0.5, np.round(10 ** rng.uniform(0.3, np.log10(4096), n)),
                   1 + 10 ** rng.uniform(-3, np.log10(4095), n)).astype(np.float32)
  v32 = np.asarray(jaxrdp.log_a(q, sigma, alpha)).astype(np.float64)
  v64 = np.asarray(jaxrdp.log_a(q.astype(float), sigma.astype(float), alpha.astype(float)))
  normal = (v64 >= np.finfo(np.float32).tiny) & (v64 <= np.finfo(np.float32).max)
  rel = (v32 - v64) / np.where(v64 == 0, 1, v64)
  err = np.abs(rel[normal])
  print(f"points {n}, log A a normal float32 at {normal.sum()}")
  print(f"within 1e-5: {100 * np.mean(err <= 1e-5):.3f} %   worst {err.max():.3g}   "
        f"median {np.median(err):.2g}   non-finite float32 {int(np.sum(~np.isfinite(v32[normal])))}")
  print(f"float32 below float64 by more than 1e-5: {int(np.sum(rel[normal] < -1e-5))}   "
        f"lowest {rel[normal].min():.3g}")
  print("worst cases (q, sigma, alpha, log A float64, relative error):")
  for i in np.argsort(-np.where(normal, np.abs(rel), 0))[:8]:
    print(f"  {q[i]:.4g} {sigma[i]:.5g} {alpha[i]:.6g} {v64[i]:.6g} {rel[i]:+.3g}")


if __name__ == "__main__":
  main()
