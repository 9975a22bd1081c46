"""Step time of ``jaxrdp.dpsgd`` (with its accountant) against ``optax.contrib.dpsgd``.

Both optimizers train the same MLP on the same random batch with the same clip norm, noise
multiplier and learning rate. A step is: per-example gradients (``jax.vmap(jax.grad)``), the
optimizer's update, ``optax.apply_updates``, all in one jitted function; optax's dpsgd takes
the per-example gradients as its ``updates`` too. Timings are interleaved (A, B, A, B, ...)
so that machine load affects both alike; the median over repeats is reported, and the last
line is ``RATIO jaxrdp/optax = <x>`` (goal: at most 1.05). Before the timings, each step's
compilation (XLA's default options, the median of three compilations of fresh lowerings,
alternating) and the kernels XLA compiled for it (``benchmarks/_kernels.py``): what the
transform adds to a user's first step.

Run from the repository root::

  PYTHONPATH=. python benchmarks/bench_transform.py                   # defaults
  PYTHONPATH=. python benchmarks/bench_transform.py --batch 64 --hidden 256 --repeats 41

``--save`` / ``--json PATH`` write the figures as JSON (``benchmarks/_results.py``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import jax
import jax.numpy as jnp
import optax
import optax.contrib

from jaxrdp.training.transform import dpsgd, privacy_spent

import _kernels
import _results


def init_mlp(key, sizes):
  params = []
  for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
    k = jax.random.fold_in(key, i)
    params.append({"w": jax.random.normal(k, (a, b), jnp.float32) / np.sqrt(a),
                   "b": jnp.zeros((b,), jnp.float32)})
  return params


def loss_fn(params, x, y):
  h = x
  for layer in params[:-1]:
    h = jax.nn.relu(h @ layer["w"] + layer["b"])
  logits = h @ params[-1]["w"] + params[-1]["b"]
  return -jax.nn.log_softmax(logits)[y]


def make_step(opt, with_mask):
  per_example = jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))

  @jax.jit
  def step(params, state, x, y, mask):
    grads = per_example(params, x, y)
    if with_mask:
      updates, state = opt.update(grads, state, params, mask=mask)
    else:
      updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state
  return step


def time_steps(step, params, state, x, y, mask, steps):
  start = time.perf_counter()
  for _ in range(steps):
    params, state = step(params, state, x, y, mask)
  jax.block_until_ready(params)
  return (time.perf_counter() - start) / steps, params, state


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--features", type=int, default=64)
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--classes", type=int, default=10)
  parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
  parser.add_argument("--repeats", type=int, default=21, help="timed blocks per optimizer")
  parser.add_argument("--clip", type=float, default=1.0)
  parser.add_argument("--sigma", type=float, default=1.1)
  _results.add_options(parser)
  args = parser.parse_args(argv)

  print(f"devices: {jax.devices()}; jax {jax.__version__}, optax {optax.__version__}")
  key = jax.random.key(0)
  sizes = (args.features, args.hidden, args.hidden, args.classes)
  params = init_mlp(key, sizes)
  x = jax.random.normal(jax.random.fold_in(key, 100), (args.batch, args.features), jnp.float32)
  y = jax.random.randint(jax.random.fold_in(key, 101), (args.batch,), 0, args.classes)
  mask = jnp.ones((args.batch,), bool)
  print(f"MLP {sizes}, batch {args.batch}, {sum(p.size for p in jax.tree.leaves(params))} parameters")

  ours = dpsgd(0.1, args.clip, args.sigma, jax.random.key(1), sampling_rate=0.01,
               expected_batch_size=float(args.batch))
  theirs = optax.contrib.dpsgd(0.1, args.clip, args.sigma, 1)
  runs = {"jaxrdp": (make_step(ours, True), ours.init(params)),
          "optax": (make_step(theirs, False), theirs.init(params))}
  compile_s = {name: [] for name in runs}
  kernels = {}
  optimizers = {"jaxrdp": (ours, True), "optax": (theirs, False)}
  for _ in range(3):
    for name, (_, s) in runs.items():   # a new jitted step each time: nothing cached
      lowered = make_step(*optimizers[name]).lower(params, s, x, y, mask)
      t0 = time.perf_counter()
      compiled = lowered.compile()
      compile_s[name].append(time.perf_counter() - t0)
      kernels[name] = sum(_kernels.fusions(compiled.as_text()).values())
  compile_med = {name: float(np.median(v)) for name, v in compile_s.items()}
  for name in runs:
    print(f"{name:7s} compile {compile_med[name]:.3f} s, {kernels[name]} kernels")
  times = {name: [] for name in runs}
  state = {}
  for name, (step, s) in runs.items():  # compile and warm up
    t0 = time.perf_counter()
    _, p, s = time_steps(step, params, s, x, y, mask, 3)
    state[name] = (p, s)
    print(f"{name}: compile + 3 steps {time.perf_counter() - t0:.2f} s")
  for _ in range(args.repeats):
    for name, (step, _) in runs.items():
      p, s = state[name]
      dt, p, s = time_steps(step, p, s, x, y, mask, args.steps)
      state[name] = (p, s)
      times[name].append(dt)
  med = {name: float(np.median(v)) for name, v in times.items()}
  for name, v in times.items():
    print(f"{name:7s} median {med[name] * 1e3:8.3f} ms/step   (min {min(v) * 1e3:.3f}, "
          f"max {max(v) * 1e3:.3f})")
  steps_done = int(state["jaxrdp"][1][0].count)
  eps, order = privacy_spent(state["jaxrdp"][1], 1e-5)
  print(f"jaxrdp accountant after {steps_done} steps (q=0.01): eps={float(eps):.4f} at order "
        f"{float(order)}")
  print(f"RATIO jaxrdp/optax = {med['jaxrdp'] / med['optax']:.3f}")
  _results.write(args, {
      "mlp": list(sizes), "parameters": sum(p.size for p in jax.tree.leaves(params)),
      "jaxrdp_step_s": med["jaxrdp"], "optax_step_s": med["optax"],
      "ratio_jaxrdp_over_optax": med["jaxrdp"] / med["optax"], "goal_ratio": 1.05,
      "jaxrdp_compile_s": compile_med["jaxrdp"], "optax_compile_s": compile_med["optax"],
      "jaxrdp_kernels": kernels["jaxrdp"], "optax_kernels": kernels["optax"],
      "steps": steps_done, "epsilon": float(eps), "order": float(order)})


if __name__ == "__main__":
  main()
