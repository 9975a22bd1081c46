"""Bounded memory at scale: RDP for 10^6 (q, sigma) pairs and for 10^5 orders.

Run:  PYTHONPATH=. python benchmarks/bench_scale.py [--pairs 1000000] [--orders 100000] [--save]

Prints wall time (including compilation) and the process's peak resident memory after each
part. The kernel runs its whole pipeline one batch of 65,536 elements at a time, so memory
grows with the output only. ``--save`` / ``--json PATH`` write the figures as JSON
(``benchmarks/_results.py``).
"""

import argparse
import resource
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)  # this script's choice; the library never sets it

import jaxrdp  # noqa: E402

import _results  # noqa: E402


def peak_gib():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pairs", type=int, default=1_000_000)
  parser.add_argument("--orders", type=int, default=100_000)
  _results.add_options(parser)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  q = 10 ** rng.uniform(-4, np.log10(0.5), args.pairs)
  sigma = rng.uniform(0.5, 5, args.pairs)
  start = time.perf_counter()
  rdp = np.asarray(jaxrdp.compute_rdp(q, sigma, 1000, 8.0))
  pairs = {"pairs": args.pairs, "orders": 1, "s": time.perf_counter() - start,
           "non_finite": int(np.sum(~np.isfinite(rdp))), "peak_rss_gib": peak_gib()}
  print(f"{args.pairs:,} pairs x 1 order: {pairs['s']:.1f} s, "
        f"non-finite {pairs['non_finite']}, peak RSS {pairs['peak_rss_gib']:.2f} GiB")
  orders = np.linspace(1.0, 100.0, args.orders)
  start = time.perf_counter()
  rdp = np.asarray(jaxrdp.compute_rdp(0.01, 1.1, 1000, orders))
  curve = {"pairs": 1, "orders": args.orders, "s": time.perf_counter() - start,
           "non_finite": int(np.sum(~np.isfinite(rdp))), "peak_rss_gib": peak_gib()}
  print(f"1 pair x {args.orders:,} orders: {curve['s']:.1f} s, "
        f"non-finite {curve['non_finite']}, peak RSS {curve['peak_rss_gib']:.2f} GiB")
  _results.write(args, {"many_pairs": pairs, "many_orders": curve})


if __name__ == "__main__":
  main()
