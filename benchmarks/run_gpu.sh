#!/usr/bin/env bash
# The GPU figures of docs/performance.md (issue 12, goal 6; the PLD sweep of bench_pld.py), in one
# run on a GPU machine, from the repository root:   bash benchmarks/run_gpu.sh [LOGFILE]
# Each step has its own time limit and the whole run stops starting new steps after DEADLINE
# seconds (default 420), most important first; everything printed also goes to LOGFILE, and each
# benchmark's figures to $RESULTS/<name>.json (default benchmarks/results/gpu). Then
# `python tools/performance_page.py` puts them on the page (its GPU section). STEPS (a
# comma-separated list of the step names below) runs those only, in this order.
set -u
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOG=${1:-gpu.log}
DEADLINE=${DEADLINE:-420}
PY=${PYTHON:-python3}
R=${RESULTS:-benchmarks/results/gpu}
STEPS=${STEPS:-all}
step() {  # step NAME LIMIT_S command...
  local name=$1 limit=$2; shift 2
  [[ $STEPS == all || ,$STEPS, == *,$name,* ]] || return 0
  if (( SECONDS + 10 > DEADLINE )); then echo "== skipped (deadline): $*" | tee -a "$LOG"; return; fi
  (( limit > DEADLINE - SECONDS )) && limit=$(( DEADLINE - SECONDS ))
  echo "== [$SECONDS s] $* (limit ${limit} s)" | tee -a "$LOG"
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
  echo "== rc ${PIPESTATUS[0]}" | tee -a "$LOG"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$LOG"
FIRST='import time; t = time.perf_counter(); import jax; jax.config.update("jax_enable_x64", True)
import jaxrdp; t1 = time.perf_counter(); jax.devices(); t2 = time.perf_counter()
e = jaxrdp.dpsgd_epsilon(0.01, 1.1, 10_000, 1e-5); t3 = time.perf_counter()
g = float(jax.grad(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 10_000, 1e-5))(1.1)); t4 = time.perf_counter()
c = float(jaxrdp.calibrate_noise_multiplier(2.0, 1e-5, 0.01, 10_000)); t5 = time.perf_counter()
p = float(jaxrdp.dpsgd_epsilon(0.01, 1.1, 10_000, 1e-5, accountant="pld")); t6 = time.perf_counter()
print(f"fresh process on {jax.devices()[0]}: imports {t1 - t:.2f} s, platform start {t2 - t1:.2f} s; "
      f"first calls: dpsgd_epsilon {float(e):.9f} (on {e.devices()}) in {t3 - t2:.2f} s, its grad "
      f"{g:.9f} {t4 - t3:.2f} s, calibrate_noise_multiplier {c:.9f} {t5 - t4:.2f} s, PLD epsilon "
      f"{p:.9f} {t6 - t5:.2f} s")'
step first 60 "$PY" -c "$FIRST"
# The same on the accelerator itself (no dispatch layer: every entry point a plain jax.jit).
step first_plain 60 env JAXRDP_PLAIN_JIT=1 "$PY" -c "$FIRST"
# Each eager first call in its own fresh process, against JAXRDP_PLAIN_JIT=1 (alternating).
step latency 150 "$PY" benchmarks/bench_latency.py --platform auto --plain --skip-script \
  --repeats 2 --json "$R/bench_latency.json"
JIT=jit_epsilon,jit_grad_epsilon,jit_calibrate,jit_compute_rdp,jit_vmap_epsilon  # *_options: CPU only
JIT+=,jit_value_and_grad_30,jit_value_and_grad_10k,jit_epsilon_10k
step user_jit 300 "$PY" benchmarks/bench_user_jit.py --platform cuda --repeats 3 --anchor-subset 200 \
  --only $JIT --json "$R/bench_user_jit.json"
step sweep_output_1e8 150 "$PY" benchmarks/bench_sweep_output.py --platform cuda --size 100000000 --repeats 1 --json "$R/bench_sweep_output_1e8.json"
step sweep_output_1e9 240 "$PY" benchmarks/bench_sweep_output.py --platform cuda --size 1000000000 --forms output --repeats 1 --json "$R/bench_sweep_output_1e9.json"
step gpu 90 "$PY" benchmarks/bench_gpu.py --repeats 3 --budget 2 --json "$R/bench_gpu.json"
step sweep_1e6_f32 60 "$PY" benchmarks/bench_sweep.py --size 1000000 --json "$R/bench_sweep_1e6_float32.json"
step sweep_1e6_f64 60 "$PY" benchmarks/bench_sweep.py --size 1000000 --float64 --json "$R/bench_sweep_1e6_float64.json"
step sweep_1e8_f32 90 "$PY" benchmarks/bench_sweep.py --size 100000000 --json "$R/bench_sweep_1e8_float32.json"
step rdp_curve_f64 60 "$PY" benchmarks/bench_rdp_curve.py --pairs 2000 --subset 20 --repeats 5 --json "$R/bench_rdp_curve_float64.json"
step pld 90 "$PY" benchmarks/bench_pld.py --repeats 3 --skip-first-call --skip-phased --json "$R/bench_pld.json"
step sweep_1e8_f64 120 "$PY" benchmarks/bench_sweep.py --size 100000000 --float64 --json "$R/bench_sweep_1e8_float64.json"
step rdp_curve_f32 60 "$PY" benchmarks/bench_rdp_curve.py --pairs 2000 --subset 20 --repeats 5 --float32 --json "$R/bench_rdp_curve_float32.json"
echo "== done after $SECONDS s" | tee -a "$LOG"
