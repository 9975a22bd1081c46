"""Test configuration.

The tests compute in float64 where they compare with 60-digit references, so x64 is switched
on here, for the test process only (the library itself never touches the flag; a test checks
that importing it leaves the flag alone). float32 tests pass float32 arrays explicitly.
"""

import json
import pathlib

import jax
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)

DATA = pathlib.Path(__file__).parent / "data"


def _load(name):
  with open(DATA / name) as f:
    points = json.load(f)["points"]
  col = lambda key: np.array([float(p[key]) for p in points])
  return {k: col(k) for k in ("q", "sigma", "alpha", "log_a", "dlog_a_dq", "dlog_a_dsigma")}


@pytest.fixture(scope="session")
def log_a_reference():
  """The mpmath reference points (tools/make_references.py), as float64 numpy arrays."""
  return _load("log_a_reference.json")


@pytest.fixture(scope="session")
def log_a_reference_float32():
  """References at float32-exact inputs (tools/make_references.py --float32)."""
  return _load("log_a_reference_float32.json")
