"""Command-line interface to jaxrdp: ε of DP-SGD, calibration of σ, privacy statements, plots.

Usage::

  jaxrdp epsilon   --sampling-rate Q --noise-multiplier S --steps T --delta D [--orders A,B,...] [--json]
  jaxrdp calibrate --epsilon E --delta D --sampling-rate Q --steps T [--json]
  jaxrdp dpsgd     --dataset-size N --batch-size B --epochs E --noise-multiplier S --delta D [--json]
  jaxrdp plot      --sampling-rate Q --noise-multiplier S --steps T --delta D --out FILE.png
  jaxrdp sweep     --sampling-rates QS --noise-multipliers SS --steps TS --deltas DS
                   [--out FILE.csv|FILE.parquet] [--heatmap FILE.png] [--progress]

(``python -m jaxrdp ...`` is the same.) Three values of ε are reported:

* ``epsilon`` / ``order``: the best order of the grid (``--orders``, default
  :data:`jaxrdp.DEFAULT_ORDERS`), from :func:`jaxrdp.compute_rdp` + :func:`jaxrdp.compute_epsilon`;
* ``epsilon_refined``: :func:`jaxrdp.dpsgd_epsilon`, which refines the order continuously
  around the best grid order (never looser than the grid value);
* ``epsilon_classic`` / ``order_classic`` (``epsilon`` and ``dpsgd``): the grid value under the
  classic conversion ε = min_α RDP(α) + log(1/δ)/(α − 1) (Mironov 2017, Prop. 3), what TF
  Privacy's tutorials and Abadi et al. (2016) reported — looser, for reconciling published
  numbers with jaxrdp's.

``sweep`` evaluates ε over the grid of all combinations (:func:`jaxrdp.accounting.sweep`: grid orders,
every cell equal to ``dpsgd_epsilon(..., refine_order=False)``) and writes a table and/or a
heatmap; grid values are comma lists or ranges ``START:STOP:NUM[:log]`` (see ``jaxrdp sweep -h``).

``calibrate`` prints the smallest noise multiplier whose grid ε is at most the target
(:func:`jaxrdp.calibrate_noise_multiplier`). ``--json`` prints one JSON object; a non-finite
value (e.g. ε = inf) is written as ``null``. ``dpsgd`` also reports the PLD's ε; where the PLD
cannot be sized for the schedule (too many grid points at its interval) and the accountant is
RDP, it reports the RDP result and says the PLD is unavailable (JSON: ``epsilon_pld`` null,
``epsilon_pld_unavailable`` the reason, null otherwise); with ``--accountant pld`` that is an
error. ``plot`` needs matplotlib (``pip install matplotlib``).

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
from jaxrdp._internal import domains
from jaxrdp.accounting.sweep import sweep as _sweep

_PROG = "jaxrdp"
_PLOT_POINTS = 40

# Library argument names -> CLI flags, for the library's messages that the flags' types
# (checked against the library's DOMAINS, see _in) cannot anticipate: a calibration target
# that no noise multiplier reaches, sweep's chunk size.
_FLAG_OF = {
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


def _numbers(text):
  try:
    return [float(part) for part in text.split(",")]
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"must be a comma-separated list of numbers, got {text!r}") from None


def _fmt(v) -> str:
  return f"{v:g}"


def _range(domain: str) -> str:
  """The library's DOMAINS[domain] as the CLI writes it: "in (0, 1)", "> 0", ">= 1"."""
  d = domains.DOMAINS[domain]
  if d.hi is None:
    return f"{'>' if d.lo_open else '>='} {_fmt(d.lo)}"
  return f"in {'(' if d.lo_open else '['}{_fmt(d.lo)}, {_fmt(d.hi)}{')' if d.hi_open else ']'}"


def _in(domain: str, parse=_number):
  """An argparse type: ``parse`` the text (a number, a list or a grid of them), then check each
  value against the library's DOMAINS[domain]. argparse puts the flag before the message."""
  allowed = domains.DOMAINS[domain]

  def convert(text):
    value = parse(text)
    for v in np.atleast_1d(value).tolist():
      if not domains.inside(allowed, v):
        unbounded = allowed.hi is None and not allowed.allow_inf
        finite = " and finite" if unbounded and v == math.inf else ""
        raise argparse.ArgumentTypeError(
            f"must {'be' if allowed.hi is None else 'lie'} {_range(domain)}{finite}, got {_fmt(v)}")
    return value
  return convert


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
  """(grid ε, its order, refined ε, classic grid ε, its order), computed in float64. The
  classic value is the conversion of Mironov (2017, Prop. 3), ε = min_α RDP(α) +
  log(1/δ)/(α − 1), which TF Privacy's tutorials and Abadi et al. (2016) reported: looser
  than the default conversion, printed so that published numbers can be reconciled."""
  with jax.enable_x64(True):
    grid = _grid(orders)
    rdp = jaxrdp.compute_rdp(q, sigma, steps, grid)
    eps, order = jaxrdp.compute_epsilon(grid, rdp, delta)
    classic, classic_order = jaxrdp.compute_epsilon(grid, rdp, delta, method="classic")
    refined = jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, orders=grid)
    return (float(eps), float(order), float(refined), float(classic), float(classic_order))


def _pld_epsilon(q, sigma, steps, delta) -> float:
  """ε by the privacy-loss distribution (jaxrdp.pld_epsilon), float64."""
  with jax.enable_x64(True):
    return float(jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, accountant="pld"))


def _optional_pld_epsilon(q, sigma, steps, delta, *, required):
  """(ε by the PLD, None), or (None, why) where the PLD's grid cannot be sized for this
  schedule (a ValueError of the PLD accountant: too many grid points at the default interval)
  and it is only reported beside the RDP statement. ``required`` (the headline is the PLD's):
  the error propagates (exit 2)."""
  try:
    return _pld_epsilon(q, sigma, steps, delta), None
  except ValueError as err:
    if required:
      raise
    return None, _library_error(err)


def _cmd_epsilon(args, out) -> None:
  if args.accountant == "pld":
    if args.orders is not None:
      _fail("--orders applies to --accountant rdp only")
    eps = _pld_epsilon(args.sampling_rate, args.noise_multiplier, args.steps, args.delta)
    if args.json:
      print(json.dumps({"epsilon": _json_number(eps), "accountant": "pld"}), file=out)
      return
    print(f"epsilon = {eps:.6g} by the privacy-loss distribution (tight accounting; "
          "dpsgd_epsilon(..., accountant='pld'))", file=out)
    return
  eps, order, refined, classic, classic_order = _epsilons(
      args.sampling_rate, args.noise_multiplier, args.steps, args.delta, args.orders)
  if args.json:
    print(json.dumps({"epsilon": _json_number(eps), "order": _json_number(order),
                      "epsilon_refined": _json_number(refined),
                      "epsilon_classic": _json_number(classic),
                      "order_classic": _json_number(classic_order)}), file=out)
    return
  n = len(_grid(args.orders))
  print(f"epsilon = {eps:.6g} at order {order:g} (best of {n} grid orders; "
        "compute_rdp + compute_epsilon)", file=out)
  print(f"epsilon = {refined:.6g} with the order refined continuously (dpsgd_epsilon)", file=out)
  print(f"epsilon = {classic:.6g} at order {classic_order:g} under the classic conversion "
        "RDP + log(1/delta)/(order - 1) (Mironov 2017; TF Privacy's tutorials, Abadi et al.)",
        file=out)


def _cmd_calibrate(args, out) -> None:
  with jax.enable_x64(True):
    sigma = float(jaxrdp.calibrate_noise_multiplier(args.epsilon, args.delta, args.sampling_rate,
                                                    args.steps, accountant=args.accountant))
  if args.json:
    print(json.dumps({"noise_multiplier": _json_number(sigma), "accountant": args.accountant}),
          file=out)
    return
  how = ("default grid orders" if args.accountant == "rdp"
         else "privacy-loss distribution, tight accounting")
  print(f"noise multiplier = {sigma!r}", file=out)
  print(f"(smallest sigma with epsilon <= {args.epsilon:g} at delta = {args.delta:g}, "
        f"q = {args.sampling_rate:g}, {args.steps} steps; {how})", file=out)


def _cmd_dpsgd(args, out) -> None:
  n, b = args.dataset_size, args.batch_size
  if b > n:
    _fail(f"--batch-size must be at most --dataset-size ({n}), got {b}")
  q = b / n
  # Exact arithmetic, so that e.g. 3 epochs of 100 examples in batches of 10 is 30 steps, not 31.
  steps = math.ceil(fractions.Fraction(repr(args.epochs)) * n / b)
  eps, order, refined, classic, classic_order = _epsilons(q, args.noise_multiplier, steps,
                                                          args.delta)
  tight, unavailable = _optional_pld_epsilon(q, args.noise_multiplier, steps, args.delta,
                                             required=args.accountant == "pld")
  if args.json:
    print(json.dumps({"sampling_rate": q, "steps": steps, "epsilon": _json_number(eps),
                      "order": _json_number(order), "epsilon_refined": _json_number(refined),
                      "epsilon_classic": _json_number(classic),
                      "order_classic": _json_number(classic_order),
                      "epsilon_pld": None if tight is None else _json_number(tight),
                      "epsilon_pld_unavailable": unavailable, "accountant": args.accountant}),
          file=out)
    return
  grid = len(jaxrdp.DEFAULT_ORDERS)
  headline = refined if args.accountant == "rdp" else tight
  by = ("Renyi DP" if args.accountant == "rdp" else "its privacy-loss distribution")
  lines = [
      f"DP-SGD with sampling rate q = {q:.6g} and noise multiplier {args.noise_multiplier:g}, "
      f"iterated over {steps} steps, satisfies differential privacy with "
      f"epsilon = {headline:.4g} and delta = {args.delta:g} (accounted by {by}).",
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
      f"(dpsgd_epsilon; {eps - refined:.3g} below the grid value);",
      f"  - epsilon = {classic:.6g} at order {classic_order:g} under the classic conversion "
      "epsilon = min RDP + log(1/delta)/(order - 1)",
      "    (Mironov 2017, Prop. 3: what TF Privacy's tutorials and Abadi et al. 2016 reported; "
      "looser, for comparison with published numbers).",
      "Result (privacy-loss distribution, tight accounting):",
      f"  - epsilon = {tight:.6g} (pessimistic discretisation at interval 1e-4, both adjacency "
      "directions; dpsgd_epsilon(..., accountant='pld'))." if tight is not None else
      f"  - unavailable for this configuration (the Renyi DP result above stands): "
      f"{unavailable}",
  ]
  print("\n".join(lines), file=out)


def _cmd_plot(args, out) -> None:
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


_SWEEP_VALUES = """\
Grid values (--sampling-rates, --noise-multipliers, --steps, --deltas): comma-separated items,
each a number or a range START:STOP:NUM[:log|:lin] of NUM values from START to STOP, both
included, evenly spaced (lin, the default) or log-spaced (log; START, STOP > 0). Examples:
  --sampling-rates 1e-4:1e-1:100:log   --noise-multipliers 0.5:5:100
  --steps 100,1000,10000               --deltas 1e-5,1e-6
Range values of --steps are rounded to whole numbers (duplicates dropped).

Output: --out FILE.csv writes one row per grid point, columns
sampling_rate,noise_multiplier,steps,delta,epsilon (epsilon at the best grid order, as
jaxrdp.sweep / dpsgd_epsilon(refine_order=False)); --out FILE.parquet needs pyarrow.
--heatmap FILE.png draws epsilon over sampling rate x noise multiplier for one (steps, delta):
the first of each, or --heatmap-steps / --heatmap-delta (values of the grid).
"""


def _grid_values(text):
  """Comma-separated numbers and START:STOP:NUM[:log|:lin] ranges, as a float64 array."""
  values = []
  for item in text.split(","):
    parts = [p.strip() for p in item.split(":")]
    try:
      if len(parts) == 1:
        values.append(float(parts[0]))
        continue
      if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] not in ("lin", "log")):
        raise ValueError
      start, stop, num = float(parts[0]), float(parts[1]), int(parts[2])
    except ValueError:
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


def _grid_steps(text):
  """As :func:`_grid_values`; range values rounded to whole numbers, plain values must be whole."""
  values = []
  for item in text.split(","):
    part = _grid_values(item)
    if ":" in item:
      part = np.rint(part)
      part = part[np.concatenate([[True], np.diff(part) != 0])]
    elif not float(part[0]).is_integer():
      raise argparse.ArgumentTypeError(f"must be whole numbers, got {item!r}")
    values.extend(part.tolist())
  return np.asarray(values, np.float64)


def _pick(flag, grid_flag, grid, value):
  if value is None:
    return 0
  hit = np.flatnonzero(np.isclose(grid, value, rtol=1e-9, atol=0))
  if hit.size == 0:
    _fail(f"{flag} must be one of the {grid_flag} values ({', '.join(_fmt(v) for v in grid)}), "
          f"got {_fmt(value)}")
  return int(hit[0])


def _writable(flag, path) -> None:
  import os
  parent = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
    _fail(f"{flag} cannot be written: {path}")


def _write_table(path, axes, eps) -> None:
  names = ("sampling_rate", "noise_multiplier", "steps", "delta")
  if path.endswith(".parquet"):
    import pyarrow as pa
    import pyarrow.parquet as pq
    columns = {n: c.ravel() for n, c in zip(names, np.meshgrid(*axes, indexing="ij"))}
    columns["steps"] = columns["steps"].astype(np.int64)
    columns["epsilon"] = eps.ravel()
    pq.write_table(pa.table(columns), path)
    return
  import csv
  import itertools
  text = [[repr(float(v)) for v in a] for a in axes]
  text[2] = [str(int(v)) for v in axes[2]]
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(names + ("epsilon",))
    writer.writerows(cell + (repr(e),) for cell, e in zip(itertools.product(*text),
                                                          eps.ravel().tolist()))


def _cell_edges(v, log):
  """Edges of cells centred on the sorted grid values v (geometric midpoints on a log axis)."""
  x = np.log(v) if log else np.asarray(v, np.float64)
  if x.size == 1:
    half = 0.1 if log else max(0.5 * abs(x[0]), 0.5)
    edges = np.array([x[0] - half, x[0] + half])
  else:
    mid = 0.5 * (x[1:] + x[:-1])
    edges = np.concatenate([[2 * x[0] - mid[0]], mid, [2 * x[-1] - mid[-1]]])
  return np.exp(edges) if log else edges


def _write_heatmap(path, q, sigma, eps, steps, delta) -> None:
  from matplotlib import colors
  from matplotlib.figure import Figure
  fig = Figure(figsize=(7, 5), layout="constrained")
  ax = fig.subplots()
  z = np.ma.masked_invalid(np.where(eps > 0, eps, np.nan)).T   # rows: sigma, columns: q
  norm = colors.LogNorm() if z.count() else None
  log_q = q.size >= 2 and q.min() > 0 and q.max() / q.min() >= 10
  mesh = ax.pcolormesh(_cell_edges(q, log_q), _cell_edges(sigma, False), z, norm=norm,
                       cmap="viridis")
  fig.colorbar(mesh, ax=ax, label="epsilon")
  if q.size >= 2 and sigma.size >= 2 and z.count():
    levels = [v for v in (0.5, 1, 2, 4, 8, 16, 32) if z.min() < v < z.max()]
    if levels:
      lines = ax.contour(q, sigma, z, levels=levels, colors="white", linewidths=0.8)
      ax.clabel(lines, fmt="%g", fontsize=8)
  if log_q:
    ax.set_xscale("log")
  ax.set_xlabel("sampling rate q")
  ax.set_ylabel("noise multiplier sigma")
  ax.set_title(f"epsilon after {int(steps)} steps, delta = {delta:g}")
  fig.savefig(path, dpi=100)


def _cmd_sweep(args, out) -> None:
  if args.out is None and args.heatmap is None:
    _fail("--out (a .csv or .parquet file) or --heatmap (a .png file) is required")
  if args.out is not None:
    _writable("--out", args.out)
    if args.out.endswith(".parquet"):
      try:
        import pyarrow.parquet  # noqa: F401
      except ImportError:
        _fail("--out FILE.parquet needs pyarrow: pip install pyarrow (or write a .csv file)")
  if args.heatmap is not None:
    _writable("--heatmap", args.heatmap)
    try:
      import matplotlib.figure  # noqa: F401
    except ImportError:
      _fail("--heatmap needs matplotlib: pip install matplotlib")
  t_index = _pick("--heatmap-steps", "--steps", args.steps, args.heatmap_steps)
  d_index = _pick("--heatmap-delta", "--deltas", args.deltas, args.heatmap_delta)
  if args.progress:
    try:
      import tqdm  # noqa: F401
    except ImportError:
      _fail("--progress needs tqdm: pip install tqdm")
  axes = (args.sampling_rates, args.noise_multipliers, args.steps, args.deltas)
  with jax.enable_x64(True):
    eps = np.asarray(_sweep(*axes, orders=None if args.orders is None else _grid(args.orders),
                            chunk_size=args.chunk_size, progress=args.progress))
  if args.out is not None:
    try:
      _write_table(args.out, axes, eps)
    except OSError as err:
      _fail(f"--out cannot be written: {' '.join(str(err).split())}")
    counts = "{} sampling rates x {} noise multipliers x {} steps x {} deltas".format(*eps.shape)
    print(f"wrote {args.out} ({eps.size} rows: {counts})", file=out)
  if args.heatmap is not None:
    steps, delta = args.steps[t_index], args.deltas[d_index]
    try:
      _write_heatmap(args.heatmap, args.sampling_rates, args.noise_multipliers,
                     eps[:, :, t_index, d_index], steps, delta)
    except (OSError, ValueError) as err:
      _fail(f"--heatmap cannot be written: {' '.join(str(err).split())}")
    print(f"wrote {args.heatmap} (epsilon at steps = {int(steps)}, delta = {delta:g})", file=out)


def _build_parser() -> argparse.ArgumentParser:
  parser = _Parser(prog=_PROG, description="Renyi-DP accounting for DP-SGD (jaxrdp).")
  parser.add_argument("--version", action="version", version=f"jaxrdp {jaxrdp.__version__}")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

  def add(p, flag, domain, parse, help_):
    """A required flag with values in the library's DOMAINS[domain] ({} in help_: the range)."""
    p.add_argument(flag, type=_in(domain, parse), required=True, help=help_.format(_range(domain)))

  def add_orders(p):
    p.add_argument("--orders", type=_in("orders", _numbers), default=None,
                   help=f"comma-separated Renyi orders {_range('orders')} "
                   "(default: jaxrdp.DEFAULT_ORDERS)")

  def add_accountant(p, what="the accountant"):
    p.add_argument("--accountant", choices=("rdp", "pld"), default="rdp",
                   help=f"{what}: rdp (Renyi DP, default) or pld (privacy-loss distribution: "
                   "tight, slower)")

  p = sub.add_parser("epsilon", help="epsilon of DP-SGD with Poisson sampling")
  add(p, "--sampling-rate", "sampling_rate", _number, "q {}")
  add(p, "--noise-multiplier", "positive_noise_multiplier", _number, "sigma {}")
  add(p, "--steps", "count", _whole, "number of steps T {}")
  add(p, "--delta", "delta", _number, "delta {}")
  add_orders(p)
  add_accountant(p)
  p.add_argument("--json", action="store_true", help="print a JSON object")
  p.set_defaults(func=_cmd_epsilon)

  p = sub.add_parser("calibrate", help="smallest noise multiplier reaching a target epsilon")
  add(p, "--epsilon", "target_epsilon", _number, "target epsilon {}")
  add(p, "--delta", "delta", _number, "delta {}")
  add(p, "--sampling-rate", "sampling_rate", _number, "q {}")
  add(p, "--steps", "count", _whole, "number of steps T {}")
  add_accountant(p)
  p.add_argument("--json", action="store_true", help="print a JSON object")
  p.set_defaults(func=_cmd_calibrate)

  p = sub.add_parser("dpsgd", help="privacy statement for DP-SGD training")
  add(p, "--dataset-size", "count", _whole, "number of training examples N {}")
  add(p, "--batch-size", "count", _whole, "expected batch size B {} (q = B/N)")
  add(p, "--epochs", "epochs", _number, "epochs E {} (steps = ceil(E*N/B))")
  add(p, "--noise-multiplier", "positive_noise_multiplier", _number, "sigma {}")
  add(p, "--delta", "delta", _number, "delta {}")
  add_accountant(p, "the accountant of the headline statement (both are printed)")
  p.add_argument("--json", action="store_true", help="print a JSON object")
  p.set_defaults(func=_cmd_dpsgd)

  p = sub.add_parser("plot", help="plot epsilon vs steps and the RDP curve (needs matplotlib)")
  add(p, "--sampling-rate", "sampling_rate", _number, "q {}")
  add(p, "--noise-multiplier", "positive_noise_multiplier", _number, "sigma {}")
  add(p, "--steps", "count", _whole, "number of steps T {}")
  add(p, "--delta", "delta", _number, "delta {}")
  p.add_argument("--out", type=str, required=True, help="output image file, e.g. eps.png")
  p.set_defaults(func=_cmd_plot)

  p = sub.add_parser("sweep", help="epsilon over a grid of (q, sigma, steps, delta): table, heatmap",
                     description="Epsilon of DP-SGD (Poisson sampling) for every combination of the "
                     "grid values (jaxrdp.sweep, float64).", epilog=_SWEEP_VALUES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  add(p, "--sampling-rates", "sampling_rate", _grid_values, "sampling rates q {}")
  add(p, "--noise-multipliers", "positive_noise_multiplier", _grid_values,
      "noise multipliers sigma {}")
  add(p, "--steps", "count", _grid_steps, "step counts T {} (whole numbers)")
  add(p, "--deltas", "delta", _grid_values, "deltas {}")
  p.add_argument("--out", default=None, help="table to write: FILE.csv, or FILE.parquet (pyarrow)")
  p.add_argument("--heatmap", default=None, help="image to write: epsilon over q x sigma (FILE.png)")
  p.add_argument("--heatmap-steps", type=_whole, default=None,
                 help="steps value of the heatmap (default: the first of --steps)")
  p.add_argument("--heatmap-delta", type=_number, default=None,
                 help="delta of the heatmap (default: the first of --deltas)")
  add_orders(p)
  p.add_argument("--chunk-size", type=_whole, default=None,
                 help="(q, sigma) pairs per compiled call (default: automatic)")
  p.add_argument("--progress", action="store_true", help="show a progress bar (needs tqdm)")
  p.set_defaults(func=_cmd_sweep)
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
