"""``jaxrdp plot``: ε against the number of steps, as an image and/or a CSV table.

The curve is ε(δ) after t steps of one DP-SGD schedule (Poisson sampling at q, noise
multiplier σ) at step counts t up to ``--steps`` T (or over ``--steps-range START:STOP``):

* RDP (default): :func:`jaxrdp.epsilon_trajectory`, each value ``dpsgd_epsilon(q, σ, t, δ)``
  (the order refined between grid orders); the image adds the RDP curve after T steps;
* PLD (``--accountant pld``): :func:`jaxrdp.pld_epsilon` at each t, on one grid
  (:func:`jaxrdp.pld_grid`) sized for the last point, so that one program (a ``lax.map``
  over t) computes every point. A grid sized for T fits every t < T and keeps the bound
  pessimistic; at T it is the grid ``pld_epsilon`` sizes itself, so the last value is its own.
  The image adds the RDP curve over the same t for comparison.

Points: ``--points`` step counts (default 40; 20 with the PLD, where each point is a full PLD
composition), evenly spaced on the x axis's scale (geometrically with ``--log x`` or ``both``),
rounded to whole steps, duplicates dropped. ``--csv FILE`` writes one row per point, columns
:data:`CSV_COLUMNS` (the inputs repeated on every row, so files of several runs concatenate).
"""

from __future__ import annotations

import csv
import functools

import jax
import numpy as np

import jaxrdp
from jaxrdp._internal import loops
from jaxrdp.cli.commands import grid, headline
from jaxrdp.cli.parsing import choose_form, fail, writable

POINTS = {"rdp": 40, "pld": 20}   # default --points by accountant
CSV_COLUMNS = ("sampling_rate", "noise_multiplier", "steps", "delta", "accountant", "epsilon")
HELP = """\
Steps: --steps T plots t from T/POINTS to T (from 1 with --log x or both); --steps-range
START:STOP from START to STOP (whole numbers, e.g. 100:1e4; START >= 1 on a log x axis).
The headline is epsilon after the last step count.

Output: --out FILE.png (needs matplotlib) and/or --csv FILE.csv, one row per step count,
columns sampling_rate,noise_multiplier,steps,delta,accountant,epsilon (no matplotlib needed).
--log x|y|both: log scale on the steps axis (x; points spaced geometrically), the epsilon axis
(y), or both.
"""


def step_points(start, stop, points, log_x) -> np.ndarray:
  """Whole step counts from ``start`` (None: ``stop``/points, or 1 on a log axis) to ``stop``,
  ``points`` of them evenly spaced on the axis's scale, rounded, duplicates dropped."""
  if log_x:
    ts = np.geomspace(1 if start is None else start, stop, points)
  else:
    ts = np.linspace(stop / points if start is None else start, stop, points)
  ts = np.unique(np.rint(ts))
  return ts[ts >= (1 if start is None else start)].astype(np.int64)


def rdp_curve(q, sigma, ts, delta) -> np.ndarray:
  """ε after each of ``ts`` steps by RDP (dpsgd_epsilon, refined order), float64."""
  with jax.enable_x64(True):
    return np.asarray(jaxrdp.epsilon_trajectory(q, sigma, float(ts[-1]), delta,
                                                np.asarray(ts, np.float64)))


@functools.partial(jax.jit, static_argnames="pld_grid")
def _pld_map(q, sigma, ts, delta, pld_grid):
  # One point at a time (lax.map, not vmap): each holds the grid's FFT work arrays, up to
  # the library's MAX_BINS points, which a batch of points would multiply.
  return loops.map(lambda t: jaxrdp.pld_epsilon(q, sigma, t, delta, pld_grid=pld_grid), ts)


def pld_grid_for(q, sigma, steps, delta):
  """The grid ``pld_epsilon(q, σ, steps, δ)`` sizes for itself: for reading ε at δ, with the
  default tail mass, or δ/1000 where that is smaller (see :func:`jaxrdp.pld_grid`)."""
  with jax.enable_x64(True):
    return jaxrdp.pld_grid(q, sigma, float(steps), delta=delta)


def pld_curve(q, sigma, ts, delta) -> np.ndarray:
  """ε after each of ``ts`` steps by the PLD, on the grid sized for the last (float64)."""
  pld_grid = pld_grid_for(q, sigma, ts[-1], delta)
  with jax.enable_x64(True):
    return np.asarray(_pld_map(np.float64(q), np.float64(sigma), np.asarray(ts, np.float64),
                               np.float64(delta), pld_grid=pld_grid))


def write_csv(path, q, sigma, ts, delta, accountant, eps) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(CSV_COLUMNS)
    writer.writerows((repr(float(q)), repr(float(sigma)), str(int(t)), repr(float(delta)),
                      accountant, repr(float(e))) for t, e in zip(ts, eps))


def rdp_at(q, sigma, steps, delta):
  """(orders, RDP curve after ``steps``, grid ε, its order): the image's right panel and
  the headline's order."""
  with jax.enable_x64(True):
    orders = grid(None)
    rdp = np.asarray(jaxrdp.compute_rdp(q, sigma, float(steps), orders))
    eps, order = jaxrdp.compute_epsilon(orders, rdp, delta)
    return orders, rdp, float(eps), float(order)


def _scales(ax, log):
  if log in ("x", "both"):
    ax.set_xscale("log")
  if log in ("y", "both"):
    ax.set_yscale("log")


def write_image(path, args, ts, eps) -> None:
  from matplotlib.figure import Figure
  q, sigma, delta = args.sampling_rate, args.noise_multiplier, args.delta
  title = f"q = {q:g}, sigma = {sigma:g}"
  if args.accountant == "pld":
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax1 = fig.subplots()
    ax1.plot(ts, eps, marker=".", label="PLD")
    ax1.plot(ts, rdp_curve(q, sigma, ts, delta), linestyle="--", color="gray",
             label="RDP (for comparison)")
    ax1.legend()
  else:
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(ts, eps, marker=".")
    orders, rdp_t, eps_t, order_t = rdp_at(q, sigma, ts[-1], delta)
    finite = np.isfinite(orders) & np.isfinite(rdp_t)
    ax2.loglog(orders[finite], rdp_t[finite])
    ax2.axvline(order_t, color="gray", linestyle="--", label=f"optimal order {order_t:g}")
    ax2.set_xlabel("order alpha")
    ax2.set_ylabel(f"RDP after {ts[-1]} steps")
    ax2.set_title(f"RDP curve (grid epsilon = {eps_t:.4g})")
    ax2.legend()
    ax2.grid(True, which="both", alpha=0.3)
  ax1.set_xlabel("steps")
  ax1.set_ylabel(f"epsilon (delta = {delta:g}, {args.accountant.upper()})")
  ax1.set_title(title)
  _scales(ax1, args.log)
  ax1.grid(True, which="both", alpha=0.3)
  fig.savefig(path, dpi=100)


def cmd_plot(args, out) -> None:
  if args.out is None and args.csv is None:
    fail("--out (an image, FILE.png) or --csv (a table, FILE.csv) is required")
  if args.out is not None:
    try:
      import matplotlib.figure  # noqa: F401
    except ImportError:
      fail("--out needs matplotlib: pip install matplotlib (or write the curve with --csv only)")
  for flag, path in (("--out", args.out), ("--csv", args.csv)):
    if path is not None:
      writable(flag, path)
  log_x = args.log in ("x", "both")
  if choose_form(args, (("--steps",), ("--steps-range",))) == 0:
    start, stop = None, args.steps
  else:
    start, stop = args.steps_range
    if log_x and start < 1:
      fail(f"--steps-range START must be at least 1 on a log steps axis (--log {args.log}), "
           f"got {start}")
  points = POINTS[args.accountant] if args.points is None else args.points
  ts = step_points(start, stop, points, log_x)
  q, sigma, delta = args.sampling_rate, args.noise_multiplier, args.delta
  curve = pld_curve if args.accountant == "pld" else rdp_curve
  eps = curve(q, sigma, ts, delta)
  wrote = []
  if args.csv is not None:
    try:
      write_csv(args.csv, q, sigma, ts, delta, args.accountant, eps)
    except OSError as err:
      fail(f"--csv cannot be written: {' '.join(str(err).split())}")
    wrote.append(f"wrote {args.csv} ({ts.size} rows: steps {ts[0]} to {ts[-1]})")
  if args.out is not None:
    try:
      write_image(args.out, args, ts, eps)
    except (OSError, ValueError) as err:
      fail(f"--out cannot be written: {' '.join(str(err).split())}")
    wrote.append(f"wrote {args.out}")
  if args.accountant == "pld":
    headline(out, f"ε = {eps[-1]:.4g} after {ts[-1]} steps (δ = {delta:g}, PLD)")
  else:
    order = rdp_at(q, sigma, ts[-1], delta)[3]
    headline(out, f"ε = {eps[-1]:.4g} after {ts[-1]} steps (δ = {delta:g}, RDP, "
             f"order ≈ {order:g})")
  print("\n".join(wrote), file=out)
