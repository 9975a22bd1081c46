"""The command-line interface (jaxrdp.cli): outputs agree with the library; bad input exits 2."""

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa

import jaxrdp
from jaxrdp.cli import main as cli

Q, SIGMA, T, DELTA = 0.01, 1.1, 10_000, 1e-5
MECHANISM = ["--sampling-rate", str(Q), "--noise-multiplier", str(SIGMA), "--steps", str(T),
             "--delta", str(DELTA)]
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _library(q, sigma, steps, delta):
  """Grid ε, its order and the refined ε, straight from the library (x64 is on in the tests)."""
  orders = np.asarray(jaxrdp.DEFAULT_ORDERS, np.float64)
  eps, order = jaxrdp.compute_epsilon(orders, jaxrdp.compute_rdp(q, sigma, steps, orders), delta)
  refined = jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, orders=orders)
  return float(eps), float(order), float(refined)


def _run_json(capsys, argv):
  assert cli.main(argv + ["--json"]) == 0
  return json.loads(capsys.readouterr().out)


def test_epsilon_json_matches_library(capsys):
  got = _run_json(capsys, ["epsilon"] + MECHANISM)
  eps, order, refined = _library(Q, SIGMA, T, DELTA)
  assert set(got) == {"sampling_rate", "noise_multiplier", "steps", "delta", "accountant",
                      "epsilon", "order", "epsilon_refined", "epsilon_classic", "order_classic"}
  assert (got["sampling_rate"], got["noise_multiplier"], got["steps"], got["delta"]) == (
      Q, SIGMA, T, DELTA)
  assert {k: got[k] for k in ("epsilon", "order", "epsilon_refined")} == pytest.approx(
      {"epsilon": eps, "order": order, "epsilon_refined": refined}, rel=1e-12)
  assert got["epsilon_classic"] > got["epsilon"]   # the classic conversion is looser
  assert got["epsilon_refined"] <= got["epsilon"]
  assert cli.main(["epsilon"] + MECHANISM) == 0
  text = capsys.readouterr().out
  assert f"{eps:.6g}" in text and f"order {order:g}" in text and "dpsgd_epsilon" in text


def test_classic_conversion_matches_dp_accounting_at_integer_orders(capsys):
  # At integer orders dp_accounting's RDP is exact too: the classic value
  # min_a T * RDP(a) + log(1/delta) / (a - 1) (Mironov 2017, Prop. 3) computed from its RDP
  # must equal the CLI's, order included.
  orders = np.arange(2, 65, dtype=np.float64)
  grid = ",".join(f"{a:g}" for a in orders)
  got = _run_json(capsys, ["epsilon"] + MECHANISM + ["--orders", grid])
  rdp = T * np.asarray(dpa._compute_rdp_poisson_subsampled_gaussian(Q, SIGMA, orders))
  classic = rdp + np.log(1 / DELTA) / (orders - 1)
  assert got["epsilon_classic"] == pytest.approx(classic.min(), rel=1e-9)
  assert got["order_classic"] == orders[np.argmin(classic)]
  assert cli.main(["epsilon"] + MECHANISM) == 0
  assert "classic conversion" in capsys.readouterr().out


def test_calibrate_is_on_the_safe_side(capsys):
  sigma = _run_json(capsys, ["calibrate", "--epsilon", "2", "--delta", str(DELTA),
                             "--sampling-rate", str(Q), "--steps", str(T)])["noise_multiplier"]
  assert sigma == pytest.approx(float(jaxrdp.calibrate_noise_multiplier(2.0, DELTA, Q, T)),
                                rel=1e-12)
  eps, _, _ = _library(Q, sigma, T, DELTA)
  assert eps <= 2.0
  assert _library(Q, sigma * (1 - 1e-6), T, DELTA)[0] > 2.0  # and tight


def test_dpsgd_statement(capsys):
  n, b, epochs = 60_000, 256, 3
  argv = ["dpsgd", "--dataset-size", str(n), "--batch-size", str(b), "--epochs", str(epochs),
          "--noise-multiplier", str(SIGMA), "--delta", str(DELTA)]
  q, steps = b / n, math.ceil(epochs * n / b)
  eps, order, refined = _library(q, SIGMA, steps, DELTA)
  got = _run_json(capsys, argv)
  assert got["steps"] == steps == 704 and got["sampling_rate"] == q
  assert got["epsilon"] == pytest.approx(eps, rel=1e-12)
  assert got["order"] == order
  assert got["epsilon_refined"] == pytest.approx(refined, rel=1e-12)
  assert got["epsilon_classic"] > got["epsilon"]
  assert cli.main(argv) == 0
  text = capsys.readouterr().out
  assert text.splitlines()[0] == f"ε = {refined:.4g} (δ = 1e-05, RDP, order ≈ {order:g})"
  for piece in ("Poisson sampling", f"{q:.6g}", f"= {steps}", f"{eps:.6g}", f"{order:g}",
                f"{refined:.6g}", f"{got['epsilon_classic']:.6g}", "classic conversion"):
    assert piece in text


# q = 1, 100,000 steps at σ = 0.2: the PLD's grid would need ~4.6e8 points at the default
# interval, over its limit (a ValueError of the PLD accountant); RDP answers at once.
UNSIZABLE_PLD = ["dpsgd", "--dataset-size", "60000", "--batch-size", "60000", "--epochs", "100000",
                 "--noise-multiplier", "0.2", "--delta", "1e-5"]


def test_dpsgd_reports_rdp_when_the_pld_cannot_be_sized(capsys):
  got = _run_json(capsys, UNSIZABLE_PLD)
  eps, order, refined = _library(1.0, 0.2, 100_000, 1e-5)
  assert got["epsilon"] == pytest.approx(eps, rel=1e-12) and got["order"] == order
  assert got["epsilon_refined"] == pytest.approx(refined, rel=1e-12)
  assert got["epsilon_pld"] is None
  assert "grid points" in got["epsilon_pld_unavailable"]
  assert cli.main(UNSIZABLE_PLD) == 0
  text = capsys.readouterr().out
  assert f"epsilon = {refined:.4g}" in text and "accounted by Renyi DP" in text
  assert "unavailable for this configuration" in text


def test_dpsgd_json_says_the_pld_is_available(capsys):
  got = _run_json(capsys, ["dpsgd", "--dataset-size", "1000", "--batch-size", "10", "--epochs",
                           "1", "--noise-multiplier", "1.1", "--delta", "1e-5"])
  assert got["epsilon_pld"] is not None and got["epsilon_pld_unavailable"] is None


def test_dpsgd_with_the_pld_accountant_still_fails_when_it_cannot_be_sized(capsys):
  with pytest.raises(SystemExit) as exc:
    cli.main(UNSIZABLE_PLD + ["--accountant", "pld"])
  assert exc.value.code == 2
  assert "grid points" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["epsilon", "--sampling-rate", "0.01", "--noise-multiplier", "1.1", "--steps", "100",
      "--delta", "2"], "--delta must lie in (0, 1), got 2"),
    (["epsilon", "--sampling-rate", "abc", "--noise-multiplier", "1.1", "--steps", "100",
      "--delta", "1e-5"], "--sampling-rate"),
    (["epsilon", "--sampling-rate", "1.5", "--noise-multiplier", "1.1", "--steps", "100",
      "--delta", "1e-5"], "--sampling-rate"),
    (["epsilon", "--sampling-rate", "0.01", "--noise-multiplier", "-1", "--steps", "100",
      "--delta", "1e-5"], "--noise-multiplier"),
    (["epsilon", "--sampling-rate", "0.01", "--noise-multiplier", "1.1", "--steps", "2.5",
      "--delta", "1e-5"], "--steps"),
    (["epsilon", "--sampling-rate", "0.01", "--noise-multiplier", "1.1", "--steps", "100",
      "--delta", "nan"], "--delta"),
    (["epsilon", "--sampling-rate", "0.01", "--noise-multiplier", "1.1", "--steps", "100",
      "--delta", "1e-5", "--orders", "2,0.5"], "--orders"),
    (["epsilon", "--sampling-rate", "0.01", "--noise-multiplier", "1.1", "--delta", "1e-5"],
     "--steps"),
    (["calibrate", "--epsilon", "0", "--delta", "1e-5", "--sampling-rate", "0.01", "--steps", "10"],
     "--epsilon"),
    (["dpsgd", "--dataset-size", "100", "--batch-size", "200", "--epochs", "1",
      "--noise-multiplier", "1", "--delta", "1e-5"], "--batch-size"),
    (["plot", "--sampling-rate", "0.01", "--noise-multiplier", "1.1", "--steps", "100",
      "--delta", "1e-5"], "--out"),
    ([], "COMMAND"),
])
def test_bad_input_exits_2_naming_the_flag(capsys, argv, flag):
  with pytest.raises(SystemExit) as exc:
    cli.main(argv)
  assert exc.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("jaxrdp: error: ") and flag in err
  assert err.count("\n") == 1 and "Traceback" not in err


def test_library_errors_are_mapped_to_flags():
  err = ValueError("target_epsilon=0.001 is not reachable for this\nschedule and delta.")
  assert cli._library_error(err) == ("--epsilon=0.001 is not reachable for this schedule "
                                     "and --delta.")


def test_plot_writes_png(tmp_path, capsys):
  out = tmp_path / "eps.png"
  assert cli.main(["plot"] + MECHANISM + ["--out", str(out)]) == 0
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  _, order, refined = _library(Q, SIGMA, T, DELTA)
  assert capsys.readouterr().out.splitlines() == [
      f"ε = {refined:.4g} after {T} steps (δ = 1e-05, RDP, order ≈ {order:g})", f"wrote {out}"]


def test_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
  with pytest.raises(SystemExit) as exc:
    cli.main(["plot"] + MECHANISM + ["--out", str(tmp_path / "x.png")])
  assert exc.value.code == 2
  err = capsys.readouterr().err
  assert "pip install matplotlib" in err and err.count("\n") == 1


def test_python_m_jaxrdp_json():
  # A fresh process, where jax_enable_x64 is off: the CLI must still compute in float64.
  env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run([sys.executable, "-m", "jaxrdp", "epsilon"] + MECHANISM + ["--json"],
                        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr
  got = json.loads(proc.stdout)
  eps, order, refined = _library(Q, SIGMA, T, DELTA)
  assert {k: got[k] for k in ("epsilon", "order", "epsilon_refined")} == pytest.approx(
      {"epsilon": eps, "order": order, "epsilon_refined": refined}, rel=1e-12)
