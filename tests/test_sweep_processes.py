"""One sweep over several processes (jax.distributed, CPU collectives), against one process.

Each process has 2 host devices, as the one-process reference has: a cell's value depends on
the number of local devices only, so the cells agree bitwise, and so do the written parts.
"""

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("pyarrow")

# 400 (q, σ) pairs in five chunks of 96 (two blocks of 24 pairs on each of 2 devices).
_CHILD = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_enable_x64", True)
    processes, index, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if processes > 1:
      jax.distributed.initialize(coordinator_address=f"localhost:{port}",
                                 num_processes=processes, process_id=index)
    import numpy as np
    import jaxrdp
    assert len(jax.local_devices()) == 2
    axes = (np.geomspace(1e-4, 0.1, 16), np.linspace(0.5, 4.0, 25), np.array([100.0, 1e4]),
            np.array([1e-5, 1e-8]))
    np.save(f"{out}/whole-{index}.npy", np.asarray(jaxrdp.sweep(*axes, chunk_size=96)))
    np.save(f"{out}/own-{index}.npy", np.asarray(jaxrdp.sweep(*axes, chunk_size=96, gather=False)))
    jaxrdp.sweep(*axes, chunk_size=96, output=f"{out}/parts")
    # 4 targets x 5 rates x 5 step counts x 2 deltas = 200 cells on 16 orders (integer and
    # fractional; a search costs ~10x less than on the 170 default orders) in two chunks of
    # 128 (two blocks of 32 cells on each of 2 devices; with 4 processes the last two have none).
    calibration = dict(deltas=np.array([1e-5, 1e-8]), sampling_rates=np.geomspace(1e-3, 0.1, 5),
                       steps=np.array([10.0, 100.0, 1e3, 1e4, 1e5]), chunk_size=128,
                       orders=np.array([1.5, 2, 2.5, 3, 4, 5, 6, 8, 11.5, 16, 24, 32, 64, 128,
                                        256, 1024]))
    targets = np.array([0.5, 1.0, 2.0, 8.0])
    np.save(f"{out}/sigma-{index}.npy",
            np.asarray(jaxrdp.sweep_noise_multiplier(targets, **calibration)))
    np.save(f"{out}/sigma-own-{index}.npy",
            np.asarray(jaxrdp.sweep_noise_multiplier(targets, gather=False, **calibration)))
    """)


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _run(processes, out):
  os.makedirs(out)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2")
  port = str(_free_port())
  children = [subprocess.Popen([sys.executable, "-c", _CHILD, str(processes), str(i), port, out],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for i in range(processes)]
  for child in children:
    log, _ = child.communicate(timeout=600)
    assert child.returncode == 0, log[-3000:]


def _files(path):
  return {name: open(os.path.join(path, name), "rb").read() for name in sorted(os.listdir(path))}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("sweep") / "one")
  _run(1, out)
  return out


@pytest.fixture(scope="module", params=[2, 4])
def many_processes(request, tmp_path_factory):
  """(P, the folder of a run over P processes): one run per P, for every test of the file."""
  out = str(tmp_path_factory.mktemp("sweep") / f"many-{request.param}")
  _run(request.param, out)
  return request.param, out


def test_a_sweep_over_processes_equals_one_process_bitwise(one_process, many_processes):
  import jaxrdp
  processes, many = many_processes
  reference = np.load(f"{one_process}/whole-0.npy")
  chunk_of_pair = np.arange(400) // 96   # the chunk of each (q, σ) pair
  for i in range(processes):
    np.testing.assert_array_equal(np.load(f"{many}/whole-{i}.npy"), reference)   # bitwise
    own = np.load(f"{many}/own-{i}.npy").reshape(400, -1)
    mine = chunk_of_pair % processes == i   # chunk c is computed by process c mod P
    assert mine.any()
    np.testing.assert_array_equal(own[mine], reference.reshape(400, -1)[mine])
    assert np.isnan(own[~mine]).all()
  np.testing.assert_array_equal(jaxrdp.read_sweep(f"{many}/parts"), reference)
  assert _files(f"{many}/parts") == _files(f"{one_process}/parts")


def test_sweep_noise_multiplier_over_processes_equals_one_process_bitwise(one_process,
                                                                          many_processes):
  processes, many = many_processes
  reference = np.load(f"{one_process}/sigma-0.npy")
  assert np.isfinite(reference).all()
  chunk_of_cell = np.arange(reference.size) // 128
  for i in range(processes):
    np.testing.assert_array_equal(np.load(f"{many}/sigma-{i}.npy"), reference)   # bitwise
    own = np.load(f"{many}/sigma-own-{i}.npy").ravel()
    mine = chunk_of_cell % processes == i   # empty for processes 2 and 3 of 4: two chunks
    np.testing.assert_array_equal(own[mine], reference.ravel()[mine])
    assert np.isnan(own[~mine]).all()
