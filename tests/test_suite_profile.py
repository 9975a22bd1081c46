"""tools/suite_profile.py: the recorder's log patterns and the report's sums."""

import json
import logging

import jax
import pytest

from scripts import load_script

profile = load_script("tools/suite_profile.py")


@pytest.fixture
def recorder():
  """The recorder's log handler on JAX's loggers for one test; the loggers as before after."""
  before = {name: (logging.getLogger(name).level, logging.getLogger(name).propagate)
            for name in profile._LOGGERS}
  profile.pytest_configure(None)
  profile._records.clear()
  yield profile._records
  for name, (level, propagate) in before.items():
    logger = logging.getLogger(name)
    for handler in [h for h in logger.handlers if isinstance(h, profile._Handler)]:
      logger.removeHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


def test_the_recorder_reads_jax_s_messages_and_the_report_counts_repeated_programs(recorder,
                                                                                 tmp_path):
  # JAX's own messages, as emitted: one program compiled twice in this process.
  profile._state["test"] = "tests/test_x.py::test_a"
  f = lambda x: x * 2.0 + 1.0
  jax.jit(f)(1.0).block_until_ready()
  jax.jit(lambda x: x * 2.0 + 1.0)(1.0).block_until_ready()   # another function, the same HLO
  kinds = [r[1] for r in profile._records]
  assert kinds.count("compile") == 2 and "lower" in kinds and "trace" in kinds
  keys = [r[3] for r in profile._records if r[1] == "compile"]
  assert all(keys) and keys[0] == keys[1]
  (tmp_path / "gw0.json").write_text(json.dumps(profile._records + [
      ["tests/test_x.py::test_a", "wall", "", "", 10.0]]))
  (tmp_path / "gw1.json").write_text(json.dumps([
      ["tests/test_y.py::test_b", "compile", "jit(g)", keys[0], 2.0],
      ["tests/test_y.py::test_b", "compile", "jit(h)", "other", 3.0],
      ["tests/test_y.py::test_b", "compile", "jit(h)", "other", 4.0],
      ["tests/test_y.py::test_b", "wall", "", "", 20.0]]))
  text = profile.report(tmp_path)
  assert "processes: 2 (gw0, gw1)" in text
  assert "summed wall time 30 s" in text
  assert "compilations: 5; of a program the same process had compiled before: 2 (" in text
  assert "programs compiled in more than one process: 1" in text
  assert text.index("test_y.py") < text.index("test_x.py")   # longest first
  # The same sums as figures (what --save writes for the performance page).
  s = profile.summary(tmp_path)
  assert s["processes"] == ["gw0", "gw1"] and s["tests"] == 2 and s["wall_s"] == 30.0
  assert s["compilations"] == 5 and s["repeated_compilations"] == 2
  assert s["programs_in_several_processes"] == 1
  assert [name for name, _ in s["files"]] == ["test_y.py", "test_x.py"]
  assert s["files"][0][1]["compile"] == 9.0
  assert profile.summary(tmp_path / "empty") is None
