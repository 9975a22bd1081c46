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


# --- one table of domains (jaxrdp._internal.domains.DOMAINS) -------------------------------------

import ast
import pathlib

from jaxrdp._internal import domains
from jaxrdp._internal import validation

PACKAGE = pathlib.Path(jaxrdp.__file__).parent
TABLE_FILE = PACKAGE / "_internal" / "domains.py"
# Keywords that write a range by hand. The checkers of a Python int that fixes a shape or a loop
# count (TypeError for a float) are not table-driven and take their bounds at the call.
RANGE_KEYWORDS = {"lo", "hi", "lo_open", "hi_open", "allow_inf", "allow_nan"}
INT_CHECKERS = {"check_int", "check_ints", "_check_count"}
DOMAIN_TAKERS = {"check": 0, "in_domain": 0, "_in": 0}   # function -> position of the domain name


def _calls(path):
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call):
      func = node.func
      yield node, func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def test_ranges_are_written_only_in_the_table():
  hand_written = []
  for path in sorted(PACKAGE.rglob("*.py")):
    if path == TABLE_FILE:
      continue
    for node, name in _calls(path):
      keywords = {k.arg for k in node.keywords} & RANGE_KEYWORDS
      if name in ("check_range", "Domain") or (keywords and name not in INT_CHECKERS):
        hand_written.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {name}")
  assert not hand_written, "ranges written outside DOMAINS:\n" + "\n".join(hand_written)


def test_every_domain_named_at_a_call_is_in_the_table():
  unknown = []
  for path in sorted(PACKAGE.rglob("*.py")):
    for node, name in _calls(path):
      names = [k.arg for k in node.keywords] if name == "check_all" else []
      if name in DOMAIN_TAKERS and len(node.args) > DOMAIN_TAKERS[name]:
        arg = node.args[DOMAIN_TAKERS[name]]
        names += [arg.value] if isinstance(arg, ast.Constant) else []
      unknown += [f"{path.name}:{node.lineno} {n}" for n in names if n not in domains.DOMAINS]
  assert not unknown, unknown


def _boundary_values(d, dtype):
  """Each end, the floats next to it, and values far inside and outside. Next to 0 the
  smallest normal numbers: XLA on CPU flushes subnormals to zero, so under jit -5e-324 is 0."""
  points = [0.0, 0.5, 1.0, -1.0, 2.0, 1e30, -1e30, np.inf, -np.inf, np.nan]
  tiny = np.finfo(dtype).tiny
  for end in (d.lo, d.hi):
    if end is not None:
      end = dtype(end)
      points += [end, -tiny, tiny] if end == 0 else [
          end, np.nextafter(end, dtype(-np.inf)), np.nextafter(end, dtype(np.inf))]
  return points


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(domains.DOMAINS))
def test_eager_check_and_jit_mask_agree(name, dtype):
  # The same values through the eager check (raises or not) and the mask under jit.
  with jax.enable_x64(dtype == np.float64):
    values = np.asarray(_boundary_values(domains.DOMAINS[name], dtype), dtype)
    mask = np.asarray(jax.jit(lambda x: validation.in_domain(name, x))(values))
    for v, inside in zip(values, mask):
      try:
        validation.check(name, v)
        accepted = True
      except ValueError:
        accepted = False
      assert accepted == bool(inside), (name, v, accepted, bool(inside))


def test_every_table_entry_is_used():
  text = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if p != TABLE_FILE)
  assert [n for n in domains.DOMAINS if f'"{n}"' not in text] == []


@pytest.mark.parametrize("value, shown", [(-3, "-3.0"), (np.float32(2.5), "2.5"),
                                          (np.array([0.5, 1.0], np.float32), "1.0"),
                                          (jnp.array([0.5, np.nan]), "nan"), (1e-300 - 1, "-1.0")])
def test_messages_name_the_argument_the_range_and_the_value(value, shown):
  # Any input type: the value as a float, the first one outside (as before the table).
  with pytest.raises(ValueError) as info:
    validation.check("delta", value, name="delta")
  assert str(info.value) == f"delta must lie in (0.0, 1.0) and be finite; got {shown}."


# --- shapes: a ValueError naming the arguments and their shapes, never an internal error -------

F3, F23 = np.full(3, 0.01), np.full((2, 3), 0.01)
SHAPE_CASES = [
    # (call, the argument names and shapes the message must show)
    (lambda: jaxrdp.dpsgd_epsilon(F23, 1.1, 100, 1e-5), ["sampling_rate", "(2, 3)"]),
    (lambda: jaxrdp.dpsgd_epsilon(F3, np.ones(2), 100, 1e-5),
     ["sampling_rate", "(3,)", "noise_multiplier", "(2,)"]),
    (lambda: jaxrdp.dpsgd_epsilon(0.01, 1.1, 100, np.full(2, 1e-5)), ["delta", "(2,)"]),
    (lambda: jaxrdp.dpsgd_epsilon(0.01, 1.1, 100, np.full(2, 1e-5), method="classic"),
     ["delta", "(2,)"]),
    (lambda: jaxrdp.dpsgd_epsilon(0.01, 1.1, 100, np.full(2, 1e-5), accountant="pld"),
     ["delta", "(2,)"]),
    (lambda: jaxrdp.calibrate_steps(2.0, 1e-5, F3, np.ones(2)),
     ["sampling_rate", "(3,)", "noise_multiplier", "(2,)"]),
    (lambda: jaxrdp.calibrate_steps(2.0, 1e-5, F3, 1.0), ["sampling_rate", "(3,)"]),
    (lambda: jaxrdp.calibrate_steps(np.full(3, 2.0), 1e-5, 0.01, 1.0), ["target_epsilon", "(3,)"]),
    (lambda: jaxrdp.calibrate_steps(2.0, np.full(2, 1e-5), 0.01, 1.0), ["delta", "(2,)"]),
    (lambda: jaxrdp.calibrate_noise_multiplier(np.full(3, 2.0), 1e-5, 0.01, 100),
     ["target_epsilon", "(3,)"]),
    (lambda: jaxrdp.calibrate_noise_multiplier(2.0, 1e-5, F3, np.full(2, 100.0)),
     ["sampling_rate", "(3,)", "steps", "(2,)"]),
    (lambda: jaxrdp.calibrate_sampling_rate(np.full(3, 2.0), 1e-5, 1.0, 100),
     ["target_epsilon", "(3,)"]),
    (lambda: jaxrdp.calibrate_sampling_rate(2.0, 1e-5, np.ones(3), np.full(2, 100.0)),
     ["noise_multiplier", "(3,)", "steps", "(2,)"]),
    (lambda: jaxrdp.epsilon_trajectory(F23, 1.1, 100, 1e-5, np.arange(1, 102.0)),
     ["sampling_rate", "(2, 3)"]),
    (lambda: jaxrdp.epsilon_trajectory(0.01, 1.1, 100, np.full((2, 3), 1e-5), np.arange(1, 102.0)),
     ["delta", "(2, 3)"]),
    (lambda: jaxrdp.optimize_schedule(lambda s, q: jnp.sum(s ** 2), sampling_rate=0.01,
                                      noise_multiplier=[1.0, 1.0], steps=[50, 50],
                                      target_epsilon=np.full(3, 2.0), delta=1e-5),
     ["target_epsilon", "(3,)"]),
    (lambda: jaxrdp.optimize_schedule(lambda s, q: jnp.sum(s ** 2), sampling_rate=0.01,
                                      noise_multiplier=[1.0, 1.0], steps=[50, 50],
                                      target_epsilon=2.0, delta=np.full(2, 1e-5)),
     ["delta", "(2,)"]),
    (lambda: jaxrdp.pld_epsilon(F3, np.ones(2), 100, 1e-5),
     ["sampling_rate", "(3,)", "noise_multiplier", "(2,)"]),
    (lambda: jaxrdp.pld_delta(F23, 1.0, 100, 1.0), ["sampling_rate", "(2, 3)"]),
    (lambda: jaxrdp.poisson_truncation_delta(1000, 0.01, 50, np.ones(2), np.ones(3)),
     ["steps", "(2,)", "epsilon", "(3,)"]),
    (lambda: jaxrdp.poisson_truncation_delta(1000, 0.01, 50, 100, np.ones(3)), ["epsilon", "(3,)"]),
]


@pytest.mark.parametrize("call,shown", SHAPE_CASES,
                         ids=[f"{i}-{'-'.join(shown[::2])}" for i, (_, shown) in enumerate(SHAPE_CASES)])
def test_shapes_that_do_not_fit_raise_naming_the_arguments_and_shapes(call, shown):
  with pytest.raises(ValueError) as info:
    call()
  message = str(info.value)
  assert all(piece in message for piece in shown), message


def test_schedule_shapes_are_checked_under_jit_too():
  # Shapes are known at trace time: the same message inside jax.jit.
  with pytest.raises(ValueError, match=r"target_epsilon.*\(3,\)"):
    jax.jit(lambda e: jaxrdp.calibrate_steps(e, 1e-5, 0.01, 1.0))(jnp.full(3, 2.0))
  with pytest.raises(ValueError, match=r"delta.*\(2,\)"):
    jax.jit(lambda d: jaxrdp.dpsgd_epsilon(0.01, 1.1, 100.0, d))(jnp.full(2, 1e-5))


def test_epsilon_trajectory_takes_at_steps_of_any_shape():
  # Documented: at_steps of any shape, the result of its shape (each entry its own prefix).
  at = np.array([[10.0, 50.0, 100.0], [0.0, 20.0, 60.0]])
  q, sigma, steps = np.array([0.01, 0.02]), np.array([1.1, 1.3]), np.array([40.0, 60.0])
  got = jaxrdp.epsilon_trajectory(q, sigma, steps, 1e-5, at)
  flat = jaxrdp.epsilon_trajectory(q, sigma, steps, 1e-5, at.ravel())
  assert got.shape == at.shape
  np.testing.assert_array_equal(np.asarray(got).ravel(), np.asarray(flat))
