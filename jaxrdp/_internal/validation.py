"""Eager argument checks that name the argument and the allowed range.

The ranges are the entries of :data:`jaxrdp._internal.domains.DOMAINS`; a public function
checks each argument once (``check("orders", orders)``) and then calls unchecked internals.
Checks run only on concrete values. Under ``jax.jit`` (tracers) they are skipped: every
public numeric function then gives NaN where an argument lies outside its domain, never a
plausible number (see the README section "Invalid input"). Elementwise functions apply
:func:`in_domain` in their compiled kernel; functions of a whole schedule apply
:func:`all_in_domains` (and :func:`domain_mask`) once, at their public boundary, with
:func:`nan_where_invalid`, which does nothing where the values are known (eager calls).
"""

from __future__ import annotations

import functools

import numpy as np
import jax
import jax.numpy as jnp

# DOMAINS: every argument's range; in_domain: the mask under jit that matches check.
from jaxrdp._internal.domains import DOMAINS, in_domain, inside  # noqa: F401
from jaxrdp._internal.loops import without_nested_jit


def is_concrete(x) -> bool:
  """True when ``x`` holds values we can inspect (not a tracer)."""
  leaves = jax.tree_util.tree_leaves(x)
  return not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)


def check_float_dtype(name: str, x) -> None:
  """Reject complex, boolean and string inputs early with a TypeError."""
  dtype = np.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype
  if dtype == np.bool_ or np.issubdtype(dtype, np.complexfloating) or not (
      np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)):
    raise TypeError(f"{name} must be a real number or array of real numbers, got dtype {dtype}.")


def check(domain: str, x, *, name: str | None = None) -> None:
  """Eager check of ``x`` against ``DOMAINS[domain]`` (the jit side is :func:`in_domain`).

  TypeError for None or a value that is not real; for a concrete value outside the domain,
  ValueError naming the argument (``name``, default the domain's name), the interval and the
  first such value. Tracers pass: under jit the functions return NaN instead."""
  name = domain if name is None else name
  allowed = DOMAINS[domain]
  if x is None:
    raise TypeError(f"{name} is required, got None.")
  check_float_dtype(name, x)
  if not is_concrete(x):
    return
  # On the host, in the value's own float dtype (every bound is exact in each), so a float
  # array is not copied to float64; integers and other types become float64.
  v = np.asarray(x)
  if v.dtype not in (np.float16, np.float32, np.float64):
    v = v.astype(np.float64)
  if v.size == 0:
    raise ValueError(f"{name} must not be empty.")
  with np.errstate(invalid="ignore"):
    bad = ~np.asarray(inside(allowed, v), bool)
  if np.any(bad):
    example = v[bad].ravel()[0]
    raise ValueError(f"{name} must lie in {allowed.interval()}"
                     f"{'' if allowed.allow_inf else ' and be finite'}; got {float(example)!r}.")


def check_all(**arguments) -> None:
  """:func:`check` of each keyword argument against the domain of the same name, in order."""
  for name, x in arguments.items():
    check(name, x)


def _listed(shapes: dict) -> str:
  return ", ".join(f"{name} {shape}" for name, shape in shapes.items())


def _and(names) -> str:
  names = list(names)
  return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _known_values(x):
  """``x``'s values where they are known, as NumPy: concrete values, and the primal values of
  an eager ``jax.grad`` (``stop_gradient`` of its tracer is concrete); the tracer otherwise."""
  if isinstance(x, jax.core.Tracer):
    x = jax.lax.stop_gradient(x)
    if isinstance(x, jax.core.Tracer):
      return x
  return np.asarray(x)


def domain_mask(domain: str, x):
  """Elementwise, ``x`` lies in ``DOMAINS[domain]``: :func:`in_domain` on the host where the
  values are known (no JAX operation, so an eager call compiles nothing more), traced under
  ``jax.jit``."""
  v = _known_values(x)
  if isinstance(v, jax.core.Tracer):
    return in_domain(domain, v)
  with np.errstate(invalid="ignore"):
    return np.asarray(inside(DOMAINS[domain], v), bool)


def _all(mask):
  return jnp.all(mask) if isinstance(mask, jax.core.Tracer) else np.all(mask)


def _both(a, b):
  either_traced = isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer)
  return (jnp if either_traced else np).logical_and(a, b)


def all_in_domains(**arguments):
  """Every entry of every argument lies in the domain of its keyword's name (the jit-side
  counterpart of :func:`check_all`), for a result that depends on all of them, such as the ε
  of a schedule: a NumPy bool where every value is known, a traced bool otherwise (one
  program for the traced ones: under an eager ``jax.vmap`` their operations were programs of
  their own, each compiled on first use)."""
  valid, traced = np.True_, {}
  for name, x in arguments.items():
    v = _known_values(x)
    if isinstance(v, jax.core.Tracer):
      traced[name] = v
    else:
      valid = valid & np.all(domain_mask(name, v))
  if not traced or not valid:
    return valid
  return _traced_in_domains(tuple(traced), *traced.values())


@functools.partial(jax.jit, static_argnums=(0,))
@without_nested_jit   # (its jax.numpy calls bind into its jaxpr: no nested jaxprs to trace)
def _traced_in_domains(names, *values):
  """Every entry of each of ``values`` lies in the domain of its name."""
  valid = jnp.bool_(True)
  for name, v in zip(names, values):
    valid = valid & jnp.all(in_domain(name, v))
  return valid


def combine_masks(*masks):
  """The elementwise conjunction of masks from :func:`domain_mask` and :func:`all_in_domains`
  (NumPy where every one is, traced otherwise)."""
  valid = np.True_
  for mask in masks:
    valid = _both(valid, mask)
  return valid


def nan_where_invalid(valid, result):
  """``result`` (an array or a pytree of floating arrays) with NaN where ``valid`` is false:
  how a public function keeps the contract "outside the domain under ``jax.jit``, NaN, never
  a plausible number". Where ``valid`` is known to hold everywhere (every eager call: its
  checks have raised otherwise) ``result`` is returned as it is, without a JAX operation.
  The NaN branch is a constant, so derivatives at valid arguments are those of ``result``."""
  if not isinstance(valid, jax.core.Tracer) and np.all(valid):
    return result
  return _nan_where(valid, result)


@jax.jit
@without_nested_jit
def _nan_where(valid, result):
  """:func:`nan_where_invalid`'s selection, one program."""
  return jax.tree_util.tree_map(lambda r: jnp.where(valid, r, jnp.nan), result)


def check_broadcast(**arrays) -> tuple:
  """The broadcast shape of the named arguments; ValueError naming them when they do not
  broadcast (shapes are known at trace time, so this also runs under jit)."""
  shapes = {name: np.shape(x) for name, x in arrays.items()}
  try:
    return np.broadcast_shapes(*shapes.values())
  except ValueError:
    raise ValueError(f"{', '.join(shapes)} must broadcast against each other; got shapes "
                     f"{_listed(shapes)}.") from None


def check_scalar(**arguments) -> None:
  """ValueError naming every argument that is not a scalar, with its shape (shapes are known
  at trace time, so this also runs under jit). Call after the range checks (which reject
  None and non-real values)."""
  shaped = {name: np.shape(x) for name, x in arguments.items() if np.ndim(x) != 0}
  if len(shaped) == 1:
    (name, shape), = shaped.items()
    raise ValueError(f"{name} must be a scalar, got shape {shape}.")
  if shaped:
    raise ValueError(f"{_and(shaped)} must be scalars; got shapes {_listed(shaped)}.")


def check_schedule(**phases) -> tuple:
  """The broadcast shape of a phased schedule's arguments (each a scalar, or a 1-D array with
  one entry per phase); ValueError naming the arguments and their shapes otherwise (also
  under jit: shapes are known at trace time)."""
  shapes = {name: np.shape(x) for name, x in phases.items()}
  for name, shape in shapes.items():
    if len(shape) > 1:
      raise ValueError(f"{name} must be a scalar or a 1-D schedule (one entry per phase), got "
                       f"shape {shape}.")
  try:
    return np.broadcast_shapes(*shapes.values())
  except ValueError:
    raise ValueError(f"{_and(shapes)} must broadcast to one schedule (scalars, or 1-D "
                     f"arrays of one length); got shapes {_listed(shapes)}.") from None


def check_int(name: str, x, *, lo: int, hi: int | None = None) -> int:
  """An int argument (it fixes a loop count or a shape): TypeError unless an int, ValueError
  outside [lo, hi]."""
  if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
    raise TypeError(f"{name} must be an int, got {x!r}.")
  if x < lo or (hi is not None and x > hi):
    raise ValueError(f"{name} must lie in [{lo}, {'inf' if hi is None else hi}]; got {x}.")
  return int(x)


def check_ints(name: str, x, *, lo: int) -> np.ndarray:
  """An int or a 1-D sequence of ints, each ≥ lo, as an int64 array: TypeError for other
  types, ValueError below lo (named, with the range and the value)."""
  values = np.asarray(x)
  if values.dtype == np.bool_ or not np.issubdtype(values.dtype, np.integer) or values.ndim > 1:
    raise TypeError(f"{name} must be an int or a 1-D sequence of ints, got {x!r}.")
  if np.any(values < lo):
    raise ValueError(f"{name} must lie in [{lo}, inf]; got {int(np.min(values))}.")
  return values.astype(np.int64)


def check_bool(name: str, x) -> bool:
  """A bool argument (a switch): TypeError unless True or False."""
  if not isinstance(x, (bool, np.bool_)):
    raise TypeError(f"{name} must be True or False, got {x!r}.")
  return bool(x)


def check_choice(name: str, value, choices: tuple) -> None:
  """ValueError naming the argument, the allowed values and the value given."""
  if value not in choices:
    raise ValueError(f"{name} must be one of {choices}, got {value!r}.")


def as_float_array(x) -> jax.Array:
  """Convert to a JAX floating array, keeping float32/float64 as given (ints become the default
  float). Conversions of concrete values happen on the host: an eager JAX op would compile."""
  if isinstance(x, (jax.Array, jax.core.Tracer)):
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.result_type(float))
  # jax.device_put, not jnp.asarray: the latter compiles a small program per shape and dtype
  # (~10-20 ms each on a first call); both canonicalize the dtype (float64 without x64).
  if isinstance(x, float):
    return jax.device_put(x)  # keeps Python floats weakly typed, as jnp does
  v = np.asarray(x)
  if not np.issubdtype(v.dtype, np.floating):
    v = v.astype(jnp.result_type(float))
  return jax.device_put(v)


def to_device(x, dtype=None) -> jax.Array:
  """``jnp.asarray(x, dtype)`` without compiling: a concrete value is converted on the host
  and placed with ``jax.device_put`` (jnp.asarray compiles a small program per shape and
  dtype); a tracer goes through jnp.asarray."""
  if isinstance(x, jax.core.Tracer):
    return jnp.asarray(x, dtype)
  return jax.device_put(np.asarray(x, dtype))


def canonical_key(key):
  """(raw key data, impl name or None) from a typed key, a legacy uint32 key, or an int seed."""
  if key is None:
    raise TypeError("key is required: pass a PRNG key (jax.random.key(seed)) or an int seed. "
                    "jaxrdp never picks a default key: a fixed key would repeat the noise of "
                    "other runs.")
  if isinstance(key, (bool, np.bool_)):
    raise TypeError(f"key must be a PRNG key or an int seed, got {key!r}.")
  if isinstance(key, (int, np.integer)):
    key = jax.random.key(int(key))
  dtype = getattr(key, "dtype", None)
  if dtype is None:
    raise TypeError(f"key must be a PRNG key or an int seed, got {type(key).__name__}.")
  if jnp.issubdtype(dtype, jax.dtypes.prng_key):
    if jnp.shape(key) != ():
      raise ValueError(f"key must be a single PRNG key, got a key array of shape {jnp.shape(key)}.")
    return jax.random.key_data(key), jax.random.key_impl(key)
  if jnp.shape(key) == () and jnp.issubdtype(dtype, jnp.integer):
    return canonical_key(jax.random.key(key))
  if dtype != jnp.uint32:
    raise TypeError(f"key must be a PRNG key, a legacy uint32 key or an int seed; got an array "
                    f"of dtype {dtype} and shape {jnp.shape(key)}.")
  try:
    jax.random.wrap_key_data(key)
  except Exception as e:  # wrong shape for the default implementation
    raise ValueError(f"key: a legacy uint32 key must have the default implementation's shape; "
                     f"got shape {jnp.shape(key)} ({e}).") from None
  return jnp.asarray(key), None
