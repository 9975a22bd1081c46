"""Standard normal noise for a list of leaves, drawn as few times as their dtypes allow."""

from __future__ import annotations

import jax
from jax import lax
import numpy as np


def standard_normals(key: jax.Array, leaves) -> list[jax.Array]:
  """I.i.d. N(0, 1) arrays of the leaves' shapes and dtypes.

  One draw per dtype (one key each, split from ``key`` when the leaves have several dtypes),
  cut into the leaves' shapes. A draw per leaf puts the generator's kernels (threefry's rounds,
  a loop of its own on a CPU, and the inverse error function) into a user's training step once
  per leaf: a fixed compile cost each, ~30 kernels for the four leaves of a two-layer MLP.
  """
  dtypes = list(dict.fromkeys(x.dtype for x in leaves))
  keys = jax.random.split(key, len(dtypes)) if len(dtypes) > 1 else [key]
  noise = [None] * len(leaves)
  for dtype, k in zip(dtypes, keys):
    members = [i for i, x in enumerate(leaves) if x.dtype == dtype]
    sizes = [int(np.prod(leaves[i].shape)) for i in members]
    flat = jax.random.normal(k, (sum(sizes),), dtype)
    for i, start, size in zip(members, np.cumsum([0] + sizes), sizes):
      noise[i] = lax.slice(flat, (int(start),), (int(start) + size,)).reshape(leaves[i].shape)
  return noise
