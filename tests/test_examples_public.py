"""The examples teach the public API: only names in ``jaxrdp.__all__`` (no submodules), and no
private name of another library (issue 13)."""

import ast
import pathlib

import jaxrdp

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))


def _uses(path):
  """(modules imported from jaxrdp's submodules, jaxrdp.X attributes, private attributes)."""
  tree = ast.parse(path.read_text())
  submodules, attributes, private = [], [], []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jaxrdp."):
      submodules.append(node.module)
    if isinstance(node, ast.Import):
      submodules += [a.name for a in node.names if a.name.startswith("jaxrdp.")]
    if isinstance(node, ast.Attribute):
      if isinstance(node.value, ast.Name) and node.value.id == "jaxrdp":
        attributes.append(node.attr)
      if node.attr.startswith("_") and not node.attr.startswith("__"):
        private.append(ast.unparse(node))
  return submodules, attributes, private


def test_there_are_examples():
  assert len(EXAMPLES) >= 4


def test_examples_use_only_the_public_api():
  public = set(jaxrdp.__all__) | {"__version__"}
  for path in EXAMPLES:
    submodules, attributes, private = _uses(path)
    assert not submodules, (path.name, submodules)
    assert set(attributes) <= public, (path.name, sorted(set(attributes) - public))
    assert not private, (path.name, private)
