"""examples/optimize_schedule.py's clipped gradient sum (ghost norms, used by the example and by
benchmarks/schedule_design.py): equal to per-example clipping, the transform's own
(``jaxrdp``'s ``clip_and_sum`` of ``jax.vmap(jax.grad(loss))``), to float32 rounding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrdp.training.microbatch import clip_and_sum

from scripts import load_script


def _load():
  return load_script("examples/optimize_schedule.py")


@pytest.mark.parametrize("sizes", [(64, 32, 10), (30, 2)])
@pytest.mark.parametrize("clip", [0.05, 1.0, 1e3])   # every example clipped, some, none
def test_ghost_norms_clip_and_sum_as_per_example_gradients(sizes, clip):
  ex = _load()
  rng = np.random.default_rng(sizes[0])
  x = jnp.asarray(rng.normal(size=(48, sizes[0])), jnp.float32)
  y = jnp.asarray(rng.integers(0, sizes[-1], 48), jnp.int32)
  mask = jnp.asarray(rng.uniform(size=48) < 0.7)
  params = ex.init_mlp(jax.random.key(3), sizes)
  loss = lambda p, xi, yi: -jax.nn.log_softmax(ex.logits(p, xi[None]))[0, yi]
  per_example = jax.vmap(jax.grad(loss), (None, 0, 0))(params, x, y)
  want = clip_and_sum(per_example, clip, mask)
  got = ex.clipped_grad_sum(params, x, y, mask, clip)
  assert float(got.l2_norm_clip) == clip
  assert jax.tree.structure(got.grad_sum) == jax.tree.structure(want)
  # float32 sums of 48 terms: to a few ulps of the sum of the terms' sizes
  for a, b, g in zip(jax.tree.leaves(got.grad_sum), jax.tree.leaves(want),
                     jax.tree.leaves(per_example)):
    size = np.sum(np.abs(np.asarray(g)), axis=0) * min(1.0, clip)
    np.testing.assert_array_less(np.abs(np.asarray(a) - np.asarray(b)), 1e-6 * size + 1e-30)
