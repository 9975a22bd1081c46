"""Benchmark: jaxrdp.sweep over a grid of DP-SGD configurations (q x sigma x steps x delta).

Default grid: 100 x 100 x 5 x 2 = 100,000 configurations, q log-spaced in [1e-4, 0.1], sigma
in [0.5, 5], steps in {100, 1000, 5000, 10000, 50000}, delta in {1e-5, 1e-6}. The kernel runs
once per (q, sigma) pair and order (10,000 x 170 log-A evaluations); steps and delta only enter
the conversion.

Run (from the repository root; a fresh process, so the first call includes compilation):

    PYTHONPATH=. python benchmarks/bench_sweep.py                    # float32 (the default dtype)
    PYTHONPATH=. python benchmarks/bench_sweep.py --float64
    PYTHONPATH=. python benchmarks/bench_sweep.py --size 10000000    # GPU: 10^6 to 10^8 configurations
    PYTHONPATH=. python benchmarks/bench_sweep.py --host-devices 2   # CPU: split over 2 host devices

Reports: the first call's wall time (compilation included, timed from just before the call;
the process's time since start is printed too), a second (warm) call (wall and CPU time: on a
shared machine the CPU time shows what other processes took away), peak resident memory
(getrusage), configurations per second and log-A evaluations per second (warm), and a check
that a random sample of cells equals ``dpsgd_epsilon(..., refine_order=False)`` (bitwise
count and the largest difference in ulps; see tests/test_sweep.py for why not all bitwise).
``--save`` / ``--json PATH`` write the figures as JSON (``benchmarks/_results.py``).
"""

import time

_START = time.perf_counter()

import argparse  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

import _results  # noqa: E402


def _args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--float64", action="store_true", help="compute in float64 (enables x64)")
  parser.add_argument("--size", type=int, default=100_000,
                      help="number of configurations (q x sigma grows; steps x delta stays 5 x 2)")
  parser.add_argument("--chunk-size", type=int, default=None, help="(q, sigma) pairs per call")
  parser.add_argument("--samples", type=int, default=20, help="cells checked against dpsgd_epsilon")
  parser.add_argument("--host-devices", type=int, default=None,
                      help="CPU only: split the host into this many XLA devices")
  parser.add_argument("--progress", action="store_true", help="show a progress bar")
  _results.add_options(parser)
  return parser.parse_args()


ARGS = _args()
if ARGS.host_devices:   # must precede the first use of JAX
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={ARGS.host_devices}")

import jax  # noqa: E402

if ARGS.float64:
  jax.config.update("jax_enable_x64", True)  # this script's choice; the library never sets it

import numpy as np  # noqa: E402

import jaxrdp  # noqa: E402
from jaxrdp.accounting.sweep import sweep  # noqa: E402

STEPS = np.array([100, 1000, 5000, 10_000, 50_000])
DELTAS = np.array([1e-5, 1e-6])


def peak_gib():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def main():
  dtype = np.float64 if ARGS.float64 else np.float32
  side = max(1, round((ARGS.size / (STEPS.size * DELTAS.size)) ** 0.5))
  q = np.geomspace(1e-4, 0.1, side).astype(dtype)
  sigma = np.linspace(0.5, 5.0, side).astype(dtype)
  steps, deltas = STEPS.astype(dtype), DELTAS.astype(dtype)
  n_configs = q.size * sigma.size * steps.size * deltas.size
  n_log_a = q.size * sigma.size * len(jaxrdp.DEFAULT_ORDERS)
  print(f"jax {jax.__version__}, devices: {jax.devices()}, dtype {np.dtype(dtype).name}")
  print(f"grid: {q.size} q x {sigma.size} sigma x {steps.size} steps x {deltas.size} deltas = "
        f"{n_configs:,} configurations; {n_log_a:,} log-A evaluations "
        f"({len(jaxrdp.DEFAULT_ORDERS)} orders per (q, sigma) pair)")
  kwargs = dict(chunk_size=ARGS.chunk_size, progress=ARGS.progress)

  start, cpu = time.perf_counter(), time.process_time()
  eps = np.asarray(sweep(q, sigma, steps, deltas, **kwargs))
  first, first_cpu = time.perf_counter() - start, time.process_time() - cpu
  since_start = time.perf_counter() - _START
  print(f"first call (incl. compilation): {first:.2f} s wall, {first_cpu:.2f} s CPU  [process "
        f"wall since start: {since_start:.2f} s], peak RSS {peak_gib():.2f} GiB")

  start, cpu = time.perf_counter(), time.process_time()
  warm_eps = np.asarray(sweep(q, sigma, steps, deltas, **kwargs))
  warm, warm_cpu = time.perf_counter() - start, time.process_time() - cpu
  peak = peak_gib()
  print(f"warm call: {warm:.2f} s wall ({warm_cpu:.2f} s CPU) = {n_configs / warm:,.0f} "
        f"configurations/s, {n_log_a / warm:,.0f} log-A evaluations/s; "
        f"peak RSS {peak:.2f} GiB")
  assert np.array_equal(eps, warm_eps, equal_nan=True)
  print(f"non-finite cells: {int(np.sum(~np.isfinite(eps)))}; "
        f"epsilon range [{np.nanmin(eps):.4g}, {np.nanmax(eps):.4g}]")

  rng = np.random.default_rng(0)
  cells = [tuple(int(rng.integers(n)) for n in eps.shape) for _ in range(ARGS.samples)]
  bitwise, worst = 0, 0.0
  for i, j, k, l in cells:
    ref = np.asarray(jaxrdp.dpsgd_epsilon(q[i], sigma[j], steps[k], deltas[l], refine_order=False))
    got = eps[i, j, k, l]
    bitwise += int(got == ref)
    worst = max(worst, float(abs(got - ref) / np.spacing(np.abs(ref))))
  print(f"sample of {len(cells)} cells vs dpsgd_epsilon(refine_order=False): {bitwise} bitwise "
        f"equal, largest difference {worst:.0f} ulps")
  _results.write(ARGS, {
      "dtype": np.dtype(dtype).name, "configurations": n_configs, "log_a_evaluations": n_log_a,
      "shape": list(eps.shape), "first_s": first, "first_cpu_s": first_cpu,
      "process_s_at_first": since_start, "warm_s": warm, "warm_cpu_s": warm_cpu,
      "configurations_per_s": n_configs / warm, "log_a_per_s": n_log_a / warm,
      "peak_rss_gib": peak, "non_finite": int(np.sum(~np.isfinite(eps))),
      "samples": len(cells), "bitwise_equal": bitwise, "max_ulps": worst})
  if worst > 64:
    sys.exit("MISMATCH: a sampled cell differs from dpsgd_epsilon by more than 64 ulps")


if __name__ == "__main__":
  main()
