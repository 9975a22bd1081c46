"""Benchmark: raw log-A throughput of the kernel on the default device (GPU where there is one).

What it measures (float32 and float64, one process, the device printed first):

* **general form**: ``jax.jit(jaxrdp.log_a)`` on N flat, independent (q, sigma, alpha) triples,
  q log-uniform in [1e-4, 0.5], sigma uniform in [0.5, 5], alpha drawn from ``DEFAULT_ORDERS``
  (every element its own order, so every element takes the general path: the certified
  quadrature at fractional orders, the exact binomial sum at integer ones);
* **curve form**: ``jax.jit(lambda q, s: jaxrdp.compute_rdp(q, s, 1, DEFAULT_ORDERS))`` on N / 170
  (q, sigma) pairs, the RDP curve at the 170 default orders (what ``sweep``, ``dpsgd_epsilon``
  and the accountants evaluate; the orders are shared, so integer orders take the binomial sum
  with tables built once).

For each: the first call (trace + compile + one run) and the median of ``--repeats`` warm calls,
as log-A evaluations per second. Sizes grow by 4x from ``--min-size`` up to ``--max-size`` and
stop once a warm call takes longer than ``--budget`` seconds. Checks printed with each row:
the count of +inf values (uncertified: expected rare or none on this box) and of other non-finite
ones (expected 0: NaN would be a bug), and for
float32 the largest relative difference against the float64 result of the same inputs (all
drawn float32-representable, orders included, so both rows compute the same function).

Run (from the repository root):

    PYTHONPATH=. python benchmarks/bench_gpu.py                    # on a GPU machine
    PYTHONPATH=. python benchmarks/bench_gpu.py --max-size 65536   # a quick look on a CPU

The sweeps of 10^6 and 10^8 configurations are ``benchmarks/bench_sweep.py --size ...``.
``--save`` / ``--json PATH`` write the figures as JSON (``benchmarks/_results.py``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

jax.config.update("jax_enable_x64", True)  # this script's choice (float64 rows); the library never sets it

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrdp  # noqa: E402
from jaxrdp.accounting import conversion  # noqa: E402

import _results  # noqa: E402

ORDERS = np.asarray(jaxrdp.DEFAULT_ORDERS).astype(np.float32).astype(np.float64)  # f32-exact


def _triples(n: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  q = 10 ** rng.uniform(-4, np.log10(0.5), n)
  sigma = rng.uniform(0.5, 5.0, n)
  alpha = rng.choice(ORDERS, n)
  # float32-representable values, so that the float32 and float64 rows take the same inputs.
  return tuple(x.astype(np.float32).astype(np.float64) for x in (q, sigma, alpha))


def _timed(fn, *args):
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - start


def _run(name, fn, make_args, n_evals, args, reference=None, rows=None):
  """First call and warm median of ``fn(*make_args())``; returns the (host) result. Appends the
  row's figures to ``rows``."""
  inputs = [jax.device_put(a) for a in make_args()]
  out, first = _timed(fn, *inputs)
  warm = [_timed(fn, *inputs)[1] for _ in range(args.repeats)]
  med = statistics.median(warm)
  out = np.asarray(out, dtype=np.float64)
  extra = (f"+inf (uncertified) {int(np.sum(np.isposinf(out)))}, "
           f"other non-finite {int(np.sum(~np.isfinite(out) & ~np.isposinf(out)))}")
  row = {"name": name, "evaluations": n_evals, "first_s": first, "warm_s": med,
         "log_a_per_s": n_evals / med, "posinf": int(np.sum(np.isposinf(out))),
         "other_non_finite": int(np.sum(~np.isfinite(out) & ~np.isposinf(out)))}
  if reference is not None:  # where both are finite (a float64 +inf is counted in its own row)
    both = np.isfinite(out) & np.isfinite(reference)
    rel = np.abs(out[both] - reference[both]) / np.maximum(np.abs(reference[both]), 1e-30)
    row.update(max_rel_diff_vs_float64=float(np.max(rel)),
               within_1e_5_vs_float64=float(np.mean(rel <= 1e-5)))
    extra += (f", vs float64: max rel diff {np.max(rel):.2e} (margin compute_epsilon adds to "
              f"float32 RDP: {conversion._RDP_REL_ERROR_FLOAT32:g}), "
              f"{np.mean(rel <= 1e-5):.4%} within 1e-5")
  print(f"  {name:<34} {n_evals:>12,} evals: first {first:7.2f} s, warm {med * 1e3:9.2f} ms "
        f"(min {min(warm) * 1e3:.2f}) = {n_evals / med:>14,.0f} log-A/s; {extra}", flush=True)
  if rows is not None:
    rows.append(row)
  return out, med


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--min-size", type=int, default=2 ** 16, help="smallest N (log-A evaluations)")
  parser.add_argument("--max-size", type=int, default=2 ** 24, help="largest N")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--budget", type=float, default=5.0,
                      help="stop growing N once a warm call takes longer than this (s)")
  _results.add_options(parser)
  args = parser.parse_args()
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")

  general = jax.jit(jaxrdp.log_a)
  curve = jax.jit(lambda q, s: jaxrdp.compute_rdp(q, s, 1, ORDERS.astype(q.dtype)))
  figures = {"general": [], "curve": []}
  for form in ("general", "curve"):
    rows = figures[form]
    print(f"{form} form ({'flat (q, sigma, alpha) triples' if form == 'general' else '170-order RDP curves'})")
    n = args.min_size
    while n <= args.max_size:
      if form == "general":
        q, s, a = _triples(n)
        ref, t64 = _run("float64 log_a", general, lambda: (q, s, a), n, args, rows=rows)
        _, t32 = _run("float32 log_a", general,
                      lambda: tuple(x.astype(np.float32) for x in (q, s, a)), n, args,
                      reference=ref, rows=rows)
      else:
        pairs = max(1, n // ORDERS.size)
        q, s, _ = _triples(pairs)
        evals = pairs * ORDERS.size
        # compute_rdp returns RDP; log A = (alpha - 1) * RDP, compared as RDP (same relative error).
        ref, t64 = _run(f"float64 compute_rdp, {pairs:,} pairs", curve, lambda: (q, s), evals,
                        args, rows=rows)
        _, t32 = _run(f"float32 compute_rdp, {pairs:,} pairs", curve,
                      lambda: (q.astype(np.float32), s.astype(np.float32)), evals, args,
                      reference=ref, rows=rows)
      if max(t64, t32) > args.budget:
        break
      n *= 4
  _results.write(args, figures)


if __name__ == "__main__":
  main()
