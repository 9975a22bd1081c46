"""docs/performance.md is what the benchmarks' JSON gives (tools/performance_page.py).

The benchmarks write their figures with ``--save`` / ``--json`` (benchmarks/_results.py) into
benchmarks/results/*.json; the generator renders the page from those files. These tests run no
benchmark: they check the committed page against the committed JSON, and that every JSON says
which run it came from (command, UTC date, machine, versions).
"""

import datetime
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
JSONS = sorted(RESULTS.glob("*.json")) + sorted(RESULTS.glob("gpu/*.json"))


def _generator():
  return load_script("tools/performance_page.py")


def test_page_matches_the_benchmarks_json():
  proc = subprocess.run([sys.executable, "tools/performance_page.py", "--check"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, (
      "docs/performance.md differs from benchmarks/results/*.json; run "
      f"`python tools/performance_page.py`:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}")


def test_check_fails_when_a_figure_changes(tmp_path):
  results = tmp_path / "results"
  shutil.copytree(RESULTS, results)
  page = tmp_path / "performance.md"
  shutil.copy(ROOT / "docs" / "performance.md", page)
  path = results / "bench_latency.json"
  record = json.loads(path.read_text(encoding="utf-8"))
  record["figures"]["first_calls"]["dpsgd_epsilon"]["first_s"] += 1.0
  path.write_text(json.dumps(record), encoding="utf-8")
  generator = _generator()
  assert generator.main(["--check", "--results", str(results), "--page", str(page)]) == 1
  assert generator.main(["--results", str(results), "--page", str(page)]) == 0
  assert generator.main(["--check", "--results", str(results), "--page", str(page)]) == 0


@pytest.mark.parametrize("path", JSONS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_json_names_its_run(path):
  record = json.loads(path.read_text(encoding="utf-8"))
  for field in ("benchmark", "command", "date", "machine", "versions", "options", "figures"):
    assert field in record, field
  name = record["benchmark"]   # a benchmark, or a tool that measures (tools/suite_profile.py)
  assert record["command"].split()[:2] in (["python", f"benchmarks/{name}.py"],
                                           ["python", f"tools/{name}.py"])
  date = datetime.datetime.strptime(record["date"], "%Y-%m-%dT%H:%M:%SZ")
  assert date.year >= 2025
  for field in ("cpu", "cores", "platform", "python"):
    assert record["machine"].get(field), field
  for package in ("jax", "jaxlib", "jaxrdp"):
    assert record["versions"].get(package), package
  assert record["figures"], "no figures"


def test_every_json_is_on_the_page():
  generator = _generator()
  on_page = {name for _, name in generator.SECTIONS if name is not None}
  for path in RESULTS.glob("*.json"):
    assert path.stem in on_page, f"{path.name} has no section on docs/performance.md"
  for path in RESULTS.glob("gpu/*.json"):
    assert json.loads(path.read_text(encoding="utf-8"))["benchmark"] in generator.RENDER, path


def test_gpu_runs_get_their_own_section(tmp_path):
  results = tmp_path / "results"
  (results / "gpu").mkdir(parents=True)
  cpu_run = sorted(RESULTS.glob("*.json"))[0]
  record = json.loads(cpu_run.read_text(encoding="utf-8"))
  record["machine"].update(backend="gpu", device_kind="NVIDIA H100 80GB HBM3")
  (results / "gpu" / cpu_run.name).write_text(json.dumps(record), encoding="utf-8")
  page = _generator().render(results)
  assert "\n## GPU\n" in page
  assert "NVIDIA H100 80GB HBM3 (gpu)" in " ".join(page.split())   # the run line names the GPU
  assert "## Inside your own jit, grad and vmap" in page   # the fixed prose stays


def test_every_benchmark_can_write_its_figures():
  for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
    text = script.read_text(encoding="utf-8")
    assert "_results.add_options(" in text and "_results.write(" in text, script.name
