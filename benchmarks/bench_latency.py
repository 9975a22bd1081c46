"""Benchmark: what a new user waits for — fresh processes, no persistent compilation cache.

What it measures (issue 12, goal 1), each in its own fresh Python process with an empty
``HOME`` / ``XDG_CACHE_HOME``, no ``JAX_COMPILATION_CACHE_DIR`` and ``JAXRDP_CACHE_DIR=""``
(so no compilation cache of any kind can help), ``JAX_PLATFORMS=cpu``, float64:

* **script**: the wall time of a whole process printing
  ``jaxrdp.dpsgd_epsilon(0.01, 1.1, 10_000, 1e-5)``, against the same query through
  dp_accounting (``RdpAccountant`` composing ``PoissonSampledDpEvent(0.01,
  GaussianDpEvent(1.1))`` 10,000 times, ``get_epsilon(1e-5)``). The two scripts run in pairs
  (alternating which goes first); the ratio is the median of the per-pair ratios.
* **first calls**: inside a fresh process, after the imports, the time of the first call
  (trace + compile + run) of ``dpsgd_epsilon``, ``jax.grad`` of it w.r.t. σ,
  ``calibrate_noise_multiplier(2.0, 1e-5, 0.01, 10_000)`` and
  ``compute_rdp(0.01, 1.1, 10_000, DEFAULT_ORDERS)``; one process per call and repeat, medians.

On a machine with an accelerator, ``--platform auto --plain --skip-script`` runs the first
calls with JAX's own platforms (the accelerator and the host CPU), each also with
``JAXRDP_PLAIN_JIT=1`` (every entry point a plain ``jax.jit``, on the accelerator): what the
dispatch layer's host route saves (``benchmarks/run_gpu.sh``).

How to run (from the repository root)::

    python benchmarks/bench_latency.py [--repeats 5] [--save]

Lines starting with ``GOAL`` compare each median with its goal. ``--save`` / ``--json PATH``
write the figures as JSON (``benchmarks/_results.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _results

_JAXRDP_SCRIPT = """
import jax
jax.config.update("jax_enable_x64", True)
import jaxrdp
print(float(jaxrdp.dpsgd_epsilon(0.01, 1.1, 10_000, 1e-5)))
"""

_DP_ACCOUNTING_SCRIPT = """
import dp_accounting
acc = dp_accounting.rdp.RdpAccountant()
acc.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 10_000)
print(acc.get_epsilon(1e-5))
"""

_FIRST_CALL = """
import json, time
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import jaxrdp
calls = {
    "dpsgd_epsilon": lambda: jaxrdp.dpsgd_epsilon(0.01, 1.1, 10_000, 1e-5),
    "grad_dpsgd_epsilon": lambda: jax.grad(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 10_000, 1e-5))(1.1),
    "calibrate_noise_multiplier": lambda: jaxrdp.calibrate_noise_multiplier(2.0, 1e-5, 0.01, 10_000),
    "compute_rdp": lambda: jaxrdp.compute_rdp(0.01, 1.1, 10_000, jaxrdp.DEFAULT_ORDERS),
}
fn = calls[%r]
t0 = time.perf_counter()
value = jax.block_until_ready(fn())
t1 = time.perf_counter()
jax.block_until_ready(fn())
t2 = time.perf_counter()
print(json.dumps({"first": t1 - t0, "second": t2 - t1, "value": jnp.ravel(jnp.asarray(value))[:3].tolist(),
                  "device": str(next(iter(value.devices()))),
                  "device_kind": jax.devices()[0].device_kind}))
"""

# The calls as docs/performance.md shows them.
LABELS = {"dpsgd_epsilon": "`dpsgd_epsilon(0.01, 1.1, 10_000, 1e-5)`",
          "grad_dpsgd_epsilon": "`jax.grad` of it with respect to σ",
          "calibrate_noise_multiplier": "`calibrate_noise_multiplier(2.0, 1e-5, 0.01, 10_000)`",
          "compute_rdp": "`compute_rdp(0.01, 1.1, 10_000, DEFAULT_ORDERS)`"}

GOALS = {"dpsgd_epsilon": 1.5, "grad_dpsgd_epsilon": 3.0, "calibrate_noise_multiplier": 1.5,
         "compute_rdp": 1.0}


def _clean_env(tmp: str, platform: str = "cpu", plain: bool = False) -> dict:
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("JAX_COMPILATION_CACHE") and k != "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
         and k not in ("JAX_PLATFORMS", "JAXRDP_PLAIN_JIT")}
  env.update(HOME=tmp, XDG_CACHE_HOME=tmp, JAXRDP_CACHE_DIR="")
  if platform != "auto":   # auto: JAX's own choice (an accelerator where there is one, and the CPU)
    env["JAX_PLATFORMS"] = platform
  if plain:
    env["JAXRDP_PLAIN_JIT"] = "1"
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
  return env


def _run(code: str, platform: str = "cpu", plain: bool = False) -> tuple[float, str]:
  with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=_clean_env(tmp, platform, plain),
                         capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
  if out.returncode != 0:
    raise RuntimeError(f"subprocess failed:\n{out.stderr[-3000:]}")
  return wall, out.stdout.strip().splitlines()[-1]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--skip-script", action="store_true")
  parser.add_argument("--only", default=None, help="comma-separated first calls to measure")
  parser.add_argument("--platform", default="cpu",
                      help="JAX_PLATFORMS of the processes ('auto': JAX's own choice)")
  parser.add_argument("--plain", action="store_true",
                      help="also each first call with JAXRDP_PLAIN_JIT=1 (no dispatch layer), "
                           "alternating with the default")
  _results.add_options(parser)
  args = parser.parse_args()
  figures = {}

  if not args.skip_script:
    ratios, ours, theirs = [], [], []
    for i in range(args.repeats):
      order = [("jaxrdp", _JAXRDP_SCRIPT), ("dp_accounting", _DP_ACCOUNTING_SCRIPT)]
      if i % 2:
        order.reverse()
      walls = {}
      for name, code in order:
        walls[name], printed = _run(code)
        walls[name + "_value"] = printed
      ours.append(walls["jaxrdp"])
      theirs.append(walls["dp_accounting"])
      ratios.append(walls["jaxrdp"] / walls["dp_accounting"])
      print(f"pair {i}: jaxrdp {walls['jaxrdp']:.2f} s (eps {walls['jaxrdp_value']}), "
            f"dp_accounting {walls['dp_accounting']:.2f} s (eps {walls['dp_accounting_value']})",
            flush=True)
    ratio = statistics.median(ratios)
    print(f"script wall: jaxrdp {statistics.median(ours):.2f} s, dp_accounting "
          f"{statistics.median(theirs):.2f} s (medians of {args.repeats})")
    print(f"GOAL script jaxrdp/dp_accounting = {ratio:.2f}x (goal <= 2x): "
          f"{'met' if ratio <= 2 else 'NOT met'}")
    figures["script"] = {"jaxrdp_s": statistics.median(ours),
                         "dp_accounting_s": statistics.median(theirs),
                         "ratio_jaxrdp_over_dp_accounting": ratio, "goal_ratio": 2.0,
                         "pairs": args.repeats, "jaxrdp_value": walls["jaxrdp_value"],
                         "dp_accounting_value": walls["dp_accounting_value"]}

  names = list(GOALS) if args.only is None else args.only.split(",")
  for name in names:
    firsts, seconds, plains = [], [], []
    for i in range(args.repeats):
      modes = [False, True] if args.plain else [False]
      for plain in (modes if i % 2 == 0 else modes[::-1]):
        _, printed = _run(_FIRST_CALL % name, args.platform, plain)
        if plain:
          plains.append(json.loads(printed)["first"])
          continue
        res = json.loads(printed)
        firsts.append(res["first"])
        seconds.append(res["second"])
    first = statistics.median(firsts)
    print(f"{name}: first call {first:.3f} s (min {min(firsts):.3f}), second call "
          f"{1e3 * statistics.median(seconds):.2f} ms, value {res['value']} on {res['device']}",
          flush=True)
    record = {"what": LABELS[name], "first_s": first, "min_first_s": min(firsts),
              "second_s": statistics.median(seconds), "goal_first_s": GOALS[name],
              "processes": len(firsts), "value": res["value"], "device": res["device"]}
    if plains:
      record["plain_first_s"] = statistics.median(plains)
      print(f"{name}: with JAXRDP_PLAIN_JIT=1 {record['plain_first_s']:.3f} s: the dispatch "
            f"layer's first call is {record['plain_first_s'] / first:.2f}x faster")
    if args.platform == "cpu":   # the goals are this 2-core CPU's
      print(f"GOAL first call {name} = {first:.2f} s (goal <= {GOALS[name]} s): "
            f"{'met' if first <= GOALS[name] else 'NOT met'}")
    figures.setdefault("first_calls", {})[name] = record
  figures["platform"] = args.platform
  if "first_calls" in figures and args.platform != "cpu":   # the default device's kind
    figures["device_kind"] = res["device_kind"]
  _results.write(args, figures)


if __name__ == "__main__":
  main()
