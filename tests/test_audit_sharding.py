"""The audit under data-parallel sharding (8 fake CPU devices): the noise is added once.

XLA_FLAGS must be set before JAX initialises, so the audit runs in a subprocess with
``--xla_force_host_platform_device_count=8`` and without x64 (the default user setting). The
per-example gradients (and the padding mask) are sharded along the batch axis, two examples
per device; the transform's key is replicated. If every device added its own noise, the
released update's noise std would be √8 times larger and the trials would differ completely.

* Canary alone (the other examples' gradients are zero): the clipped sum is exact in any
  reduction order, so the per-trial statistics must be bit-identical to the single-device
  ones: the same keys give the same noise, drawn once.
* A full batch with NaN padding rows: the sums differ only by float rounding of the reduction
  order, so the statistics agree to 1e-6 relative, and the audit's test, its error counts and
  its ε lower bound are the same.
"""

import json
import pathlib
import textwrap

import pytest

from fake_devices import run_on_fake_devices


SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxrdp.audit.canary import audit_transform
    from jaxrdp.training.transform import differentially_private_aggregate

    assert jax.device_count() == 8, jax.devices()
    assert not jax.config.jax_enable_x64
    mesh = Mesh(np.array(jax.devices()), ("batch",))
    by_batch = NamedSharding(mesh, P("batch"))
    one = jax.devices()[0]

    B = 16
    rng = np.random.default_rng(0)
    grads = {"w": (0.7 * rng.normal(size=(B, 5, 3))).astype(np.float32),
             "b": (0.7 * rng.normal(size=(B, 3))).astype(np.float32)}
    grads["w"][0] *= 4.0  # the canary: norm above the clip
    grads["w"][13:] = np.nan  # padding rows, masked out
    mask = np.arange(B) < 13
    canary_only = {k: np.where(np.arange(B).reshape((B,) + (1,) * (v.ndim - 1)) == 0, v, 0)
                   .astype(np.float32) for k, v in grads.items()}

    tx = differentially_private_aggregate(1.0, 1.0, 0, sampling_rate=0.5, expected_batch_size=8.0)
    kw = dict(num_trials=20_000, key=jax.random.key(3), delta=1e-5, sampling_rate=0.5,
              num_steps=2, confidence=0.99)
    out = {}
    for name, g in (("canary_only", canary_only), ("batch", grads)):
      single = audit_transform(tx, jax.device_put(g, one), 0, mask=jax.device_put(mask, one), **kw)
      g8 = jax.device_put(g, by_batch)
      assert len(g8["w"].addressable_shards) == 8
      assert g8["w"].addressable_shards[0].data.shape[0] == B // 8
      sharded = audit_transform(tx, g8, 0, mask=jax.device_put(mask, by_batch), **kw)
      diffs = [np.max(np.abs(getattr(sharded, f) - getattr(single, f)) / (1 + np.abs(getattr(single, f))))
               for f in ("absent_statistics", "present_statistics")]
      out[name] = {
          "bit_identical": bool(np.array_equal(sharded.absent_statistics, single.absent_statistics)
                                and np.array_equal(sharded.present_statistics,
                                                   single.present_statistics)),
          "max_rel_diff": float(max(diffs)),
          "included_equal": bool(np.array_equal(sharded.present_included, single.present_included)),
          "finite": bool(np.all(np.isfinite(sharded.absent_statistics))),
          "single": [single.false_positives, single.false_negatives, single.epsilon_lower_bound],
          "sharded": [sharded.false_positives, sharded.false_negatives, sharded.epsilon_lower_bound],
      }
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def result(request, tmp_path_factory):
  out = run_on_fake_devices(SCRIPT, request, tmp_path_factory)
  assert out.returncode == 0, out.stdout + out.stderr
  line = next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))
  return json.loads(line[len("RESULT "):])


def test_sharded_audit_of_the_canary_alone_is_bit_identical(result):
  r = result["canary_only"]
  assert r["finite"] and r["included_equal"]
  assert r["bit_identical"], r["max_rel_diff"]
  assert r["sharded"] == r["single"]


def test_sharded_audit_of_a_padded_batch_gives_the_same_bound(result):
  r = result["batch"]
  assert r["finite"] and r["included_equal"]
  assert r["max_rel_diff"] < 1e-6
  assert r["sharded"] == r["single"]  # same error counts, same ε lower bound
  assert r["single"][2] > 0  # the audit found something to bound
