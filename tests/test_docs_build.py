"""The documentation site: `mkdocs build --strict` passes, every public name is documented, and
the math reaches the pages as markup that the vendored KaTeX renders offline.

One build per test session (module fixture); it is timed and the duration printed
(`pytest -s`). Needs the docs packages, which are in the `test` extra.
"""

import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

import jaxrdp

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  """Builds the site once; returns (completed process, site directory, seconds)."""
  out = tmp_path_factory.mktemp("site")
  env = dict(os.environ, NO_MKDOCS_2_WARNING="1")   # mkdocs-material's banner, not a warning
  start = time.perf_counter()
  proc = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  seconds = time.perf_counter() - start
  print(f"\nmkdocs build --strict: {seconds:.1f} s")
  return proc, out, seconds


def _html(site_dir, page):
  return (site_dir / page / "index.html").read_text(encoding="utf-8")


def test_strict_build_passes(site):
  proc, site_dir, _ = site
  assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
  assert (site_dir / "index.html").is_file()


def test_every_public_name_is_documented(site):
  proc, site_dir, _ = site
  assert proc.returncode == 0, proc.stderr
  api = "".join(p.read_text(encoding="utf-8") for p in sorted((site_dir / "api").rglob("*.html")))
  documented = set(re.findall(r'<h\d id="jaxrdp\.(\w+)" class="doc doc-heading"', api))
  missing = sorted(set(jaxrdp.__all__) - documented)
  assert not missing, f"public names without an API entry: {missing}"
  # Signatures and Google-style sections are rendered, not left as text.
  compute_rdp = api[api.index('id="jaxrdp.compute_rdp"'):]
  compute_rdp = compute_rdp[:compute_rdp.index('class="doc doc-heading"', 30)]
  assert "doc-signature" in compute_rdp
  for section in ("Parameters:", "Returns:", "Raises:"):
    assert section in compute_rdp, section


def test_math_is_rendered_markup(site):
  proc, site_dir, _ = site
  assert proc.returncode == 0, proc.stderr
  page = _html(site_dir, "log-a")
  assert '<div class="arithmatex">\\[' in page         # display math
  assert '<span class="arithmatex">\\(' in page        # inline math
  assert r"A_\alpha" in page
  # KaTeX is served from the site itself (the check must work without a network).
  for asset in ("vendor/katex/katex.min.js", "vendor/katex/katex.min.css",
                "javascripts/katex-init.js"):
    assert (site_dir / asset).is_file(), asset
    assert "../" + asset in page, asset
  assert "cdn" not in "".join(re.findall(r'<script src="([^"]*)"', page)).lower()
  # The docstrings' reST math and roles are converted (docs/hooks/griffe_jaxrdp.py).
  for api_page in ("api/mechanisms", "api/accounting", "api/training", "api/audit"):
    html = _html(site_dir, api_page)
    assert 'class="arithmatex"' in html, api_page
    for leftover in (":math:`", ".. math::", ":func:`", ":class:`", ":data:`"):
      assert leftover not in html, (api_page, leftover)
  # No display math was left unprocessed anywhere.
  for html_file in site_dir.rglob("*.html"):
    text = re.sub(r'<(div|span) class="arithmatex">.*?</\1>', "", html_file.read_text("utf-8"),
                  flags=re.S)
    assert "$$" not in text, html_file
