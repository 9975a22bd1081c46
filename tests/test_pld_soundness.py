"""The PLD accountant is sound: ``jaxrdp.pld_epsilon`` is never below the exact ε, or it refuses.

References, none computed by the code under test:

* tests/data/pld_references.json (tools/make_pld_references.py, mpmath, 50 significant digits):
  the exact ε(δ) where the mechanism's privacy loss has a closed form:
    - q = 1: T Gaussian steps compose to one Gaussian mechanism with μ = √T/σ, δ(ε) =
      Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Balle & Wang 2018, Thm. 8), solved for ε;
    - T = 1, q < 1: the add/remove dominating pair of the Poisson-sampled Gaussian (Zhu, Dong,
      Wang 2022, Thm. 11), whose loss is monotone, so δ(ε) is a difference of Gaussian CDFs
      at the end of a half-line; solved for ε, the larger direction's.
  Cases: the issue's hand-picked ones, a seeded random sample of 220 over σ ∈ [1, 10³],
  T ∈ [1, 10⁷], δ ∈ [1e-15, 1e-2], interval Δ ∈ [1e-5, 1] (log-uniform), and a T = 1 grid
  q ∈ {1e-3, 0.01, 0.1, 0.5} × σ ∈ {0.5, 1, 2, 5} × δ ∈ {1e-5, 1e-10, 1e-15} × Δ ∈ {1e-4,
  0.01, 0.3, 1}.
* ``prv_accountant.PRVAccountant``'s ``eps_lower`` (Gopi, Lee, Wutschitz 2021), a certified lower
  bound on the true ε, for q < 1 at T > 1 where no closed form exists (used where ε ≤ 50, as in
  tests/test_soundness.py, whose helper runs it).

Each case is evaluated as a user would: ``pld_epsilon(q, σ, T, δ, pld_grid=pld_grid(q, σ, T,
interval=Δ))``. It passes if the accountant refuses clearly (a ValueError from either call, or
ε = +inf) or answers ε ≥ exact · (1 − RTOL). RTOL = 4.5e-16 (two ulps): the reference is exact
to 50 digits and only its float64 rounding is allowed. The accountant's own read-out rounds on
the safe side (jaxrdp.accounting.pld: sums rounded up or down as they raise δ, ε kept in the
grid interval its closed form is exact on), so it needs no allowance. No discretisation error is
allowed below: the pessimistic discretisation is an upper bound by construction.
How loose the answer is (ε/exact − 1) is printed (``pytest -s``); benchmarks/pld_soundness.py
prints the full table.

Speed: every distinct PldGrid compiles its own program (~1–3 s), so the default test runs the
22 cases flagged "quick" in the file (the hand-picked ones, 6 random ones with small grids, 6
of the T = 1 grid; ~1 min); the whole file (422 cases) is ``@pytest.mark.slow``.
"""

from __future__ import annotations

import json
import math
import pathlib
import sys

import numpy as np
import pytest

import jaxrdp

DATA = pathlib.Path(__file__).parent / "data" / "pld_references.json"
RTOL = 4.5e-16   # see the module docstring: the reference's float64 rounding only


def _load():
  with open(DATA) as f:
    cases = json.load(f)["cases"]
  for case in cases:
    for key in ("q", "sigma", "delta", "interval", "epsilon_float64"):
      case[key] = float(case[key])
    case["steps"] = int(case["steps"])
  return cases


CASES = _load()


def _where(case):
  return (f"{case['group']}: q={case['q']!r}, sigma={case['sigma']!r}, T={case['steps']}, "
          f"delta={case['delta']!r}, interval={case['interval']!r}")


def _pld_epsilon(q, sigma, steps, delta, interval, for_delta=False):
  """(ε, None), or (None, the refusal's message) for a ValueError. ``for_delta``: the grid
  sized for reading ε at δ (``pld_grid(..., delta=δ)``, as ``pld_epsilon`` sizes its own)."""
  try:
    grid = jaxrdp.pld_grid(q, sigma, steps, interval=interval,
                           delta=delta if for_delta else None)
    return float(jaxrdp.pld_epsilon(q, sigma, steps, delta, pld_grid=grid)), None
  except ValueError as e:
    return None, str(e)


def _check(cases, for_delta=False):
  """Evaluates every case; returns (failures, summary). A failure is an answer below the exact
  ε (beyond RTOL) or one that is neither a number ≥ 0 nor +inf (NaN)."""
  failures, looseness, refused, infinite, zero_exact = [], [], [], 0, 0
  for case in cases:
    eps, refusal = _pld_epsilon(case["q"], case["sigma"], case["steps"], case["delta"],
                                case["interval"], *((True,) if for_delta else ()))
    exact = case["epsilon_float64"]
    if refusal is not None:
      refused.append(refusal)
    elif eps == math.inf:
      infinite += 1
    elif not eps >= exact * (1 - RTOL):       # also catches NaN
      failures.append(f"ε = {eps!r} < exact {case['epsilon']} "
                      f"(ε/exact − 1 = {eps / exact - 1 if exact else -math.inf:.3e}); {_where(case)}")
    elif exact > 0:
      looseness.append(eps / exact - 1)
    else:
      zero_exact += 1
  summary = dict(cases=len(cases), answered=len(looseness) + zero_exact, refused=len(refused),
                 infinite=infinite, below_exact=len(failures), exact_zero=zero_exact)
  if looseness:
    summary.update(min_looseness=f"{min(looseness):.3e}",
                   median_looseness=f"{float(np.median(looseness)):.3e}",
                   max_looseness=f"{max(looseness):.3e}")
  return failures, summary


# ---------------------------------------------------------------------------------------------
# The references themselves (cheap; the generator checks them more thoroughly).


def test_reference_file_holds_the_issues_cases_and_a_random_sample_of_at_least_200():
  groups = [c["group"] for c in CASES]
  assert groups.count("q1_random") >= 200
  random = [c for c in CASES if c["group"] == "q1_random"]
  assert min(c["delta"] for c in random) < 1e-13 and max(c["delta"] for c in random) > 1e-3
  assert max(c["steps"] for c in random) > 1e6 and max(c["sigma"] for c in random) > 500
  assert min(c["interval"] for c in random) < 2e-5 and max(c["interval"] for c in random) > 0.5


@pytest.mark.parametrize("q,sigma,steps,delta,published", [
    (1.0, 300.0, 100_000, 1e-12, 7.66548), (1.0, 2.0, 10, 1e-5, 7.511),
    (0.01, 1.0, 1, 1e-5, 0.19945)])
def test_reference_epsilon_rounds_to_the_issues_published_value(q, sigma, steps, delta, published):
  # The values quoted in issue 33 (to their printed digits).
  case = next(c for c in CASES if (c["q"], c["sigma"], c["steps"], c["delta"]) ==
              (q, sigma, steps, delta))
  digits = len(repr(published).split(".")[1])
  assert round(case["epsilon_float64"], digits) == published


def test_reference_gaussian_epsilon_solves_the_closed_form_in_float64():
  # (G) evaluated with SciPy (another Φ) at the stored ε gives back δ: the file is not garbled.
  from scipy import special
  for case in CASES:
    eps = case["epsilon_float64"]
    if case["q"] != 1.0 or not 0 < eps <= 1000:
      continue
    mu = math.sqrt(case["steps"]) / case["sigma"]
    log_a, log_b = special.log_ndtr(-eps / mu + mu / 2), special.log_ndtr(-eps / mu - mu / 2)
    delta = math.exp(log_a) * -math.expm1(eps + log_b - log_a)
    assert delta == pytest.approx(case["delta"], rel=1e-6), _where(case)


def test_check_fails_an_epsilon_below_the_exact_one(monkeypatch):
  # The check itself can fail: answers of exact · (1 − 1e-9), 0 and NaN are caught; the exact
  # value, +inf and a refusal pass.
  module = sys.modules[__name__]
  case = next(c for c in CASES if c["quick"] and c["epsilon_float64"] > 0)
  for answer in (case["epsilon_float64"] * (1 - 1e-9), 0.0, math.nan):
    monkeypatch.setattr(module, "_pld_epsilon", lambda *a, v=answer: (v, None))
    assert len(_check([case])[0]) == 1, answer
  for answer in ((case["epsilon_float64"], None), (math.inf, None), (None, "too large")):
    monkeypatch.setattr(module, "_pld_epsilon", lambda *a, v=answer: v)
    assert _check([case])[0] == [], answer


# ---------------------------------------------------------------------------------------------
# Soundness against the exact ε.


def _sized_differently(case):
  """Whether the grid sized for δ differs from the schedule's own (where it does not, the
  "grid" variant already checked the same computation)."""
  grids = []
  for delta in (None, case["delta"]):
    try:
      grids.append(jaxrdp.pld_grid(case["q"], case["sigma"], case["steps"],
                                   interval=case["interval"], delta=delta))
    except ValueError:
      return True   # a refusal: checked as such
  return grids[0] != grids[1]


@pytest.mark.parametrize("for_delta", [False, True], ids=["grid", "grid_for_delta"])
def test_quick_cases_are_never_below_the_exact_epsilon(for_delta):
  cases = [c for c in CASES if c["quick"] and (not for_delta or _sized_differently(c))]
  assert len(cases) >= 15
  failures, summary = _check(cases, for_delta)
  print(summary)
  assert not failures, "\n".join(failures)


@pytest.mark.slow   # 422 cases, one compiled program per grid, grids up to MAX_BINS: ~10-20 min
@pytest.mark.parametrize("for_delta", [False, True], ids=["grid", "grid_for_delta"])
def test_all_cases_are_never_below_the_exact_epsilon(for_delta):
  failures, summary = _check(CASES, for_delta)
  print(summary)
  assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# Soundness against the PRV accountant's certified lower bound (q < 1, T > 1).

# (q, σ, T, δ, interval): the anchors of tests/test_pld.py and test_soundness.py, small δ and
# coarse intervals (where the discretisation is coarsest relative to ε).
PRV_CASES = [
    (0.01, 1.1, 10_000, 1e-5, 1e-4), (0.01, 1.1, 10_000, 1e-5, 0.1),
    (0.1, 2.0, 1000, 1e-5, 1e-4), (0.1, 2.0, 1000, 1e-10, 0.01),
    (0.001, 0.8, 30_000, 1e-8, 1e-4), (0.02, 1.5, 100_000, 1e-12, 1e-3),
    (0.3, 1.0, 10, 1e-6, 1.0), (0.05, 3.0, 2000, 1e-14, 0.3), (0.2, 0.8, 50, 1e-12, 0.1),
]   # (at δ = 1e-15 the PRV accountant fails: its δ error would be 1e-18)


@pytest.mark.slow   # ~40 s: a compiled program per grid, the PRV accountant ~1 s per case
def test_sampled_cases_are_never_below_the_prv_accountants_lower_bound():
  from test_soundness import PRV_MAX_EPSILON, _prv_lower_bound
  checked, failures, ratios = 0, [], []
  for q, sigma, steps, delta, interval in PRV_CASES:
    # The PRV accountant's scale (its ε error) and the ε ≤ 50 gate come from RDP's ε, an upper
    # bound on the true ε, not from the accountant under test.
    scale = float(jaxrdp.dpsgd_epsilon(q, sigma, float(steps), delta))
    if scale > PRV_MAX_EPSILON:
      continue
    lower = _prv_lower_bound(q, sigma, steps, delta, scale)
    if lower is None:      # the reference failed or timed out, not the code under test
      continue
    checked += 1
    for for_delta in (False, True):   # the grid for the schedule, and the one sized for δ
      eps, refusal = _pld_epsilon(q, sigma, steps, delta, interval, for_delta)
      where = (f"q={q}, sigma={sigma}, T={steps}, delta={delta}, interval={interval}, "
               f"grid for delta: {for_delta}")
      if refusal is None and eps != math.inf:
        if not eps >= lower:
          failures.append(f"ε = {eps!r} < PRV lower bound {lower!r}; {where}")
        elif lower > 0:
          ratios.append(eps / lower)
  print(dict(checked=checked, min_ratio=min(ratios, default=math.nan),
             max_ratio=max(ratios, default=math.nan)))
  assert not failures, "\n".join(failures)
  assert checked >= len(PRV_CASES) - 1     # the PRV accountant handled (almost) all of them
