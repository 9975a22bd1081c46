"""Eager argument checks that name the argument and the allowed range.

The ranges are the entries of :data:`jaxrdp._internal.domains.DOMAINS`; a public function
checks each argument once (``check("orders", orders)``) and then calls unchecked internals.
Checks run only on concrete values. Under ``jax.jit`` (tracers) they are skipped: the
numerical kernels then give NaN where :func:`in_domain` is false, never a number (see the
README section "Invalid input under jit").
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

# DOMAINS: every argument's range; in_domain: the mask under jit that matches check.
from jaxrdp._internal.domains import DOMAINS, in_domain, inside  # noqa: F401


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


def check_broadcast(**arrays) -> tuple:
  """The broadcast shape of the named arguments; ValueError naming them when they do not
  broadcast (shapes are known at trace time, so this also runs under jit)."""
  shapes = {name: np.shape(x) for name, x in arrays.items()}
  try:
    return np.broadcast_shapes(*shapes.values())
  except ValueError:
    listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
    raise ValueError(f"{', '.join(shapes)} must broadcast against each other; got shapes "
                     f"{listed}.") from None


def check_int(name: str, x, *, lo: int, hi: int | None = None) -> int:
  """An int argument (it fixes a loop count or a shape): TypeError unless an int, ValueError
  outside [lo, hi]."""
  if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
    raise TypeError(f"{name} must be an int, got {x!r}.")
  if x < lo or (hi is not None and x > hi):
    raise ValueError(f"{name} must lie in [{lo}, {'inf' if hi is None else hi}]; got {x}.")
  return int(x)


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
