"""``jaxrdp plot``: ε after t steps by RDP or the PLD, as a CSV table and/or an image; its step
points (``--steps``, ``--steps-range``, ``--points``, ``--log``). Every value equals the
library's at the same step count: ``dpsgd_epsilon`` (RDP) and ``pld_epsilon`` (PLD).

The PLD cases use the schedule of tests/test_cli_units.py's PLD runs (q = 0.01, σ = 1.1,
100 steps, δ = 1e-5), so that the compiled programs are shared.
"""

import csv
import sys

import numpy as np
import pytest

import jaxrdp
from jaxrdp.cli import main as cli
from jaxrdp.cli import plot
from cli_errors import exit_2

Q, SIGMA, DELTA = 0.01, 1.1, 1e-5
REST = ["--sampling-rate", str(Q), "--noise-multiplier", str(SIGMA), "--delta", str(DELTA)]
PNG = b"\x89PNG\r\n\x1a\n"


def _plot(capsys, argv):
  assert cli.main(["plot"] + REST + argv) == 0
  return capsys.readouterr().out.splitlines()


def _rows(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _curve(rows):
  return (np.array([int(r["steps"]) for r in rows]),
          np.array([float(r["epsilon"]) for r in rows]))


# --- the CSV and its values ---------------------------------------------------------------------

def test_rdp_csv_parses_and_equals_dpsgd_epsilon(tmp_path, capsys):
  path = tmp_path / "eps.csv"
  lines = _plot(capsys, ["--steps", "1e4", "--points", "5", "--csv", str(path)])
  rows = _rows(path)
  assert list(rows[0]) == list(plot.CSV_COLUMNS)
  for row in rows:   # the inputs on every row
    assert (float(row["sampling_rate"]), float(row["noise_multiplier"]), float(row["delta"]),
            row["accountant"]) == (Q, SIGMA, DELTA, "rdp")
  steps, eps = _curve(rows)
  assert steps.tolist() == [2000, 4000, 6000, 8000, 10000]
  want = [float(jaxrdp.dpsgd_epsilon(Q, SIGMA, float(t), DELTA)) for t in steps]
  np.testing.assert_allclose(eps, want, rtol=1e-12)
  orders = np.asarray(jaxrdp.DEFAULT_ORDERS, np.float64)
  _, order = jaxrdp.compute_epsilon(orders, jaxrdp.compute_rdp(Q, SIGMA, 1e4, orders), DELTA)
  assert lines == [f"ε = {want[-1]:.4g} after 10000 steps (δ = 1e-05, RDP, "
                   f"order ≈ {float(order):g})",
                   f"wrote {path} (5 rows: steps 2000 to 10000)"]


def test_pld_values_equal_pld_epsilon_at_the_same_steps(tmp_path, capsys):
  path = tmp_path / "pld.csv"
  lines = _plot(capsys, ["--accountant", "pld", "--steps", "100", "--points", "4",
                         "--csv", str(path)])
  rows = _rows(path)
  steps, eps = _curve(rows)
  assert steps.tolist() == [25, 50, 75, 100] and {r["accountant"] for r in rows} == {"pld"}
  # One grid for every point, sized for the last: the values are pld_epsilon's on that grid ...
  grid = jaxrdp.pld_grid(Q, SIGMA, 100.0, delta=DELTA)
  on_grid = [float(jaxrdp.pld_epsilon(Q, SIGMA, float(t), DELTA, pld_grid=grid)) for t in steps]
  np.testing.assert_allclose(eps, on_grid, rtol=1e-9)
  # ... at the last point the grid pld_epsilon sizes itself, and within the discretisation's
  # rounding of it before (a grid wider than needed moves no mass).
  own = [float(jaxrdp.dpsgd_epsilon(Q, SIGMA, float(t), DELTA, accountant="pld")) for t in steps]
  assert eps[-1] == pytest.approx(own[-1], rel=1e-9)
  np.testing.assert_allclose(eps, own, rtol=1e-6)
  assert (np.diff(eps) > 0).all()
  assert lines[0] == f"ε = {own[-1]:.4g} after 100 steps (δ = 1e-05, PLD)"


def test_pld_grid_for_small_delta_takes_the_librarys_tail_mass():
  # pld_epsilon sizes its grid with tail mass min(1e-15, δ/1000): the plot's grid is the same.
  assert plot.pld_grid_for(Q, SIGMA, 100, 1e-5).tail_mass == 1e-15
  assert plot.pld_grid_for(Q, SIGMA, 100, 1e-14).tail_mass == pytest.approx(1e-17)


def test_csv_needs_no_matplotlib(tmp_path, capsys, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
  path = tmp_path / "eps.csv"
  _plot(capsys, ["--steps", "100", "--points", "2", "--csv", str(path)])
  assert _curve(_rows(path))[0].tolist() == [50, 100]


# --- the step points ----------------------------------------------------------------------------

@pytest.mark.parametrize("start, stop, points, log_x, want", [
    (None, 10_000, 5, False, [2000, 4000, 6000, 8000, 10000]),   # from T/points
    (None, 10_000, 5, True, [1, 10, 100, 1000, 10000]),          # from 1, geometric
    (100, 1000, 4, False, [100, 400, 700, 1000]),
    (10, 1000, 3, True, [10, 100, 1000]),
    (0, 3, 4, False, [0, 1, 2, 3]),
    (None, 3, 40, False, [1, 2, 3]),                             # rounded, duplicates dropped
])
def test_step_points_are_evenly_spaced_on_the_axis_scale(start, stop, points, log_x, want):
  assert plot.step_points(start, stop, points, log_x).tolist() == want


def test_steps_range_and_log_x_choose_the_points(tmp_path, capsys):
  path = tmp_path / "eps.csv"
  lines = _plot(capsys, ["--steps-range", "10:1e3", "--points", "3", "--log", "x",
                         "--csv", str(path)])
  steps, eps = _curve(_rows(path))
  assert steps.tolist() == [10, 100, 1000]
  assert eps[-1] == pytest.approx(float(jaxrdp.dpsgd_epsilon(Q, SIGMA, 1000.0, DELTA)), rel=1e-12)
  assert "after 1000 steps" in lines[0]


@pytest.mark.parametrize("text, value", [("100:1e4", (100, 10_000)), ("0:5", (0, 5)),
                                         ("1e2:2e2", (100, 200))])
def test_steps_range_reads_whole_numbers(text, value):
  from jaxrdp.cli import parsing
  assert parsing.steps_range(text) == value


# --- the image ----------------------------------------------------------------------------------

@pytest.mark.parametrize("accountant, log", [("rdp", "y"), ("pld", "both")])
def test_image_and_csv_together(tmp_path, capsys, accountant, log):
  pytest.importorskip("matplotlib")
  image, table = tmp_path / "eps.png", tmp_path / "eps.csv"
  lines = _plot(capsys, ["--accountant", accountant, "--log", log, "--steps", "100",
                         "--points", "4", "--out", str(image), "--csv", str(table)])
  assert image.read_bytes()[:8] == PNG and len(_rows(table)) == 4
  first = 1 if log == "both" else 25   # a log steps axis starts at 1
  assert lines[1:] == [f"wrote {table} (4 rows: steps {first} to 100)", f"wrote {image}"]


# --- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, flags", [
    (["--steps", "100"], ["--out", "--csv"]),
    (["--steps", "100", "--steps-range", "1:100", "--csv", "x.csv"], ["--steps", "--steps-range"]),
    (["--csv", "x.csv"], ["--steps", "--steps-range"]),
    (["--steps-range", "5:5", "--csv", "x.csv"], ["--steps-range", "START < STOP"]),
    (["--steps-range", "100", "--csv", "x.csv"], ["--steps-range", "START:STOP"]),
    (["--steps-range", "1:2:3", "--csv", "x.csv"], ["--steps-range"]),
    (["--steps-range", "1.5:10", "--csv", "x.csv"], ["--steps-range"]),
    (["--steps-range", "-1:10", "--csv", "x.csv"], ["--steps-range"]),
    (["--steps-range", "0:100", "--log", "x", "--csv", "x.csv"], ["--steps-range", "--log x"]),
    (["--steps", "100", "--log", "z", "--csv", "x.csv"], ["--log"]),
    (["--steps", "100", "--points", "1", "--csv", "x.csv"], ["--points", "at least 2"]),
    (["--steps", "100", "--points", "2.5", "--csv", "x.csv"], ["--points"]),
    (["--steps", "100", "--accountant", "tight", "--csv", "x.csv"], ["--accountant"]),
    (["--steps", "100", "--csv", "/nonexistent-dir/x.csv"], ["--csv"]),
])
def test_bad_plot_input_exits_2_naming_the_flags(capsys, argv, flags):
  err = exit_2(capsys, ["plot"] + REST + argv)
  assert all(flag in err for flag in flags), err


def test_an_image_without_matplotlib_exits_2(tmp_path, capsys, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
  err = exit_2(capsys, ["plot"] + REST + ["--steps", "100", "--out", str(tmp_path / "x.png")])
  assert "pip install matplotlib" in err and "--csv" in err
  assert not (tmp_path / "x.png").exists()


def test_a_schedule_too_wide_for_the_pld_exits_2_before_writing(tmp_path, capsys):
  # q = 1, σ = 0.2 over 10⁵ steps: the PLD's grid would exceed its MAX_BINS (as for `epsilon`).
  path = tmp_path / "x.csv"
  err = exit_2(capsys, ["plot", "--sampling-rate", "1", "--noise-multiplier", "0.2", "--delta",
                        "1e-5", "--steps", "1e5", "--accountant", "pld", "--csv", str(path)])
  assert "grid points" in err and not path.exists()
