"""Runs the CPU benchmarks one after another and saves their figures for docs/performance.md.

From the repository root::

    python benchmarks/run_all.py --save && python tools/performance_page.py

``--save`` writes ``benchmarks/results/<script>.json`` for each (``--results DIR`` writes
there instead); ``tools/performance_page.py`` then renders the page from those files. One
benchmark at a time, never two at once: they time themselves and would slow each other. Each
benchmark's own output is printed as it runs, then its wall time; a failing benchmark is
reported and the others still run (exit status 1 at the end).

It takes about 20 minutes on 2 CPU cores, half of it dp_accounting composing 10,000 events
one by one in bench_user_jit (the anchor of its long schedule). ``--quick`` takes the fewest
repeats each benchmark allows (about 15 minutes); the page shows each figure's command, repeats
included.
``--only bench_latency,bench_pld`` runs a subset. The GPU figures come from
``bash benchmarks/run_gpu.sh`` on a GPU machine (``benchmarks/results/gpu/``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

# script: (options for the default run, options for --quick). Sequential, in this order.
BENCHMARKS = {
    "bench_latency": ([], ["--repeats", "1"]),
    "bench_user_jit": ([], ["--repeats", "1"]),
    "bench_examples": ([], ["--repeats", "1"]),
    "bench_rdp_curve": ([], ["--repeats", "3"]),
    "bench_accounting": ([], ["--repeats", "3"]),
    "bench_transform": ([], ["--repeats", "11"]),
    "bench_pld": ([], ["--repeats", "1"]),
    "bench_samplers": ([], ["--repeats", "1", "--first-runs", "1"]),
    "bench_mixture": ([], ["--repeats", "1", "--first-runs", "1"]),
    "bench_sweep": ([], []),
    "bench_scale": ([], []),
}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--save", action="store_true",
                      help="write benchmarks/results/<script>.json for each benchmark")
  parser.add_argument("--results", metavar="DIR", default=None,
                      help="write the JSON files to DIR instead (implies --save)")
  parser.add_argument("--quick", action="store_true", help="the fewest repeats each allows")
  parser.add_argument("--only", default=None, help="comma-separated scripts, e.g. bench_pld")
  args = parser.parse_args()
  names = list(BENCHMARKS) if args.only is None else args.only.split(",")
  unknown = sorted(set(names) - set(BENCHMARKS))
  if unknown:
    parser.error(f"unknown benchmarks {unknown}; known: {', '.join(BENCHMARKS)}")
  results = pathlib.Path(args.results) if args.results else (
      HERE / "results" if args.save else None)
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")

  walls, failed = {}, []
  for name in names:
    default, quick = BENCHMARKS[name]
    cmd = [sys.executable, str(HERE / f"{name}.py"), *(quick if args.quick else default)]
    if results is not None:
      json_path = results / f"{name}.json"
      try:
        json_path = json_path.relative_to(ROOT)   # the command the JSON records stays short
      except ValueError:
        pass
      cmd += ["--json", str(json_path)]
    print(f"\n==== {name}: {' '.join(cmd[1:])}", flush=True)
    start = time.perf_counter()
    rc = subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
    walls[name] = time.perf_counter() - start
    print(f"==== {name}: {walls[name]:.0f} s" + ("" if rc == 0 else f", FAILED (exit {rc})"),
          flush=True)
    if rc != 0:
      failed.append(name)
  print("\n==== wall time per benchmark")
  for name, wall in walls.items():
    print(f"  {name:<18} {wall:6.0f} s{'  FAILED' if name in failed else ''}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
