#!/usr/bin/env python
"""mpmath reference values of Theorem 27 of Wang, Balle, Kasiviswanathan (2019) for the Gaussian.

Independent of the package under test (never imports ``jaxrdp``); needs only mpmath.

Quantity
--------
Sampling a subset of fixed size m = q n without replacement, replace-one neighbours, and the
Gaussian mechanism with noise multiplier sigma, whose RDP is eps(a) = a / (2 sigma^2). With
    g(i)      = exp((i - 1) eps(i)) = exp(i (i - 1) / (2 sigma^2)),
    Delta^l   = sum_{i=0}^{l} (-1)^(l-i) C(l, i) g(i)      (l-th forward difference of g at 0),
Theorem 27 of WBK (arXiv:1808.00087, the form dp_accounting implements) bounds, for integer
alpha >= 2,
    A_alpha = 1 + sum_{i=2}^{alpha} q^i C(alpha, i) b_i,
    b_i     = min( 4 sqrt(|Delta^(2 floor(i/2))| |Delta^(2 ceil(i/2))|),  2 g(i) ),
    rdp(alpha) = log(A_alpha) / (alpha - 1).
(For i = 2 the first argument is 4 Delta^2 = 4 (e^{eps(2)} - 1) and the second 2 e^{eps(2)}.)
Fractional alpha (Corollary 10, convexity of (alpha - 1) rdp(alpha) in alpha): with
alpha_f = floor(alpha), alpha_c = ceil(alpha), t = alpha - alpha_f and K(1) = 0,
    rdp(alpha) <= ((1 - t) K(alpha_f) + t K(alpha_c)) / (alpha - 1),   K(a) = log A_a.

Method
------
Delta^l is the alternating sum itself, which cancels catastrophically for large sigma (the
terms reach 2^l e^{l^2/(2 sigma^2)} while Delta^l can be ~1e-200 of that). It is evaluated at a
working precision of 40 digits plus the number of digits the sum cancels (measured from the
largest term and the result, and the evaluation repeated at the higher precision until the
measured loss fits), so every Delta^l carries at least 40 correct digits. Everything after that
is sums of positive terms, evaluated at 60 digits. Values are written with 30 significant
digits.

Output: tests/data/wor_reference.json (one point per line) with
  "points":         q, sigma, alpha (decimal strings of the float64 inputs), rdp;
  "points_float32": the same at inputs rounded to float32 (a smaller grid), for float32 tests.

Run:  python tools/make_wor_references.py   (about six minutes; most of it in the forward
      differences at sigma = 100, whose alternating sums cancel ~600 digits)
"""

from __future__ import annotations

import json
import pathlib
import sys

import mpmath as mp

Q_GRID = [1e-4, 1e-3, 1e-2, 0.1, 0.5, 0.9]
SIGMA_GRID = [0.3, 0.5, 0.8, 1.0, 2.0, 5.0, 10.0, 30.0, 100.0]
ALPHA_INT = list(range(2, 65)) + [96, 128, 200, 256, 512]
ALPHA_FRAC = [2.5, 3.7, 10.3, 63.5, 100.7]
FLOAT32_Q = [1e-3, 1e-2, 0.1, 0.5]
FLOAT32_SIGMA = [0.5, 0.8, 1.0, 2.0, 5.0, 10.0, 30.0]
FLOAT32_ALPHA = [2, 3, 4, 5, 8, 16, 32, 64, 128, 256, 2.5, 10.3]

_GOOD_DIGITS = 40
_SUM_DPS = 60


def _float32(x: float) -> float:
  import struct
  return struct.unpack("f", struct.pack("f", x))[0]


def forward_differences(sigma: float, lmax: int) -> dict[int, mp.mpf]:
  """Delta^l g(0) for even l = 2, ..., lmax (exact binary value of sigma)."""
  out = {}
  for l in range(2, lmax + 1, 2):
    dps = _GOOD_DIGITS + 20
    while True:
      with mp.workdps(dps):
        c = 1 / (2 * mp.mpf(sigma) ** 2)
        terms = [(-1) ** (l - i) * mp.binomial(l, i) * mp.exp(c * i * (i - 1)) for i in range(l + 1)]
        total = mp.fsum(terms)
        lost = mp.log10(max(abs(t) for t in terms) / abs(total)) if total != 0 else mp.inf
      if dps >= _GOOD_DIGITS + 10 + lost:
        break
      if lost == mp.inf:
        dps *= 2
      else:
        dps = int(_GOOD_DIGITS + 20 + lost)
    if total <= 0:  # even-order differences are E[(L - 1)^l] > 0
      raise AssertionError(f"non-positive Delta^{l} at sigma={sigma}")
    out[l] = +total
  return out


def log_a_int(q: float, sigma: float, alpha: int, deltas: dict[int, mp.mpf]) -> mp.mpf:
  """log A_alpha of Theorem 27 (integer alpha >= 2), at _SUM_DPS digits."""
  with mp.workdps(_SUM_DPS):
    q = mp.mpf(q)
    c = 1 / (2 * mp.mpf(sigma) ** 2)
    total = mp.mpf(0)
    for i in range(2, alpha + 1):
      d_lo, d_hi = deltas[2 * (i // 2)], deltas[2 * ((i + 1) // 2)]
      b = min(4 * mp.sqrt(d_lo * d_hi), 2 * mp.exp(c * i * (i - 1)))
      total += q ** i * mp.binomial(alpha, i) * b
    return mp.log1p(total)


def rdp(q: float, sigma: float, alpha: float, deltas: dict[int, mp.mpf]) -> tuple[mp.mpf, mp.mpf]:
  """(rdp, log_a) with Corollary 10 for fractional alpha (log_a is then the interpolated K)."""
  with mp.workdps(_SUM_DPS):
    a = mp.mpf(alpha)
    lo, hi = int(mp.floor(a)), int(mp.ceil(a))
    k_lo = mp.mpf(0) if lo == 1 else log_a_int(q, sigma, lo, deltas)
    k_hi = k_lo if hi == lo else log_a_int(q, sigma, hi, deltas)
    t = a - lo
    k = (1 - t) * k_lo + t * k_hi
    return k / (a - 1), k


def _grid(qs, sigmas, alphas, cast):
  points = []
  for sigma in sigmas:
    sigma = cast(sigma)
    lmax = 2 * ((int(max(alphas)) + 2) // 2)
    deltas = forward_differences(sigma, lmax)
    for q in qs:
      q = cast(q)
      for alpha in alphas:
        alpha = cast(float(alpha))
        value, _ = rdp(q, sigma, alpha, deltas)
        points.append({"q": repr(q), "sigma": repr(sigma), "alpha": repr(alpha), "rdp": mp.nstr(value, 30)})
    print(f"sigma={sigma}: done", file=sys.stderr)
  return points


def _dumps(data):
  """JSON with one point per line."""
  parts = []
  for key, value in data.items():
    if isinstance(value, list):
      rows = ",\n".join(json.dumps(p, separators=(",", ":")) for p in value)
      parts.append(f"{json.dumps(key)}: [\n{rows}\n]")
    else:
      parts.append(f"{json.dumps(key)}: {json.dumps(value)}")
  return "{\n" + ",\n".join(parts) + "\n}\n"


def main():
  out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "wor_reference.json"
  data = {
      "description": ("Theorem 27 of Wang, Balle, Kasiviswanathan (2019, arXiv:1808.00087) for the "
                      "Gaussian mechanism, sampling without replacement, replace-one neighbours; "
                      "Corollary 10 interpolation at fractional orders. Generated by "
                      "tools/make_wor_references.py with mpmath (forward differences with >= 40 "
                      "correct digits, sums at 60 digits)."),
      "points": _grid(Q_GRID, SIGMA_GRID, ALPHA_INT + ALPHA_FRAC, float),
      "points_float32": _grid(FLOAT32_Q, FLOAT32_SIGMA, FLOAT32_ALPHA, _float32),
  }
  out.parent.mkdir(parents=True, exist_ok=True)
  with open(out, "w") as f:
    f.write(_dumps(data))
  print(f"wrote {len(data['points'])} + {len(data['points_float32'])} points to {out}", file=sys.stderr)


if __name__ == "__main__":
  main()
