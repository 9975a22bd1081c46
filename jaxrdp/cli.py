"""Command-line interface to jaxrdp: ε of DP-SGD, calibration of σ, privacy statements, plots.

Usage::

  jaxrdp epsilon   --sampling-rate Q --noise-multiplier S --steps T --delta D [--orders A,B,...] [--json]
  jaxrdp calibrate --epsilon E --delta D --sampling-rate Q --steps T [--json]
  jaxrdp dpsgd     --dataset-size N --batch-size B --epochs E --noise-multiplier S --delta D [--json]
  jaxrdp plot      --sampling-rate Q --noise-multiplier S --steps T --delta D --out FILE.png

(``python -m jaxrdp ...`` is the same.) Two values of ε are reported:

* ``epsilon`` / ``order``: the best order of the grid (``--orders``, default
  :data:`jaxrdp.DEFAULT_ORDERS`), from :func:`jaxrdp.compute_rdp` + :func:`jaxrdp.compute_epsilon`;
* ``epsilon_refined``: :func:`jaxrdp.dpsgd_epsilon`, which refines the order continuously
  around the best grid order (never looser than the grid value).

``calibrate`` prints the smallest noise multiplier whose grid ε is at most the target
(:func:`jaxrdp.calibrate_noise_multiplier`). ``--json`` prints one JSON object; a non-finite
value (e.g. ε = inf) is written as ``null``. ``plot`` needs matplotlib (``pip install matplotlib``).

All computation runs in float64 inside ``with jax.enable_x64(True):``; the global flag is never
changed. Bad input exits with status 2 and a one-line message naming the flag.
"""

from __future__ import annotations

import argparse
import fractions
import json
import math
import re
import sys

import jax
import numpy as np

import jaxrdp

_PROG = "jaxrdp"
_PLOT_POINTS = 40

# Library argument names -> CLI flags, for messages of the library's ValueError / TypeError.
_FLAG_OF = {
    "target_epsilon": "--epsilon",
    "sampling_rate": "--sampling-rate",
    "noise_multiplier": "--noise-multiplier",
    "steps": "--steps",
    "delta": "--delta",
    "orders": "--orders",
}


class UsageError(Exception):
  """Bad command-line input; the message is shown after ``jaxrdp: error:``."""


class _Parser(argparse.ArgumentParser):
  """An ArgumentParser whose errors are one line (no usage block) and name the flag first."""

  def error(self, message):
    message = re.sub(r"^argument (--[\w-]+)(?:/[\w-]+)?: ", r"\1 ", message)
    raise UsageError(message)


def _fail(message) -> None:
  raise UsageError(message)


def _number(text):
  try:
    return float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def _whole(text):
  try:
    return int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def _orders(text):
  try:
    values = [float(part) for part in text.split(",")]
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"must be a comma-separated list of numbers, got {text!r}") from None
  if not all(v >= 1 for v in values):  # also rejects NaN
    raise argparse.ArgumentTypeError(f"orders must all be >= 1, got {text!r}")
  return values


def _fmt(v) -> str:
  return f"{v:g}"


def _check(flag, value, *, lo=None, hi=None, lo_open=False, hi_open=False) -> None:
  ok = math.isfinite(value)
  if ok and lo is not None:
    ok = value > lo if lo_open else value >= lo
  if ok and hi is not None:
    ok = value < hi if hi_open else value <= hi
  if not ok:
    if hi is None:
      where = f"be {'>' if lo_open else '>='} {_fmt(lo)}"
    else:
      where = f"lie in {'(' if lo_open else '['}{_fmt(lo)}, {_fmt(hi)}{')' if hi_open else ']'}"
    _fail(f"{flag} must {where}, got {_fmt(value)}")


def _library_error(err: Exception) -> str:
  """The library's message, one line, with argument names replaced by the CLI flags."""
  message = " ".join(str(err).split())
  pattern = r"\b(" + "|".join(_FLAG_OF) + r")\b"
  return re.sub(pattern, lambda m: _FLAG_OF[m.group(1)], message)


def _json_number(v):
  v = float(v)
  return v if math.isfinite(v) else None


def _grid(orders):
  return np.asarray(jaxrdp.DEFAULT_ORDERS if orders is None else orders, dtype=np.float64)


def _epsilons(q, sigma, steps, delta, orders=None):
  """(grid ε, its order, refined ε), computed in float64."""
  with jax.enable_x64(True):
    grid = _grid(orders)
    rdp = jaxrdp.compute_rdp(q, sigma, steps, grid)
    eps, order = jaxrdp.compute_epsilon(grid, rdp, delta)
    refined = jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, orders=grid)
    return float(eps), float(order), float(refined)


def _check_mechanism(args) -> None:
  _check("--sampling-rate", args.sampling_rate, lo=0.0, hi=1.0)
  _check("--noise-multiplier", args.noise_multiplier, lo=0.0, lo_open=True)
  _check("--steps", args.steps, lo=1)
  _check("--delta", args.delta, lo=0.0, hi=1.0, lo_open=True, hi_open=True)


def _cmd_epsilon(args, out) -> None:
  _check_mechanism(args)
  eps, order, refined = _epsilons(args.sampling_rate, args.noise_multiplier, args.steps,
                                  args.delta, args.orders)
  if args.json:
    print(json.dumps({"epsilon": _json_number(eps), "order": _json_number(order),
                      "epsilon_refined": _json_number(refined)}), file=out)
    return
  n = len(_grid(args.orders))
  print(f"epsilon = {eps:.6g} at order {order:g} (best of {n} grid orders; "
        "compute_rdp + compute_epsilon)", file=out)
  print(f"epsilon = {refined:.6g} with the order refined continuously (dpsgd_epsilon)", file=out)


def _cmd_calibrate(args, out) -> None:
  _check("--epsilon", args.epsilon, lo=0.0, lo_open=True)
  _check("--delta", args.delta, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
  _check("--sampling-rate", args.sampling_rate, lo=0.0, hi=1.0)
  _check("--steps", args.steps, lo=1)
  with jax.enable_x64(True):
    sigma = float(jaxrdp.calibrate_noise_multiplier(args.epsilon, args.delta, args.sampling_rate,
                                                    args.steps))
  if args.json:
    print(json.dumps({"noise_multiplier": _json_number(sigma)}), file=out)
    return
  print(f"noise multiplier = {sigma!r}", file=out)
  print(f"(smallest sigma with epsilon <= {args.epsilon:g} at delta = {args.delta:g}, "
        f"q = {args.sampling_rate:g}, {args.steps} steps; default grid orders)", file=out)


def _cmd_dpsgd(args, out) -> None:
  n, b = args.dataset_size, args.batch_size
  _check("--dataset-size", n, lo=1)
  _check("--batch-size", b, lo=1)
  if b > n:
    _fail(f"--batch-size must be at most --dataset-size ({n}), got {b}")
  _check("--epochs", args.epochs, lo=0.0, lo_open=True)
  _check("--noise-multiplier", args.noise_multiplier, lo=0.0, lo_open=True)
  _check("--delta", args.delta, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
  q = b / n
  # Exact arithmetic, so that e.g. 3 epochs of 100 examples in batches of 10 is 30 steps, not 31.
  steps = math.ceil(fractions.Fraction(repr(args.epochs)) * n / b)
  eps, order, refined = _epsilons(q, args.noise_multiplier, steps, args.delta)
  if args.json:
    print(json.dumps({"sampling_rate": q, "steps": steps, "epsilon": _json_number(eps),
                      "order": _json_number(order), "epsilon_refined": _json_number(refined)}),
          file=out)
    return
  grid = len(jaxrdp.DEFAULT_ORDERS)
  lines = [
      f"DP-SGD with sampling rate q = {q:.6g} and noise multiplier {args.noise_multiplier:g}, "
      f"iterated over {steps} steps, satisfies differential privacy with "
      f"epsilon = {refined:.4g} and delta = {args.delta:g}.",
      "Assumptions:",
      f"  - Poisson sampling: each of the N = {n} examples joins each batch independently with "
      f"probability q = B/N = {b}/{n} = {q:.6g}",
      "    (shuffling into fixed-size batches is a different mechanism, not covered here);",
      f"  - steps = ceil(epochs * N / B) = ceil({args.epochs:g} * {n} / {b}) = {steps};",
      "  - adjacent datasets differ by adding or removing one example; the clipping norm is the "
      "L2 sensitivity.",
      "Result (Renyi DP of the sampled Gaussian mechanism, converted to (epsilon, delta)-DP):",
      f"  - epsilon = {eps:.6g} at the optimal order {order:g} of the default grid "
      f"({grid} orders);",
      f"  - epsilon = {refined:.6g} with the order refined continuously "
      f"(dpsgd_epsilon; {eps - refined:.3g} below the grid value).",
  ]
  print("\n".join(lines), file=out)


def _cmd_plot(args, out) -> None:
  _check_mechanism(args)
  try:
    from matplotlib.figure import Figure
  except ImportError:
    _fail("plot needs matplotlib: pip install matplotlib")
  t = args.steps
  ts = np.unique(np.ceil(np.linspace(t / _PLOT_POINTS, t, _PLOT_POINTS)).astype(np.int64))
  with jax.enable_x64(True):
    grid = _grid(None)
    per_step = np.asarray(jaxrdp.compute_rdp(args.sampling_rate, args.noise_multiplier, 1, grid))
    eps, _ = jaxrdp.compute_epsilon(grid, ts[:, None] * per_step[None, :], args.delta)
    eps = np.asarray(eps)
    rdp_t = per_step * t
    eps_t, order_t = (float(v) for v in jaxrdp.compute_epsilon(grid, rdp_t, args.delta))
  fig = Figure(figsize=(10, 4), layout="constrained")
  ax1, ax2 = fig.subplots(1, 2)
  ax1.plot(ts, eps, marker=".")
  ax1.set_xlabel("steps")
  ax1.set_ylabel(f"epsilon (delta = {args.delta:g})")
  ax1.set_title(f"q = {args.sampling_rate:g}, sigma = {args.noise_multiplier:g}")
  ax1.grid(True, alpha=0.3)
  finite = np.isfinite(grid) & np.isfinite(rdp_t)
  ax2.loglog(grid[finite], rdp_t[finite])
  ax2.axvline(order_t, color="gray", linestyle="--", label=f"optimal order {order_t:g}")
  ax2.set_xlabel("order alpha")
  ax2.set_ylabel(f"RDP after {t} steps")
  ax2.set_title(f"RDP curve (epsilon = {eps_t:.4g})")
  ax2.legend()
  ax2.grid(True, which="both", alpha=0.3)
  try:
    fig.savefig(args.out, dpi=100)
  except (OSError, ValueError) as err:
    _fail(f"--out cannot be written: {' '.join(str(err).split())}")
  print(f"wrote {args.out}", file=out)


def _build_parser() -> argparse.ArgumentParser:
  parser = _Parser(prog=_PROG, description="Renyi-DP accounting for DP-SGD (jaxrdp).")
  parser.add_argument("--version", action="version", version=f"jaxrdp {jaxrdp.__version__}")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

  def add(p, flag, type_, help_):
    p.add_argument(flag, type=type_, required=True, help=help_)

  p = sub.add_parser("epsilon", help="epsilon of DP-SGD with Poisson sampling")
  add(p, "--sampling-rate", _number, "q in [0, 1]")
  add(p, "--noise-multiplier", _number, "sigma > 0")
  add(p, "--steps", _whole, "number of steps T >= 1")
  add(p, "--delta", _number, "delta in (0, 1)")
  p.add_argument("--orders", type=_orders, default=None,
                 help="comma-separated Renyi orders >= 1 (default: jaxrdp.DEFAULT_ORDERS)")
  p.add_argument("--json", action="store_true", help="print a JSON object")
  p.set_defaults(func=_cmd_epsilon)

  p = sub.add_parser("calibrate", help="smallest noise multiplier reaching a target epsilon")
  add(p, "--epsilon", _number, "target epsilon > 0")
  add(p, "--delta", _number, "delta in (0, 1)")
  add(p, "--sampling-rate", _number, "q in [0, 1]")
  add(p, "--steps", _whole, "number of steps T >= 1")
  p.add_argument("--json", action="store_true", help="print a JSON object")
  p.set_defaults(func=_cmd_calibrate)

  p = sub.add_parser("dpsgd", help="privacy statement for DP-SGD training")
  add(p, "--dataset-size", _whole, "number of training examples N")
  add(p, "--batch-size", _whole, "expected batch size B (q = B/N)")
  add(p, "--epochs", _number, "epochs E > 0 (steps = ceil(E*N/B))")
  add(p, "--noise-multiplier", _number, "sigma > 0")
  add(p, "--delta", _number, "delta in (0, 1)")
  p.add_argument("--json", action="store_true", help="print a JSON object")
  p.set_defaults(func=_cmd_dpsgd)

  p = sub.add_parser("plot", help="plot epsilon vs steps and the RDP curve (needs matplotlib)")
  add(p, "--sampling-rate", _number, "q in [0, 1]")
  add(p, "--noise-multiplier", _number, "sigma > 0")
  add(p, "--steps", _whole, "number of steps T >= 1")
  add(p, "--delta", _number, "delta in (0, 1)")
  add(p, "--out", str, "output image file, e.g. eps.png")
  p.set_defaults(func=_cmd_plot)
  return parser


def _enable_compilation_cache() -> None:
  """Reuse compiled kernels across CLI runs (first run ~20 s of compilation, later ones fast).

  The CLI is its own process, so setting JAX's persistent cache here touches no user program;
  JAXRDP_CACHE_DIR overrides the location, an empty value disables it. A user-configured cache
  directory is left alone.
  """
  import os
  if jax.config.jax_compilation_cache_dir:
    return
  path = os.environ.get("JAXRDP_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "jaxrdp"))
  if not path:
    return
  try:
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  except (OSError, AttributeError):
    pass


def main(argv: list[str] | None = None) -> int:
  """Run the CLI on ``argv`` (default ``sys.argv[1:]``); returns 0, raises SystemExit(2) on bad input."""
  if argv is None:
    _enable_compilation_cache()
  try:
    args = _build_parser().parse_args(argv)
    try:
      args.func(args, sys.stdout)
    except (ValueError, TypeError) as err:
      _fail(_library_error(err))
  except UsageError as err:
    print(f"{_PROG}: error: {err}", file=sys.stderr)
    raise SystemExit(2) from None
  return 0


if __name__ == "__main__":
  sys.exit(main())
