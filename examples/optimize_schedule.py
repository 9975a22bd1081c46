"""Design a DP-SGD schedule by gradient for a real model, and measure the accuracy it buys.

Task: the digits (scikit-learn's, stored in examples/data), an MLP 64-32-10, DP-SGD with
``jaxrdp.differentially_private_aggregate`` and SGD for 600 steps at a base sampling rate of
0.05 (Poisson batches), clipping norm 1, δ = 1e-5, in 10 phases.

1. The baseline: the constant σ whose ε is the budget (``calibrate_noise_multiplier``).
2. The design: ``jaxrdp.optimize_schedule(..., design="both")`` chooses σ and the batch size
   of each phase (the expected number of gradient evaluations held) to minimise
   ``jaxrdp.noisy_sgd_utility`` — the variance the injected noise leaves in the final iterate
   of noisy SGD — with ε exactly at the budget (at most it, for the schedule returned).
3. Both are trained with ten seeds (the same seeds for both), each at its best learning rate
   on a validation split; the test accuracy of each and their paired difference are printed.
   The clipped gradient sum comes from one backward pass of the batch ("ghost norms",
   :func:`clipped_grad_sum`), handed to the transform as a ``jaxrdp.ClippedGradSum``; every
   learning rate and seed of a schedule trains in one vmapped program.

It reproduces the row "σ and batch size, analytic" at ε = 8 of the digits table in the docs
("Designing schedules", from benchmarks/schedule_design.py: the same data split, model, seeds
and learning-rate grid). What to expect: a designed schedule buys little over a constant σ
with a tuned learning rate — +0.9 percentage points here (+0.5 with the same seeds and other
noise draws; the constant schedule's own accuracy moves by about a point between such draws);
the example shows how to measure it on your own model.

Run:  python examples/optimize_schedule.py [--epsilon 8] [--seeds 10] [--out schedule.png]

About 15–16 s on a 2-core CPU (``benchmarks/bench_examples.py``: a quarter of it the design, a
quarter training, most of the rest compiling); it prints a line per stage.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import time

import numpy as np
import jax
import jax.numpy as jnp
import optax

import jaxrdp

DIGITS = pathlib.Path(__file__).resolve().parent / "data" / "digits.npz"
PHASES, STEPS, RATE, CLIP, DELTA = 10, 600, 0.05, 1.0, 1e-5
LEARNING_RATES = (0.0625, 0.125, 0.25, 0.5, 1.0)


def load_digits():
  """Train / validation / test splits (1200 / 300 / 297) of the digits, pixels in [0, 1]."""
  with np.load(DIGITS) as data:
    x = (data["images"] / 16.0).astype(np.float32)
    y = data["labels"].astype(np.int32)
  perm = np.random.default_rng(0).permutation(len(x))
  parts = np.split(perm, [1200, 1500])
  return [(jax.device_put(x[p]), jax.device_put(y[p])) for p in parts]


def init_mlp(key, sizes=(64, 32, 10)):
  params = []
  for a, b in zip(sizes[:-1], sizes[1:]):
    key, sub = jax.random.split(key)
    params.append((jax.random.normal(sub, (a, b), jnp.float32) / math.sqrt(a),
                   jnp.zeros((b,), jnp.float32)))
  return params


def forward(params, x, shifts=None):
  """(logits, each layer's input) of the MLP (tanh hidden layers); ``shifts`` (one per layer)
  are added to the pre-activations: the loss's gradient with respect to them is each
  example's δ_l."""
  shifts = shifts or [0.0] * len(params)
  inputs = []
  for k, ((w, b), shift) in enumerate(zip(params, shifts)):
    inputs.append(x)
    x = x @ w + b + shift
    x = jnp.tanh(x) if k < len(params) - 1 else x
  return x, inputs


def logits(params, x):
  return forward(params, x)[0]


def clipped_grad_sum(params, x, y, mask, clip):
  """Σ_i mask_i clip_C(g_i) of the MLP's summed cross-entropy, as a
  :class:`jaxrdp.ClippedGradSum`, without per-example gradients ("ghost norms", Goodfellow
  2015): example i's gradient of layer l is a_il ⊗ δ_il (the layer's input a and the loss's
  gradient at its pre-activation δ), and δ_il for the bias, so ||g_i||² = Σ_l (||a_il||² + 1)
  ||δ_il||², and the clipped sum is Σ_l A_lᵀ (s ⊙ Δ_l) with each example's scale
  s_i = min(1, C / ||g_i||) (0 where masked): one backward pass of the batch instead of one
  per example (training is 3-4x faster here). Differentiable (double ``where``: finite where
  a gradient is 0)."""
  def loss(shifts):
    out, inputs = forward(params, x, shifts)
    return jnp.sum(-jnp.take_along_axis(jax.nn.log_softmax(out), y[:, None], 1)), inputs
  zeros = [jnp.zeros((x.shape[0], w.shape[1]), x.dtype) for w, _ in params]
  deltas, inputs = jax.grad(loss, has_aux=True)(zeros)
  squares = sum((jnp.sum(a * a, 1) + 1) * jnp.sum(d * d, 1) for a, d in zip(inputs, deltas))
  norm = jnp.sqrt(jnp.where(squares > 0, squares, 1.0))
  scale = jnp.where(mask, jnp.minimum(1.0, clip / norm), 0.0)
  return jaxrdp.ClippedGradSum([(a.T @ (scale[:, None] * d), scale @ d)
                                for a, d in zip(inputs, deltas)], clip)


def make_trainer(train, val, test):
  """train(keys, σ per phase, q per phase, learning rates) -> (validation, test accuracy),
  each (learning rates, keys)."""
  x, y = train
  n = x.shape[0]
  per_phase = STEPS // PHASES
  accuracy = lambda p, d: jnp.mean(jnp.argmax(logits(p, d[0]), -1) == d[1])

  def run(key, sigmas, qs, lr, max_batch):
    phase = lambda count: jnp.minimum(count // per_phase, PHASES - 1)
    k_init, k_noise, k_batch = jax.random.split(key, 3)
    tx = optax.chain(
        jaxrdp.differentially_private_aggregate(
            CLIP, lambda c: sigmas[phase(c)], k_noise, sampling_rate=lambda c: qs[phase(c)],
            expected_batch_size=lambda c: qs[phase(c)] * n),
        optax.sgd(lr))
    params = init_mlp(k_init)

    def step(carry, i):
      params, state = carry
      idx, mask = jaxrdp.poisson_sample(jax.random.fold_in(k_batch, i), n, qs[phase(i)],
                                        max_batch)
      clipped = clipped_grad_sum(params, x[idx], y[idx], mask, CLIP)
      updates, state = tx.update(clipped, state, params)
      return (optax.apply_updates(params, updates), state), None

    (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), jnp.arange(STEPS))
    return accuracy(params, val), accuracy(params, test)

  # One batch shape for both schedules (the design keeps its rates within 1.5x the base
  # rate): one program, run for every learning rate and seed at once.
  room = jaxrdp.poisson_max_batch_size(n, 1.5 * RATE)
  compiled = {}

  def train_all(keys, sigmas, qs, lrs):
    max_batch = max(room, jaxrdp.poisson_max_batch_size(n, float(np.max(qs))))
    if max_batch not in compiled:
      per_key = jax.vmap(lambda k, s, q, lr: run(k, s, q, lr, max_batch), (0, None, None, None))
      # A short run, whose first call (mostly compilation) is most of the wait: compiled with
      # jaxrdp's CPU options (about 3 s less here; a long training run would rather keep
      # XLA's defaults, which run large arrays faster).
      compiled[max_batch] = jax.jit(jax.vmap(per_key, (None, None, None, 0)),
                                    compiler_options=jaxrdp.compiler_options())
    va, te = compiled[max_batch](keys, np.asarray(sigmas), np.asarray(qs), np.asarray(lrs))
    return np.asarray(va, np.float64), np.asarray(te, np.float64)
  return train_all


def best_run(train_all, keys, sigmas, qs):
  """(learning rate, test accuracies per seed) of the best mean validation accuracy."""
  val, test = train_all(keys, sigmas, qs, LEARNING_RATES)   # (learning rates, seeds)
  k = int(np.argmax(val.mean(axis=1)))
  return LEARNING_RATES[k], test[k]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--epsilon", type=float, default=8.0)
  parser.add_argument("--seeds", type=int, default=10)
  parser.add_argument("--iterations", type=int, default=60)
  parser.add_argument("--out", default="optimize_schedule.png", help="plot file (PNG), or ''")
  args = parser.parse_args(argv)
  start = time.perf_counter()
  elapsed = lambda: f"({time.perf_counter() - start:.0f} s)"

  with jax.enable_x64(True):   # the accountant in float64; the model stays in float32
    train, val, test = load_digits()
    n = train[0].shape[0]
    steps = np.full(PHASES, float(STEPS // PHASES))
    # The baseline on the design's phases (the same σ as on one phase of all the steps; the
    # accountant then compiles its programs for this shape once, for both).
    sigma = float(jaxrdp.calibrate_noise_multiplier(args.epsilon, DELTA, np.full(PHASES, RATE),
                                                    steps))
    constant = (np.full(PHASES, sigma), np.full(PHASES, RATE))
    print(f"budget epsilon = {args.epsilon:g} at delta = {DELTA:g}: constant sigma = {sigma:.3f}, "
          f"q = {RATE} {elapsed()}", flush=True)

    # η μ T = 1: the design is then the same for every learning rate (η² a constant factor)
    lr = LEARNING_RATES[0]
    utility = jaxrdp.noisy_sgd_utility(steps, lr, l2_norm_clip=CLIP, dataset_size=n,
                                       curvature=1.0 / (lr * STEPS))
    result = jaxrdp.optimize_schedule(
        utility, sampling_rate=np.full(PHASES, RATE), noise_multiplier=np.ones(PHASES),
        steps=steps, target_epsilon=args.epsilon, delta=DELTA, num_iterations=args.iterations,
        design="both")
    designed = (np.asarray(result.noise_multiplier), np.asarray(result.sampling_rate))
    pld = float(jaxrdp.dpsgd_epsilon(*designed[::-1], steps, DELTA, accountant="pld"))
    print(f"designed: epsilon = {float(result.epsilon):.6f} (RDP), {pld:.4f} (PLD); "
          f"sigma {designed[0][0]:.3f} -> {designed[0][-1]:.3f}, batch "
          f"{designed[1][0] * n:.0f} -> {designed[1][-1] * n:.0f} (expected) {elapsed()}",
          flush=True)

    train_all = make_trainer(train, val, test)
    keys = jax.random.split(jax.random.key(1), args.seeds)
    runs = {}
    for name, (s, q) in (("constant", constant), ("designed", designed)):
      runs[name] = best_run(train_all, keys, s, q)
      lr, acc = runs[name]
      print(f"{name:9s}: test accuracy {100 * acc.mean():.2f} % over {args.seeds} seeds "
            f"(learning rate {lr} of {LEARNING_RATES}) {elapsed()}", flush=True)
    diff = 100 * (runs["designed"][1] - runs["constant"][1])
    se = diff.std(ddof=1) / math.sqrt(diff.size) if diff.size > 1 else float("nan")
    print(f"designed - constant: {diff.mean():+.2f} percentage points "
          f"(± {se:.2f} standard error of the paired difference) {elapsed()}")

    if args.out:
      import matplotlib
      matplotlib.use("Agg")
      import matplotlib.pyplot as plt
      fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
      phase = np.arange(1, PHASES + 1)
      a.step(phase, constant[0], where="mid", label="constant σ")
      a.step(phase, designed[0], where="mid", label="designed σ")
      a.set_xlabel("phase (60 steps each)")
      a.set_ylabel("noise multiplier σ")
      a2 = a.twinx()
      a2.step(phase, designed[1] * n, where="mid", color="C2", ls="--", label="designed batch")
      a2.set_ylabel("expected batch size")
      a.legend(loc="upper left", fontsize=8)
      a2.legend(loc="lower right", fontsize=8)
      at = np.linspace(0.0, STEPS, 31)
      for label, (s, q) in (("constant", constant), ("designed", designed)):
        b.plot(at, jaxrdp.epsilon_trajectory(q, s, steps, DELTA, at), label=label)
      b.set_xlabel("steps")
      b.set_ylabel(f"ε at δ = {DELTA:g}")
      b.legend(fontsize=8)
      fig.tight_layout()
      fig.savefig(args.out, dpi=110)
      print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
