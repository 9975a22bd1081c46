"""The 0.1.0 call forms of reordered or renamed parameters, kept for one release (issue 13).

jaxrdp 1.0 puts every ``rdp_*`` curve's ``orders`` last and DP-SGD's parameters in one order
(q, σ, T). A positional call cannot be reordered silently: ``rdp_relative_gaussian(alpha, eta,
gamma, dim)`` read in the new order would compute the ε of other parameters, possibly a smaller
one. So for this release the moved parameters are **keyword-only**: a call by keyword means the
same in both releases; a positional call is one written for 0.1.0 and is read in the 0.1.0
order, as before, with a ``DeprecationWarning`` giving the keyword call to write instead. The
next release makes them positional in the new order (where the new order is positional at
all). A renamed parameter (``alpha`` → ``orders``) still accepts its old keyword, with a warning.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Callable, Mapping

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def positional_in_old_order(*old_order: str, renamed: Mapping[str, str] | None = None
                            ) -> Callable[[Callable], Callable]:
  """Decorator: ``fn``'s keyword-only parameters may still be passed by position, in 0.1.0's order.

  Args:
    *old_order: the names of the 0.1.0 positional parameters, in their 0.1.0 order. Those that
      are positional in ``fn`` must come first, unchanged; the others must be keyword-only in
      ``fn`` (under their new name, see ``renamed``).
    renamed: 0.1.0 name -> new name, for renamed parameters (accepted as keywords, with a
      warning).

  Returns:
    The decorator. The wrapped function has ``fn``'s signature (``inspect.signature`` follows
    ``__wrapped__``) and its 0.1.0 order as ``__jaxrdp_old_order__``.

  Raises:
    ValueError: at decoration, an ``old_order`` that does not fit ``fn``'s signature. The
      wrapper raises ``TypeError`` for more positional arguments than the 0.1.0 form took, for
      an argument given twice, or for an old keyword given together with its new name.
  """
  renamed = dict(renamed or {})

  def decorate(fn):
    params = inspect.signature(fn).parameters
    positional = [p.name for p in params.values() if p.kind in _POSITIONAL]
    keyword_only = [p.name for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    n = len(positional)
    moved = old_order[n:]
    if (tuple(old_order[:n]) != tuple(positional)
        or any(renamed.get(m, m) not in keyword_only for m in moved)
        or any(old in params or new not in params for old, new in renamed.items())):
      raise ValueError(f"{fn.__name__}: 0.1.0 order {old_order} does not fit {list(params)}.")
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
      for old, new in renamed.items():
        if old in kwargs:
          if new in kwargs:
            raise TypeError(f"{name}() got both {old!r} (its 0.1.0 name) and {new!r}; "
                            f"pass only {new}=.")
          warnings.warn(f"{name}(): the keyword {old!r} is deprecated; write {new}={old} "
                        "(same meaning).", DeprecationWarning, stacklevel=2)
          kwargs[new] = kwargs.pop(old)
      if len(args) > n:
        if len(args) > len(old_order):
          raise TypeError(f"{name}() takes at most {len(old_order)} positional arguments in its "
                          f"0.1.0 form and {n} in its current one ({len(args)} given).")
        given = moved[:len(args) - n]
        for old, value in zip(given, args[n:]):
          new = renamed.get(old, old)
          if new in kwargs:
            raise TypeError(f"{name}() got multiple values for argument {new!r}.")
          kwargs[new] = value
        new_of = {renamed.get(old, old): old for old in given}
        call = positional + [f"{new}={new_of[new]}" for new in keyword_only if new in new_of]
        more = ", ..." if len(kwargs) > len(given) else ""
        them = "it" if len(given) == 1 else "them"
        warnings.warn(
            f"{name}(): passing {', '.join(given)} by position is deprecated (jaxrdp 1.0 takes "
            f"{them} by keyword). This call is read in the 0.1.0 order {name}("
            f"{', '.join(old_order)}), as before; write {name}({', '.join(call)}{more}), "
            "which means the same.", DeprecationWarning, stacklevel=2)
        args = args[:n]
      return fn(*args, **kwargs)

    wrapper.__jaxrdp_old_order__ = tuple(old_order)
    return wrapper

  return decorate
