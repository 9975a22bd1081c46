"""Run a Python script in a child process that sees 8 fake CPU devices.

``XLA_FLAGS`` must be set before JAX initialises, hence a child process. JAX's persistent
compilation cache (results are identical) is kept in pytest's cache directory, so that the RDP
kernel's compilation, slow with 8 host devices, is reused by later runs.
"""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_on_fake_devices(script, request, tmp_path_factory, devices=8, timeout=600):
  env = dict(os.environ)
  flag = f"--xla_force_host_platform_device_count={devices}"
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
  env["JAX_PLATFORMS"] = "cpu"
  cache = getattr(request.config, "cache", None)
  cache_dir = cache.mkdir("jaxrdp_jax_cache") if cache is not None else tmp_path_factory.mktemp("jax_cache")
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache_dir))
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
  env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
  env.pop("JAX_ENABLE_X64", None)
  return subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=timeout)
