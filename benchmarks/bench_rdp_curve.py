"""Benchmark: RDP curve of the Poisson-sampled Gaussian, jaxrdp vs dp_accounting.

What it measures
----------------
The RDP curve at dp_accounting's 156 default orders
(1.1, 1.2, ..., 10.9, 11, 12, ..., 63, 128, 256, 512, 1024) for ``--pairs`` random
(q, sigma) pairs (q log-uniform in [1e-4, 0.5], sigma uniform in [0.5, 5], fixed seed):

* jaxrdp: ``jaxrdp.compute_rdp(q, sigma, 1, orders)`` on the whole batch inside ``jax.jit``
  (q, sigma of shape (N,), result (N, 156)); float64 by default (this script enables
  ``jax_enable_x64``; the library itself never does). Reported: the first call
  (trace + compile + one run) separately, then the median over ``--repeats`` warm calls.
* the same curve written for one pair and batched with ``jax.jit(jax.vmap(...))`` (it must run
  the same flattened kernel: the script reports the largest relative difference, ulps);
* dp_accounting 0.6: ``_compute_rdp_poisson_subsampled_gaussian(q, sigma, orders)`` in a
  Python loop over the first ``--subset`` pairs, in the same process (median over repeats);
* dp_accelerator (if installed): ``_core.compute_epsilon_batch(q, sigma, [1], orders, 1e-5)``
  per pair on the first max(``--subset``, 200) pairs.

Both are reported in µs per pair, together with the ratio dp_accounting / jaxrdp.

Accuracy (on the subset, float64 jaxrdp vs dp_accounting):

* integer orders: max relative difference where both are finite (expected ~1e-12 or better;
  both compute the same quantity there);
* fractional orders: fraction of values with jaxrdp <= dp_accounting * (1 + 1e-12)
  (dp_accounting uses an upper bound there, jaxrdp is exact, so this should be 1.0);
* count of non-finite values in each (dp_accounting returns inf at fractional orders where its
  series does not converge; its warnings about that are silenced).

dp_accounting computes log A (= (order - 1) * RDP) directly, so where A is close to 1 (small
q) its float64 rounding of log A (~1e-14 absolute) costs relative accuracy of the RDP (up to
~1e-10 or worse), at integer and fractional orders alike. Two extra rows therefore compare
log A instead: at integer orders max |delta log A| / max(1, |log A|) (expected ~1e-13 or
better), and at fractional orders the check allowing |delta log A| <= 1e-13.

With ``--float32`` the timed jaxrdp run is in float32, and the max relative difference of
the float32 result vs the float64 jaxrdp result (all pairs) is reported as well.

How to run (from the repository root)
-------------------------------------
    PYTHONPATH=. python benchmarks/bench_rdp_curve.py
    PYTHONPATH=. python benchmarks/bench_rdp_curve.py --pairs 200 --subset 10 --repeats 3
    PYTHONPATH=. python benchmarks/bench_rdp_curve.py --float32

The last line printed is ``RATIO dp_accounting/jaxrdp = <x>x`` (per-pair time ratio).
``--save`` / ``--json PATH`` write the figures as JSON (``benchmarks/_results.py``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import statistics
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)  # before any array is created

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from dp_accounting.rdp.rdp_privacy_accountant import (  # noqa: E402
    _compute_rdp_poisson_subsampled_gaussian)

import jaxrdp  # noqa: E402

import _results  # noqa: E402

try:  # dp_accounting logs a warning per non-converged fractional order (it returns inf there);
  from absl import logging as absl_logging  # those show up as its non-finite count instead.
  absl_logging.set_verbosity(absl_logging.ERROR)
except ImportError:  # pragma: no cover
  pass

# dp_accounting's default orders (RdpAccountant), 156 of them.
ORDERS = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64))
                  + [128, 256, 512, 1024], dtype=np.float64)
FRACTIONAL_TOL = 1e-12
# dp_accounting computes log A_alpha (~ (alpha-1) * RDP) directly in float64, so where A ~ 1 its
# log A carries an absolute rounding error of ~1e-14 and RDP values of 1e-8 lose digits. The
# "rounding-aware" rows below measure the difference in log A instead: at integer orders
# |delta log A| / max(1, |log A|), at fractional orders allowing |delta log A| <= LOG_A_ATOL.
LOG_A_ATOL = 1e-13


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--pairs", type=int, default=2000, help="number of (q, sigma) pairs for jaxrdp")
  p.add_argument("--subset", type=int, default=40,
                 help="number of pairs (the first ones) also run through dp_accounting")
  p.add_argument("--repeats", type=int, default=5, help="warm repeats; the median is reported")
  p.add_argument("--seed", type=int, default=0, help="seed of the random (q, sigma) pairs")
  p.add_argument("--float32", action="store_true",
                 help="time jaxrdp in float32 (and compare it with the float64 result)")
  _results.add_options(p)
  args = p.parse_args(argv)
  if args.pairs < 1 or args.repeats < 1 or args.subset < 0:
    p.error("--pairs and --repeats must be >= 1, --subset >= 0")
  args.subset = min(args.subset, args.pairs)
  return args


def make_pairs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """q log-uniform in [1e-4, 0.5], sigma uniform in [0.5, 5] (float64)."""
  rng = np.random.default_rng(seed)
  q = np.exp(rng.uniform(np.log(1e-4), np.log(0.5), size=n))
  sigma = rng.uniform(0.5, 5.0, size=n)
  return q, sigma


def time_jaxrdp(q: np.ndarray, sigma: np.ndarray, dtype, repeats: int, vmap: bool = False):
  """Return (result as float64 numpy, first-call seconds, list of warm seconds). With
  ``vmap``, the curve of one pair is written for scalars and batched by jax.jit(jax.vmap(.))."""
  orders = jnp.asarray(ORDERS, dtype=dtype)
  if vmap:
    fn = jax.jit(jax.vmap(lambda q_, s_: jaxrdp.compute_rdp(q_, s_, 1, orders)))
  else:
    fn = jax.jit(lambda q_, s_: jaxrdp.compute_rdp(q_, s_, 1, orders))
  q_dev = jax.device_put(jnp.asarray(q, dtype=dtype))
  s_dev = jax.device_put(jnp.asarray(sigma, dtype=dtype))

  t0 = time.perf_counter()
  out = fn(q_dev, s_dev).block_until_ready()
  first = time.perf_counter() - t0
  assert out.shape == (len(q), len(ORDERS)), out.shape
  assert out.dtype == dtype, f"expected {dtype}, got {out.dtype}"

  warm = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn(q_dev, s_dev).block_until_ready()
    warm.append(time.perf_counter() - t0)
  return np.asarray(out, dtype=np.float64), first, warm


def time_dp_accounting(q: np.ndarray, sigma: np.ndarray, repeats: int):
  """Return (result (n, 156), list of seconds for the whole loop over the n pairs)."""
  orders = list(ORDERS)
  times, out = [], None
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = [_compute_rdp_poisson_subsampled_gaussian(float(qi), float(si), orders)
           for qi, si in zip(q, sigma)]
    times.append(time.perf_counter() - t0)
  return np.asarray(out, dtype=np.float64).reshape(len(q), len(ORDERS)), times


def time_dp_accelerator(q: np.ndarray, sigma: np.ndarray, repeats: int):
  """dp_accelerator (Rust port of dp_accounting's RDP): seconds per loop over the pairs, or None
  if it is not installed. ``_core.compute_epsilon_batch(q, sigma, [T], orders, delta)``
  computes the 156-order curve and its ε, per pair."""
  try:
    from dp_accelerator import _core
  except ImportError:
    return None
  orders = [float(o) for o in ORDERS]
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for qi, si in zip(q, sigma):
      _core.compute_epsilon_batch(float(qi), float(si), [1], orders, 1e-5)
    times.append(time.perf_counter() - t0)
  return times


def max_rel_diff(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
  """Max |a-b| / max(|a|,|b|) where both are finite (0/0 counts as 0); and #both finite."""
  both = np.isfinite(a) & np.isfinite(b)
  if not both.any():
    return float("nan"), 0
  a, b = a[both], b[both]
  scale = np.maximum(np.abs(a), np.abs(b))
  with np.errstate(invalid="ignore", divide="ignore"):
    rel = np.where(scale > 0, np.abs(a - b) / scale, 0.0)
  return float(rel.max()), int(both.sum())


def row(label: str, value: str) -> str:
  return f"  {label:<64s} {value}"


def main(argv=None) -> None:
  args = parse_args(argv)
  dtype = jnp.float32 if args.float32 else jnp.float64
  dtype_name = "float32" if args.float32 else "float64"

  print("=== environment ===")
  print(f"python {platform.python_version()}, jax {jax.__version__}, "
        f"jaxlib {importlib.metadata.version('jaxlib')}, numpy {np.__version__}, "
        f"dp_accounting {importlib.metadata.version('dp_accounting')}, "
        f"jaxrdp {jaxrdp.__version__}")
  print(f"jax.devices(): {jax.devices()}")
  print(f"pairs={args.pairs} subset={args.subset} repeats={args.repeats} seed={args.seed} "
        f"jaxrdp dtype={dtype_name} orders={len(ORDERS)}")
  sys.stdout.flush()

  q, sigma = make_pairs(args.pairs, args.seed)
  int_mask = ORDERS == np.round(ORDERS)

  # --- jaxrdp, all pairs ---
  rdp_jax, first, warm = time_jaxrdp(q, sigma, dtype, args.repeats)
  jax_med = statistics.median(warm)
  jax_us = jax_med / args.pairs * 1e6

  rdp_vmap, first_vmap, warm_vmap = time_jaxrdp(q, sigma, dtype, args.repeats, vmap=True)
  vmap_us = statistics.median(warm_vmap) / args.pairs * 1e6
  both = np.isfinite(rdp_vmap) & np.isfinite(rdp_jax) & (rdp_jax != 0)
  vmap_rel = float(np.max(np.abs(rdp_vmap[both] / rdp_jax[both] - 1), initial=0.0))
  vmap_equal = bool(np.array_equal(np.isfinite(rdp_vmap), np.isfinite(rdp_jax)))
  dpx_times = time_dp_accelerator(q[:max(args.subset, 200)], sigma[:max(args.subset, 200)], args.repeats)
  dpx_us = (statistics.median(dpx_times) / min(args.pairs, max(args.subset, 200)) * 1e6
            if dpx_times else float("nan"))

  rdp_jax64 = rdp_jax
  if args.float32:  # float64 reference for the accuracy checks (not timed against dp_accounting)
    rdp_jax64, _, _ = time_jaxrdp(q, sigma, jnp.float64, 1)

  # --- dp_accounting, subset ---
  if args.subset:
    rdp_dpa, dpa_times = time_dp_accounting(q[:args.subset], sigma[:args.subset], args.repeats)
    dpa_med = statistics.median(dpa_times)
    dpa_us = dpa_med / args.subset * 1e6
  else:
    rdp_dpa, dpa_med, dpa_us = None, float("nan"), float("nan")
  ratio = dpa_us / jax_us

  # --- summary ---
  print()
  print("=== timing ===")
  print(row(f"jaxrdp {dtype_name} first call (trace+compile+1 run)", f"{first:10.3f} s"))
  print(row(f"jaxrdp {dtype_name} warm, median of {args.repeats}, {args.pairs} pairs",
            f"{jax_med:10.4f} s   (min {min(warm):.4f} s, max {max(warm):.4f} s)"))
  print(row("jaxrdp per pair", f"{jax_us:10.1f} µs"))
  print(row(f"dp_accounting median of {args.repeats}, {args.subset} pairs", f"{dpa_med:10.4f} s"))
  print(row("dp_accounting per pair", f"{dpa_us:10.1f} µs"))
  print(row("ratio dp_accounting / jaxrdp (per pair)", f"{ratio:10.2f} x"))
  print(row(f"jaxrdp {dtype_name} jit(vmap) first call (trace+compile+1 run)", f"{first_vmap:10.3f} s"))
  print(row("jaxrdp jit(vmap) per pair", f"{vmap_us:10.1f} µs   (vs arrays: max rel. diff {vmap_rel:.1e}, same non-finite: {vmap_equal})"))
  print(row("dp_accelerator per pair (up to 200 pairs)", f"{dpx_us:10.1f} µs"))
  print(row("ratio dp_accelerator / jaxrdp arrays, jit(vmap)",
            f"{dpx_us / jax_us:10.2f} x, {dpx_us / vmap_us:.2f} x"))
  print(row("ratio dp_accounting / jaxrdp jit(vmap)", f"{dpa_us / vmap_us:10.2f} x"))

  figures = {
      "dtype": dtype_name, "pairs": args.pairs, "orders": len(ORDERS),
      "timing": {"jaxrdp_first_s": first, "jaxrdp_warm_s": jax_med, "jaxrdp_us_per_pair": jax_us,
                 "jaxrdp_vmap_first_s": first_vmap, "jaxrdp_vmap_us_per_pair": vmap_us,
                 "dp_accounting_pairs": args.subset, "dp_accounting_us_per_pair": dpa_us,
                 "dp_accelerator_us_per_pair": dpx_us},
      "ratios": {"dp_accounting_over_jaxrdp": ratio,
                 "dp_accounting_over_jaxrdp_vmap": dpa_us / vmap_us,
                 "dp_accelerator_over_jaxrdp": dpx_us / jax_us,
                 "dp_accelerator_over_jaxrdp_vmap": dpx_us / vmap_us,
                 "goal_dp_accounting": 200.0, "goal_dp_accelerator": 5.0},
      "vmap_vs_arrays": {"max_rel_diff": vmap_rel, "same_non_finite": vmap_equal},
      "accuracy": {"non_finite_jaxrdp_all_pairs": int((~np.isfinite(rdp_jax)).sum())},
  }

  print()
  print("=== accuracy (subset; jaxrdp float64 vs dp_accounting) ===")
  if rdp_dpa is not None:
    sub = rdp_jax64[:args.subset]
    rel_int, n_int = max_rel_diff(sub[:, int_mask], rdp_dpa[:, int_mask])
    frac_j, frac_d = sub[:, ~int_mask], rdp_dpa[:, ~int_mask]
    # Difference in log A = (order - 1) * RDP, relative where |log A| > 1, absolute below.
    log_a_j = sub[:, int_mask] * (ORDERS[int_mask] - 1)
    log_a_d = rdp_dpa[:, int_mask] * (ORDERS[int_mask] - 1)
    fin = np.isfinite(log_a_j) & np.isfinite(log_a_d)
    mixed = np.abs(log_a_j - log_a_d)[fin] / np.maximum(1.0, np.abs(log_a_d[fin]))
    mixed_max = float(mixed.max()) if mixed.size else float("nan")
    both = np.isfinite(frac_j) & np.isfinite(frac_d)
    bound = frac_d * (1 + FRACTIONAL_TOL)
    ok = frac_j[both] <= bound[both]
    ok_atol = frac_j[both] <= (bound + LOG_A_ATOL / (ORDERS[~int_mask] - 1))[both]
    rel_frac, _ = max_rel_diff(frac_j, frac_d)
    print(row(f"integer orders ({int_mask.sum()}): max rel. diff (both finite)",
              f"{rel_int:10.3e}   over {n_int} values"))
    print(row("  max |delta log A| / max(1, |log A|) (dpa rounding scale)",
              f"{mixed_max:10.3e}"))
    print(row(f"fractional orders ({(~int_mask).sum()}): jaxrdp <= dpa*(1+{FRACTIONAL_TOL:g})",
              f"{ok.mean() if ok.size else float('nan'):10.4f}   ({int(ok.sum())}/{ok.size} values)"))
    print(row(f"  same, allowing |delta log A| <= {LOG_A_ATOL:g} (dpa rounding)",
              f"{ok_atol.mean() if ok.size else float('nan'):10.4f}   "
              f"({int(ok_atol.sum())}/{ok.size} values)"))
    print(row("fractional orders: max rel. diff (mostly dpa's over-estimate)", f"{rel_frac:10.3e}"))
    print(row("non-finite values, jaxrdp float64 (subset)",
              f"{int((~np.isfinite(sub)).sum()):10d}   of {sub.size}"))
    print(row("non-finite values, dp_accounting (subset)",
              f"{int((~np.isfinite(rdp_dpa)).sum()):10d}   of {rdp_dpa.size}"))
    figures["accuracy"].update(
        integer_orders_max_rel_diff=rel_int, integer_orders_max_log_a_diff=mixed_max,
        fractional_orders_at_most_dp_accounting=float(ok.mean()) if ok.size else None,
        fractional_orders_at_most_dp_accounting_log_a_atol=(
            float(ok_atol.mean()) if ok.size else None),
        fractional_orders_max_rel_diff=rel_frac,
        non_finite_jaxrdp_subset=int((~np.isfinite(sub)).sum()),
        non_finite_dp_accounting_subset=int((~np.isfinite(rdp_dpa)).sum()))
  else:
    print("  (skipped: --subset 0)")
  print(row(f"non-finite values, jaxrdp {dtype_name} (all {args.pairs} pairs)",
            f"{int((~np.isfinite(rdp_jax)).sum()):10d}   of {rdp_jax.size}"))
  if args.float32:
    rel32, n32 = max_rel_diff(rdp_jax, rdp_jax64)
    print(row("float32 vs float64 jaxrdp: max rel. diff (all pairs)",
              f"{rel32:10.3e}   over {n32} values"))
    figures["accuracy"]["float32_vs_float64_max_rel_diff"] = rel32

  print()
  print(f"RATIO dp_accelerator/jaxrdp = {dpx_us / jax_us:.2f}x arrays, {dpx_us / vmap_us:.2f}x jit(vmap) (goal >= 5x)")
  print(f"RATIO dp_accounting/jaxrdp = {ratio:.1f}x arrays, {dpa_us / vmap_us:.1f}x jit(vmap) (goal >= 200x)")
  _results.write(args, figures)


if __name__ == "__main__":
  main()
