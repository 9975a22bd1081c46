"""Corners of the PLD accountant where it once reported too small an ε (issue 33).

References, none computed by the code under test:

* ``dp_accounting.pld.PLDAccountant`` at the same discretisation interval (the same pessimistic
  connect-the-dots quantity, computed independently, also at coarse intervals);
* the exact ε of the Gaussian mechanism composed T times (q = 1: μ = √T/σ,
  δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)), solved with SciPy to 1e-14;
* the identity that a phase with no steps adds nothing, and one-sided finite differences.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
import jaxrdp
from jaxrdp.accounting import pld


def _dp_accounting(q, sigma, steps, delta, interval):
  accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
  accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
  return accountant.get_epsilon(delta)


def _exact_gaussian(sigma, steps, delta):
  from scipy.optimize import brentq
  from scipy.stats import norm
  mu = math.sqrt(steps) / sigma
  return brentq(lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2)
                - delta, 0.0, 500.0, xtol=1e-14, rtol=1e-15)


@pytest.mark.parametrize("q,sigma,steps,interval", [
    (0.01, 1.0, 1, 1.0),     # once 0.0 (exact ε 0.19945): the log-MGF's blocks underflowed
    (0.1, 2.0, 100, 0.3),    # once 0.0 (2.337 at the default interval)
])   # (q = 1, σ = 2, T = 10 at Δ = 0.3, 0.5, 1: once 0.0 against 7.511; tests/test_pld_soundness.py)
def test_coarse_interval_gives_dp_accountings_pessimistic_epsilon(q, sigma, steps, interval):
  grid = jaxrdp.pld_grid(q, sigma, steps, interval=interval)
  eps = float(jaxrdp.pld_epsilon(q, sigma, steps, 1e-5, pld_grid=grid))
  assert eps == pytest.approx(_dp_accounting(q, sigma, steps, 1e-5, interval), rel=1e-9)
  if q == 1.0:
    assert eps >= _exact_gaussian(sigma, steps, 1e-5)


def _exact_gaussian_delta(sigma, steps, eps):
  from scipy.stats import norm
  mu = math.sqrt(steps) / sigma
  return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def test_delta_below_a_narrow_windows_start_is_never_below_the_exact_delta():
  # q = 1, σ = 2, T = 100: the composed loss is N(12.5, 25). On a hand-made grid of 4 or 16
  # nats (a PldGrid is documented to give a valid bound whatever its size), δ(ε) at ε below
  # the window's start was once 0.53-0.55 against 0.62-0.99: the mass between ε and the start
  # wrapped onto the top, its weight scaled by e^{-λW}. The window now starts at ε.
  grid = jaxrdp.pld_grid(1.0, 2.0, 100, interval=1e-3)
  for bins in (4096, 16384, grid.bins):
    narrow = jaxrdp.PldGrid(grid.interval, grid.pmf_bins, bins, grid.tail_mass)
    for eps in (0.0, 2.0, 5.0, 10.0):
      exact = _exact_gaussian_delta(2.0, 100, eps)
      assert float(jaxrdp.pld_delta(1.0, 2.0, 100, eps, pld_grid=narrow)) >= exact, (bins, eps)


@pytest.mark.parametrize("q,sigma,steps,delta", [(1.0, 2.0, 100, 1e-5), (0.01, 1.1, 10_000, 1e-5)])
def test_a_grid_sized_for_delta_is_narrower_with_the_same_epsilon(q, sigma, steps, delta):
  # The window needs to reach only as far below ε as the tilt at δ needs (pld_grid's delta=,
  # and pld_epsilon's own sizing): fewer points, the same ε to 1e-7 (the narrower circle's
  # FFT rounding floor is lower, so ε may come out a little smaller; it stays an upper bound,
  # tests/test_pld_soundness.py), and never below the exact ε at q = 1.
  generic = jaxrdp.pld_grid(q, sigma, steps, interval=1e-3)
  sized = jaxrdp.pld_grid(q, sigma, steps, interval=1e-3, delta=delta)
  assert sized.bins <= 0.85 * generic.bins and sized.pmf_bins == generic.pmf_bins
  eps = [float(jaxrdp.pld_epsilon(q, sigma, steps, delta, pld_grid=g)) for g in (generic, sized)]
  assert eps[1] == pytest.approx(eps[0], rel=1e-7)
  if q == 1.0:
    assert eps[1] >= _exact_gaussian(sigma, steps, delta)
  # pld_epsilon's own grid (at the default Δ) is the one sized for δ, also where δ/1000 is
  # below the default tail mass.
  phases = [np.array([v], np.float64) for v in (q, sigma, steps)]
  for d in (delta, 1e-14):
    assert pld.grid_of(*phases, None, np.float64(d)) == jaxrdp.pld_grid(q, sigma, steps, delta=d)


def test_small_delta_is_never_reported_below_at_the_exact_epsilon():
  # σ = 300, T = 10⁵, q = 1: δ at the exact ε(1e-12) = 7.66548 was once 8.53e-13 (the FFT's
  # rounding, summed over the points above ε). Its ε is in tests/test_pld_soundness.py.
  exact = _exact_gaussian(300.0, 100_000, 1e-12)
  assert float(jaxrdp.pld_delta(1.0, 300.0, 100_000, exact)) >= 1e-12


def test_zero_steps_give_zero_epsilon_and_zero_delta():
  assert float(jaxrdp.pld_epsilon(0.01, 1.0, 0, 1e-5)) == 0.0     # once +inf
  # δ: 0 up to the certified rounding allowance (jaxrdp.accounting.pld.convolution._composed)
  assert 0.0 <= float(jaxrdp.pld_delta(0.01, 1.0, 0, 0.5)) < 1e-15  # once NaN


def test_a_phase_without_steps_adds_nothing():
  with_empty = jaxrdp.pld_epsilon(np.array([0.01, 0.02]), np.array([1.0, 1.5]),
                                  np.array([100.0, 0.0]), 1e-5)     # once +inf
  alone = jaxrdp.pld_epsilon(0.01, 1.0, 100, 1e-5)
  assert float(with_empty) == pytest.approx(float(alone), rel=1e-6)


@pytest.mark.parametrize("sigma,steps", [
    (1.0, 100.0),   # once 215 (the two directions' derivatives averaged) against 116.3
    (0.5, 1.0),     # once 32,015 (the add direction's, picked by rounding) against 1.458
])
def test_derivative_in_q_at_one_is_the_one_sided_derivative(sigma, steps):
  # At q = 1 both directions are the same Gaussian pair; below 1 the add direction's ε falls
  # steeply, so the derivative at q = 1 must be the remove direction's, the left one.
  grid = jaxrdp.pld_grid(1.0, sigma, steps)
  eps = lambda q: jaxrdp.pld_epsilon(q, sigma, steps, 1e-5, pld_grid=grid)
  h = 1e-6
  left = (float(eps(1.0)) - float(eps(1.0 - h))) / h
  assert float(jax.grad(eps)(1.0)) == pytest.approx(left, rel=2e-3)


@pytest.mark.parametrize("grid,error,field", [
    (jaxrdp.PldGrid(1e-4, 100, 1024, 1e-15), ValueError, "pmf_bins"),    # once a reshape TypeError
    (jaxrdp.PldGrid(1e-4, 0, 1024, 1e-15), ValueError, "pmf_bins"),      # once ZeroDivisionError
    (jaxrdp.PldGrid(1e-4, 128, 1000, 1e-15), ValueError, "bins"),
    (jaxrdp.PldGrid(-1e-4, 128, 1024, 1e-15), ValueError, "interval"),   # once a silent inf
    (jaxrdp.PldGrid(1e-4, 128, 1024, 2.0), ValueError, "tail_mass"),     # once a silent inf
    (jaxrdp.PldGrid(1e-4, 128.0, 1024, 1e-15), TypeError, "pmf_bins"),
])
def test_a_hand_made_grid_is_checked_naming_the_field(grid, error, field):
  with pytest.raises(error, match=field):
    jaxrdp.pld_epsilon(0.01, 1.0, 10, 1e-5, pld_grid=grid)
