"""The vectorising float64 sin, cos and atan2 of :mod:`jaxrdp._internal.numerics` against mpmath
(references computed here at 60 digits, seeded samples): the absolute errors their docstrings
state, which the PLD's rounding bound (:mod:`jaxrdp.accounting.pld.convolution`) relies on."""

import jax
import mpmath
import numpy as np
import pytest

from jaxrdp._internal import numerics

_U = np.finfo(np.float64).eps / 2


@pytest.fixture(autouse=True)
def _x64():
  with jax.enable_x64(True):
    yield


def _samples(rng, n):
  # Every scale the PLD's angle sums reach (t·arg f, t up to 1e7), the quadrant edges and zero.
  scales = 10.0 ** rng.uniform(-12, 7, n)
  x = rng.choice([-1.0, 1.0], n) * scales
  edges = np.pi / 4 * np.arange(-40, 41)
  return np.concatenate([x, edges, np.nextafter(edges, np.inf), [0.0, -0.0, 1e-300]])


def test_sincos_against_mpmath():
  mpmath.mp.dps = 60
  x = _samples(np.random.default_rng(0), 1000)
  s, c = (np.asarray(v) for v in jax.jit(numerics.sincos)(x))
  ref_s = np.array([float(mpmath.sin(mpmath.mpf(float(v)))) for v in x])
  ref_c = np.array([float(mpmath.cos(mpmath.mpf(float(v)))) for v in x])
  assert np.max(np.abs(s - ref_s)) <= 2.1e-16
  assert np.max(np.abs(c - ref_c)) <= 2.1e-16
  # And relative to sin x itself where it is small (x near 0, normal: XLA flushes subnormals).
  tiny = (np.abs(x) < 1e-3) & (np.abs(x) >= np.finfo(np.float64).tiny)
  assert np.all(np.abs(s[tiny] - ref_s[tiny]) <= 4 * _U * np.abs(ref_s[tiny]))


def test_atan2_against_mpmath():
  mpmath.mp.dps = 60
  rng = np.random.default_rng(1)
  n = 1000
  y = rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 8, n)
  x = rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 8, n)
  # The octants' edges: |x| = |y|, one of them 0, |y|/|x| at tan(π/8).
  t8 = np.sqrt(2) - 1
  y = np.concatenate([y, [1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 3.0, -3.0, t8, np.nextafter(t8, 1), 0.0]])
  x = np.concatenate([x, [1.0, 1.0, -1.0, -1.0, 2.0, -2.0, 0.0, 0.0, 1.0, 1.0, 0.0]])
  a = np.asarray(jax.jit(numerics.atan2)(y, x))
  ref = np.array([float(mpmath.atan2(mpmath.mpf(float(v)), mpmath.mpf(float(w))))
                  for v, w in zip(y, x)])
  assert np.max(np.abs(a - ref)) <= 4.5e-16
  assert a[-1] == 0.0


def test_sincos_and_atan2_gradients():
  x = np.array([0.3, -2.0, 5.5, 1e4])
  ds, dc = (np.asarray(jax.vmap(jax.grad(lambda v, i=i: numerics.sincos(v)[i]))(x)) for i in (0, 1))
  np.testing.assert_allclose(ds, np.cos(x), rtol=1e-12, atol=1e-14)
  np.testing.assert_allclose(dc, -np.sin(x), rtol=1e-12, atol=1e-14)
  y, w = np.array([0.5, -1.0, 2.0]), np.array([1.0, -0.3, -4.0])
  dy, dw = jax.vmap(jax.grad(numerics.atan2, argnums=(0, 1)))(y, w)
  r2 = y * y + w * w
  np.testing.assert_allclose(np.asarray(dy), w / r2, rtol=1e-12)
  np.testing.assert_allclose(np.asarray(dw), -y / r2, rtol=1e-12)


def test_log_against_mpmath():
  mpmath.mp.dps = 60
  rng = np.random.default_rng(2)
  x = 10.0 ** rng.uniform(-307, 308, 1000)
  near_one = 1 + rng.uniform(-0.3, 0.3, 300)
  edges = np.array([np.sqrt(2), np.nextafter(np.sqrt(2), 0), 0.5, 1.0, 2.0, 1e-310, 5e-324,
                    np.finfo(np.float64).tiny, np.finfo(np.float64).max])
  x = np.concatenate([x, near_one, edges])
  got = np.asarray(jax.jit(numerics.log)(x))
  ref = np.array([float(mpmath.log(mpmath.mpf(float(v)))) for v in x])
  normal = x >= np.finfo(np.float64).tiny   # XLA may flush subnormal inputs to zero (−inf)
  ulp = np.spacing(np.abs(ref[normal]))
  assert np.max(np.abs(got[normal] - ref[normal]) / ulp) <= 4
  sub = got[~normal]
  assert np.all((sub == -np.inf) | (np.abs(sub - ref[~normal]) <= 1e-12))
  special = np.asarray(numerics.log(np.array([0.0, -1.0, np.inf, np.nan])))
  assert special[0] == -np.inf and np.isnan(special[1]) and special[2] == np.inf
  assert np.isnan(special[3])
  np.testing.assert_allclose(np.asarray(jax.vmap(jax.grad(numerics.log))(x[:50])), 1 / x[:50],
                             rtol=1e-15)
