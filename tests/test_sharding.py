"""Data-parallel DP-SGD over 8 (fake CPU) devices, and the default float32 accountant.

XLA_FLAGS must be set before JAX initialises, so the checks run in one subprocess with
``--xla_force_host_platform_device_count=8`` and without x64 (the default user setting):

* With the batch axis sharded and the key replicated, the clipped sum is a global reduction
  and the noise is drawn once from the same key, so the update must equal the single-device
  update (exactly for the noise; up to float rounding of the reduction order for the sum).
* Without x64 the accountant is float32; 1e5 steps in a ``lax.scan`` must not drift. The
  subprocess reports its numbers and this process (x64) checks them against float64
  references.
"""

import json
import pathlib
import textwrap

import numpy as np
import pytest

import jaxrdp
from fake_devices import run_on_fake_devices


SCRIPT = textwrap.dedent("""
    import numpy as np
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxrdp.training.transform import differentially_private_aggregate, dpsgd, privacy_spent, rdp_spent

    assert jax.device_count() == 8, jax.devices()
    assert not jax.config.jax_enable_x64
    mesh = Mesh(np.array(jax.devices()), ("batch",))
    by_batch, replicated = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
    one = jax.devices()[0]

    B = 32
    rng = np.random.default_rng(0)
    params = {"w": jnp.zeros((5, 3), jnp.float32), "b": jnp.zeros((3,), jnp.float32)}
    grads = {"w": (2 * rng.normal(size=(B, 5, 3))).astype(np.float32),
             "b": (2 * rng.normal(size=(B, 3))).astype(np.float32)}
    grads["w"][27:] = np.nan  # padding rows, masked out
    mask = np.arange(B) < 27

    tx = differentially_private_aggregate(1.0, 1.1, jax.random.key(0), sampling_rate=0.01,
                                          expected_batch_size=20.0)
    state = tx.init(params)
    assert state.accountant.rdp.dtype == jnp.float32
    step = jax.jit(tx.update)

    u1, s1 = step(jax.device_put(grads, one), jax.device_put(state, one), params,
                  mask=jax.device_put(mask, one))
    g8 = jax.device_put(grads, by_batch)
    assert len(g8["w"].addressable_shards) == 8
    assert g8["w"].addressable_shards[0].data.shape[0] == B // 8
    u8, s8 = step(g8, jax.device_put(state, replicated), jax.device_put(params, replicated),
                  mask=jax.device_put(mask, by_batch))
    for k in u1:
      assert np.all(np.isfinite(np.asarray(u8[k])))
      np.testing.assert_allclose(np.asarray(u8[k]), np.asarray(u1[k]), rtol=2e-6, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(s8.key), np.asarray(s1.key))
    np.testing.assert_array_equal(np.asarray(rdp_spent(s8)[1]), np.asarray(rdp_spent(s1)[1]))

    # Noise alone (zero gradients): bit-identical, i.e. drawn once from the replicated key.
    zeros = jax.tree.map(np.zeros_like, grads)
    n1, _ = step(jax.device_put(zeros, one), jax.device_put(state, one), params,
                 mask=jax.device_put(mask, one))
    n8, _ = step(jax.device_put(zeros, by_batch), jax.device_put(state, replicated),
                 jax.device_put(params, replicated), mask=jax.device_put(mask, by_batch))
    for k in n1:
      np.testing.assert_array_equal(np.asarray(n8[k]), np.asarray(n1[k]))

    # A jitted training loop: per-example gradients of a sharded batch, three steps.
    x = rng.normal(size=(B, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=B)
    opt = dpsgd(0.5, 1.0, 1.1, jax.random.key(1), sampling_rate=0.01, expected_batch_size=20.0,
                momentum=0.9)

    def loss(p, xi, yi):
      return -jax.nn.log_softmax(xi @ p["w"] + p["b"])[yi]

    @jax.jit
    def train(p, s, x, y, m):
      def body(carry, _):
        p, s = carry
        g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(p, x, y)
        u, s = opt.update(g, s, p, mask=m)
        return (optax.apply_updates(p, u), s), None
      return jax.lax.scan(body, (p, s), None, length=3)[0]

    p1, t1 = train(params, opt.init(params), jax.device_put(x, one), jax.device_put(y, one),
                   jax.device_put(mask, one))
    p8, t8 = train(jax.device_put(params, replicated), jax.device_put(opt.init(params), replicated),
                   jax.device_put(x, by_batch), jax.device_put(y, by_batch),
                   jax.device_put(mask, by_batch))
    for k in p1:
      np.testing.assert_allclose(np.asarray(p8[k]), np.asarray(p1[k]), rtol=1e-5, atol=1e-6)
    assert float(privacy_spent(t8, 1e-5)[0]) == float(privacy_spent(t1, 1e-5)[0])
    print("SHARDING OK")

    # Float32 accountant (the default without x64): 1e5 steps.
    import json
    from jaxrdp.accounting.composition import compute_rdp
    from jaxrdp.accounting.orders import DEFAULT_ORDERS
    tx = differentially_private_aggregate(1.0, 1.1, 1, sampling_rate=0.01, expected_batch_size=10.0)
    p = {"x": jnp.zeros((1,), jnp.float32)}
    g = {"x": jnp.ones((1, 1), jnp.float32)}
    body = lambda s, _: (tx.update(g, s, p)[1], None)
    state = jax.jit(lambda s: jax.lax.scan(body, s, None, length=100_000)[0])(tx.init(p))
    orders, rdp = rdp_spent(state)
    eps, order = privacy_spent(state, 1e-5)
    step = compute_rdp(0.01, 1.1, 1, DEFAULT_ORDERS)
    print("RESULT " + json.dumps({
        "dtype": str(rdp.dtype), "count": int(state.count), "orders": np.asarray(orders).tolist(),
        "rdp": np.asarray(rdp).tolist(), "step_rdp": np.asarray(step).tolist(),
        "eps": float(eps), "eps_dtype": str(eps.dtype)}))
""")


@pytest.fixture(scope="module")
def subprocess_output(request, tmp_path_factory):
  result = run_on_fake_devices(SCRIPT, request, tmp_path_factory)
  return result


def test_sharded_update_equals_single_device_update(subprocess_output):
  out = subprocess_output
  assert "SHARDING OK" in out.stdout, out.stdout + out.stderr


def test_default_float32_accountant_does_not_drift_over_1e5_steps(subprocess_output):
  out = subprocess_output
  assert out.returncode == 0, out.stdout + out.stderr
  line = next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))
  res = json.loads(line[len("RESULT "):])
  assert res["dtype"] == "float32" and res["eps_dtype"] == "float32" and res["count"] == 100_000
  steps = 100_000
  orders32 = np.asarray(res["orders"], np.float32)
  step32 = np.asarray(res["step_rdp"], np.float64)  # the float32 kernel's per-step RDP
  np.testing.assert_allclose(np.asarray(res["rdp"]), steps * step32, rtol=1e-6)
  # ε of the exact composition of the float32 per-step values (converted in float32).
  eps_ref, _ = jaxrdp.compute_epsilon(orders32, (steps * step32).astype(np.float32), np.float32(1e-5))
  assert res["eps"] == pytest.approx(float(eps_ref), rel=1e-5)
  orders = jaxrdp.DEFAULT_ORDERS
  eps64, _ = jaxrdp.compute_epsilon(orders, jaxrdp.compute_rdp(0.01, 1.1, steps, orders), 1e-5)
  # Never below the float64 value; above it by at most the float32 RDP margin (2e-3) and rounding.
  assert float(eps64) <= res["eps"] <= float(eps64) * (1 + 3e-3)
