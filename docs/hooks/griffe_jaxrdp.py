"""Griffe extension for jaxrdp's documentation site (used by mkdocs.yml, not part of the package).

1. Lazy exports. ``jaxrdp/__init__.py`` loads the optax transforms and the audit on first use
   (module ``__getattr__`` over the ``_LAZY`` table), which griffe's static analysis cannot see.
   For every lazy name this adds an alias ``jaxrdp.<name>`` to the module that defines it, read
   from ``jaxrdp._LAZY`` at build time, so the pages can say ``::: jaxrdp.dpsgd`` and keep working
   when modules move.
2. reST in docstrings. The docstrings are Google style with reST inline markup; before griffe
   parses them this rewrites, in the docstring text only:

   * ``.. math:: ...`` (with its indented continuation lines) -> a ``$$ ... $$`` display block,
   * ``:math:`x``` -> ``\\(x\\)`` (rendered by pymdownx.arithmatex and the vendored KaTeX),
   * ``:func:`x```, ``:class:`x```, ``:data:`x```, ... -> a cross-reference to ``jaxrdp.x`` when
     ``x`` is a public name (``jaxrdp.__all__``), otherwise inline code,
   * a paragraph ending in ``::`` followed by an indented literal block -> a fenced code block,
   * a grouped entry of an ``Args:`` section (``a, b, c: as in f``, possibly wrapped over lines)
     -> one entry per parameter with that description (Google style has one name per entry).
"""

from __future__ import annotations

import importlib
import re

import griffe

_PACKAGE = "jaxrdp"
_ROLE = re.compile(r":(?:py:)?(func|class|data|mod|meth|attr|obj|exc|const):`~?([^`]+)`")
_MATH_ROLE = re.compile(r":math:`([^`]*)`")
_MATH_DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*(?P<first>.*)$")


def _public_names() -> set[str]:
  return set(importlib.import_module(_PACKAGE).__all__)


def _indent_of(line: str) -> int:
  return len(line) - len(line.lstrip())


def _convert_blocks(text: str) -> str:
  """``.. math::`` directives and ``::`` literal blocks -> Markdown blocks."""
  lines = text.split("\n")
  out: list[str] = []
  i = 0
  while i < len(lines):
    line = lines[i]
    match = _MATH_DIRECTIVE.match(line)
    literal = line.rstrip().endswith("::") and not match
    if not (match or literal):
      out.append(line)
      i += 1
      continue
    base = _indent_of(line)
    body: list[str] = []
    if match and match.group("first").strip():
      body.append(match.group("first").strip())
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or _indent_of(lines[j]) > base):
      body.append(lines[j])
      j += 1
    while body and not body[-1].strip():
      body.pop()
      j -= 1
    if literal and not body:       # a "::" that introduces nothing: leave the line alone
      out.append(line)
      i += 1
      continue
    pad = " " * base
    if match:
      tex = [b.strip() for b in body if b.strip()]
      block = [pad + "$$", *(pad + t for t in tex), pad + "$$"]
    else:
      head = line.rstrip()[:-2].rstrip()
      if head.strip():
        out.append(head + ":")
      inner = min(_indent_of(b) for b in body if b.strip())
      code = [pad + b[inner:] if b.strip() else "" for b in body]
      while code and not code[0].strip():
        code.pop(0)
      block = [pad + "```python", *code, pad + "```"]
    if out and out[-1].strip():
      out.append("")
    out.extend(block)
    out.append("")
    i = j
    while i < len(lines) and not lines[i].strip():
      i += 1
  return "\n".join(out)


_SECTION = re.compile(r"^(?P<indent>[ \t]*)(Args|Arguments|Parameters):[ \t]*$")
_NAMES = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*\s*,?\s*$")


def _split_grouped_args(text: str) -> str:
  """``a, b,\n c: desc`` in an Args section -> ``a: desc``, ``b: desc``, ``c: desc``."""
  lines = text.split("\n")
  out: list[str] = []
  i = 0
  while i < len(lines):
    out.append(lines[i])
    section = _SECTION.match(lines[i])
    i += 1
    if not section:
      continue
    base = _indent_of(section.group(0))
    item = None
    while i < len(lines) and (not lines[i].strip() or _indent_of(lines[i]) > base):
      line = lines[i]
      if item is None and line.strip():
        item = _indent_of(line)
      if line.strip() and _indent_of(line) == item:
        # an item: gather "name, name," continuation lines up to the one with the colon
        head, j = line.strip(), i
        while ":" not in head and _NAMES.match(head) and j + 1 < len(lines) \
            and _indent_of(lines[j + 1]) == item:
          j += 1
          head += " " + lines[j].strip()
        names, sep, desc = head.partition(":")
        parts = [n.strip() for n in names.split(",") if n.strip()]
        if sep and len(parts) > 1 and _NAMES.match(names.strip()):
          cont = []
          k = j + 1
          while k < len(lines) and lines[k].strip() and _indent_of(lines[k]) > item:
            cont.append(lines[k])
            k += 1
          for name in parts:
            out.append(" " * item + f"{name}:{desc}")
            out.extend(cont)
          i = k
          continue
      out.append(line)
      i += 1
  return "\n".join(out)


def rest_to_markdown(text: str, public: set[str]) -> str:
  """The docstring text with jaxrdp's reST constructs rewritten as Markdown (see the module)."""
  text = _split_grouped_args(text)
  text = _convert_blocks(text)
  text = _MATH_ROLE.sub(lambda m: r"\(" + m.group(1) + r"\)", text)

  def role(m: re.Match) -> str:
    target = m.group(2).strip()
    name = target[len(_PACKAGE) + 1:] if target.startswith(_PACKAGE + ".") else target
    if name in public:
      return f"[`{target}`][{_PACKAGE}.{name}]"
    return f"`{target}`"

  return _ROLE.sub(role, text)


class JaxrdpDocs(griffe.Extension):
  """Aliases for jaxrdp's lazily loaded exports; reST math and roles in docstrings -> Markdown."""

  def __init__(self) -> None:
    super().__init__()
    self._public = _public_names()

  def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
    if obj.docstring is not None and obj.path.startswith(_PACKAGE):
      obj.docstring.value = rest_to_markdown(obj.docstring.value, self._public)

  def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
    if pkg.path != _PACKAGE:
      return
    lazy = getattr(importlib.import_module(_PACKAGE), "_LAZY", {})
    for name, module in lazy.items():
      if name not in pkg.members:
        pkg.set_member(name, griffe.Alias(name, f"{module}.{name}", parent=pkg))
