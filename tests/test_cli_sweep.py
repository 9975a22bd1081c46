"""``jaxrdp sweep``: the table agrees with jaxrdp.sweep, the heatmap is written, bad flags exit 2.

The grid has the sizes of tests/test_sweep.py (4 x 3 x 3 x 2), so that the compiled kernel is
shared when both files run in one session.
"""

import csv
import sys

import numpy as np
import pytest

from jaxrdp.cli import main as cli
from jaxrdp.accounting.sweep import sweep
from cli_errors import exit_2

GRID = ["--sampling-rates", "1e-3:1e-1:4:log", "--noise-multipliers", "0.8,1.5,4",
        "--steps", "10,1000,100000", "--deltas", "1e-5,1e-9"]
AXES = (np.geomspace(1e-3, 1e-1, 4), np.array([0.8, 1.5, 4.0]), np.array([10.0, 1000.0, 1e5]),
        np.array([1e-5, 1e-9]))
COLUMNS = ["sampling_rate", "noise_multiplier", "steps", "delta", "epsilon"]


def test_csv_round_trip_equals_jaxrdp_sweep(tmp_path, capsys):
  out = tmp_path / "results.csv"
  assert cli.main(["sweep"] + GRID + ["--out", str(out)]) == 0
  headline, wrote = capsys.readouterr().out.splitlines()
  assert headline.startswith("ε from ")
  assert headline.endswith(" over 72 grid points (RDP, grid orders)")
  assert wrote.startswith(f"wrote {out} (72 rows")
  with open(out, newline="") as f:
    reader = csv.reader(f)
    assert next(reader) == COLUMNS
    rows = np.array([[float(v) for v in row] for row in reader])
  assert rows.shape == (72, 5)
  # Rows in C order of (q, sigma, steps, delta); numbers written to full precision.
  cells = np.stack(np.meshgrid(*AXES, indexing="ij"), axis=-1).reshape(-1, 4)
  np.testing.assert_array_equal(rows[:, :4], cells)
  np.testing.assert_array_equal(rows[:, 4], np.asarray(sweep(*AXES)).ravel())


def test_heatmap_png_is_written(tmp_path, capsys):
  png = tmp_path / "eps.png"
  argv = ["sweep"] + GRID + ["--heatmap", str(png), "--heatmap-steps", "1000",
                             "--heatmap-delta", "1e-9"]
  assert cli.main(argv) == 0
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "epsilon at steps = 1000, delta = 1e-09" in capsys.readouterr().out


def test_grid_value_syntax():
  np.testing.assert_array_equal(cli._grid_values("1e-4:1e-1:4:log"), np.geomspace(1e-4, 1e-1, 4))
  np.testing.assert_array_equal(cli._grid_values("0.5:5:10"), np.linspace(0.5, 5, 10))
  np.testing.assert_array_equal(cli._grid_values("0.1, 0.2,1:2:3:lin"), [0.1, 0.2, 1, 1.5, 2])
  np.testing.assert_array_equal(cli._grid_steps("100:10000:5:log"), [100, 316, 1000, 3162, 10000])
  np.testing.assert_array_equal(cli._grid_steps("1:3:9"), [1, 2, 3])   # rounded, deduplicated
  assert cli._grid_values("1e-5").tolist() == [1e-5]


def test_help_documents_the_range_syntax(capsys):
  with pytest.raises(SystemExit) as exc:
    cli.main(["sweep", "-h"])
  assert exc.value.code == 0
  text = capsys.readouterr().out
  assert "START:STOP:NUM[:log|:lin]" in text and "1e-4:1e-1:100:log" in text
  assert "sampling_rate,noise_multiplier,steps,delta,epsilon" in text


@pytest.mark.parametrize("change, flag", [
    ({"--sampling-rates": "0.1,1.5"}, "--sampling-rates must lie in [0, 1], got 1.5"),
    ({"--sampling-rates": "0.1:0.2"}, "--sampling-rates must be comma-separated numbers"),
    ({"--sampling-rates": "0:0.1:5:log"}, "--sampling-rates log range"),
    ({"--sampling-rates": "0.1:0.2:0"}, "--sampling-rates range"),
    ({"--sampling-rates": "abc"}, "--sampling-rates"),
    ({"--noise-multipliers": "1,-1"}, "--noise-multipliers must be > 0, got -1"),
    ({"--steps": "2.5"}, "--steps must be whole numbers"),
    ({"--steps": "0,10"}, "--steps must be >= 1, got 0"),
    ({"--deltas": "1e-5,1"}, "--deltas must lie in (0, 1), got 1"),
    ({"--deltas": "nan"}, "--deltas"),
    ({"--heatmap-steps": "500"}, "--heatmap-steps must be one of the --steps values"),
    ({"--heatmap-delta": "1e-3"}, "--heatmap-delta must be one of the --deltas values"),
    ({"--chunk-size": "0"}, "--chunk-size must be a positive int"),
    ({"--out": None}, "--out (a .csv or .parquet file) or --heatmap"),
    ({"--out": "/nonexistent-dir/x.csv"}, "--out cannot be written"),
])
def test_bad_flags_exit_2_naming_the_flag(capsys, tmp_path, change, flag):
  args = dict(zip(GRID[::2], GRID[1::2]), **{"--out": str(tmp_path / "x.csv")})
  args.update(change)
  argv = ["sweep"] + [v for k, val in args.items() if val is not None for v in (k, val)]
  assert flag in exit_2(capsys, argv)
  assert not (tmp_path / "x.csv").exists()


def test_parquet_without_pyarrow_exits_2(capsys, tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "pyarrow", None)
  monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
  err = exit_2(capsys, ["sweep"] + GRID + ["--out", str(tmp_path / "r.parquet")])
  assert "--out" in err and "pip install pyarrow" in err


def test_parquet_round_trip(tmp_path, capsys):
  import pyarrow.parquet as pq  # a test extra: the round trip always runs
  out = tmp_path / "r.parquet"
  assert cli.main(["sweep"] + GRID + ["--out", str(out)]) == 0
  table = pq.read_table(out).to_pydict()
  assert list(table) == COLUMNS
  np.testing.assert_array_equal(table["epsilon"], np.asarray(sweep(*AXES)).ravel())


def test_parquet_is_written_as_it_goes_and_resumed(tmp_path, capsys):
  out = tmp_path / "r.parquet"
  assert cli.main(["sweep"] + GRID + ["--out", str(out)]) == 0
  assert (out / "_sweep.json").exists()
  written = {p.name: p.read_bytes() for p in out.iterdir()}
  # Again without --resume: the sweep there is not overwritten; with it, completed.
  err = exit_2(capsys, ["sweep"] + GRID + ["--out", str(out)])
  assert "--out" in err and "resume" in err
  (out / "part-000000.parquet").unlink()
  assert cli.main(["sweep"] + GRID + ["--out", str(out), "--resume"]) == 0
  assert {p.name: p.read_bytes() for p in out.iterdir()} == written


def test_resume_needs_a_parquet_out(capsys, tmp_path):
  err = exit_2(capsys, ["sweep"] + GRID + ["--out", str(tmp_path / "x.csv"), "--resume"])
  assert "--resume" in err and "FILE.parquet" in err


def test_a_streamed_sweep_reports_and_draws_what_the_array_holds(tmp_path, capsys):
  # The summary and the heatmap of --out FILE.parquet are read part by part, not as one array.
  assert cli.main(["sweep"] + GRID + ["--heatmap", str(tmp_path / "a.png")]) == 0
  in_memory = capsys.readouterr().out.splitlines()[0]
  assert cli.main(["sweep"] + GRID + ["--out", str(tmp_path / "r.parquet"), "--heatmap",
                                      str(tmp_path / "b.png"), "--heatmap-steps", "1000"]) == 0
  assert capsys.readouterr().out.splitlines()[0] == in_memory
  from jaxrdp.cli.sweep import _streamed_summary
  shape, span, plane = _streamed_summary(str(tmp_path / "r.parquet"), 1, 1)
  eps = np.asarray(sweep(*AXES))
  assert shape == eps.shape
  assert span == (eps[np.isfinite(eps)].min(), eps[np.isfinite(eps)].max())
  np.testing.assert_array_equal(plane, eps[:, :, 1, 1])
