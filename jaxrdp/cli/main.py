"""Command-line interface to jaxrdp: ε of DP-SGD, calibration of σ, privacy statements, plots.

Usage::

  jaxrdp epsilon   --sampling-rate Q --noise-multiplier S --steps T --delta D [--orders A,B,...] [--json]
  jaxrdp epsilon   --dataset-size N --batch-size B --epochs E --noise-multiplier S --delta D
  jaxrdp calibrate --epsilon E --delta D --sampling-rate Q --steps T [--json]
  jaxrdp calibrate --epsilon E --delta D --solve-for {noise-multiplier,sampling-rate,steps} ...
  jaxrdp dpsgd     --dataset-size N --batch-size B --epochs E --noise-multiplier S --delta D [--json]
  jaxrdp plot      --sampling-rate Q --noise-multiplier S --steps T --delta D --out FILE.png
                   [--csv FILE.csv] [--accountant pld] [--log {x,y,both}] [--points N]
  jaxrdp plot      ... --steps-range START:STOP ... --csv FILE.csv   (no image, no matplotlib)
  jaxrdp sweep     --sampling-rates QS --noise-multipliers SS --steps TS --deltas DS
                   [--out FILE.csv|FILE.parquet [--resume]] [--heatmap FILE.png] [--progress]

(``python -m jaxrdp ...`` is the same.) Numbers may be fractions or in scientific notation
(``--sampling-rate 256/60000``, ``--steps 1e4``), read by one function
(:func:`jaxrdp.cli.parsing.exact`); ``--dataset-size/--batch-size/--epochs`` stand for
``--sampling-rate/--steps`` (q = B/N, steps = ⌈E·N/B⌉:
:func:`jaxrdp.cli.parsing.training_schedule`). Every command prints a one-line answer first
(``ε = ... (δ = ..., RDP, order ≈ ...)``), then its details. Three values of ε are reported:

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
(:func:`jaxrdp.calibrate_noise_multiplier`), or with ``--solve-for`` the largest sampling rate
or number of steps (:func:`jaxrdp.calibrate_sampling_rate`, :func:`jaxrdp.calibrate_steps`).
``--json`` prints one JSON object, one schema for every command (docs/cli.md); a non-finite
value (e.g. ε = inf) is written as ``null``. ``dpsgd`` also reports the PLD's ε; where the PLD
cannot be sized for the schedule (too many grid points at its interval) and the accountant is
RDP, it reports the RDP result and says the PLD is unavailable (JSON: ``epsilon_pld`` null,
``epsilon_pld_unavailable`` the reason, null otherwise); with ``--accountant pld`` that is an
error. ``plot`` draws ε after t steps (RDP: :func:`jaxrdp.epsilon_trajectory`; PLD:
:func:`jaxrdp.pld_epsilon` at each t on one grid) and writes the image (``--out``, needs
matplotlib) and/or the points as CSV (``--csv``): :mod:`jaxrdp.cli.plot`.

All computation runs in float64 inside ``with jax.enable_x64(True):``; the global flag is never
changed. Bad input exits with status 2 and a one-line message naming the flag.
"""

from __future__ import annotations

import argparse
import sys

import jax

import jaxrdp
from jaxrdp.cli import commands, plot, sweep
from jaxrdp.cli.parsing import (Parser, UsageError, fail, grid_steps, grid_values, in_domain,
                                library_error, number, numbers, points, range_text,
                                steps_range, whole)

_PROG = "jaxrdp"
# The helpers' former names here (tests and users' scripts import them from this module).
_grid_values, _grid_steps, _library_error, _fail = grid_values, grid_steps, library_error, fail


def _build_parser() -> argparse.ArgumentParser:
  parser = Parser(prog=_PROG, description="Renyi-DP accounting for DP-SGD (jaxrdp).")
  parser.add_argument("--version", action="version", version=f"jaxrdp {jaxrdp.__version__}")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

  def add(p, flag, domain, parse, help_):
    """A required flag with values in the library's DOMAINS[domain] ({} in help_: the range)."""
    p.add_argument(flag, type=in_domain(domain, parse), required=True,
                   help=help_.format(range_text(domain)))

  def add_orders(p):
    p.add_argument("--orders", type=in_domain("orders", numbers), default=None,
                   help=f"comma-separated Renyi orders {range_text('orders')} "
                   "(default: jaxrdp.DEFAULT_ORDERS)")

  def add_accountant(p, what="the accountant"):
    p.add_argument("--accountant", choices=("rdp", "pld"), default="rdp",
                   help=f"{what}: rdp (Renyi DP, default) or pld (privacy-loss distribution: "
                   "tight, slower)")

  def add_optional(p, flag, domain, parse, help_):
    """As ``add``, not required: a flag of one of alternative forms (checked by the command)."""
    p.add_argument(flag, type=in_domain(domain, parse), default=None,
                   help=help_.format(range_text(domain)))

  def add_sampling(p):
    p.add_argument("--sampling", choices=("poisson", "truncated_poisson", "fixed", "shuffle"),
                   default="poisson",
                   help="how batches are drawn: poisson (default; add/remove neighbours), "
                   "truncated_poisson (Poisson batches cut to --max-batch-size examples chosen "
                   "uniformly, as jaxrdp.poisson_sample draws them; needs --dataset-size, "
                   "--batch-size, --epochs), fixed (B examples without replacement) or shuffle "
                   "(a permutation per epoch; needs --dataset-size, --batch-size, --epochs); "
                   "fixed and shuffle are accounted for replace-one neighbours")
    add_optional(p, "--max-batch-size", "count", whole,
                 "the largest batch M {} of --sampling truncated_poisson")

  def add_schedule(p, alternative=" (or --dataset-size, --batch-size, --epochs)"):
    add_optional(p, "--sampling-rate", "sampling_rate", number, "q {}" + alternative)
    add_optional(p, "--steps", "count", whole, "number of steps T {}" + alternative)
    add_optional(p, "--dataset-size", "count", whole, "number of training examples N {}")
    add_optional(p, "--batch-size", "count", whole, "expected batch size B {} (q = B/N)")
    add_optional(p, "--epochs", "epochs", number, "epochs E {} (steps = ceil(E*N/B))")

  p = sub.add_parser("epsilon", help="epsilon of DP-SGD (Poisson, fixed-size or shuffled batches)")
  add_schedule(p)
  add_sampling(p)
  add(p, "--noise-multiplier", "positive_noise_multiplier", number, "sigma {}")
  add(p, "--delta", "delta", number, "delta {}")
  add_orders(p)
  add_accountant(p)
  p.add_argument("--json", action="store_true", help="print a JSON object")
  p.set_defaults(func=commands.cmd_epsilon)

  p = sub.add_parser("calibrate", help="smallest noise multiplier (or largest sampling rate, "
                     "number of steps) reaching a target epsilon")
  add(p, "--epsilon", "target_epsilon", number, "target epsilon {}")
  add(p, "--delta", "delta", number, "delta {}")
  p.add_argument("--solve-for", choices=("noise-multiplier", "sampling-rate", "steps"),
                 default="noise-multiplier",
                 help="the unknown (default noise-multiplier); the other two are given")
  add_schedule(p, "")
  add_optional(p, "--noise-multiplier", "positive_noise_multiplier", number,
               "sigma {} (with --solve-for sampling-rate or steps)")
  add_sampling(p)
  add_accountant(p)
  p.add_argument("--json", action="store_true", help="print a JSON object")
  p.set_defaults(func=commands.cmd_calibrate)

  p = sub.add_parser("dpsgd", help="privacy statement for DP-SGD training")
  add(p, "--dataset-size", "count", whole, "number of training examples N {}")
  add(p, "--batch-size", "count", whole, "expected batch size B {} (q = B/N)")
  add(p, "--epochs", "epochs", number, "epochs E {} (steps = ceil(E*N/B))")
  add(p, "--noise-multiplier", "positive_noise_multiplier", number, "sigma {}")
  add(p, "--delta", "delta", number, "delta {}")
  add_sampling(p)
  add_accountant(p, "the accountant of the headline statement (both are printed)")
  p.add_argument("--json", action="store_true", help="print a JSON object")
  p.set_defaults(func=commands.cmd_dpsgd)

  p = sub.add_parser("plot", help="epsilon vs steps: an image (needs matplotlib) and/or a CSV",
                     description="Epsilon of DP-SGD (Poisson sampling) after t steps, for t up "
                     "to --steps or over\n--steps-range, by RDP or the PLD (float64).",
                     epilog=plot.HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  add(p, "--sampling-rate", "sampling_rate", number, "q {}")
  add(p, "--noise-multiplier", "positive_noise_multiplier", number, "sigma {}")
  add_optional(p, "--steps", "count", whole, "last number of steps T {} (or --steps-range)")
  p.add_argument("--steps-range", type=steps_range, default=None, metavar="START:STOP",
                 help="the steps plotted, from START to STOP (whole numbers, e.g. 100:1e4)")
  add(p, "--delta", "delta", number, "delta {}")
  add_accountant(p)
  p.add_argument("--points", type=points, default=None,
                 help="number of step counts, at least 2 (default 40; 20 with --accountant pld)")
  p.add_argument("--log", choices=("x", "y", "both"), default=None,
                 help="log scale on the steps axis (x), the epsilon axis (y) or both")
  p.add_argument("--out", default=None, metavar="FILE.png",
                 help="image to write (needs matplotlib)")
  p.add_argument("--csv", default=None, metavar="FILE.csv",
                 help="table to write: the step counts and epsilon")
  p.set_defaults(func=plot.cmd_plot)

  p = sub.add_parser("sweep", help="epsilon over a grid of (q, sigma, steps, delta): table, heatmap",
                     description="Epsilon of DP-SGD (Poisson sampling) for every combination of the "
                     "grid values (jaxrdp.sweep, float64).", epilog=sweep.VALUES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  add(p, "--sampling-rates", "sampling_rate", grid_values, "sampling rates q {}")
  add(p, "--noise-multipliers", "positive_noise_multiplier", grid_values,
      "noise multipliers sigma {}")
  add(p, "--steps", "count", grid_steps, "step counts T {} (whole numbers)")
  add(p, "--deltas", "delta", grid_values, "deltas {}")
  p.add_argument("--out", default=None, help="table to write: FILE.csv, or FILE.parquet (pyarrow)")
  p.add_argument("--heatmap", default=None, help="image to write: epsilon over q x sigma (FILE.png)")
  p.add_argument("--heatmap-steps", type=whole, default=None,
                 help="steps value of the heatmap (default: the first of --steps)")
  p.add_argument("--heatmap-delta", type=number, default=None,
                 help="delta of the heatmap (default: the first of --deltas)")
  add_orders(p)
  p.add_argument("--chunk-size", type=whole, default=None,
                 help="(q, sigma) pairs per compiled call (default: automatic)")
  p.add_argument("--progress", action="store_true", help="show a progress bar (needs tqdm)")
  p.add_argument("--resume", action="store_true",
                 help="complete an interrupted sweep written to --out FILE.parquet")
  add_sampling(p)
  add_optional(p, "--dataset-size", "count", whole,
               "number of training examples N {} (with --sampling shuffle: epochs of "
               "floor(N/B) steps, B = q*N)")
  p.set_defaults(func=sweep.cmd_sweep)
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
      fail(library_error(err))
  except UsageError as err:
    print(f"{_PROG}: error: {err}", file=sys.stderr)
    raise SystemExit(2) from None
  return 0


if __name__ == "__main__":
  sys.exit(main())
