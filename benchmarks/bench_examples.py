"""Benchmark: the examples' wall time, as a new user waits for it.

Each example runs with its defaults in a fresh Python process, from the repository root, with
``JAX_PLATFORMS=cpu`` unless ``--platform`` says otherwise, no ``JAX_COMPILATION_CACHE_DIR``
and ``JAXRDP_CACHE_DIR=""`` (no compilation cache of any kind), its plot written to a temporary
directory. The wall time is the whole process's (interpreter start, imports, every compilation,
the plot); medians over ``--repeats`` runs. matplotlib's font cache is built once, before the
first run, in a temporary ``MPLCONFIGDIR`` that every run shares: a one-time cost of a fresh
matplotlib install, not of the examples. There is no anchor: no other accountant has these
examples.

How to run (from the repository root)::

    python benchmarks/bench_examples.py [--repeats 3] [--only quickstart] [--save]

Lines starting with ``GOAL`` compare each median with its goal (issue 34: the quickstart
≤ 10 s, ``optimize_schedule.py`` ≤ 15 s on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import _results

ROOT = pathlib.Path(__file__).resolve().parent.parent
# name: (script, its arguments (the plot goes to OUT), the goal in seconds)
EXAMPLES = {
    "quickstart": ("examples/quickstart.py", [], 10.0),
    "optimize_schedule": ("examples/optimize_schedule.py", ["--out", "{out}/schedule.png"], 15.0),
}
_DROP_ENV = ("JAX_COMPILATION_CACHE_DIR", "JAX_ENABLE_X64", "XLA_FLAGS")


def _env(platform: str, mpl: str) -> dict:
  env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
  env.update(JAXRDP_CACHE_DIR="", MPLCONFIGDIR=mpl, MPLBACKEND="Agg")
  if platform:
    env["JAX_PLATFORMS"] = platform
  return env


def run_once(name: str, env: dict) -> float:
  """One fresh process of example ``name``: its wall time (it must exit with 0)."""
  script, extra, _ = EXAMPLES[name]
  with tempfile.TemporaryDirectory() as out:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, script, *(a.format(out=out) for a in extra)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
  if proc.returncode != 0:
    sys.exit(f"{script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return seconds


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--only", default="", help="comma-separated example names")
  parser.add_argument("--platform", default="cpu", help="JAX_PLATFORMS for the runs ('' = JAX's)")
  _results.add_options(parser)
  args = parser.parse_args(argv)
  names = [n for n in args.only.split(",") if n] or list(EXAMPLES)
  figures = {"platform": args.platform or "default", "examples": {}}
  with tempfile.TemporaryDirectory() as mpl:
    env = _env(args.platform, mpl)
    subprocess.run([sys.executable, "-c", "import matplotlib.pyplot"], env=env, check=True)
    for name in names:
      times = [run_once(name, env) for _ in range(args.repeats)]
      median = statistics.median(times)
      goal = EXAMPLES[name][2]
      print(f"{name}: {median:.1f} s (runs: {', '.join(f'{t:.1f}' for t in times)})", flush=True)
      print(f"GOAL {name} = {median:.1f} s (goal <= {goal:g} s): "
            f"{'met' if median <= goal else 'NOT met'}", flush=True)
      figures["examples"][name] = {"wall_s": median, "runs_s": times, "goal_s": goal,
                                   "script": EXAMPLES[name][0]}
  _results.write(args, figures)
  return 0


if __name__ == "__main__":
  sys.exit(main())
