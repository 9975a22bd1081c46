"""jaxrdp's structured loops: ``lax`` loops that stay loops while an entry point is traced.

Entry points (:func:`jaxrdp._internal.compilation.jit`) trace their bodies under
``jax.disable_jit()``: every ``jax.numpy`` function is a small nested ``jax.jit``, and tracing
each of them as a jaxpr of its own (once per new combination of shapes) was ~40 % of tracing
jaxrdp's kernels; with jit disabled they bind their primitives directly into the one jaxpr
being built, which is the same program. But under ``jax.disable_jit()``, ``lax.scan``,
``lax.map`` and ``lax.fori_loop`` run as Python loops (unrolled into the jaxpr), and
``lax.while_loop`` runs its body once in Python before falling back to a loop (the body traced
twice). The functions here are those of ``lax`` with jit enabled for the loop itself and, when
it was disabled at the call, disabled again inside the loop's functions; they are the only
loops jaxrdp uses (``tests/test_loops.py`` checks both).
"""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np


def without_nested_jit(fun):
  """``fun`` run under ``jax.disable_jit()``: called while a jaxpr is being traced, the
  ``jax.numpy`` functions it calls bind their primitives into that jaxpr directly instead of
  being traced as nested jaxprs first (same program, much less Python)."""
  @functools.wraps(fun)
  def call(*args, **kwargs):
    with jax.disable_jit():
      return fun(*args, **kwargs)
  return call


def of_primals(fun):
  """``fun`` for what a ``jax.custom_jvp`` rule computes from its primal values alone (a
  search, a gradient at the point), with a NaN derivative.

  Under ``jax.grad`` (JAX's linearisation) a rule runs inside a partial-evaluation trace, and
  every loop or nested ``jax.jit`` it binds there is partially evaluated (its body traced
  again, to split known from unknown values) even when all its inputs are known, as they are
  here: ~35 % of tracing ``jax.grad`` of ε. A ``custom_jvp`` function whose inputs are all
  known is handed to the enclosing trace as a whole instead, with no partial evaluation.

  Its own rule is reached only where the rule itself is differentiated (a second derivative:
  ``jax.hessian``, ``jax.jacfwd`` of ``jax.grad``). jaxrdp's rules do not implement those:
  differentiating their searches and fixed-order gradients gave 0, a plausible and wrong
  number, so every floating output's tangent is NaN (integer outputs have none)."""
  def nan_rule(primals, tangents):
    out = fun(*primals)
    # NaN times the tangents (linear in them: a constant would be taken for a zero tangent).
    moved = jnp.asarray(sum(jnp.sum(d) for d in jax.tree_util.tree_leaves(tangents)
                            if jnp.issubdtype(jnp.result_type(d), jnp.inexact)))

    def nan(v):
      v = jnp.asarray(v)
      return (jnp.full_like(v, jnp.nan) * moved.astype(v.dtype)
              if jnp.issubdtype(v.dtype, jnp.inexact) else np.zeros(v.shape, jax.dtypes.float0))
    return out, jax.tree_util.tree_map(nan, out)
  wrapped = jax.custom_jvp(fun)
  wrapped.defjvp(nan_rule)
  return wrapped


def _loop(run, *functions):
  """``run(*functions)`` with the loop traced as a loop: where jit is disabled (an entry
  point's trace), enabled for the loop and disabled again inside its functions."""
  if not jax.config.jax_disable_jit:
    return run(*functions)
  with jax.disable_jit(False):
    return run(*(without_nested_jit(f) for f in functions))


def while_loop(cond_fun, body_fun, init_val, *, batched_as=()):
  """:func:`jax.lax.while_loop`, a loop also inside an entry point's trace.

  ``batched_as``: values the loop's state will depend on. Where :func:`jax.vmap` batches any
  of them, the whole initial state is made batched at once (a select of each value with
  itself, which XLA removes): vmap batches a loop's body again for every state variable that
  turns out batched after a pass, and each pass traces the batching rules of the kernels in
  the body anew (see :mod:`jaxrdp.mechanisms.sampled_gaussian`).

  Compile time: where a loop's condition is one operation on one value of its state (``n > 0``
  on a scalar count, a flag itself, or ``flag[0]``, which XLA looks through), XLA takes that
  value for an induction variable and copies out, as a module of its own, all of the body
  that computes its next value: in each of several passes (the while-loop simplifier, the
  invariant-code motion, the trip-count annotator), ~0.1 s of the 1.1 s that
  ``jax.jit(dpsgd_epsilon)`` compiles in (jaxlib 0.10). jaxrdp's long loops therefore compare
  an entry of an array of shape ``(1,)`` (``n[0] > 0``), or read two values of their state,
  which ends that analysis at the condition (``tests/test_loops.py`` checks them)."""
  from jaxrdp._internal import compilation   # (which imports this module)
  leaves = [x for x in jax.tree_util.tree_leaves(batched_as) if compilation.batched(x)]
  if leaves:
    init_val = jax.tree_util.tree_map(lambda v: batched_like(leaves[0], v), init_val)
    body_fun = _witnessed(body_fun)
  return _loop(lambda c, b: lax.while_loop(c, b, init_val), cond_fun, body_fun)


def batched_like(witness, value):
  """``value``, made to depend on ``witness`` (a select of ``value`` with itself on a
  predicate computed from ``witness`` that is always true, which XLA removes): batched by
  :func:`jax.vmap` wherever ``witness`` is."""
  always = (jnp.sum(witness) == 0) | True
  return jnp.where(always, value, value)


_WITNESS = threading.local()   # .stack: witnesses of the batched loop bodies being traced


def batched_witness():
  """While the body of a :func:`while_loop` that :func:`jax.vmap` batches is traced (at the
  unbatched shapes: ``lax.while_loop`` traces its body before vmap batches it), a value of
  its state, which vmap batches (the whole state is batched from the start); None
  otherwise. A kernel with a batching rule called there can skip tracing its primal
  (:func:`jaxrdp.mechanisms.sampled_gaussian.common._rule_only_when_batched`), made batched
  by this value (:func:`batched_like`) so that its rule is sure to replace it."""
  stack = getattr(_WITNESS, "stack", None)
  return stack[-1] if stack else None


def _witnessed(body_fun):
  """``body_fun`` with its state's first value as :func:`batched_witness` while it runs."""
  @functools.wraps(body_fun)
  def body(state):
    stack = _WITNESS.__dict__.setdefault("stack", [])
    stack.append(jax.tree_util.tree_leaves(state)[0])
    try:
      return body_fun(state)
    finally:
      stack.pop()
  return body


def in_body(values, counter):
  """``values`` (a pytree of arrays that every step of a loop sees unchanged: the loop's
  parameters), as the body of that loop should use them: passed through one
  ``lax.optimization_barrier`` with ``counter``, a value of the loop's state that changes
  from step to step. XLA's loop-invariant code motion moves a computation that depends only
  on unchanged values out of the loop, where it becomes a kernel of its own (cheap functions of
  the parameters, each one more kernel to compile, ~15 ms of a first call each); through the
  barrier they stay in the body's own kernels. The barrier computes nothing (the values are
  bitwise the same) and costs no kernel; what is recomputed per step is per-parameter work,
  small beside the step's."""
  *out, _ = lax.optimization_barrier((*jax.tree_util.tree_leaves(values), counter))
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(values), out)


def fori_loop(lower, upper, body_fun, init_val):
  """:func:`jax.lax.fori_loop`, a loop also inside an entry point's trace."""
  return _loop(lambda b: lax.fori_loop(lower, upper, b, init_val), body_fun)


def scan(f, init, xs=None, length=None):
  """:func:`jax.lax.scan`, a loop also inside an entry point's trace."""
  return _loop(lambda g: lax.scan(g, init, xs, length=length), f)


def map(f, xs, batch_size=None):  # noqa: A001 - lax.map's name
  """:func:`jax.lax.map`, a loop also inside an entry point's trace."""
  return _loop(lambda g: lax.map(g, xs, batch_size=batch_size), f)


@jax.custom_batching.custom_vmap
def any_lane(flag):
  """``flag`` (a boolean scalar); under :func:`jax.vmap`, whether it holds in any lane, unbatched.

  For a ``lax.cond`` whose true branch is optional work: with a batched predicate ``vmap``
  turns the cond into a select that runs both branches in every lane; with this one the
  branch runs, for the whole batch, only where some lane asks for it (the caller's true branch
  must then give every lane a valid result, asked or not)."""
  return flag


@any_lane.def_vmap
def _any_lane_batched(axis_size, in_batched, flag):
  del axis_size
  return (jnp.any(flag) if in_batched[0] else flag), False
