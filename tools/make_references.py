#!/usr/bin/env python
"""Arbitrary-precision reference values for the Sampled Gaussian Mechanism (SGM).

This script is deliberately independent of the package under test (it never
imports ``jaxrdp``).  It uses mpmath (and numpy for a float64 pre-scan).

Quantity
--------
Mironov, Talwar, Zhang (2019), "Renyi Differential Privacy of the Sampled
Gaussian Mechanism".  For a sampling rate q in [0, 1], a noise multiplier
sigma > 0 and a Renyi order alpha > 1,

    A_alpha = E_{z ~ N(0, sigma^2)} [ (1 - q + q L(z))^alpha ],
    L(z)    = exp((2 z - 1) / (2 sigma^2))      (likelihood ratio N(1,s^2)/N(0,s^2)),

``log_a`` = log A_alpha and RDP(alpha) = log_a / (alpha - 1).

Formulas
--------
(F1) Non-negative integral for A - 1.  Because E[L - 1] = 0,
         A - 1 = int phi_sigma(z) f(x(z)) dz,   x = q (L - 1),
         f(x)  = (1 + x)^alpha - 1 - alpha x  >= 0,
     evaluated as f = g (1 + x) - (alpha - 1) x with
         g(x)  = (1 + x)^(alpha - 1) - 1 = expm1((alpha - 1) log1p(x)),
     which has no catastrophic cancellation for alpha -> 1.  Then
     log A = log1p(A - 1) keeps full relative accuracy when A - 1 ~ 1e-30.
(F2) Derivatives, differentiating under the integral sign (for sigma after
     the substitution z = sigma t, so that dL/dsigma = L (1 - z) / sigma^3):
         dA/dq     = alpha     int phi_sigma(z) g(x) (L - 1)              dz   (integrand >= 0)
         dA/dsigma = alpha q   int phi_sigma(z) g(x) L (1 - z) / sigma^3  dz   (sign changes at z = 1/2, 1)
     The "- 1" inside g is legitimate because E[L - 1] = 0 and
     E[dL/dsigma] = d/dsigma E[L] = 0; it removes the cancellation for small q.
         d log A / dq = (dA/dq) / A,     d log A / dsigma = (dA/dsigma) / A.
(F3) Integer alpha: exact finite sums, every term of one sign:
         A - 1     =  sum_{k=2}^{alpha}   C(alpha,k)   (1-q)^(alpha-k)   q^k expm1(k(k-1)/(2 s^2))
         dA/dq     =  alpha sum_{k=1}^{alpha-1} C(alpha-1,k) (1-q)^(alpha-1-k) q^k
                                             e^{k(k-1)/(2 s^2)} expm1(k / s^2)
         dA/dsigma = -sum_{k=2}^{alpha}   C(alpha,k)   (1-q)^(alpha-k)   q^k e^{k(k-1)/(2 s^2)} k(k-1)/s^3
     (dA/dq is the derivative of the Bernstein polynomial sum_k C(a,k)(1-q)^(a-k) q^k M_k.)
(F4) Fractional alpha: Mironov's signed series (paper, Sec. 3.3), with
     z0 = 1/2 + sigma^2 log((1 - q)/q) and j = alpha - i,
         A = sum_{i>=0} C(alpha,i) [ q^i (1-q)^(alpha-i) e^{(i^2-i)/(2s^2)} erfc((i-z0)/(sqrt2 s))/2
                                   + q^(alpha-i) (1-q)^i e^{(j^2-j)/(2s^2)} erfc((z0-j)/(sqrt2 s))/2 ],
     C(alpha, i) the signed generalised binomial coefficient.  For i > alpha the
     terms alternate in sign and decay only like i^(-alpha-2) (times
     (1-q)^alpha exp(-z0^2/(2 s^2))).  Each bracket is a Hausdorff moment sequence
     in i (it is (1-q)^alpha int_{z<z0} phi r^i + q^alpha int_{z>z0} phi L^alpha r'^i
     with r = qL/(1-q) < 1, r' = 1/r < 1), and so is |C(alpha, i)| for i > alpha,
     so the tail is summed with the Cohen-Villegas-Zagier alternating-series
     acceleration (error ~ 5.83^-n after n terms).
(F5) Closed forms: q = 0: log A = 0 and both derivatives are 0;
     q = 1: log A = alpha (alpha - 1) / (2 s^2), d log A/dsigma = -alpha (alpha - 1)/s^3,
            d log A/dq (one-sided) = alpha (1 - exp(-(alpha - 1)/s^2)).

Methods
-------
* ``closed_form``   q in {0, 1}: (F5).
* ``exact_sum``     integer alpha: (F3) at 80 digits.  Validated against
                    ``quad_gl`` (below) at every integer point, and against
                    dp_accounting's float64 ``_compute_log_a`` at every integer
                    point with 0 < q < 1 (summary in "dp_accounting_check").
* ``quad_gl``       fractional alpha: (F1)/(F2) by adaptive composite
                    Gauss-Legendre quadrature (24- vs 32-point rule per panel,
                    panels bisected until sum |G24 - G32| <= 1e-32 * scale).
                    The integration domain is the set where any of the three
                    log-integrands is within T = 92 nats (1e-40) of its maximum,
                    found by a float64 scan on a grid of spacing sigma/10 over
                    [-30 sigma, max(alpha, 2) + 30 sigma] (all Gaussian components of
                    the integrand are centred in [0, max(alpha, 2)]), padded by
                    2 sigma.  Breakpoints: every sigma, plus z = 1/2, z = 1 and a
                    geometric grading z0 +- sigma^2 2^k around the transition point z0
                    (complex branch points of (1 - q + qL)^alpha sit at z0 +- i pi sigma^2).
                    Working precision 75 digits.
* independent cross-checks at every fractional point (stored per point under
  "checks" as relative differences [log_a, dlog_a_dq, dlog_a_dsigma]):
    - ``series``: (F4) at 60 + 25 + log10(1/(A-1)) digits: head i <= floor(alpha)
      summed directly (positive terms), alternating tail by Cohen-Villegas-Zagier
      with n and n/1.3 terms.  No quadrature and no domain heuristic, so this is
      the fully independent check of log A.  Its derivatives are central
      differences of (F4) at q +- h, sigma +- h with h = 1e-20 * scale (so they
      check (F2) independently; their own truncation error is ~1e-40..1e-36);
    - ``quad_gl_alt``: the integrals (F1)/(F2) discretised differently: threshold
      T = 115 nats, panel spacing 0.7 sigma with an offset, 3^k grading around z0,
      40- vs 56-point Gauss-Legendre rules, 95 working digits;
    - ``tanh_sinh``: mpmath.quad (tanh-sinh) of (F1) on the alternative
      breakpoints, on every 6th fractional point (``--tanh-sinh-every``).
  At integer points ``quad_gl`` is compared against the exact sums (this
  validates the quadrature and the derivative formulas (F2)).
  ``est_rel_err_*`` is the max of the quadrature's own error estimate (panel
  error + a bound on the mass outside the domain) and the disagreement with
  every cross-check (1e-60 for the exact sums, 0 for closed forms).

Parameter box and point set (see ``point_set``; fixed seed, 438 points)
----------------------------------------------------------------------
q in [0, 1], sigma in [0.1, 1e4], alpha in (1, 4096]:
  dp_grid     dp_accounting's grid q in {1e-3, 1e-2, 0.1} x sigma in {0.8, 1.1, 2, 5}
              x alpha in {1.5, 2, 2.5, 4.7, 8, 16.5, 32, 64, 256};
  edge_q      q in {1e-10, 1e-6, 0.999, 1 - 1e-6} x sigma in {0.1, 0.5, 1, 1e3, 1e4}
              x alpha in {1.0001, 2.5, 16, 1000.5, 4096};
  closed      q in {0, 1} x sigma in {0.1, 1, 1e4} x alpha in {1.0001, 2.5, 4096};
  edge_alpha  alpha in {1.0001, 1.01, 1.1, 1000.5, 2048, 4095.5, 4096} x 6 (q, sigma);
  edge_sigma  sigma in {0.1, 0.2, 0.5, 1e3, 1e4} x 4 (q, alpha);
  random      150 points: q log-uniform in [1e-8, 1] (every 5th uniform in [0.5, 1)),
              sigma log-uniform in [0.1, 1e4], alpha: half integers log-uniform in
              [2, 4096], a quarter 1 + 10^u (u in [-4, 0.5]), a quarter fractional
              log-uniform in (1, 4096].
A point is skipped (listed under "skipped") only if log A > 1e300, which
cannot happen in this box (log A <= alpha(alpha-1)/(2 sigma^2) < 1e9).

Float32 point set (``--float32``, see ``point_set_float32``; written to
tests/data/log_a_reference_float32.json, same layout)
----------------------------------------------------------------------
Every q, sigma, alpha is exactly representable in binary32 (a numpy.float32
converted to a Python float, so mpmath evaluates at exactly the float32 value):
  <set> (dp_grid, edge_q, closed, edge_alpha, edge_sigma, random)
              the points above rounded to float32 (round to nearest), duplicates
              dropped, kept only if 0 <= q <= 1 and alpha > 1 (all are kept);
  random_f32  60 further points (seed SEED_F32): q log-uniform in [1e-8, 1],
              sigma log-uniform in [0.1, 1e4], alpha: even k integers
              log-uniform in [2, 4096], odd k fractional log-uniform in (1, 4096]
              (x + 0.5 if the float32 value is an integer); all rounded to float32.
Same methods and cross-checks as above.

Usage (from the repo root)::

    /work/venv/bin/python tools/make_references.py                     # full set (~8 min, one core)
    /work/venv/bin/python tools/make_references.py --quick             # 8 points, prints only
    /work/venv/bin/python tools/make_references.py --float32           # float32 set (~9 min)
    /work/venv/bin/python tools/make_references.py --float32 --quick   # 8 points rounded to float32
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

import mpmath
import numpy as np
from mpmath import mp, mpf

MP_DPS = 60  # precision of the stored references
QUAD_DPS = 75  # working precision, main quadrature
ALT_DPS = 95  # working precision, alternative quadrature
SEED = 20240917
SEED_F32 = 20240932  # extra random points of the float32 set
N_RAND_F32 = 60
OUT_PATH = os.path.join("tests", "data", "log_a_reference.json")
OUT_PATH_F32 = os.path.join("tests", "data", "log_a_reference_float32.json")

# ----------------------------------------------------------------------------
# Closed forms and exact sums
# ----------------------------------------------------------------------------


def closed_form(q, sigma, alpha):
    """(F5): log A and derivatives for q in {0, 1}."""
    q, s, a = mpf(q), mpf(sigma), mpf(alpha)
    if q == 0:
        return mpf(0), mpf(0), mpf(0)
    if q == 1:
        return (
            a * (a - 1) / (2 * s**2),
            -a * mpmath.expm1(-(a - 1) / s**2),
            -a * (a - 1) / s**3,
        )
    raise ValueError("closed form only for q in {0, 1}")


def log_a_integer_exact(q, sigma, alpha, dps=MP_DPS + 20):
    """(F3): exact finite sums for integer alpha.

    Returns (log A, dlogA/dq, dlogA/dsigma, A - 1) as mpf.  All sums have
    terms of one sign, so precision loss is bounded by the term count.
    """
    n = int(alpha)
    assert n == alpha and n >= 2
    with mp.workdps(dps + len(str(n))):
        q, s = mpf(q), mpf(sigma)
        lq, l1q = mpmath.log(q), mpmath.log1p(-q)
        inv2s2 = 1 / (2 * s * s)
        s3 = s**3
        # log C(n, k) and log C(n-1, k) by recurrence.
        a_m1 = mpf(0)  # A - 1
        da_ds = mpf(0)
        log_c = mpf(0)  # log C(n, 0)
        for k in range(0, n + 1):
            if k > 0:
                log_c += mpmath.log(mpf(n - k + 1) / k)
            if k >= 2:
                c_k = k * (k - 1) * inv2s2
                base = log_c + k * lq + (n - k) * l1q
                a_m1 += mpmath.exp(base) * mpmath.expm1(c_k)
                da_ds -= mpmath.exp(base + c_k) * (k * (k - 1)) / s3
        da_dq = mpf(0)
        log_c = mpf(0)  # log C(n-1, 0)
        for k in range(1, n):
            log_c += mpmath.log(mpf(n - k) / k)
            c_k = k * (k - 1) * inv2s2
            da_dq += mpmath.exp(log_c + k * lq + (n - 1 - k) * l1q + c_k) * mpmath.expm1(k / s**2)
        da_dq *= n
        a = 1 + a_m1
        return mpmath.log1p(a_m1), da_dq / a, da_ds / a, a_m1


# ----------------------------------------------------------------------------
# Float64 pre-scan of the log-integrands (only used to find the domain)
# ----------------------------------------------------------------------------


def log_integrands_float(z, q, sigma, alpha):
    """log of the three integrands of (F1)/(F2), in float64, for a z-grid.

    Returns an array (3, len(z)).  Uses log(1 + x) = log1p(q expm1(u)) with
    u = log L, and f/(1+x) = expm1((alpha-1) y) + (alpha-1) expm1(-y), y = log(1+x).
    Only needs to be accurate to ~1 nat.
    """
    a = alpha - 1.0
    s2 = sigma * sigma
    with np.errstate(all="ignore"):
        u = (2.0 * z - 1.0) / (2.0 * s2)
        log_phi = -z * z / (2.0 * s2) - math.log(sigma * math.sqrt(2.0 * math.pi))
        if q == 1.0:
            y = u.copy()
        else:
            y = np.where(
                u < 700.0,
                np.log1p(q * np.expm1(np.minimum(u, 700.0))),
                np.logaddexp(math.log1p(-q), math.log(q) + u),
            )
        # log |L - 1|
        log_em = np.where(u > 700.0, u, np.log(np.abs(np.expm1(np.minimum(u, 700.0)))))
        # log h,  h = f / (1 + x)
        ay = a * y
        h_mid = np.expm1(np.clip(ay, -700, 700)) + a * np.expm1(np.clip(-y, -700, 700))
        log_h = np.log(np.where(h_mid > 0, h_mid, np.nan))
        small = np.abs(y) < 1e-4
        log_h = np.where(
            small,
            math.log(alpha * a / 2.0) + 2.0 * np.log(np.abs(y)) + np.log1p((alpha - 2.0) * y / 3.0),
            log_h,
        )
        log_h = np.where(ay > 700.0, ay, log_h)
        log_h = np.where(-y > 700.0, math.log(a) - y, log_h)
        log_h = np.where(np.isnan(log_h), -np.inf, log_h)
        log_f = y + log_h
        # log |g|
        log_g = np.where(ay > 700.0, ay, np.log(np.abs(np.expm1(np.clip(ay, -700, 700)))))
        out0 = log_phi + log_f
        out1 = log_phi + math.log(alpha) + log_g + log_em
        out2 = (
            log_phi
            + math.log(alpha * q)
            - 3.0 * math.log(sigma)
            + log_g
            + u
            + np.log(np.abs(1.0 - z))
        )
    out = np.stack([out0, out1, out2])
    return np.where(np.isnan(out), -np.inf, out)


def significant_domain(q, sigma, alpha, threshold_nats, pad_sigmas=2.0):
    """Union of intervals where some log-integrand is within `threshold_nats`
    of its maximum (float64 scan, spacing sigma/10).  Returns a list of (a, b).
    """
    k_sig = 30.0
    for _ in range(6):
        lo = -k_sig * sigma
        hi = max(alpha, 2.0) + k_sig * sigma
        n = int(math.ceil((hi - lo) / (sigma / 10.0))) + 1
        z = np.linspace(lo, hi, n)
        li = log_integrands_float(z, q, sigma, alpha)
        mask = np.zeros(n, dtype=bool)
        for row in li:
            m = np.max(row)
            if np.isfinite(m):
                mask |= row >= m - threshold_nats
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            raise RuntimeError("empty significant domain")
        if idx[0] == 0 or idx[-1] == n - 1:
            k_sig *= 2.0
            continue
        # runs of consecutive indices
        breaks = np.flatnonzero(np.diff(idx) > 1)
        starts = np.concatenate([[idx[0]], idx[breaks + 1]])
        ends = np.concatenate([idx[breaks], [idx[-1]]])
        pad = pad_sigmas * sigma
        intervals = []
        for s_, e_ in zip(starts, ends):
            a_, b_ = z[s_] - pad, z[e_] + pad
            if intervals and a_ <= intervals[-1][1]:
                intervals[-1] = (intervals[-1][0], max(b_, intervals[-1][1]))
            else:
                intervals.append((a_, b_))
        return intervals
    raise RuntimeError("significant domain does not close")


def transition_point(q, sigma):
    """z0 = 1/2 + sigma^2 log((1-q)/q): where q L = 1 - q."""
    return 0.5 + sigma * sigma * (math.log1p(-q) - math.log(q))


def breakpoints(q, sigma, alpha, intervals, spacing, offset, grading):
    """Panel boundaries: regular grid of `spacing` (shifted by `offset`),
    z = 1/2, z = 1, and z0 +- sigma^2 * grading^k."""
    z0 = transition_point(q, sigma)
    s2 = sigma * sigma
    special = [0.5, 1.0, z0]
    if s2 < 4 * sigma:  # the transition is narrower than the Gaussian width
        d = s2 / 4.0
        while d < 4 * sigma:
            special += [z0 - d, z0 + d]
            d *= grading
    pts = []
    for a_, b_ in intervals:
        seg = [a_, b_]
        k0 = math.ceil((a_ - offset) / spacing)
        k1 = math.floor((b_ - offset) / spacing)
        seg += [offset + k * spacing for k in range(k0, k1 + 1)]
        seg += [p for p in special if a_ < p < b_]
        seg = sorted(set(seg))
        pts.append(seg)
    return pts


# ----------------------------------------------------------------------------
# Adaptive Gauss-Legendre quadrature (vector-valued integrand)
# ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def gauss_legendre(n, dps):
    """Nodes and weights of the n-point Gauss-Legendre rule on [-1, 1]."""
    with mp.workdps(dps + 15):
        nodes, weights = [], []
        for i in range(1, n + 1):
            x = mpmath.cos(mpmath.pi * (i - mpf(0.25)) / (n + mpf(0.5)))
            for _ in range(100):
                p0, p1 = mpf(1), x
                for k in range(2, n + 1):
                    p0, p1 = p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k
                dp = n * (x * p1 - p0) / (x * x - 1)
                dx = p1 / dp
                x -= dx
                if abs(dx) < mpf(10) ** (-(dps + 12)):
                    break
            p0, p1 = mpf(1), x
            for k in range(2, n + 1):
                p0, p1 = p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k
            dp = n * (x * p1 - p0) / (x * x - 1)
            nodes.append(x)
            weights.append(2 / ((1 - x * x) * dp * dp))
    with mp.workdps(dps):
        return tuple(+x for x in nodes), tuple(+w for w in weights)


def make_integrand(q, sigma, alpha):
    """z -> (phi f, alpha phi g (L-1), alpha q phi g L (1-z)/sigma^3), (F1)/(F2)."""
    q, s, a = mpf(q), mpf(sigma), mpf(alpha)
    am1 = a - 1
    inv2s2 = 1 / (2 * s * s)
    log_norm = -mpmath.log(s * mpmath.sqrt(2 * mpmath.pi))
    c2 = a * q / s**3
    exp, expm1, log1p = mpmath.exp, mpmath.expm1, mpmath.log1p

    def integrand(z):
        em = expm1((2 * z - 1) * inv2s2)  # L - 1
        x = q * em
        g = expm1(am1 * log1p(x))  # (1+x)^(alpha-1) - 1
        phi = exp(log_norm - z * z * inv2s2)
        pg = phi * g
        return (phi * (g * (1 + x) - am1 * x), a * pg * em, c2 * pg * (em + 1) * (1 - z))

    return integrand


def adaptive_gauss_legendre(func, panels, n_lo, n_hi, rel_tol, dps, max_panels=50000):
    """Integrate a 3-vector valued func over the union of `panels`.

    Each panel gets G_{n_lo} and G_{n_hi}; panels are bisected until
    sum_i max_k |G_lo - G_hi|_{i,k} / scale_k <= rel_tol, with
    scale_k = sum_i |G_hi|_{i,k} (= int |integrand_k| since panels do not
    straddle sign changes).  Returns (integrals, scales, err_est, n_evals, n_panels).
    """
    xl, wl = gauss_legendre(n_lo, dps)
    xh, wh = gauss_legendre(n_hi, dps)
    n_evals = 0

    def rule(a, b):
        nonlocal n_evals
        c, h = (a + b) / 2, (b - a) / 2
        lo = [mpf(0)] * 3
        hi = [mpf(0)] * 3
        for x, w in zip(xl, wl):
            v = func(c + h * x)
            for k in range(3):
                lo[k] += w * v[k]
        for x, w in zip(xh, wh):
            v = func(c + h * x)
            for k in range(3):
                hi[k] += w * v[k]
        n_evals += n_lo + n_hi
        return [h * v for v in lo], [h * v for v in hi]

    done = []  # (a, b, lo, hi)
    todo = [(mpf(a), mpf(b)) for a, b in panels]
    while True:
        for a, b in todo:
            lo, hi = rule(a, b)
            done.append((a, b, lo, hi))
        scales = [sum(abs(d[3][k]) for d in done) for k in range(3)]

        def err_of(d):
            return max(
                (abs(d[2][k] - d[3][k]) / scales[k] if scales[k] != 0 else mpf(0)) for k in range(3)
            )

        errs = [err_of(d) for d in done]
        total_err = sum(errs)
        if total_err <= rel_tol:
            break
        cutoff = rel_tol / (2 * len(done))
        keep, todo = [], []
        for d, e in zip(done, errs):
            if e > cutoff and (d[1] - d[0]) > mpf(10) ** (-30) * (1 + abs(d[0])):
                m = (d[0] + d[1]) / 2
                todo += [(d[0], m), (m, d[1])]
            else:
                keep.append(d)
        if not todo or len(keep) + len(todo) > max_panels:
            break
        done = keep
    totals = [sum(d[3][k] for d in done) for k in range(3)]
    return totals, scales, total_err, n_evals, len(done)


def log_a_quadrature(q, sigma, alpha, variant="main"):
    """(F1)/(F2) by adaptive Gauss-Legendre.  Returns a dict of mpf values."""
    if variant == "main":
        thr, spacing, offset, grading, n_lo, n_hi, dps = 92.0, 1.0, 0.0, 2.0, 24, 32, QUAD_DPS
    else:
        thr, spacing, offset, grading, n_lo, n_hi, dps = 115.0, 0.7, 0.31, 3.0, 40, 56, ALT_DPS
    intervals = significant_domain(q, sigma, alpha, thr)
    segs = breakpoints(q, sigma, alpha, intervals, spacing * sigma, offset * sigma, grading)
    panels = [(seg[i], seg[i + 1]) for seg in segs for i in range(len(seg) - 1)]
    # Mass left outside the domain: every scanned point outside is > thr nats
    # below the maximum, and beyond the scanned range the integrands decay like
    # Gaussians, so (length / (sigma/10)) * sigma/10 * e^-thr / sigma bounds it.
    scan_len = max(alpha, 2.0) + 60.0 * sigma
    trunc = (scan_len / sigma) * math.exp(-thr)
    with mp.workdps(dps):
        func = make_integrand(q, sigma, alpha)
        (a_m1, da_dq, da_ds), scales, err, n_evals, n_panels = adaptive_gauss_legendre(
            func, panels, n_lo, n_hi, mpf(10) ** -32, dps
        )
        err = err + trunc
        a = 1 + a_m1
        cancel_ds = scales[2] / abs(da_ds) if da_ds != 0 else mpf(1)
        return {
            "a_m1": a_m1,
            "log_a": mpmath.log1p(a_m1),
            "dlog_a_dq": da_dq / a,
            "dlog_a_dsigma": da_ds / a,
            # err is relative to int|integrand|; for the signed d/dsigma integrand
            # we multiply by the cancellation factor.
            "err": err,
            "err_ds": err * cancel_ds,
            "n_evals": n_evals,
            "n_panels": n_panels,
            "domain": intervals,
        }


def log_a_tanh_sinh(q, sigma, alpha, dps=70):
    """(F1) with mpmath.quad (tanh-sinh) on the alternative breakpoints (log A only)."""
    intervals = significant_domain(q, sigma, alpha, 115.0)
    segs = breakpoints(q, sigma, alpha, intervals, 0.7 * sigma, 0.31 * sigma, 3.0)
    with mp.workdps(dps):
        func = make_integrand(q, sigma, alpha)
        total, err = mpf(0), mpf(0)
        for seg in segs:
            v, e = mpmath.quad(lambda z: func(z)[0], [mpf(p) for p in seg], error=True)
            total += v
            err += e
        return mpmath.log1p(total), err / total


# ----------------------------------------------------------------------------
# Mironov's series (F4)
# ----------------------------------------------------------------------------


def cvz_alternating_sum(a, n):
    """Cohen-Villegas-Zagier (Algorithm 1): sum_{k>=0} (-1)^k a[k] from a[0..n-1].

    Error <= 2 (3 + sqrt 8)^(-n) * int|dmu| when a_k are moments of a positive
    measure on [0, 1] (true here, see log_a_series)."""
    d = (3 + mpmath.sqrt(8)) ** n
    d = (d + 1 / d) / 2
    b, c, s = mpf(-1), -d, mpf(0)
    for k in range(n):
        c = b - c
        s += c * a[k]
        b = (k + n) * (k - n) * b / ((k + mpf(0.5)) * (k + 1))
    return s / d


def log_a_series(q, sigma, alpha, a_m1_hint):
    """(F4), Mironov's series.  Returns (log A, relative tail-error estimate).

    The i-th bracket equals (1-q)^alpha int_{z<z0} phi(z) r^i dz
    + q^alpha int_{z>z0} phi(z) L^alpha r'^i dz with r = qL/(1-q) < 1 on the first
    and r' = (1-q)/(qL) < 1 on the second region: a Hausdorff moment sequence in i.
    For i > alpha, C(alpha, i) alternates in sign and |C(alpha, i)| is itself a
    moment sequence, so the tail i > floor(alpha) is an alternating series of the
    form sum (-1)^k mu_k, for which CVZ converges like 5.83^(-n).  The head
    i <= floor(alpha) has only positive terms.  Working precision:
    60 + 25 + log10(1/(A-1)) digits (the sum is A, not A - 1).
    """
    extra = max(0, int(-mpmath.floor(mpmath.log10(a_m1_hint))))
    dps = MP_DPS + 25 + extra
    with mp.workdps(dps):
        q, s, a = mpf(q), mpf(sigma), mpf(alpha)
        lq, l1q = mpmath.log(q), mpmath.log1p(-q)
        z0 = mpf(0.5) + s * s * (l1q - lq)
        inv2s2 = 1 / (2 * s * s)
        r2s = mpmath.sqrt(2) * s

        def bracket(i):
            j = a - i
            t0 = mpmath.exp(i * lq + j * l1q + (i * i - i) * inv2s2) * mpmath.erfc((i - z0) / r2s)
            t1 = mpmath.exp(j * lq + i * l1q + (j * j - j) * inv2s2) * mpmath.erfc((z0 - j) / r2s)
            return (t0 + t1) / 2

        i0 = int(math.floor(alpha)) + 1  # C(alpha, i) alternates for i >= i0
        head = mpf(0)
        c = mpf(1)  # C(alpha, 0)
        for i in range(i0):
            head += c * bracket(i)
            c = c * (a - i) / (i + 1)
        # tail: c_i * bracket(i) for i >= i0, signs sign(c_i0) * (-1)^(i - i0)
        n_terms = int(1.3 * dps * math.log(10) / math.log(3 + math.sqrt(8))) + 10
        mags = []
        sign0 = mpmath.sign(c)
        for k in range(n_terms):
            i = i0 + k
            t = c * bracket(i)
            if t != 0 and mpmath.sign(t) != sign0 * (-1) ** k:
                raise RuntimeError("series tail is not alternating")
            mags.append(abs(t))
            c = c * (a - i) / (i + 1)
        n1 = int(n_terms / 1.3)
        tail = sign0 * cvz_alternating_sum(mags, n_terms)
        tail_lo = sign0 * cvz_alternating_sum(mags, n1)
        total = head + tail
        return mpmath.log(total), abs(tail - tail_lo) / (total - 1)


def series_derivatives(q, sigma, alpha, a_m1_hint, rel_step=mpf(10) ** -20):
    """d log A/dq and d log A/dsigma by central differences of (F4), evaluated at
    q +- h, sigma +- h (exact mpf arguments, h = 1e-20 * scale): truncation error
    ~1e-40 relative, round-off ~1e-60.  Independent of the derivative formulas (F2)."""
    with mp.workdps(MP_DPS + 40):
        q, s = mpf(q), mpf(sigma)
        hq = rel_step * min(q, 1 - q)
        hs = rel_step * s
        fq = [log_a_series(q + e * hq, s, alpha, a_m1_hint)[0] for e in (1, -1)]
        fs = [log_a_series(q, s + e * hs, alpha, a_m1_hint)[0] for e in (1, -1)]
        return (fq[0] - fq[1]) / (2 * hq), (fs[0] - fs[1]) / (2 * hs)


# ----------------------------------------------------------------------------
# Point set
# ----------------------------------------------------------------------------


def point_set(quick=False):
    """Fixed, seeded list of (q, sigma, alpha, set-name)."""
    pts = []

    def add(q, s, a, tag):
        pts.append((float(q), float(s), float(a), tag))

    if quick:
        add(1e-2, 1.1, 8.0, "quick")
        add(1e-2, 1.1, 4.7, "quick")
        add(1e-10, 1e4, 1.0001, "quick")
        add(0.999, 0.1, 4095.5, "quick")
        add(0.5, 0.1, 1.0001, "quick")
        add(1e-3, 0.8, 256.0, "quick")
        add(1.0, 2.0, 2.5, "quick")
        add(0.0, 2.0, 2.5, "quick")
        return pts

    # dp_accounting's typical grid
    for q in (1e-3, 1e-2, 0.1):
        for s in (0.8, 1.1, 2.0, 5.0):
            for a in (1.5, 2.0, 2.5, 4.7, 8.0, 16.5, 32.0, 64.0, 256.0):
                add(q, s, a, "dp_grid")
    # extreme q
    for q in (1e-10, 1e-6, 0.999, 1 - 1e-6):
        for s in (0.1, 0.5, 1.0, 1e3, 1e4):
            for a in (1.0001, 2.5, 16.0, 1000.5, 4096.0):
                add(q, s, a, "edge_q")
    # closed forms
    for q in (0.0, 1.0):
        for s in (0.1, 1.0, 1e4):
            for a in (1.0001, 2.5, 4096.0):
                add(q, s, a, "closed")
    # extreme alpha
    for a in (1.0001, 1.01, 1.1, 1000.5, 2048.0, 4095.5, 4096.0):
        for q, s in ((1e-2, 1.0), (0.1, 2.0), (0.5, 0.7), (1e-4, 30.0), (0.3, 0.2), (1e-3, 1e3)):
            add(q, s, a, "edge_alpha")
    # extreme sigma
    for s in (0.1, 0.2, 0.5, 1e3, 1e4):
        for q, a in ((0.01, 3.0), (0.5, 7.5), (1e-3, 100.0), (0.9, 50.25)):
            add(q, s, a, "edge_sigma")
    # random points
    rng = np.random.default_rng(SEED)
    n_rand = 150
    for k in range(n_rand):
        if k % 5 == 4:
            q = float(rng.uniform(0.5, 1.0))
        else:
            q = float(10.0 ** rng.uniform(-8.0, 0.0))
        s = float(10.0 ** rng.uniform(-1.0, 4.0))
        kind = k % 4
        if kind in (0, 1):  # integer, log-uniform in [2, 4096]
            a = float(round(2.0 ** rng.uniform(1.0, 12.0)))
        elif kind == 2:  # 1 + 10^u
            a = 1.0 + 10.0 ** float(rng.uniform(-4.0, 0.5))
        else:  # log-uniform fractional
            a = float(2.0 ** rng.uniform(0.05, 12.0))
            if a.is_integer():
                a += 0.5
        a = min(a, 4096.0)
        add(q, s, a, "random")
    # de-duplicate, keep order
    seen, out = set(), []
    for p in pts:
        if p[:3] not in seen:
            seen.add(p[:3])
            out.append(p)
    return out


def to_f32(x):
    """Round to the nearest binary32 value, returned as an (exact) Python float."""
    return float(np.float32(x))


def point_set_float32(quick=False):
    """Fixed, seeded list of (q, sigma, alpha, set-name), all float32-exact.

    The points of ``point_set(quick)`` rounded to float32 (duplicates, q outside
    [0, 1] and alpha <= 1 dropped), plus, unless `quick`, N_RAND_F32 random points.
    """
    pts = []
    for q, s, a, tag in point_set(quick):
        q, s, a = to_f32(q), to_f32(s), to_f32(a)
        if 0.0 <= q <= 1.0 and a > 1.0:
            pts.append((q, s, a, tag))
    if not quick:
        rng = np.random.default_rng(SEED_F32)
        for k in range(N_RAND_F32):
            q = to_f32(10.0 ** rng.uniform(-8.0, 0.0))
            s = to_f32(10.0 ** rng.uniform(-1.0, 4.0))
            if k % 2 == 0:  # integer, log-uniform in [2, 4096]
                a = to_f32(round(2.0 ** rng.uniform(1.0, 12.0)))
            else:  # fractional, log-uniform in (1, 4096]
                a = 1.0
                while a <= 1.0:
                    a = to_f32(2.0 ** rng.uniform(0.0, 12.0))
                if a.is_integer():
                    a = to_f32(a + 0.5)
            a = min(a, 4096.0)
            pts.append((q, s, a, "random_f32"))
    seen, out = set(), []
    for p in pts:
        assert all(float(np.float32(v)) == v for v in p[:3])
        if p[:3] not in seen:
            seen.add(p[:3])
            out.append(p)
    return out


# ----------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------


def rel_diff(x, y):
    x, y = mpf(x), mpf(y)
    if x == y:
        return 0.0
    return float(abs(x - y) / max(abs(x), abs(y)))


def compute_point(q, sigma, alpha, tanh_sinh=False):
    """Reference values + cross-checks for one point."""
    info = {}
    if q in (0.0, 1.0):
        with mp.workdps(MP_DPS + 20):
            la, dq, ds = closed_form(q, sigma, alpha)
        zero = {"est_rel_err_log_a": 0.0, "est_rel_err_dlog_a_dq": 0.0, "est_rel_err_dlog_a_dsigma": 0.0}
        return la, dq, ds, "closed_form", zero
    is_int = float(alpha).is_integer()
    quad = log_a_quadrature(q, sigma, alpha, "main")
    info["quad_panels"] = quad["n_panels"]
    info["quad_evals"] = quad["n_evals"]
    checks = {}
    if is_int:
        la, dq, ds, _ = log_a_integer_exact(q, sigma, alpha)
        method = "exact_sum"
        checks["quad_gl"] = (
            rel_diff(quad["log_a"], la),
            rel_diff(quad["dlog_a_dq"], dq),
            rel_diff(quad["dlog_a_dsigma"], ds),
        )
        est = (1e-60, 1e-60, 1e-60)  # the exact sums carry >= 70 correct digits
    else:
        la, dq, ds = quad["log_a"], quad["dlog_a_dq"], quad["dlog_a_dsigma"]
        method = "quad_gl"
        alt = log_a_quadrature(q, sigma, alpha, "alt")
        checks["quad_gl_alt"] = (
            rel_diff(alt["log_a"], la),
            rel_diff(alt["dlog_a_dq"], dq),
            rel_diff(alt["dlog_a_dsigma"], ds),
        )
        ser = log_a_series(q, sigma, alpha, quad["a_m1"])
        sdq, sds = series_derivatives(q, sigma, alpha, quad["a_m1"])
        checks["series"] = (rel_diff(ser[0], la), rel_diff(sdq, dq), rel_diff(sds, ds))
        info["series_tail_err"] = float(f"{float(ser[1]):.3g}")
        if tanh_sinh:
            ts, ts_err = log_a_tanh_sinh(q, sigma, alpha)
            checks["tanh_sinh"] = (rel_diff(ts, la),)
        own = float(quad["err"])
        est = (
            max([own] + [c[0] for c in checks.values()]),
            max([own] + [c[1] for c in checks.values() if len(c) > 1]),
            max([float(quad["err_ds"])] + [c[2] for c in checks.values() if len(c) > 2]),
        )
    info["checks"] = {k: [float(f"{v:.3g}") for v in vals] for k, vals in checks.items()}
    info["est_rel_err_log_a"] = float(f"{est[0]:.3g}")
    info["est_rel_err_dlog_a_dq"] = float(f"{est[1]:.3g}")
    info["est_rel_err_dlog_a_dsigma"] = float(f"{est[2]:.3g}")
    return la, dq, ds, method, info


def dp_accounting_check(points):
    """Integer-order cross-check against dp_accounting's float64 _compute_log_a.

    dp_accounting sums the alpha + 1 terms of A (not A - 1) in log space in
    float64, so its *absolute* error is ~1e-16..1e-11 (growing with alpha);
    relative differences are therefore only meaningful where log A is not tiny.
    """
    try:
        from dp_accounting.rdp.rdp_privacy_accountant import _compute_log_a
    except Exception as exc:  # pragma: no cover
        return {"error": repr(exc)}
    rel_all, rel_ge1, abs_all, n, n_ge1 = 0.0, 0.0, 0.0, 0, 0
    for p in points:
        q, s, a = p["q"], p["sigma"], p["alpha"]
        if not (0.0 < q < 1.0) or not float(a).is_integer():
            continue
        ref = float(mpf(p["log_a"]))
        val = float(_compute_log_a(q, s, int(a)))
        rel = abs(val - ref) / abs(ref)
        rel_all = max(rel_all, rel)
        abs_all = max(abs_all, abs(val - ref) / max(1.0, abs(ref)))
        n += 1
        if abs(ref) >= 1.0:
            rel_ge1 = max(rel_ge1, rel)
            n_ge1 += 1
    return {
        "n_points": n,
        "max_abs_diff_over_max_1_abs_log_a": abs_all,
        "max_rel_diff": rel_all,
        "n_points_log_a_ge_1": n_ge1,
        "max_rel_diff_log_a_ge_1": rel_ge1,
    }


def summarize(records):
    """Max relative disagreement per (set, check) for [log_a, dq, dsigma]."""
    out = {}
    for r in records:
        for name, vals in r.get("checks", {}).items():
            key = f"{r['set']}/{name}"
            cur = out.setdefault(key, [0.0] * len(vals))
            for k, v in enumerate(vals):
                cur[k] = max(cur[k], v)
    return dict(sorted(out.items()))


def fmt(x, digits):
    return mpmath.nstr(x, digits, strip_zeros=False, min_fixed=-1, max_fixed=1) if x != 0 else "0"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="only a handful of points")
    ap.add_argument(
        "--out",
        default=None,
        help="output path (default tests/data/log_a_reference.json, with --float32 "
        "tests/data/log_a_reference_float32.json; with --quick nothing is written unless given)",
    )
    ap.add_argument(
        "--float32",
        action="store_true",
        help="the float32-exact point set (written to tests/data/log_a_reference_float32.json)",
    )
    ap.add_argument(
        "--tanh-sinh-every",
        type=int,
        default=6,
        help="also run mpmath.quad tanh-sinh on every k-th fractional point (0: never)",
    )
    args = ap.parse_args(argv)
    mp.dps = MP_DPS
    pts = point_set_float32(args.quick) if args.float32 else point_set(args.quick)
    default_out = OUT_PATH_F32 if args.float32 else OUT_PATH
    out_path = args.out or (None if args.quick else default_out)
    t_start = time.time()
    records, skipped = [], []
    n_frac = 0
    for idx, (q, s, a, tag) in enumerate(pts):
        t0 = time.time()
        frac = not float(a).is_integer() and 0.0 < q < 1.0
        ts = frac and args.tanh_sinh_every > 0 and n_frac % args.tanh_sinh_every == 0
        n_frac += frac
        la, dq, ds, method, info = compute_point(q, s, a, tanh_sinh=ts)
        dt = time.time() - t0
        if abs(la) > mpf("1e300"):
            skipped.append({"q": q, "sigma": s, "alpha": a, "reason": "log A overflows float64"})
            continue
        with mp.workdps(MP_DPS):
            rec = {
                "q": q,
                "sigma": s,
                "alpha": a,
                "log_a": fmt(la, 30),
                "dlog_a_dq": fmt(dq, 25),
                "dlog_a_dsigma": fmt(ds, 25),
                "method": method,
                "set": tag,
            }
        rec.update(info)
        records.append(rec)
        print(
            f"[{idx + 1:4d}/{len(pts)}] {tag:10s} q={q!r:<22} sigma={s!r:<10} alpha={a!r:<10} "
            f"{method:11s} log_a={rec['log_a'][:18]:<18} est={rec['est_rel_err_log_a']:.1e} "
            f"checks={info.get('checks', {})} {dt:6.2f}s",
            flush=True,
        )
    elapsed = time.time() - t_start
    if args.float32:
        inputs = (
            "q, sigma, alpha are float32-exact: each is a binary32 value (stored as the "
            "equal binary64 number), and the references are for exactly these inputs. "
            "Points: the float64 set's points rounded to float32, plus random points "
            "(set 'random_f32')."
        )
    else:
        inputs = "q, sigma, alpha are the exact binary64 inputs."
    doc = {
        "generated_by": "tools/make_references.py" + (" --float32" if args.float32 else ""),
        "mp_dps": MP_DPS,
        "description": (
            "log A_alpha of the sampled Gaussian mechanism (Mironov et al. 2019) and its "
            "derivatives w.r.t. q and sigma; " + inputs + " "
            "At q = 0 and q = 1 dlog_a_dq is the one-sided derivative. See the script's "
            "docstring for methods; 'checks' hold relative differences "
            "[log_a, dlog_a_dq, dlog_a_dsigma] against independent methods."
        ),
        "dp_accounting_check": dp_accounting_check(records),
        "max_check_rel_diff": summarize(records),
        "skipped": skipped,
        "points": records,
    }
    if out_path:
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        with open(out_path, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
    print(f"{len(records)} points in {elapsed:.1f}s; skipped {len(skipped)}; written to {out_path}")
    print("dp_accounting check:", doc["dp_accounting_check"])
    print("max relative disagreement [log_a, dlog_a_dq, dlog_a_dsigma] per set/check:")
    for k, v in doc["max_check_rel_diff"].items():
        print(f"  {k:28s} " + " ".join(f"{x:.1e}" for x in v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
