"""Smoke test of examples/compare_variants.py and the orderings its curves must obey.

Orderings (same mechanism, same δ): the tight zCDP conversion (Canonne–Kamath–Steinke 2020
Cor. 13) is the infimum over all real α of the improved RDP conversion, so it is ≤ the RDP ε on
any finite order grid; Bun–Steinke's ρ + 2√(ρ log(1/δ)) is the infimum of Mironov's classic
conversion, so it is ≤ the classic RDP ε; the improved conversion is ≤ the classic one at every
order; CKS ≤ BS16. Advanced composition is the loosest for many steps. The per-step ε0 of the
example's advanced composition is checked against the Gaussian privacy profile (Balle & Wang
2018, Thm. 8) evaluated with mpmath at 30 digits.
"""

import contextlib
import io

import mpmath as mp
import numpy as np
import pytest

from scripts import load_script


@pytest.fixture(scope="module")
def example():
  return load_script("examples/compare_variants.py")


@pytest.fixture(scope="module")
def run(example, tmp_path_factory):
  out = tmp_path_factory.mktemp("plot") / "variants.png"
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    result = example.main(["--steps", "2000", "--sigma", "20", "--delta", "1e-6", "--out", str(out)])
  return result, out, printed.getvalue()


def test_writes_a_png(run):
  out = run[1]
  data = out.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_table_is_printed(run):
  text = run[2]
  assert "advanced composition" in text and "zCDP (tight)" in text and "RDP" in text
  assert all(f"\n{k:>7} " in text for k in (1, 10, 100, 1000, 2000))


def test_orderings_that_hold_mathematically(run):
  r = run[0]
  rel = 1 + 1e-12  # rounding allowances of the conversions (a few ulps)
  assert np.all(r["zCDP (tight)"] <= r["RDP"] * rel)
  assert np.all(r["zCDP (tight)"] <= r["zCDP (Bun-Steinke)"] * rel)
  assert np.all(r["RDP"] <= r["RDP (classic conversion)"] * rel)
  assert np.all(r["zCDP (Bun-Steinke)"] <= r["RDP (classic conversion)"] * rel)
  assert np.all(np.diff(r["RDP"]) > 0) and np.all(np.diff(r["advanced composition"]) > 0)


def test_advanced_composition_is_the_loosest_for_many_steps(run):
  r = run[0]
  many = r["steps"] >= 100
  others = np.max([r[k] for k in ("zCDP (Bun-Steinke)", "zCDP (tight)", "RDP", "RDP (classic conversion)")], axis=0)
  assert np.all(r["advanced composition"][many] > others[many])
  # ... by a growing factor (its ε grows like √k log k against √k).
  ratio = r["advanced composition"][many] / r["RDP"][many]
  assert ratio[-1] > ratio[0] > 1


def _log_delta_mp(eps, sigma):
  eps, s = mp.mpf(eps), mp.mpf(sigma)
  return mp.log(mp.ncdf(1 / (2 * s) - eps * s) - mp.exp(eps) * mp.ncdf(-1 / (2 * s) - eps * s))


@pytest.mark.parametrize("sigma,delta", [(20.0, 1e-6), (1.0, 1e-5), (200.0, 1e-9), (0.5, 1e-3)])
def test_per_step_epsilon_inverts_the_gaussian_privacy_profile(example, sigma, delta):
  # ε0 is rounded up: δ(ε0) ≤ δ, and 1e-9 relative below ε0 the profile is already above δ.
  mp.mp.dps = 30
  eps0 = float(example.gaussian_epsilon(np.float64(delta), sigma))
  assert _log_delta_mp(eps0, sigma) <= mp.log(delta)
  assert _log_delta_mp(eps0 * (1 - 1e-9), sigma) > mp.log(delta)
