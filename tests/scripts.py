"""The repository's scripts (examples, tools) loaded as modules for the tests."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_script(relative_path):
  """The script at ``relative_path`` (from the repository's root) as a fresh module."""
  path = ROOT / relative_path
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
