"""How jaxrdp's entry points are compiled: with XLA's classic CPU loop emitters.

A user's first query is dominated by XLA compiling the kernel, not by running it. On the CPU
backend, ``xla_cpu_use_fusion_emitters=False`` (the loop emitters XLA used by default until
recently) compiles jaxrdp's graphs ~1.7x faster and runs them as fast. It selects how code
is generated, not what is computed (no fast-math, no reassociation); results agree with the
default emitters to ~1e-14 relative (the order of a few elementwise roundings), far inside
the kernel's certified tolerance. ``xla_backend_optimization_level=1`` (LLVM's lighter
pipeline instead of the default) takes another ~18 % off the compilation, runs the small
programs it is used for about as fast, and agrees with the default to ~1 ulp.
``xla_backend_optimization_level=0`` would compile ~2x faster still, but miscompiles the
kernel together with the classic emitters (re-checked with jaxlib 0.10.2: the per-order
kernel returns +inf where the true log A is 12,437; each elementwise operation alone is
right, the fused program is not): it is not used.

XLA accepts compiler options only on a computation compiled on its own, not on a function
inlined into an outer ``jax.jit``. Entry points decorated with :func:`jit` therefore choose at
call time: when every argument is a concrete value (an eager call, and also the primal values
that ``jax.grad`` hands to a ``custom_jvp`` rule), they are compiled ahead of time with the
option and run directly, whatever transformation is being traced around them (the result is
a concrete value there too); when an argument is a tracer (under ``jax.jit``, ``jax.vmap``
or inside a derivative), they are plain ``jax.jit`` functions. Where the default backend is a
GPU or TPU, a small eager call (fewer than :data:`_RUN_TIME_ELEMENTS` elements of work: one ε,
one calibration, an RDP curve) runs the same way on the host's CPU device (:func:`_host`): XLA
compiles such a program for the host several times faster than for the accelerator, and the
accelerator would not run it faster. Larger calls there are plain ``jax.jit`` functions on the
default device, with XLA's defaults.

The option trades run time for compile time, which is right for the queries a user waits on
(one ε, one calibration). Where a call does much work (at least :data:`_RUN_TIME_ELEMENTS`
elements: by default the arguments' elements in all, or the entry point's own ``work``
estimate), run time dominates instead, and the default emitters, which vectorise the
shared-node quadrature ~2.5x better, are used.

The entry points' bodies are traced with the nested ``jax.jit`` of ``jax.numpy`` functions
disabled (:mod:`jaxrdp._internal.loops`): the same program, traced in ~40 % less time. A caller
that needs several programs can ``prepare`` each first (traced and lowered at once, compiled in
a background thread, XLA releasing the GIL), so that tracing one overlaps compiling another
(:func:`jaxrdp.accounting.composition.by_order_parts`).
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import functools
import gc
import inspect
import os
import re
import threading

import jax
import numpy as np

from jaxrdp._internal import loops

_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}
_CACHE_SIZE = 64   # compiled executables kept per entry point (least recently used dropped)
_RUN_TIME_ELEMENTS = 2048   # from this many argument elements on, compile for run time


def plain_jit() -> bool:
  """Whether ``JAXRDP_PLAIN_JIT`` is set (to anything but ``""`` or ``0``): then every entry
  point calls a plain ``jax.jit`` (XLA's default options, jax.jit's own cache, no executable
  cache of jaxrdp's, no background compilation); under ``jax.vmap`` inside a trace it is
  inlined as always. The values are the same; only first calls are slower. Read when an
  entry point is defined (at import)."""
  return os.environ.get("JAXRDP_PLAIN_JIT", "") not in ("", "0")


# JAX settings whose non-default values change what a program computes or checks. Where one
# is set, the ahead-of-time executables (compiled for the defaults) are not used: the call is
# a plain jax.jit, which honours them.
_RESULT_SETTINGS = {"jax_debug_nans": False, "jax_debug_infs": False,
                    "jax_default_matmul_precision": None, "jax_numpy_dtype_promotion": "standard",
                    "jax_numpy_rank_promotion": "allow", "jax_disable_jit": False}


def _default_settings() -> bool:
  return all(getattr(jax.config, k, v) == v for k, v in _RESULT_SETTINGS.items())


BUCKET_MAX = 1 << 16   # eager calls up to this many elements are padded to bucket(n)


def bucket(n: int) -> int:
  """The padded size of a flat eager call of ``n`` elements: 1, 8 or 64 up to 64 elements,
  then the next multiple of an eighth of the next power of two (at most 12.5 % padding).
  Eager entry points pad concrete inputs to it, so that calls of any shape share a few
  compiled programs: a new shape otherwise costs a compilation of one to three seconds, while
  running 64 elements instead of 2 costs about a millisecond more."""
  n = int(n)
  if n <= 64:
    return 1 if n <= 1 else 8 if n <= 8 else 64
  power = 1 << (n - 1).bit_length()
  step = power // 8
  return -(-n // step) * step


def _leaf_key(leaf, default_device):
  """What an executable compiled for ``leaf`` depends on: its shape, dtype and weak type, and
  where a JAX array is committed to a device other than ``default_device``, its placement. A
  NumPy array, an uncommitted JAX array and one committed to the default device run the same
  executable (an accounting query's arguments come in any of these forms: keyed apart, the
  same program compiled again, ~1 s each). Read directly: this runs on every call."""
  if type(leaf) is np.ndarray:
    return leaf.shape, leaf.dtype, False, None
  aval = jax.typeof(leaf)
  placed = None
  if getattr(leaf, "committed", False):
    placed = leaf.sharding
    if isinstance(placed, jax.sharding.SingleDeviceSharding) and (
        next(iter(placed.device_set)) == default_device):
      placed = None
  return aval.shape, aval.dtype, aval.weak_type, placed


def _default_device():
  """The device an uncommitted computation runs on (JAX's default device setting, else the
  default backend's first device)."""
  device = jax.config.jax_default_device
  if device is None:
    return jax.devices()[0]
  return jax.devices(device)[0] if isinstance(device, str) else device


def batched(x) -> bool:
  """Whether ``x`` is being batched by :func:`jax.vmap` along a mapped axis. Its tracer class
  is not public, so it is recognised by name; should that change, this says False and the
  callers take their general path (slower to trace, same results)."""
  return type(x).__name__ == "BatchTracer" and getattr(x, "batch_dim", None) is not None


def _batched_in_a_trace(x) -> bool:
  """:func:`batched`, with the batched values themselves traced (``jax.jit(jax.vmap(f))``)."""
  return batched(x) and isinstance(getattr(x, "val", None), jax.core.Tracer)


def _host(leaves):
  """The CPU device on which a small eager call runs where the default backend is another
  (GPU, TPU), or None. An accounting query is a few thousand scalar operations on a few
  hundred values, which the host runs about as fast as an accelerator, while XLA compiles it
  for the host several times faster (first calls 2-4x faster on an H200 machine:
  docs/performance.md, "GPU"); on a TPU, float64 runs there natively too. Arguments on the
  accelerator are copied (small by definition); the results are uncommitted arrays on the
  host, which JAX moves wherever they are used next, as it moves the default device's own.
  Where a default device is chosen (``jax.default_device``: the user's, or
  :func:`on_host`'s), that device if it is a CPU, else None (the call runs there). None too
  where an argument is committed to a device that is not a CPU, or JAX has no CPU backend
  (``JAX_PLATFORMS`` without it)."""
  chosen = jax.config.jax_default_device
  if chosen is not None:   # the user's choice, or on_host's: a CPU device is used as the host
    chosen = jax.devices(chosen)[0] if isinstance(chosen, str) else chosen
    return chosen if chosen.platform == "cpu" else None
  for x in leaves:
    if (isinstance(x, jax.Array) and x.committed
        and any(d.platform != "cpu" for d in x.devices())):
      return None
  try:
    return jax.devices("cpu")[0]
  except RuntimeError:
    return None


def on_host(fun):
  """Decorator of the public accounting queries: where the default backend is an accelerator,
  a small eager call (concrete arguments of fewer than :data:`_RUN_TIME_ELEMENTS` elements in
  all, no default device chosen) runs whole on the host's CPU device (:func:`_host`): its
  argument checks and conversions and the operations between its compiled programs too, which
  JAX would otherwise compile one by one for the accelerator (~0.1 s each on a GPU). Every
  other call (traced, large, on a chosen device, on the CPU backend, ``JAXRDP_PLAIN_JIT=1``)
  runs as it would undecorated."""
  if plain_jit():
    return fun

  @functools.wraps(fun)
  def call(*args, **kwargs):
    if jax.default_backend() == "cpu" or jax.config.jax_default_device is not None:
      return fun(*args, **kwargs)
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    if (any(isinstance(x, jax.core.Tracer) for x in leaves)
        or sum(int(x.size) if hasattr(x, "shape") and hasattr(x, "size") else 1
               for x in leaves) >= _RUN_TIME_ELEMENTS):
      return fun(*args, **kwargs)
    host = _host(leaves)
    with _on(host):
      return fun(*args, **kwargs)
  return call


def _on(device):
  """``jax.default_device(device)`` for a device, nothing for None."""
  return contextlib.nullcontext() if device is None else jax.default_device(device)


_UNSUPPORTED = set()   # options of _CPU_OPTIONS that this jaxlib rejected (dropped from then on)
_UNKNOWN_OPTION = re.compile(r"No such compile option: '([^']+)'")


def _compile_with_options(lowered):
  """``lowered.compile`` with :data:`_CPU_OPTIONS`, less any option this jaxlib does not know
  (XLA renames and retires its flags: jaxlib 0.11 rejects ``xla_cpu_use_fusion_emitters``).
  A rejected option is dropped for the rest of the process and the compilation retried; the
  options only choose how code is generated, so without them the results are the same."""
  while True:
    options = {k: v for k, v in _CPU_OPTIONS.items() if k not in _UNSUPPORTED}
    try:
      return lowered.compile(compiler_options=options) if options else lowered.compile()
    except Exception as error:  # noqa: BLE001 - XLA's runtime error type moves between jaxlibs
      unknown = _UNKNOWN_OPTION.search(str(error))
      if unknown is None or unknown.group(1) not in options:
        raise
      _UNSUPPORTED.add(unknown.group(1))


BACKENDS = ("cpu", "gpu", "cuda", "rocm", "tpu")   # jax.default_backend()'s names, and "gpu"


def compiler_options(backend: str | None = None) -> dict:
  """XLA compiler options for your own ``jax.jit`` of jaxrdp functions: on the CPU backend,
  those jaxrdp's own eager calls compile with (XLA's classic loop emitters, LLVM's lighter
  pipeline: first calls ~1.3-1.5x faster, the same arithmetic, no fast-math; results agree with
  XLA's defaults to ~1e-14 relative), less any option this jaxlib does not know (found once, on
  a program of one addition); ``{}`` on other backends, whose defaults jaxrdp uses too.

  Usage: ``jax.jit(f, compiler_options=jaxrdp.compiler_options())``. The options apply to the
  whole of ``f``'s program: worth it where first calls are what you wait for (an interactive
  query, a short design run), not for a long-running training step, which may run slower
  with them on large arrays.

  Args:
    backend: one of :data:`BACKENDS` (default: ``jax.default_backend()``).

  Returns:
    A new dict of option names and values.

  Raises:
    TypeError: ``backend`` is not a string (or None).
    ValueError: ``backend`` is not one of :data:`BACKENDS` (named, with the value).
  """
  if backend is not None and not isinstance(backend, str):
    raise TypeError(f"backend must be a string (one of {BACKENDS}) or None, got {backend!r}.")
  if backend is not None and backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}.")
  if (backend or jax.default_backend()) != "cpu":
    return {}
  if not _PROBED:
    _compile_with_options(jax.jit(lambda x: x + 1).lower(np.float32(0)))
    _PROBED.append(True)
  return {k: v for k, v in _CPU_OPTIONS.items() if k not in _UNSUPPORTED}


_PROBED = []   # whether compiler_options has probed this jaxlib's options


def chained(first, first_args, second, second_args, first_kwargs=None, second_kwargs=None,
            between=None):
  """``second(between(first(*first_args, **first_kwargs)), *second_args, **second_kwargs)``,
  two entry points of :func:`jit` (``between``, if given, a light function of the first's
  outputs, run eagerly op by op: what lets the second's shapes depend on less than the
  first's): one computation in two programs. Where an eager call compiles the first, the
  second is traced, lowered and compiled (in the background, for the shapes ``between``
  gives the first's outputs) before the first runs, so that the two compilations overlap
  each other and the second's tracing: on two cores a PLD's first ε (the step PMFs, then
  their composition) takes ~0.2 s less than as one program. Traced (a user's ``jax.jit``,
  ``jax.grad``, ``jax.vmap``), it is the nested call, inlined into one program as any
  function."""
  first_kwargs, second_kwargs = first_kwargs or {}, second_kwargs or {}
  between = between or (lambda outputs: outputs)
  shapes = first.prepare(*first_args, **first_kwargs)   # placed where its outputs will be
  if shapes is not None:
    placed = jax.tree.leaves(shapes)[0].sharding
    shapes = jax.tree.map(
        lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=placed, weak_type=v.weak_type),
        jax.eval_shape(between, shapes))
    second.prepare(shapes, *second_args, **second_kwargs)
  return second(between(first(*first_args, **first_kwargs)), *second_args, **second_kwargs)


_GC_PAUSE = threading.Lock()   # guards the two below across threads compiling at once
_gc_pausers = 0                # compilations in progress
_gc_resume = False             # whether the collector was on when the first of them began


@contextlib.contextmanager
def _gc_paused():
  """Python's cyclic garbage collector off while a program is traced, lowered and compiled
  (and while an entry point is traced inside a user's ``jax.jit`` or ``jax.vmap``), as it was
  before afterwards. Tracing allocates hundreds of thousands of short-lived objects,
  and with JAX's imported modules on the heap each full collection they trigger takes ~50-60 ms
  (one or two per first call of a jaxrdp entry point: ~7 % of it). Nothing is left
  uncollected: the collector runs again, as usual, once it is back on; reference counting
  frees everything else as before. Nested and concurrent compilations share one pause; a
  collector the user switched off stays off. Only while no other Python thread than jaxrdp's
  own compilers runs: another thread could switch the collector off meanwhile, and turning
  it back on afterwards would undo that."""
  global _gc_pausers, _gc_resume
  if _other_threads():
    yield
    return
  with _GC_PAUSE:
    if _gc_pausers == 0:
      _gc_resume = gc.isenabled()
      gc.disable()
    _gc_pausers += 1
  try:
    yield
  finally:
    with _GC_PAUSE:
      _gc_pausers -= 1
      if _gc_pausers == 0 and _gc_resume:
        gc.enable()


def _other_threads() -> bool:
  current = threading.current_thread()
  return any(t is not current and not t.name.startswith(_THREAD_PREFIX)
             for t in threading.enumerate())


_BACKGROUND = []   # the thread pool of background compilations, created on first use
_THREAD_PREFIX = "jaxrdp-compile"


def _background_compiler():
  """Two threads for :func:`jit`'s background compilations (created on first use, shut down
  at exit without waiting for compilations nobody will use)."""
  with _GC_PAUSE:
    if not _BACKGROUND:
      _BACKGROUND.append(concurrent.futures.ThreadPoolExecutor(
          max_workers=2, thread_name_prefix=_THREAD_PREFIX))
      atexit.register(shutdown)
    return _BACKGROUND[0]


def shutdown():
  """Stops the background compilers (pending compilations are cancelled); a later
  compilation starts new ones."""
  with _GC_PAUSE:
    pools = list(_BACKGROUND)
    _BACKGROUND.clear()
  for pool in pools:
    pool.shutdown(wait=False, cancel_futures=True)


def jit(fun=None, *, static_argnames=(), work=None):
  """``jax.jit`` that compiles with :data:`_CPU_OPTIONS` on the CPU backend where it can.
  ``work``: optional estimate of a call's work in elements, from its bound arguments (a dict)."""
  if fun is None:
    return functools.partial(jit, static_argnames=static_argnames, work=work)
  static_argnames = tuple(static_argnames)
  signature = inspect.signature(fun)
  inlined = loops.without_nested_jit(fun)   # traced in one jaxpr (see jaxrdp._internal.loops)
  plain = jax.jit(inlined, static_argnames=static_argnames)
  plain_only = plain_jit()
  executables = collections.OrderedDict()
  lock = threading.Lock()

  def bind(args, kwargs):
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    dynamic = {k: v for k, v in arguments.items() if k not in static_argnames}
    leaves, treedef = jax.tree_util.tree_flatten(dynamic)
    return arguments, dynamic, leaves, treedef

  def size_of(arguments, leaves):
    return work(arguments) if work else sum(getattr(x, "size", 1) for x in leaves)

  def site(arguments, leaves):
    """Where an eager call (concrete arguments) compiles ahead of time: True on the CPU
    backend (on the default device), the host's CPU device for a small call on another
    backend (:func:`_host`), None where it is a plain ``jax.jit`` (a large call there, or
    no host device to use)."""
    if jax.default_backend() == "cpu":
      return True
    return _host(leaves) if size_of(arguments, leaves) < _RUN_TIME_ELEMENTS else None

  def _key(arguments, leaves, treedef):
    statics = tuple((k, arguments[k]) for k in static_argnames if k in arguments)
    device = _default_device()
    return (treedef, tuple(_leaf_key(x, device) for x in leaves), statics, jax.config.jax_enable_x64,
            str(jax.config.jax_default_device))

  def entry(arguments, leaves, treedef, background):
    """The executable for these concrete arguments: cached, or traced and lowered now and
    compiled now (or, with ``background``, in a background thread: a Future); and the
    shapes of its outputs where it was lowered now (else None)."""
    key = _key(arguments, leaves, treedef)
    with lock:
      found = executables.get(key)
      if found is not None:
        executables.move_to_end(key)
        return key, found, None
    heavy = size_of(arguments, leaves) >= _RUN_TIME_ELEMENTS
    with _gc_paused():
      lowered = plain.lower(**arguments)
      if background:
        found = _background_compiler().submit(
            lowered.compile if heavy else functools.partial(_compile_with_options, lowered))
      else:
        found = lowered.compile() if heavy else _compile_with_options(lowered)
    with lock:
      executables[key] = found
      while len(executables) > _CACHE_SIZE:
        executables.popitem(last=False)
    return key, found, lowered.out_info

  @functools.wraps(fun)
  def call(*args, **kwargs):
    arguments, dynamic, leaves, treedef = bind(args, kwargs)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
      if any(_batched_in_a_trace(x) for x in leaves):
        # Inlined: a jax.jit function under jax.vmap is traced for the unbatched shapes,
        # then batched, and a kernel with a batching rule (see jaxrdp.mechanisms.sampled_gaussian) would
        # be traced a second time by its rule. Inlined, only the rule traces it; the
        # enclosing trace compiles it all the same.
        with _gc_paused():
          return inlined(*args, **kwargs)
      # A real nested jit (inside another entry point's trace, where jit is disabled): its
      # jaxpr is traced once per signature and reused by every program that calls it.
      with jax.disable_jit(False), _gc_paused():
        return plain(*args, **kwargs)
    if jax.config.jax_disable_jit:
      # A user's jax.disable_jit(): the body runs op by op, as any JAX function would (its
      # loops stay compiled loops, see jaxrdp._internal.loops).
      return fun(*args, **kwargs)
    where = None if plain_only or not _default_settings() else site(arguments, leaves)
    if where is None:
      # jax.jit's own cache (this call may compile), which honours every setting.
      with _gc_paused():
        return plain(*args, **kwargs)
    with _on(None if where is True else where):
      return run(arguments, dynamic, leaves, treedef)

  def run(arguments, dynamic, leaves, treedef):
    key, executable, _ = entry(arguments, leaves, treedef, background=False)
    if isinstance(executable, concurrent.futures.Future):   # compiling in the background
      future = executable
      try:
        executable = future.result()
      except BaseException as error:
        # A failed or cancelled compilation is not kept: the next call compiles again (a
        # cancelled one, from shutdown(), this call).
        with lock:
          if executables.get(key) is future:
            del executables[key]
        if not isinstance(error, concurrent.futures.CancelledError):
          raise
        _, executable, _ = entry(arguments, leaves, treedef, background=False)
      with lock:
        if executables.get(key) is future:
          executables[key] = executable
    return executable(**dynamic)

  def prepare(*args, **kwargs):
    """Trace and lower the program of an eager call with these arguments now, and compile
    it in a background thread (XLA releases the GIL): a caller that needs several programs
    prepares them all, so that each one's tracing (Python, one core) overlaps the others'
    compilation; the call itself then waits for its compilation. Does nothing where the
    call would not compile ahead of time (tracers, a large call on an accelerator, a setting
    a plain ``jax.jit`` honours) or is compiled already. Returns the shapes of the program's
    outputs (``jax.ShapeDtypeStruct``, placed on the device the call will run on) where it
    started a compilation, else None."""
    arguments, _, leaves, treedef = bind(args, kwargs)
    if (any(isinstance(x, jax.core.Tracer) for x in leaves) or plain_only
        or not _default_settings() or jax.config.jax_disable_jit):
      return None
    where = site(arguments, leaves)
    if where is None:
      return None
    device = None if where is True else where
    with _on(device):
      shapes = entry(arguments, leaves, treedef, background=True)[2]
      if shapes is None:
        return None
      if device is None:
        device = jax.config.jax_default_device
        device = (jax.devices(device)[0] if isinstance(device, str)
                  else device or jax.devices()[0])
    placed = jax.sharding.SingleDeviceSharding(device)   # where the outputs will be
    return jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=placed,
                                                       weak_type=v.weak_type), shapes)

  call.prepare = prepare
  call.executables = executables   # (read by tests: empty with JAXRDP_PLAIN_JIT=1)
  call.trace = plain.trace
  return call
