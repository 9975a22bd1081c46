r"""ε over a grid of DP-SGD configurations, and σ calibrated over a grid of targets.

:func:`sweep` gives ε for every (q, σ, T, δ) of a Cartesian grid. It exploits the structure of
the accountant: the per-step RDP of the Poisson-sampled Gaussian depends on (q, σ) only; T
steps compose to T times the per-step RDP (Mironov 2017, Prop. 1); δ enters only in the
conversion to (ε, δ)-DP. So the quadrature kernel (the expensive part) runs once per
(q, σ) pair and order, Q·S·K evaluations instead of Q·S·T·D·K, and each (T, δ) costs one
conversion (:func:`jaxrdp.compute_epsilon`, a few elementwise operations per order).

Each cell is ε at the best order of the grid, as
``dpsgd_epsilon(q, σ, T, δ, orders=orders, refine_order=False)`` computes it: the same kernel,
the same composition and the same conversion (its rounding allowances included, so no cell is
below the RDP-based value). Not bitwise: dpsgd_epsilon evaluates one (q, σ) pair, which XLA
compiles differently from a batch of pairs, so the kernel's last bits differ (ε within ~16
ulps measured; far inside the 256-ulp allowance the conversion adds). The continuous
refinement of the order that :func:`jaxrdp.dpsgd_epsilon` does by default is not offered: it
probes further orders that depend on (T, δ), i.e. kernel evaluations per *cell*, which is
exactly the cost the sweep's structure avoids. The grid value is an upper bound on the
refined one (never below it).

:func:`sweep_noise_multiplier` is the inverse: the smallest σ meeting each target ε, one
:func:`jaxrdp.calibrate_noise_multiplier` search per cell of (target ε, δ, q, T), vectorised.

Both functions evaluate the grid in chunks (so that memory stays bounded whatever the grid
size: the only thing that grows is the result, kept on the host until the end, or for
``sweep(..., output=DIR)`` written chunk by chunk, :mod:`jaxrdp.accounting.sweep_output`;
``sweep`` also spreads the chunks over the processes of a ``jax.distributed`` run), spread every
chunk over all local devices of the default backend (``shard_map`` over the flattened grid,
padded to whole blocks on every device; no communication between devices), and compute in
the floating dtype of their inputs, as :func:`jaxrdp.dpsgd_epsilon` does: float32 unless
``jax_enable_x64`` is on and the inputs are float64. They run their own compiled chunks from
Python, so they cannot themselves be traced (``jit``, ``vmap``, ``grad``).

Reproducibility: on a given set of devices a cell does not depend on the grid it is part of
or on ``chunk_size`` (bitwise): items go through the kernel in blocks of a fixed size. A
different number of devices is a different compiled program (XLA:CPU's multi-device code
differs from its single-device code), and agrees to the kernel's accuracy, not bitwise
(float64: within 3e-13 relative measured on 8 host devices).
"""

from __future__ import annotations

import functools
import math
import os
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec

from jaxrdp._internal import deprecation
from jaxrdp._internal import loops
from jaxrdp._internal import validation
from jaxrdp.accounting import samplers
from jaxrdp.accounting import sweep_output
from jaxrdp.accounting.calibration import _calibrate_on_grid, _host_calibration
from jaxrdp.accounting.epsilon import order_grid
from jaxrdp.accounting.conversion import compute_epsilon
from jaxrdp.mechanisms.sampled_gaussian import fill_pending, log_a_and_rdp_at_orders, order_split, order_tables
from jaxrdp.mechanisms.without_replacement import without_replacement_unchecked

_AXIS = "grid"
# Items (pairs or searches) are evaluated in blocks of a fixed number, lax.map'ed over a device's
# share: the compiled block does not depend on the grid size, chunk_size or the device count,
# so neither does any cell (XLA compiles an operation on n elements differently for different
# n, with last-bit differences). A block holds ~4096 (item, order) elements on CPU (the
# kernel's own level-0 chunk) and ~65,536 on accelerators (its batch), and at least 2 items
# (XLA simplifies a length-1 batch as a broadcast scalar).
_BLOCK_ELEMENTS = {"cpu": 4096}
_BLOCK_ELEMENTS_ACCELERATOR = 65536
_CALL_BLOCKS = 64               # default blocks per device per call of the forward sweep
_SEARCH_CALL_BLOCKS = 4         # ... and of the inverse sweep (searches are ~20x costlier)
# At most this many searches per block on CPU: the search loop runs every search of a block,
# padding included, until the last has converged, and a short order grid (4096 / 6 orders =
# 682 searches per block) made a small grid almost all padding (18 cells: 3.1 s warm, 0.1 s
# with this cap). 4096 // 170 default orders = 24 is below it: those blocks are unchanged.
_SEARCH_BLOCK_MAX = {"cpu": 32}
_COMBO_BLOCK = 8                # (T, δ) combinations per conversion block
_OUTPUT_ELEMENTS = 2 ** 22      # ε values per call, at most (more (T, δ) -> more calls)


def sweep(sampling_rates: jax.typing.ArrayLike, noise_multipliers: jax.typing.ArrayLike,
          steps: jax.typing.ArrayLike, deltas: jax.typing.ArrayLike, *,
          orders: jax.typing.ArrayLike | None = None, chunk_size: int | None = None,
          progress: bool = False, devices: Sequence[jax.Device] | None = None,
          output: str | os.PathLike | None = None, resume: bool = False, gather: bool = True,
          sampling: str = "poisson", neighboring: str | None = None,
          dataset_size: int | None = None,
          max_batch_size: int | None = None) -> jax.Array | pathlib.Path:
  r"""ε of DP-SGD over the grid q × σ × steps × δ (all combinations); Poisson sampling
  unless ``sampling`` says otherwise.

  .. math:: \varepsilon[i, j, k, l] = \min_\alpha \mathrm{conv}_{\delta_l}\big(\alpha,\;
            T_k\,\varepsilon_{q_i,\sigma_j}(\alpha)\big)

  The per-step RDP :math:`\varepsilon_{q,\sigma}(\alpha)` is computed once per (q, σ) pair;
  see the module docstring for why this equals :func:`jaxrdp.dpsgd_epsilon` with
  ``refine_order=False`` cell by cell.

  Args:
    sampling_rates: 1-D array of Q sampling rates q in [0, 1].
    noise_multipliers: 1-D array of S noise multipliers σ ≥ 0.
    steps: 1-D array of T step counts ≥ 0.
    deltas: 1-D array of D values of δ in (0, 1).
    orders: the order grid (default :data:`jaxrdp.DEFAULT_ORDERS`), 1-D.
    chunk_size: at most this many (q, σ) pairs per compiled call (rounded up to whole blocks
      of ~4096 / len(orders) pairs on every device); default 64 blocks per device. Memory
      grows with it, results do not depend on it.
    progress: show a progress bar (needs ``tqdm``).
    devices: the devices to spread the work over (default: all local devices of the default
      backend).
    output: a directory to write the result to as it is computed, one Parquet part per
      chunk (needs ``pyarrow``; :mod:`jaxrdp.accounting.sweep_output` describes the files),
      instead of returning it: host memory then holds one chunk's cells, not the grid's.
      :func:`jaxrdp.read_sweep` reads it back as the array.
    resume: with ``output``, complete a sweep that was interrupted (killed, preempted): the
      chunks already written are kept, the others computed (the same files as an
      uninterrupted run). The grid, orders, dtype, ``chunk_size`` and devices must be the
      same as the first call's (the number of processes may differ).
    gather: in a multi-process run (after ``jax.distributed.initialize``; see below), return
      the whole grid on every process (True, the default: one all-gather at the end), or only
      the cells this process computed, NaN elsewhere (False: no communication). Ignored with
      ``output`` (every process returns the path once every part is written).
    sampling, neighboring, dataset_size, max_batch_size: how the batches are drawn, as in
      :func:`jaxrdp.dpsgd_epsilon` (:mod:`jaxrdp.accounting.samplers`): ``"fixed"`` takes the
      per-step RDP of sampling without replacement (at σ/2) in place of the sampled
      Gaussian's; ``"shuffle"`` (with ``dataset_size``; every q·n a whole number) composes
      one Gaussian mechanism at σ/2 per epoch, the epochs counted per (q, T);
      ``"truncated_poisson"`` (with ``dataset_size`` and ``max_batch_size``, one int B for
      the whole grid) adds the probability that a batch overflows B to δ (the RDP account of
      :func:`jaxrdp.accounting.samplers.additive_epsilon`: ε at δ/2, then at δ less the
      charge; +inf where the overflows alone exceed δ/2). Each cell is then
      ``dpsgd_epsilon(q, σ, T, δ, orders=orders, refine_order=False, sampling=...)``.

  Several processes (``jax.distributed``: one per host, or per GPU): the same call on every
  process spreads the chunks over the processes (chunk i on process i mod P), each computing
  its chunks on its own local devices with no communication; every process needs the same
  number of local devices. A cell's value depends on the number of local devices, not on the
  number of processes (bitwise: each process runs the program a one-process sweep on that many
  devices runs). With ``output`` every process writes its own parts (to a file system they
  share), and the progress bar, if asked for, is process 0's: the parts every process has
  written, read from the directory as process 0 goes (without ``output``, its own share).

  Returns:
    ε of shape (Q, S, T, D), in the floating dtype of ``sampling_rates``, ``noise_multipliers``
    and ``steps`` (``deltas`` is cast to it). +inf where no order gives a finite bound (σ = 0).
    With ``output``: its path (a :class:`pathlib.Path`).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Mironov, Talwar, Zhang (2019), arXiv:1908.10530 (RDP of the sampled Gaussian); Mironov
    (2017), Prop. 1 (composition); Balle et al. (2020), Thm. 21 (conversion).
  """
  q = _grid_axis("sampling_rates", sampling_rates, "sampling_rate")
  sigma = _grid_axis("noise_multipliers", noise_multipliers, "noise_multiplier")
  t = _grid_axis("steps", steps, "steps")
  delta = _grid_axis("deltas", deltas, "delta")
  samplers.check_sampling(sampling, neighboring, dataset_size, "rdp", max_batch_size,
                          truncation=True)
  if max_batch_size is not None:
    validation.check_int("max_batch_size", max_batch_size, lo=1)   # one B for the grid
  if sampling == "shuffle":   # every rate of the grid its own schedule
    for rate in np.ravel(np.asarray(sampling_rates, np.float64)):
      samplers.check_batches(rate, dataset_size)
  dtype = jnp.result_type(q, sigma, t)   # as dpsgd_epsilon: δ is cast to the schedule's dtype
  grid = _order_grid(orders, dtype)
  mesh = _mesh(devices)
  chunk_size = _check_chunk_size(chunk_size)
  progress_bar = _progress_bar(progress)

  resume = validation.check_bool("resume", resume)
  gather = validation.check_bool("gather", gather)
  if output is not None and not isinstance(output, (str, os.PathLike)):
    raise TypeError(f"output must be a path (str or os.PathLike) or None, got {output!r}.")
  if output is None and resume:
    raise ValueError("resume=True applies to output=... only (a sweep to write), got output=None.")

  q, sigma, t, delta = (np.asarray(v.astype(dtype)) for v in (q, sigma, t, delta))
  n_pairs, n_combos = q.size * sigma.size, t.size * delta.size
  block, chunk = _layout(n_pairs, grid.size, chunk_size, _CALL_BLOCKS, mesh)
  n_chunks = -(-n_pairs // chunk)
  n_proc, me = _processes(devices, mesh)
  # The chunks this process computes: its share (chunk i on process i mod P), less those an
  # interrupted sweep already wrote.
  skip = {c for c in range(n_chunks) if c % n_proc != me}
  if output is not None:
    output = pathlib.Path(os.fspath(output))
    spec = sweep_output.definition((q, sigma, t, delta), grid, dtype, chunk, n_chunks,
                                   mesh.devices.size,
                                   {"sampling": sampling, "dataset_size": dataset_size}
                                   | ({} if max_batch_size is None
                                      else {"max_batch_size": int(max_batch_size)}))
    # Process 0 prepares the directory; the others join it once it has (a barrier).
    if me == 0:
      skip |= sweep_output.open_output(output, spec, resume)
    _barrier(n_proc, "jaxrdp.sweep: output ready")
    if me != 0:
      skip |= sweep_output.join_output(output, spec)
  # (T, δ) combinations, T-major, in fixed blocks too (at least two per call), as many per
  # call as keep the call's output below _OUTPUT_ELEMENTS; the padding (T = 0, δ = 1/2) is
  # valid and cheap: the conversion costs little next to the kernel.
  needed = -(-n_combos // _COMBO_BLOCK)
  per_call = _balanced_chunk(needed, max(2, _OUTPUT_ELEMENTS // (chunk * _COMBO_BLOCK)), 1)
  per_call = max(2, per_call)
  n_calls = -(-needed // per_call)
  size = n_calls * per_call * _COMBO_BLOCK
  combo_shape = (n_calls, per_call, _COMBO_BLOCK)
  combo_t = _pad(np.repeat(t, delta.size), size, 0).reshape(combo_shape)
  combo_d = _pad(np.tile(delta, t.size), size, 0.5).reshape(combo_shape)
  combo_width = per_call * _COMBO_BLOCK

  split = order_split(grid)
  tables = order_tables(grid, split)
  per_step_fn = {"poisson": lambda: _per_step_rdp_fn(mesh, block, split),
                 "truncated_poisson": lambda: _per_step_rdp_fn(mesh, block, split),
                 "fixed": lambda: _fixed_rdp_fn(mesh, block, samplers.max_order(grid)),
                 "shuffle": lambda: _gaussian_rdp_fn(mesh, block)}[sampling]()
  epsilon_fn = _epsilon_fn(mesh, block, sampling if sampling in _PER_PAIR else None)
  # The result (NaN where another process computes), or with ``output`` the chunk being
  # collected (written when complete).
  out = np.full((n_pairs, n_combos) if output is None else (chunk, n_combos), np.nan, dtype)

  def tasks():
    for start in range(0, n_pairs, chunk):
      if start // chunk in skip:
        continue
      idx = np.arange(start, min(start + chunk, n_pairs))
      # Padding pairs (q = 0, σ = 1) are exact special cases of the kernel: no refinement.
      qc = _pad(q[idx // sigma.size], chunk, 0.0)
      sc = _pad(sigma[idx % sigma.size], chunk, 1.0)
      rdp, pending = per_step_fn(qc, sc, grid, tables)   # reused by every (T, δ) call of this chunk
      pending = np.asarray(pending)
      if pending.any():   # rare: the per-order quadrature, compiled only when needed
        rdp = fill_pending(rdp, pending, qc, sc, grid)
      # Per pair: shuffled batches' steps per epoch (the epochs are counted from T there), or
      # truncated Poisson batches' overflow probability per step.
      if sampling == "shuffle":
        per_pair = np.asarray(samplers.steps_per_epoch(qc, dataset_size), dtype)
      elif sampling == "truncated_poisson":
        per_pair = samplers.overflow_mass(jnp.asarray(qc), jnp.ones_like(qc), dataset_size,
                                          max_batch_size, total=False)
      else:
        per_pair = np.ones((qc.size,), dtype)
      for c in range(n_calls):
        yield idx, c, epsilon_fn(rdp, per_pair, combo_t[c], combo_d[c], grid)

  def collect(task, bar):
    idx, c, eps = task
    lo, hi = c * combo_width, min((c + 1) * combo_width, n_combos)
    rows = idx if output is None else slice(0, idx.size)
    out[rows, lo:hi] = np.asarray(eps)[:idx.size, :hi - lo]
    if output is not None and c == n_calls - 1:
      writer.submit(idx[0] // chunk, idx, out[:idx.size].copy())
    if bar is None:
      return
    if across:   # every process's parts on the shared file system
      bar.n = max(bar.n, sweep_output.written(output, spec) * n_combos)
      bar.refresh()
    else:
      bar.update(idx.size * (hi - lo))

  remaining = n_pairs - sum(min(chunk, n_pairs - i * chunk) for i in skip)
  progress_bar = progress_bar if me == 0 else None
  # Process 0 reports: with output, the parts every process has written (read from the
  # directory as it goes); without, its own share.
  across = output is not None and n_proc > 1
  if output is None:
    _run_pipelined(tasks(), collect, progress_bar, remaining * n_combos)
    if n_proc > 1 and gather:   # each chunk from the process that computed it
      from jax.experimental import multihost_utils
      every = np.asarray(multihost_utils.process_allgather(out))
      rows = np.arange(n_pairs)
      out = every[(rows // chunk) % n_proc, rows]
    return jnp.asarray(out.reshape(q.size, sigma.size, t.size, delta.size))
  writer = sweep_output.PartWriter(output, (q, sigma, t, delta))
  total = n_pairs * n_combos if across else remaining * n_combos
  try:
    _run_pipelined(tasks(), collect, progress_bar, total)
  finally:
    writer.close()
  _barrier(n_proc, "jaxrdp.sweep: parts written")
  return output


def _processes(devices, mesh):
  """(P, this process's index) of a multi-process run (``jax.distributed``) whose sweep spreads
  over the processes: when no devices are given; (1, 0) otherwise. Every process must have as
  many local devices (the chunk layout depends on it)."""
  n_proc = jax.process_count()
  if devices is not None or n_proc == 1:
    return 1, 0
  if jax.device_count() != n_proc * mesh.devices.size:
    raise ValueError(f"a sweep over {n_proc} processes needs the same number of local devices "
                     f"on each; this one has {mesh.devices.size} of {jax.device_count()} in all.")
  return n_proc, jax.process_index()


def _barrier(n_proc, name):
  """Waits for every process (of a multi-process sweep) to get here."""
  if n_proc > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


@deprecation.positional_in_old_order("target_epsilons", "sampling_rates", "steps", "deltas")
def sweep_noise_multiplier(target_epsilons: jax.typing.ArrayLike, *,
                           deltas: jax.typing.ArrayLike, sampling_rates: jax.typing.ArrayLike,
                           steps: jax.typing.ArrayLike,
                           orders: jax.typing.ArrayLike | None = None,
                           chunk_size: int | None = None, progress: bool = False,
                           devices: Sequence[jax.Device] | None = None,
                           gather: bool = True) -> jax.Array:
  r"""Smallest noise multiplier σ meeting each target ε, over the grid of targets, δ, q and T.

  Cell by cell the same search as :func:`jaxrdp.calibrate_noise_multiplier` (bracketed
  Illinois regula falsi in log σ on the grid-order ε; the σ returned was checked to meet the
  target), vectorised over the cells of a chunk: the search loop runs until every cell of the
  chunk has converged, each cell keeping its own result.

  **Changed in 1.0:** the arguments follow :func:`jaxrdp.calibrate_noise_multiplier`'s order
  (target ε, δ, q, T) (0.1.0: ``sweep_noise_multiplier(target_epsilons, sampling_rates, steps,
  deltas)``). The result keeps its 0.1.0 axes (E, Q, T, D), :func:`sweep`'s layout (q, T, δ):
  reordering them would silently change what an index written for 0.1.0 reads. For this
  release all but ``target_epsilons`` are keyword-only,
  ``sweep_noise_multiplier(targets, deltas=δs, sampling_rates=qs, steps=ts)``; a positional
  call is read in the 0.1.0 order, as before, and warns (``DeprecationWarning``). The next
  release takes ``(target_epsilons, deltas, sampling_rates, steps)`` by position.

  Args:
    target_epsilons: 1-D array of E targets ε > 0.
    deltas: 1-D array of D values of δ in (0, 1).
    sampling_rates: 1-D array of Q sampling rates q in [0, 1].
    steps: 1-D array of T step counts ≥ 0.
    orders: the order grid (default :data:`jaxrdp.DEFAULT_ORDERS`), 1-D.
    chunk_size: at most this many cells per compiled call (rounded up to whole blocks of
      ~4096 / len(orders) cells, at most 32, on every CPU device); default 4 blocks per
      device. Results do not depend on it.
    progress: show a progress bar (needs ``tqdm``).
    devices: the devices to spread the work over (default: all local devices).
    gather: in a multi-process run (``jax.distributed``), every process gets the whole grid
      (True, one all-gather at the end) or only the cells it computed, NaN elsewhere (False).
      As in :func:`sweep`: chunk i on process i mod P, each on its local devices, the cells
      bitwise those of one process with as many local devices.

  Returns:
    σ of shape (E, Q, T, D), in the floating dtype of ``sampling_rates`` and ``steps``. NaN
    where no σ in [1e-4, 1e8] meets the target, i.e. where
    :func:`jaxrdp.calibrate_noise_multiplier` raises ``ValueError`` (ε at σ = 1e8 is still
    above the target: only for extreme step counts, e.g. 1e16 steps at q = 1).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.
  """
  eps = _grid_axis("target_epsilons", target_epsilons, "target_epsilon")
  q = _grid_axis("sampling_rates", sampling_rates, "sampling_rate")
  t = _grid_axis("steps", steps, "steps")
  delta = _grid_axis("deltas", deltas, "delta")
  dtype = jnp.result_type(q, t)   # as calibrate_noise_multiplier
  grid = _order_grid(orders, dtype)
  mesh = _mesh(devices)
  chunk_size = _check_chunk_size(chunk_size)
  progress_bar = _progress_bar(progress)

  axes = [np.asarray(v.astype(dtype)) for v in (eps, q, t, delta)]
  shape = tuple(v.size for v in axes)
  n_cells = math.prod(shape)
  block, chunk = _layout(n_cells, grid.size, chunk_size, _SEARCH_CALL_BLOCKS, mesh,
                         _SEARCH_BLOCK_MAX)
  split = order_split(grid)
  tables = order_tables(grid, split)
  search_fn = _search_fn(mesh, block, split)
  gather = validation.check_bool("gather", gather)
  n_proc, me = _processes(devices, mesh)
  out = np.full(n_cells, np.nan, dtype)   # NaN where another process computes
  filler = (1.0, 0.5, 0.0, 0.5)   # target ε = 1, q = 1/2, T = 0, δ = 1/2: found at once
  starts = [s for s in range(0, n_cells, chunk) if (s // chunk) % n_proc == me]

  def tasks():
    for start in starts:
      idx = np.arange(start, min(start + chunk, n_cells))
      cell = np.unravel_index(idx, shape)
      args = [_pad(v[i], chunk, f) for v, i, f in zip(axes, cell, filler)]
      yield idx, search_fn(*args, grid, tables)

  def collect(task, bar):
    idx, (sigma, is_open) = task
    sigma = np.array(sigma[:idx.size])
    # A cell whose search met a value the shared nodes left open (rare): its search again,
    # as calibrate_noise_multiplier runs it (the per-order quadrature fills those values).
    for k in np.flatnonzero(np.asarray(is_open)[:idx.size]):
      target, q_k, t_k, delta_k = (v[i] for v, i in zip(axes, np.unravel_index(idx[k], shape)))
      sigma[k] = _host_calibration("noise_multiplier", target, delta_k, q_k[None], t_k[None], grid)
    out[idx] = sigma
    if bar is not None:
      bar.update(idx.size)

  mine = sum(min(chunk, n_cells - start) for start in starts)
  _run_pipelined(tasks(), collect, progress_bar if me == 0 else None, mine)
  if n_proc > 1 and gather:   # each chunk from the process that computed it
    from jax.experimental import multihost_utils
    every = np.asarray(multihost_utils.process_allgather(out))
    cells = np.arange(n_cells)
    out = every[(cells // chunk) % n_proc, cells]
  return jnp.asarray(out.reshape(shape))


def _compose(rdp, t):
  """T-step RDP from the per-step RDP, with compute_rdp's conventions (0 steps spend nothing,
  even at orders where one step is infinite)."""
  return jnp.where(t == 0, jnp.zeros_like(rdp), t * rdp)


def _in_blocks(fn, block, *arrays):
  """fn on consecutive blocks of ``block`` items of each array (leading axis), concatenated."""
  blocked = tuple(a.reshape((-1, block) + a.shape[1:]) for a in arrays)
  out = loops.map(lambda xs: fn(*xs), blocked)
  return jax.tree_util.tree_map(lambda v: v.reshape((-1,) + v.shape[2:]), out)


def _sharded(local, mesh, n_sharded, n_replicated):
  """``local`` on every device of the mesh: the first n_sharded arguments split along their
  leading axis, the others replicated; no communication."""
  spec, rep = PartitionSpec(_AXIS), PartitionSpec()
  in_specs = (spec,) * n_sharded + (rep,) * n_replicated
  return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=spec,
                               check_vma=False))


@functools.lru_cache(maxsize=None)
def _per_step_rdp_fn(mesh, block, split):
  """(pairs,), (pairs,), (K,), tables -> per-step RDP (pairs, K) and the entries still to compute
  by the per-order quadrature (see :func:`jaxrdp.mechanisms.sampled_gaussian.fill_pending`); each device
  on its share of pairs. ``split``: order_split of the grid (exact sums at integer orders,
  shared nodes at fractional ones)."""
  def local(q, sigma, grid, tables):
    one_block = lambda q, s: log_a_and_rdp_at_orders(q, s, grid, split, tables, fallback=False)[1:]
    return _in_blocks(one_block, block, q, sigma)
  return _sharded(local, mesh, 2, 2)


@functools.lru_cache(maxsize=None)
def _fixed_rdp_fn(mesh, block, n_max):
  """:func:`_per_step_rdp_fn` for fixed-size batches: the bound of sampling without
  replacement at σ/2 (:func:`jaxrdp.accounting.samplers.fixed_rdp`), nothing left open."""
  def local(q, sigma, grid, tables):
    del tables
    def one_block(q, s):
      rdp = without_replacement_unchecked(q[:, None], s[:, None] / 2, grid[None, :], n_max)
      return rdp, jnp.zeros(rdp.shape, bool)
    return _in_blocks(one_block, block, q, sigma)
  return _sharded(local, mesh, 2, 2)


@functools.lru_cache(maxsize=None)
def _gaussian_rdp_fn(mesh, block):
  """:func:`_per_step_rdp_fn` for shuffled batches: the RDP of one participation, a Gaussian
  mechanism at σ/2, 2α/σ² (+inf at σ = 0); q enters through the epochs."""
  def local(q, sigma, grid, tables):
    del q, tables
    s = sigma[:, None]
    rdp = jnp.where(s > 0, 2 * grid[None, :] / jnp.where(s > 0, s, 1.0) ** 2, jnp.inf)
    return rdp, jnp.zeros(rdp.shape, bool)
  return _sharded(local, mesh, 2, 2)


_PER_PAIR = ("shuffle", "truncated_poisson")   # samplers with a per-pair input to the conversion


@functools.lru_cache(maxsize=None)
def _epsilon_fn(mesh, block, sampling):
  """Per-step RDP (pairs, K), a per-pair value (pairs,), T and δ of shape (combo blocks,
  _COMBO_BLOCK) -> ε of shape (pairs, combos). ``sampling`` (static): None (the per-pair
  value unused), ``"shuffle"`` (it is the steps per epoch S: T steps count as the epochs they
  overlap, ⌊(T − 1)/S⌋ + 1, not as T) or ``"truncated_poisson"`` (it is the probability that
  a step's batch overflows: T times it is charged to δ, :func:`samplers.additive_epsilon`)."""
  def local(rdp, per_pair, combo_t, combo_d, grid):
    def one_block(rdp, per_pair):
      def one_combo_block(t, d):
        t = t[None, :, None]
        steps = t
        if sampling == "shuffle":
          steps = samplers.epochs_from_start(t, per_pair[:, None, None])
        composed = _compose(rdp[:, None, :], steps)
        epsilon_at = lambda delta: compute_epsilon(grid, composed, delta)[0]
        if sampling == "truncated_poisson":
          overflow = jnp.where(t[..., 0] > 0, t[..., 0] * per_pair[:, None], 0.0)
          return samplers.additive_epsilon(epsilon_at, d[None, :], overflow)
        return epsilon_at(d[None, :])
      eps = loops.map(lambda td: one_combo_block(*td), (combo_t, combo_d))  # (blocks, pairs, 8)
      return jnp.moveaxis(eps, 0, 1).reshape(rdp.shape[0], -1)
    return _in_blocks(one_block, block, rdp, per_pair)
  return _sharded(local, mesh, 2, 3)


@functools.lru_cache(maxsize=None)
def _search_fn(mesh, block, split):
  """(cells,) arrays of target ε, q, T, δ, the grid and its tables -> (calibrated σ, open), each
  (cells,): calibrate_noise_multiplier's search with every order through the grid's ``split``
  (exact sums, shared nodes; open: a value they left open was met), vmapped over a block (the
  search loop runs until every cell of the block has converged)."""
  def one(target, q, t, delta, grid, tables):
    return _calibrate_on_grid(target, delta, q[None], t[None], grid, tables, False, split=split,
                              unknown="noise_multiplier")

  def local(target, q, t, delta, grid, tables):
    searches = jax.vmap(one, in_axes=(0, 0, 0, 0, None, None))
    return _in_blocks(lambda *cells: searches(*cells, grid, tables), block, target, q, t, delta)
  return _sharded(local, mesh, 4, 2)


def _run_pipelined(tasks, collect, progress_bar, total):
  """Dispatch each task (an iterator step launches a compiled call) before collecting the
  previous one: dispatch is asynchronous, so the devices compute task i+1 while the host
  copies task i out, and at most two results are alive at a time."""
  bar = None if progress_bar is None else progress_bar(total=total, unit="cell", unit_scale=True)
  pending = None
  try:
    for task in tasks:
      if pending is not None:
        collect(pending, bar)
      pending = task
    if pending is not None:
      collect(pending, bar)
  finally:
    if bar is not None:
      bar.close()


def _grid_axis(name, x, domain):
  """A grid axis: a concrete 1-D array of values in ``DOMAINS[domain]``."""
  if x is None:
    raise TypeError(f"{name} is required, got None.")
  validation.check_float_dtype(name, x)
  if not validation.is_concrete(x):
    raise TypeError(f"{name}: the sweep runs its own compiled chunks and cannot be traced; "
                    "call it outside jax.jit / jax.vmap / jax.grad.")
  v = validation.as_float_array(x)
  if v.ndim != 1:
    raise ValueError(f"{name} must be a 1-D array (one entry per grid point), got shape "
                     f"{v.shape}.")
  validation.check(domain, v, name=name)
  return v


def _order_grid(orders, dtype):
  grid = order_grid(orders, dtype)
  if grid.ndim != 1:
    raise ValueError(f"orders must be a 1-D array, got shape {grid.shape}.")
  return np.asarray(grid)


def _check_chunk_size(chunk_size):
  if chunk_size is None:
    return None
  if isinstance(chunk_size, (bool, np.bool_)) or not isinstance(chunk_size, (int, np.integer)):
    raise TypeError(f"chunk_size must be a positive int or None, got {chunk_size!r}.")
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be a positive int (>= 1), got {chunk_size}.")
  return int(chunk_size)


def _progress_bar(progress):
  """The tqdm class when a progress bar is asked for (imported only then), else None."""
  if not progress:
    return None
  try:
    from tqdm.auto import tqdm
  except ImportError:
    raise ImportError("progress=True needs tqdm: pip install tqdm (or pass progress=False)."
                      ) from None
  return tqdm


def _mesh(devices):
  devices = jax.local_devices() if devices is None else list(devices)
  if not devices:
    raise ValueError("devices must not be empty.")
  return Mesh(np.array(devices), (_AXIS,))


def _layout(n_items, n_orders, chunk_size, call_blocks, mesh, max_block=None):
  """(block, chunk): items per block, and per call: whole blocks on every device, at least two
  (XLA inlines a loop of one iteration, which changes the compiled block), balanced so that
  the last call is not mostly padding. ``max_block``: at most this many items per block, by
  platform (none where not given)."""
  platform = mesh.devices.flat[0].platform
  target = _BLOCK_ELEMENTS.get(platform, _BLOCK_ELEMENTS_ACCELERATOR)
  block = max(2, target // n_orders)
  if max_block and platform in max_block:
    block = min(block, max_block[platform])
  unit = block * mesh.devices.size
  return block, max(2 * unit, _balanced_chunk(n_items, chunk_size or unit * call_blocks, unit))


def _balanced_chunk(n, limit, multiple):
  """The smallest multiple of ``multiple`` that covers n items in as many chunks of at most
  ``limit`` (rounded up to the multiple) as needed: padding stays below one multiple per chunk."""
  limit = -(-max(1, limit) // multiple) * multiple
  n_chunks = -(-n // limit)
  per_chunk = -(-n // n_chunks)
  return -(-per_chunk // multiple) * multiple


def _pad(v, size, fill):
  return np.concatenate([v, np.full(size - v.size, fill, v.dtype)])
