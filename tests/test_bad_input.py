"""Bad input, table-driven, over every public name of ``jaxrdp`` and every CLI subcommand.

Specification:

* **Eager calls** with an invalid value (below or above the allowed range, NaN, ±inf where not
  allowed, an empty array, an array with one bad entry, a non-broadcastable or wrongly shaped
  array) raise ``ValueError``; with a value of the wrong type (complex, bool, string, None, a
  float where an int fixes a shape) they raise ``TypeError``. Either way the message names the
  argument. A function never returns a silent NaN for an eager call.
* **Under ``jax.jit``** the values are tracers and cannot be inspected, so the eager checks do
  not run: the numeric functions return NaN for invalid values (NaN propagation, never a
  plausible number). Checks that depend only on shapes, dtypes and static arguments still raise
  at trace time.
* **The CLI** (``jaxrdp.cli.main``) exits with status 2 and prints one line,
  ``jaxrdp: error: ...``, naming the flag; never a traceback.

``TABLE`` must list every name of ``jaxrdp.__all__`` except the commented exclusions, so a new
public function cannot be added without its bad-input cases (``test_table_covers_the_public_api``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxrdp
from jaxrdp._internal.domains import DOMAINS
from jaxrdp.cli import main as cli

NAN, INF = float("nan"), float("inf")


@dataclasses.dataclass(frozen=True)
class Bad:
  """One invalid value for one argument, the exception it must raise, and an optional label."""
  value: Any
  error: type
  label: str = ""
  others: dict | None = None   # other arguments changed along with this one (shape clashes)


def real(valid, *, lo=None, hi=None, lo_open=False, hi_open=False, inf_ok=False, nan_ok=False,
         none_ok=False):
  """The invalid values of a real argument with the allowed range [lo, hi] (ends open as asked).

  ``valid`` is a valid value, used to build arrays with a single bad entry; ``none_ok`` for
  optional arguments (None selects the default).
  """
  out = []
  if lo is not None:
    out.append(Bad(lo if lo_open else lo - 1.0, ValueError, "below range"))
    if lo_open and lo != 0:
      out.append(Bad(lo - 1.0, ValueError, "below range"))
    if lo == 0 and not lo_open:
      out.append(Bad(-1e-300, ValueError, "tiny negative"))
    out.append(Bad(np.array([valid, lo - 1.0]), ValueError, "one bad entry"))
  if hi is not None:
    out.append(Bad(hi if hi_open else hi + 0.5, ValueError, "above range"))
  if not nan_ok:
    out.append(Bad(NAN, ValueError, "nan"))
    out.append(Bad(np.array([valid, NAN]), ValueError, "one nan entry"))
  if not inf_ok or hi is not None:
    out.append(Bad(INF, ValueError, "inf"))
  out.append(Bad(-INF, ValueError, "-inf"))
  out += [Bad(0.5 + 0.5j, TypeError, "complex"), Bad(np.array([1 + 1j]), TypeError, "complex array"),
          Bad(True, TypeError, "bool"), Bad(np.array([True]), TypeError, "bool array"),
          Bad("0.5", TypeError, "string"), Bad(np.array([]), ValueError, "empty")]
  if not none_ok:
    out.append(Bad(None, TypeError, "None"))
  return out


def clash(value, **others):
  """A shape that does not broadcast against the ``others`` (the message may name any of them)."""
  return Bad(np.asarray(value), ValueError, "shapes do not broadcast", others)


def static_int(lo, *, hi=None):
  """Invalid values of an int that fixes a shape or a loop count."""
  out = [Bad(lo - 1, ValueError, "below range"), Bad(2.5, TypeError, "float"),
         Bad(NAN, TypeError, "nan"), Bad(True, TypeError, "bool"), Bad("3", TypeError, "string"),
         Bad(None, TypeError, "None"), Bad(np.array([]), TypeError, "empty")]
  if hi is not None:
    out.append(Bad(hi + 1, ValueError, "above range"))
  return out


NOT_CALLABLE = [Bad(3.0, TypeError, "not callable"), Bad(None, TypeError, "None")]
BAD_METHOD = [Bad("bogus", ValueError, "unknown method")]
BAD_KEY = [Bad(None, TypeError, "None"), Bad("seed", TypeError, "string"),
           Bad(1.5, TypeError, "float"), Bad(jnp.zeros((3,), jnp.uint32), ValueError, "wrong shape")]
ORDERS_2D = Bad(np.full((2, 2), 2.0), ValueError, "2-D")


@dataclasses.dataclass(frozen=True)
class Api:
  """A public function, a valid call (by keyword) and the invalid values of each argument."""
  fn: Callable
  valid: dict
  bad: dict


def _params():
  return {"w": jnp.zeros((2,))}


def _loss(params, example):
  return jnp.sum(params["w"] * example)


def _state():
  tx = jaxrdp.differentially_private_aggregate(1.0, 1.0, 0, sampling_rate=0.01,
                                               expected_batch_size=10.0, orders=[2.0, 8.0])
  return tx.init(_params())


SCHEDULE_2D = Bad(np.full((2, 2), 0.01), ValueError, "2-D schedule")
MISMATCHED = Bad(np.array([0.01, 0.02, 0.03]), ValueError, "schedules of different lengths")

BAD_ACCOUNTANT = [Bad("bogus", ValueError, "unknown accountant")]
NOT_A_GRID = [Bad((1e-4, 128, 512, 1e-15), TypeError, "a tuple, not a PldGrid")]


def _pld_api(fn, last, last_value, last_bad):
  """A PLD accountant function: the schedule's arguments, then ``last`` (delta or epsilon)."""
  return Api(fn, {"sampling_rate": 0.01, "noise_multiplier": 1.0, "steps": 100, last: last_value},
             {"sampling_rate": real(0.01, lo=0, hi=1) + [SCHEDULE_2D],
              "noise_multiplier": real(1.0, lo=0) + [clash([1.0, 2.0], sampling_rate=[0.1, 0.2, 0.3])],
              "steps": real(100, lo=0) + [Bad(2.5, ValueError, "not a whole number")],
              last: last_bad, "pld_grid": NOT_A_GRID})


def _mixture_api(fn, last, last_value, last_bad):
  """A mixture-of-Gaussians PLD function: s, c, p and T, then ``last`` (delta or epsilon)."""
  return Api(fn, {"standard_deviation": 1.0, "sensitivities": [0.0, 1.0],
                  "probabilities": [0.9, 0.1], "steps": 100, last: last_value},
             {"standard_deviation": real(1.0, lo=0, lo_open=True),
              "sensitivities": real(1.0, lo=0) + [Bad(np.zeros(2), ValueError, "none positive"),
                                                  Bad([1.0, 2.0, 3.0], ValueError, "shape")],
              "probabilities": real(0.5, lo=0, hi=1) + [Bad([0.5, 0.1], ValueError, "sum")],
              "steps": real(100, lo=0) + [Bad(2.5, ValueError, "not a whole number")],
              last: last_bad, "pld_grid": NOT_A_GRID})


TABLE = {
    "pld_epsilon": _pld_api(jaxrdp.pld_epsilon, "delta", 1e-5,
                            real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True)),
    "pld_delta": _pld_api(jaxrdp.pld_delta, "epsilon", 1.0, real(1.0, lo=0, inf_ok=True)),
    "mixture_of_gaussians_epsilon": _mixture_api(jaxrdp.mixture_of_gaussians_epsilon, "delta",
                                                 1e-5, real(1e-5, lo=0, hi=1, lo_open=True,
                                                            hi_open=True)),
    "mixture_of_gaussians_delta": _mixture_api(jaxrdp.mixture_of_gaussians_delta, "epsilon", 1.0,
                                               real(1.0, lo=0, inf_ok=True)),
    "mixture_of_gaussians_grid": Api(
        jaxrdp.mixture_of_gaussians_grid,
        dict(standard_deviation=1.0, sensitivities=[0.0, 1.0], probabilities=[0.9, 0.1],
             steps=100, interval=1e-4, tail_mass=1e-15, delta=1e-5),
        dict(standard_deviation=real(1.0, lo=0, lo_open=True),
             interval=real(1e-4, lo=0, hi=1, lo_open=True),
             tail_mass=real(1e-15, lo=0, hi=1, lo_open=True, hi_open=True),
             delta=real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True, none_ok=True))),
    "pld_grid": Api(
        jaxrdp.pld_grid,
        dict(sampling_rate=0.01, noise_multiplier=1.0, steps=100, interval=1e-4, tail_mass=1e-15,
             delta=1e-5),
        dict(sampling_rate=real(0.01, lo=0, hi=1),
             noise_multiplier=real(1.0, lo=0),
             steps=real(100, lo=0),
             interval=real(1e-4, lo=0, hi=1, lo_open=True),
             tail_mass=real(1e-15, lo=0, hi=1, lo_open=True, hi_open=True),
             delta=real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True, none_ok=True))),
    "calibrate_noise_multiplier": Api(
        jaxrdp.calibrate_noise_multiplier,
        dict(target_epsilon=2.0, delta=1e-5, sampling_rate=0.01, steps=1000, orders=[2.0, 8.0]),
        dict(target_epsilon=real(2.0, lo=0, lo_open=True),
             delta=real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True),
             sampling_rate=real(0.01, lo=0, hi=1) + [SCHEDULE_2D],
             steps=real(1000, lo=0) + [clash([10, 20, 30], sampling_rate=[0.01, 0.02])],
             orders=real(2.0, lo=1, inf_ok=True, none_ok=True) + [ORDERS_2D],
             accountant=BAD_ACCOUNTANT)),
    "calibrate_sampling_rate": Api(
        jaxrdp.calibrate_sampling_rate,
        dict(target_epsilon=2.0, delta=1e-5, noise_multiplier=1.0, steps=1000, orders=[2.0, 8.0]),
        dict(target_epsilon=real(2.0, lo=0, lo_open=True),
             delta=real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True),
             noise_multiplier=real(1.0, lo=0) + [SCHEDULE_2D],
             steps=real(1000, lo=0),
             orders=real(2.0, lo=1, inf_ok=True, none_ok=True) + [ORDERS_2D],
             accountant=BAD_ACCOUNTANT)),
    "calibrate_steps": Api(
        jaxrdp.calibrate_steps,
        dict(target_epsilon=2.0, delta=1e-5, sampling_rate=0.01, noise_multiplier=1.0,
             max_steps=10 ** 6, orders=[2.0, 8.0]),
        dict(target_epsilon=real(2.0, lo=0, lo_open=True),
             delta=real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True),
             sampling_rate=real(0.01, lo=0, hi=1),
             noise_multiplier=real(1.0, lo=0),
             max_steps=static_int(1),
             orders=real(2.0, lo=1, inf_ok=True, none_ok=True) + [ORDERS_2D])),
    "clipped_grad_sum": Api(
        jaxrdp.clipped_grad_sum,
        dict(loss_fn=_loss, params=_params(), batch=jnp.ones((4, 2)), l2_norm_clip=1.0,
             mask=jnp.ones((4,), bool), microbatch_size=2),
        dict(loss_fn=NOT_CALLABLE,
             batch=[Bad(jnp.ones(()), ValueError, "no batch axis"),
                    Bad({"a": jnp.ones((4, 2)), "b": jnp.ones((3, 2))}, ValueError, "mismatched batch"),
                    Bad({}, ValueError, "empty pytree")],
             l2_norm_clip=[b for b in real(1.0, lo=0) if b.label != "one bad entry"],
             mask=[Bad(jnp.ones((4,)), TypeError, "float mask"),
                   Bad(jnp.ones((5,), bool), ValueError, "wrong length")],
             microbatch_size=[Bad(0, ValueError, "zero"), Bad(-1, ValueError, "negative"),
                              Bad(2.5, ValueError, "float"), Bad(True, ValueError, "bool")])),
    "compute_delta": Api(
        jaxrdp.compute_delta,
        dict(orders=np.array([2.0, 8.0]), rdp=np.array([0.1, 0.5]), epsilon=1.0, method="improved"),
        dict(orders=real(2.0, lo=1, inf_ok=True, nan_ok=True) + [ORDERS_2D],
             rdp=[b for b in real(0.1, lo=0, inf_ok=True, nan_ok=True) if b.label != "one bad entry"]
             + [Bad(np.array([0.1, 0.2, 0.3]), ValueError, "length differs from orders")],
             epsilon=real(1.0, lo=0, inf_ok=True) + [clash([1.0, 2.0, 3.0], rdp=np.full((2, 2), 0.1))],
             method=BAD_METHOD)),
    "compute_epsilon": Api(
        jaxrdp.compute_epsilon,
        dict(orders=np.array([2.0, 8.0]), rdp=np.array([0.1, 0.5]), delta=1e-5, method="improved"),
        dict(orders=real(2.0, lo=1, inf_ok=True, nan_ok=True) + [ORDERS_2D],
             rdp=[b for b in real(0.1, lo=0, inf_ok=True, nan_ok=True) if b.label != "one bad entry"]
             + [Bad(np.array([0.1, 0.2, 0.3]), ValueError, "length differs from orders")],
             delta=real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True)
             + [clash([1e-5, 1e-6, 1e-7], rdp=np.full((2, 2), 0.1))],
             method=BAD_METHOD)),
    "compute_rdp": Api(
        jaxrdp.compute_rdp,
        dict(q=0.01, noise_multiplier=1.0, steps=100, orders=np.array([2.0, 8.0])),
        dict(q=real(0.01, lo=0, hi=1) + [clash([0.1, 0.2, 0.3], noise_multiplier=[1.0, 2.0])],
             noise_multiplier=real(1.0, lo=0) + [clash([1.0, 2.0], steps=[1, 2, 3])],
             steps=real(100, lo=0),
             orders=real(2.0, lo=1, inf_ok=True) + [ORDERS_2D])),
    "differentially_private_aggregate": Api(
        jaxrdp.differentially_private_aggregate,
        dict(l2_norm_clip=1.0, noise_multiplier=1.0, key=0, sampling_rate=0.01,
             expected_batch_size=10.0, orders=[2.0, 8.0]),
        dict(l2_norm_clip=real(1.0, lo=0) + [Bad(np.ones((2,)), ValueError, "not a scalar")],
             noise_multiplier=real(1.0, lo=0),
             key=BAD_KEY,
             sampling_rate=real(0.01, lo=0, hi=1, lo_open=True),
             expected_batch_size=real(10.0, lo=0, lo_open=True),
             orders=real(2.0, lo=1, inf_ok=True, none_ok=True) + [ORDERS_2D],
             accountant_dtype=[Bad(jnp.int32, TypeError, "integer dtype")],
             pld_phases=static_int(0))),
    "dpsgd": Api(
        jaxrdp.dpsgd,
        dict(learning_rate=0.1, l2_norm_clip=1.0, noise_multiplier=1.0, key=0, sampling_rate=0.01,
             expected_batch_size=10.0, momentum=0.9, orders=[2.0, 8.0]),
        dict(learning_rate=[Bad(NAN, ValueError, "nan"), Bad(INF, ValueError, "inf"),
                            Bad(1j, TypeError, "complex"), Bad("0.1", TypeError, "string"),
                            Bad(None, TypeError, "None")],
             l2_norm_clip=real(1.0, lo=0),
             noise_multiplier=real(1.0, lo=0),
             key=BAD_KEY,
             sampling_rate=real(0.01, lo=0, hi=1, lo_open=True),
             expected_batch_size=real(10.0, lo=0, lo_open=True),
             momentum=[Bad(NAN, ValueError, "nan"), Bad(INF, ValueError, "inf"),
                       Bad(1j, TypeError, "complex"), Bad("0.9", TypeError, "string")],
             orders=real(2.0, lo=1, inf_ok=True, none_ok=True))),
    "dpsgd_epsilon": Api(
        jaxrdp.dpsgd_epsilon,
        dict(sampling_rate=0.01, noise_multiplier=1.0, steps=100, delta=1e-5, orders=[2.0, 8.0]),
        dict(sampling_rate=real(0.01, lo=0, hi=1) + [SCHEDULE_2D],
             noise_multiplier=real(1.0, lo=0) + [clash([1.0, 2.0], sampling_rate=[0.1, 0.2, 0.3])],
             steps=real(100, lo=0) + [clash([1, 2, 3], noise_multiplier=[1.0, 2.0])],
             delta=real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True),
             orders=real(2.0, lo=1, inf_ok=True, none_ok=True),
             accountant=BAD_ACCOUNTANT)),
    "epsilon_trajectory": Api(
        jaxrdp.epsilon_trajectory,
        dict(sampling_rate=0.01, noise_multiplier=1.0, steps=100, delta=1e-5, at_steps=[10, 100],
             orders=[2.0, 8.0]),
        dict(sampling_rate=real(0.01, lo=0, hi=1),
             noise_multiplier=real(1.0, lo=0),
             steps=real(100, lo=0),
             delta=real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True),
             at_steps=real(10, lo=0),
             orders=real(2.0, lo=1, inf_ok=True, none_ok=True))),
    "log_a": Api(
        jaxrdp.log_a,
        dict(q=0.01, sigma=1.0, alpha=2.0),
        dict(q=real(0.01, lo=0, hi=1) + [clash([0.1, 0.2, 0.3], sigma=[1.0, 2.0])],
             sigma=real(1.0, lo=0) + [clash([1.0, 2.0], alpha=[2.0, 3.0, 4.0])],
             alpha=real(2.0, lo=1, inf_ok=True))),
    "optimize_schedule": Api(
        jaxrdp.optimize_schedule,
        dict(utility=lambda s, q: jnp.sum(s ** 2), sampling_rate=0.01,
             noise_multiplier=[1.0, 1.0], steps=[50, 50], target_epsilon=2.0, delta=1e-5,
             num_iterations=2, orders=[2.0, 8.0]),
        dict(utility=NOT_CALLABLE,
             sampling_rate=real(0.01, lo=0, hi=1) + [SCHEDULE_2D],
             noise_multiplier=real(1.0, lo=0, lo_open=True),
             steps=real(50, lo=0),
             target_epsilon=real(2.0, lo=0, lo_open=True),
             delta=real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True),
             num_iterations=static_int(0),
             orders=real(2.0, lo=1, inf_ok=True, none_ok=True),
             design=[Bad("sigma", ValueError, "unknown design")],
             accountant=BAD_ACCOUNTANT,
             key=[b for b in BAD_KEY if b.value is not None],
             family=[Bad("linear", ValueError, "unknown family")],
             degree=static_int(1),
             pld_grid=[Bad(jaxrdp.pld_grid(0.01, 1.0, 100), ValueError, "with the RDP accountant")])),
    "noisy_sgd_utility": Api(
        jaxrdp.noisy_sgd_utility,
        dict(steps=[50, 50], learning_rate=0.1, l2_norm_clip=1.0, dataset_size=1000,
             curvature=0.1),
        dict(steps=real(50, lo=0) + [Bad(2.5, ValueError, "not a whole number"), SCHEDULE_2D],
             learning_rate=real(0.1, lo=0) + [Bad(np.full(3, 0.1), ValueError, "wrong length")],
             l2_norm_clip=real(1.0, lo=0, lo_open=True) + [Bad(np.ones(2), ValueError, "not scalar")],
             dataset_size=static_int(1),
             curvature=real(0.1, lo=0) + [Bad(30.0, ValueError, "unstable: curvature * rate > 2")])),
    "poisson_max_batch_size": Api(
        jaxrdp.poisson_max_batch_size,
        dict(dataset_size=1000, sampling_rate=0.01, overflow_probability=1e-12),
        dict(dataset_size=static_int(1),
             sampling_rate=real(0.01, lo=0, hi=1, lo_open=True),
             overflow_probability=real(1e-12, lo=0, hi=1, hi_open=True))),
    "poisson_overflow_probability": Api(
        jaxrdp.poisson_overflow_probability,
        dict(dataset_size=1000, sampling_rate=0.01, max_batch_size=50),
        dict(dataset_size=static_int(0),
             sampling_rate=real(0.01, lo=0, hi=1),
             max_batch_size=static_int(0))),
    "poisson_sample": Api(
        jaxrdp.poisson_sample,
        dict(key=jax.random.key(0), dataset_size=1000, sampling_rate=0.01, max_batch_size=100,
             max_overflow_probability=1e-12),
        dict(key=[Bad(None, TypeError, "None"), Bad(3, TypeError, "int seed"),
                  Bad("seed", TypeError, "string"), Bad(1.5, TypeError, "float")],
             dataset_size=static_int(1),
             sampling_rate=real(0.01, lo=0, hi=1, lo_open=True)
             + [Bad(np.full((2,), 0.01), ValueError, "not a scalar")],
             max_batch_size=static_int(1),
             max_overflow_probability=real(1e-12, lo=0, hi=1))),
    "fixed_sample": Api(
        jaxrdp.fixed_sample,
        dict(key=jax.random.key(0), dataset_size=1000, batch_size=100),
        dict(key=[Bad(None, TypeError, "None"), Bad(3, TypeError, "int seed"),
                  Bad("seed", TypeError, "string"), Bad(1.5, TypeError, "float")],
             dataset_size=static_int(1),
             batch_size=static_int(1, hi=1000))),
    "poisson_truncation_delta": Api(
        jaxrdp.poisson_truncation_delta,
        dict(dataset_size=1000, sampling_rate=0.01, max_batch_size=50, steps=100, epsilon=1.0),
        dict(dataset_size=static_int(0),
             sampling_rate=real(0.01, lo=0, hi=1),
             max_batch_size=static_int(0),
             steps=real(100, lo=0),
             epsilon=real(1.0, lo=0, inf_ok=True))),
    "privacy_spent": Api(
        jaxrdp.privacy_spent,
        dict(opt_state=_state(), delta=1e-5, orders=[2.0]),
        dict(opt_state=[Bad(optax.sgd(0.1).init(_params()), ValueError, "no accountant"),
                        Bad(None, ValueError, "None")],
             delta=real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True),
             orders=real(2.0, lo=1, inf_ok=True, none_ok=True)
             + [Bad([3.0], ValueError, "not an accountant order")],
             accountant=BAD_ACCOUNTANT)),
    "pure_dp_to_zcdp": Api(
        jaxrdp.pure_dp_to_zcdp,
        dict(epsilon=1.0),
        dict(epsilon=real(1.0, lo=0, inf_ok=True))),
    "rdp_gaussian": Api(
        jaxrdp.rdp_gaussian,
        dict(noise_multiplier=1.0, orders=2.0),
        dict(noise_multiplier=real(1.0, lo=0) + [clash([1.0, 2.0, 3.0], orders=[2.0, 3.0])],
             orders=real(2.0, lo=1, inf_ok=True))),
    "rdp_laplace": Api(
        jaxrdp.rdp_laplace,
        dict(scale=1.0, orders=2.0),
        dict(scale=real(1.0, lo=0) + [clash([1.0, 2.0], orders=[2.0, 3.0, 4.0])],
             orders=real(2.0, lo=1, inf_ok=True))),
    "rdp_randomized_response": Api(
        jaxrdp.rdp_randomized_response,
        dict(p=0.75, orders=2.0),
        dict(p=real(0.75, lo=0.5, hi=1) + [clash([0.6, 0.7], orders=[2.0, 3.0, 4.0])],
             orders=real(2.0, lo=1, inf_ok=True))),
    "rdp_relative_gaussian": Api(
        jaxrdp.rdp_relative_gaussian,
        dict(eta=0.1, gamma=1.0, dim=10, orders=2.0),
        dict(eta=real(0.1, lo=0, lo_open=True),
             gamma=real(1.0, lo=0, lo_open=True),
             dim=real(10, lo=1) + [Bad(2.5, ValueError, "not an integer"),
                                   clash([10, 20], orders=[2.0, 3.0, 4.0])],
             orders=real(2.0, lo=1, inf_ok=True))),
    "rdp_relative_gaussian_descent": Api(
        jaxrdp.rdp_relative_gaussian_descent,
        dict(eta=0.1, gamma=1.0, dim=10, steps=100, orders=2.0),
        dict(eta=real(0.1, lo=0, lo_open=True),
             gamma=real(1.0, lo=0, lo_open=True),
             dim=real(10, lo=1) + [Bad(2.5, ValueError, "not an integer")],
             steps=real(100, lo=0) + [clash([1, 2], orders=[2.0, 3.0, 4.0])],
             orders=real(2.0, lo=1, inf_ok=True))),
    "rdp_sampled_gaussian": Api(
        jaxrdp.rdp_sampled_gaussian,
        dict(q=0.01, noise_multiplier=1.0, orders=2.0),
        dict(q=real(0.01, lo=0, hi=1) + [clash([0.01, 0.02], orders=[2.0, 3.0, 4.0])],
             noise_multiplier=real(1.0, lo=0),
             orders=real(2.0, lo=1, inf_ok=True))),
    "rdp_sampled_gaussian_closed_form": Api(
        jaxrdp.rdp_sampled_gaussian_closed_form,
        dict(sampling_rate=0.01, noise_multiplier=5.0, orders=2.0),
        dict(sampling_rate=real(0.01, lo=0, hi=1) + [clash([0.01, 0.02], orders=[2.0, 3.0, 4.0])],
             noise_multiplier=real(5.0, lo=0),
             orders=real(2.0, lo=1, inf_ok=True))),
    "rdp_sampled_gaussian_without_replacement": Api(
        jaxrdp.rdp_sampled_gaussian_without_replacement,
        dict(sampling_rate=0.01, noise_multiplier=1.0, orders=2.0, max_order=8),
        dict(sampling_rate=real(0.01, lo=0, hi=1) + [clash([0.01, 0.02], orders=[2.0, 3.0, 4.0])],
             noise_multiplier=real(1.0, lo=0),
             orders=real(2.0, lo=1, inf_ok=True),
             max_order=[b for b in static_int(2, hi=65536) if b.label != "None"])),
    "rdp_spent": Api(
        jaxrdp.rdp_spent,
        dict(opt_state=_state()),
        dict(opt_state=[Bad(optax.sgd(0.1).init(_params()), ValueError, "no accountant"),
                        Bad((_state(), _state()), ValueError, "two accountants")])),
    "rdp_tcdp": Api(
        jaxrdp.rdp_tcdp,
        dict(rho=0.1, omega=10.0, orders=2.0),
        dict(rho=real(0.1, lo=0) + [clash([0.1, 0.2], omega=[5.0, 6.0, 7.0])],
             omega=real(10.0, lo=1, lo_open=True, inf_ok=True),
             orders=real(2.0, lo=1, inf_ok=True))),
    "rdp_zcdp": Api(
        jaxrdp.rdp_zcdp,
        dict(rho=0.1, orders=2.0, xi=0.0),
        dict(rho=real(0.1, lo=0) + [clash([0.1, 0.2], orders=[2.0, 3.0, 4.0])],
             orders=real(2.0, lo=1, inf_ok=True), xi=real(0.0, lo=0))),
    "relative_gaussian_noise": Api(
        jaxrdp.relative_gaussian_noise,
        dict(eta=0.1, gamma=1.0, sigma=1.0, key=0, r_rel=0.1),
        dict(eta=real(0.1, lo=0, lo_open=True), gamma=real(1.0, lo=0, lo_open=True),
             sigma=real(1.0, lo=0), key=BAD_KEY,
             r_rel=[b for b in real(0.1, lo=0) if b.label != "None"]
             + [Bad(1e3, ValueError, "sigma below gamma * r_rel / eta")])),
    "compiler_options": Api(
        jaxrdp.compiler_options,
        dict(backend="cpu"),
        dict(backend=[Bad("cpuu", ValueError, "unknown backend"), Bad(1, TypeError, "int"),
                      Bad(b"cpu", TypeError, "bytes")])),
    "zcdp_to_delta": Api(
        jaxrdp.zcdp_to_delta,
        dict(rho=0.1, epsilon=1.0),
        dict(rho=real(0.1, lo=0) + [clash([0.1, 0.2], epsilon=[1.0, 2.0, 3.0])],
             epsilon=real(1.0, lo=0, inf_ok=True))),
    "zcdp_to_epsilon": Api(
        jaxrdp.zcdp_to_epsilon,
        dict(rho=0.1, delta=1e-5, method="tight"),
        dict(rho=real(0.1, lo=0) + [clash([0.1, 0.2], delta=[1e-5, 1e-6, 1e-7])],
             delta=real(1e-5, lo=0, hi=1, lo_open=True, hi_open=True),
             method=BAD_METHOD)),
}

# Public names without a bad-input row, and why.
EXCLUDED = {
    # Being written now by other engineers; their modules carry their own bad-input tests.
    "sweep", "sweep_noise_multiplier", "audit_statistics", "audit_transform", "AuditResult",
    "clopper_pearson_upper", "epsilon_lower_bound",
    # Its one argument is a path; a path without a sweep is tested in test_sweep_output.py.
    "read_sweep",
    # NamedTuple containers without behaviour; what they hold is validated where it is consumed
    # (ClippedGradSum by differentially_private_aggregate, see test_clipped_grad_sum_is_checked_...).
    "ClippedGradSum", "DifferentiallyPrivateAggregateState", "RelativeGaussianNoiseState",
    "ScheduleResult", "PldGrid",
    # A constant (test_default_orders_are_read_only).
    "DEFAULT_ORDERS",
}


def _cases():
  for name, api in TABLE.items():
    for arg, bads in api.bad.items():
      for i, bad in enumerate(bads):
        yield pytest.param(name, arg, bad, id=f"{name}-{arg}-{bad.label or i}-{i}")


CASES = list(_cases())


def _names(message, arg):
  return re.search(rf"(?<![\w.]){re.escape(arg)}(?!\w)", message) is not None


def test_table_covers_the_public_api():
  public = set(jaxrdp.__all__)
  missing = public - EXCLUDED - set(TABLE)
  assert not missing, f"public names without bad-input cases: {sorted(missing)}"
  assert set(TABLE) <= public


def test_table_is_large():
  assert len(CASES) >= 300


@pytest.mark.parametrize("name,arg,bad", CASES)
def test_eager_bad_input_raises_naming_the_argument(name, arg, bad):
  api = TABLE[name]
  kwargs = dict(api.valid, **(bad.others or {}), **{arg: bad.value})
  with pytest.raises((ValueError, TypeError)) as info:
    result = api.fn(**kwargs)
    if isinstance(result, optax.GradientTransformation):  # what a transform defers to init
      result.init(_params())
  assert isinstance(info.value, bad.error), f"{type(info.value).__name__}: {info.value}"
  assert _names(str(info.value), arg), str(info.value)


def test_default_orders_are_read_only():
  with pytest.raises(ValueError):
    jaxrdp.DEFAULT_ORDERS[0] = 0.5


def test_clipped_grad_sum_is_checked_where_it_is_consumed():
  params = _params()
  tx = jaxrdp.differentially_private_aggregate(1.0, 1.0, 0, sampling_rate=0.01,
                                               expected_batch_size=10.0, orders=[2.0, 8.0])
  state = tx.init(params)
  for clip, error in ((-1.0, ValueError), (NAN, ValueError), (2.0, ValueError), (1j, TypeError)):
    with pytest.raises(error, match="l2_norm_clip"):
      tx.update(jaxrdp.ClippedGradSum(params, clip), state, params)


# --- under jax.jit: NaN, never a plausible number -----------------------------------------------


def outside(domain, *extra):
  """The values outside ``DOMAINS[domain]`` tried under jit: below the range (and its open lower
  end), above it (and its open upper end), NaN and ±inf where not allowed, then ``extra``."""
  d = DOMAINS[domain]
  out = []
  if d.lo is not None:
    out += ([d.lo] if d.lo_open else []) + [d.lo - 1.0]
  if d.hi is not None:
    out.append(d.hi if d.hi_open else d.hi + 0.5)
  if not d.allow_nan:
    out.append(NAN)
  if not d.allow_inf or d.hi is not None:
    out.append(INF)
  if not d.allow_inf or d.lo is not None:
    out.append(-INF)
  return out + list(extra)


def _grid(order):
  """A traced order grid holding ``order``: 7 orders, the fewest the traced search takes (its
  batches are 8 wide, counting the virtual order 1)."""
  return jnp.stack([order, 3.0, 4.0, 5.0, 6.0, 8.0, 16.0])


_PLD_GRID = jaxrdp.pld_grid(0.01, 1.0, 100)   # static sizes for the valid schedule
# A mixture (0, c) with probabilities (1 − p, p): its scalars c and p are the rows' values.
_MIXTURE = dict(standard_deviation=1.0, sensitivity=1.0, probability=0.1, steps=100.0)
_MIXTURE_GRID = jaxrdp.mixture_of_gaussians_grid(1.0, [0.0, 1.0], [0.9, 0.1], 100.0)
_MIXTURE_OUTSIDE = dict(standard_deviation=outside("standard_deviation"),
                        sensitivity=outside("sensitivities"),
                        probability=outside("probabilities"), steps=outside("steps"))


def _mixture(fn, standard_deviation, sensitivity, probability, steps, **last):
  return fn(standard_deviation, jnp.stack([0.0, sensitivity]),
            jnp.stack([1.0 - probability, probability]), steps, **last, pld_grid=_MIXTURE_GRID)
_SCHEDULE = dict(sampling_rate=0.01, noise_multiplier=1.0, steps=100.0)
_SCHEDULE_OUTSIDE = dict(sampling_rate=outside("sampling_rate"),
                         noise_multiplier=outside("noise_multiplier"), steps=outside("steps"))
_PLD_OUTSIDE = dict(_SCHEDULE_OUTSIDE, steps=outside("steps", 2.5))   # PLD steps are whole


def _curve(fn):
  """``fn`` on a two-order curve whose first order and RDP value are the row's."""
  return lambda orders, rdp, **kw: fn(jnp.stack([orders, 8.0]), jnp.stack([rdp, 0.5]), **kw)


def _phased(fn):
  """``fn`` of a two-phase schedule whose second phase's sampling rate is the row's."""
  def phased(sampling_rate, orders, **kw):
    return fn(jnp.stack([0.01, sampling_rate]), orders=_grid(orders), **kw)
  return phased


# name -> (function of the row's arguments, valid arguments, {argument: invalid values}).
# Every numeric public function (a bracketed suffix marks a second configuration of one), every
# argument with a value domain, every value ``outside`` its domain: under jax.jit each gives
# NaN in every floating output, and the valid arguments give finite numbers.
JIT_TABLE = {
    "log_a": (jaxrdp.log_a, dict(q=0.1, sigma=1.0, alpha=2.0),
              dict(q=outside("sampling_rate"), sigma=outside("noise_multiplier"),
                   alpha=outside("orders"))),
    "rdp_sampled_gaussian": (
        jaxrdp.rdp_sampled_gaussian, dict(q=0.1, noise_multiplier=1.0, orders=2.0),
        dict(q=outside("sampling_rate"), noise_multiplier=outside("noise_multiplier"),
             orders=outside("orders"))),
    "rdp_sampled_gaussian_closed_form": (
        jaxrdp.rdp_sampled_gaussian_closed_form,
        dict(sampling_rate=0.1, noise_multiplier=5.0, orders=2.0),
        dict(sampling_rate=outside("sampling_rate"), noise_multiplier=outside("noise_multiplier"),
             orders=outside("orders"))),
    "rdp_sampled_gaussian_without_replacement": (
        lambda **kw: jaxrdp.rdp_sampled_gaussian_without_replacement(**kw, max_order=8),
        dict(sampling_rate=0.1, noise_multiplier=1.0, orders=2.0),
        dict(sampling_rate=outside("sampling_rate"), noise_multiplier=outside("noise_multiplier"),
             orders=outside("orders"))),
    "rdp_gaussian": (jaxrdp.rdp_gaussian, dict(noise_multiplier=1.0, orders=2.0),
                     dict(noise_multiplier=outside("noise_multiplier"), orders=outside("orders"))),
    "rdp_laplace": (jaxrdp.rdp_laplace, dict(scale=1.0, orders=2.0),
                    dict(scale=outside("scale"), orders=outside("orders"))),
    "rdp_randomized_response": (jaxrdp.rdp_randomized_response, dict(p=0.75, orders=2.0),
                                dict(p=outside("p"), orders=outside("orders"))),
    "rdp_zcdp": (jaxrdp.rdp_zcdp, dict(rho=0.1, orders=2.0, xi=0.0),
                 dict(rho=outside("rho"), orders=outside("orders"), xi=outside("xi"))),
    "rdp_tcdp": (jaxrdp.rdp_tcdp, dict(rho=0.1, omega=10.0, orders=2.0),
                 dict(rho=outside("rho"), omega=outside("omega"), orders=outside("orders"))),
    "zcdp_to_epsilon": (jaxrdp.zcdp_to_epsilon, dict(rho=0.1, delta=1e-5),
                        dict(rho=outside("rho"), delta=outside("delta"))),
    "zcdp_to_delta": (jaxrdp.zcdp_to_delta, dict(rho=0.1, epsilon=1.0),
                      dict(rho=outside("rho"), epsilon=outside("epsilon"))),
    "pure_dp_to_zcdp": (jaxrdp.pure_dp_to_zcdp, dict(epsilon=1.0),
                        dict(epsilon=outside("epsilon"))),
    "rdp_relative_gaussian": (
        jaxrdp.rdp_relative_gaussian, dict(eta=0.1, gamma=1.0, dim=10.0, orders=2.0),
        dict(eta=outside("eta"), gamma=outside("gamma"), dim=outside("dim", 2.5),
             orders=outside("orders"))),
    "rdp_relative_gaussian_descent": (
        jaxrdp.rdp_relative_gaussian_descent,
        dict(eta=0.1, gamma=1.0, dim=10.0, steps=5.0, orders=2.0),
        dict(eta=outside("eta"), gamma=outside("gamma"), dim=outside("dim", 2.5),
             steps=outside("steps"), orders=outside("orders"))),
    "compute_rdp": (
        jaxrdp.compute_rdp, dict(q=0.01, noise_multiplier=1.0, steps=100.0, orders=2.0),
        dict(q=outside("sampling_rate"), noise_multiplier=outside("noise_multiplier"),
             steps=outside("steps"), orders=outside("orders"))),
    "compute_epsilon": (_curve(jaxrdp.compute_epsilon), dict(orders=2.0, rdp=0.1, delta=1e-5),
                        dict(orders=outside("curve_orders"), rdp=outside("rdp"),
                             delta=outside("delta"))),
    "compute_delta": (_curve(jaxrdp.compute_delta), dict(orders=2.0, rdp=0.1, epsilon=1.0),
                      dict(orders=outside("curve_orders"), rdp=outside("rdp"),
                           epsilon=outside("epsilon"))),
    "dpsgd_epsilon": (_phased(jaxrdp.dpsgd_epsilon), dict(_SCHEDULE, delta=1e-5, orders=2.0),
                      dict(_SCHEDULE_OUTSIDE, delta=outside("delta"), orders=outside("orders"))),
    "dpsgd_epsilon[pld]": (
        lambda **kw: jaxrdp.dpsgd_epsilon(**kw, accountant="pld", pld_grid=_PLD_GRID),
        dict(_SCHEDULE, delta=1e-5), dict(_PLD_OUTSIDE, delta=outside("delta"))),
    "pld_epsilon": (lambda **kw: jaxrdp.pld_epsilon(**kw, pld_grid=_PLD_GRID),
                    dict(_SCHEDULE, delta=1e-5), dict(_PLD_OUTSIDE, delta=outside("delta"))),
    "pld_delta": (lambda **kw: jaxrdp.pld_delta(**kw, pld_grid=_PLD_GRID),
                  dict(_SCHEDULE, epsilon=1.0), dict(_PLD_OUTSIDE, epsilon=outside("epsilon"))),
    "mixture_of_gaussians_epsilon": (
        lambda **kw: _mixture(jaxrdp.mixture_of_gaussians_epsilon, **kw),
        dict(_MIXTURE, delta=1e-5), dict(_MIXTURE_OUTSIDE, delta=outside("delta"))),
    "mixture_of_gaussians_delta": (
        lambda **kw: _mixture(jaxrdp.mixture_of_gaussians_delta, **kw),
        dict(_MIXTURE, epsilon=1.0), dict(_MIXTURE_OUTSIDE, epsilon=outside("epsilon"))),
    "calibrate_noise_multiplier": (
        lambda orders, **kw: jaxrdp.calibrate_noise_multiplier(**kw, orders=_grid(orders)),
        dict(target_epsilon=2.0, delta=1e-5, sampling_rate=0.01, steps=100.0, orders=2.0),
        dict(target_epsilon=outside("target_epsilon"), delta=outside("delta"),
             sampling_rate=outside("sampling_rate"), steps=outside("steps"),
             orders=outside("orders"))),
    "calibrate_sampling_rate": (
        lambda orders, **kw: jaxrdp.calibrate_sampling_rate(**kw, orders=_grid(orders)),
        dict(target_epsilon=2.0, delta=1e-5, noise_multiplier=1.0, steps=100.0, orders=2.0),
        dict(target_epsilon=outside("target_epsilon"), delta=outside("delta"),
             noise_multiplier=outside("noise_multiplier"), steps=outside("steps"),
             orders=outside("orders"))),
    "calibrate_steps": (
        lambda orders, **kw: jaxrdp.calibrate_steps(**kw, orders=_grid(orders), max_steps=10 ** 6),
        dict(target_epsilon=2.0, delta=1e-5, sampling_rate=0.01, noise_multiplier=1.0, orders=2.0),
        dict(target_epsilon=outside("target_epsilon"), delta=outside("delta"),
             sampling_rate=outside("sampling_rate"), noise_multiplier=outside("noise_multiplier"),
             orders=outside("orders"))),
    "optimize_schedule": (   # the whole design in the graph (every floating field NaN)
        lambda orders, **kw: jaxrdp.optimize_schedule(
            lambda s, q: jnp.sum(s ** 2), **kw, num_iterations=2, orders=_grid(orders)),
        dict(_SCHEDULE, target_epsilon=2.0, delta=1e-5, orders=2.0),
        dict(sampling_rate=outside("sampling_rate"),
             noise_multiplier=outside("positive_noise_multiplier"), steps=outside("steps"),
             target_epsilon=outside("target_epsilon"), delta=outside("delta"),
             orders=outside("orders"))),
    "epsilon_trajectory": (
        lambda orders, **kw: jaxrdp.epsilon_trajectory(**kw, orders=_grid(orders)),
        dict(_SCHEDULE, delta=1e-5, at_steps=50.0, orders=2.0),
        dict(_SCHEDULE_OUTSIDE, delta=outside("delta"), at_steps=outside("steps"),
             orders=outside("orders"))),
    "privacy_spent": (lambda **kw: jaxrdp.privacy_spent(_state(), **kw),
                      dict(delta=1e-5, orders=2.0),
                      dict(delta=outside("delta"), orders=outside("orders"))),
    "clipped_grad_sum": (   # the gradients; the clip norm it returns is the argument itself
        lambda l2_norm_clip: jaxrdp.clipped_grad_sum(_loss, _params(), jnp.ones((4, 2)),
                                                     l2_norm_clip).grad_sum,
        dict(l2_norm_clip=1.0), dict(l2_norm_clip=outside("l2_norm_clip"))),
}

# Public functions whose arguments set shapes or drive loops on the host: they need concrete
# values, so under jax.jit they raise TypeError at trace time (never return a number).
EAGER_ONLY = {
    "pld_grid": lambda x: jaxrdp.pld_grid(x, 1.0, 100),
    "mixture_of_gaussians_grid": lambda x: jaxrdp.mixture_of_gaussians_grid(x, [0.0, 1.0],
                                                                             [0.9, 0.1], 100),
    "sweep": lambda x: jaxrdp.sweep(x, np.array([1.0]), np.array([10.0]), np.array([1e-5])),
    "sweep_noise_multiplier": lambda x: jaxrdp.sweep_noise_multiplier(
        x, deltas=np.array([1e-5]), sampling_rates=np.array([0.01]), steps=np.array([10.0])),
    "noisy_sgd_utility": lambda x: jaxrdp.noisy_sgd_utility(
        [50, 50], 0.1, l2_norm_clip=x, dataset_size=1000, curvature=0.1),
    "poisson_max_batch_size": lambda x: jaxrdp.poisson_max_batch_size(1000, x),
    "poisson_overflow_probability": lambda x: jaxrdp.poisson_overflow_probability(1000, x, 50),
    "poisson_truncation_delta": lambda x: jaxrdp.poisson_truncation_delta(1000, 0.01, 50, 100, x),
    "clopper_pearson_upper": lambda x: jaxrdp.clopper_pearson_upper(3, 10, x),
    "epsilon_lower_bound": lambda x: jaxrdp.epsilon_lower_bound(3, 3, 10, x),
}

# Public names in neither JIT_TABLE nor EAGER_ONLY, and why.
JIT_EXCLUDED = {
    "read_sweep": "reads files from the host; its argument is a path, not a number",
    **dict.fromkeys(("differentially_private_aggregate", "dpsgd", "relative_gaussian_noise"),
                    "optax transforms: tested in test_transform.py"),
    **dict.fromkeys(("AuditResult", "ClippedGradSum", "DifferentiallyPrivateAggregateState",
                     "PldGrid", "RelativeGaussianNoiseState", "ScheduleResult"),
                    "a NamedTuple: holds values, computes nothing"),
    "DEFAULT_ORDERS": "a constant",
    "compiler_options": "returns compiler options for jax.jit, no number",
    "rdp_spent": "its one argument is an optimizer state, no value with a domain "
                 "(privacy_spent reads the same state and is in the table)",
    "fixed_sample": "returns indices, no number to make NaN; its sizes are static ints (shapes), "
                    "checked eagerly also under jit",
    "poisson_sample": "returns indices and a mask, no number to make NaN: a traced invalid rate "
                      "gives an empty batch (its docstring; test_sampling.py)",
    **dict.fromkeys(("audit_statistics", "audit_transform"),
                    "run a transform's trials from the host, with concrete trial counts"),
}


def _jit_rows(valid, bad):
  """Arrays of equal length: row i has the i-th invalid value, the last row is valid; and
  (argument, value) of each row."""
  rows = [(arg, v) for arg, values in bad.items() for v in values] + [(None, None)]
  return {arg: jnp.array([v if a == arg else valid[arg] for a, v in rows]) for arg in valid}, rows


def test_jit_table_covers_every_numeric_public_function():
  public = set(jaxrdp.__all__)
  tabled = {name.split("[")[0] for name in JIT_TABLE}
  groups = (tabled, set(EAGER_ONLY), set(JIT_EXCLUDED))
  assert not public - set().union(*groups), "public names in no list: add a JIT_TABLE row"
  assert set().union(*groups) <= public
  assert sum(map(len, groups)) == len(set().union(*groups)), "a name listed twice"


# Arguments of JIT_TABLE that still give numbers under jit, in modules with another owner (who
# has the report): skipped by the test below, which fails once they give NaN (then remove them).
OPEN: dict[str, set[str]] = {}


@pytest.mark.parametrize("name", sorted(JIT_TABLE))
def test_under_jit_invalid_values_give_nan(name):
  fn, valid, bad = JIT_TABLE[name]
  args, rows = _jit_rows(valid, bad)
  # One compilation for every row (the rows share shapes). Not jax.vmap: batching the
  # calibrations' searches compiles for ~12 s each, and the contract is about jit.
  jitted = jax.jit(lambda a: fn(**a))
  outs = [jitted({arg: value[i] for arg, value in args.items()}) for i in range(len(rows))]
  out = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *outs)
  leaves = [np.asarray(x).reshape(len(rows), -1) for x in jax.tree_util.tree_leaves(out)
            if jnp.issubdtype(x.dtype, jnp.floating)]
  assert leaves
  numbers = [row for i, row in enumerate(rows[:-1])
             if not all(np.all(np.isnan(x[i])) for x in leaves)]
  open_args = OPEN.get(name, set())
  assert not [row for row in numbers if row[0] not in open_args], f"not NaN under jit: {numbers}"
  assert open_args <= {arg for arg, _ in numbers}, "now NaN: remove from OPEN"
  assert all(np.all(np.isfinite(x[-1])) for x in leaves), [x[-1] for x in leaves]


@pytest.mark.parametrize("name", sorted(EAGER_ONLY))
def test_eager_only_functions_raise_type_error_under_jit(name):
  with pytest.raises(TypeError):
    jax.jit(EAGER_ONLY[name])(0.01)


def _trajectory_of_steps(t):   # one function, so that its two rows below share a compilation
  return jaxrdp.epsilon_trajectory(0.01, 1.1, t, 1e-5, np.array([10.0, 50.0]))


# Issue 33, defect 3: calls that gave a plausible number under jit (the comment), each with the
# default orders (a concrete grid: the path an eager-looking call inside jax.jit takes). A NaN
# entry of at_steps: test_under_jit_an_invalid_at_steps_entry_gives_nan_in_its_place_only.
DEFECTS = {
    "calibrate_noise_multiplier-delta": (   # σ = 1e-4, an unsafe noise multiplier
        lambda d: jaxrdp.calibrate_noise_multiplier(2.0, d, 0.01, 100.0), 1.5),
    "calibrate_noise_multiplier-target_epsilon": (   # σ = 7141
        lambda e: jaxrdp.calibrate_noise_multiplier(e, 1e-5, 0.01, 100.0), -1.0),
    "calibrate_sampling_rate-delta": (   # q = 1
        lambda d: jaxrdp.calibrate_sampling_rate(2.0, d, 1.1, 100.0), 1.5),
    "calibrate_steps-delta": (lambda d: jaxrdp.calibrate_steps(2.0, d, 0.01, 1.0), 1.5),   # 0 steps
    "epsilon_trajectory-steps": (_trajectory_of_steps, -1.0),   # ε = [0, 0]
    "epsilon_trajectory-steps-nan": (_trajectory_of_steps, NAN),   # ε = [0, 0]
    "dpsgd_epsilon-steps-nan": (lambda t: jaxrdp.dpsgd_epsilon(0.01, 1.1, t, 1e-5), NAN),   # +inf
    "compute_epsilon-rdp": (   # ε = 0
        lambda r: jaxrdp.compute_epsilon(np.array([2.0, 4.5, 8.0]), r, 1e-5),
        np.array([-1.0, 0.2, 0.4])),
    "compute_delta-rdp": (   # δ = 0
        lambda r: jaxrdp.compute_delta(np.array([2.0, 4.5, 8.0]), r, 1.0),
        np.array([-1.0, 0.2, 0.4])),
}


@pytest.mark.parametrize("name", sorted(DEFECTS))
def test_under_jit_reported_plausible_numbers_are_nan(name):
  fn, value = DEFECTS[name]
  out = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jit(fn)(value))]
  assert all(np.all(np.isnan(x)) for x in out), out


def test_under_jit_an_invalid_at_steps_entry_gives_nan_in_its_place_only():
  # It gave ε = 0 for NaN and -1 (the prefixes were clipped to valid ones).
  eps = np.asarray(jax.jit(lambda n: jaxrdp.epsilon_trajectory(0.01, 1.1, 100.0, 1e-5, n))(
      np.array([10.0, NAN, -1.0, 50.0])))
  assert np.all(np.isnan(eps[1:3])) and np.all(np.isfinite(eps[[0, 3]])), eps


def test_under_jit_compute_epsilon_gives_nan_for_the_curve_with_a_negative_rdp_only():
  # One curve per row: the second has a negative entry. NaN entries stay allowed (skipped).
  rdp = np.array([[0.1, NAN, 0.5], [0.1, -0.2, 0.5]])
  for fn, last in ((jaxrdp.compute_epsilon, 1e-5), (jaxrdp.compute_delta, 1.0)):
    value, order = jax.jit(lambda r: fn(np.array([2.0, 4.0, 8.0]), r, last))(rdp)
    assert np.isfinite(value[0]) and np.isfinite(order[0]), (fn, value, order)
    assert np.isnan(value[1]) and np.isnan(order[1]), (fn, value, order)


def test_under_jit_the_masks_leave_gradients_at_valid_arguments_finite():
  # The NaN branch of the masks is a constant: derivatives at valid arguments are ε's own.
  args = (0.01, 1.0, 100.0, 1e-5)
  grads = jax.jit(jax.grad(lambda a: jaxrdp.dpsgd_epsilon(*a)))(args)
  np.testing.assert_allclose(grads, jax.grad(lambda a: jaxrdp.dpsgd_epsilon(*a))(args), rtol=1e-9)
  assert np.all(np.isfinite(grads))
  d_rdp = jax.jit(jax.grad(lambda r: jaxrdp.compute_epsilon(np.array([2.0, 8.0]), r, 1e-5)[0]))(
      np.array([0.1, NAN]))
  assert np.all(np.isfinite(d_rdp)), d_rdp


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_under_jit_dpsgd_epsilon_gives_nan_for_invalid_values(accountant):
  # One contract: outside the domain, NaN. (Before 1.0 the RDP accountant gave +inf for an
  # invalid q, σ or T, whose RDP is NaN and was skipped as no information.)
  grid = {"pld_grid": _PLD_GRID} if accountant == "pld" else {}
  eps = jax.jit(lambda **kw: jaxrdp.dpsgd_epsilon(**kw, accountant=accountant, **grid))
  valid = dict(sampling_rate=0.01, noise_multiplier=1.0, steps=100.0, delta=1e-5)
  assert np.isfinite(float(eps(**valid)))
  for arg, values in dict(sampling_rate=[-0.1, 1.5, NAN], noise_multiplier=[-1.0, NAN],
                          steps=[-1.0, NAN], delta=[0.0, 1.5, NAN]).items():
    for v in values:
      out = float(eps(**dict(valid, **{arg: v})))
      assert np.isnan(out), (arg, v, out)


def test_shape_errors_still_raise_under_jit():
  with pytest.raises(ValueError, match="sigma"):
    jax.jit(jaxrdp.log_a)(jnp.full((3,), 0.1), jnp.ones((2,)), 2.0)
  with pytest.raises(ValueError, match="orders"):
    jax.jit(jaxrdp.compute_rdp)(0.1, 1.0, 10.0, jnp.full((2, 2), 2.0))


# --- the CLI ------------------------------------------------------------------------------------

CLI_VALID = {
    "epsilon": {"--sampling-rate": "0.01", "--noise-multiplier": "1.1", "--steps": "100",
                "--delta": "1e-5"},
    "calibrate": {"--epsilon": "2", "--delta": "1e-5", "--sampling-rate": "0.01", "--steps": "100"},
    "dpsgd": {"--dataset-size": "1000", "--batch-size": "10", "--epochs": "1",
              "--noise-multiplier": "1.1", "--delta": "1e-5"},
    "plot": {"--sampling-rate": "0.01", "--noise-multiplier": "1.1", "--steps": "100",
             "--delta": "1e-5", "--out": "eps.png"},
}
NOT_A_NUMBER = ["abc", "", "1+1j", "True", "nan", "inf", "-inf", "1e400"]
CLI_BAD = {
    "--sampling-rate": NOT_A_NUMBER + ["-1", "-1e-300", "1.5", "3/2", "1/0", "1/2/3", "1/x"],
    "--noise-multiplier": NOT_A_NUMBER + ["0", "-1"],
    "--steps": ["abc", "", "2.5", "1.5e0", "5/2", "0", "-5", "nan", "inf"],
    "--delta": NOT_A_NUMBER + ["0", "1", "-1e-5", "1.5"],
    "--epsilon": NOT_A_NUMBER + ["0", "-1"],
    "--dataset-size": ["abc", "", "2.5", "0", "-1"],
    "--batch-size": ["abc", "", "2.5", "0", "-1", "1001"],
    "--epochs": NOT_A_NUMBER + ["0", "-1"],
}
CLI_EXTRA = [   # (argv, flag named in the message)
    (["epsilon", "--orders", "2,0.5"], "--orders"), (["epsilon", "--orders", "2,nan"], "--orders"),
    (["epsilon", "--orders", "abc"], "--orders"), (["epsilon", "--orders", ""], "--orders"),
    (["epsilon", "--orders", "2,,3"], "--orders"),
    (["plot", "--out", "/nonexistent-dir/eps.png"], "--out"),
    (["plot", "--csv", "/nonexistent-dir/eps.csv"], "--csv"),
    (["plot", "--accountant", "tight"], "--accountant"),
    (["plot", "--steps-range", "5:5"], "--steps-range"),
    (["plot", "--points", "1"], "--points"),
    (["plot", "--log", "z"], "--log"),
    (["epsilon", "--accountant", "bogus"], "--accountant"),
    (["epsilon", "--accountant", "pld", "--orders", "2,3"], "--orders"),
    (["calibrate", "--accountant", "tight"], "--accountant"),
    (["dpsgd", "--accountant", ""], "--accountant"),
    # --dataset-size/--batch-size/--epochs are the alternative to --sampling-rate/--steps
    (["epsilon", "--dataset-size", "1000"], "--dataset-size"),
    (["calibrate", "--epochs", "1"], "--epochs"),
    (["calibrate", "--noise-multiplier", "1.1"], "--noise-multiplier"),
    (["calibrate", "--solve-for", "steps"], "--noise-multiplier"),
    (["calibrate", "--solve-for", "sigma"], "--solve-for"),
    (["epsilon", "--sampling", "uniform"], "--sampling"),
    # shuffled batches count epochs: the training run's flags, not a rate and steps
    (["epsilon", "--sampling", "shuffle"], "--sampling"),
    (["dpsgd", "--sampling", "fixed", "--accountant", "pld"], "--sampling"),
    (["calibrate", "--sampling", "fixed", "--accountant", "pld"], "--sampling"),
    (["calibrate", "--sampling", "shuffle", "--solve-for", "sampling-rate"], "--sampling"),
    # truncated Poisson batches: the training run's flags and the largest batch
    (["epsilon", "--sampling", "truncated_poisson"], "--sampling"),
    (["epsilon", "--max-batch-size", "10"], "--max-batch-size"),
    (["dpsgd", "--sampling", "truncated_poisson"], "--max-batch-size"),
    (["dpsgd", "--sampling", "truncated_poisson", "--max-batch-size", "0"], "--max-batch-size"),
    (["calibrate", "--sampling", "truncated_poisson", "--max-batch-size", "10"], "--sampling"),
    (["calibrate", "--sampling", "truncated_poisson", "--max-batch-size", "10", "--solve-for",
      "sampling-rate"], "--sampling"),
]


def _cli_cases():
  for cmd, flags in CLI_VALID.items():
    for flag in flags:
      for value in CLI_BAD.get(flag, []):
        argv = [cmd] + [x for f, v in flags.items() for x in (f, value if f == flag else v)]
        yield pytest.param(argv, flag, id=f"{cmd}{flag}={value!r}")
      missing = [cmd] + [x for f, v in flags.items() if f != flag for x in (f, v)]
      yield pytest.param(missing, flag, id=f"{cmd}-missing{flag}")
  for extra, flag in CLI_EXTRA:
    cmd = extra[0]
    changed = dict(zip(extra[1::2], extra[2::2]))
    argv = [cmd] + [x for f, v in dict(CLI_VALID[cmd], **changed).items() for x in (f, v)]
    yield pytest.param(argv, flag, id=f"{cmd}{flag}={extra[2]!r}")


CLI_CASES = list(_cli_cases())


@pytest.mark.parametrize("argv,flag", CLI_CASES)
def test_cli_bad_input_exits_2_with_one_line_naming_the_flag(argv, flag, capsys):
  with pytest.raises(SystemExit) as info:
    cli.main(argv)
  assert info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("jaxrdp: error: ") and err.count("\n") == 1, err
  assert flag in err and "Traceback" not in err, err


def test_cli_table_covers_every_subcommand_and_flag():
  parser = cli._build_parser()
  commands = parser._subparsers._group_actions[0].choices
  covered = {argv[0] for argv, _ in (p.values for p in CLI_CASES)}
  assert set(CLI_VALID) <= set(commands)
  assert set(commands) - covered <= {"sweep"}   # being written now, with its own tests
  for cmd in CLI_VALID:
    flags = {o for a in commands[cmd]._actions for o in a.option_strings if o.startswith("--")}
    optional = ({"--orders"} if cmd == "epsilon" else set()) | (
        {"--accountant", "--sampling", "--max-batch-size"} if cmd in ("epsilon", "calibrate", "dpsgd")
        else set()) | (
        {"--dataset-size", "--batch-size", "--epochs"} if cmd in ("epsilon", "calibrate")
        else set()) | ({"--solve-for", "--noise-multiplier"} if cmd == "calibrate" else set()) | (
        {"--accountant", "--steps-range", "--points", "--log", "--csv"} if cmd == "plot"
        else set())
    assert flags - {"--help", "--json"} == set(CLI_VALID[cmd]) | optional


def test_counts():
  # Figures for docs/trust.md.
  jit_values = sum(len(v) for *_, bad in JIT_TABLE.values() for v in bad.values())
  print(f"{len(CASES)} eager cases, {jit_values} jit values, {len(CLI_CASES)} CLI cases")
