"""The README is a front door: short, no development history, links that resolve, and every
Python block in it runs as written. So does every Python block of docs/getting-started.md, the
longer tour.

Each page's ```python blocks run in order in ONE child process (``JAX_PLATFORMS=cpu``; a block's
``jax_enable_x64`` stays out of the test process), each in a fresh namespace and with
``jax_enable_x64`` reset to its default before it, so that a block which uses a name, an import
or float64 without setting it up itself fails: every block can be copied alone. One process per
page keeps the cost to one JAX start-up; the blocks' own first calls (compilations) are the rest,
~10-15 s per page on a 2-core CPU, so the snippets must stay cheap (small step counts, few
distinct calls). A failure's traceback gives the page's own line numbers.
"""

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

# Runs in the child: reads [page, [(first line, code), ...]] as JSON on stdin.
_RUNNER = r"""
import json, sys, time, traceback
import jax

page, blocks = json.load(sys.stdin)
for first_line, code in blocks:
  jax.config.update("jax_enable_x64", False)     # the default, whatever the last block set
  start = time.perf_counter()
  try:
    # Padded so that tracebacks point at the page's own lines.
    exec(compile("\n" * (first_line - 1) + code, page, "exec"), {"__name__": "__tour__"})
  except BaseException:
    print(f"{page}: the python block starting at line {first_line} failed:", file=sys.stderr)
    traceback.print_exc()
    sys.exit(1)
  print(f"block at line {first_line}: {time.perf_counter() - start:.1f} s", flush=True)
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


@pytest.mark.parametrize("page", TOURS)
def test_every_python_block_runs(page):
  blocks = _fenced_blocks((ROOT / page).read_text(encoding="utf-8"), "python")
  assert blocks, f"{page} has no ```python block"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("JAX_ENABLE_X64", None)
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps([page, blocks]),
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  print(f"\n{page} python blocks: {time.perf_counter() - start:.1f} s\n{proc.stdout}")
  assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
  assert proc.stdout.count("block at line") == len(blocks), proc.stdout
