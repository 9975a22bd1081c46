"""Experiment: do gradient-designed DP-SGD schedules train better models at the same ε?

Pre-registered in issue 36. Three tasks that run offline on a CPU:

* ``digits``: sklearn's 8x8 digits (1,797 images, as stored in examples/data), an MLP
  64-32-10 (tanh);
* ``mnist1d``: MNIST-1D (``mnist1d.data.make_dataset``, generated, no download; 4,000 train /
  1,000 test sequences of length 40), an MLP 40-64-10 (tanh);
* ``cancer``: sklearn's breast-cancer data (569 cases, 30 standardised features), logistic
  regression.

Each task is split into train / validation / test once (seed 0). Training is DP-SGD with
:func:`jaxrdp.differentially_private_aggregate` (Poisson batches by
:func:`jaxrdp.poisson_sample`, per-example clipping, Gaussian noise) followed by plain SGD, at
ε ∈ {1, 3, 8} and δ = 1e-5, for a fixed number of steps at a base sampling rate. The clipped
sum of the per-example gradients is computed from the batch's backward pass with "ghost
norms" (examples/optimize_schedule.py's ``clipped_grad_sum``, the same sum to float32
rounding, tested) and given to the transform as a :class:`jaxrdp.ClippedGradSum`; every
learning rate and seed of a schedule trains in one vmapped program. Methods:

1. ``constant``: the best constant σ (calibrated to ε), the learning rate tuned on the
   validation split;
2. ``sigma``: the noise schedule designed by :func:`jaxrdp.optimize_schedule` with the analytic
   utility :func:`jaxrdp.noisy_sgd_utility` (10 phases; curvature μ with η μ T = 1, so noise
   from the first half of training is damped e^-1 or more by the end), same learning-rate grid;
3. ``learned-fixed`` and ``learned``: the σ schedule whose validation loss after a short
   differentiable training run is smallest (the loss differentiated through the run, the noise
   σ_t·z_t; z_t fixed once, or drawn afresh each design iteration: a stochastic gradient of the
   expected loss), projected onto the budget as in 2;
4. ``batch``: the sampling-rate (batch-size) schedule designed with the analytic utility, the
   expected number of gradient evaluations held; ``both``: σ and q jointly.

The learning rate of every method is tuned on the validation split over the same grid (the
tuning is not counted in ε, as is common practice). Every method's realised schedule is checked
with :func:`jaxrdp.dpsgd_epsilon`, both accountants, and must be ≤ the budget. Each
configuration is trained with the same seeds (initialisation, batches and noise keys); the
report gives test accuracy (mean over seeds) and the paired difference to ``constant`` with
its 95 % confidence interval (t distribution).

Run::

    pip install scikit-learn mnist1d   # MNIST-1D and the breast-cancer data
    python benchmarks/schedule_design.py [--tasks digits,mnist1d,cancer] [--seeds 10]
        [--epsilons 1,3,8] [--json benchmarks/results/experiments/schedule_design.json] [--docs]

Writes the JSON (per task, ε and method: schedule, learning rate, validation and test accuracy
per seed) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

import jax
jax.config.update("jax_enable_x64", True)   # the accountant in float64; the models in float32
import jax.numpy as jnp
import optax

import jaxrdp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
# The model and its clipped gradient sum (ghost norms: no per-example gradients) are the
# example's, which reproduces one row of this experiment.
from optimize_schedule import clipped_grad_sum, forward, init_mlp  # noqa: E402
DELTA = 1e-5
PHASES = 10
CLIP = 1.0
DAMPING = 1.0   # η μ T of the analytic utility


# ---------------------------------------------------------------- tasks

def _split(x, y, n_train, n_val, seed=0):
  perm = np.random.default_rng(seed).permutation(len(x))
  x, y = x[perm], y[perm]
  cut = (n_train, n_train + n_val)
  parts = (x[:cut[0]], y[:cut[0]]), (x[cut[0]:cut[1]], y[cut[0]:cut[1]]), (x[cut[1]:], y[cut[1]:])
  return tuple((jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.int32)) for a, b in parts)


def _mlp(sizes):
  """(init, apply) of the MLP with these layer sizes (tanh hidden layers; one layer: logistic
  regression)."""
  return (lambda key: init_mlp(key, sizes)), (lambda params, x: forward(params, x)[0])


def load_task(name):
  """(train, val, test, init, apply, steps, sampling_rate, learning rates) of a task."""
  if name == "digits":   # scikit-learn's load_digits, as stored in examples/data
    with np.load(os.path.join(ROOT, "examples", "data", "digits.npz")) as d:
      x, y = d["images"].astype(np.float64), d["labels"].astype(np.int64)
    data = _split(x / 16.0, y, 1200, 300)
    return data + _mlp((64, 32, 10)) + (600, 0.05, (0.0625, 0.125, 0.25, 0.5, 1.0))
  if name == "mnist1d":
    from mnist1d.data import get_dataset_args, make_dataset
    d = make_dataset(get_dataset_args())
    x = np.concatenate([d["x"], d["x_test"]])
    y = np.concatenate([d["y"], d["y_test"]])
    x = (x - x.mean()) / x.std()
    data = _split(x, y, 3500, 500)
    return data + _mlp((40, 64, 10)) + (800, 0.02, (0.0625, 0.125, 0.25, 0.5, 1.0))
  if name == "cancer":
    from sklearn.datasets import load_breast_cancer
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    data = _split(x, y, 400, 85)
    return data + _mlp((30, 2)) + (300, 0.1, (0.125, 0.25, 0.5, 1.0, 2.0))
  raise ValueError(f"unknown task {name!r}")


# ---------------------------------------------------------------- training

def make_trainer(task):
  """train(keys, sigma_phases, q_phases, lrs) -> (val acc, test acc, ε spent), each (lrs,
  keys): one jitted program per batch shape, vmapped over the learning rates and the keys
  (the seeds)."""
  (xtr, ytr), (xva, yva), (xte, yte), init, apply, steps, q0, _ = task
  n = xtr.shape[0]
  per_phase = steps // PHASES

  def accuracy(params, x, y):
    return jnp.mean(jnp.argmax(apply(params, x), -1) == y)

  def train(key, sigmas, qs, lr, max_batch):
    phase = lambda count: jnp.minimum(count // per_phase, PHASES - 1)
    k_init, k_noise, k_batches = jax.random.split(key, 3)
    dp = jaxrdp.differentially_private_aggregate(
        CLIP, lambda c: sigmas[phase(c)], k_noise, sampling_rate=lambda c: qs[phase(c)],
        expected_batch_size=lambda c: qs[phase(c)] * n)
    tx = optax.chain(dp, optax.sgd(lr))
    params = init(k_init)
    state = tx.init(params)

    def step(carry, i):
      params, state = carry
      idx, mask = jaxrdp.poisson_sample(jax.random.fold_in(k_batches, i), n, qs[phase(i)],
                                        max_batch)
      clipped = clipped_grad_sum(params, xtr[idx], ytr[idx], mask, CLIP)
      updates, state = tx.update(clipped, state, params)
      return (optax.apply_updates(params, updates), state), None

    (params, state), _ = jax.lax.scan(step, (params, state), jnp.arange(steps))
    return accuracy(params, xva, yva), accuracy(params, xte, yte), jaxrdp.privacy_spent(state, DELTA)

  # One batch shape for every schedule of the task (the designs' rates stay within 1.5x the
  # base rate): one program per task; a rate above that gets a program of its own.
  room = jaxrdp.poisson_max_batch_size(n, min(1.0, 1.5 * q0))

  def run(keys, sigmas, qs, lrs):
    max_batch = max(room, jaxrdp.poisson_max_batch_size(n, float(np.max(qs))))
    return _compiled(max_batch)(keys, jnp.asarray(sigmas), jnp.asarray(qs), jnp.asarray(lrs))

  cache = {}

  def _compiled(max_batch):
    if max_batch not in cache:
      per_key = jax.vmap(lambda k, s, q, lr: train(k, s, q, lr, max_batch), (0, None, None, None))
      cache[max_batch] = jax.jit(jax.vmap(per_key, (None, None, None, 0)))
    return cache[max_batch]
  return run


def learned_utility(task, lr, seeds=2, fresh=True):
  """The mean validation loss after ``seeds`` training runs at learning rate ``lr`` with the
  per-phase σ and q, differentiable in both: the run of :func:`make_trainer` with its Poisson
  batches and the standard normal noise z_t as given by a key (``fresh``:
  ``utility(σ, q, key)``, new draws each iteration of the design, a stochastic gradient of the
  expected loss; else ``utility(σ, q)`` with one fixed set of draws), the noise
  σ_t C z_t / (q_t N) (the gradient through σ), the sum divided by the expected batch q_t N
  (the gradient through q), clipping as the trainer clips (:func:`clipped_grad_sum`)."""
  (xtr, ytr), (xva, yva), _, init, apply, steps, _, _ = task
  n = xtr.shape[0]
  per_phase = steps // PHASES
  keys = jax.random.split(jax.random.key(12345), seeds)   # not the evaluation's seeds
  # q is held at the task's rate in this design (σ only); a static batch shape with room.
  max_batch = jaxrdp.poisson_max_batch_size(n, min(1.0, 2 * task[6]))

  def run(key, sigmas, qs):
    params = init(jax.random.fold_in(key, 0))
    leaves, treedef = jax.tree.flatten(params)

    @jax.checkpoint   # the backward pass keeps one step's parameters, not its gradients
    def step(params, i):
      k = jax.random.fold_in(key, i + 1)
      s, q = sigmas[i // per_phase], qs[i // per_phase]
      idx, mask = jaxrdp.poisson_sample(jax.random.fold_in(k, 0), n, jax.lax.stop_gradient(q),
                                        max_batch)
      g = jax.tree.leaves(clipped_grad_sum(params, xtr[idx], ytr[idx], mask, CLIP).grad_sum)
      noise_keys = jax.random.split(jax.random.fold_in(k, 1), len(g))
      noisy = [(v + s * CLIP * jax.random.normal(kk, v.shape, jnp.float32)) / (q * n)
               for v, kk in zip(g, noise_keys)]
      params = jax.tree.map(lambda p, d: p - lr * d, params, jax.tree.unflatten(treedef, noisy))
      return params, None

    params, _ = jax.lax.scan(step, params, jnp.arange(steps))
    logits = apply(params, xva)
    return jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(logits), yva[:, None], 1))

  def utility(sigmas, qs, key=None):
    sigmas, qs = jnp.asarray(sigmas, jnp.float32), jnp.asarray(qs, jnp.float32)
    draws = keys if key is None else jax.random.split(key, seeds)
    return jnp.mean(jax.vmap(run, (0, None, None))(draws, sigmas, qs)).astype(jnp.float64)
  return utility if fresh else (lambda sigmas, qs: utility(sigmas, qs))


def design(task, method, eps, lr, iterations):
  """(σ per phase, q per phase) of ``method`` at the budget ``eps``."""
  (xtr, _), _, _, _, _, steps, q0, _ = task
  n = xtr.shape[0]
  t = jnp.full(PHASES, float(steps // PHASES))
  q = jnp.full(PHASES, q0)
  if method == "constant":
    sigma = float(jaxrdp.calibrate_noise_multiplier(eps, DELTA, q0, steps))
    return np.full(PHASES, sigma), np.asarray(q)
  key = None
  if method in ("learned", "learned-fixed"):
    utility = learned_utility(task, lr, fresh=method == "learned")
    key = jax.random.key(12345) if method == "learned" else None   # not the evaluation's seeds
    kind = "noise_multiplier"
  else:
    # η μ T = 1: the analytic weights are then about e^(-2 (T - t) / T) times η² (a
    # constant), so the design does not depend on the learning rate.
    utility = jaxrdp.noisy_sgd_utility(t, lr, l2_norm_clip=CLIP, dataset_size=n,
                                       curvature=DAMPING / (lr * steps))
    kind = {"sigma": "noise_multiplier", "batch": "sampling_rate", "both": "both"}[method]
  result = jaxrdp.optimize_schedule(utility, sampling_rate=q, noise_multiplier=jnp.ones(PHASES),
                                    steps=t, target_epsilon=eps, delta=DELTA,
                                    num_iterations=iterations, design=kind, key=key)
  return np.asarray(result.noise_multiplier), np.asarray(result.sampling_rate)


def realised_epsilons(sigma, q, steps):
  t = jnp.full(PHASES, float(steps // PHASES))
  return (float(jaxrdp.dpsgd_epsilon(q, sigma, t, DELTA)),
          float(jaxrdp.dpsgd_epsilon(q, sigma, t, DELTA, accountant="pld")))


def paired_interval(diff):
  """Mean and 95 % t-interval half-width of paired differences."""
  from scipy import stats
  d = np.asarray(diff, np.float64)
  half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
  return float(d.mean()), float(half)


METHODS = ("constant", "sigma", "batch", "both", "learned-fixed", "learned")
LABELS = {"constant": "constant σ (tuned η)", "sigma": "σ schedule, analytic",
          "batch": "batch-size schedule, analytic", "both": "σ and batch size, analytic",
          "learned-fixed": "σ schedule, learned (fixed draws)",
          "learned": "σ schedule, learned (fresh draws)"}
START, END = "<!-- schedule-design:start -->", "<!-- schedule-design:end -->"


def render(report):
  """The docs' tables (markdown): per task, test accuracy per method and budget, and the
  paired difference to the constant schedule with its 95 % interval."""
  out = []
  for name, task in report["tasks"].items():
    budgets = list(task["budgets"])
    out.append(f"**{name}** ({task['steps']} steps, base sampling rate {task['sampling_rate']}, "
               f"{report['seeds']} seeds; test accuracy, and the paired difference to the "
               "constant schedule, percentage points, 95 % interval)\n")
    out.append("| method | " + " | ".join(f"ε = {float(b):g}" for b in budgets) + " |")
    out.append("|---|" + "---|" * len(budgets))
    for method in METHODS:
      cells = []
      for b in budgets:
        row = task["budgets"][b].get(method)
        if row is None:
          cells.append("–")
          continue
        cell = f"{100 * row['test']:.1f} %"
        if "diff" in row:
          mean, half = row["diff"]
          mark = " **(>0)**" if mean - half > 0 else (" (<0)" if mean + half < 0 else "")
          cell += f", {100 * mean:+.1f} ± {100 * half:.1f}{mark}"
        cells.append(cell)
      out.append(f"| {LABELS[method]} | " + " | ".join(cells) + " |")
    out.append("")
  if any("–" in line for line in out):
    out.append("–: not measured yet.")
  return "\n".join(out)


def render_replication(report, earlier):
  """The paired differences of two runs of the protocol side by side (markdown), per task and
  method: ``earlier``'s, this ``report``'s, and both runs' seeds pooled (20 paired differences;
  the runs share their initialisations and batches, only the noise draws differ, so the
  pooled interval is somewhat narrower than independent runs would give)."""
  out = ["| task | method | " + " | ".join(
      f"ε = {float(b):g}: earlier / this run / pooled" for b in earlier["tasks"][
          next(iter(earlier["tasks"]))]["budgets"]) + " |"]
  out.append("|---|---|" + "---|" * len(earlier["tasks"][next(iter(earlier["tasks"]))]["budgets"]))
  for name, task in report["tasks"].items():
    before = earlier["tasks"].get(name)
    if before is None:
      continue
    for method in METHODS[1:]:
      cells = []
      for b in task["budgets"]:
        rows = [r["budgets"].get(b, {}) for r in (before, task)]
        if not all(method in r and "constant" in r for r in rows):
          cells.append("–")
          continue
        diffs = [np.asarray(r[method]["test_seeds"]) - np.asarray(r["constant"]["test_seeds"])
                 for r in rows]
        parts = [paired_interval(d) for d in diffs] + [paired_interval(np.concatenate(diffs))]
        mark = lambda m, h: " **(>0)**" if m - h > 0 else (" (<0)" if m + h < 0 else "")
        cells.append(" / ".join(f"{100 * m:+.1f} ± {100 * h:.1f}{mark(m, h)}" for m, h in parts))
      out.append(f"| {name} | {LABELS[method]} | " + " | ".join(cells) + " |")
  return "\n".join(out)


def write_docs(report, page, image, earlier=None):
  """Replace the results block of ``page`` by :func:`render`'s tables (and, with an
  ``earlier`` run, :func:`render_replication`'s); plot the paired differences (one panel per
  task) to ``image``."""
  text = open(page).read()
  a, b = text.index(START) + len(START), text.index(END)
  block = render(report)
  if earlier is not None:
    block += ("\n**Two runs of the protocol** (the same seeds, initialisations and batches; the "
              "noise drawn by two versions of the transform's generator: per leaf, and one draw "
              "for all leaves): paired difference to the constant schedule, percentage points, "
              "95 % interval\n\n" + render_replication(report, earlier) + "\n")
  with open(page, "w") as f:
    f.write(text[:a] + "\n" + block + "\n" + text[b:])
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  tasks = list(report["tasks"])
  fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), squeeze=False)
  for ax, name in zip(axes[0], tasks):
    budgets = list(report["tasks"][name]["budgets"])
    for k, method in enumerate(METHODS[1:]):
      xs, ys, es = [], [], []
      for i, b in enumerate(budgets):
        row = report["tasks"][name]["budgets"][b].get(method)
        if row is not None:
          xs.append(i + 0.12 * (k - 1.5))
          ys.append(100 * row["diff"][0])
          es.append(100 * row["diff"][1])
      ax.errorbar(xs, ys, yerr=es, fmt="o", capsize=3, label=LABELS[method])
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(budgets)), [f"ε = {float(b):g}" for b in budgets])
    ax.set_title(name)
    ax.set_ylabel("test accuracy − constant σ (pp)")
  axes[0][-1].legend(fontsize=7, loc="best")
  fig.tight_layout()
  fig.savefig(image, dpi=110)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tasks", default="digits,mnist1d,cancer")
  parser.add_argument("--epsilons", default="1,3,8")
  parser.add_argument("--methods", default=",".join(METHODS))
  parser.add_argument("--seeds", type=int, default=10)
  parser.add_argument("--iterations", type=int, default=60, help="design iterations (analytic)")
  parser.add_argument("--learned-iterations", type=int, default=15)
  parser.add_argument("--learning-rates", default=None,
                      help="comma-separated grid for every task instead of each task's own "
                           "(a sensitivity check: the tables use the tasks' grids)")
  parser.add_argument("--json", default=None)
  parser.add_argument("--docs", action="store_true",
                      help="write the tables into docs/schedule-design.md and the plot into "
                           "docs/images/schedule_design.png")
  parser.add_argument("--from-json", default=None,
                      help="render the docs from a saved run instead of running")
  parser.add_argument("--earlier", default=None,
                      help="a saved earlier run of the protocol (other noise draws): its paired "
                           "differences and the pooled ones are rendered beside this run's")
  args = parser.parse_args(argv)
  docs = (os.path.join(ROOT, "docs", "schedule-design.md"),
          os.path.join(ROOT, "docs", "images", "schedule_design.png"))
  earlier = json.load(open(args.earlier)) if args.earlier else None
  if args.from_json:
    write_docs(json.load(open(args.from_json)), *docs, earlier=earlier)
    return
  start = time.perf_counter()
  import _results   # the run's provenance: command, date, machine, versions
  report = {"delta": DELTA, "phases": PHASES, "clip": CLIP, "seeds": args.seeds, "tasks": {}}
  for name in args.tasks.split(","):
    task = load_task(name)
    run = make_trainer(task)
    steps, q0, lrs = task[5], task[6], task[7]
    if args.learning_rates:
      lrs = tuple(float(v) for v in args.learning_rates.split(","))
    keys = jax.random.split(jax.random.key(1), args.seeds)
    report["tasks"][name] = out = {"steps": steps, "sampling_rate": q0, "learning_rates": lrs,
                                   "budgets": {}}
    for eps in map(float, args.epsilons.split(",")):
      rows = out["budgets"][str(eps)] = {}
      for method in args.methods.split(","):
        t0 = time.perf_counter()
        # The learned design is run at the constant schedule's tuned learning rate.
        learned = method.startswith("learned")
        design_lr = rows["constant"]["lr"] if learned else lrs[0]
        iterations = args.learned_iterations if learned else args.iterations
        sigma, q = design(task, method, eps, design_lr, iterations)
        rdp_eps, pld_eps = realised_epsilons(sigma, q, steps)
        if not (rdp_eps <= eps and pld_eps <= eps):
          raise RuntimeError(f"{name} {method}: realised epsilon {rdp_eps}, {pld_eps} > {eps}")
        va, te, _ = (np.asarray(v, np.float64) for v in run(keys, sigma, q, lrs))
        k = int(np.argmax(va.mean(axis=1)))   # the first of the best mean validation accuracies
        best = {"lr": lrs[k], "val": float(va[k].mean()), "val_seeds": va[k].tolist(),
                "test_seeds": te[k].tolist(), "test": float(te[k].mean())}
        best.update(sigma=sigma.tolist(), q=q.tolist(), epsilon_rdp=rdp_eps, epsilon_pld=pld_eps,
                    gradient_evaluations=float(np.sum(q) * (steps // PHASES) * task[0][0].shape[0]))
        if method != "constant":
          best["diff"] = paired_interval(np.asarray(best["test_seeds"])
                                         - np.asarray(rows["constant"]["test_seeds"]))
        rows[method] = best
        diff = (f"  diff {100 * best['diff'][0]:+.2f} ± {100 * best['diff'][1]:.2f} pp"
                if "diff" in best else "")
        print(f"{name:8s} eps={eps:<4g} {method:9s} lr={best['lr']:<7g} val {best['val']:.4f} "
              f"test {best['test']:.4f}{diff}  sigma {sigma[0]:.2f}->{sigma[-1]:.2f} "
              f"q {q[0]:.4f}->{q[-1]:.4f}  eps rdp {rdp_eps:.4f} pld {pld_eps:.4f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
  report["seconds"] = time.perf_counter() - start
  report.update(_results.metadata())
  print(f"total {report['seconds']:.0f} s")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1)
  print(render(report))
  if args.docs:
    write_docs(report, *docs, earlier=earlier)


if __name__ == "__main__":
  main()
