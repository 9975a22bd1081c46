"""Benchmark: the README's first command on a fresh virtual environment, against JAX alone.

What it measures, side by side in one run (each command in a new virtual environment made with
``python -m venv``, so with only the pip that ``venv`` seeds):

* **(a) baseline**: ``pip install jax optax dp-accounting`` — what any DP-SGD user of JAX
  installs anyway;
* **(b) the README's first command**: ``pip install ".[examples]"`` in a copy of the repository
  (its tracked and untracked, not ignored, files: what a fresh clone holds, so that the build
  writes nothing into the working tree), then ``python examples/quickstart.py``.

For each: the wall time of ``python -m venv`` (printed, not in the ratio: it is the same for
both), of the ``pip install``, and for (b) of the quickstart; and the packages the command
installed (``pip list`` after it, less ``pip list`` of the fresh venv). Printed: the ratio
(b: install + quickstart) / (a: install), whether (b) installed any test or documentation tool
that (a) did not (pytest, hypothesis, mkdocs, black, pyarrow, prv-accountant, ...), and a ``GOAL``
line for "≤ 40 packages, no test or docs tooling, (b) within 2× (a)". ``--install ARGS``
replaces what (b) installs (e.g. ``--install ". dp-accounting"``), to weigh another first
command against the same baseline.

Pip caches (the same policy for both commands):

* **cold**: each command gets its own new, empty ``PIP_CACHE_DIR``: every wheel is fetched
  (from the index, or from the ``find-links`` / local indexes that pip's configuration names:
  they are printed first, as they change what "fetched" costs);
* **warm** (unless ``--no-warm``): the same command again, in another new venv, with the cache
  that its cold run filled. The locally built jaxrdp wheel is not cached by pip, so (b) builds
  it again, as a user re-running the command would.

The order (a, b) alternates between repeats (``--repeats``, default 1); with several repeats
the medians are reported. Environment variables that would change what pip or Python pick up
(``PYTHONPATH``, ``VIRTUAL_ENV``, ``PIP_CACHE_DIR``, ``PIP_NO_CACHE_DIR``, ``JAX_ENABLE_X64``)
are removed; the rest of pip's configuration (index, find-links, constraints) is this machine's.

How to run (from the repository root; a few minutes, mostly downloads)::

    python benchmarks/bench_install.py [--repeats 1] [--no-warm] [--install ARGS] [--save]

``--save`` / ``--json PATH`` write the figures as JSON (``benchmarks/_results.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import _results

ROOT = pathlib.Path(__file__).resolve().parent.parent
BASELINE = ["jax", "optax", "dp-accounting"]
README_INSTALL = [".[examples]"]
QUICKSTART = ["examples/quickstart.py"]
MAX_PACKAGES = 40
MAX_RATIO = 2.0
# What the README's first command must not install: the test and documentation tool chains
# (beyond what (a) installs: dp-accounting itself needs mpmath).
TOOLING = ("pytest", "pytest-xdist", "hypothesis", "mpmath", "pyarrow", "prv-accountant",
           "mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python",
           "pymdown-extensions", "black", "build", "twine")
_DROP_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_CACHE_DIR", "PIP_NO_CACHE_DIR",
             "JAX_ENABLE_X64", "JAXRDP_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")


def _env(venv: pathlib.Path, cache: pathlib.Path) -> dict:
  env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
  env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
             PIP_CACHE_DIR=str(cache), PIP_DISABLE_PIP_VERSION_CHECK="1")
  return env


def _run(cmd: list[str], cwd: pathlib.Path, env: dict | None = None) -> float:
  """Runs cmd, returns its wall time; on failure prints its output and stops."""
  start = time.perf_counter()
  proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
  seconds = time.perf_counter() - start
  if proc.returncode != 0:
    sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-4000:]}\n"
             f"{proc.stderr[-4000:]}")
  return seconds


def _packages(venv: pathlib.Path, env: dict) -> set[str]:
  out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
                       env=env, capture_output=True, text=True, check=True).stdout
  return {p["name"].lower().replace("_", "-") for p in json.loads(out)}


def _base_python() -> str:
  """The interpreter venvs are made from (the base one when this runs inside a venv)."""
  return getattr(sys, "_base_executable", None) or sys.executable


def _source_copy(dest: pathlib.Path) -> pathlib.Path:
  """The repository's tracked and untracked (not ignored) files, copied to dest."""
  files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
  for name in filter(None, files.split("\0")):
    src = ROOT / name
    if src.is_file():   # a deleted-but-tracked file is listed and absent
      (dest / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, dest / name)
  return dest


def measure(which: str, work: pathlib.Path, source: pathlib.Path, cache: pathlib.Path,
            readme_install: list[str]) -> dict:
  """One fresh venv: (a) the baseline install, or (b) the README's install + quickstart."""
  venv = pathlib.Path(tempfile.mkdtemp(prefix=f"venv_{which}_", dir=work))
  venv_s = _run([_base_python(), "-m", "venv", str(venv)], cwd=work)
  env = _env(venv, cache)
  seeded = _packages(venv, env)
  python = str(venv / "bin" / "python")
  if which == "a":
    install_s = _run([python, "-m", "pip", "install", *BASELINE], cwd=work, env=env)
    quickstart_s = 0.0
  else:
    install_s = _run([python, "-m", "pip", "install", *readme_install], cwd=source, env=env)
    quickstart_s = _run([python, *QUICKSTART], cwd=source, env=env)
  installed = _packages(venv, env) - seeded
  shutil.rmtree(venv, ignore_errors=True)
  return {"venv_s": venv_s, "install_s": install_s, "quickstart_s": quickstart_s,
          "total_s": install_s + quickstart_s, "packages": len(installed),
          "pip_list": len(installed | seeded), "installed": sorted(installed)}


def _median(runs: list[dict]) -> dict:
  out = {k: statistics.median(r[k] for r in runs)
         for k in ("venv_s", "install_s", "quickstart_s", "total_s")}
  out.update(packages=runs[0]["packages"], pip_list=runs[0]["pip_list"],
             installed=runs[0]["installed"], runs=len(runs))
  return out


def _report(label: str, a: dict, b: dict, readme_install: list[str]) -> dict:
  ratio = b["total_s"] / a["install_s"]
  tooling = sorted(p for p in set(b["installed"]) - set(a["installed"]) if p in TOOLING)
  print(f"\n{label} pip cache")
  print(f"  (a) pip install {' '.join(BASELINE)}: install {a['install_s']:6.1f} s, "
        f"{a['packages']} packages installed ({a['pip_list']} in pip list); venv {a['venv_s']:.1f} s")
  print(f"  (b) pip install {shlex.join(readme_install)} + quickstart: install {b['install_s']:6.1f} s "
        f"+ quickstart {b['quickstart_s']:5.1f} s = {b['total_s']:6.1f} s, {b['packages']} packages "
        f"installed ({b['pip_list']} in pip list); venv {b['venv_s']:.1f} s")
  print(f"  only in (b): {', '.join(sorted(set(b['installed']) - set(a['installed'])))}")
  print(f"  test/docs tooling in (b), not in (a): {', '.join(tooling) or 'none'}")
  print(f"  RATIO (b) / (a) = {ratio:.2f}")
  met = b["packages"] <= MAX_PACKAGES and not tooling and ratio <= MAX_RATIO
  print(f"GOAL ({label}) ≤ {MAX_PACKAGES} packages, no test/docs tooling, (b) ≤ {MAX_RATIO:g}× (a): "
        f"{b['packages']} packages, tooling {', '.join(tooling) or 'none'}, {ratio:.2f}× -> "
        f"{'met' if met else 'NOT met'}")
  return {"baseline": a, "readme": b, "ratio": ratio, "tooling": tooling, "goal_met": met}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=1, help="runs of each command per cache policy")
  parser.add_argument("--no-warm", action="store_true", help="cold caches only")
  parser.add_argument("--install", default=shlex.join(README_INSTALL), metavar="ARGS",
                      help="what (b) passes to pip install, in the repository (default: the "
                           "README's %(default)s); to weigh an alternative first command")
  parser.add_argument("--workdir", default=None,
                      help="where the venvs, caches and the source copy go (default: a temporary "
                           "folder, removed at the end)")
  _results.add_options(parser)
  args = parser.parse_args()
  readme_install = shlex.split(args.install)

  config = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                          capture_output=True, text=True).stdout.strip()
  print(f"python {sys.version.split()[0]} ({_base_python()}), {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}")
  print("pip configuration (index, find-links, constraints):\n  "
        + ("\n  ".join(config.splitlines()) or "(defaults)"))

  work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="bench_install_"))
  work.mkdir(parents=True, exist_ok=True)
  try:
    source = _source_copy(work / "source")
    cold = {"a": [], "b": []}
    warm = {"a": [], "b": []}
    for repeat in range(args.repeats):
      order = "ab" if repeat % 2 == 0 else "ba"
      for which in order:
        cache = work / f"cache_{which}_{repeat}"
        cache.mkdir()
        cold[which].append(measure(which, work, source, cache, readme_install))
        print(f"cold {which}: {cold[which][-1]['total_s']:.1f} s", flush=True)
      if not args.no_warm:
        for which in order:
          warm[which].append(measure(which, work, source, work / f"cache_{which}_{repeat}",
                                     readme_install))
          print(f"warm {which}: {warm[which][-1]['total_s']:.1f} s", flush=True)
    figures = {"cold": _report("cold", _median(cold["a"]), _median(cold["b"]), readme_install)}
    if not args.no_warm:
      figures["warm"] = _report("warm", _median(warm["a"]), _median(warm["b"]), readme_install)
  finally:
    if args.workdir is None:
      shutil.rmtree(work, ignore_errors=True)
  print(f"load average at the end {os.getloadavg()[0]:.1f}")
  figures["pip_config"] = config
  _results.write(args, figures)


if __name__ == "__main__":
  main()
