"""The accounting commands: ``epsilon``, ``calibrate`` and ``dpsgd`` (``plot`` and ``sweep``
have their own modules).

Each prints one headline line first (the answer: ``ε = 0.8431 (δ = 1e-05, RDP, order ≈ 12)``,
``σ = 1.0123 for ε = 2 (δ = 1e-05, RDP)``), then its details. ``--json`` prints one object whose
keys are those of :func:`record` plus the command's own (docs/cli.md, "JSON output").
"""

from __future__ import annotations

import json
import math

import jax
import numpy as np

import jaxrdp
from jaxrdp.accounting import samplers
from jaxrdp.cli.parsing import (RATE_FLAGS, TRAINING_FLAGS, assumptions, choose_form, fail, given,
                                library_error, training_schedule)

_ASCII = str.maketrans({"ε": "epsilon", "σ": "sigma", "δ": "delta", "≈": "~"})
_CALIBRATE = {   # --solve-for: (the unknown's JSON key, the library's calibration)
    "noise-multiplier": ("noise_multiplier", jaxrdp.calibrate_noise_multiplier),
    "sampling-rate": ("sampling_rate", jaxrdp.calibrate_sampling_rate),
    "steps": ("steps", jaxrdp.calibrate_steps),
}


def headline(out, text: str) -> None:
  """Print the command's one-line answer; in ASCII where ``out`` cannot encode ε, σ, δ."""
  try:
    text.encode(getattr(out, "encoding", None) or "utf-8")
  except (UnicodeEncodeError, LookupError):
    text = text.translate(_ASCII)
  print(text, file=out)


def json_number(v):
  if v is None:
    return None
  v = float(v)
  return v if math.isfinite(v) else None


def record(q, sigma, steps, delta, accountant, epsilon, args=None, **extra) -> str:
  """The JSON object every command prints (docs/cli.md, "JSON output"): the schedule (with the
  training run's N, B, E where given), the accountant and ε by it, then ``extra`` (RDP:
  ``order``, ``epsilon_classic``, ...). Every ``--json`` goes through here: one schema."""
  obj = {"sampling_rate": json_number(q), "noise_multiplier": json_number(sigma),
         "steps": None if steps is None else int(steps), "delta": delta}
  if args is not None and given(args, "--dataset-size") and given(args, "--batch-size"):
    obj.update(dataset_size=args.dataset_size, batch_size=args.batch_size,
               epochs=json_number(getattr(args, "epochs", None)))
  obj.update(accountant=accountant, epsilon=json_number(epsilon))
  obj.update({k: v if isinstance(v, (str, int)) or v is None else json_number(v)
              for k, v in extra.items()})
  return json.dumps(obj)


def grid(orders):
  return np.asarray(jaxrdp.DEFAULT_ORDERS if orders is None else orders, dtype=np.float64)


def epsilons(q, sigma, steps, delta, orders=None):
  """(grid ε, its order, refined ε, classic grid ε, its order), computed in float64. The
  classic value is the conversion of Mironov (2017, Prop. 3), ε = min_α RDP(α) +
  log(1/δ)/(α − 1), which TF Privacy's tutorials and Abadi et al. (2016) reported: looser
  than the default conversion, printed so that published numbers can be reconciled."""
  with jax.enable_x64(True):
    orders = grid(orders)
    rdp = jaxrdp.compute_rdp(q, sigma, steps, orders)
    eps, order = jaxrdp.compute_epsilon(orders, rdp, delta)
    classic, classic_order = jaxrdp.compute_epsilon(orders, rdp, delta, method="classic")
    refined = jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, orders=orders)
    return (float(eps), float(order), float(refined), float(classic), float(classic_order))


def pld_epsilon(q, sigma, steps, delta) -> float:
  """ε by the privacy-loss distribution (jaxrdp.pld_epsilon), float64."""
  with jax.enable_x64(True):
    return float(jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, accountant="pld"))


def optional_pld_epsilon(q, sigma, steps, delta, *, required):
  """(ε by the PLD, None), or (None, why) where the PLD's grid cannot be sized for this
  schedule (a ValueError of the PLD accountant: too many grid points at the default interval)
  and it is only reported beside the RDP statement. ``required`` (the headline is the PLD's):
  the error propagates (exit 2)."""
  try:
    return pld_epsilon(q, sigma, steps, delta), None
  except ValueError as err:
    if required:
      raise
    return None, library_error(err)


def schedule(args, unused=(), why=""):
  """(q, steps, assumption lines): --sampling-rate and --steps, or the training run's
  --dataset-size, --batch-size and --epochs (one form, in full: bad input otherwise; shuffled
  batches need the training run's)."""
  if choose_form(args, (RATE_FLAGS, TRAINING_FLAGS), unused, why) == 0:
    if args.sampling == "shuffle":
      fail("--sampling shuffle needs --dataset-size, --batch-size and --epochs (its epochs are "
           "counted in batches of B), not --sampling-rate and --steps")
    if args.sampling == "truncated_poisson":
      fail("--sampling truncated_poisson needs --dataset-size, --batch-size and --epochs (the "
           "chance that a batch is cut depends on N), not --sampling-rate and --steps")
    return args.sampling_rate, args.steps, []
  n, b, epochs = args.dataset_size, args.batch_size, args.epochs
  q, steps = training_schedule(n, b, epochs)
  return q, steps, ["Assumptions:"] + training_assumptions(args, q, epochs, steps)


def training_assumptions(args, q, epochs, steps, epochs_of_steps=False) -> list[str]:
  """:func:`assumptions` of the training run in ``args`` (its sampler and largest batch)."""
  return assumptions(args.dataset_size, args.batch_size, q, epochs, steps,
                     epochs_of_steps=epochs_of_steps, sampling=args.sampling,
                     max_batch_size=getattr(args, "max_batch_size", None))


_SAMPLERS = {"truncated_poisson": "truncated Poisson batches", "fixed": "fixed-size batches",
             "shuffle": "shuffled batches"}
_NEIGHBOURS = {"add_or_remove": "add/remove neighbours", "replace_one": "replace-one neighbours"}


def sampler(args) -> dict:
  """The library's sampler arguments for ``--sampling`` (the dataset size for shuffling);
  bad input where the library would refuse the combination."""
  if args.sampling == "fixed" and args.accountant == "pld":
    fail("--sampling fixed is accounted by --accountant rdp only (no tight privacy-loss "
         "distribution of fixed-size batches is implemented)")
  only_truncated_takes_max_batch_size(args)
  if args.sampling == "truncated_poisson":
    if getattr(args, "solve_for", None) == "sampling-rate":
      fail("--sampling truncated_poisson with --solve-for sampling-rate is not offered (the "
           "batch size B = q*N is the training run's): solve for steps or the noise multiplier")
    if args.max_batch_size is None:
      fail("--sampling truncated_poisson needs --max-batch-size (the largest batch M)")
    return {"sampling": args.sampling, "dataset_size": args.dataset_size,
            "max_batch_size": args.max_batch_size}
  if args.sampling == "shuffle" and getattr(args, "solve_for", None) == "sampling-rate":
    fail("--sampling shuffle with --solve-for sampling-rate is not offered (the batch size "
         "changes its epsilon only through the number of epochs): solve for steps or the "
         "noise multiplier")
  size = args.dataset_size if args.sampling == "shuffle" else None
  return {"sampling": args.sampling, "dataset_size": size}


def sampler_epsilon(args, q, sigma, steps, delta) -> float:
  """ε of fixed-size or shuffled batches by ``--accountant`` (float64): dpsgd_epsilon's."""
  with jax.enable_x64(True):
    orders = None if args.accountant == "pld" else getattr(args, "orders", None)
    return float(jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, orders=orders,
                                      accountant=args.accountant, **sampler(args)))


def cmd_sampler_epsilon(args, out, q, sigma, steps, lines) -> None:
  """``epsilon`` and ``dpsgd`` for truncated Poisson, fixed-size or shuffled batches: one ε,
  the relation named."""
  delta = args.delta
  if args.accountant == "pld" and getattr(args, "orders", None) is not None:
    fail("--orders applies to --accountant rdp only")
  eps = sampler_epsilon(args, q, sigma, steps, delta)
  relation = samplers.RELATION[args.sampling]
  if args.json:
    extra = {"max_batch_size": args.max_batch_size} if args.sampling == "truncated_poisson" else {}
    print(record(q, sigma, steps, delta, args.accountant, eps, args, sampling=args.sampling,
                 neighboring=relation, **extra), file=out)
    return
  headline(out, f"ε = {eps:.4g} (δ = {delta:g}, {args.accountant.upper()}, "
                f"{_SAMPLERS[args.sampling]}, {_NEIGHBOURS[relation]})")
  how = ("adjacent datasets differ by replacing one example" if relation == "replace_one" else
         "adjacent datasets differ by adding or removing one example")
  if args.sampling == "truncated_poisson" and args.accountant == "rdp":
    how += ("; RDP adds the probability of a cut batch to delta (+inf when cuts are not much "
            "rarer than delta): --accountant pld is tight")
  print("\n".join(lines + [
      f"epsilon = {eps:.6g} (dpsgd_epsilon(..., sampling={args.sampling!r}, "
      f"accountant={args.accountant!r}); {how})"]), file=out)


def only_truncated_takes_max_batch_size(args) -> None:
  """Bad input: --max-batch-size with another sampler than truncated_poisson."""
  if args.sampling != "truncated_poisson" and getattr(args, "max_batch_size", None) is not None:
    fail("--max-batch-size applies to --sampling truncated_poisson only")


def cmd_epsilon(args, out) -> None:
  only_truncated_takes_max_batch_size(args)
  q, steps, lines = schedule(args)
  sigma, delta = args.noise_multiplier, args.delta
  if args.sampling != "poisson":
    cmd_sampler_epsilon(args, out, q, sigma, steps, lines)
    return
  if args.accountant == "pld":
    if args.orders is not None:
      fail("--orders applies to --accountant rdp only")
    eps = pld_epsilon(q, sigma, steps, delta)
    if args.json:
      print(record(q, sigma, steps, delta, "pld", eps, args), file=out)
      return
    headline(out, f"ε = {eps:.4g} (δ = {delta:g}, PLD)")
    print("\n".join(lines + [f"epsilon = {eps:.6g} by the privacy-loss distribution (tight "
                             "accounting; dpsgd_epsilon(..., accountant='pld'))"]), file=out)
    return
  eps, order, refined, classic, classic_order = epsilons(q, sigma, steps, delta, args.orders)
  if args.json:
    print(record(q, sigma, steps, delta, "rdp", eps, args, order=order, epsilon_refined=refined,
                 epsilon_classic=classic, order_classic=classic_order), file=out)
    return
  headline(out, f"ε = {refined:.4g} (δ = {delta:g}, RDP, order ≈ {order:g})")
  n = len(grid(args.orders))
  print("\n".join(lines + [
      f"epsilon = {eps:.6g} at order {order:g} (best of {n} grid orders; "
      "compute_rdp + compute_epsilon)",
      f"epsilon = {refined:.6g} with the order refined continuously (dpsgd_epsilon)",
      f"epsilon = {classic:.6g} at order {classic_order:g} under the classic conversion "
      "RDP + log(1/delta)/(order - 1) (Mironov 2017; TF Privacy's tutorials, Abadi et al.)"]),
        file=out)


def _calibration_inputs(args):
  """(q, sigma, steps, assumption lines) given for ``args.solve_for`` (None: the unknown)."""
  unknown = args.solve_for
  why = f" with --solve-for {unknown} ({unknown.replace('-', ' ')} is the unknown)"
  if unknown == "noise-multiplier":
    q, steps, lines = schedule(args, ("--noise-multiplier",), why)
    return q, None, steps, lines
  if not given(args, "--noise-multiplier"):
    fail(f"--noise-multiplier is required with --solve-for {unknown}")
  if unknown == "sampling-rate":
    choose_form(args, (("--steps",),), ("--sampling-rate",) + TRAINING_FLAGS, why)
    return None, args.noise_multiplier, args.steps, []
  why = " with --solve-for steps (the steps are the unknown; with --dataset-size and " \
        "--batch-size they are also reported in epochs)"
  if choose_form(args, (("--sampling-rate",), TRAINING_FLAGS[:2]), ("--steps", "--epochs"),
                 why) == 0:
    if args.sampling == "truncated_poisson":
      fail("--sampling truncated_poisson needs --dataset-size and --batch-size (the chance that "
           "a batch is cut depends on N), not --sampling-rate")
    return args.sampling_rate, args.noise_multiplier, None, []
  q, _ = training_schedule(args.dataset_size, args.batch_size, None)
  return q, args.noise_multiplier, None, None


def cmd_calibrate(args, out) -> None:
  only_truncated_takes_max_batch_size(args)
  if args.sampling != "poisson":
    sampler(args)   # its refusals first
  q, sigma, steps, lines = _calibration_inputs(args)
  key, solve = _CALIBRATE[args.solve_for]
  given_two = [v for v in (q, sigma, steps) if v is not None]
  kwargs = {"accountant": args.accountant}
  if args.sampling != "poisson":
    kwargs.update(sampler(args))
    if kwargs["dataset_size"] is None:
      kwargs.pop("dataset_size")
  with jax.enable_x64(True):
    answer = float(solve(args.epsilon, args.delta, *given_two, **kwargs))
  q, sigma, steps = (answer if v is None else v for v in (q, sigma, steps))
  steps = int(steps)
  epochs = None
  if lines is None:   # steps solved for a training run: also in epochs, E = steps·B/N
    epochs = steps * args.batch_size / args.dataset_size
    lines = ["Assumptions:"] + training_assumptions(args, q, epochs, steps, epochs_of_steps=True)
  if args.json:   # with ε at the answer: the value the calibration checked against the target
    extra = {} if epochs is None else {"epochs": epochs}
    if args.sampling != "poisson":
      eps = sampler_epsilon(args, q, sigma, steps, args.delta)
      extra.update(sampling=args.sampling, neighboring=samplers.RELATION[args.sampling])
    elif args.accountant == "pld":
      eps = pld_epsilon(q, sigma, steps, args.delta)
    else:
      eps, order, refined, classic, classic_order = epsilons(q, sigma, steps, args.delta)
      extra.update(order=order, epsilon_refined=refined, epsilon_classic=classic,
                   order_classic=classic_order)
    print(record(q, sigma, steps, args.delta, args.accountant, eps, args,
                 target_epsilon=args.epsilon, solve_for=args.solve_for, **extra), file=out)
    return
  how = ("default grid orders" if args.accountant == "rdp"
         else "privacy-loss distribution, tight accounting")
  if args.sampling != "poisson":
    how += f"; {_SAMPLERS[args.sampling]}, {_NEIGHBOURS[samplers.RELATION[args.sampling]]}"
  sampled = "" if args.sampling == "poisson" else f", {_SAMPLERS[args.sampling]}"
  what = f"for ε = {args.epsilon:g} (δ = {args.delta:g}, {args.accountant.upper()}{sampled})"
  if key == "noise_multiplier":
    headline(out, f"σ = {sigma:.6g} {what}")
    details = [f"noise multiplier = {sigma!r}",
               f"(smallest sigma with epsilon <= {args.epsilon:g} at delta = {args.delta:g}, "
               f"q = {q:g}, {steps} steps; {how})"]
  elif key == "sampling_rate":
    headline(out, f"q = {q:.6g} {what}")
    details = [f"sampling rate = {q!r}",
               f"(largest q with epsilon <= {args.epsilon:g} at delta = {args.delta:g}, "
               f"sigma = {sigma:g}, {steps} steps; {how})"]
  else:
    headline(out, f"steps = {steps}{'' if epochs is None else f' ({epochs:.4g} epochs)'} {what}")
    details = [f"steps = {steps}",
               f"(largest number of steps with epsilon <= {args.epsilon:g} at delta = "
               f"{args.delta:g}, q = {q:g}, sigma = {sigma:g}; {how})"]
  print("\n".join(lines + details), file=out)


def cmd_dpsgd(args, out) -> None:
  only_truncated_takes_max_batch_size(args)
  n, b, sigma, delta = args.dataset_size, args.batch_size, args.noise_multiplier, args.delta
  q, steps = training_schedule(n, b, args.epochs)
  if args.sampling != "poisson":
    sampler(args)   # its refusals first
    lines = ["Assumptions:"] + training_assumptions(args, q, args.epochs, steps)
    cmd_sampler_epsilon(args, out, q, sigma, steps, lines)
    return
  eps, order, refined, classic, classic_order = epsilons(q, sigma, steps, delta)
  tight, unavailable = optional_pld_epsilon(q, sigma, steps, delta,
                                            required=args.accountant == "pld")
  if args.json:
    top = eps if args.accountant == "rdp" else tight   # ε by the accountant named
    print(record(q, sigma, steps, delta, args.accountant, top, args, order=order,
                 epsilon_refined=refined, epsilon_classic=classic, order_classic=classic_order,
                 epsilon_rdp=eps, epsilon_pld=tight, epsilon_pld_unavailable=unavailable),
          file=out)
    return
  order_grid = len(jaxrdp.DEFAULT_ORDERS)
  rdp = args.accountant == "rdp"
  top = refined if rdp else tight
  headline(out, f"ε = {top:.4g} (δ = {delta:g}, " +
           (f"RDP, order ≈ {order:g})" if rdp else "PLD)"))
  by = "Renyi DP" if rdp else "its privacy-loss distribution"
  lines = [
      f"DP-SGD with sampling rate q = {q:.6g} and noise multiplier {sigma:g}, "
      f"iterated over {steps} steps, satisfies differential privacy with "
      f"epsilon = {top:.4g} and delta = {delta:g} (accounted by {by}).",
      "Assumptions:",
      *assumptions(n, b, q, args.epochs, steps),
      "  - adjacent datasets differ by adding or removing one example; the clipping norm is the "
      "L2 sensitivity.",
      "Result (Renyi DP of the sampled Gaussian mechanism, converted to (epsilon, delta)-DP):",
      f"  - epsilon = {eps:.6g} at the optimal order {order:g} of the default grid "
      f"({order_grid} orders);",
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
