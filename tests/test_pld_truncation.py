"""Truncated Poisson sampling: its step weights against SciPy's binomial tails, the replace-one
loss's inverse, and ε against dp_accounting's ``TruncatedSubsampledGaussianDpEvent``.

Box: N ∈ [10³, 10⁷], B from below the mean to 20 standard deviations above it, q ∈ [1e-3,
0.5], σ ∈ [0.8, 1.5], T ∈ [500, 3000], δ ∈ {1e-5, 1e-6}. ε within [1 − 1e-7, 1.01] of
dp_accounting's PLD (interval 1e-4) with ``dataset_size`` N + 1 (the larger neighbour; its values
stored in tests/data/peer_references.json by tools/make_peer_references.py, which a slow test
recomputes), and never below the PRV accountant's certified lower bound on the same pair
(tests/prv_pairs.py, written from the pair's definition)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jaxrdp
from jaxrdp.accounting.pld import discretisation, truncation
from conftest import peer_references
import prv_pairs
from scripts import load_script

@pytest.mark.parametrize("n, b, q", [
    (60_000, 400, 0.004), (60_000, 300, 0.004), (60_000, 240, 0.004), (60_000, 200, 0.004),
    (1000, 10, 0.005), (1000, 3, 0.5), (10**7, 12_000, 1e-3), (10**7, 10_100, 1e-3),
    (10**7, 9000, 1e-3), (100, 99, 0.3), (2, 1, 0.5)])
def test_weights_bound_scipy_binomial_tails(n, b, q):
  # w = P[Binomial(N − 1, q) ≥ B], q_c = B·P[Binomial(N, q) > B]/(N·w) (SciPy's sf, a reference
  # computed independently of the window sums).
  keep, w, qc = (float(v) for v in _weights(n, b, q))
  exact_w = stats.binom.sf(b - 1, n - 1, q)
  exact_qc = stats.binom.sf(b, n, q) * b / (exact_w * n)
  assert w >= exact_w and keep >= 1 - exact_w          # each weight an upper bound ...
  assert w <= exact_w * (1 + 1e-6) + 1e-15              # ... and close
  assert keep <= (1 - exact_w) * (1 + 1e-6) + 1e-15
  assert exact_qc * (1 - 1e-12) <= qc <= exact_qc * (1 + 1e-8)
  # The host's estimate for sizing (certified tails of jaxrdp.accounting.binomial).
  host_keep, host_w, host_qc = (float(v) for v in truncation.host_weights(n, b, q))
  assert host_w == pytest.approx(exact_w, rel=1e-6, abs=1e-15)
  assert host_qc == pytest.approx(exact_qc, rel=1e-6)


def _weights(n, b, q):
  """The graph's weights (1 − w, w, q_c) of N = n, B = b at rate q."""
  log_c, error = truncation.log_choose(n - 1, b)
  return truncation.truncation_weights(q, n, b, log_c, error)


def test_weights_without_truncation_and_at_q_one():
  for weights in (_weights, truncation.host_weights):
    assert [float(v) for v in weights(100, 100, 0.3)] == [1.0, 0.0, 0.0]
    assert [float(v) for v in weights(100, 5, 0.0)] == [1.0, 0.0, 0.0]
    assert [float(v) for v in weights(100, 5, 1.0)] == [0.0, 1.0, 0.05]


def test_replace_loss_inverse():
  # x(u) of the replace-one pair maps back to u through the loss itself, for q_c from 1e-6 to 1
  # and s = σ/2 from 0.1 to 5 (A = e^{1/(2s²)}(1 − q_c)/q_c up to e^{50}).
  u = jnp.linspace(-30.0, 30.0, 121)
  for qc in (1e-6, 1e-3, 0.3, 1.0):
    for s in (0.1, 0.5, 2.5):
      _, z0, _ = discretisation._replace_x_of_loss(u, jnp.float64(qc), jnp.float64(s))
      x = np.asarray(z0) * s
      reachable = np.abs(x) < 1e3
      back = np.asarray(discretisation._replace_loss(jnp.asarray(x), qc, s))
      np.testing.assert_allclose(back[reachable], np.asarray(u)[reachable], rtol=1e-9,
                                 atol=1e-9)


CASES = peer_references("truncated_poisson")


@pytest.mark.parametrize("case", CASES, ids=lambda case: case["id"])
def test_epsilon_against_dp_accounting(case):
  n, b, q, sigma, steps, delta = (case[k] for k in ("dataset_size", "max_batch_size", "q",
                                                    "sigma", "steps", "delta"))
  eps = float(jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, accountant="pld",
                                   sampling="truncated_poisson", dataset_size=n,
                                   max_batch_size=b))
  assert case["epsilon"] * (1 - 1e-7) <= eps <= case["epsilon"] * 1.01
  # At least the Poisson ε (the truncation term only adds), and more where batches are cut
  # often enough to matter.
  poisson = float(jaxrdp.pld_epsilon(q, sigma, steps, delta))
  assert eps >= poisson


def _prv_check(case):
  """(jaxrdp's ε, the PRV accountant's certified lower bound on the pair's ε, or None where
  the accountant fails) of a case (tests/prv_pairs.py: the pair from its definition, the
  weights from SciPy's binomial tails)."""
  n, b, q, sigma, steps, delta = (case[k] for k in ("dataset_size", "max_batch_size", "q",
                                                    "sigma", "steps", "delta"))
  eps = float(jaxrdp.dpsgd_epsilon(q, sigma, steps, delta, accountant="pld",
                                   sampling="truncated_poisson", dataset_size=n,
                                   max_batch_size=b))
  return eps, prv_pairs.lower_bound(prv_pairs.truncated_poisson(n + 1, b, q, sigma), steps,
                                    delta, case["epsilon"])


# The two quickest cases (~2 s each for the PRV accountant); all of them in the slow test.
@pytest.mark.parametrize("case", CASES[1:3], ids=lambda case: case["id"])
def test_epsilon_is_never_below_the_prv_accountants_lower_bound(case):
  eps, lower = _prv_check(case)
  assert lower is not None and 0.97 * eps <= lower <= eps, (eps, lower)


@pytest.mark.slow   # the PRV accountant: 2 to 5 s per case
def test_every_case_is_never_below_the_prv_accountants_lower_bound():
  checked = [_prv_check(case) for case in CASES]
  assert all(lower is None or lower <= eps for eps, lower in checked), checked
  assert sum(lower is not None for _, lower in checked) >= len(CASES) - 1, checked


@pytest.mark.slow   # dp_accounting: 1 to 3 s per case
@pytest.mark.parametrize("case", CASES, ids=lambda case: case["id"])
def test_stored_dp_accounting_values_are_the_installed_ones(case):
  pytest.importorskip("dp_accounting")
  fresh = load_script("tools/make_peer_references.py").truncated_poisson_epsilon(
      *(case[k] for k in ("dataset_size", "max_batch_size", "q", "sigma", "steps", "delta")))
  # dp_accounting's PLD composes by FFT convolution, whose last digits depend on the machine
  # and its libraries: this machine's values are up to 1.8e-8 (relative) from the stored ones
  # (same dp_accounting 0.6.0; deterministic on each). Far below what the stored values serve
  # for (jaxrdp within 1 % above them), far above a float64 rounding.
  assert fresh == pytest.approx(case["epsilon"], rel=1e-7)


def test_no_truncation_is_poisson():
  # B ≥ N + 1: no batch is ever cut, every weight of the replace-one term is 0; the same PMFs
  # (only the rounding allowance charged for the mixing differs: ~1e-13).
  args = (0.02, 1.1, 300, 1e-5)
  cut = float(jaxrdp.pld_epsilon(*args, dataset_size=500, max_batch_size=501))
  poisson = float(jaxrdp.pld_epsilon(*args))
  assert poisson <= cut <= poisson * (1 + 1e-11)


def test_epsilon_falls_with_the_largest_batch():
  eps = [float(jaxrdp.pld_epsilon(0.004, 1.0, 1000, 1e-5, dataset_size=60_000,
                                  max_batch_size=b)) for b in (260, 280, 300, 340)]
  assert eps == sorted(eps, reverse=True) and eps[0] > eps[-1]


def test_jit_grad_and_vmap():
  grid = jaxrdp.pld_grid(0.004, 1.0, 1000, delta=1e-5, dataset_size=60_000, max_batch_size=300)
  eps = lambda q, s: jaxrdp.pld_epsilon(q, s, 1000, 1e-5, pld_grid=grid, dataset_size=60_000,
                                        max_batch_size=300)
  eager = float(jaxrdp.pld_epsilon(0.004, 1.0, 1000, 1e-5, dataset_size=60_000,
                                   max_batch_size=300))
  assert float(jax.jit(eps)(0.004, 1.0)) == pytest.approx(eager, rel=1e-12)
  dq, ds = jax.grad(eps, argnums=(0, 1))(0.004, 1.0)
  step = 1e-6
  fd_q = (float(eps(0.004 + step * 0.004, 1.0)) - float(eps(0.004 - step * 0.004, 1.0))) / (
      2 * step * 0.004)
  assert np.isfinite(float(dq)) and float(ds) < 0
  assert float(dq) == pytest.approx(fd_q, rel=0.05)
  batched = jax.vmap(lambda s: eps(0.004, s))(jnp.array([0.9, 1.0, 1.1]))
  assert float(batched[1]) == pytest.approx(eager, rel=1e-12)
  assert np.all(np.diff(np.asarray(batched)) < 0)


def test_rdp_adds_the_overflows_to_delta():
  # Overflow impossible (B ≥ N + 2): the Poisson RDP ε; likely overflows: +inf; in between,
  # at least the Poisson RDP ε and at least the tight PLD.
  args = (0.004, 1.0, 1000, 1e-5)
  poisson = float(jaxrdp.dpsgd_epsilon(*args))
  never = float(jaxrdp.dpsgd_epsilon(*args, sampling="truncated_poisson", dataset_size=60_000,
                                     max_batch_size=60_002))
  assert never == pytest.approx(poisson, rel=1e-12)
  assert float(jaxrdp.dpsgd_epsilon(*args, sampling="truncated_poisson", dataset_size=60_000,
                                    max_batch_size=300)) == np.inf
  rare = float(jaxrdp.dpsgd_epsilon(*args, sampling="truncated_poisson", dataset_size=60_000,
                                    max_batch_size=400))
  tight = float(jaxrdp.dpsgd_epsilon(*args, accountant="pld", sampling="truncated_poisson",
                                     dataset_size=60_000, max_batch_size=400))
  assert rare >= poisson and rare >= tight


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(sampling="truncated_poisson", max_batch_size=10), ValueError, "dataset_size"),
    (dict(sampling="truncated_poisson", dataset_size=100), ValueError, "max_batch_size"),
    (dict(sampling="truncated_poisson", dataset_size=100, max_batch_size=0), ValueError,
     r"max_batch_size must lie in \[1, inf\]; got 0"),
    (dict(sampling="truncated_poisson", dataset_size=100, max_batch_size=2.5), TypeError,
     "max_batch_size must be an int"),
    (dict(max_batch_size=10), ValueError, "max_batch_size applies to sampling='truncated_poisson'"),
    (dict(sampling="truncated_poisson", dataset_size=100, max_batch_size=10,
          neighboring="replace_one"), ValueError, "add_or_remove"),
])
def test_bad_arguments(kwargs, error, match):
  with pytest.raises(error, match=match):
    jaxrdp.dpsgd_epsilon(0.01, 1.0, 100, 1e-5, **kwargs)


def test_pld_needs_both_sizes():
  with pytest.raises(ValueError, match="both dataset_size and max_batch_size"):
    jaxrdp.pld_epsilon(0.01, 1.0, 100, 1e-5, dataset_size=100)


def _truncated_run(max_batch_size, steps=30, n=1000, q=0.005, sigma=1.0, pld_phases=0):
  tx = jaxrdp.dpsgd(0.1, 1.0, sigma, jax.random.key(0), sampling_rate=q,
                    expected_batch_size=q * n, sampling="truncated_poisson", dataset_size=n,
                    max_batch_size=max_batch_size, pld_phases=pld_phases)
  params = {"w": jnp.zeros(3)}
  state = tx.init(params)
  update = jax.jit(lambda g, s, m: tx.update(g, s, params, mask=m))
  key = jax.random.key(1)
  for _ in range(steps):
    key, k = jax.random.split(key)
    _, mask = jaxrdp.poisson_sample(k, n, q, max_batch_size, max_overflow_probability=1.0)
    _, state = update({"w": jnp.ones((max_batch_size, 3))}, state, mask)
  return state


@pytest.mark.parametrize("pld_phases", [0, 4])
def test_transform_accounts_its_cut_batches(pld_phases):
  # The state carries the sampler (static: no leaves); privacy_spent accounts the cut batches
  # as dpsgd_epsilon does, tightly with the PLD, by the additive δ with RDP (+inf here: cuts
  # are frequent), also under jit.
  state = _truncated_run(12, pld_phases=pld_phases)
  assert state[0].truncation == jaxrdp.training.state.Truncation(1000, 12)
  expected = jaxrdp.dpsgd_epsilon(0.005, 1.0, 30, 1e-5, accountant="pld",
                                  sampling="truncated_poisson", dataset_size=1000,
                                  max_batch_size=12)
  eps, _ = jaxrdp.privacy_spent(state, 1e-5, accountant="pld")
  # With a PLD log the run is composed as its logged phases (the same q and σ): the same
  # composition, whose phase sums' rounding allowance grows with their number of terms.
  assert float(eps) >= float(expected) * (1 - 1e-12)
  assert float(eps) == pytest.approx(float(expected), rel=1e-12 if pld_phases == 0 else 1e-7)
  poisson = float(jaxrdp.pld_epsilon(0.005, 1.0, 30, 1e-5))
  assert float(eps) > poisson
  assert float(jaxrdp.privacy_spent(state, 1e-5)[0]) == np.inf
  assert float(jax.jit(lambda s: jaxrdp.privacy_spent(s, 1e-5)[0])(state)) == np.inf


def test_transform_without_cuts_spends_the_poisson_rdp():
  # M = N + 1: no batch is ever cut, the RDP account is the Poisson one.
  state = _truncated_run(1001, steps=5)
  eps, order = jaxrdp.privacy_spent(state, 1e-5)
  rdp = jaxrdp.compute_rdp(0.005, 1.0, 5, jaxrdp.DEFAULT_ORDERS)
  expected, expected_order = jaxrdp.compute_epsilon(jaxrdp.DEFAULT_ORDERS, rdp, 1e-5)
  assert float(eps) == pytest.approx(float(expected), rel=1e-12)
  assert float(order) == float(expected_order)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(sampling="truncated_poisson", dataset_size=100), ValueError, "max_batch_size"),
    (dict(sampling="truncated_poisson", max_batch_size=10), ValueError, "dataset_size"),
    (dict(sampling="truncated_poisson", dataset_size=100, max_batch_size=1.5), TypeError,
     "max_batch_size must be an int"),
    (dict(sampling="truncated_poisson", dataset_size=0, max_batch_size=5), ValueError,
     r"dataset_size must lie in \[1, inf\]; got 0"),
    (dict(dataset_size=100), ValueError, "dataset_size applies to sampling='truncated_poisson'"),
    (dict(sampling="fixed", max_batch_size=10), ValueError, "max_batch_size applies"),
])
def test_transform_bad_truncation_arguments(kwargs, error, match):
  with pytest.raises(error, match=match):
    jaxrdp.differentially_private_aggregate(1.0, 1.0, jax.random.key(0), sampling_rate=0.01,
                                            expected_batch_size=10.0, **kwargs)


TRUNCATED = dict(sampling="truncated_poisson", dataset_size=60_000, max_batch_size=300)


def _truncated_epsilon(q, sigma, steps, accountant):
  return float(jaxrdp.dpsgd_epsilon(q, sigma, steps, 1e-5, accountant=accountant, **TRUNCATED))


def test_calibrated_noise_multiplier_meets_the_target_tightly():
  # Cut batches cost ε, so the calibrated σ is larger than the Poisson one; it meets the
  # target by the truncated account, and 1e-6 less noise does not.
  sigma = float(jaxrdp.calibrate_noise_multiplier(1.0, 1e-5, 0.004, 1000, accountant="pld",
                                                  **TRUNCATED))
  assert _truncated_epsilon(0.004, sigma, 1000, "pld") <= 1.0
  assert _truncated_epsilon(0.004, sigma * (1 - 1e-6), 1000, "pld") > 1.0
  poisson = float(jaxrdp.calibrate_noise_multiplier(1.0, 1e-5, 0.004, 1000, accountant="pld"))
  assert sigma > poisson


def test_calibrated_sampling_rate_and_steps_meet_the_target():
  q = float(jaxrdp.calibrate_sampling_rate(1.0, 1e-5, 1.0, 1000, accountant="pld", **TRUNCATED))
  assert _truncated_epsilon(q, 1.0, 1000, "pld") <= 1.0 < _truncated_epsilon(q * (1 + 1e-6), 1.0,
                                                                               1000, "pld")
  steps = int(jaxrdp.calibrate_steps(1.0, 1e-5, 0.004, 1.0, accountant="pld", **TRUNCATED))
  assert _truncated_epsilon(0.004, 1.0, steps, "pld") <= 1.0 < _truncated_epsilon(
      0.004, 1.0, steps + 1, "pld")


def test_calibration_by_rdp_adds_the_overflows():
  # Overflows rare enough (at most 400 of a mean 240): reachable, and the answer meets the
  # target by dpsgd_epsilon's own account; overflows too frequent (300): no σ reaches it.
  rare = dict(TRUNCATED, max_batch_size=400)
  sigma = float(jaxrdp.calibrate_noise_multiplier(2.0, 1e-5, 0.004, 1000, **rare))
  assert float(jaxrdp.dpsgd_epsilon(0.004, sigma, 1000, 1e-5, **rare)) <= 2.0
  assert float(jaxrdp.dpsgd_epsilon(0.004, sigma * (1 - 1e-6), 1000, 1e-5, **rare)) > 2.0
  with pytest.raises(ValueError, match="not reachable"):
    jaxrdp.calibrate_noise_multiplier(2.0, 1e-5, 0.004, 1000, **TRUNCATED)
