"""jaxrdp.sweep spreads the grid over every device, with the values of a single-device run.

XLA_FLAGS must be set before JAX initialises, so the sweep runs in a subprocess with
``--xla_force_host_platform_device_count=8`` (8 CPU devices), in float64 (JAX_ENABLE_X64=1 in
the child's environment). Each device gets two blocks of 24 pairs. This process computes the
same sweep on its one device.

Not bitwise: XLA:CPU compiles a program for 8 devices differently from one for a single
device (measured on the kernel alone: per-step RDP within 2.3e-13 relative, 1018 ulps, at
random (q, σ, α)); the values agree to the kernel's accuracy, hence ``rtol = 1e-12``. Within a
given set of devices the sweep is bitwise reproducible (tests/test_sweep.py).
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxrdp.accounting.sweep import sweep

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The grid of tests/test_sweep.py (its float64 sweep shares this process's compilation).
AXES = {"q": [0.0, 1e-3, 0.05, 1.0], "sigma": [0.0, 0.8, 2.5], "steps": [0.0, 10.0, 5000.0],
        "delta": [1e-5, 1e-10]}

SCRIPT = textwrap.dedent("""
    import importlib, json, sys
    import numpy as np
    import jax
    from jaxrdp.accounting.sweep import sweep

    axes = {k: np.asarray(v, np.float64) for k, v in json.loads(sys.argv[1]).items()}
    eps = np.asarray(sweep(axes["q"], axes["sigma"], axes["steps"], axes["delta"]))
    # Where the per-step RDP lives: the mesh the sweep builds and the shards of its chunk.
    module = importlib.import_module("jaxrdp.accounting.sweep")
    mesh = module._mesh(None)
    grid = module._order_grid(None, np.float64)
    block, chunk = module._layout(12, grid.size, None, module._CALL_BLOCKS, mesh)
    pairs = np.resize(axes["q"], chunk), np.resize(axes["sigma"], chunk)
    split = module.order_split(grid)
    rdp, _ = module._per_step_rdp_fn(mesh, block, split)(*pairs, grid, module.order_tables(grid, split))
    print("RESULT " + json.dumps({
        "device_count": jax.device_count(), "x64": bool(jax.config.jax_enable_x64),
        "mesh_devices": int(mesh.devices.size), "block": block, "chunk": chunk,
        "shards": sorted(str(s.device) for s in rdp.addressable_shards),
        "shard_rows": [int(s.data.shape[0]) for s in rdp.addressable_shards],
        "dtype": str(eps.dtype), "eps": eps.tolist()}))
""")


@pytest.fixture(scope="module")
def child(request, tmp_path_factory):
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["JAX_ENABLE_X64"] = "1"
  env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
  # JAX's persistent compilation cache, for the child only (as in test_sharding.py): later
  # runs of this test reuse the kernel compiled for 8 devices.
  cache = getattr(request.config, "cache", None)
  cache_dir = cache.mkdir("jaxrdp_jax_cache") if cache is not None else tmp_path_factory.mktemp("jax_cache")
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache_dir))
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
  proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(AXES)], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
  return json.loads(line[len("RESULT "):])


def test_child_sees_and_uses_8_devices(child):
  assert child["device_count"] == 8 and child["x64"]
  assert child["mesh_devices"] == 8
  # 12 pairs padded to two blocks per device, each device holding its own share.
  assert child["chunk"] == 16 * child["block"]
  assert len(set(child["shards"])) == 8 and child["shard_rows"] == [2 * child["block"]] * 8


def test_8_devices_agree_with_a_single_device(child):
  f64 = {k: np.asarray(v, np.float64) for k, v in AXES.items()}
  single = np.asarray(sweep(f64["q"], f64["sigma"], f64["steps"], f64["delta"]))
  eight = np.asarray(child["eps"], np.float64)
  assert child["dtype"] == "float64" == str(single.dtype) and eight.shape == single.shape
  np.testing.assert_allclose(eight, single, rtol=1e-12, atol=0)
  assert np.array_equal(np.isinf(eight), np.isinf(single)) and np.all(eight[0] == 0)
