"""The README is a front door: short, no development history, links that resolve, and every
Python block in it runs as written. So does every Python block of docs/getting-started.md, the
longer tour.

The pages' ```python blocks run in order in ONE child process (``JAX_PLATFORMS=cpu``; a block's
``jax_enable_x64`` stays out of the test process), each in a fresh namespace and with
``jax_enable_x64`` reset to its default before it, so that a block which uses a name, an import
or float64 without setting it up itself fails: every block can be copied alone. One process for
all the pages keeps the cost to one JAX start-up (and the compilations the pages share); the
blocks' own first calls (compilations) are the rest, ~15 s on a 2-core CPU, so the snippets
must stay cheap (small step counts, few distinct calls). A failure's traceback gives the
page's own line numbers.
"""

import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 150
# The pages whose ```python blocks must run as written.
TOURS = ["README.md", "docs/getting-started.md"]

# Runs in the child: reads [[page, [(first line, code), ...]], ...] as JSON on stdin; prints
# each block's time, a failing block's traceback, and last a JSON line {page: passed}. A
# page stops at its first failing block; the next page still runs.
_RUNNER = r"""
import json, sys, time, traceback
import jax

passed = {}
for page, blocks in json.load(sys.stdin):
  passed[page] = True
  for first_line, code in blocks:
    jax.config.update("jax_enable_x64", False)     # the default, whatever the last block set
    start = time.perf_counter()
    try:
      # Padded so that tracebacks point at the page's own lines.
      exec(compile("\n" * (first_line - 1) + code, page, "exec"), {"__name__": "__tour__"})
    except BaseException:
      print(f"{page}: the python block starting at line {first_line} failed:", flush=True)
      traceback.print_exc(file=sys.stdout)
      passed[page] = False
      break
    print(f"{page}: block at line {first_line}: {time.perf_counter() - start:.1f} s", flush=True)
print(json.dumps(passed))
"""

# Development history has no place in a user's README (STYLE.md): dates, sessions, work items.
_HISTORY = [
    r"\b20\d\d-\d\d-\d\d\b",                     # dates
    r"\bsessions?\b",
    r"\bissue\s*#?\d+",
    r"\bstep \d+\b",
    r"\bcore v\d\b",
    r"\bnot kept\b",
    r"\breviewer\b",
    r"\b(slow|slower|slowest|busier) hour\b",
]


def _text():
  return README.read_text(encoding="utf-8")


def _fenced_blocks(text, language):
  """(first line of the code, code) of each ```language block."""
  blocks, lines, i = [], text.splitlines(), 0
  while i < len(lines):
    if lines[i].strip() == "```" + language:
      start = i + 1
      end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
      blocks.append((start + 1, "\n".join(lines[start:end]) + "\n"))
      i = end
    i += 1
  return blocks


def test_readme_is_at_most_150_lines():
  count = len(_text().splitlines())
  assert count <= MAX_LINES, f"README.md has {count} lines (at most {MAX_LINES}): move detail to docs/"


def test_readme_has_no_development_history():
  text = _text()
  found = {pattern: m.group(0) for pattern in _HISTORY
           if (m := re.search(pattern, text, flags=re.IGNORECASE))}
  assert not found, f"development history in README.md (belongs in CHANGELOG.md): {found}"


def test_readme_relative_links_resolve():
  targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _text())
  local = [t for t in targets if "://" not in t]
  assert local, "no relative links found"
  missing = [t for t in local if not (ROOT / t).exists()]
  assert not missing, f"README.md links to files that do not exist: {missing}"


def test_two_commands_match_ci_and_getting_started():
  section = _text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
  install_and_run, install_and_test = [code.strip() for _, code in _fenced_blocks(section, "bash")]
  assert 'pip install ".[examples]"' in install_and_run   # the light first command: no test tools
  assert install_and_run.endswith("python examples/quickstart.py")
  # .ci/run runs exactly the README's test command (after creating its own virtual environment).
  test_command = install_and_test.split("&& ", 2)[2]
  assert test_command == 'pip install -e ".[test]" && python -m pytest -q', test_command
  assert test_command in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
  getting_started = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
  assert install_and_run in getting_started and install_and_test in getting_started


@functools.lru_cache(maxsize=None)
def _run_tours():
  """(passed per page, the child's output): every page's blocks in one child process, so that
  the pages share one JAX start-up and the compilations of the calls they have in common."""
  tours = [[page, _fenced_blocks((ROOT / page).read_text(encoding="utf-8"), "python")]
           for page in TOURS]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("JAX_ENABLE_X64", None)
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(tours),
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  output = f"python blocks: {time.perf_counter() - start:.1f} s\n{proc.stdout}\n{proc.stderr}"
  lines = proc.stdout.strip().splitlines()
  passed = json.loads(lines[-1]) if proc.returncode == 0 and lines else {}
  return passed, output, {page: len(blocks) for page, blocks in tours}


@pytest.mark.parametrize("page", TOURS)
def test_every_python_block_runs(page):
  passed, output, counts = _run_tours()
  print(output)
  assert counts[page], f"{page} has no ```python block"
  assert passed.get(page), output
  assert output.count(f"{page}: block at line") == counts[page], output
