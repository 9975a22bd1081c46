"""Smoke run of examples/train_dpsgd_pld.py at a tiny size (1 epoch of 3 steps, a 4-point curve;
needs tqdm, and matplotlib for the plot): σ calibrated by the PLD accountant is
below σ by RDP at the same (ε, δ), and each run meets the target by its own accountant."""

import math

import pytest

from scripts import load_script

TARGET = 1.0


def _load():
  return load_script("examples/train_dpsgd_pld.py")


def test_pld_calibrates_less_noise_and_both_runs_meet_the_target(tmp_path, capsys):
  try:
    import matplotlib  # noqa: F401
    plot = tmp_path / "pld.png"
  except ImportError:
    plot = None
  argv = ["--epsilon", str(TARGET), "--epochs", "1", "--steps-per-epoch", "3", "--hidden", "8",
          "--curve-points", "4", "--quiet"] + (["--plot", str(plot)] if plot else [])
  result = _load().main(argv)

  sigmas = result["sigmas"]
  assert 0 < sigmas["pld"] < sigmas["rdp"] < math.inf
  assert result["steps"] == 3
  runs = {run["accountant"]: run for run in result["runs"]}
  assert set(runs) == {"rdp", "pld"}
  for accountant, run in runs.items():
    assert run["sigma"] == sigmas[accountant]
    assert 0.0 <= run["accuracy"] <= 1.0
    assert run["epsilon_recomputed"] <= TARGET
    # The state's ε (RDP: on the accountant's order grid, what the calibration checked) and
    # dpsgd_epsilon's (RDP: the best order refined between grid orders, never looser) agree.
    assert run["epsilon"][accountant] == pytest.approx(run["epsilon_recomputed"], rel=1e-3)
    assert 0 < run["epsilon"][accountant] <= TARGET * (1 + 1e-9)
    assert 1e-5 <= run["delta_total"] < 2e-5
  # The PLD is tighter: the RDP-calibrated run is below the target by the PLD, the
  # PLD-calibrated one above it by RDP.
  assert runs["rdp"]["epsilon"]["pld"] < TARGET < runs["pld"]["epsilon"]["rdp"]

  steps, curves = result["curve_steps"], result["curves"]
  assert steps[-1] == 3 and len(curves) == 4
  for (name, accountant), eps in curves.items():
    assert eps.shape == steps.shape and (eps[1:] > eps[:-1]).all()
    assert eps[-1] == pytest.approx(runs[name]["epsilon"][accountant], rel=1e-3)
  for name in sigmas:
    assert (curves[name, "pld"] < curves[name, "rdp"]).all()

  out = capsys.readouterr().out
  assert "calibrated by" in out and "sigma_pld" in out
  if plot:
    assert plot.stat().st_size > 0 and f"wrote {plot}" in out
