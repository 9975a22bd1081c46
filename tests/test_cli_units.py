"""The CLI in a training run's units: N, B, E for q and steps, fractions and scientific notation,
``calibrate --solve-for``, the headline line. Every answer equals the library's on the same values.

One setting throughout (q = 600/60000 = 0.01, σ = 1.1, 10,000 steps = 100 epochs, δ = 1e-5, as
tests/test_cli.py), so that the compiled programs are shared.
"""

import argparse
import io
import json
import math

import pytest

import jaxrdp
from jaxrdp.cli import commands, parsing
from jaxrdp.cli import main as cli
from cli_errors import exit_2

N, B, E = 60_000, 600, 100
Q, SIGMA, T, DELTA = B / N, 1.1, 10_000, 1e-5
TRAINING = ["--dataset-size", str(N), "--batch-size", str(B), "--epochs", str(E)]
RATE = ["--sampling-rate", f"{B}/{N}", "--steps", "1e4"]
REST = ["--noise-multiplier", str(SIGMA), "--delta", str(DELTA)]
TARGET = ["--epsilon", "3", "--delta", str(DELTA)]


def _json(capsys, argv):
  assert cli.main(argv + ["--json"]) == 0
  return json.loads(capsys.readouterr().out)


def _text(capsys, argv):
  assert cli.main(argv) == 0
  return capsys.readouterr().out.splitlines()


# --- numbers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [("0.01", 0.01), ("1e-5", 1e-5), ("256/60000", 256 / 60000),
                                         (" 3 ", 3.0), ("1.5e0", 1.5), ("1/3", 1 / 3)])
def test_numbers_are_decimals_or_fractions_rounded_once(text, value):
  assert parsing.number(text) == value


@pytest.mark.parametrize("text, value", [("1e4", 10_000), ("10000", 10_000), ("2e1/2", 10),
                                         ("1_000", 1000)])
def test_a_whole_count_may_be_written_in_scientific_notation(text, value):
  assert parsing.whole(text) == value and isinstance(parsing.whole(text), int)


@pytest.mark.parametrize("text", ["1.5e0", "5/2", "1e-1", "nan", "inf", "1e400"])
def test_a_count_that_is_not_whole_is_refused(text):
  with pytest.raises(argparse.ArgumentTypeError, match="whole number"):
    parsing.whole(text)


def test_steps_in_scientific_notation_that_is_not_whole_names_the_flag(capsys):
  err = exit_2(capsys, ["epsilon", "--sampling-rate", "0.01", "--steps", "1.5e0"] + REST)
  assert "--steps must be a whole number, got '1.5e0'" in err


def test_training_schedule_is_exact():
  # 3 epochs of 100 examples in batches of 10: 30 steps (floating point would give 31).
  assert parsing.training_schedule(100, 10, 3.0) == (0.1, 30)
  assert parsing.training_schedule(N, 256, 3.0) == (256 / N, math.ceil(3 * N / 256))


# --- N, B, E for q and steps ------------------------------------------------------------------

def test_epsilon_from_dataset_batch_and_epochs_is_the_librarys(capsys):
  got = _json(capsys, ["epsilon"] + TRAINING + REST)
  refined = float(jaxrdp.dpsgd_epsilon(Q, SIGMA, T, DELTA))
  assert (got["sampling_rate"], got["steps"]) == (Q, T)
  assert (got["dataset_size"], got["batch_size"], got["epochs"]) == (N, B, E)
  assert got["epsilon_refined"] == pytest.approx(refined, rel=1e-12)
  # the same numbers as --sampling-rate B/N --steps 1e4
  same = _json(capsys, ["epsilon"] + RATE + REST)
  assert {k: same[k] for k in ("epsilon", "order", "epsilon_refined", "epsilon_classic")} == {
      k: got[k] for k in ("epsilon", "order", "epsilon_refined", "epsilon_classic")}
  lines = _text(capsys, ["epsilon"] + TRAINING + REST)
  assert lines[0] == f"ε = {refined:.4g} (δ = 1e-05, RDP, order ≈ {got['order']:g})"
  assert "Assumptions:" in lines and any("q = B/N = 600/60000 = 0.01" in x for x in lines)
  assert any(f"ceil(100 * 60000 / 600) = {T}" in x for x in lines)
  assert any(x.startswith("epsilon = ") and "dpsgd_epsilon" in x for x in lines)


def test_calibrate_from_dataset_batch_and_epochs_is_the_librarys(capsys):
  got = _json(capsys, ["calibrate", "--epsilon", "2", "--delta", str(DELTA)] + TRAINING)
  sigma = float(jaxrdp.calibrate_noise_multiplier(2.0, DELTA, Q, T))
  assert got["noise_multiplier"] == pytest.approx(sigma, rel=1e-12)
  assert (got["sampling_rate"], got["steps"], got["solve_for"]) == (Q, T, "noise-multiplier")
  lines = _text(capsys, ["calibrate", "--epsilon", "2", "--delta", str(DELTA)] + TRAINING)
  assert lines[0] == f"σ = {sigma:.6g} for ε = 2 (δ = 1e-05, RDP)"
  assert f"noise multiplier = {sigma!r}" in lines


def test_calibrate_solves_for_the_sampling_rate(capsys):
  argv = ["calibrate", "--solve-for", "sampling-rate", "--steps", "1e4",
          "--noise-multiplier", str(SIGMA)] + TARGET
  got = _json(capsys, argv)
  q = float(jaxrdp.calibrate_sampling_rate(3.0, DELTA, SIGMA, T))
  assert got["sampling_rate"] == pytest.approx(q, rel=1e-12) and got["steps"] == T
  assert _text(capsys, argv)[0] == f"q = {q:.6g} for ε = 3 (δ = 1e-05, RDP)"


def test_calibrate_solves_for_the_steps_also_in_epochs(capsys):
  steps = int(jaxrdp.calibrate_steps(3.0, DELTA, Q, SIGMA))
  argv = ["calibrate", "--solve-for", "steps", "--sampling-rate", "0.01",
          "--noise-multiplier", str(SIGMA)] + TARGET
  got = _json(capsys, argv)
  assert got["steps"] == steps and "epochs" not in got
  assert _text(capsys, argv)[0] == f"steps = {steps} for ε = 3 (δ = 1e-05, RDP)"
  argv = ["calibrate", "--solve-for", "steps", "--dataset-size", str(N), "--batch-size", str(B),
          "--noise-multiplier", str(SIGMA)] + TARGET
  got = _json(capsys, argv)
  assert got["steps"] == steps and got["epochs"] == pytest.approx(steps * B / N, rel=1e-15)
  lines = _text(capsys, argv)
  assert lines[0] == f"steps = {steps} ({steps * B / N:.4g} epochs) for ε = 3 (δ = 1e-05, RDP)"
  assert any(f"epochs = steps * B / N = {steps} * {B} / {N}" in x for x in lines)


@pytest.mark.parametrize("argv, flags", [
    (["epsilon"] + RATE + TRAINING + REST, ["--sampling-rate", "--dataset-size"]),
    (["epsilon", "--dataset-size", "100", "--batch-size", "10"] + REST, ["--epochs"]),
    (["epsilon", "--steps", "10"] + REST, ["--sampling-rate"]),
    (["epsilon"] + REST, ["--sampling-rate", "--steps", "--dataset-size"]),
    (["epsilon", "--dataset-size", "10", "--batch-size", "20", "--epochs", "1"] + REST,
     ["--batch-size must be at most --dataset-size (10), got 20"]),
    (["calibrate"] + TARGET + RATE + ["--noise-multiplier", "1"], ["--noise-multiplier"]),
    (["calibrate", "--solve-for", "steps", "--noise-multiplier", "1"] + TARGET + RATE,
     ["--steps", "--solve-for steps"]),
    (["calibrate", "--solve-for", "steps", "--noise-multiplier", "1"] + TARGET + TRAINING,
     ["--epochs", "--solve-for steps"]),
    (["calibrate", "--solve-for", "steps", "--noise-multiplier", "1"] + TARGET,
     ["--sampling-rate", "--dataset-size and --batch-size"]),
    (["calibrate", "--solve-for", "sampling-rate", "--steps", "10"] + TARGET,
     ["--noise-multiplier"]),
    (["calibrate", "--solve-for", "sampling-rate", "--noise-multiplier", "1"] + TARGET + RATE,
     ["--sampling-rate", "--solve-for sampling-rate"]),
    (["calibrate", "--solve-for", "sampling-rate", "--noise-multiplier", "1", "--steps", "10",
      "--dataset-size", "100"] + TARGET, ["--dataset-size"]),
])
def test_missing_or_superfluous_flags_exit_2_naming_them(capsys, argv, flags):
  err = exit_2(capsys, argv)
  assert all(flag in err for flag in flags), err


def test_headline_falls_back_to_ascii():
  out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
  commands.headline(out, "σ = 1.2 for ε = 2 (δ = 1e-05, RDP, order ≈ 3)")
  out.seek(0)
  assert out.read() == "sigma = 1.2 for epsilon = 2 (delta = 1e-05, RDP, order ~ 3)\n"


# --- one JSON schema --------------------------------------------------------------------------

SCHEMA = {   # key: its type(s); docs/cli.md, "JSON output"
    "sampling_rate": float, "noise_multiplier": float, "steps": int, "delta": float,
    "accountant": str, "epsilon": float,
}
TRAINING_KEYS = {"dataset_size": int, "batch_size": int, "epochs": float}
RDP_KEYS = {"order": float, "epsilon_classic": float, "order_classic": float,
            "epsilon_refined": float}
CALIBRATE_KEYS = {"target_epsilon": float, "solve_for": str}
PLD_RUN = ["--dataset-size", "1000", "--batch-size", "10", "--epochs", "1"] + REST   # q = 0.01
SCHEMA_CASES = [   # (argv, training keys?, calibrate keys?)
    (["epsilon"] + RATE + REST, False, False),
    (["epsilon"] + TRAINING + REST, True, False),
    (["epsilon", "--accountant", "pld"] + PLD_RUN, True, False),
    (["calibrate", "--epsilon", "2", "--delta", str(DELTA)] + RATE, False, True),
    (["calibrate", "--epsilon", "2", "--delta", str(DELTA)] + TRAINING, True, True),
    (["calibrate", "--solve-for", "sampling-rate", "--steps", "1e4",
      "--noise-multiplier", str(SIGMA)] + TARGET, False, True),
    (["calibrate", "--solve-for", "steps", "--dataset-size", str(N), "--batch-size", str(B),
      "--noise-multiplier", str(SIGMA)] + TARGET, True, True),
    (["dpsgd"] + PLD_RUN, True, False),
    (["dpsgd", "--accountant", "pld"] + PLD_RUN, True, False),
]


@pytest.mark.parametrize("argv, training, calibrate", SCHEMA_CASES,
                         ids=[" ".join(a[:3]) for a, *_ in SCHEMA_CASES])
def test_every_json_output_follows_one_schema(capsys, argv, training, calibrate):
  got = _json(capsys, argv)
  want = dict(SCHEMA)
  want.update(TRAINING_KEYS if training else {})
  want.update(RDP_KEYS if got["accountant"] == "rdp" or argv[0] == "dpsgd" else {})
  want.update(CALIBRATE_KEYS if calibrate else {})
  if argv[0] == "dpsgd":
    want.update(epsilon_rdp=float, epsilon_pld=float, epsilon_pld_unavailable=type(None))
  assert set(got) == set(want)
  for key, kind in want.items():
    assert isinstance(got[key], kind) and not isinstance(got[key], bool), (key, got[key])
  # ε is the accountant's on the schedule reported, as the library computes it
  q, sigma, steps = got["sampling_rate"], got["noise_multiplier"], got["steps"]
  if got["accountant"] == "pld":
    eps = float(jaxrdp.dpsgd_epsilon(q, sigma, steps, DELTA, accountant="pld"))
  else:
    eps = float(jaxrdp.dpsgd_epsilon(q, sigma, steps, DELTA, refine_order=False))
  assert got["epsilon"] == pytest.approx(eps, rel=1e-9)
  if calibrate:
    assert got["epsilon"] <= got["target_epsilon"]
