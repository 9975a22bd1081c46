"""Where the test suite's time goes: per file and per test, the wall time and the time JAX spends
tracing, lowering and compiling (XLA), and how many compilations repeat a program compiled
before (the same HLO and options: the key JAX computes for its persistent cache, which it
computes for every compilation whether a cache is set or not).

Usage:

    python tools/suite_profile.py [pytest arguments]   # run the suite with the recorder, report
    python tools/suite_profile.py --report DIR          # report an earlier run's records again
    python tools/suite_profile.py --save                # also write the run's figures to
                                                        # benchmarks/results/suite_profile.json

The suite runs as the README's test command runs it (``python -m pytest -q`` plus the arguments
given), with this file loaded as a pytest plugin (``-p suite_profile``) in every process,
xdist workers included; each writes its records to ``DIR/<worker>.json`` (``DIR`` from
``--out``, a temporary directory otherwise). The times come from JAX's debug log messages
("Finished tracing ...", "Finished jaxpr to MLIR module conversion ...", "Finished XLA
compilation of ... in ... sec"); a JAX whose messages read otherwise records no JAX time (the
report says so). Child processes that tests start are not recorded: their time counts as the
test's own (``rest`` below). With ``--save`` (or ``--json PATH``) the figures of a run that
passed are written with the run's metadata (``benchmarks/_results.py``), for the performance
page: the run's wall time against the issues' goal of 7 minutes, and where it goes.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import _results  # noqa: E402  (benchmarks/_results.py: --json, --save and the run's metadata)

_DIR_VARIABLE = "JAXRDP_SUITE_PROFILE_DIR"
_LOGGERS = ("jax._src.dispatch", "jax._src.interpreters.pxla", "jax._src.pjit", "jax._src.compiler")
_PATTERNS = (
    ("trace", re.compile(r"Finished tracing (?:\+ transforming )?(.*?) for \w+ in ([\d.]+) sec")),
    ("lower", re.compile(r"Finished jaxpr to MLIR module conversion (.*?) in ([\d.]+) sec")),
    ("compile", re.compile(r"Finished XLA compilation of (.*?) in ([\d.]+) sec")),
)
_KEY = re.compile(r"PERSISTENT COMPILATION CACHE MISS for '.*?' with key '(.*?)'")

# ---------------------------------------------------------------------------------------------
# The recorder (a pytest plugin: ``-p suite_profile`` with this directory on the path).

_records: list = []    # [test id, kind, program name, cache key, seconds]
_state = {"test": "(collection)", "key": ""}


class _Handler(logging.Handler):

  def emit(self, record):
    message = record.getMessage()
    key = _KEY.match(message)
    if key:
      _state["key"] = key[1]
      return
    for kind, pattern in _PATTERNS:
      found = pattern.match(message)
      if found:
        key = _state.pop("key", "") if kind == "compile" else ""
        _records.append([_state["test"], kind, found[1], key, float(found[2])])
        return


def pytest_configure(config):
  del config
  handler = _Handler(level=logging.DEBUG)
  for name in _LOGGERS:
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  _state["test"] = item.nodeid
  start = time.perf_counter()
  yield
  _records.append([item.nodeid, "wall", "", "", time.perf_counter() - start])


def pytest_sessionfinish(session):
  del session
  out = os.environ.get(_DIR_VARIABLE)
  if out:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (pathlib.Path(out) / f"{worker}.json").write_text(json.dumps(_records))


# ---------------------------------------------------------------------------------------------
# The report.


def summary(directory: pathlib.Path) -> dict | None:
  """The records in ``directory`` (one JSON file per process) summed: the run's totals (s),
  its compilations, and per file and per test their wall, compile, lower and trace times (s);
  None where no process recorded a test."""
  workers = {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}
  workers = {k: v for k, v in workers.items() if v}   # (xdist's controller runs no test)
  if not workers:
    return None
  per_test = collections.defaultdict(collections.Counter)
  totals, compiles, repeats, seen_anywhere = collections.Counter(), 0, [0, 0.0], {}
  for worker, records in workers.items():
    seen = set()
    for test, kind, name, key, seconds in records:
      per_test[test][kind] += seconds
      totals[kind] += seconds
      if kind != "compile":
        continue
      compiles += 1
      if key and key in seen:
        repeats[0] += 1
        repeats[1] += seconds
      elif key:
        seen.add(key)
        seen_anywhere.setdefault(key, set()).add(worker)
  per_file = collections.defaultdict(collections.Counter)
  for test, c in per_test.items():
    per_file[test.split("::")[0].removeprefix("tests/")].update(c)
  times = lambda c: {k: c[k] for k in ("wall", "compile", "lower", "trace")}
  ranked = lambda table: sorted(((name, times(c)) for name, c in table.items()),
                                key=lambda kv: -kv[1]["wall"])
  return {"processes": sorted(workers), "tests": sum(1 for t in per_test if t != "(collection)"),
          **{f"{k}_s": totals[k] for k in ("wall", "compile", "lower", "trace")},
          "compilations": compiles, "repeated_compilations": repeats[0],
          "repeated_compilation_s": repeats[1],
          "programs_in_several_processes": sum(1 for w in seen_anywhere.values() if len(w) > 1),
          "files": ranked(per_file),
          "tests_by_time": [(name.removeprefix("tests/"), t) for name, t in ranked(per_test)]}


def report(directory: pathlib.Path, top: int = 25) -> str:
  """The report of the records in ``directory`` (one JSON file per process)."""
  s = summary(directory)
  if s is None:
    return f"no records in {directory}"
  jax_time = s["compile_s"] + s["lower_s"] + s["trace_s"]
  lines = [
      f"processes: {len(s['processes'])} ({', '.join(s['processes'])})",
      f"tests: {s['tests']}; summed wall time {s['wall_s']:.0f} s "
      f"(with N processes in parallel the run takes about this / N)",
      f"XLA compilation {s['compile_s']:.0f} s "
      f"({100 * s['compile_s'] / s['wall_s']:.0f} %), "
      f"lowering {s['lower_s']:.0f} s, tracing {s['trace_s']:.0f} s, "
      f"the rest (running, Python, child processes) {s['wall_s'] - jax_time:.0f} s",
      f"compilations: {s['compilations']}; of a program the same process had compiled before: "
      f"{s['repeated_compilations']} ({s['repeated_compilation_s']:.0f} s); programs compiled "
      f"in more than one process: {s['programs_in_several_processes']}",
  ]
  if not jax_time:
    lines.append("(no JAX times recorded: this JAX's log messages differ from the patterns here)")

  def table(rows, title):
    lines.append("")
    lines.append(f"{title:72s} {'wall':>7s} {'compile':>8s} {'lower':>6s} {'trace':>6s}")
    for name, c in rows[:top]:
      name = name if len(name) <= 72 else name[:34] + "…" + name[-37:]
      lines.append(f"{name:72s} {c['wall']:7.1f} {c['compile']:8.1f} {c['lower']:6.1f} "
                   f"{c['trace']:6.1f}")

  table(s["files"], "file")
  table(s["tests_by_time"], "test")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--report", type=pathlib.Path, help="report this directory's records")
  parser.add_argument("--out", type=pathlib.Path, help="directory for the records")
  parser.add_argument("--top", type=int, default=25, help="rows per table")
  _results.add_options(parser)
  args, pytest_args = parser.parse_known_args(argv)
  if args.report is not None:
    print(report(args.report, args.top))
    return 0
  out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="suite_profile_"))
  out.mkdir(parents=True, exist_ok=True)
  here = str(pathlib.Path(__file__).resolve().parent)
  env = dict(os.environ, **{_DIR_VARIABLE: str(out)})
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
  start = time.perf_counter()
  status = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "suite_profile",
                            *pytest_args], env=env)
  elapsed = time.perf_counter() - start
  print(report(out, args.top))
  print(f"(records in {out})")
  s = summary(out)
  if s is not None and status == 0:   # the figures of a run that passed, and its wall time
    s["files"], s["tests_by_time"] = s["files"][:args.top], s["tests_by_time"][:args.top]
    s.update(run_s=elapsed, pytest_arguments=pytest_args, goal_run_s=_GOAL_S)
    args.out = str(out)
    _results.write(args, s)
  return status


_GOAL_S = 420.0   # the issues' goal for the suite: 7 minutes of pytest time from a clean clone


if __name__ == "__main__":
  sys.exit(main())
