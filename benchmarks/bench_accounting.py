"""Benchmark: schedule accounting and calibration, jaxrdp vs dp_accounting (and Opacus).

What it measures (all in one process, float64, dp_accounting's 156 default orders for both)
------------------------------------------------------------------------------------------
1. **Per-step schedule.** ε of a ``--steps``-step DP-SGD run (default 10,000) with a different
   noise multiplier at every step (σ_t linear from 0.8 to 1.5, q = 0.01, δ = 1e-5):

   * jaxrdp: ``jaxrdp.dpsgd_epsilon(q, sigma_schedule, 1, delta, orders=...)`` (jitted
     internally; first call reported separately, then the median of ``--repeats`` warm calls),
     with and without the continuous refinement of the order;
   * dp_accounting: ``RdpAccountant.compose(PoissonSampledDpEvent(q, GaussianDpEvent(σ_t)))``
     for each step, then ``get_epsilon(delta)``. dp_accounting's cost is linear in the number
     of events, so by default it runs on the first ``--subset`` steps and its time is scaled
     to the full schedule (``--subset 0`` runs all of them; expect minutes). Accuracy is
     compared on that prefix (jaxrdp on the same prefix, grid orders).

2. **Calibration** of σ for (ε = 2, δ = 1e-5, q = 0.01, T = 10,000):
   jaxrdp ``calibrate_noise_multiplier`` (warm) vs dp_accounting ``calibrate_dp_mechanism``
   with ``RdpAccountant`` (default tolerance) vs Opacus ``get_noise_multiplier``
   (``accountant="rdp"``, default ``epsilon_tolerance=0.01``) when Opacus is installed.
   Medians of ``--repeats``; the σ each returns and the ε of that σ (dp_accounting's RDP) are
   printed: a σ with ε above the target is unsafe.

3. **Whole process**: wall time of ``python -m jaxrdp calibrate ...`` (fresh process; with
   the persistent compilation cache emptied first, then warm) against an equivalent
   ``python -c`` running dp_accounting's calibration.

Run (from the repository root):

    PYTHONPATH=. python benchmarks/bench_accounting.py
    PYTHONPATH=. python benchmarks/bench_accounting.py --steps 2000 --subset 100 --repeats 3

Lines starting with ``RATIO`` are the headline ratios (dp_accounting time / jaxrdp time).
``--save`` / ``--json PATH`` write the figures as JSON (``benchmarks/_results.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import dp_accounting  # noqa: E402
from dp_accounting import rdp as dp_rdp  # noqa: E402

import jaxrdp  # noqa: E402

import _results  # noqa: E402

DP_ORDERS = np.array(dp_rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=float) \
    if hasattr(dp_rdp.rdp_privacy_accountant, "DEFAULT_RDP_ORDERS") else None


def _orders():
  if DP_ORDERS is not None:
    return DP_ORDERS
  return np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024],
                  dtype=float)


def _timed(fn, repeats):
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return out, first, statistics.median(times)


def _dp_event(q, sigma):
  return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))


def bench_schedule(args, orders, figures):
  q, delta, n = 0.01, 1e-5, args.steps
  sigmas = np.linspace(0.8, 1.5, n)
  print(f"\n== per-step schedule: {n} steps, sigma 0.8 -> 1.5, q = {q}, delta = {delta}, "
        f"{len(orders)} orders")
  eps_ref, first, warm = _timed(lambda: jaxrdp.dpsgd_epsilon(q, sigmas, 1, delta, orders=orders),
                                args.repeats)
  eps_grid, first_g, warm_g = _timed(
      lambda: jaxrdp.dpsgd_epsilon(q, sigmas, 1, delta, orders=orders, refine_order=False),
      args.repeats)
  print(f"jaxrdp refined order: eps = {float(eps_ref):.6f}  first call {first:.2f} s, "
        f"warm {warm:.3f} s")
  print(f"jaxrdp grid orders  : eps = {float(eps_grid):.6f}  first call {first_g:.2f} s, "
        f"warm {warm_g:.3f} s")

  m = n if args.subset <= 0 else min(args.subset, n)
  times = []
  for _ in range(max(1, args.dp_repeats)):
    start = time.perf_counter()
    acc = dp_rdp.RdpAccountant(list(orders))
    for s in sigmas[:m]:
      acc.compose(_dp_event(q, float(s)))
    eps_dp_prefix = acc.get_epsilon(delta)
    times.append(time.perf_counter() - start)
  dp_time = statistics.median(times) * n / m
  eps_jx_prefix = float(jaxrdp.dpsgd_epsilon(q, sigmas[:m], 1, delta, orders=orders,
                                             refine_order=False))
  scaled = "" if m == n else f" (timed on the first {m} steps, scaled x{n / m:g})"
  print(f"dp_accounting       : {dp_time:.2f} s for {n} steps{scaled}")
  print(f"eps on the first {m} steps: dp_accounting {eps_dp_prefix:.6f}, jaxrdp (grid) "
        f"{eps_jx_prefix:.6f}, rel diff {(eps_jx_prefix - eps_dp_prefix) / eps_dp_prefix:+.2e}")
  print(f"RATIO schedule dp_accounting/jaxrdp = {dp_time / warm:.1f}x (refined), "
        f"{dp_time / warm_g:.1f}x (grid)")
  figures["schedule"] = {
      "steps": n, "orders": len(orders), "dp_accounting_steps": m,
      "jaxrdp_refined": {"epsilon": float(eps_ref), "first_s": first, "warm_s": warm},
      "jaxrdp_grid": {"epsilon": float(eps_grid), "first_s": first_g, "warm_s": warm_g},
      "dp_accounting_s": dp_time,
      "prefix_epsilon": {"dp_accounting": eps_dp_prefix, "jaxrdp_grid": eps_jx_prefix},
      "ratio_dp_accounting_over_jaxrdp_refined": dp_time / warm,
      "ratio_dp_accounting_over_jaxrdp_grid": dp_time / warm_g}


def bench_calibration(args, orders, figures):
  target, delta, q, steps = 2.0, 1e-5, 0.01, 10_000
  print(f"\n== calibration of sigma: eps = {target}, delta = {delta}, q = {q}, T = {steps}")
  sigma_jx, first, warm = _timed(
      lambda: jaxrdp.calibrate_noise_multiplier(target, delta, q, steps, orders=orders), args.repeats)

  def eps_dp(sigma):
    acc = dp_rdp.RdpAccountant(list(orders))
    acc.compose(_dp_event(q, sigma), steps)
    return acc.get_epsilon(delta)

  make_event = lambda s: dp_accounting.SelfComposedDpEvent(_dp_event(q, s), steps)
  make_acc = lambda: dp_rdp.RdpAccountant(list(orders))
  times = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    sigma_dp = dp_accounting.calibrate_dp_mechanism(make_acc, make_event, target, delta)
    times.append(time.perf_counter() - start)
  dp_time = statistics.median(times)
  print(f"jaxrdp        : sigma = {float(sigma_jx):.8f} (eps {eps_dp(float(sigma_jx)):.8f})  "
        f"first {first:.2f} s, warm {warm * 1e3:.1f} ms")
  print(f"dp_accounting : sigma = {sigma_dp:.8f} (eps {eps_dp(sigma_dp):.8f})  {dp_time * 1e3:.1f} ms")
  print(f"RATIO calibration dp_accounting/jaxrdp = {dp_time / warm:.1f}x")
  calibration = figures["calibration"] = {
      "jaxrdp": {"sigma": float(sigma_jx), "epsilon": eps_dp(float(sigma_jx)), "first_s": first,
                 "warm_s": warm},
      "dp_accounting": {"sigma": sigma_dp, "epsilon": eps_dp(sigma_dp), "s": dp_time},
      "ratio_dp_accounting_over_jaxrdp": dp_time / warm}
  try:
    from opacus.accountants.utils import get_noise_multiplier
  except ImportError:
    print("opacus not installed: skipped")
    return
  times = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    sigma_op = get_noise_multiplier(target_epsilon=target, target_delta=delta, sample_rate=q,
                                    steps=steps, accountant="rdp")
    times.append(time.perf_counter() - start)
  op_time = statistics.median(times)
  print(f"opacus        : sigma = {sigma_op:.8f} (eps {eps_dp(sigma_op):.8f})  {op_time * 1e3:.1f} ms")
  print(f"RATIO calibration opacus/jaxrdp = {op_time / warm:.1f}x")
  calibration["opacus"] = {"sigma": sigma_op, "epsilon": eps_dp(sigma_op), "s": op_time}
  calibration["ratio_opacus_over_jaxrdp"] = op_time / warm


def bench_process(figures):
  print("\n== whole process: calibrate sigma for eps = 2, delta = 1e-5, q = 0.01, T = 10,000")
  cache = tempfile.mkdtemp(prefix="jaxrdp-cache-")
  env = dict(os.environ, JAXRDP_CACHE_DIR=cache)
  cli = [sys.executable, "-m", "jaxrdp", "calibrate", "--epsilon", "2", "--delta", "1e-5",
         "--sampling-rate", "0.01", "--steps", "10000"]
  script = ("import dp_accounting as d; from dp_accounting import rdp;"
            "ev=lambda s: d.SelfComposedDpEvent(d.PoissonSampledDpEvent(0.01, d.GaussianDpEvent(s)), 10000);"
            "print(d.calibrate_dp_mechanism(rdp.RdpAccountant, ev, 2.0, 1e-5))")
  results = {}
  for name, cmd in (("jaxrdp (empty cache)", cli), ("jaxrdp (warm cache)", cli),
                    ("dp_accounting", [sys.executable, "-c", script])):
    start = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    results[name] = time.perf_counter() - start
    print(f"{name:22s}: {results[name]:.2f} s  -> {out.stdout.strip().splitlines()[-1]}")
  shutil.rmtree(cache, ignore_errors=True)
  for name in ("jaxrdp (empty cache)", "jaxrdp (warm cache)"):
    print(f"RATIO process dp_accounting/{name} = {results['dp_accounting'] / results[name]:.2f}x")
  figures["process"] = {
      "jaxrdp_empty_cache_s": results["jaxrdp (empty cache)"],
      "jaxrdp_warm_cache_s": results["jaxrdp (warm cache)"],
      "dp_accounting_s": results["dp_accounting"],
      "ratio_dp_accounting_over_jaxrdp_empty_cache":
          results["dp_accounting"] / results["jaxrdp (empty cache)"],
      "ratio_dp_accounting_over_jaxrdp_warm_cache":
          results["dp_accounting"] / results["jaxrdp (warm cache)"]}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=10_000)
  parser.add_argument("--subset", type=int, default=500,
                      help="steps dp_accounting composes (scaled to --steps); 0 = all")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--dp-repeats", type=int, default=1)
  parser.add_argument("--skip-process", action="store_true")
  _results.add_options(parser)
  args = parser.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()}, dp_accounting "
        f"{getattr(dp_accounting, '__version__', '?')}")
  orders = _orders()
  figures = {}
  bench_schedule(args, orders, figures)
  bench_calibration(args, orders, figures)
  if not args.skip_process:
    bench_process(figures)
  _results.write(args, figures)


if __name__ == "__main__":
  main()
