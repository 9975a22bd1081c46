"""Benchmark: a sweep written as it goes (``sweep(..., output=DIR)``) against the same sweep in memory.

Default grid: 100 q x 100 σ x 100 steps x 10 δ = 10^7 configurations, float64 (q log-spaced in
[1e-4, 0.1], σ in [0.5, 5], steps log-spaced in [100, 10^5], δ in [1e-10, 1e-5]). Each form
runs in its own fresh process (``--repeats`` times, alternating): the peak resident memory
(getrusage) is the process's own, the wall time is the call's (compilation included: the
same programs in both), and the throughput is configurations per second. Written parts go to a
temporary directory, removed afterwards.

    python benchmarks/bench_sweep_output.py [--size 10000000] [--repeats 3] [--save]
    python benchmarks/bench_sweep_output.py --platform cuda --size 1000000000 --forms output

``--platform`` picks JAX's backend in the children (default ``cpu``); on an accelerator the
device's own peak memory is reported too (``memory_stats``, where the backend keeps one), and
the size of the written files. ``--forms`` runs one form only (a 10^9 grid in memory needs
8 GB of host memory for the result alone).

``GOAL`` lines: peak memory with ``output=`` ≤ 1 GiB; its throughput within 10 % of the
in-memory sweep's (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import _results

_CHILD = """
import json, os, pathlib, resource, sys, time
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import jaxrdp
n_q = n_s = %(side)d
axes = (np.geomspace(1e-4, 0.1, n_q), np.linspace(0.5, 5.0, n_s),
        np.round(np.geomspace(100, 1e5, %(n_t)d)), np.geomspace(1e-10, 1e-5, %(n_d)d))
out = %(out)r
start = time.perf_counter()
result = jaxrdp.sweep(*axes, output=out)
if out is None:
  np.asarray(result)
wall = time.perf_counter() - start
cells = int(np.prod([a.size for a in axes]))
device = jax.devices()[0]
stats = device.memory_stats() or {}
written = (sum(f.stat().st_size for f in pathlib.Path(out).iterdir())
           if out is not None else None)
print(json.dumps({"wall": wall, "cells": cells, "device_kind": device.device_kind,
                  "device_peak_mib": stats.get("peak_bytes_in_use", float("nan")) / 2 ** 20,
                  "written_mib": None if written is None else written / 2 ** 20,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _run(side, n_t, n_d, out, platform):
  code = _CHILD % {"side": side, "n_t": n_t, "n_d": n_d, "out": out}
  env = dict(os.environ, JAX_PLATFORMS=platform)
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                        check=False)
  if done.returncode:
    raise RuntimeError(done.stderr[-3000:])
  return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=10_000_000,
                      help="configurations: q x σ grows (steps x δ stays 100 x 10)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--platform", default=os.environ.get("JAX_PLATFORMS") or "cpu",
                      help="JAX backend of the sweeps (cpu, cuda, tpu)")
  parser.add_argument("--forms", default="memory,output",
                      help="which forms to run: memory, output or both (comma-separated)")
  _results.add_options(parser)
  args = parser.parse_args()
  n_t, n_d = 100, 10
  side = max(1, round((args.size / (n_t * n_d)) ** 0.5))
  forms = args.forms.split(",")
  if not forms or set(forms) - {"memory", "output"}:
    parser.error(f"--forms takes memory, output or both, got {args.forms!r}")
  runs = {form: [] for form in forms}
  for _ in range(args.repeats):
    if "memory" in runs:
      runs["memory"].append(_run(side, n_t, n_d, None, args.platform))
    if "output" in runs:
      with tempfile.TemporaryDirectory() as tmp:
        runs["output"].append(_run(side, n_t, n_d, os.path.join(tmp, "sweep.parquet"),
                                   args.platform))
  figures = {"platform": args.platform, "device_kind": runs[forms[0]][0]["device_kind"]}
  for form, rs in runs.items():
    wall = statistics.median(r["wall"] for r in rs)
    peak = statistics.median(r["peak_rss_mib"] for r in rs)
    device_peak = statistics.median(r["device_peak_mib"] for r in rs)
    figures[form] = {"cells": rs[0]["cells"], "wall_s": wall, "cells_per_s": rs[0]["cells"] / wall,
                     "peak_rss_mib": peak, "device_peak_mib": device_peak,
                     "written_mib": rs[0]["written_mib"], "processes": len(rs)}
    print(f"{form:>6}: {rs[0]['cells']:,} configurations in {wall:.2f} s "
          f"({rs[0]['cells'] / wall:,.0f}/s), peak RSS {peak:.0f} MiB"
          + (f", device peak {device_peak:.0f} MiB" if device_peak == device_peak else "")
          + (f", {rs[0]['written_mib']:.0f} MiB written" if rs[0]["written_mib"] else ""))
  if len(runs) < 2:
    _results.write(args, figures)
    return
  ratio = figures["output"]["cells_per_s"] / figures["memory"]["cells_per_s"]
  figures["throughput_ratio_output_over_memory"] = ratio
  peak = figures["output"]["peak_rss_mib"]
  if args.platform != "cpu":   # the goals are this 2-core CPU's (issue 38, goal 3)
    print(f"throughput with output= {ratio:.3f} of in memory; peak RSS {peak:.0f} MiB")
    _results.write(args, figures)
    return
  print(f"GOAL peak memory with output= = {peak:.0f} MiB (goal <= 1024 MiB): "
        f"{'met' if peak <= 1024 else 'NOT met'}")
  print(f"GOAL throughput with output= = {ratio:.3f} of in memory (goal >= 0.9): "
        f"{'met' if ratio >= 0.9 else 'NOT met'}")
  _results.write(args, figures)


if __name__ == "__main__":
  main()
