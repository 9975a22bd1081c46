#!/usr/bin/env python
r"""Exact ε(δ) references for the PLD accountant, at 50 digits (mpmath).

Independent of the package under test (never imports ``jaxrdp``); needs mpmath, and SciPy and
dp_accounting for the cross-checks.

Quantities
----------
(G) q = 1, T steps, noise multiplier σ, sensitivity 1. T Gaussian mechanisms compose to one
    with μ = √T/σ, whose exact hockey-stick divergence is (Balle & Wang 2018, Thm. 8)
        δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).
    The add and the remove direction coincide (the pair is symmetric).
(S) T = 1, Poisson sampling at rate q < 1 (Zhu, Dong, Wang 2022, Thm. 11: the dominating pairs
    of add/remove adjacency, which for one step are exact):
        remove: P = (1 − q) N(0, σ²) + q N(1, σ²),  Q = N(0, σ²),  L(x) = log(1 − q + q r(x)),
        add:    P = N(0, σ²),  Q = (1 − q) N(0, σ²) + q N(1, σ²),  L(x) = −log(1 − q + q r(x)),
    r(x) = exp((2x − 1)/(2σ²)). L is monotone in x, so {L > ε} is a half-line and
    δ_dir(ε) = ∫(P − e^ε Q)₊ = P(L > ε) − e^ε Q(L > ε) is a difference of Gaussian CDFs at
        remove: x > x_r = σ² log((e^ε − (1 − q))/q) + 1/2,
                δ = q Φ̄((x_r − 1)/σ) − (e^ε − 1 + q) Φ̄(x_r/σ);
        add:    x < x_a = σ² log((e^{−ε} − (1 − q))/q) + 1/2   (empty for ε ≥ −log(1 − q)),
                δ = (1 − e^ε (1 − q)) Φ(x_a/σ) − e^ε q Φ((x_a − 1)/σ).
    The mechanism's δ(ε) is the larger direction's; its ε(δ) the larger direction's ε.
In both, dδ_dir/dε = −e^ε Q(L > ε), and ε(δ) = inf{ε ≥ 0 : δ(ε) ≤ δ} (0 where δ(0) ≤ δ).

Method
------
ε(δ) by a safeguarded Newton iteration on log δ(ε) (Newton steps kept inside a bracket that
every evaluation narrows; bisection where a step leaves it), at WORK_DPS digits, stopped when
the step is below 10^−(WORK_DPS − 5) relative. Every term of δ is at most 1 and δ ≥ 1e-15, so
the subtraction loses at most 15 digits: ≥ 55 of the WORK_DPS = 75 survive. Every ε is computed
again at CHECK_DPS = 100 digits; the relative difference of the two is stored per case
("check", ≤ 1e-50 expected) and the script fails if any exceeds 1e-48. The stored "epsilon" is
the 100-digit value rounded to MP_DPS = 50 significant digits (a decimal string);
"epsilon_float64" is the nearest float64 (repr). Inputs are float64 values (decimal repr
strings), and mpmath evaluates at exactly those binary values.

Cross-checks (stored under "checks"; the script fails if one is violated)
-------------------------------------------------------------------------
* ``scipy_gaussian``: (G)'s δ at each q = 1 case's exact ε, recomputed in float64 with SciPy's
  ``log_ndtr`` (another implementation of Φ), where ε ≤ 1000: max relative difference from δ.
* ``quadrature``: (S)'s δ at each T = 1 case's exact ε, recomputed as ∫(P − e^ε Q)₊ dx by
  mpmath.quad (tanh-sinh at 30 digits) over the whole line, split at the half-line's end point
  (checks the half-line reduction and the closed forms): max relative difference.
* ``dp_accounting``: for each (q, σ) of the T = 1 grid at δ = 1e-5, dp_accounting's
  ``from_gaussian_mechanism(σ, sampling_prob=q, value_discretization_interval=Δ)`` (Δ = 1e-5
  for σ ≥ 2, 1e-4 below, where 1e-5 takes ~10 s per PLD) with ``pessimistic_estimate=False``
  (privacy buckets, ``use_connect_dots=False``) and ``True`` (connect the dots) must bracket
  the exact ε; the largest relative width of the bracket is stored. (And the issue's value
  ε(q=0.01, σ=1, δ=1e-5) = 0.19945 is checked too; (G) with σ = 300, T = 1e5, δ = 1e-12:
  7.66548, and σ = 2, T = 10, δ = 1e-5: 7.511).

Cases (fixed seed SEED)
-----------------------
* ``q1_handpicked`` (q = 1, interval 1e-4): (σ, T, δ) = (300, 1e5, 1e-12), (200, 1e4, 1e-12),
  (25, 1e4, 1e-10), (15.8, 1000, 1e-10), (100, 1e6, 1e-15), (1000, 1e6, 1e-12), (2, 10, 1e-5);
  the last also at intervals 0.3, 0.5 and 1.0.
* ``q1_random`` (q = 1), N_RANDOM cases: σ log-uniform in [1, 1e3], T = floor of a log-uniform
  draw in [1, 1e7 + 1), δ log-uniform in [1e-15, 1e-2], interval log-uniform in [1e-5, 1].
* ``t1_grid`` (T = 1): q ∈ {1e-3, 0.01, 0.1, 0.5} × σ ∈ {0.5, 1, 2, 5} × δ ∈ {1e-5, 1e-10,
  1e-15} × interval ∈ {1e-4, 0.01, 0.3, 1.0} (it contains the issue's (q = 0.01, σ = 1,
  δ = 1e-5, interval 1.0): 0.19945).
A case with "quick": true belongs to the bounded subset that the default (not slow) test and
``benchmarks/pld_soundness.py --quick`` run: all hand-picked cases, the first QUICK_RANDOM
random ones whose composed loss fits a window of ≤ QUICK_MAX_BINS points (an estimate from μ:
(μ² + 20μ + 20)/interval, so that the quick subset stays a few seconds per case), and
QUICK_T1 from the T = 1 grid.

Output: tests/data/pld_references.json (one case per line).
Run:    python tools/make_pld_references.py            (about a minute on one core)
        python tools/make_pld_references.py --quick    (a few cases, prints only)
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import mpmath as mp
import numpy as np

SEED = 20261201
MP_DPS = 50          # significant digits stored
WORK_DPS = 75        # working precision of δ(ε) and of the root
CHECK_DPS = 100      # the second, independent-precision evaluation of every ε
N_RANDOM = 220
OUT_PATH = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "pld_references.json"

Q1_HANDPICKED = [(300.0, 100_000, 1e-12), (200.0, 10_000, 1e-12), (25.0, 10_000, 1e-10),
                 (15.8, 1000, 1e-10), (100.0, 1_000_000, 1e-15), (1000.0, 1_000_000, 1e-12),
                 (2.0, 10, 1e-5)]
Q1_COARSE = [(2.0, 10, 1e-5, interval) for interval in (0.3, 0.5, 1.0)]
DEFAULT_INTERVAL = 1e-4
T1_Q = [1e-3, 0.01, 0.1, 0.5]
T1_SIGMA = [0.5, 1.0, 2.0, 5.0]
T1_DELTA = [1e-5, 1e-10, 1e-15]
T1_INTERVAL = [1e-4, 0.01, 0.3, 1.0]
QUICK_RANDOM = 6
QUICK_MAX_BINS = 300_000
# (q, σ, δ, interval) of the T = 1 grid in the quick subset: the case, the default
# interval at the smallest δ, a coarse interval at small q.
QUICK_T1 = [(0.01, 1.0, 1e-5, 1.0), (0.01, 1.0, 1e-5, 1e-4), (0.1, 0.5, 1e-15, 1e-4),
            (0.5, 2.0, 1e-10, 0.01), (1e-3, 5.0, 1e-5, 0.3), (0.1, 1.0, 1e-10, 1.0)]
# Published values (the issue) the exact ε must round to.
ANCHORS = {("q1", 300.0, 100_000, 1e-12): "7.66548", ("q1", 2.0, 10, 1e-5): "7.511",
           ("t1", 0.01, 1.0, 1e-5): "0.19945"}


# ---------------------------------------------------------------------------------------------
# δ(ε) and dδ/dε of one direction, at the current mpmath precision.


def _cdf(x):
  """Φ(x) with full relative accuracy in the lower tail (erfc of a positive argument)."""
  return mp.erfc(-x / mp.sqrt(2)) / 2


def gaussian_delta(eps, mu):
  """(G): (δ(ε), dδ/dε) of the Gaussian mechanism with μ = √T/σ."""
  eps, mu = mp.mpf(eps), mp.mpf(mu)
  q_tail = _cdf(-eps / mu - mu / 2)             # Q(L > ε)
  delta = _cdf(-eps / mu + mu / 2) - mp.exp(eps) * q_tail
  return delta, -mp.exp(eps) * q_tail


def remove_delta(eps, q, sigma):
  """(S), remove direction: (δ(ε), dδ/dε); L > ε ⇔ x > x_r."""
  eps, q, s = mp.mpf(eps), mp.mpf(q), mp.mpf(sigma)
  x = s**2 * mp.log((mp.exp(eps) - (1 - q)) / q) + mp.mpf(1) / 2
  q_tail = _cdf(-x / s)                         # Q(L > ε) = Φ̄(x_r/σ)
  delta = q * _cdf(-(x - 1) / s) - (mp.expm1(eps) + q) * q_tail
  return delta, -mp.exp(eps) * q_tail


def add_delta(eps, q, sigma):
  """(S), add direction: (δ(ε), dδ/dε); L > ε ⇔ x < x_a, empty for ε ≥ −log(1 − q)."""
  eps, q, s = mp.mpf(eps), mp.mpf(q), mp.mpf(sigma)
  inner = mp.exp(-eps) - (1 - q)
  if inner <= 0:
    return mp.mpf(0), mp.mpf(0)
  x = s**2 * mp.log(inner / q) + mp.mpf(1) / 2
  e = mp.exp(eps)
  q_tail = (1 - q) * _cdf(x / s) + q * _cdf((x - 1) / s)     # Q(L > ε)
  delta = (1 - e * (1 - q)) * _cdf(x / s) - e * q * _cdf((x - 1) / s)
  return delta, -e * q_tail


# ---------------------------------------------------------------------------------------------
# ε(δ): the root of a decreasing δ(ε).


def solve_epsilon(delta_fn, delta, dps):
  """inf{ε ≥ 0 : δ(ε) ≤ δ} for a non-increasing δ(ε) = ``delta_fn(ε)[0]``, at ``dps`` digits.

  Safeguarded Newton on log δ(ε) − log δ: the bracket [lo, hi] (δ(lo) > δ ≥ δ(hi)) shrinks at
  every evaluation; a Newton step outside it, or from a point with δ = 0, is replaced by the
  bracket's midpoint.
  """
  with mp.workdps(dps):
    target = mp.mpf(delta)
    d0, _ = delta_fn(mp.mpf(0))
    if d0 <= target:
      return mp.mpf(0)
    lo, hi = mp.mpf(0), mp.mpf(1)
    while delta_fn(hi)[0] > target:
      lo, hi = hi, 2 * hi
    x = (lo + hi) / 2
    tol = mp.mpf(10) ** (-(dps - 5))
    for _ in range(2000):
      d, slope = delta_fn(x)
      if d > target:
        lo = x
      else:
        hi = x
      if d > 0 and slope < 0:
        step = (mp.log(d) - mp.log(target)) * d / -slope      # (log δ)' = δ'/δ
        new = x + step
      else:
        new = lo - 1         # forces bisection
      if not lo < new < hi:
        new = (lo + hi) / 2
      if abs(new - x) <= tol * max(abs(x), mp.mpf(1)) or hi - lo <= tol * max(hi, mp.mpf(1)):
        return new
      x = new
    raise RuntimeError("ε(δ) did not converge")


def exact_q1(sigma, steps, delta, dps):
  """(ε, None) of (G) at ``dps`` digits (the two directions coincide)."""
  with mp.workdps(dps):
    mu = mp.sqrt(mp.mpf(steps)) / mp.mpf(sigma)
  return solve_epsilon(lambda e: gaussian_delta(e, mu), delta, dps), None


def exact_t1(q, sigma, delta, dps):
  """(ε, the direction that attains it) of (S) at ``dps`` digits."""
  remove = solve_epsilon(lambda e: remove_delta(e, q, sigma), delta, dps)
  add = solve_epsilon(lambda e: add_delta(e, q, sigma), delta, dps)
  return (remove, "remove") if remove >= add else (add, "add")


# ---------------------------------------------------------------------------------------------
# The cases.


def _log_uniform(rng, lo, hi, n):
  return np.exp(rng.uniform(math.log(lo), math.log(hi), n))


def _window_bins(sigma, steps, interval):
  """A rough size of the composed q = 1 PLD's window: loss ~ N(μ²/2, μ²) in both directions."""
  mu = math.sqrt(steps) / sigma
  return (mu * mu + 20 * mu + 20) / interval


def cases():
  """The list of case dicts (inputs and group), before the references are computed."""
  out = []
  for sigma, steps, delta in Q1_HANDPICKED:
    out.append(dict(group="q1_handpicked", q=1.0, sigma=sigma, steps=steps, delta=delta,
                    interval=DEFAULT_INTERVAL, quick=True))
  for sigma, steps, delta, interval in Q1_COARSE:
    out.append(dict(group="q1_handpicked", q=1.0, sigma=sigma, steps=steps, delta=delta,
                    interval=interval, quick=True))
  rng = np.random.default_rng(SEED)
  sigma = _log_uniform(rng, 1.0, 1e3, N_RANDOM)
  steps = np.floor(_log_uniform(rng, 1.0, 1e7 + 1, N_RANDOM)).astype(int)
  delta = _log_uniform(rng, 1e-15, 1e-2, N_RANDOM)
  interval = _log_uniform(rng, 1e-5, 1.0, N_RANDOM)
  quick = 0
  for s, t, d, i in zip(sigma.tolist(), steps.tolist(), delta.tolist(), interval.tolist()):
    fits = quick < QUICK_RANDOM and _window_bins(s, t, i) <= QUICK_MAX_BINS
    quick += fits
    out.append(dict(group="q1_random", q=1.0, sigma=s, steps=int(t), delta=d, interval=i,
                    quick=bool(fits)))
  for q in T1_Q:
    for s in T1_SIGMA:
      for d in T1_DELTA:
        for i in T1_INTERVAL:
          out.append(dict(group="t1_grid", q=q, sigma=s, steps=1, delta=d, interval=i,
                          quick=(q, s, d, i) in QUICK_T1))
  return out


def _key(case):
  """Cases sharing an exact ε (the interval does not enter it)."""
  return (case["q"], case["sigma"], case["steps"], case["delta"])


def _exact(case, dps):
  if case["q"] == 1.0:
    return exact_q1(case["sigma"], case["steps"], case["delta"], dps)
  assert case["steps"] == 1
  return exact_t1(case["q"], case["sigma"], case["delta"], dps)


def compute(case_list):
  """Adds "epsilon", "epsilon_float64", "direction", "check" to every case (in place)."""
  done = {}
  for case in case_list:
    key = _key(case)
    if key not in done:
      eps, direction = _exact(case, WORK_DPS)
      eps_check, direction_check = _exact(case, CHECK_DPS)
      assert direction == direction_check, case
      with mp.workdps(CHECK_DPS):
        diff = abs(eps - eps_check) / eps_check if eps_check > 0 else abs(eps - eps_check)
      if diff > mp.mpf(10) ** -48:
        raise RuntimeError(f"precision check failed ({float(diff):.3g}) for {case}")
      done[key] = (eps_check, direction, float(diff))
    eps, direction, diff = done[key]
    with mp.workdps(MP_DPS):
      case["epsilon"] = mp.nstr(+eps, MP_DPS, min_fixed=-mp.inf, max_fixed=mp.inf)
    with mp.workdps(CHECK_DPS):
      case["epsilon_float64"] = repr(float(eps))
    case["direction"] = direction or "both"
    case["check"] = f"{diff:.2e}"


# ---------------------------------------------------------------------------------------------
# Cross-checks.


def check_scipy_gaussian(case_list):
  """(G) in float64 with SciPy at the exact ε: max relative difference of δ."""
  from scipy import special
  worst = 0.0
  for case in case_list:
    eps = float(case["epsilon"])
    if case["q"] != 1.0 or not 0 < eps <= 1000:
      continue
    mu = math.sqrt(case["steps"]) / case["sigma"]
    log_a = special.log_ndtr(-eps / mu + mu / 2)
    log_b = special.log_ndtr(-eps / mu - mu / 2)
    delta = math.exp(log_a) * -math.expm1(eps + log_b - log_a)
    worst = max(worst, abs(delta / case["delta"] - 1))
  if worst > 1e-6:
    raise RuntimeError(f"SciPy disagrees with (G): {worst:.3g}")
  return worst


def _quadrature_delta(eps, q, sigma, direction):
  """∫(P − e^ε Q)₊ dx by mpmath.quad at 30 digits, split at the positive part's end point."""
  with mp.workdps(30):
    q, s, eps = mp.mpf(q), mp.mpf(sigma), mp.mpf(eps)
    phi = lambda x, m: mp.npdf(x, m, s)
    mix = lambda x: (1 - q) * phi(x, 0) + q * phi(x, 1)
    p, qq = (mix, lambda x: phi(x, 0)) if direction == "remove" else (lambda x: phi(x, 0), mix)
    f = lambda x: max(p(x) - mp.exp(eps) * qq(x), 0)
    if direction == "remove":
      x0 = s**2 * mp.log((mp.exp(eps) - (1 - q)) / q) + mp.mpf(1) / 2
      return mp.quad(f, [x0, x0 + s, x0 + 4 * s, x0 + 16 * s, mp.inf])
    x0 = s**2 * mp.log((mp.exp(-eps) - (1 - q)) / q) + mp.mpf(1) / 2
    return mp.quad(f, [-mp.inf, x0 - 16 * s, x0 - 4 * s, x0 - s, x0])


def check_quadrature(case_list):
  """(S) by direct quadrature at the exact ε: max relative difference of δ."""
  worst, seen = 0.0, set()
  for case in case_list:
    if case["q"] == 1.0 or _key(case) in seen or float(case["epsilon"]) == 0:
      continue
    seen.add(_key(case))
    delta = _quadrature_delta(case["epsilon"], case["q"], case["sigma"], case["direction"])
    worst = max(worst, float(abs(delta / case["delta"] - 1)))
  if worst > 1e-20:
    raise RuntimeError(f"quadrature disagrees with (S): {worst:.3g}")
  return worst


def check_dp_accounting(case_list):
  """dp_accounting's optimistic and pessimistic PLDs (Δ = 1e-5) bracket the T = 1 ε at 1e-5."""
  from dp_accounting.pld import privacy_loss_distribution as pld
  widest, seen = 0.0, set()
  for case in case_list:
    if case["group"] != "t1_grid" or case["delta"] != 1e-5 or _key(case) in seen:
      continue
    seen.add(_key(case))
    interval = 1e-5 if case["sigma"] >= 2 else 1e-4     # 1e-5 at σ ≤ 1: ~10 s per PLD
    bounds = [pld.from_gaussian_mechanism(case["sigma"], sampling_prob=case["q"],
                                          value_discretization_interval=interval,
                                          pessimistic_estimate=p,
                                          use_connect_dots=p).get_epsilon_for_delta(1e-5)
              for p in (False, True)]     # optimistic: privacy buckets (no connect-the-dots)
    exact = float(case["epsilon"])
    if not bounds[0] <= exact <= bounds[1]:
      raise RuntimeError(f"dp_accounting's bracket {bounds} misses {exact} for {case}")
    widest = max(widest, (bounds[1] - bounds[0]) / exact)
  return widest


def check_anchors(case_list):
  """The issue's published values: the exact ε rounds to each."""
  found = set()
  for case in case_list:
    kind = "q1" if case["q"] == 1.0 else "t1"
    key = (kind, case["sigma"], case["steps"], case["delta"]) if kind == "q1" else (
        kind, case["q"], case["sigma"], case["delta"])
    if key in ANCHORS:
      want = ANCHORS[key]
      digits = len(want.split(".")[1])
      if round(float(case["epsilon"]), digits) != float(want):
        raise RuntimeError(f"{case['epsilon']} does not round to the published {want}")
      found.add(key)
  return sorted(f"{k}: {ANCHORS[k]}" for k in found)


# ---------------------------------------------------------------------------------------------


def _line(case):
  keys = ("group", "quick", "q", "sigma", "steps", "delta", "interval", "epsilon",
          "epsilon_float64", "direction", "check")
  out = {k: case[k] for k in keys}
  for k in ("q", "sigma", "delta", "interval"):
    out[k] = repr(float(case[k]))
  return json.dumps(out, ensure_ascii=False)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="a few cases, printed, not written")
  args = parser.parse_args(argv)
  start = time.time()
  case_list = cases()
  if args.quick:
    case_list = [c for c in case_list if c["group"] != "q1_random"][:14] + [
        c for c in case_list if c["group"] == "t1_grid" and c["quick"]]
  compute(case_list)
  seconds_exact = time.time() - start
  checks = dict(scipy_gaussian=f"{check_scipy_gaussian(case_list):.2e}",
                quadrature=f"{check_quadrature(case_list):.2e}",
                dp_accounting_bracket_width=f"{check_dp_accounting(case_list):.2e}",
                anchors=check_anchors(case_list))
  print(f"{len(case_list)} cases, exact ε in {seconds_exact:.1f} s, checks in "
        f"{time.time() - start - seconds_exact:.1f} s: {checks}", file=sys.stderr)
  if args.quick:
    for case in case_list:
      print(_line(case))
    return
  header = {
      "description": (
          "Exact epsilon(delta) of the Poisson-sampled Gaussian's add/remove PLD where it has a "
          "closed form: q = 1 (T Gaussian steps = one with mu = sqrt(T)/sigma) and T = 1 "
          "(one step, half-line quadrature). Generated by tools/make_pld_references.py with "
          f"mpmath ({WORK_DPS} working digits, checked at {CHECK_DPS}; epsilon to {MP_DPS} "
          "significant digits)."),
      "seed": SEED, "mp_dps": MP_DPS, "work_dps": WORK_DPS, "check_dps": CHECK_DPS,
      "checks": checks,
  }
  body = ",\n".join(_line(c) for c in case_list)
  text = json.dumps(header, ensure_ascii=False, indent=0)[:-2] + ',\n"cases": [\n' + body + "\n]\n}\n"
  json.loads(text)
  OUT_PATH.write_text(text)
  print(f"wrote {len(case_list)} cases to {OUT_PATH}", file=sys.stderr)


if __name__ == "__main__":
  main()
