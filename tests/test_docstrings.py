"""Every public callable documents its arguments, its result and what it raises (issue 13):
functions have ``Args:`` and ``Returns:`` sections, and ``Raises:`` where their code raises or
validates; classes (results and optimizer states) have ``Attributes:``."""

import inspect

import pytest

import jaxrdp

PUBLIC = [n for n in jaxrdp.__all__ if callable(getattr(jaxrdp, n))]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_callables_document_their_interface(name):
  obj = getattr(jaxrdp, name)
  doc = inspect.getdoc(obj) or ""
  if inspect.isclass(obj):
    assert "Attributes:" in doc, name
    return
  assert "Args:" in doc and "Returns:" in doc, name
  source = inspect.getsource(obj)
  if "raise " in source or "check_" in source or "_check" in source:
    assert "Raises:" in doc, name
