"""Smoke test of examples/relative_gaussian_ridge.py at a tiny size."""

import numpy as np
import pytest

import jaxrdp
from jaxrdp.mechanisms.relative_gaussian import rdp_relative_gaussian

from scripts import load_script


@pytest.fixture(scope="module")
def example():
  return load_script("examples/relative_gaussian_ridge.py")


def test_example_runs_and_writes_the_plot(example, tmp_path, capsys):
  out = tmp_path / "ridge.png"
  curves = example.main(["--n", "3000", "--dim", "3", "--steps", "6", "--runs", "1",
                         "--epsilon", "2", "--out", str(out)])
  assert out.exists() and out.stat().st_size > 1000
  assert {"non-private", "RGM"} <= set(curves) and len(curves) == 5
  for vals in curves.values():
    assert vals.shape[-1] == 7 and np.all(np.isfinite(vals)) and np.all(vals > -1e-12)
  assert curves["non-private"][0, -1] < curves["non-private"][0, 0]
  text = capsys.readouterr().out
  assert "final excess loss" in text and "RGM" in text


def test_example_calibrations_reach_the_same_epsilon(example):
  """Each mechanism's noise is the smallest (to bisection accuracy) meeting the target ε."""
  eta, dim, steps, delta, target = 2e-3, 10, 40, 1e-5, 1.0
  gamma = example.calibrate(lambda g: example.epsilon_rgm(g, eta, dim, steps, delta),
                            target, 1e-6 * eta, 1e8 * eta)
  orders = np.asarray(jaxrdp.DEFAULT_ORDERS)
  rdp = steps * rdp_relative_gaussian(eta=eta, gamma=gamma, dim=dim, orders=orders)
  eps = float(jaxrdp.compute_epsilon(orders, rdp, delta)[0])
  assert target * (1 - 1e-9) <= eps <= target
  s = example.calibrate(lambda x: example.epsilon_gaussian(x, steps, delta), target, 1e-3, 1e6)
  eps_g = float(jaxrdp.compute_epsilon(orders, steps * jaxrdp.rdp_gaussian(s, orders), delta)[0])
  assert target * (1 - 1e-9) <= eps_g <= target


def test_example_refuses_an_epsilon_below_the_rgm_floor(example, tmp_path):
  with pytest.raises(SystemExit, match="floor"):
    example.main(["--n", "300", "--dim", "3", "--steps", "6", "--runs", "1",
                  "--epsilon", "0.01", "--out", str(tmp_path / "x.png")])
