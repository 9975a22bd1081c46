"""The CLI's input: numbers as flags take them, the library's ranges, the training schedule.

Every numeric flag goes through :func:`exact`: a decimal number (``0.01``, ``1e-5``, ``1e4``) or a
fraction ``A/B`` (``256/60000``), read exactly, so that a whole count written as ``1e4`` is the
whole number 10000 and ``1.5e0`` steps is refused instead of rounded. A training run's dataset
size N, expected batch size B and epochs E give q = B/N and steps = ⌈E·N/B⌉
(:func:`training_schedule`), for every command that takes them.
"""

from __future__ import annotations

import argparse
import fractions
import math
import re

import numpy as np

from jaxrdp._internal import domains

# Library argument names -> CLI flags, for the library's messages that the flags' types
# (checked against the library's DOMAINS, see in_domain) cannot anticipate: a calibration
# target that no noise multiplier reaches, sweep's chunk size.
FLAG_OF = {
    "target_epsilon": "--epsilon",
    "sampling_rate": "--sampling-rate",
    "noise_multiplier": "--noise-multiplier",
    "steps": "--steps",
    "delta": "--delta",
    "orders": "--orders",
    "sampling_rates": "--sampling-rates",
    "noise_multipliers": "--noise-multipliers",
    "deltas": "--deltas",
    "chunk_size": "--chunk-size",
}

RATE_FLAGS = ("--sampling-rate", "--steps")
TRAINING_FLAGS = ("--dataset-size", "--batch-size", "--epochs")


class UsageError(Exception):
  """Bad command-line input; the message is shown after ``jaxrdp: error:``."""


class Parser(argparse.ArgumentParser):
  """An ArgumentParser whose errors are one line (no usage block) and name the flag first."""

  def error(self, message):
    message = re.sub(r"^argument (--[\w-]+)(?:/[\w-]+)?: ", r"\1 ", message)
    raise UsageError(message)


def fail(message) -> None:
  raise UsageError(message)


def exact(text: str):
  """``text`` as a Fraction (a decimal or ``A/B``, read exactly), or a float where it is not
  finite (``nan``, ``inf``, ``1e400``: the range checks name those); ArgumentTypeError else."""
  parts = text.split("/")
  try:
    if len(parts) > 2:
      raise ValueError
    values = []
    for part in parts:
      approx = float(part)   # first, so that 1e999999999 is inf, not a huge integer
      values.append(fractions.Fraction(part) if math.isfinite(approx) else approx)
    if len(values) == 1:
      return values[0]
    if values[1] == 0:
      raise ValueError
    return values[0] / values[1]
  except (ValueError, ZeroDivisionError):
    raise argparse.ArgumentTypeError(
        f"must be a number (e.g. 0.01, 1e-5 or 256/60000), got {text!r}") from None


def number(text: str) -> float:
  """A flag's real value: :func:`exact`, rounded once to the nearest float."""
  value = exact(text)
  try:
    return float(value)
  except OverflowError:   # an A/B beyond the floats
    return math.copysign(math.inf, value)


def whole(text: str) -> int:
  """A count (steps, examples): :func:`exact`, a whole number (``1e4`` is, ``1.5e0`` is not)."""
  value = exact(text)
  if not isinstance(value, fractions.Fraction) or value.denominator != 1:
    raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}")
  return int(value)


def numbers(text: str) -> list[float]:
  """Comma-separated :func:`number` values."""
  try:
    return [number(part) for part in text.split(",")]
  except argparse.ArgumentTypeError:
    raise argparse.ArgumentTypeError(
        f"must be a comma-separated list of numbers, got {text!r}") from None


def fmt(v) -> str:
  return f"{v:g}"


def range_text(domain: str) -> str:
  """The library's DOMAINS[domain] as the CLI writes it: "in (0, 1)", "> 0", ">= 1"."""
  d = domains.DOMAINS[domain]
  if d.hi is None:
    return f"{'>' if d.lo_open else '>='} {fmt(d.lo)}"
  return f"in {'(' if d.lo_open else '['}{fmt(d.lo)}, {fmt(d.hi)}{')' if d.hi_open else ']'}"


def in_domain(domain: str, parse=number):
  """An argparse type: ``parse`` the text (a number, a list or a grid of them), then check each
  value against the library's DOMAINS[domain]. argparse puts the flag before the message."""
  allowed = domains.DOMAINS[domain]

  def convert(text):
    value = parse(text)
    for v in np.atleast_1d(value).tolist():
      if not domains.inside(allowed, v):
        unbounded = allowed.hi is None and not allowed.allow_inf
        finite = " and finite" if unbounded and v == math.inf else ""
        verb = "be" if allowed.hi is None else "lie"
        raise argparse.ArgumentTypeError(
            f"must {verb} {range_text(domain)}{finite}, got {fmt(v)}")
    return value
  return convert


def library_error(err: Exception) -> str:
  """The library's message, one line, with argument names replaced by the CLI flags."""
  message = " ".join(str(err).split())
  pattern = r"\b(" + "|".join(FLAG_OF) + r")\b"
  return re.sub(pattern, lambda m: FLAG_OF[m.group(1)], message)


def grid_values(text):
  """Comma-separated numbers and START:STOP:NUM[:log|:lin] ranges, as a float64 array."""
  values = []
  for item in text.split(","):
    parts = [p.strip() for p in item.split(":")]
    try:
      if len(parts) == 1:
        values.append(number(parts[0]))
        continue
      if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] not in ("lin", "log")):
        raise ValueError
      start, stop, num = number(parts[0]), number(parts[1]), whole(parts[2])
    except (ValueError, argparse.ArgumentTypeError):
      raise argparse.ArgumentTypeError(
          f"must be comma-separated numbers or START:STOP:NUM[:log] ranges, got {item!r}") from None
    if num < 1:
      raise argparse.ArgumentTypeError(f"range {item!r}: NUM must be at least 1")
    if len(parts) == 4 and parts[3] == "log":
      if not (start > 0 and stop > 0):
        raise argparse.ArgumentTypeError(f"log range {item!r}: START and STOP must be > 0")
      values.extend(np.geomspace(start, stop, num).tolist())
    else:
      values.extend(np.linspace(start, stop, num).tolist())
  return np.asarray(values, np.float64)


def grid_steps(text):
  """As :func:`grid_values`; range values rounded to whole numbers, plain values must be whole."""
  values = []
  for item in text.split(","):
    part = grid_values(item)
    if ":" in item:
      part = np.rint(part)
      part = part[np.concatenate([[True], np.diff(part) != 0])]
    elif not float(part[0]).is_integer():
      raise argparse.ArgumentTypeError(f"must be whole numbers, got {item!r}")
    values.extend(part.tolist())
  return np.asarray(values, np.float64)


def points(text: str) -> int:
  """A number of points on a curve: :func:`whole`, at least 2."""
  value = whole(text)
  if value < 2:
    raise argparse.ArgumentTypeError(f"must be at least 2, got {value}")
  return value


def steps_range(text):
  """``START:STOP``: the steps plotted, two whole numbers (:func:`whole`: ``1e4`` is 10000)
  with 0 <= START < STOP."""
  parts = text.split(":")
  try:
    if len(parts) != 2:
      raise argparse.ArgumentTypeError
    start, stop = (whole(part) for part in parts)
  except argparse.ArgumentTypeError:
    raise argparse.ArgumentTypeError(
        f"must be START:STOP, two whole numbers (e.g. 100:1e4), got {text!r}") from None
  if not 0 <= start < stop:
    raise argparse.ArgumentTypeError(f"must be START:STOP with 0 <= START < STOP, got {text!r}")
  return start, stop


def writable(flag, path) -> None:
  """Bad input naming ``flag`` where ``path`` cannot be a file written (before any work)."""
  import os
  parent = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
    fail(f"{flag} cannot be written: {path}")


# --- which flags a command was given --------------------------------------------------------

def given(args, flag) -> bool:
  return getattr(args, flag[2:].replace("-", "_"), None) is not None


def _and(flags) -> str:
  return flags[0] if len(flags) == 1 else ", ".join(flags[:-1]) + " and " + flags[-1]


def choose_form(args, forms, unused=(), why=""):
  """The index of the one of ``forms`` (alternative tuples of flags) given in full; bad input
  (exit 2, naming the flags) for a form given in part, two forms, or a flag of ``unused``
  (``why``: the reason it does not apply)."""
  for flag in unused:
    if given(args, flag):
      fail(f"{flag} does not apply{why}")
  started = [i for i, form in enumerate(forms) if any(given(args, f) for f in form)]
  if len(started) > 1:
    a, b = forms[started[0]], forms[started[1]]
    got = [f for f in a + b if given(args, f)]
    fail(f"give either {_and(a)}, or {_and(b)}, not both (got {', '.join(got)})")
  index = started[0] if started else 0
  form = forms[index]
  missing = [f for f in form if not given(args, f)]
  if missing:
    alternatives = " or ".join(_and(f) for i, f in enumerate(forms) if i != index)
    verb = "is" if len(missing) == 1 else "are"
    message = (f"{_and(missing)} {verb} missing ({_and(form)} go together)" if started
               else f"{_and(missing)} {verb} required")
    fail(message + (f"; or give {alternatives} instead" if alternatives else ""))
  return index


def training_schedule(dataset_size: int, batch_size: int, epochs: float):
  """(q, steps) of training on N examples in expected batches of B for E epochs: q = B/N,
  steps = ⌈E·N/B⌉ (exact arithmetic, so that 3 epochs of 100 examples in batches of 10 is 30
  steps, not 31). The assumptions are spelt out by :func:`assumptions`."""
  n, b = dataset_size, batch_size
  if b > n:
    fail(f"--batch-size must be at most --dataset-size ({n}), got {b}")
  q = b / n
  if epochs is None:
    return q, None
  return q, math.ceil(fractions.Fraction(repr(epochs)) * n / b)


def assumptions(n, b, q, epochs=None, steps=None, epochs_of_steps=False,
                sampling="poisson", max_batch_size=None) -> list[str]:
  """The lines that say how N, B (and E) became q (and steps), as ``dpsgd`` prints them.
  ``epochs_of_steps``: the steps were solved for; the epochs are steps·B/N. ``sampling``: how
  the batches are drawn (:mod:`jaxrdp.accounting.samplers`), ``max_batch_size`` the largest
  batch of truncated Poisson sampling."""
  lines = {
      "poisson": [
          f"  - Poisson sampling: each of the N = {n} examples joins each batch independently "
          f"with probability q = B/N = {b}/{n} = {q:.6g}",
          "    (shuffling into fixed-size batches is a different mechanism: --sampling shuffle);",
      ],
      "truncated_poisson": [
          f"  - truncated Poisson sampling: each of the N = {n} examples joins each batch "
          f"independently with probability q = B/N = {b}/{n} = {q:.6g}, and a batch of more "
          f"than M = {max_batch_size} examples is cut to M of them chosen uniformly at random "
          "(jaxrdp.poisson_sample);",
      ],
      "fixed": [
          f"  - fixed-size batches: each batch is B = {b} of the N = {n} examples drawn uniformly "
          f"without replacement (q = B/N = {q:.6g});",
          "  - adjacent datasets differ by replacing one example (the sum of clipped gradients "
          "moves by up to 2C: the Gaussian's sigma is half the noise multiplier);",
      ],
      "shuffle": [
          f"  - shuffled batches: each epoch the N = {n} examples are permuted and cut into "
          f"floor(N/B) = {n // b} batches of B = {b} (the remainder dropped or a smaller last "
          "batch; not carried into the next epoch);",
          "  - each example takes part in at most one batch per epoch: one Gaussian mechanism per "
          "epoch, at half the noise multiplier (adjacent datasets differ by replacing one "
          "example: sensitivity 2C); no amplification by the shuffle is claimed;",
      ],
  }[sampling]
  if epochs_of_steps:
    lines.append(f"  - epochs = steps * B / N = {steps} * {b} / {n} = {epochs:.6g};")
  elif steps is not None:
    lines.append(f"  - steps = ceil(epochs * N / B) = ceil({epochs:g} * {n} / {b}) = {steps};")
  return lines
