"""Machine-readable benchmark output: the figures a benchmark prints, and the run they came from.

Every script in this folder takes ``--json PATH`` (write there) and ``--save`` (write
``benchmarks/results/<script>.json``). The file holds::

    {"benchmark": "bench_latency",                 # the script's name
     "command": "python benchmarks/bench_latency.py --repeats 3 --save",
     "date": "2026-11-27T17:10:02Z",               # UTC, when the figures were written
     "machine": {"cpu": ..., "cores": ..., "platform": ..., "python": ..., "devices": ...},
     "versions": {"jax": ..., "jaxlib": ..., "jaxrdp": ..., "numpy": ..., "dp_accounting": ...},
     "options": {...},                             # the parsed command-line options
     "figures": {...}}                             # what the script printed, as numbers

``tools/performance_page.py`` renders ``docs/performance.md`` from these files, so a figure on
the page is always one a run printed. The printed output stays the benchmark's own.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import shlex
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
METADATA = ("benchmark", "command", "date", "machine", "versions", "options", "figures")
MACHINE = ("cpu", "cores", "platform", "python")
VERSIONS = ("jax", "jaxlib", "jaxrdp")


def add_options(parser: argparse.ArgumentParser) -> None:
  """Adds ``--json PATH`` and ``--save`` to a benchmark's command line."""
  parser.add_argument("--json", metavar="PATH", default=None,
                      help="also write the figures, with the run's metadata, as JSON to PATH")
  parser.add_argument("--save", action="store_true",
                      help="same as --json benchmarks/results/<this script>.json")


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _version(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def _command() -> str:
  script = pathlib.Path(sys.argv[0]).resolve()
  try:
    script = script.relative_to(ROOT)
  except ValueError:
    pass
  return shlex.join(["python", str(script), *sys.argv[1:]])


def metadata() -> dict:
  """The run's command line, UTC date, machine and library versions."""
  jax_imported = "jax" in sys.modules   # devices only where the benchmark itself used JAX
  import jaxrdp  # at write time, after the timings: the version of the code that ran
  machine = {"cpu": _cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
             "python": platform.python_version(), "load_average": list(os.getloadavg())}
  if jax_imported:
    import jax
    devices = jax.devices()
    machine.update(backend=jax.default_backend(), devices=[str(d) for d in devices],
                   device_kind=devices[0].device_kind)
  versions = {"jax": _version("jax"), "jaxlib": _version("jaxlib"),
              "jaxrdp": jaxrdp.__version__}
  for name in ("numpy", "dp-accounting", "dp-accelerator", "optax", "opacus"):
    if (v := _version(name)) is not None:
      versions[name.replace("-", "_")] = v
  return {"command": _command(),
          "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
          "machine": machine, "versions": versions}


def _clean(value):
  """JSON has no NaN or infinity: those become null."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {str(k): _clean(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_clean(v) for v in value]
  if hasattr(value, "item") and getattr(value, "shape", None) == ():  # NumPy / JAX scalars
    return _clean(value.item())
  return value


def write(args: argparse.Namespace, figures: dict) -> pathlib.Path | None:
  """Writes ``figures`` and the run's metadata where ``--json``/``--save`` say; else nothing."""
  name = pathlib.Path(sys.argv[0]).stem
  path = args.json or (RESULTS / f"{name}.json" if args.save else None)
  if path is None:
    return None
  path = pathlib.Path(path)
  options = {k: v for k, v in vars(args).items() if k not in ("json", "save")}
  record = {"benchmark": name, **metadata(), "options": options, "figures": figures}
  if "backend" not in record["machine"] and figures.get("platform") not in (None, "cpu"):
    # JAX ran in child processes (fresh-process benchmarks): their backend and device.
    record["machine"].update(backend=figures["platform"], device_kind=figures.get("device_kind"))
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(_clean(record), indent=1, ensure_ascii=False) + "\n",
                  encoding="utf-8")
  print(f"figures written to {path}")
  return path
