"""Benchmark: soundness and tightness of the PLD accountant against exact ε (issue 33).

What it measures
----------------
Every case of tests/data/pld_references.json (tools/make_pld_references.py: the exact ε(δ) at
50 digits where the privacy loss has a closed form, q = 1 for any T and T = 1 for q < 1; the
issue's hand-picked cases, a random sample of 220 over σ ∈ [1, 10³], T ∈ [1, 10⁷],
δ ∈ [1e-15, 1e-2], interval Δ ∈ [1e-5, 1], and a T = 1 grid over q, σ, δ, Δ) is evaluated as a
user would, in float64::

    eps = jaxrdp.pld_epsilon(q, σ, T, δ, pld_grid=jaxrdp.pld_grid(q, σ, T, interval=Δ))

and classified as

* refused: a ValueError from ``pld_grid`` or ``pld_epsilon`` (e.g. more than MAX_BINS points),
  or ε = +inf: a clear refusal, sound;
* below: ε < exact · (1 − 1e-12) or NaN: unsound (must be 0; 1e-12 allows only float64 rounding,
  as in tests/test_pld_soundness.py);
* answered: otherwise; its looseness is ε/exact − 1 (exact ε = 0 counts as answered, with no
  looseness).

Printed: the library version and devices, then one table per grouping (all cases, the case
group, δ decade, Δ decade) with the counts and the min / median / max looseness (negative
min = below exact), the ``--worst`` cases furthest below exact and loosest, and the time.
The last line is ``SOUNDNESS below_exact=<n> of <cases>``.

Run (from the repository root; every distinct grid compiles its own program, ~1–3 s, and the
largest grids take tens of seconds: ~15 min on 2 CPU cores for all 422 cases)::

    PYTHONPATH=. python benchmarks/pld_soundness.py [--quick] [--worst 10] [--verbose]

``--quick`` runs the 22 cases the default test runs (~1 min).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)  # the PLD accountant is float64 only

import numpy as np  # noqa: E402

import jaxrdp  # noqa: E402

# The cases and the tolerance are the test's (tests/test_pld_soundness.py), read from there.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from test_pld_soundness import RTOL, _load as _load_all  # noqa: E402


def _load(quick):
  cases = _load_all()
  return [c for c in cases if c["quick"]] if quick else cases


def _evaluate(case):
  """Adds "outcome" (answered / refused / below), "eps", "looseness", "seconds" to the case."""
  start = time.perf_counter()
  try:
    grid = jaxrdp.pld_grid(case["q"], case["sigma"], case["steps"], interval=case["interval"])
    eps = float(jaxrdp.pld_epsilon(case["q"], case["sigma"], case["steps"], case["delta"],
                                   pld_grid=grid))
    case["bins"] = grid.bins
  except ValueError as e:
    eps, case["refusal"], case["bins"] = None, str(e), None
  case["seconds"] = time.perf_counter() - start
  exact = case["epsilon_float64"]
  case["eps"] = eps
  case["looseness"] = None
  if eps is None or eps == math.inf:
    case["outcome"] = "refused"
  elif not eps >= exact * (1 - RTOL):
    case["outcome"] = "below"
    case["looseness"] = eps / exact - 1 if exact > 0 else -math.inf
  else:
    case["outcome"] = "answered"
    case["looseness"] = eps / exact - 1 if exact > 0 else None


def _decade(x):
  return f"1e{math.floor(math.log10(x) + 1e-9):+d}"


def _row(label, cases):
  n = {k: sum(c["outcome"] == k for c in cases) for k in ("answered", "refused", "below")}
  loose = [c["looseness"] for c in cases if c["looseness"] is not None]
  stats = ("{:>11.3e} {:>11.3e} {:>11.3e}".format(min(loose), float(np.median(loose)), max(loose))
           if loose else f"{'-':>11} {'-':>11} {'-':>11}")
  return (f"{label:<14} {len(cases):>5} {n['answered']:>8} {n['refused']:>7} {n['below']:>5} "
          f"{stats}")


def _table(title, key, cases):
  print(f"\n{title}")
  print(f"{'':<14} {'cases':>5} {'answered':>8} {'refused':>7} {'below':>5} "
        f"{'min ε/ex−1':>11} {'median':>11} {'max':>11}")
  groups = {}
  for case in cases:
    groups.setdefault(key(case), []).append(case)
  for label in sorted(groups, key=lambda g: (isinstance(g, str), g)):
    print(_row(str(label), groups[label]))


def _describe(case):
  eps = "refused" if case["eps"] is None else f"{case['eps']:.10g}"
  loose = "" if case["looseness"] is None else f" ε/exact−1={case['looseness']:+.3e}"
  return (f"  {case['group']:<13} q={case['q']:<6g} σ={case['sigma']:<9.4g} T={case['steps']:<8d} "
          f"δ={case['delta']:<9.3g} Δ={case['interval']:<9.3g} exact={case['epsilon_float64']:.10g} "
          f"ε={eps}{loose}")


def _reason(case):
  """A refusal's kind: ε = inf, or its ValueError's message up to the first number."""
  if case["eps"] == math.inf:
    return "ε = inf"
  words = []
  for word in case["refusal"].split():
    if any(ch.isdigit() for ch in word):
      break
    words.append(word)
  return "ValueError: " + " ".join(words) + " …"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="only the default test's 22 cases")
  parser.add_argument("--worst", type=int, default=10, help="worst cases listed (default 10)")
  parser.add_argument("--verbose", action="store_true", help="a line per case as it is done")
  args = parser.parse_args()

  print(f"jaxrdp {importlib.metadata.version('jaxrdp')} ({jaxrdp.__file__}), "
        f"jax {jax.__version__}, devices {jax.devices()}")
  cases = _load(args.quick)
  start = time.perf_counter()
  for case in cases:
    _evaluate(case)
    if args.verbose:
      print(f"{_describe(case)}  [{case['outcome']}, {case['seconds']:.1f} s]", flush=True)
  seconds = time.perf_counter() - start

  _table("All cases", lambda c: "all", cases)
  _table("By group", lambda c: c["group"], cases)
  _table("By δ decade", lambda c: _decade(c["delta"]), cases)
  _table("By interval decade", lambda c: _decade(c["interval"]), cases)

  scored = [c for c in cases if c["looseness"] is not None]
  print(f"\nLowest ε/exact − 1 (negative: below exact), {args.worst} cases:")
  for case in sorted(scored, key=lambda c: c["looseness"])[:args.worst]:
    print(_describe(case))
  print(f"\nLoosest, {args.worst} cases:")
  for case in sorted(scored, key=lambda c: -c["looseness"])[:args.worst]:
    print(_describe(case))
  refusals = {}
  for case in cases:
    if case["outcome"] == "refused":
      reason = _reason(case)
      refusals[reason] = refusals.get(reason, 0) + 1
  if refusals:
    print("\nRefusals:", "; ".join(f"{k} ({v})" for k, v in refusals.items()))
  slowest = max(cases, key=lambda c: c["seconds"])
  print(f"\n{len(cases)} cases in {seconds:.0f} s (slowest {slowest['seconds']:.1f} s, "
        f"bins {slowest['bins']})")
  below = sum(c["outcome"] == "below" for c in cases)
  print(f"SOUNDNESS below_exact={below} of {len(cases)}")


if __name__ == "__main__":
  main()
