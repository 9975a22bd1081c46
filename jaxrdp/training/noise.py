"""Standard normal noise for a list of leaves, drawn as few times as their sizes allow."""

from __future__ import annotations

import jax
from jax import lax
import numpy as np

_GROUP_ELEMENTS = 1 << 20   # entries of one shared draw at most; a larger leaf draws alone


def _groups(leaves):
  """The leaves' indices in draws: per dtype, consecutive leaves packed while the draw stays
  within _GROUP_ELEMENTS entries; a leaf that size or larger in a draw of its own."""
  groups, open_group = [], {}
  for i, x in enumerate(leaves):
    size = int(np.prod(x.shape))
    if size >= _GROUP_ELEMENTS:
      groups.append([i])
      continue
    group = open_group.get(x.dtype)
    if group is None or group[1] + size > _GROUP_ELEMENTS:
      group = open_group[x.dtype] = [[], 0]
      groups.append(group[0])
    group[0].append(i)
    group[1] += size
  return groups


def standard_normals(key: jax.Array, leaves) -> list[jax.Array]:
  """I.i.d. N(0, 1) arrays of the leaves' shapes and dtypes (anything with ``shape`` and
  ``dtype``).

  The leaves of one dtype share a draw, cut into their shapes, up to 2^20 entries per draw;
  larger leaves draw alone (one key per draw, split from ``key`` where there are several). A
  draw per leaf puts the generator's kernels (threefry's rounds, a loop of its own on a CPU,
  and the inverse error function) into a user's training step once per leaf: a fixed compile
  cost each, ~30 kernels for the four leaves of a two-layer MLP. The bound keeps a large
  leaf's noise drawn in its own shape (where it is sharded, each device draws its part) and a
  shared draw small wherever it is placed.
  """
  groups = _groups(leaves)
  keys = jax.random.split(key, len(groups)) if len(groups) > 1 else [key]
  noise = [None] * len(leaves)
  for members, k in zip(groups, keys):
    if int(np.prod(leaves[members[0]].shape)) >= _GROUP_ELEMENTS:   # a large leaf: alone
      i = members[0]
      noise[i] = jax.random.normal(k, leaves[i].shape, leaves[i].dtype)
      continue
    sizes = [int(np.prod(leaves[i].shape)) for i in members]
    flat = jax.random.normal(k, (sum(sizes),), leaves[members[0]].dtype)
    for i, start, size in zip(members, np.cumsum([0] + sizes), sizes):
      noise[i] = lax.slice(flat, (int(start),), (int(start) + size,)).reshape(leaves[i].shape)
  return noise
