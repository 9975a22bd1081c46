"""How many kernels XLA compiled for a program: a compile-time measure that does not depend on
the machine's load.

On a CPU, XLA compiles every fusion of the optimised HLO module as a kernel of its own (its own
MLIR and LLVM modules, ``backends/cpu/codegen/fusion_compiler.cc`` and ``ir_compiler.cc``):
with XLA's default options about 12 ms of MLIR and 18 ms of LLVM work per kernel on the 2-core
machine of ``docs/performance.md``, whether the kernel holds ten operations or a thousand
(``TF_CPP_VMODULE=fusion_compiler=3,cpu_compiler=2`` prints both per kernel). A program's
first call is therefore about its kernel count times that, plus XLA's HLO passes (~0.2 s):
fewer kernels is what makes a user's ``jax.jit`` compile faster, and counting them tells
whether a change did so where timings, which vary 1.3-1.6x with the machine's load, cannot.

:func:`fusions` counts them in ``jax.jit(f).lower(*args).compile().as_text()``, per
computation (the entry computation, each loop body and condition), leaving out the fused
computations themselves and the reducers of reductions.
"""

from __future__ import annotations

import collections
import re

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%\S+ = .*? fusion\(", re.M)
_HEAD = re.compile(r"^(?:ENTRY )?%(\S+) ")


def _canonical(body: str) -> str:
  """A fused computation's text without its names and metadata: equal for two fusions that
  XLA compiles as one kernel (it compiles a fused computation once, however many fusions
  call it)."""
  body = re.sub(r", metadata=\{[^}]*\}", "", body)
  body = re.sub(r"%[\w.-]+", "%", body)
  return body.split("\n", 1)[-1]


def fusions(hlo_text: str) -> collections.Counter:
  """Kernels per computation of an optimised HLO module's text: its fusion instructions, each
  fused computation counted once (where it first appears)."""
  computations = re.split(r"\n(?=\S)", hlo_text)
  bodies = {}
  for computation in computations:
    head = _HEAD.match(computation)
    if head is not None:
      bodies[head.group(1)] = _canonical(computation)
  counts, seen = collections.Counter(), set()
  for computation in computations:
    head = _HEAD.match(computation)
    if head is None:   # the module's header, its stack-frame tables
      continue
    name = head.group(1)
    if name.startswith(("fused_", "wrapped_")) or "fused_computation" in name:
      continue   # the body of a fusion: compiled as part of the kernel that calls it
    for line in computation.splitlines()[1:]:
      if not _INSTRUCTION.match(line):
        continue
      called = re.search(r"calls=%([\w.-]+)", line)
      body = bodies.get(called.group(1)) if called else line
      if body not in seen:
        seen.add(body)
        counts["entry" if computation.startswith("ENTRY") else name] += 1
  return counts


def sources(hlo_text: str) -> list[tuple[str, str, str]]:
  """(computation, fusion, innermost jaxrdp source line) of each kernel, from the module's
  stack-frame tables (``file:function:line``; empty where XLA kept no location)."""
  tables = {"FileNames": {}, "FunctionNames": {}, "FileLocations": {}, "StackFrames": {}}
  section = None
  for line in hlo_text.splitlines():
    if line in tables:
      section = line
      continue
    entry = re.match(r"^(\d+) (.*)$", line) if section else None
    if entry is None:
      section = None
      continue
    tables[section][int(entry.group(1))] = entry.group(2)
  files = {k: v.strip('"').split("/jaxrdp/")[-1] for k, v in tables["FileNames"].items()}
  functions = {k: v.strip('"') for k, v in tables["FunctionNames"].items()}

  def place(frame):
    """The innermost frame of ``frame``'s chain inside jaxrdp, as file:function:line."""
    seen = set()
    while frame in tables["StackFrames"] and frame not in seen:
      seen.add(frame)
      location, parent = map(int, re.findall(r"=(\d+)", tables["StackFrames"][frame]))
      file_id, function_id, line = map(int, re.findall(
          r"[{ ](?:file_name_id|function_name_id|line)=(\d+)", tables["FileLocations"][location]))
      if not files[file_id].startswith("/"):   # a path inside the package
        return f"{files[file_id]}:{functions[function_id]}:{line}"
      frame = parent
    return ""

  out = []
  for computation in re.split(r"\n(?=\S)", hlo_text):
    head = _HEAD.match(computation)
    if head is None or head.group(1).startswith(("fused_", "wrapped_")):
      continue
    name = "entry" if computation.startswith("ENTRY") else head.group(1)
    for line in computation.splitlines()[1:]:
      if not _INSTRUCTION.match(line):
        continue
      fusion = re.match(r"^\s*(?:ROOT )?%(\S+) =", line).group(1)
      frame = re.search(r"stack_frame_id=(\d+)", line)
      out.append((name, fusion, place(int(frame.group(1))) if frame else ""))
  return out
