"""sweep(..., output=DIR): the result written as Parquet parts as it goes, and resumed."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import jaxrdp
from jaxrdp.accounting import sweep_output

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# 105 pairs in three chunks (of two blocks of 24 pairs, the least a call takes, at the
# default 170 orders).
AXES = (np.geomspace(1e-3, 0.1, 7), np.linspace(0.5, 3.0, 15), np.array([10.0, 1000.0]),
        np.array([1e-5, 1e-7]))
CHUNK = 24


def _files(path):
  return {p.name: p.read_bytes() for p in sorted(pathlib.Path(path).iterdir())}


def test_the_parts_hold_the_array_cell_by_cell(tmp_path):
  expected = np.asarray(jaxrdp.sweep(*AXES, chunk_size=CHUNK))
  out = tmp_path / "grid.parquet"
  assert jaxrdp.sweep(*AXES, chunk_size=CHUNK, output=str(out)) == out
  assert sorted(p.name for p in out.iterdir()) == [
      "_sweep.json", "part-000000.parquet", "part-000001.parquet", "part-000002.parquet"]
  np.testing.assert_array_equal(jaxrdp.read_sweep(out), expected)   # bitwise
  # The directory reads as one table, a row per cell in the array's order.
  table = pq.read_table(out)
  columns = np.meshgrid(*AXES, indexing="ij")
  for name, column in zip(("sampling_rate", "noise_multiplier", "steps", "delta"), columns):
    np.testing.assert_array_equal(table[name].to_numpy(), column.ravel())
  np.testing.assert_array_equal(table["epsilon"].to_numpy(), expected.ravel())


_KILLED_WHILE_WRITING = textwrap.dedent("""
    import os, signal, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    import jaxrdp
    from jaxrdp.accounting import sweep_output
    write = sweep_output.write_part

    def write_then_die(path, index, *args):
      if index == 1:   # a part half written: its temporary file, then kill -9
        (sweep_output._part(path, index).parent / f".part-{index:06d}.parquet.{os.getpid()}.tmp"
         ).write_bytes(b"PAR1 half")
        os.kill(os.getpid(), signal.SIGKILL)
      write(path, index, *args)

    sweep_output.write_part = write_then_die
    axes = [np.asarray(eval(a)) for a in sys.argv[2:6]]
    jaxrdp.sweep(*axes, chunk_size=%d, output=sys.argv[1])
    """ % CHUNK)


def test_parallel_part_writers_write_the_same_files_and_raise_their_errors(tmp_path):
  # PartWriter with several threads (one per four cores on a large host): the same bytes as
  # one thread, whatever order the parts finish in; a failed part is raised by close().
  rng = np.random.default_rng(3)
  n_pairs, n_combos = AXES[0].size * AXES[1].size, AXES[2].size * AXES[3].size
  eps = rng.uniform(0.0, 10.0, (n_pairs, n_combos))
  chunks = np.array_split(np.arange(n_pairs), 7)
  for workers in (1, 3):
    out = tmp_path / f"w{workers}"
    out.mkdir()
    writer = sweep_output.PartWriter(out, AXES, workers=workers)
    for i, pairs in enumerate(chunks):
      writer.submit(i, pairs, eps[pairs].copy())
    writer.close()
  assert _files(tmp_path / "w1") == _files(tmp_path / "w3")
  table = pq.read_table(tmp_path / "w3" / "part-000004.parquet")
  np.testing.assert_array_equal(table["epsilon"].to_numpy(), eps[chunks[4]].ravel())
  bad = sweep_output.PartWriter(tmp_path / "missing", AXES, workers=3)
  bad.submit(0, chunks[0], eps[chunks[0]])
  with pytest.raises(OSError):
    bad.close()


def test_written_counts_the_pairs_of_the_parts_on_disk(tmp_path):
  # How process 0 reads a multi-process sweep's progress: from the parts in the directory.
  out = tmp_path / "grid.parquet"
  jaxrdp.sweep(*AXES, chunk_size=CHUNK, output=str(out))
  spec = sweep_output._spec(out)
  assert sweep_output.written(out, spec) == 105
  (out / "part-000002.parquet").unlink()   # the last chunk: 105 - 2 * 48 = 9 pairs
  assert sweep_output.written(out, spec) == 96
  (out / "part-000000.parquet").unlink()
  assert sweep_output.written(out, spec) == 48


def test_a_sweep_killed_mid_write_resumes_to_the_same_files(tmp_path):
  whole, killed = tmp_path / "whole", tmp_path / "killed"
  jaxrdp.sweep(*AXES, chunk_size=CHUNK, output=whole)
  axes = [repr(a.tolist()) for a in AXES]
  run = subprocess.run([sys.executable, "-c", _KILLED_WHILE_WRITING, str(killed), *axes],
                       capture_output=True, text=True, check=False)
  assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
  names = sorted(p.name for p in killed.iterdir())
  assert "part-000000.parquet" in names and "part-000001.parquet" not in names
  assert any(n.endswith(".tmp") for n in names)   # what the kill left behind
  with pytest.raises(ValueError, match="incomplete"):
    jaxrdp.read_sweep(killed)
  first = (killed / "part-000000.parquet").stat().st_mtime_ns
  jaxrdp.sweep(*AXES, chunk_size=CHUNK, output=killed, resume=True)
  assert (killed / "part-000000.parquet").stat().st_mtime_ns == first   # not recomputed
  assert _files(killed) == _files(whole)


def test_an_existing_or_different_sweep_is_not_overwritten(tmp_path):
  out = tmp_path / "grid"
  jaxrdp.sweep(*AXES, chunk_size=CHUNK, output=out)
  with pytest.raises(ValueError, match="resume=True"):
    jaxrdp.sweep(*AXES, chunk_size=CHUNK, output=out)
  with pytest.raises(ValueError, match="noise_multipliers differ"):
    jaxrdp.sweep(AXES[0], AXES[1][:-1], *AXES[2:], chunk_size=CHUNK, output=out, resume=True)
  with pytest.raises(ValueError, match="pairs_per_chunk"):
    jaxrdp.sweep(*AXES, chunk_size=4 * CHUNK, output=out, resume=True)
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="not empty"):
    jaxrdp.sweep(*AXES, output=other)
  with pytest.raises(ValueError, match="holds no sweep"):
    jaxrdp.read_sweep(other)
  # A complete sweep resumed is left as it is.
  before = _files(out)
  jaxrdp.sweep(*AXES, chunk_size=CHUNK, output=out, resume=True)
  assert _files(out) == before


def test_bad_output_arguments_are_named(tmp_path):
  with pytest.raises(ValueError, match="resume=True applies to output"):
    jaxrdp.sweep(*AXES, resume=True)
  with pytest.raises(TypeError, match="resume must be True or False"):
    jaxrdp.sweep(*AXES, output=tmp_path / "x", resume="yes")
  with pytest.raises(TypeError, match="gather must be True or False"):
    jaxrdp.sweep(*AXES, gather=1)
  with pytest.raises(TypeError, match="output must be a path"):
    jaxrdp.sweep(*AXES, output=3)
  (tmp_path / "file").write_text("")
  with pytest.raises(ValueError, match="not a directory"):
    jaxrdp.sweep(*AXES, output=tmp_path / "file")
