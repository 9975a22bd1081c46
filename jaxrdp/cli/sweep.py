"""``jaxrdp sweep``: ε over the grid of all combinations of (q, σ, steps, δ), as a table
(CSV, Parquet) and/or a heatmap (:func:`jaxrdp.accounting.sweep.sweep`: grid orders)."""

from __future__ import annotations

import os

import jax
import numpy as np

from jaxrdp.accounting.sweep import sweep as _sweep
from jaxrdp.accounting.sweep_output import parts as read_parts
from jaxrdp.cli.commands import grid, headline
from jaxrdp.cli.parsing import fail, fmt, writable

VALUES = """\
Grid values (--sampling-rates, --noise-multipliers, --steps, --deltas): comma-separated items,
each a number or a range START:STOP:NUM[:log|:lin] of NUM values from START to STOP, both
included, evenly spaced (lin, the default) or log-spaced (log; START, STOP > 0). Examples:
  --sampling-rates 1e-4:1e-1:100:log   --noise-multipliers 0.5:5:100
  --steps 100,1000,10000               --deltas 1e-5,1e-6
Range values of --steps are rounded to whole numbers (duplicates dropped).

Batches: Poisson (default); --sampling fixed (batches of q*N drawn without replacement) or
--sampling shuffle with --dataset-size N (a permutation per epoch), both for replace-one
neighbours; --sampling truncated_poisson with --dataset-size N --max-batch-size B (Poisson
batches cut to B examples: the overflows' probability added to delta) (see the docs' "Which
sampler, which accountant").

Output: --out FILE.csv writes one row per grid point, columns
sampling_rate,noise_multiplier,steps,delta,epsilon (epsilon at the best grid order, as
jaxrdp.sweep / dpsgd_epsilon(refine_order=False)); --out FILE.parquet (needs pyarrow) is a
directory of Parquet parts written as the sweep goes (it reads as one table), and --resume
completes one that was interrupted (killed, preempted) with the same flags.
--heatmap FILE.png draws epsilon over sampling rate x noise multiplier for one (steps, delta):
the first of each, or --heatmap-steps / --heatmap-delta (values of the grid).
"""


def _pick(flag, grid_flag, grid, value):
  if value is None:
    return 0
  hit = np.flatnonzero(np.isclose(grid, value, rtol=1e-9, atol=0))
  if hit.size == 0:
    fail(f"{flag} must be one of the {grid_flag} values ({', '.join(fmt(v) for v in grid)}), "
          f"got {fmt(value)}")
  return int(hit[0])


def _write_table(path, axes, eps) -> None:
  """The CSV table (a Parquet --out is written by the sweep itself, as it goes)."""
  import csv
  import itertools
  names = ("sampling_rate", "noise_multiplier", "steps", "delta")
  text = [[repr(float(v)) for v in a] for a in axes]
  text[2] = [str(int(v)) for v in axes[2]]
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(names + ("epsilon",))
    writer.writerows(cell + (repr(e),) for cell, e in zip(itertools.product(*text),
                                                          eps.ravel().tolist()))


def _streamed_summary(path, t_index, d_index):
  """(shape, finite ε's min and max (None if none), the heatmap's (q, σ) slice) of the sweep
  written to ``path``, read one part at a time: the grid is never all in memory."""
  shape, chunks = read_parts(path)
  low, high, column = np.inf, -np.inf, []
  for eps in chunks:
    finite = eps[np.isfinite(eps)]
    if finite.size:
      low, high = min(low, finite.min()), max(high, finite.max())
    column.append(eps[:, t_index * shape[3] + d_index])
  span = (low, high) if np.isfinite(low) else None
  return shape, span, np.concatenate(column).reshape(shape[:2])


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


def _sampler(args) -> dict:
  """The sweep's sampler arguments for --sampling (bad input where they do not fit)."""
  if args.sampling == "truncated_poisson":
    if args.dataset_size is None or args.max_batch_size is None:
      fail("--sampling truncated_poisson needs --dataset-size and --max-batch-size (batches "
           "of more examples are cut to that many)")
    return {"sampling": "truncated_poisson", "dataset_size": args.dataset_size,
            "max_batch_size": args.max_batch_size}
  if args.max_batch_size is not None:
    fail("--max-batch-size applies to --sampling truncated_poisson only")
  if args.sampling != "shuffle":
    if args.dataset_size is not None:
      fail("--dataset-size applies to --sampling shuffle only")
    return {"sampling": args.sampling}
  if args.dataset_size is None:
    fail("--sampling shuffle needs --dataset-size (epochs are counted in batches of q*N)")
  sizes = np.asarray(args.sampling_rates, np.float64) * args.dataset_size
  bad = np.abs(sizes - np.round(sizes)) > 1e-6 * np.maximum(np.round(sizes), 1.0)
  if np.any(bad | (np.round(sizes) < 1)):
    fail(f"--sampling shuffle needs whole batches: --sampling-rates times --dataset-size must "
         f"be whole numbers of at least 1, got {fmt(sizes[bad | (np.round(sizes) < 1)][0])}")
  return {"sampling": "shuffle", "dataset_size": args.dataset_size}


def cmd_sweep(args, out) -> None:
  if args.out is None and args.heatmap is None:
    fail("--out (a .csv or .parquet file) or --heatmap (a .png file) is required")
  streamed = args.out is not None and args.out.endswith(".parquet")
  if args.resume and not streamed:
    fail("--resume completes a sweep written to --out FILE.parquet; give that --out")
  if args.out is not None:
    if streamed:   # a directory of Parquet parts, written as the sweep goes
      parent = os.path.dirname(os.path.abspath(args.out))
      if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        fail(f"--out cannot be written: {args.out}")
      try:
        import pyarrow.parquet  # noqa: F401
      except ImportError:
        fail("--out FILE.parquet needs pyarrow: pip install pyarrow (or write a .csv file)")
    else:
      writable("--out", args.out)
  if args.heatmap is not None:
    writable("--heatmap", args.heatmap)
    try:
      import matplotlib.figure  # noqa: F401
    except ImportError:
      fail("--heatmap needs matplotlib: pip install matplotlib")
  t_index = _pick("--heatmap-steps", "--steps", args.steps, args.heatmap_steps)
  d_index = _pick("--heatmap-delta", "--deltas", args.deltas, args.heatmap_delta)
  if args.progress:
    try:
      import tqdm  # noqa: F401
    except ImportError:
      fail("--progress needs tqdm: pip install tqdm")
  axes = (args.sampling_rates, args.noise_multipliers, args.steps, args.deltas)
  orders = None if args.orders is None else grid(args.orders)
  sampler = _sampler(args)
  with jax.enable_x64(True):
    if streamed:
      try:
        _sweep(*axes, orders=orders, chunk_size=args.chunk_size, progress=args.progress,
               output=args.out, resume=args.resume, **sampler)
      except (OSError, ValueError) as err:
        fail(f"--out cannot be written: {' '.join(str(err).split())}")
      shape, span, plane = _streamed_summary(args.out, t_index, d_index)
    else:
      eps = np.asarray(_sweep(*axes, orders=orders, chunk_size=args.chunk_size,
                              progress=args.progress, **sampler))
      finite = eps[np.isfinite(eps)]
      shape, plane = eps.shape, eps[:, :, t_index, d_index]
      span = (finite.min(), finite.max()) if finite.size else None
  size = int(np.prod(shape))
  counts = "{} sampling rates x {} noise multipliers x {} steps x {} deltas".format(*shape)
  wrote = []
  if streamed:
    wrote.append(f"wrote {args.out} ({size} rows: {counts}; a directory of Parquet parts, "
                 "written as the sweep went)")
  elif args.out is not None:
    try:
      _write_table(args.out, axes, eps)
    except OSError as err:
      fail(f"--out cannot be written: {' '.join(str(err).split())}")
    wrote.append(f"wrote {args.out} ({size} rows: {counts})")
  if args.heatmap is not None:
    steps, delta = args.steps[t_index], args.deltas[d_index]
    try:
      _write_heatmap(args.heatmap, args.sampling_rates, args.noise_multipliers, plane, steps,
                     delta)
    except (OSError, ValueError) as err:
      fail(f"--heatmap cannot be written: {' '.join(str(err).split())}")
    wrote.append(f"wrote {args.heatmap} (epsilon at steps = {int(steps)}, delta = {delta:g})")
  text = f"ε from {span[0]:.4g} to {span[1]:.4g}" if span is not None else "ε not finite"
  how = {"poisson": "", "fixed": ", fixed-size batches, replace-one neighbours",
         "truncated_poisson": ", truncated Poisson batches, overflows added to delta",
         "shuffle": ", shuffled batches, replace-one neighbours"}[args.sampling]
  headline(out, f"{text} over {size} grid points (RDP, grid orders{how})")
  print("\n".join(wrote), file=out)
