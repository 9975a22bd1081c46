r"""ε after k Gaussian-mechanism steps under advanced composition, zCDP and RDP.

Run:  python examples/compare_variants.py [--steps 10000] [--sigma 200] [--delta 1e-5]
                                          [--out compare_variants.png]

The comparison of Near & Abuah, *Programming Differential Privacy*, chapter "Variants of
Differential Privacy", section "Composition under Variants of Differential Privacy" (its figure
"Gaussian+Adv. Comp. / Gaussian+zCDP / Gaussian+RDP", σ = 200, δ = 1e-5): the same mechanism,
k applications of the Gaussian mechanism with noise multiplier σ (noise standard deviation over
L2 sensitivity), accounted three ways and converted to (ε, δ)-DP at the same total δ.

(a) Advanced composition (Dwork, Rothblum, Vadhan 2010, Thm. III.3; Dwork–Roth 2014, Thm.
    3.20): k mechanisms, each (ε0, δ0)-DP, compose to (ε', kδ0 + δ')-DP with
    ε' = √(2k log(1/δ')) ε0 + k ε0 (e^{ε0} − 1). Here each step's (ε0, δ0) is the *exact*
    privacy profile of the Gaussian mechanism (Balle & Wang 2018, Thm. 8:
    δ0 = Φ(1/(2σ) − ε0σ) − e^{ε0} Φ(−1/(2σ) − ε0σ), inverted for ε0 by bisection, rounded up),
    the split δ = kδ0 + δ' is optimised over a grid of δ'/δ, and the result is also compared
    with basic composition (kε0, kδ0) at δ0 = δ/k; the smaller is reported. This is the best
    that these two theorems give for this mechanism, more favourable to advanced composition
    than the book, which uses the classical calibration ε0 = √(2 log(1.25/δ0))/σ and
    ε' ≈ 2ε0√(2k log(1/δ)).
(b) zCDP (Bun & Steinke 2016): the Gaussian mechanism is ρ = 1/(2σ²)-zCDP, ρ adds up over the
    k steps, and ρ-zCDP gives (ε, δ)-DP with ε = ρ + 2√(ρ log(1/δ)) (BS16 Prop. 1.3, the
    book's formula, ``method="simple"``) or the tight conversion of Canonne, Kamath, Steinke
    2020 (Cor. 13, ``method="tight"``) — :func:`jaxrdp.zcdp_to_epsilon`.
(c) RDP (Mironov 2017): ε(α) = kα/(2σ²) on jaxrdp's default order grid
    (:func:`jaxrdp.rdp_gaussian`), converted by :func:`jaxrdp.compute_epsilon` with the
    improved conversion (Balle et al. 2020 Thm. 21) and, for comparison, Mironov's Prop. 3
    (``method="classic"``, what the book plots at one fixed order).

For the Gaussian mechanism the RDP curve *is* the zCDP line ρα, so (b) and (c) differ only in
the conversion: the tight zCDP conversion is the infimum over all real α of the improved RDP
conversion (hence ≤ the RDP value on a finite grid), and BS16's formula is the infimum of the
classic one. Advanced composition is the loosest for many steps.

Takes about 6 s on a laptop CPU with the defaults, most of it compilation.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import log_ndtr

import jaxrdp

_BISECTION_STEPS = 200
_SPLITS = np.concatenate([np.geomspace(1e-4, 0.5, 40), 1 - np.geomspace(1e-4, 0.5, 40)[::-1][1:]])


def gaussian_log_delta(eps, sigma):
  """log δ(ε) of one Gaussian mechanism (Balle & Wang 2018, Thm. 8), sensitivity 1."""
  a = 0.5 / sigma - eps * sigma
  b = -0.5 / sigma - eps * sigma
  log_pa, log_pb = log_ndtr(a), log_ndtr(b)
  return log_pa + jnp.log(-jnp.expm1(eps + log_pb - log_pa))


def gaussian_epsilon(delta, sigma):
  """Smallest ε0 (rounded up: the upper end of a bisection bracket) with δ(ε0) ≤ δ.

  The target is lowered by 1e-12 relative, more than the rounding of log δ(ε) in float64, so
  that the ε0 returned satisfies δ(ε0) ≤ δ exactly, not just as computed.
  """
  log_target = jnp.log(delta) * (1 + 1e-12)
  hi = 0.5 / sigma**2 + jnp.sqrt(2 * -log_target) / sigma  # Φ(1/(2σ) − εσ) ≤ δ there
  lo = jnp.zeros_like(hi)

  def body(_, bracket):
    lo, hi = bracket
    mid = 0.5 * (lo + hi)
    ok = gaussian_log_delta(mid, sigma) <= log_target
    return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

  _, hi = jax.lax.fori_loop(0, _BISECTION_STEPS, body, (lo, hi))
  return hi


def advanced_composition_epsilon(steps, sigma, delta):
  """min over δ splits of the DRV advanced composition bound, and basic composition (see (a))."""
  k = jnp.asarray(steps, dtype=jnp.result_type(float))[:, None]
  theta = jnp.asarray(_SPLITS, k.dtype)[None, :]
  delta_prime = theta * delta
  eps0 = gaussian_epsilon((1 - theta) * delta / k, sigma)
  advanced = jnp.sqrt(2 * k * jnp.log(1 / delta_prime)) * eps0 + k * eps0 * jnp.expm1(eps0)
  basic = k[:, 0] * gaussian_epsilon(delta / k[:, 0], sigma)
  return jnp.minimum(jnp.min(advanced, axis=1), basic)


def compare(steps, sigma, delta):
  """ε after each number of steps, under each accounting. Returns a dict of 1-D arrays."""
  steps = np.asarray(steps, dtype=np.float64)
  rho = steps / (2 * sigma**2)
  orders = jaxrdp.DEFAULT_ORDERS
  rdp = steps[:, None] * jaxrdp.rdp_gaussian(sigma, orders)[None, :]
  rdp_eps, rdp_order = jaxrdp.compute_epsilon(orders, rdp, delta)
  rdp_classic, _ = jaxrdp.compute_epsilon(orders, rdp, delta, method="classic")
  return {
      "steps": steps,
      "advanced composition": np.asarray(advanced_composition_epsilon(steps, sigma, delta)),
      "zCDP (Bun-Steinke)": np.asarray(jaxrdp.zcdp_to_epsilon(rho, delta, method="simple")),
      "zCDP (tight)": np.asarray(jaxrdp.zcdp_to_epsilon(rho, delta, method="tight")),
      "RDP": np.asarray(rdp_eps),
      "RDP (classic conversion)": np.asarray(rdp_classic),
      "RDP order": np.asarray(rdp_order),
  }


def _table(result, rows):
  names = [n for n in result if n not in ("steps", "RDP order")]
  lines = [f"{'k':>7} " + " ".join(f"{n:>26}" for n in names) + f" {'RDP order':>10}"]
  for i in rows:
    lines.append(f"{int(result['steps'][i]):>7} " + " ".join(f"{result[n][i]:>26.5g}" for n in names)
                 + f" {result['RDP order'][i]:>10g}")
  return "\n".join(lines)


def plot(result, sigma, delta, out):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4.5))
  styles = {"advanced composition": "-", "zCDP (Bun-Steinke)": "-", "zCDP (tight)": "--", "RDP": "-",
            "RDP (classic conversion)": ":"}
  for name, style in styles.items():
    ax.plot(result["steps"], result[name], style, label=name)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("number of Gaussian-mechanism steps k")
  ax.set_ylabel(f"ε at δ = {delta:g}")
  ax.set_title(f"Gaussian mechanism, σ = {sigma:g}: ε after k steps")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(out, dpi=120)
  plt.close(fig)


def main(argv=None):
  parser = argparse.ArgumentParser(description="ε after k Gaussian steps: advanced composition, zCDP, RDP.")
  parser.add_argument("--steps", type=int, default=10_000, help="largest number of steps k (default 10000)")
  parser.add_argument("--sigma", type=float, default=200.0, help="noise multiplier σ (default 200, as the book)")
  parser.add_argument("--delta", type=float, default=1e-5, help="total δ (default 1e-5)")
  parser.add_argument("--out", default="compare_variants.png", help="output PNG (default compare_variants.png)")
  args = parser.parse_args(argv)
  if args.steps < 1 or not args.sigma > 0 or not 0 < args.delta < 1:
    parser.error("need steps >= 1, sigma > 0 and 0 < delta < 1")
  jax.config.update("jax_enable_x64", True)  # a script: float64 for the printed table

  decades = [10**p for p in range(int(np.log10(args.steps)) + 1)] + [args.steps]
  steps = np.unique(np.concatenate([np.round(np.geomspace(1, args.steps, 60)), decades]).astype(np.int64))
  print(f"epsilon at {len(steps)} step counts from 1 to {args.steps}: advanced composition, "
        "zCDP, RDP ...", flush=True)
  result = compare(steps, args.sigma, args.delta)
  rows = [int(np.searchsorted(steps, d)) for d in sorted(set(decades))]
  print(f"sigma = {args.sigma:g}, delta = {args.delta:g}")
  print(_table(result, rows))
  plot(result, args.sigma, args.delta, args.out)
  print(f"wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
