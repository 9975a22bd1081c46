#!/usr/bin/env python
"""How loose is Theorem 11 of Mironov–Talwar–Zhang? bound / exact RDP over the region where it applies.

The bound is ``jaxrdp.mechanisms.closed_form.rdp_sampled_gaussian_closed_form`` (2q²α/σ², +inf outside the
theorem's conditions); the exact value is ``jaxrdp.rdp_sampled_gaussian`` (certified quadrature,
float64). Prints min / median / max of the ratio over the finite points of a log-spaced grid and
where the extremes occur.

Run:  PYTHONPATH=. python tools/closed_form_tightness.py [--points-per-axis N]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--points-per-axis", type=int, default=25,
                      help="grid points per parameter axis (orders get 3x as many, plus integers)")
  args = parser.parse_args(argv)
  jax.config.update("jax_enable_x64", True)
  import jaxrdp
  from jaxrdp.mechanisms.closed_form import rdp_sampled_gaussian_closed_form

  n = args.points_per_axis
  q = np.geomspace(1e-6, np.nextafter(0.2, 0), n)
  sigma = np.geomspace(4.0, 400.0, n)
  alpha = np.unique(np.concatenate([np.geomspace(1.0001, 2e4, 3 * n), np.arange(2.0, 65.0)]))
  qq, ss, aa = np.meshgrid(q, sigma, alpha, indexing="ij")
  bound = np.asarray(rdp_sampled_gaussian_closed_form(qq, ss, aa))
  valid = np.isfinite(bound)
  exact = np.asarray(jaxrdp.rdp_sampled_gaussian(qq[valid], ss[valid], aa[valid]))
  ratio = bound[valid] / exact
  print(f"grid: q in [{q[0]:.0e}, {q[-1]:.6f}] ({n}), sigma in [4, 400] ({n}), "
        f"orders in [1.0001, 2e4] ({alpha.size}); the theorem applies at {valid.sum()} of {valid.size} points")
  assert np.all(ratio >= 1), "bound below the exact RDP"
  where = lambda i: f"q={qq[valid][i]:.4g}, sigma={ss[valid][i]:.4g}, alpha={aa[valid][i]:.6g}"
  i_min, i_max = int(np.argmin(ratio)), int(np.argmax(ratio))
  print(f"bound / exact:  min {ratio[i_min]:.4f} at {where(i_min)}")
  print(f"                median {np.median(ratio):.4f}")
  print(f"                max {ratio[i_max]:.6f} at {where(i_max)}")
  for p in (1, 10, 50, 90, 99):
    print(f"  {p:>2}th percentile: {np.percentile(ratio, p):.4f}")


if __name__ == "__main__":
  main()
