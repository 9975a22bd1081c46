"""Kernels XLA compiles for the programs a user's ``jax.jit`` builds around jaxrdp: per program,
per computation (the entry, each loop's body), and with ``--sources`` each kernel's line in
jaxrdp. The cases are ``benchmarks/bench_user_jit.py``'s.

A first call's compile time is about its kernel count times a fixed cost per kernel (see
``benchmarks/_kernels.py``), and the count does not depend on the machine's load: compare it
before and after a change to the traced code, where a timing would need many fresh processes.

``--ir`` adds each kernel's optimised LLVM IR in KB (XLA's dump, in a temporary folder): XLA:CPU
fully unrolls a kernel's innermost loop when it is short (under ~24 vectors: a last axis of 5 to
~95 float64 entries), which multiplies its machine code, and its compile time, by up to ten.

Usage (from the repository root)::

    python tools/kernel_census.py [--only jit_epsilon,jit_grad_epsilon] [--sources] [--ir]
"""

from __future__ import annotations

import argparse
import glob
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time

if "--ir" in sys.argv:   # before JAX starts its backend
  _DUMP = tempfile.mkdtemp(prefix="kernel_census_")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={_DUMP}").strip()

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import _kernels  # noqa: E402
import bench_user_jit  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--only", default=None, help="comma-separated cases of bench_user_jit")
  parser.add_argument("--sources", action="store_true", help="list each kernel's jaxrdp line")
  parser.add_argument("--ir", action="store_true", help="each kernel's optimised LLVM IR (KB)")
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
    sizes = _ir_sizes() if args.ir else {}
    if sizes:
      print(f"  LLVM IR {sum(sizes.values()) / 1e3:.0f} KB", flush=True)
    shapes = dict(re.findall(r"^\s*(?:ROOT )?%([\w.-]+) = (\S+) fusion\(", text, re.M))
    if args.sources or args.ir:
      for computation, fusion, where in _kernels.sources(text):
        size = f"{sizes.get(fusion, 0) / 1e3:6.1f} {shapes.get(fusion, '')[:22]:22s} " if sizes else ""
        print(f"  {computation[:24]:24s} {fusion[:40]:40s} {size}{where}")


def _ir_sizes() -> dict:
  """Optimised LLVM IR bytes per kernel of the last program compiled (XLA's dump)."""
  files = glob.glob(os.path.join(_DUMP, "module_*.ir-with-opt.ll"))
  if not files:
    return {}
  last = max(os.path.basename(f).split(".")[0] for f in files)
  sizes = {}
  for f in files:
    name = os.path.basename(f)
    if not name.startswith(last + "."):
      continue
    kernel = name.split(".", 2)[2].replace("__compute_module_", "")
    kernel = kernel.replace("_kernel_module.ir-with-opt.ll", "").replace(".ir-with-opt.ll", "")
    sizes[kernel] = os.path.getsize(f)
  for f in glob.glob(os.path.join(_DUMP, "*")):
    shutil.rmtree(f) if os.path.isdir(f) else os.remove(f)
  return sizes


if __name__ == "__main__":
  main()
