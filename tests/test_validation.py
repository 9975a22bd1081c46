"""Bad input: a clear error naming the argument in eager mode; NaN (never a number) under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrdp

ORDERS = np.array([1.5, 2.0, 8.0])
RDP = np.array([0.1, 0.2, 0.5])

EAGER_CASES = [
    # (callable, error type, text that must appear in the message)
    (lambda: jaxrdp.log_a(-0.1, 1.0, 2.0), ValueError, "q"),
    (lambda: jaxrdp.log_a(1.5, 1.0, 2.0), ValueError, "q"),
    (lambda: jaxrdp.log_a(np.nan, 1.0, 2.0), ValueError, "q"),
    (lambda: jaxrdp.log_a(0.1, -1.0, 2.0), ValueError, "sigma"),
    (lambda: jaxrdp.log_a(0.1, np.inf, 2.0), ValueError, "sigma"),
    (lambda: jaxrdp.log_a(0.1, 1.0, 0.5), ValueError, "alpha"),
    (lambda: jaxrdp.log_a(0.1, 1.0, 1j), TypeError, "alpha"),
    (lambda: jaxrdp.log_a("0.1", 1.0, 2.0), TypeError, "q"),
    (lambda: jaxrdp.log_a(None, 1.0, 2.0), TypeError, "q"),
    (lambda: jaxrdp.compute_rdp(1.01, 1.0, 1, ORDERS), ValueError, "q"),
    (lambda: jaxrdp.compute_rdp(0.1, -0.5, 1, ORDERS), ValueError, "noise_multiplier"),
    (lambda: jaxrdp.compute_rdp(0.1, 1.0, -3, ORDERS), ValueError, "steps"),
    (lambda: jaxrdp.compute_rdp(0.1, 1.0, 1, [0.9, 2.0]), ValueError, "orders"),
    (lambda: jaxrdp.compute_rdp(0.1, 1.0, 1, np.ones((2, 2)) * 2), ValueError, "orders"),
    (lambda: jaxrdp.compute_rdp(0.1, 1.0, 1, np.array([])), ValueError, "orders"),
    (lambda: jaxrdp.compute_epsilon(ORDERS, RDP, 0.0), ValueError, "delta"),
    (lambda: jaxrdp.compute_epsilon(ORDERS, RDP, 1.0), ValueError, "delta"),
    (lambda: jaxrdp.compute_epsilon(ORDERS, RDP, -1e-5), ValueError, "delta"),
    (lambda: jaxrdp.compute_epsilon(ORDERS, RDP[:2], 1e-5), ValueError, "rdp"),
    (lambda: jaxrdp.compute_epsilon(ORDERS, -RDP, 1e-5), ValueError, "rdp"),
    (lambda: jaxrdp.compute_epsilon(ORDERS * 0.5, RDP, 1e-5), ValueError, "orders"),
    (lambda: jaxrdp.compute_epsilon(ORDERS, RDP, 1e-5, method="tight"), ValueError, "method"),
    (lambda: jaxrdp.compute_delta(ORDERS, RDP, -1.0), ValueError, "epsilon"),
    (lambda: jaxrdp.compute_delta(ORDERS, RDP, np.nan), ValueError, "epsilon"),
]


@pytest.mark.parametrize("call,error,name", EAGER_CASES)
def test_bad_input_raises_naming_the_argument(call, error, name):
  with pytest.raises(error, match=name):
    call()


def test_messages_state_the_allowed_range():
  with pytest.raises(ValueError, match=r"q must lie in \[0.0, 1.0\].*got 1.5"):
    jaxrdp.log_a(1.5, 1.0, 2.0)


@pytest.mark.parametrize("args", [(1.5, 1.0, 2.0), (-0.1, 1.0, 2.0), (0.1, -1.0, 2.0), (0.1, 1.0, 0.5)])
def test_under_jit_invalid_kernel_input_gives_nan(args):
  assert np.isnan(float(jax.jit(jaxrdp.log_a)(*args)))


def test_under_jit_invalid_steps_and_delta_give_nan():
  assert np.all(np.isnan(np.asarray(jax.jit(jaxrdp.compute_rdp)(0.1, 1.0, -1, ORDERS))))
  eps, order = jax.jit(jaxrdp.compute_epsilon)(ORDERS, RDP, 0.0)
  assert np.isnan(float(eps)) and np.isnan(float(order))
  assert np.isnan(float(jax.jit(jaxrdp.compute_delta)(ORDERS, RDP, -1.0)[0]))
