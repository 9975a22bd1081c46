"""Smoke run of examples/train_dpsgd.py at a tiny size (1 epoch of 3 steps; needs tqdm)."""

import math

from scripts import load_script


def _load():
  return load_script("examples/train_dpsgd.py")


def test_example_trains_one_tiny_epoch_and_reports_epsilon(capsys):
  result = _load().main(["--epochs", "1", "--steps-per-epoch", "3", "--hidden", "8", "--quiet"])
  (epoch, acc, eps, delta), = result["history"]
  assert epoch == 1 and 0.0 <= acc <= 1.0
  assert 0.0 < eps < math.inf and 1e-5 <= delta < 2e-5
  assert 0.0 <= result["nonprivate_accuracy"] <= 1.0
  assert result["info"]["max_batch_size"] > 64
  out = capsys.readouterr().out
  assert "final: test accuracy" in out and "non-private: test accuracy" in out
