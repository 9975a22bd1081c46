"""Kernels XLA compiles for the programs a user's ``jax.jit`` builds around jaxrdp: per program,
per computation (the entry, each loop's body), and with ``--sources`` each kernel's line in
jaxrdp. The cases are ``benchmarks/bench_user_jit.py``'s.

A first call's compile time is about its kernel count times a fixed cost per kernel (see
``benchmarks/_kernels.py``), and the count does not depend on the machine's load: compare it
before and after a change to the traced code, where a timing would need many fresh processes.

Usage (from the repository root)::

    python tools/kernel_census.py [--only jit_epsilon,jit_grad_epsilon] [--sources]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import _kernels  # noqa: E402
import bench_user_jit  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--only", default=None, help="comma-separated cases of bench_user_jit")
  parser.add_argument("--sources", action="store_true", help="list each kernel's jaxrdp line")
  args = parser.parse_args()
  names = list(bench_user_jit._CASES) if args.only is None else args.only.split(",")
  for name in names:
    scope: dict = {}
    exec(bench_user_jit._PRELUDE + bench_user_jit._CASES[name], scope)   # f and args
    lowered = scope["f"].lower(*scope["args"])
    start = time.perf_counter()
    text = lowered.compile().as_text()
    seconds = time.perf_counter() - start
    counts = _kernels.fusions(text)
    parts = ", ".join(f"{k} {v}" for k, v in counts.most_common())
    print(f"{name}: {sum(counts.values())} kernels ({parts}); compiled in {seconds:.2f} s",
          flush=True)
    if args.sources:
      for computation, fusion, where in _kernels.sources(text):
        print(f"  {computation[:24]:24s} {fusion[:40]:40s} {where}")


if __name__ == "__main__":
  main()
