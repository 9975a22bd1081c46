"""The distributions: the sdist and the wheel build, hold what they should and pass ``twine check``.

One build per test session (module fixture), of a copy of the repository's files (``git
ls-files``, untracked files not ignored included) in a temporary directory, so that building
writes no ``build/`` or ``*.egg-info`` into the working tree. ``python -m build --no-isolation``
builds the sdist, then the wheel from the sdist (so the sdist is checked to be complete), with the
build backend of this environment: no network. A stand-in ``jax`` that raises on import is put
first on the path, so the build is checked to need no jax (setuptools reads the version,
``jaxrdp.__version__``, from the source without importing it). The build is timed and the
duration printed (``pytest -s``). Needs build, setuptools, wheel and twine: in the ``test`` extra.
"""

import email
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest

import jaxrdp

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The classifiers a registry page needs to show: maturity, licence, Python versions, typing.
CLASSIFIERS = {
    "Development Status :: 5 - Production/Stable",
    "License :: OSI Approved :: Apache Software License",
    "Programming Language :: Python :: 3",
    "Programming Language :: Python :: 3.10",
    "Programming Language :: Python :: 3.11",
    "Programming Language :: Python :: 3.12",
    "Typing :: Typed",
}


def _source_files():
  """The repository's files, relative to ROOT: tracked ones, and untracked ones git does not
  ignore."""
  out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
  names = sorted({name for name in out.decode().split("\0") if name})
  return [name for name in names if (ROOT / name).is_file()]   # not tracked files deleted here


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
  """Builds once; returns (sdist path, wheel path, seconds)."""
  tmp = tmp_path_factory.mktemp("packaging")
  src, out, nojax = tmp / "src", tmp / "dist", tmp / "nojax"
  for name in _source_files():
    (src / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / name, src / name)
  (nojax / "jax").mkdir(parents=True)
  (nojax / "jax" / "__init__.py").write_text(
      'raise ImportError("building jaxrdp must not import jax")\n')
  path = os.pathsep.join(filter(None, (str(nojax), os.environ.get("PYTHONPATH"))))
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                         str(src)], cwd=tmp, env=dict(os.environ, PYTHONPATH=path),
                        capture_output=True, text=True, timeout=300)
  seconds = time.perf_counter() - start
  print(f"\npython -m build --no-isolation (sdist, then the wheel from it): {seconds:.1f} s")
  assert proc.returncode == 0, f"build failed:\n{proc.stdout}\n{proc.stderr}"
  sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
  assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
  return sdists[0], wheels[0], seconds


def _wheel_file(wheel, name):
  with zipfile.ZipFile(wheel) as zf:
    return zf.read(f"jaxrdp-{jaxrdp.__version__}.dist-info/{name}").decode()


def test_names_carry_the_version(dists):
  sdist, wheel, _ = dists
  assert sdist.name == f"jaxrdp-{jaxrdp.__version__}.tar.gz"
  assert wheel.name == f"jaxrdp-{jaxrdp.__version__}-py3-none-any.whl"


def test_wheel_metadata(dists):
  _, wheel, _ = dists
  meta = email.message_from_string(_wheel_file(wheel, "METADATA"))
  assert meta["Name"] == "jaxrdp"
  assert meta["Version"] == jaxrdp.__version__ == "1.0.0"
  assert meta["Requires-Python"] == ">=3.10"
  assert CLASSIFIERS <= set(meta.get_all("Classifier")), meta.get_all("Classifier")
  assert "differential privacy" in meta["Keywords"]
  urls = {url.split(",")[0].strip() for url in meta.get_all("Project-URL")}
  assert {"Homepage", "Repository", "Documentation", "Changelog"} <= urls
  assert {"examples", "test"} <= set(meta.get_all("Provides-Extra"))
  assert any(req.startswith("jax>=") for req in meta.get_all("Requires-Dist"))
  assert meta["Description-Content-Type"] == "text/markdown"
  assert meta.get_payload().lstrip().startswith("# jaxrdp")   # the README is the long description


def test_wheel_holds_the_package_and_nothing_else(dists):
  _, wheel, _ = dists
  with zipfile.ZipFile(wheel) as zf:
    names = set(zf.namelist())
  tops = {name.split("/")[0] for name in names}
  # No tests/, docs/, benchmarks/, examples/ or tools/: the package and its metadata only.
  assert tops == {"jaxrdp", f"jaxrdp-{jaxrdp.__version__}.dist-info"}, tops
  assert {"jaxrdp/__init__.py", "jaxrdp/py.typed", "jaxrdp/cli/main.py"} <= names
  # Every module of the package is shipped (a subpackage left out of packages.find would not be).
  modules = {name for name in _source_files()
             if name.startswith("jaxrdp/") and name.endswith(".py")}
  assert modules <= names, sorted(modules - names)


def test_wheel_ships_the_license(dists):
  _, wheel, _ = dists
  with zipfile.ZipFile(wheel) as zf:
    # setuptools' default license-files patterns pick up LICENSE: dist-info/LICENSE, or
    # dist-info/licenses/LICENSE with newer setuptools (PEP 639).
    licenses = [n for n in zf.namelist() if ".dist-info/" in n and n.endswith("LICENSE")]
    assert licenses, "no LICENSE in the wheel's dist-info"
    assert "Apache License" in zf.read(licenses[0]).decode()


def test_wheel_installs_the_command_line(dists):
  _, wheel, _ = dists
  entry_points = _wheel_file(wheel, "entry_points.txt")
  assert "[console_scripts]" in entry_points
  assert "jaxrdp = jaxrdp.cli.main:main" in entry_points


def test_sdist_holds_the_sources(dists):
  sdist, _, _ = dists
  prefix = f"jaxrdp-{jaxrdp.__version__}"
  with tarfile.open(sdist) as tf:
    names = set(tf.getnames())
    pkg_info = email.message_from_bytes(tf.extractfile(f"{prefix}/PKG-INFO").read())
  for name in ("pyproject.toml", "README.md", "LICENSE", "PKG-INFO", "jaxrdp/__init__.py",
               "jaxrdp/py.typed", "jaxrdp/cli/main.py"):
    assert f"{prefix}/{name}" in names, name
  assert pkg_info["Version"] == jaxrdp.__version__


def test_twine_check(dists):
  sdist, wheel, _ = dists
  proc = subprocess.run(
      [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
      capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, f"twine check failed:\n{proc.stdout}\n{proc.stderr}"
