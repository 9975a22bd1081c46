"""One argument order across the public API, and the 0.1.0 call forms kept for one release
(issue 13, item 3).

Specification:

* every RDP curve (``rdp_*``, ``compute_rdp``) takes the orders last;
* calibrations and the inverse sweep take (target ε, δ, then the other DP-SGD parameters in
  ``dpsgd_epsilon``'s order q, σ, T); everything else that takes a DP-SGD schedule takes it in
  that order;
* a call written for 0.1.0 never changes meaning silently: a positional call to a function whose
  parameters moved is read in the 0.1.0 order and warns (``DeprecationWarning``) with the
  keyword call to write; that call, run, gives exactly the same value, and so does the new form
  called on its own. The new form never warns;
* ``dpsgd_epsilon`` returns ε alone, ``compute_epsilon`` the pair (ε, order).
"""

import inspect
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrdp

DPSGD = ("sampling_rate", "noise_multiplier", "steps")
SINGULAR = {"target_epsilons": "target_epsilon", "deltas": "delta",
            "sampling_rates": "sampling_rate", "noise_multipliers": "noise_multiplier"}


def _params(fn):
  return list(inspect.signature(fn).parameters.values())


def _required(fn):
  """Names of the parameters without a default, in signature order (positional or keyword)."""
  return [SINGULAR.get(p.name, p.name) for p in _params(fn) if p.default is p.empty]


def _new_form(fn, **kwargs):
  """The 1.0 form, which must not warn."""
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    return fn(**kwargs)


# --- one order ----------------------------------------------------------------------------------

RDP_CURVES = sorted(n for n in jaxrdp.__all__ if n.startswith("rdp_") or n == "compute_rdp")


@pytest.mark.parametrize("name", RDP_CURVES)
def test_every_rdp_curve_takes_the_orders_last(name):
  fn = getattr(jaxrdp, name)
  names = [p.name for p in _params(fn)]
  if name == "rdp_spent":   # the accountant's curve: its orders are in the optimizer state
    assert "orders" not in names
    return
  assert _required(fn)[-1] == "orders", names
  positional = [p.name for p in _params(fn) if p.kind is p.POSITIONAL_OR_KEYWORD]
  assert not positional or positional[-1] == "orders", names
  # What follows the orders is only options: keyword-only, with a default.
  after = _params(fn)[names.index("orders") + 1:]
  assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in after), names


def test_the_curves_checked_are_the_ones_expected():
  assert {"rdp_gaussian", "rdp_laplace", "rdp_sampled_gaussian", "rdp_relative_gaussian",
          "rdp_relative_gaussian_descent", "rdp_zcdp", "rdp_tcdp", "compute_rdp"} <= set(RDP_CURVES)


@pytest.mark.parametrize("fn,calibrated", [
    (jaxrdp.calibrate_noise_multiplier, "noise_multiplier"),
    (jaxrdp.calibrate_sampling_rate, "sampling_rate"),
    (jaxrdp.calibrate_steps, "steps"),
    (jaxrdp.sweep_noise_multiplier, "noise_multiplier"),
])
def test_calibrations_and_the_inverse_sweep_share_one_order(fn, calibrated):
  expected = ["target_epsilon", "delta"] + [p for p in DPSGD if p != calibrated]
  assert _required(fn) == expected


@pytest.mark.parametrize("fn", [jaxrdp.dpsgd_epsilon, jaxrdp.epsilon_trajectory,
                                jaxrdp.optimize_schedule, jaxrdp.sweep])
def test_schedules_are_given_in_dpsgd_epsilons_order(fn):
  assert [n for n in _required(fn) if n in DPSGD] == list(DPSGD)


# --- dpsgd_epsilon's result ---------------------------------------------------------------------

def test_dpsgd_epsilon_returns_epsilon_alone_and_compute_epsilon_the_pair():
  q, sigma, steps, delta = 0.01, 1.1, 1000, 1e-5
  orders = np.asarray(jaxrdp.DEFAULT_ORDERS)
  eps = jaxrdp.dpsgd_epsilon(q, sigma, steps, delta)
  assert jnp.shape(eps) == ()
  assert np.isfinite(float(jax.grad(jaxrdp.dpsgd_epsilon, argnums=1)(q, sigma, steps, delta)))
  # The documented way to the order: compute_rdp + compute_epsilon, the grid value.
  rdp = jaxrdp.compute_rdp(q, sigma, steps, orders)
  grid_eps, order = jaxrdp.compute_epsilon(orders, rdp, delta)
  assert float(order) in orders
  unrefined = jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, refine_order=False)
  assert float(unrefined) == pytest.approx(float(grid_eps), rel=1e-12)
  assert float(eps) <= float(unrefined)


# --- the 0.1.0 forms ----------------------------------------------------------------------------

ORDERS = np.array([1.5, 2.0, 3.0, 8.0, 32.0])
GAMMA = 0.01 * np.sqrt(20)   # the seed paper's calibration: ε(2) = 0.0512 at d = 1
_U = lambda s, q: jnp.sum(s ** 2 / q)   # depends on both, so that a swap would show
_Q, _SIGMA = jnp.array([0.01, 0.02]), jnp.array([1.0, 1.5])   # distinct: a swap would show
_SCHEDULE = dict(target_epsilon=2.0, delta=1e-5, num_iterations=0)   # the projection alone
_SWEEP = dict()   # the default orders (compiled once for the three calls)


# (function, 0.1.0 positional arguments, other 0.1.0 keywords, the 1.0 keywords)
OLD_FORMS = {
    "rdp_relative_gaussian": (
        jaxrdp.rdp_relative_gaussian, (ORDERS, 0.01, GAMMA, 3), {},
        dict(eta=0.01, gamma=GAMMA, dim=3, orders=ORDERS)),
    "rdp_relative_gaussian-mixed": (
        jaxrdp.rdp_relative_gaussian, (ORDERS,), dict(eta=0.01, gamma=GAMMA, dim=3),
        dict(eta=0.01, gamma=GAMMA, dim=3, orders=ORDERS)),
    "rdp_relative_gaussian_descent": (
        jaxrdp.rdp_relative_gaussian_descent, (ORDERS, 0.01, GAMMA, 3, 40), {},
        dict(eta=0.01, gamma=GAMMA, dim=3, steps=40, orders=ORDERS)),
    "rdp_zcdp": (
        jaxrdp.rdp_zcdp, (0.1, ORDERS, 0.05), {}, dict(rho=0.1, orders=ORDERS, xi=0.05)),
    "optimize_schedule": (
        jaxrdp.optimize_schedule, (_U, _SIGMA, _Q, 100.0), _SCHEDULE,
        dict(utility=_U, sampling_rate=_Q, noise_multiplier=_SIGMA, steps=100.0, **_SCHEDULE)),
    "optimize_schedule-mixed": (
        jaxrdp.optimize_schedule, (_U, _SIGMA, _Q), dict(steps=100.0, **_SCHEDULE),
        dict(utility=_U, sampling_rate=_Q, noise_multiplier=_SIGMA, steps=100.0, **_SCHEDULE)),
    "sweep_noise_multiplier": (
        jaxrdp.sweep_noise_multiplier,
        (np.array([1.0, 2.0]), np.array([0.01, 0.02, 0.05]), np.array([100.0]),
         np.array([1e-5, 1e-6])),
        _SWEEP,
        dict(target_epsilons=np.array([1.0, 2.0]), deltas=np.array([1e-5, 1e-6]),
             sampling_rates=np.array([0.01, 0.02, 0.05]), steps=np.array([100.0]), **_SWEEP)),
}


def _values(result):
  return [np.asarray(v) for v in (result if isinstance(result, tuple) else (result,))]


@pytest.mark.parametrize("case", sorted(OLD_FORMS))
def test_old_positional_form_warns_keeps_its_meaning_and_says_the_new_call(case):
  fn, args, old_kwargs, new_kwargs = OLD_FORMS[case]
  with pytest.warns(DeprecationWarning, match="read in the 0.1.0 order") as record:
    old = fn(*args, **old_kwargs)
  new = _new_form(fn, **new_kwargs)
  for a, b in zip(_values(old), _values(new), strict=True):
    np.testing.assert_array_equal(a, b)
  # The call the warning says to write, run on the same values, is the new form: same value.
  message = str([w for w in record if issubclass(w.category, DeprecationWarning)][0].message)
  written = re.search(r"; write (.*\)), which means the same", message).group(1)
  assert written.startswith(fn.__name__ + "(")
  names = dict(zip(fn.__jaxrdp_old_order__, args), rest=old_kwargs, **{fn.__name__: fn})
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    rewritten = eval(written.replace(", ...)", ", **rest)"), {}, names)  # pylint: disable=eval-used
  for a, b in zip(_values(rewritten), _values(new), strict=True):
    np.testing.assert_array_equal(a, b)


def test_old_forms_agree_with_values_computed_independently():
  # ξ + ρα (Bun–Steinke 2016, Def. 1.1), by hand.
  with pytest.warns(DeprecationWarning):
    zcdp = jaxrdp.rdp_zcdp(0.1, ORDERS, 0.05)
  np.testing.assert_allclose(zcdp, 0.05 + 0.1 * ORDERS, rtol=1e-15)
  # The seed paper's value at α = 2, η = 0.01, γ = η√20, d = 1 (its notes: 0.0512).
  with pytest.warns(DeprecationWarning):
    rgm = jaxrdp.rdp_relative_gaussian(2.0, 0.01, GAMMA, 1)
  assert float(rgm) == pytest.approx(0.0512, abs=5e-5)
  # 0.1.0's optimize_schedule took σ before q: the result holds q where the call put it.
  fn, args, kwargs, _ = OLD_FORMS["optimize_schedule"]
  with pytest.warns(DeprecationWarning):
    result = fn(*args, **kwargs)
  np.testing.assert_array_equal(result.sampling_rate, [0.01, 0.02])
  assert float(result.epsilon) <= 2.0
  # ... and sweep_noise_multiplier's cells are calibrate_noise_multiplier's, axes (E, Q, T, D).
  fn, args, kwargs, _ = OLD_FORMS["sweep_noise_multiplier"]
  with pytest.warns(DeprecationWarning):
    sigma = np.asarray(fn(*args, **kwargs))
  assert sigma.shape == (2, 3, 1, 2)
  ref = jaxrdp.calibrate_noise_multiplier(2.0, 1e-6, 0.05, 100.0)
  assert sigma[1, 2, 0, 1] == pytest.approx(float(ref), rel=1e-9)


def test_old_keyword_alpha_warns_and_means_orders():
  new = _new_form(jaxrdp.rdp_relative_gaussian, eta=0.01, gamma=GAMMA, dim=3, orders=ORDERS)
  with pytest.warns(DeprecationWarning, match="write orders=alpha"):
    old = jaxrdp.rdp_relative_gaussian(alpha=ORDERS, eta=0.01, gamma=GAMMA, dim=3)
  np.testing.assert_array_equal(old, new)
  with pytest.warns(DeprecationWarning, match="write orders=alpha"):
    old = jaxrdp.rdp_relative_gaussian_descent(alpha=ORDERS, eta=0.01, gamma=GAMMA, dim=3, steps=4)
  np.testing.assert_array_equal(old, 4 * new)


# Reordered parameters are keyword-only for this release: no positional call can be read in the
# new order, so nothing is guessed from the values.
DEPRECATED = {"rdp_relative_gaussian", "rdp_relative_gaussian_descent", "rdp_zcdp",
              "optimize_schedule", "sweep_noise_multiplier"}


def test_the_functions_with_old_forms_are_the_ones_expected():
  have = {n for n in jaxrdp.__all__ if hasattr(getattr(jaxrdp, n), "__jaxrdp_old_order__")}
  assert have == DEPRECATED


@pytest.mark.parametrize("name", sorted(DEPRECATED))
def test_moved_parameters_cannot_be_passed_by_position_in_the_new_order(name):
  fn = getattr(jaxrdp, name)
  old = fn.__jaxrdp_old_order__
  positional = [p.name for p in _params(fn) if p.kind is p.POSITIONAL_OR_KEYWORD]
  assert list(old[:len(positional)]) == positional   # unchanged where nothing moved
  for p in _params(fn)[len(positional):]:
    assert p.kind is p.KEYWORD_ONLY, p.name


def test_a_positional_call_in_the_new_order_is_never_read_silently():
  # (eta, gamma, dim, orders) by position is not the 1.0 form: it is read as 0.1.0's
  # (alpha, eta, gamma, dim), loudly, and turning the warning into an error stops it.
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    with pytest.raises(DeprecationWarning, match="rdp_relative_gaussian"):
      jaxrdp.rdp_relative_gaussian(0.01, GAMMA, 3, 2.0)
    with pytest.raises(DeprecationWarning, match="optimize_schedule"):
      jaxrdp.optimize_schedule(_U, _Q, _SIGMA, 100.0, **_SCHEDULE)
    with pytest.raises(DeprecationWarning, match="sweep_noise_multiplier"):
      jaxrdp.sweep_noise_multiplier([1.0], [1e-5], [0.01], [100.0])


@pytest.mark.parametrize("call,match", [
    (lambda: jaxrdp.rdp_relative_gaussian(ORDERS, 0.01, GAMMA, 3, 4), "at most 4 positional"),
    (lambda: jaxrdp.rdp_relative_gaussian(ORDERS, 0.01, gamma=GAMMA, dim=3, orders=ORDERS),
     "multiple values for argument 'orders'"),
    (lambda: jaxrdp.rdp_relative_gaussian(alpha=ORDERS, orders=ORDERS, eta=0.01, gamma=GAMMA,
                                          dim=3),
     "got both 'alpha'"),
    (lambda: jaxrdp.rdp_zcdp(0.1, ORDERS, 0.05, 1.0), "at most 3 positional"),
    (lambda: jaxrdp.rdp_zcdp(0.1, ORDERS, 0.05, xi=0.05), "multiple values for argument 'xi'"),
])
def test_ambiguous_mixtures_raise_type_error(call, match):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    with pytest.raises(TypeError, match=match):
      call()


def test_new_forms_work_under_jit_vmap_and_grad():
  rgm = lambda g, a: jaxrdp.rdp_relative_gaussian(eta=0.01, gamma=g, dim=3.0, orders=a)
  eager = _new_form(jaxrdp.rdp_relative_gaussian, eta=0.01, gamma=GAMMA, dim=3.0, orders=ORDERS)
  np.testing.assert_allclose(jax.jit(rgm)(GAMMA, ORDERS), eager, rtol=1e-15)
  np.testing.assert_allclose(jax.vmap(rgm, in_axes=(None, 0))(GAMMA, ORDERS), eager, rtol=1e-15)
  assert float(jax.grad(rgm)(GAMMA, 2.0)) < 0   # more noise per unit norm, less privacy loss
  zcdp = jax.jit(lambda r, a: jaxrdp.rdp_zcdp(r, a, xi=0.05))(0.1, ORDERS)
  np.testing.assert_allclose(zcdp, 0.05 + 0.1 * ORDERS, rtol=1e-15)
