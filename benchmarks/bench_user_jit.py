"""Benchmark: jaxrdp inside a user's own ``jax.jit``, ``jax.grad`` and ``jax.vmap``.

Each case runs in its own fresh Python process with an empty ``HOME`` / ``XDG_CACHE_HOME``,
no ``JAX_COMPILATION_CACHE_DIR`` and ``JAXRDP_CACHE_DIR=""`` (no compilation cache of any
kind), ``JAX_PLATFORMS=cpu`` unless ``--platform`` says otherwise, float64. The user's
``jax.jit`` gets XLA's default compiler options. Reported per case: the first call (trace +
compile + one run, after the imports and the platform's start, which is timed apart: a CUDA
context takes about a second whatever the program) with its trace, lowering and compile
times (``jax.monitoring``), and the warm call, medians over ``--repeats``
processes; after them, the kernels XLA compiled for the program (``benchmarks/_kernels.py``:
a count that does not depend on the machine's load, unlike the times) and the time the same
process took to compile a fixed reference program of plain ``jax.numpy`` (the machine's speed
at the time: first calls measured at different times compare through it). The long schedule (10,000 steps, a different σ each) is also composed by
dp_accounting in the same process (``RdpAccountant``, the same events, ``get_epsilon``), and
the ratio of the two warm times is printed; dp_accounting takes 5 to 10 minutes there on 2 CPU
cores, so it runs in the first ``--anchor-repeats`` processes only (default 1).

How to run (from the repository root)::

    python benchmarks/bench_user_jit.py [--repeats 3] [--only jit_epsilon,...] [--save]

Lines starting with ``GOAL`` compare each median with its goal. ``--save`` / ``--json PATH``
write the figures as JSON (``benchmarks/_results.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _results

_PRELUDE = """
import collections, json, time
import jax
import jax.monitoring
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
import jaxrdp
s = time.perf_counter()
jax.devices()  # the platform's start (a CUDA context: ~1 s on a GPU), paid by any JAX program
backend_init = time.perf_counter() - s
events = collections.Counter()
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: events.update({event: duration}))
"""

_CASES = {
    "jit_epsilon": """
f = jax.jit(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 10_000, 1e-5))
args = (1.1,)
""",
    "jit_grad_epsilon": """
f = jax.jit(jax.grad(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 10_000, 1e-5)))
args = (1.1,)
""",
    "jit_calibrate": """
f = jax.jit(lambda e: jaxrdp.calibrate_noise_multiplier(e, 1e-5, 0.01, 10_000))
args = (2.0,)
""",
    "jit_compute_rdp": """
f = jax.jit(lambda s: jaxrdp.compute_rdp(0.01, s, 10_000, jaxrdp.DEFAULT_ORDERS))
args = (1.1,)
""",
    "jit_vmap_epsilon": """
f = jax.jit(jax.vmap(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 10_000, 1e-5)))
args = (jnp.linspace(0.6, 3.0, 64),)
""",
    "jit_value_and_grad_30": """
f = jax.jit(jax.value_and_grad(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 100.0, 1e-5)))
args = (jnp.linspace(0.8, 1.6, 30),)
""",
    "jit_value_and_grad_10k": """
f = jax.jit(jax.value_and_grad(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 1.0, 1e-5)))
args = (jnp.asarray(np.random.default_rng(0).uniform(0.8, 2.0, 10_000)),)
""",
    "jit_epsilon_10k": """
f = jax.jit(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 1.0, 1e-5))
args = (jnp.asarray(np.random.default_rng(0).uniform(0.8, 2.0, 10_000)),)
""",
    # The same as jit_grad_epsilon and jit_value_and_grad_30 with jaxrdp's CPU compiler options
    # passed to the user's jit (jaxrdp.compiler_options()): what a user who waits on first calls
    # can choose; the goals above are for XLA's defaults.
    "jit_grad_epsilon_options": """
f = jax.jit(jax.grad(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 10_000, 1e-5)),
            compiler_options=jaxrdp.compiler_options())
args = (1.1,)
""",
    "jit_value_and_grad_30_options": """
f = jax.jit(jax.value_and_grad(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 100.0, 1e-5)),
            compiler_options=jaxrdp.compiler_options())
args = (jnp.linspace(0.8, 1.6, 30),)
""",
}

_RUN = """
t0 = time.perf_counter()
value = jax.block_until_ready(f(*args))
t1 = time.perf_counter()
split = {k: events[e] for k, e in (("trace", "/jax/core/compile/jaxpr_trace_duration"),
         ("lower", "/jax/core/compile/jaxpr_to_mlir_module_duration"),
         ("compile", "/jax/core/compile/backend_compile_duration"))}
warm = []
for _ in range(5):
  s = time.perf_counter()
  jax.block_until_ready(f(*args))
  warm.append(time.perf_counter() - s)
out = {"first": t1 - t0, "warm": sorted(warm)[2], "device_kind": jax.devices()[0].device_kind,
       "backend_init": backend_init, **split,
       "value": [float(v) for v in jnp.ravel(jnp.asarray(jax.tree_util.tree_leaves(value)[0]))[:2]]}
# After the timed calls: the kernels XLA compiled for the program (a count that does not depend
# on the machine's load), and how long this process took to compile a fixed reference program
# of plain jax.numpy (the machine's speed, to compare runs made at different times).
import _kernels
out["kernels"] = sum(_kernels.fusions(f.lower(*args).compile().as_text()).values())
def reference(x):
  for k in range(24):
    x = x + jnp.log(jnp.sum(jnp.exp(jnp.sin(x * (k + 1))), axis=-1, keepdims=True))
  return x
lowered = jax.jit(reference).lower(jnp.ones((4, 64)))
s = time.perf_counter()
compiled = lowered.compile()
out["reference_compile"] = time.perf_counter() - s
out["reference_kernels"] = sum(_kernels.fusions(compiled.as_text()).values())
if %(anchor)r:
  import dp_accounting
  sig = np.asarray(args[0])
  subset = %(subset)d or sig.size   # its cost is linear in the events: timed on a subset, scaled
  s = time.perf_counter()
  acc = dp_accounting.rdp.RdpAccountant()
  for x in sig[:subset]:
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(float(x))))
  anchor_eps = acc.get_epsilon(1e-5)
  out["anchor"] = (time.perf_counter() - s) * sig.size / subset
  out["anchor_value"] = anchor_eps if subset == sig.size else None
print(json.dumps(out))
"""

# What the user writes, as docs/performance.md shows it.
LABELS = {
    "jit_epsilon": "`jax.jit(lambda s: dpsgd_epsilon(0.01, s, 10_000, 1e-5))`",
    "jit_grad_epsilon": "`jax.jit(jax.grad(lambda s: dpsgd_epsilon(0.01, s, 10_000, 1e-5)))`",
    "jit_calibrate": "`jax.jit(lambda e: calibrate_noise_multiplier(e, 1e-5, 0.01, 10_000))`",
    "jit_compute_rdp": "`jax.jit(lambda s: compute_rdp(0.01, s, 10_000, DEFAULT_ORDERS))`",
    "jit_vmap_epsilon": "`jax.jit(jax.vmap(...dpsgd_epsilon...))` over 64 σ",
    "jit_value_and_grad_30": "`jax.jit(jax.value_and_grad(...dpsgd_epsilon...))`, 30 phases",
    "jit_value_and_grad_10k": "`jax.jit(jax.value_and_grad(...dpsgd_epsilon...))`, 10,000 phases "
                              "(a σ per step)",
    "jit_epsilon_10k": "`jax.jit(...dpsgd_epsilon...)`, 10,000 phases (a σ per step)",
    "jit_grad_epsilon_options": "`jax.jit(jax.grad(...dpsgd_epsilon...), "
                                "compiler_options=jaxrdp.compiler_options())`",
    "jit_value_and_grad_30_options": "`jax.jit(jax.value_and_grad(...dpsgd_epsilon...), "
                                     "compiler_options=jaxrdp.compiler_options())`, 30 phases",
}

GOALS = {"jit_epsilon": (1.5, None), "jit_grad_epsilon": (2.0, None), "jit_calibrate": (2.0, None),
         "jit_compute_rdp": (1.5, None), "jit_vmap_epsilon": (2.0, 0.030),
         "jit_value_and_grad_30": (2.0, None), "jit_value_and_grad_10k": (5.0, 0.3),
         "jit_epsilon_10k": (None, None), "jit_grad_epsilon_options": (None, None),
         "jit_value_and_grad_30_options": (None, None)}


def _clean_env(tmp: str, platform: str) -> dict:
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("JAX_COMPILATION_CACHE") and k != "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"}
  env.update(HOME=tmp, XDG_CACHE_HOME=tmp, JAXRDP_CACHE_DIR="", JAX_PLATFORMS=platform)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = os.pathsep.join([repo, os.path.join(repo, "benchmarks"),
                                       env.get("PYTHONPATH", "")])
  return env


def _run(code: str, platform: str) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    out = subprocess.run([sys.executable, "-c", code], env=_clean_env(tmp, platform),
                         capture_output=True, text=True, check=False)
  if out.returncode != 0:
    raise RuntimeError(f"subprocess failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--only", default=None, help="comma-separated cases")
  parser.add_argument("--platform", default="cpu")
  parser.add_argument("--no-anchor", action="store_true",
                      help="skip dp_accounting on the 10,000-step schedule (minutes)")
  parser.add_argument("--anchor-subset", type=int, default=1000,
                      help="events dp_accounting composes, its time scaled to all (0 = all)")
  parser.add_argument("--anchor-repeats", type=int, default=1,
                      help="processes (of --repeats) that also run dp_accounting's composition")
  _results.add_options(parser)
  args = parser.parse_args()
  cases, device_kind = {}, None
  names = list(_CASES) if args.only is None else args.only.split(",")
  if not args.no_anchor and importlib.util.find_spec("dp_accounting") is None:
    print("dp_accounting is not installed: the 10,000-step schedule runs without its anchor")
    args.no_anchor = True
  for name in names:
    anchor = name == "jit_epsilon_10k" and not args.no_anchor and args.anchor_repeats > 0
    runs = [_run(_PRELUDE + _CASES[name] + _RUN % {"anchor": anchor and i < args.anchor_repeats,
                                                    "subset": args.anchor_subset},
                 args.platform)
            for i in range(args.repeats)]
    first = statistics.median(r["first"] for r in runs)
    device_kind = runs[0]["device_kind"]
    warm = statistics.median(r["warm"] for r in runs)
    split = {k: statistics.median(r[k] for r in runs)
             for k in ("backend_init", "trace", "lower", "compile", "reference_compile")}
    line = (f"{name}: first call {first:.2f} s (trace {split['trace']:.2f}, lower "
            f"{split['lower']:.2f}, compile {split['compile']:.2f}; platform start "
            f"{split['backend_init']:.2f} s before it), warm {1e3 * warm:.2f} ms, "
            f"{runs[0]['kernels']} kernels, value {runs[0]['value']}; the reference program "
            f"({runs[0]['reference_kernels']} kernels) compiled in "
            f"{split['reference_compile']:.2f} s")
    if anchor:
      anchored = [r for r in runs if "anchor" in r]
      ratio = statistics.median(r["anchor"] / r["warm"] for r in anchored)
      value = runs[0]["anchor_value"]
      line += (f"; dp_accounting {statistics.median(r['anchor'] for r in anchored):.2f} s"
               f"{'' if value is None else f' (eps {value:.6f})'}"
               f"{'' if not args.anchor_subset else f' (timed on {args.anchor_subset} events, scaled)'}"
               f": {ratio:.0f}x faster warm")
    print(line, flush=True)
    goal_first, goal_warm = GOALS[name]
    cases[name] = {"what": LABELS[name], "first_s": first, "warm_s": warm,
                   "value": runs[0]["value"], "goal_first_s": goal_first, "goal_warm_s": goal_warm,
                   "processes": len(runs), "kernels": runs[0]["kernels"],
                   "reference_kernels": runs[0]["reference_kernels"],
                   **{f"{k}_s": v for k, v in split.items()}}
    if anchor:
      cases[name].update(anchor="dp_accounting RdpAccountant", anchor_processes=len(anchored),
                         anchor_s=statistics.median(r["anchor"] for r in anchored),
                         anchor_value=runs[0]["anchor_value"], ratio_anchor_over_jaxrdp=ratio)
    if goal_first is not None:
      print(f"GOAL {name} first call = {first:.2f} s (goal <= {goal_first} s): "
            f"{'met' if first <= goal_first else 'NOT met'}")
    if goal_warm is not None:
      print(f"GOAL {name} warm = {1e3 * warm:.1f} ms (goal <= {1e3 * goal_warm:.0f} ms): "
            f"{'met' if warm <= goal_warm else 'NOT met'}")
  _results.write(args, {"cases": cases, "platform": args.platform, "device_kind": device_kind})


if __name__ == "__main__":
  main()
