r"""A sweep written as it goes: one Parquet part per chunk of (q, σ) pairs, resumable.

``sweep(..., output=PATH)`` writes a directory ``PATH`` (a name ending in ``.parquet`` reads as
one dataset in pyarrow, pandas and polars):

* ``_sweep.json``: the grid's definition (its four axes, the orders, the dtype) and the
  chunk layout (pairs per chunk, number of chunks, devices), as written by this version;
* ``part-NNNNNN.parquet``: the cells of chunk N, one row per cell, columns
  ``sampling_rate, noise_multiplier, steps, delta, epsilon``, in the order of the array
  ``sweep`` returns (q, then σ, then T, then δ): the parts in order are the whole grid.

A part is written to a temporary name and renamed when complete (atomic on POSIX and
Windows), so a process killed at any point (``kill -9``, a preempted job) leaves only whole
parts; ``resume=True`` computes the chunks that have none. Each cell depends on the devices
that computed it, not on which chunks were computed before (see :mod:`jaxrdp.accounting.sweep`),
so a resumed sweep writes the same files as one that ran through. The layout depends on the
device count, so a resume on another number of devices is refused, not mixed.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

FORMAT = "jaxrdp.sweep/1"
_DEFINITION = "_sweep.json"
_COLUMNS = ("sampling_rate", "noise_multiplier", "steps", "delta")


def _pyarrow():
  try:
    import pyarrow as pa
    import pyarrow.parquet as pq
  except ImportError:
    raise ImportError("sweep(output=...) writes Parquet and needs pyarrow: pip install pyarrow "
                      "(or leave output=None for the result as an array).") from None
  return pa, pq


def definition(axes, orders, dtype, chunk, n_chunks, devices, sampler=None) -> dict:
  """The grid's definition and chunk layout, as ``_sweep.json`` holds it (floats exact:
  JSON writes the shortest repr, which reads back to the same double). ``sampler``: the
  sampler's arguments where they are not Poisson's (absent otherwise: files written before
  samplers read the same)."""
  spec = {"format": FORMAT, **{name: [float(v) for v in axis]
                               for name, axis in zip(("sampling_rates", "noise_multipliers",
                                                      "steps", "deltas"), axes)},
          "orders": [float(v) for v in orders], "dtype": np.dtype(dtype).name,
          "pairs_per_chunk": int(chunk), "chunks": int(n_chunks), "devices": int(devices)}
  if sampler and sampler.get("sampling", "poisson") != "poisson":
    spec["sampler"] = dict(sampler)
  return spec


def open_output(path, spec: dict, resume: bool) -> set[int]:
  """Prepares the directory ``path`` for the sweep ``spec`` and returns the chunks already
  written there (empty for a new output). An existing output is taken up only with
  ``resume`` and only for the same grid and layout (ValueError naming what differs)."""
  _pyarrow()
  path = pathlib.Path(path)
  meta = path / _DEFINITION
  if path.exists() and not path.is_dir():
    raise ValueError(f"output={str(path)!r} exists and is not a directory (a sweep writes a "
                     "directory of Parquet parts).")
  if meta.exists():
    if not resume:
      raise ValueError(f"output={str(path)!r} already holds a sweep: pass resume=True to "
                       "complete it, or remove it.")
    _check_same(path, spec)
    for stale in path.glob(".part-*.tmp"):   # a part being written when the process died
      stale.unlink(missing_ok=True)
    return {i for i in range(spec["chunks"]) if _part(path, i).exists()}
  if path.is_dir() and any(path.iterdir()):
    raise ValueError(f"output={str(path)!r} is a directory that is not empty and holds no "
                     "sweep: give a new or empty directory.")
  path.mkdir(parents=True, exist_ok=True)
  _atomic(meta, lambda tmp: tmp.write_text(json.dumps(spec)))
  return set()


def join_output(path, spec: dict) -> set[int]:
  """The chunks already written to the sweep ``spec`` that another process of the same run
  prepared (:func:`open_output`); ValueError if it holds another sweep."""
  _check_same(path, spec)
  return {i for i in range(spec["chunks"]) if _part(path, i).exists()}


def _check_same(path, spec):
  """ValueError naming what differs where ``path`` holds another sweep than ``spec``."""
  with open(pathlib.Path(path) / _DEFINITION) as f:
    found = json.load(f)
  differ = [k for k in dict(found, **spec) if found.get(k) != spec.get(k)]
  if differ:
    raise ValueError(f"output={str(path)!r} holds a different sweep (its {', '.join(differ)} "
                     "differ from this call's): resume it with the same grid, orders, dtype, "
                     "sampler, chunk_size and devices, or write elsewhere.")


def written(path, spec) -> int:
  """How many of the sweep's pairs the parts in ``path`` hold now (parts written by any
  process: how a multi-process sweep's progress is read)."""
  chunk, n_chunks = spec["pairs_per_chunk"], spec["chunks"]
  pairs = len(spec["sampling_rates"]) * len(spec["noise_multipliers"])
  return sum(min(chunk, pairs - i * chunk) for i in range(n_chunks) if _part(path, i).exists())


def _part(path, index):
  return pathlib.Path(path) / f"part-{index:06d}.parquet"


def _atomic(target, write):
  """``write(tmp)`` then rename onto ``target``: the target is absent or whole."""
  tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
  write(tmp)
  os.replace(tmp, target)


def write_part(path, index, axes, pairs, eps) -> None:
  """Writes chunk ``index``: the cells of the flat pair indices ``pairs`` (q-major) with their
  ε ``eps`` (pairs × (T · δ), T-major). The axis columns repeat a few values each:
  dictionary-encoded (a few bytes per part); ε is written plain (random doubles gain nothing
  from a dictionary, and trying one costs a third of the time)."""
  pa, pq = _pyarrow()
  q, sigma, t, delta = axes
  n_combos = t.size * delta.size
  values = (np.repeat(q[pairs // sigma.size], n_combos),
            np.repeat(sigma[pairs % sigma.size], n_combos),
            np.tile(np.repeat(t, delta.size), pairs.size), np.tile(delta, t.size * pairs.size))
  table = pa.table({**dict(zip(_COLUMNS, values)), "epsilon": np.asarray(eps).reshape(-1)})
  _atomic(_part(path, index),
          lambda tmp: pq.write_table(table, tmp, use_dictionary=list(_COLUMNS)))


class PartWriter:
  """Writes parts (:func:`write_part`) on threads of its own while the next chunks are
  computed (the Parquet encoder releases the GIL): ``workers`` parts at a time, one thread each
  (default: one per four cores, at least one, at most four); ``submit`` waits for the oldest
  once that many are in flight, so host memory stays bounded by ``workers + 1`` chunks.
  ``close`` waits for the rest and raises the first error."""

  def __init__(self, path, axes, workers=None):
    import collections
    from concurrent.futures import ThreadPoolExecutor
    self._path, self._axes = path, axes
    self._workers = workers or min(4, max(1, (os.cpu_count() or 1) // 4))
    self._pool = ThreadPoolExecutor(max_workers=self._workers,
                                    thread_name_prefix="jaxrdp-sweep-output")
    self._pending = collections.deque()

  def submit(self, index, pairs, eps):
    while len(self._pending) >= self._workers:
      self._pending.popleft().result()
    self._pending.append(self._pool.submit(write_part, self._path, index, self._axes, pairs, eps))

  def close(self):
    try:
      while self._pending:
        self._pending.popleft().result()
    finally:
      self._pool.shutdown(wait=True, cancel_futures=True)


def _spec(path) -> dict:
  """The definition of the sweep in ``path``; ValueError where there is none, or where it is
  incomplete (how many chunks are missing)."""
  try:
    with open(pathlib.Path(path) / _DEFINITION) as f:
      spec = json.load(f)
  except FileNotFoundError:
    raise ValueError(f"{str(path)!r} holds no sweep (no {_DEFINITION}).") from None
  missing = [i for i in range(spec["chunks"]) if not _part(path, i).exists()]
  if missing:
    raise ValueError(f"{str(path)!r} is incomplete: {len(missing)} of {spec['chunks']} chunks "
                     "missing; complete it with sweep(..., output=path, resume=True).")
  return spec


def _shape(spec):
  return tuple(len(spec[k]) for k in ("sampling_rates", "noise_multipliers", "steps", "deltas"))


def parts(path):
  """(shape (Q, S, T, D), an iterator over the chunks' ε, each (pairs, T · D) in the array's
  order): a complete sweep one part at a time (memory: one part)."""
  _, pq = _pyarrow()
  spec = _spec(path)
  shape = _shape(spec)

  def chunks():
    for i in range(spec["chunks"]):
      eps = pq.read_table(_part(path, i), columns=["epsilon"])["epsilon"].to_numpy()
      yield eps.astype(spec["dtype"]).reshape(-1, shape[2] * shape[3])
  return shape, chunks()


def read_sweep(path):
  """The ε array of a complete sweep written with ``output=path``, as :func:`jaxrdp.sweep`
  returns it without ``output`` (the same values, bitwise).

  Args:
    path: the directory ``sweep(..., output=path)`` wrote.

  Returns:
    ε, a NumPy array of shape (Q, S, T, D) in the sweep's dtype.

  Raises:
    ValueError: ``path`` holds no sweep, or an incomplete one (how many chunks are missing:
      complete it with ``resume=True``).
  """
  shape, chunks = parts(path)
  return np.concatenate(list(chunks)).reshape(shape)
