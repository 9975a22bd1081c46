"""The package layout: imports run one way, mechanisms → accounting → training → audit → cli.

Every ``import`` statement in ``jaxrdp/`` (module level and inside functions) is read with
``ast`` and mapped to the subpackage it reaches; each subpackage may import only the ones
below it (``jaxrdp/__init__.py`` and ``__main__.py``, which assemble the public namespace,
may import anything).
"""

import ast
import pathlib
import subprocess
import sys

import pytest

import jaxrdp

PACKAGE = pathlib.Path(jaxrdp.__file__).parent
LAYERS = ("_internal", "mechanisms", "accounting", "training", "audit", "cli")
# What each subpackage may import: itself and the layers below it. Only the command line may
# import the public namespace ``jaxrdp`` itself.
ALLOWED = {layer: set(LAYERS[:i + 1]) for i, layer in enumerate(LAYERS)}
ALLOWED["cli"].add("jaxrdp")


def _subpackage(module: str) -> str | None:
  """The subpackage a dotted module name lies in (``jaxrdp`` for the top level), or None
  outside jaxrdp."""
  parts = module.split(".")
  if parts[0] != "jaxrdp":
    return None
  return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "jaxrdp"


def _imports(path: pathlib.Path):
  """(line, target module) of every import in the file, relative imports resolved."""
  package = ".".join(("jaxrdp",) + path.relative_to(PACKAGE).parent.parts)
  return _imports_in(path.read_text(), package)


def _imports_in(source: str, package: str):
  """(line, target module) of every import in ``source``, a module of ``package``."""
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, alias.name
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
      for alias in node.names:
        # `from jaxrdp import mechanisms` reaches the subpackage named, not the top level.
        full = f"{base}.{alias.name}"
        yield node.lineno, full if _subpackage(full) != _subpackage(base) else base


def _layer_of(path: pathlib.Path) -> str | None:
  parts = path.relative_to(PACKAGE).parts
  return parts[0] if len(parts) > 1 else None


def test_every_module_lives_in_a_subpackage():
  top = sorted(p.name for p in PACKAGE.glob("*.py"))
  assert top == ["__init__.py", "__main__.py"]
  assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__") \
      == sorted(LAYERS)


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_run_one_way(layer):
  violations = []
  for path in sorted((PACKAGE / layer).rglob("*.py")):
    for line, module in _imports(path):
      target = _subpackage(module)
      if target is not None and target not in ALLOWED[layer]:
        violations.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
  assert not violations, "imports running upward:\n" + "\n".join(violations)


def test_the_checker_sees_upward_imports():
  """The walk resolves every form of import (so the test above can fail)."""
  source = ("from jaxrdp.accounting import composition\nfrom ..training import transform\n"
            "from jaxrdp import cli\nimport jaxrdp.audit.canary\nfrom . import gaussian\n"
            "def f():\n  import jaxrdp\n")
  targets = [_subpackage(m) for _, m in _imports_in(source, "jaxrdp.mechanisms")]
  assert targets == ["accounting", "training", "cli", "audit", "mechanisms", "jaxrdp"]


def test_import_jaxrdp_does_not_import_optax():
  """The subpackages' ``__init__`` files import nothing, so an accounting query does not pay
  for optax (the transforms load on first use)."""
  code = "import sys, jaxrdp; print('optax' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"
