"""Benchmark: the PLD accountant (``jaxrdp.pld_epsilon``) against dp_accounting's PLDAccountant.

What it measures (float64, loss grid interval Δ = 1e-4 for both, one process unless noted)
-----------------------------------------------------------------------------------------
1. **Warm ε** for three single-phase configurations (q, σ, T, δ) = (0.01, 1.1, 10,000, 1e-5),
   (0.001, 0.8, 30,000, 1e-8), (0.01, 1.0, 50,000, 1e-6):

   * jaxrdp jitted: ``f = jax.jit(lambda q, s, t, d: pld_epsilon(q, s, t, d, pld_grid=g))``
     with ``g = pld_grid(q, σ, T, delta=δ)`` made once (the grid sized for reading ε at δ,
     the one ``pld_epsilon`` sizes for itself); its trace + lowering and its compilation are
     timed apart (``f.lower(...)``, ``.compile()``), then one warm-up call, then
     ``f(...).block_until_ready()`` per repeat;
   * jaxrdp eager: ``pld_epsilon(q, σ, T, δ)`` from its second call on (host-side grid sizing,
     argument checks and dispatch included);
   * dp_accounting: per query, the whole of ``PLDAccountant(value_discretization_interval=1e-4)``,
     ``compose(PoissonSampledDpEvent(q, GaussianDpEvent(σ)), T)`` and ``get_epsilon(δ)``
     (what a user runs for one ε).

   The three are interleaved per repeat; medians of ``--repeats``. Printed: the times, both
   ε and their relative difference, the ratios dp_accounting / jaxrdp. Goal: ≥ 10× (jitted).

2. **First call**, in a fresh process per repeat with an empty ``HOME`` / ``XDG_CACHE_HOME``, no
   ``JAX_COMPILATION_CACHE_DIR``, ``JAXRDP_CACHE_DIR=""`` and ``JAX_PLATFORMS=cpu`` (as in
   bench_latency.py: no compilation cache of any kind): the first
   ``pld_epsilon(0.01, 1.1, 10_000, 1e-5)`` after the imports (grid sizing, trace, compile,
   run), and the whole process's wall time. Goal: first call ≤ 3 s (median).

3. **Phased schedule**: ``--phases`` phases (default 100) of ``--steps-per-phase`` steps
   (default 100), σ linear from 0.8 to 1.6, q = 0.01, δ = 1e-5. jaxrdp jitted with a grid for
   the schedule and δ (pld_grid's host time printed apart) vs dp_accounting composing the phases'
   events one by one (``--dp-repeats`` runs, default 1: about 45 s each on 2 CPU cores).

4. **Sweep** (where ``jax.default_backend() == "gpu"``; skipped on CPU unless ``--sweep-size``
   is given): ``jax.jit(jax.vmap(...))`` of ``pld_epsilon`` over a q × σ grid (q log-spaced
   in [1e-3, 1e-2], σ in [0.8, 2.0], T = 10,000, δ = 1e-5; default 10⁴ configurations), one
   grid for all (the largest sizes over the box's four corners), in chunks of ``--sweep-batch``
   configurations (default: as many as fit in ~40 % of the device memory, from XLA's memory
   analysis of a small batch). Prints the first pass (compilation included) and a warm pass,
   configurations/s, and a check of ``--sweep-samples`` cells against ``pld_epsilon`` with
   each cell's own grid. On a GPU, parts 1 and 3 run there too (dp_accounting on the CPU).

5. **Gradient memory**: in a fresh process per phase count (``--memory-phases``, default 20,
   80, 160), ``jax.jit(jax.value_and_grad(lambda s: pld_epsilon(q, s, T, δ, pld_grid=g)))``
   over that many phases (q = 0.01, σ drawn in [0.9, 1.2], seed 0, 10 steps each, δ = 1e-5, g
   sized for the schedule): the process's peak resident memory, XLA's working memory for the
   program (``memory_analysis().temp_size_in_bytes``), the first call and a warm call. The
   passes over the phases run sub-chunk by sub-chunk under ``jax.checkpoint``, so the working
   memory grows with the phases only by the step PMFs kept between passes.

How to run (from the repository root; about 2 minutes on 2 CPU cores)::

    PYTHONPATH=. python benchmarks/bench_pld.py [--repeats 5]
    PYTHONPATH=. python benchmarks/bench_pld.py --repeats 3 --skip-phased --sweep-size 100

Lines starting with ``GOAL`` compare medians with the issue's goals; ``RATIO`` lines are the
other dp_accounting / jaxrdp figures. Results depend on the machine: the devices and the
library versions are printed first. ``--save`` / ``--json PATH`` write the figures as JSON
(``benchmarks/_results.py``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import statistics
import time

import jax

jax.config.update("jax_enable_x64", True)  # the PLD accountant is float64 only

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import dp_accounting  # noqa: E402
from dp_accounting.pld import pld_privacy_accountant  # noqa: E402

from jaxrdp.accounting import pld  # noqa: E402

# A fresh process with no compilation cache of any kind, as bench_latency.py launches them.
from bench_latency import _run  # noqa: E402  (this script's folder is on sys.path)
import _results  # noqa: E402

INTERVAL = 1e-4
CONFIGS = ((0.01, 1.1, 10_000, 1e-5), (0.001, 0.8, 30_000, 1e-8), (0.01, 1.0, 50_000, 1e-6))
WARM_GOAL = 10.0          # dp_accounting / jaxrdp (jitted, warm), at least
FIRST_CALL_GOAL = 3.0     # seconds, at most
AGREEMENT = 1e-4          # relative difference of the two ε accepted as agreement

_FIRST_CALL = """
import json, time
start = time.perf_counter()
import jax
jax.config.update("jax_enable_x64", True)
from jaxrdp.accounting import pld
imported = time.perf_counter()
eps = pld.pld_epsilon(0.01, 1.1, 10_000, 1e-5).block_until_ready()
first = time.perf_counter()
pld.pld_epsilon(0.01, 1.1, 10_000, 1e-5).block_until_ready()
second = time.perf_counter()
print(json.dumps({"imports": imported - start, "first": first - imported,
                  "second": second - first, "eps": float(eps)}))
"""


_MEMORY = """
import json, resource, sys, time
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
from jaxrdp.accounting import pld
phases = int(sys.argv[1])
q = np.full(phases, 0.01)
sigma = np.random.default_rng(0).uniform(0.9, 1.2, phases)
t = np.full(phases, 10.0)
grid = pld.pld_grid(q, sigma, t, delta=1e-5)
f = jax.jit(jax.value_and_grad(lambda s: pld.pld_epsilon(q, s, t, 1e-5, pld_grid=grid)))
temp = f.lower(jnp.asarray(sigma)).compile().memory_analysis().temp_size_in_bytes
start = time.perf_counter()
jax.block_until_ready(f(jnp.asarray(sigma)))
first = time.perf_counter()
value, _ = jax.block_until_ready(f(jnp.asarray(sigma)))
warm = time.perf_counter() - first
print(json.dumps({"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "temp_bytes": temp, "first_s": first - start, "warm_s": warm,
                  "epsilon": float(value), "pmf_bins": grid.pmf_bins, "bins": grid.bins}))
"""


# ---------------------------------------------------------------------------------------------
# Helpers.


def _timed(fn):
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - start


def _dp_event(q, sigma):
  return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))


def _dp_epsilon(phases, delta):
  """dp_accounting's ε of [(q, σ, T), ...]: the accountant made, the phases composed, read."""
  acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=INTERVAL)
  for q, sigma, steps in phases:
    acc.compose(_dp_event(float(q), float(sigma)), int(steps))
  return acc.get_epsilon(delta)


def _jitted(grid):
  return jax.jit(lambda q, s, t, d: pld.pld_epsilon(q, s, t, d, pld_grid=grid))


def _aot(f, *args):
  """Times f's trace + lowering and its compilation (AOT); returns (lower_s, compile_s)."""
  start = time.perf_counter()
  lowered = f.lower(*args)
  lowered_at = time.perf_counter()
  lowered.compile()
  return lowered_at - start, time.perf_counter() - lowered_at


def _rel(a, b):
  return (float(a) - float(b)) / float(b)


def _ms(seconds):
  return f"{1e3 * seconds:.1f} ms"


def _grid_text(grid):
  return f"pmf_bins {grid.pmf_bins:,}, bins {grid.bins:,}"


def _version(name):
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return "?"


# ---------------------------------------------------------------------------------------------
# 1. Warm ε against dp_accounting.


def bench_warm(args, figures):
  print(f"\n== 1. warm eps, jaxrdp (jit / eager) vs dp_accounting PLDAccountant, interval "
        f"{INTERVAL:g}, medians of {args.repeats}")
  for q, sigma, steps, delta in CONFIGS:
    name = f"q={q:g} sigma={sigma:g} T={steps:,} delta={delta:g}"
    grid, grid_s = _timed(lambda: pld.pld_grid(q, sigma, steps, interval=INTERVAL, delta=delta))
    f = _jitted(grid)
    lower_s, compile_s = _aot(f, q, sigma, steps, delta)
    eps_jit, first_s = _timed(lambda: f(q, sigma, steps, delta))
    eps_eager, eager_first_s = _timed(lambda: pld.pld_epsilon(q, sigma, steps, delta))
    jit_t, eager_t, dp_t = [], [], []
    for r in range(args.repeats):
      runs = [
          (jit_t, lambda: f(q, sigma, steps, delta).block_until_ready()),
          (eager_t, lambda: pld.pld_epsilon(q, sigma, steps, delta).block_until_ready()),
          (dp_t, lambda: _dp_epsilon([(q, sigma, steps)], delta)),
      ]
      if r % 2:
        runs.reverse()
      for times, fn in runs:
        out, seconds = _timed(fn)
        times.append(seconds)
        if times is dp_t:
          eps_dp = out
    jit_m, eager_m, dp_m = (statistics.median(t) for t in (jit_t, eager_t, dp_t))
    rel = _rel(eps_jit, eps_dp)
    print(f"{name}: grid {_grid_text(grid)} (pld_grid {_ms(grid_s)})")
    print(f"  jaxrdp jit    : eps {float(eps_jit):.10f}  warm {_ms(jit_m)} (min {_ms(min(jit_t))}); "
          f"trace+lower {lower_s:.2f} s, compile {compile_s:.2f} s, first call after "
          f"compiling {_ms(first_s)}")
    print(f"  jaxrdp eager  : eps {float(eps_eager):.10f}  2nd+ call {_ms(eager_m)} (first call "
          f"{eager_first_s:.2f} s, compiles its own graph)")
    print(f"  dp_accounting : eps {eps_dp:.10f}  {_ms(dp_m)} per query (construct + compose + "
          f"get_epsilon)")
    print(f"  eps rel diff jaxrdp - dp_accounting: {rel:+.2e} "
          f"({'agree' if abs(rel) <= AGREEMENT else 'DISAGREE'} within {AGREEMENT:g}); "
          f"jit == eager: {float(eps_jit) == float(eps_eager)}")
    print(f"RATIO warm {name}: dp_accounting/jaxrdp = {dp_m / jit_m:.1f}x (jit), "
          f"{dp_m / eager_m:.1f}x (eager)")
    ratio = dp_m / jit_m
    figures.setdefault("warm", []).append({
        "q": q, "sigma": sigma, "steps": steps, "delta": delta,
        "pmf_bins": grid.pmf_bins, "bins": grid.bins,
        "jaxrdp_jit": {"epsilon": float(eps_jit), "warm_s": jit_m, "lower_s": lower_s,
                       "compile_s": compile_s},
        "jaxrdp_eager": {"epsilon": float(eps_eager), "warm_s": eager_m, "first_s": eager_first_s},
        "dp_accounting": {"epsilon": eps_dp, "s": dp_m},
        "epsilon_rel_diff": rel, "ratio_dp_accounting_over_jaxrdp_jit": ratio,
        "ratio_dp_accounting_over_jaxrdp_eager": dp_m / eager_m, "goal_ratio": WARM_GOAL})
    print(f"GOAL warm eps {name}: dp_accounting/jaxrdp jit = {ratio:.1f}x (goal >= "
          f"{WARM_GOAL:g}x): {'met' if ratio >= WARM_GOAL else 'NOT met'}", flush=True)


# ---------------------------------------------------------------------------------------------
# 2. First call in a fresh process (as in bench_latency.py).


def bench_first_call(args, figures):
  print(f"\n== 2. first call pld_epsilon(0.01, 1.1, 10_000, 1e-5) in a fresh process (empty "
        f"HOME, no compilation cache, JAX_PLATFORMS=cpu), medians of {args.repeats}")
  walls, results = [], []
  for _ in range(args.repeats):
    wall, printed = _run(_FIRST_CALL)
    walls.append(wall)
    results.append(json.loads(printed))
  med = {k: statistics.median(r[k] for r in results) for k in ("imports", "first", "second")}
  firsts = [r["first"] for r in results]
  print(f"imports {med['imports']:.2f} s, first call {med['first']:.2f} s (min {min(firsts):.2f}, "
        f"max {max(firsts):.2f}), second call {_ms(med['second'])}, eps {results[-1]['eps']:.10f}")
  print(f"whole process wall {statistics.median(walls):.2f} s (min {min(walls):.2f})")
  print(f"GOAL first call pld_epsilon = {med['first']:.2f} s (goal <= {FIRST_CALL_GOAL:g} s): "
        f"{'met' if med['first'] <= FIRST_CALL_GOAL else 'NOT met'}", flush=True)
  figures["first_call"] = {"imports_s": med["imports"], "first_s": med["first"],
                           "second_s": med["second"], "process_s": statistics.median(walls),
                           "epsilon": results[-1]["eps"], "processes": len(results),
                           "goal_first_s": FIRST_CALL_GOAL}


# ---------------------------------------------------------------------------------------------
# 3. A phased schedule.


def bench_phased(args, figures):
  n, per, q, delta = args.phases, args.steps_per_phase, 0.01, 1e-5
  sigmas = np.linspace(0.8, 1.6, n)
  qs, steps = np.full(n, q), np.full(n, float(per))
  print(f"\n== 3. phased schedule: {n} phases x {per} steps, sigma 0.8 -> 1.6, q = {q}, "
        f"delta = {delta:g}; jaxrdp medians of {args.repeats}, dp_accounting of {args.dp_repeats}")
  grid, grid_s = _timed(lambda: pld.pld_grid(qs, sigmas, steps, interval=INTERVAL, delta=delta))
  f = _jitted(grid)
  lower_s, compile_s = _aot(f, qs, sigmas, steps, delta)
  eps_jit, first_s = _timed(lambda: f(qs, sigmas, steps, delta))
  jit_t = [_timed(lambda: f(qs, sigmas, steps, delta))[1] for _ in range(args.repeats)]
  dp_t = []
  for _ in range(args.dp_repeats):
    eps_dp, seconds = _timed(lambda: _dp_epsilon(zip(qs, sigmas, steps), delta))
    dp_t.append(seconds)
  jit_m, dp_m = statistics.median(jit_t), statistics.median(dp_t)
  rel = _rel(eps_jit, eps_dp)
  print(f"grid {_grid_text(grid)} (pld_grid on the host {grid_s:.2f} s)")
  print(f"  jaxrdp jit    : eps {float(eps_jit):.10f}  warm {jit_m:.3f} s (min {min(jit_t):.3f}); "
        f"trace+lower {lower_s:.2f} s, compile {compile_s:.2f} s, first call after compiling "
        f"{first_s:.2f} s")
  print(f"  dp_accounting : eps {eps_dp:.10f}  {dp_m:.2f} s ({n} compose calls + get_epsilon)")
  print(f"  eps rel diff jaxrdp - dp_accounting: {rel:+.2e} "
        f"({'agree' if abs(rel) <= AGREEMENT else 'DISAGREE'} within {AGREEMENT:g})")
  print(f"RATIO phased dp_accounting/jaxrdp = {dp_m / jit_m:.1f}x (jit, warm), "
        f"{dp_m / (jit_m + grid_s):.1f}x (jit warm + pld_grid)", flush=True)
  figures["phased"] = {
      "phases": n, "steps_per_phase": per, "q": q, "delta": delta,
      "pmf_bins": grid.pmf_bins, "bins": grid.bins, "pld_grid_s": grid_s,
      "jaxrdp_jit": {"epsilon": float(eps_jit), "warm_s": jit_m, "lower_s": lower_s,
                     "compile_s": compile_s},
      "dp_accounting": {"epsilon": eps_dp, "s": dp_m}, "epsilon_rel_diff": rel,
      "ratio_dp_accounting_over_jaxrdp_jit": dp_m / jit_m,
      "ratio_dp_accounting_over_jaxrdp_jit_and_grid": dp_m / (jit_m + grid_s)}


# ---------------------------------------------------------------------------------------------
# 4. A vmapped sweep (GPU).


def _sweep_batch(fn, grid, total, requested):
  """Configurations per chunk: ``requested``, or what fits in ~40 % of the device's memory
  (XLA's temp size of a batch of 8, scaled; 2 GiB assumed where the device does not say)."""
  if requested:
    return min(requested, total), None
  probe = 8
  try:
    memory = fn.lower(jnp.full(probe, 0.01), jnp.full(probe, 1.0)).compile().memory_analysis()
    per_config = memory.temp_size_in_bytes / probe
  except Exception:  # noqa: BLE001 - no memory analysis on this backend: a generous estimate
    per_config = 8 * 40 * (grid.pmf_bins + grid.bins)
  stats = jax.devices()[0].memory_stats() or {}
  limit = stats.get("bytes_limit", 2 * 2**30)
  batch = 2 ** int(math.floor(math.log2(max(1.0, 0.4 * limit / per_config))))
  return max(1, min(batch, total)), per_config


def bench_sweep(args, figures):
  backend = jax.default_backend()
  size = args.sweep_size if args.sweep_size is not None else (10_000 if backend == "gpu" else 0)
  print(f"\n== 4. vmapped sweep (backend {backend})")
  if backend != "gpu":
    print(f"GPU part skipped: backend is {backend} (the warm timings above ran there; "
          f"--sweep-size N runs a sweep of N configurations here anyway)")
  if size <= 0:
    return
  steps, delta = 10_000, 1e-5
  n_q = max(1, round(math.sqrt(size)))
  n_s = max(1, round(size / n_q))
  q_axis, s_axis = np.geomspace(1e-3, 1e-2, n_q), np.linspace(0.8, 2.0, n_s)
  qq, ss = (a.ravel() for a in np.meshgrid(q_axis, s_axis, indexing="ij"))
  total = qq.size
  corners = [pld.pld_grid(q, s, steps, interval=INTERVAL, delta=delta)
             for q in (q_axis[0], q_axis[-1]) for s in (s_axis[0], s_axis[-1])]
  grid = pld.PldGrid(INTERVAL, max(g.pmf_bins for g in corners), max(g.bins for g in corners),
                     corners[0].tail_mass)
  fn = jax.jit(jax.vmap(lambda q, s: pld.pld_epsilon(q, s, steps, delta, pld_grid=grid)))
  batch, per_config = _sweep_batch(fn, grid, total, args.sweep_batch)
  chunks = -(-total // batch)
  pad = chunks * batch - total
  q_pad = np.concatenate([qq, np.full(pad, qq[-1])])
  s_pad = np.concatenate([ss, np.full(pad, ss[-1])])
  per = "" if per_config is None else f" (~{per_config / 2**20:.0f} MiB of XLA temp per config)"
  print(f"{n_q} q in [1e-3, 1e-2] x {n_s} sigma in [0.8, 2.0] = {total:,} configurations, "
        f"T = {steps:,}, delta = {delta:g}; one grid ({_grid_text(grid)}); chunks of {batch}{per}")

  def sweep():
    parts = [fn(q_pad[i * batch:(i + 1) * batch], s_pad[i * batch:(i + 1) * batch])
             for i in range(chunks)]
    return np.asarray(jnp.concatenate(parts))[:total]

  eps, first_s = _timed(sweep)
  warm_eps, warm_s = _timed(sweep)
  finite = np.isfinite(eps)
  print(f"first pass (compilation included) {first_s:.2f} s; warm pass {warm_s:.2f} s = "
        f"{total / warm_s:,.0f} configurations/s ({_ms(warm_s / total)} per configuration)")
  print(f"identical passes: {np.array_equal(eps, warm_eps, equal_nan=True)}; non-finite cells "
        f"{int(np.sum(~finite))}; eps range [{np.min(eps[finite]):.4g}, {np.max(eps[finite]):.4g}]")
  rng = np.random.default_rng(0)
  cells = rng.choice(total, size=min(args.sweep_samples, total), replace=False)
  worst = 0.0
  for i in cells:
    ref = float(pld.pld_epsilon(qq[i], ss[i], steps, delta))
    worst = max(worst, abs(_rel(eps[i], ref)))
  print(f"sample of {len(cells)} cells vs pld_epsilon with each cell's own grid: largest rel diff "
        f"{worst:.2e}", flush=True)
  figures["sweep"] = {"configurations": total, "batch": batch, "first_s": first_s,
                      "warm_s": warm_s, "configurations_per_s": total / warm_s,
                      "non_finite": int(np.sum(~finite)), "samples": len(cells),
                      "max_rel_diff_own_grid": worst}


# ---------------------------------------------------------------------------------------------
# 5. The gradient's memory over many phases.


def bench_memory(args, figures):
  counts = [int(c) for c in args.memory_phases.split(",") if c]
  print(f"\n== 5. jit(value_and_grad) of pld_epsilon over P phases (q = 0.01, sigma in [0.9, 1.2], "
        f"10 steps each, delta = 1e-5), a fresh process each")
  rows = []
  for phases in counts:
    code = _MEMORY.replace("int(sys.argv[1])", str(phases))
    _, printed = _run(code)
    row = dict(json.loads(printed), phases=phases)
    rows.append(row)
    print(f"  P = {phases:4d}: peak RSS {row['peak_rss_bytes'] / 2**30:.2f} GiB, XLA working "
          f"memory {row['temp_bytes'] / 2**30:.2f} GiB, first call {row['first_s']:.2f} s "
          f"(after compiling), warm {row['warm_s']:.2f} s, eps {row['epsilon']:.6f} "
          f"(grid {row['pmf_bins']:,} / {row['bins']:,} points)", flush=True)
  figures["gradient_memory"] = rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5, help="timed repeats (medians reported)")
  parser.add_argument("--dp-repeats", type=int, default=1,
                      help="dp_accounting runs of the phased schedule (~45 s each on 2 cores)")
  parser.add_argument("--phases", type=int, default=100)
  parser.add_argument("--steps-per-phase", type=int, default=100)
  parser.add_argument("--sweep-size", type=int, default=None,
                      help="configurations of the vmapped sweep (default: 10^4 on a GPU, none on CPU)")
  parser.add_argument("--sweep-batch", type=int, default=None,
                      help="configurations per vmapped chunk (default: from the device's memory)")
  parser.add_argument("--sweep-samples", type=int, default=5,
                      help="sweep cells checked against pld_epsilon with their own grid")
  parser.add_argument("--skip-warm", action="store_true")
  parser.add_argument("--skip-first-call", action="store_true")
  parser.add_argument("--skip-phased", action="store_true")
  parser.add_argument("--memory-phases", default="20,80,160",
                      help="phase counts of the gradient-memory part (comma-separated; '' skips it)")
  _results.add_options(parser)
  args = parser.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()} (backend {jax.default_backend()}), "
        f"dp_accounting {_version('dp-accounting')}, numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (other work on the "
        f"machine slows both sides)")
  figures = {}
  if not args.skip_warm:
    bench_warm(args, figures)
  if not args.skip_first_call:
    bench_first_call(args, figures)
  if not args.skip_phased:
    bench_phased(args, figures)
  bench_sweep(args, figures)
  if args.memory_phases:
    bench_memory(args, figures)
  _results.write(args, figures)


if __name__ == "__main__":
  main()
