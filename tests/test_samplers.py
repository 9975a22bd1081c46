"""ε of fixed-size and shuffled batches (``sampling=`` across the accounting API).

References, none computed by the code under test:

* dp_accounting 0.6's ``RdpAccountant`` with ``NeighboringRelation.REPLACE_ONE`` composing
  ``SampledWithoutReplacementDpEvent(n, B, GaussianDpEvent(σ/2))`` (fixed-size batches: the sum
  of clipped gradients moves by up to 2C under a replacement, so the Gaussian's multiplier is
  σ/2), and ``GaussianDpEvent(σ/2)`` composed once per epoch (shuffled batches), on the same
  orders: equal to 1e-9 relative (both evaluate Theorem 27 of Wang, Balle, Kasiviswanathan
  2019 and the same conversion; the forward differences are computed differently, measured
  agreement ~1e-13 on this table).
* The exact ε of k Gaussian mechanisms (a Gaussian of μ = √k/(σ/2); Balle & Wang 2018, Thm. 8:
  δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)), solved with mpmath at 50 digits here: the PLD
  accountant's shuffled ε is never below it and within 2 % above it.
* The participation counts, against a simulated pipeline (a permutation per epoch cut into
  batches, the remainder dropped or kept as a smaller last batch): no example ever takes part
  more often than the count charges.
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting import privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant as dpa

import jaxrdp
from jaxrdp.accounting import samplers

REPLACE_ONE = privacy_accountant.NeighboringRelation.REPLACE_ONE
ORDERS = np.array([1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128,
                   256])

# (n, B, σ, steps, δ): MNIST-like and small runs, ε from below 1 to above 50.
FIXED_CASES = [
    (60_000, 256, 1.0, 14_063, 1e-5),
    (60_000, 256, 2.0, 2_344, 1e-5),
    (50_000, 500, 4.0, 5_000, 1e-6),
    (1_000, 10, 1.5, 300, 1e-5),
    (10_000, 1_000, 8.0, 100, 1e-3),
    (100_000, 64, 0.8, 20_000, 1e-5),
]


def _dp_accounting(events, delta, orders=ORDERS):
  accountant = dpa.RdpAccountant(orders=[float(a) for a in orders], neighboring_relation=REPLACE_ONE)
  for event, count in events:
    accountant.compose(event, count)
  return accountant.get_epsilon(delta)


@pytest.mark.parametrize("n, b, sigma, steps, delta", FIXED_CASES)
def test_fixed_batches_equal_dp_accountings_without_replacement_event_at_half_sigma(
    n, b, sigma, steps, delta):
  expected = _dp_accounting(
      [(dp_event.SampledWithoutReplacementDpEvent(n, b, dp_event.GaussianDpEvent(sigma / 2)),
        steps)], delta)
  eps = jaxrdp.dpsgd_epsilon(b / n, sigma, steps, delta, orders=ORDERS, sampling="fixed")
  assert float(eps) == pytest.approx(expected, rel=1e-9)


def test_fixed_batches_compose_a_schedule_phase_by_phase():
  n, delta = 60_000, 1e-5
  b, sigma, steps = np.array([128, 256, 512]), np.array([1.0, 1.5, 2.0]), np.array([500, 800, 300])
  expected = _dp_accounting(
      [(dp_event.SampledWithoutReplacementDpEvent(n, int(bi), dp_event.GaussianDpEvent(si / 2)),
        int(ti)) for bi, si, ti in zip(b, sigma, steps)], delta)
  eps = jaxrdp.dpsgd_epsilon(b / n, sigma, steps, delta, orders=ORDERS, sampling="fixed")
  assert float(eps) == pytest.approx(expected, rel=1e-9)


def test_fixed_batches_cost_more_than_poisson_at_the_same_sigma_on_these_cases():
  # Not a theorem for every configuration, but what the bounds give on the table: a reminder
  # that replace-one neighbours cost a factor two of noise, which the sampler does not recover.
  for n, b, sigma, steps, delta in FIXED_CASES[:3]:
    fixed = jaxrdp.dpsgd_epsilon(b / n, sigma, steps, delta, sampling="fixed")
    poisson = jaxrdp.dpsgd_epsilon(b / n, sigma, steps, delta)
    assert float(fixed) > float(poisson)


# ----- shuffled batches


def _simulated_batches(n, b, steps, keep_last, rng):
  """The batches of one run of a shuffling pipeline: each epoch a permutation, cut into batches
  of b; the remainder dropped, or kept as a smaller last batch (``keep_last``)."""
  out, batches = [], []
  for _ in range(steps):
    if not batches:
      order = rng.permutation(n)
      cut = n if keep_last else (n // b) * b
      batches = [order[i:i + b] for i in range(0, cut, b)]
    out.append(batches.pop(0))
  return out


@pytest.mark.parametrize("keep_last", [False, True])
def test_shuffle_charges_every_phase_at_least_the_participations_of_a_simulated_pipeline(
    keep_last):
  # Random (n, B) and a random split of the steps into phases: in every phase, no example takes
  # part more often than the phase is charged (both epoch lengths occur: n not a multiple of B).
  rng = np.random.default_rng(0)
  for _ in range(60):
    n = int(rng.integers(5, 60))
    b = int(rng.integers(1, n + 1))
    phases = rng.integers(0, 12, size=int(rng.integers(1, 5)))
    charged = samplers.shuffle_participations(jnp.full(phases.shape, b / n),
                                              jnp.asarray(phases, float), n)
    batches = _simulated_batches(n, b, int(phases.sum()), keep_last, rng)
    start = 0
    for steps, paid in zip(phases, np.asarray(charged)):
      counts = np.zeros(n, int)
      for batch in batches[start:start + steps]:
        counts[batch] += 1
      assert paid >= counts.max(), (n, b, phases)
      start += steps


@pytest.mark.parametrize("steps, expected", [([10.0], [1]), ([11.0], [2]), ([20.0], [2]),
                                             ([5.0, 10.0, 5.0], [1, 2, 1]),
                                             ([10.0, 0.0, 10.0], [1, 0, 2])])
def test_shuffle_charges_each_phase_the_epochs_it_overlaps(steps, expected):
  # n = 105, B = 10: epochs of 10 steps (5 examples dropped) or 11 (a last batch of 5). From
  # the start the 10-step epochs overlap more; the third phase of [10, 0, 10] (steps 10 to 19)
  # overlaps two 11-step epochs (step 10 ends the first).
  q = jnp.full((len(steps),), 10 / 105)
  got = samplers.shuffle_participations(q, jnp.asarray(steps), 105)
  np.testing.assert_array_equal(np.asarray(got), expected)


def test_shuffle_equals_dp_accountings_gaussian_composed_once_per_epoch():
  n, b, sigma, delta = 60_000, 256, 3.0, 1e-5
  steps = 234 * 20   # 20 epochs of ⌊60000/256⌋ = 234 steps
  expected = _dp_accounting([(dp_event.GaussianDpEvent(sigma / 2), 20)], delta)
  eps = jaxrdp.dpsgd_epsilon(b / n, sigma, steps, delta, orders=ORDERS, refine_order=False,
                             sampling="shuffle", dataset_size=n)
  assert float(eps) == pytest.approx(expected, rel=1e-9)
  refined = jaxrdp.dpsgd_epsilon(b / n, sigma, steps, delta, orders=ORDERS, sampling="shuffle",
                                 dataset_size=n)
  assert float(refined) <= float(eps)


def _exact_gaussian_epsilon(mu, delta):
  """ε of a Gaussian mechanism of μ at δ (Balle & Wang 2018, Thm. 8), mpmath at 50 digits."""
  import mpmath
  mpmath.mp.dps = 50
  phi = lambda x: mpmath.ncdf(x)
  mu, delta = mpmath.mpf(mu), mpmath.mpf(delta)
  f = lambda e: phi(-e / mu + mu / 2) - mpmath.exp(e) * phi(-e / mu - mu / 2) - delta
  lo, hi = mpmath.mpf(0), mpmath.mpf(1)
  while f(hi) > 0:
    hi *= 2
  return float(mpmath.findroot(f, (lo, hi), solver="bisect", tol=mpmath.mpf(10) ** -40))


@pytest.mark.parametrize("sigma, epochs, delta", [(3.0, 20, 1e-5), (8.0, 60, 1e-6), (1.5, 3, 1e-5)])
def test_shuffle_pld_is_never_below_the_exact_gaussian_epsilon(sigma, epochs, delta):
  n, b = 60_000, 256
  eps = jaxrdp.dpsgd_epsilon(b / n, sigma, 234 * epochs, delta, accountant="pld",
                             sampling="shuffle", dataset_size=n)
  exact = _exact_gaussian_epsilon(math.sqrt(epochs) / (sigma / 2), delta)
  assert exact <= float(eps) <= 1.02 * exact


# ----- the relation is explicit; bad input is named


@pytest.mark.parametrize("sampling, neighboring", [("poisson", "replace_one"),
                                                   ("fixed", "add_or_remove"),
                                                   ("shuffle", "add_or_remove")])
def test_a_sampler_with_the_other_neighbouring_relation_is_an_error(sampling, neighboring):
  size = 1000 if sampling == "shuffle" else None
  with pytest.raises(ValueError, match=f"sampling='{sampling}' with neighboring='{neighboring}'"):
    jaxrdp.dpsgd_epsilon(0.01, 1.0, 100, 1e-5, sampling=sampling, neighboring=neighboring,
                         dataset_size=size)


@pytest.mark.parametrize("sampling", ["poisson", "fixed", "shuffle"])
def test_the_samplers_own_relation_may_be_stated(sampling):
  size = 1000 if sampling == "shuffle" else None
  stated = jaxrdp.dpsgd_epsilon(0.01, 1.0, 100, 1e-5, sampling=sampling, dataset_size=size,
                                neighboring=samplers.RELATION[sampling])
  default = jaxrdp.dpsgd_epsilon(0.01, 1.0, 100, 1e-5, sampling=sampling, dataset_size=size)
  assert float(stated) == float(default)


@pytest.mark.parametrize("kwargs, match", [
    (dict(sampling="uniform"), r"sampling must be one of \('poisson', 'truncated_poisson', 'fixed', 'shuffle'\), got 'uniform'"),
    (dict(neighboring="substitute"), "neighboring must be one of"),
    (dict(sampling="shuffle"), "sampling='shuffle' needs dataset_size"),
    (dict(sampling="fixed", dataset_size=1000), "dataset_size applies to sampling='shuffle' and 'truncated_poisson' only"),
    (dict(sampling="fixed", accountant="pld"), "accountant='pld' does not account sampling='fixed'"),
    (dict(sampling="shuffle", dataset_size=1001), r"whole number of examples.*0\.01 \* 1001"),
    (dict(sampling="shuffle", dataset_size=0), r"dataset_size must lie in \[1, inf\]; got 0"),
])
def test_bad_sampler_arguments_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    jaxrdp.dpsgd_epsilon(0.01, 1.0, 100, 1e-5, **kwargs)


def test_shuffle_needs_one_batch_size_for_the_whole_schedule():
  q = np.array([0.01, 0.02])
  with pytest.raises(ValueError, match="one batch size for the whole schedule"):
    jaxrdp.dpsgd_epsilon(q, 1.0, np.array([50.0, 50.0]), 1e-5, sampling="shuffle",
                         dataset_size=1000)
  f = jax.jit(lambda q: jaxrdp.dpsgd_epsilon(q, 1.0, np.array([50.0, 50.0]), 1e-5,
                                             sampling="shuffle", dataset_size=1000))
  assert np.isnan(float(f(q)))
  assert np.isfinite(float(f(np.array([0.01, 0.01]))))


def test_dataset_size_must_be_an_int():
  with pytest.raises(TypeError, match="dataset_size must be an int"):
    jaxrdp.dpsgd_epsilon(0.01, 1.0, 100, 1e-5, sampling="shuffle", dataset_size=1000.0)


def test_shuffle_with_a_fractional_batch_under_jit_is_nan():
  f = jax.jit(lambda q: jaxrdp.dpsgd_epsilon(q, 1.0, 100, 1e-5, sampling="shuffle",
                                             dataset_size=1000))
  assert np.isnan(float(f(0.0105)))
  assert float(f(0.01)) == pytest.approx(
      float(jaxrdp.dpsgd_epsilon(0.01, 1.0, 100, 1e-5, sampling="shuffle", dataset_size=1000)),
      rel=1e-12)


# ----- JAX transformations


@pytest.mark.parametrize("sampling", ["fixed", "shuffle"])
def test_jit_vmap_and_eager_agree(sampling):
  size = 60_000 if sampling == "shuffle" else None
  eps = lambda s: jaxrdp.dpsgd_epsilon(256 / 60_000, s, 2_344, 1e-5, sampling=sampling,
                                       dataset_size=size)
  sigmas = jnp.array([0.8, 1.0, 2.0, 4.0])
  eager = np.array([float(eps(float(s))) for s in sigmas])
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(eps))(sigmas)), eager, rtol=1e-12)
  np.testing.assert_allclose(float(jax.jit(eps)(1.0)), eager[1], rtol=1e-12)


@pytest.mark.parametrize("sampling", ["fixed", "shuffle"])
def test_gradient_in_sigma_matches_central_differences(sampling):
  size = 60_000 if sampling == "shuffle" else None
  eps = lambda s: jaxrdp.dpsgd_epsilon(256 / 60_000, s, 2_344, 1e-5, sampling=sampling,
                                       dataset_size=size, refine_order=False)
  sigma, h = 2.0, 1e-6
  grad = float(jax.grad(eps)(sigma))
  central = (float(eps(sigma + h)) - float(eps(sigma - h))) / (2 * h)
  assert np.isfinite(grad) and grad < 0
  assert grad == pytest.approx(central, rel=1e-5)


# ----- calibration


def test_calibrated_sigma_of_fixed_batches_meets_the_target_and_is_the_smallest():
  q, steps, delta, target = 256 / 60_000, 14_063, 1e-5, 8.0
  sigma = float(jaxrdp.calibrate_noise_multiplier(target, delta, q, steps, sampling="fixed"))
  at = lambda s: float(jaxrdp.dpsgd_epsilon(q, s, steps, delta, sampling="fixed"))
  assert at(sigma) <= target < at(sigma * (1 - 1e-7))
  jitted = jax.jit(lambda e: jaxrdp.calibrate_noise_multiplier(e, delta, q, steps,
                                                               sampling="fixed"))(target)
  assert float(jitted) == pytest.approx(sigma, rel=1e-12)


def test_calibrated_sampling_rate_of_fixed_batches_meets_the_target():
  delta, target, sigma, steps = 1e-5, 4.0, 2.0, 5_000
  q = float(jaxrdp.calibrate_sampling_rate(target, delta, sigma, steps, sampling="fixed"))
  at = lambda r: float(jaxrdp.dpsgd_epsilon(r, sigma, steps, delta, sampling="fixed"))
  assert at(q) <= target < at(q * (1 + 1e-7))


def test_calibrated_steps_of_fixed_batches_meet_the_target_and_one_more_does_not():
  q, sigma, delta, target = 256 / 60_000, 2.0, 1e-5, 8.0
  steps = int(jaxrdp.calibrate_steps(target, delta, q, sigma, sampling="fixed"))
  at = lambda t: float(jaxrdp.dpsgd_epsilon(q, sigma, t, delta, sampling="fixed"))
  assert at(steps) <= target < at(steps + 1)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_calibrated_sigma_of_shuffled_batches_is_twice_the_epochs_gaussian(accountant):
  n, b, delta, target = 60_000, 256, 1e-5, 8.0
  steps = 234 * 30
  sigma = float(jaxrdp.calibrate_noise_multiplier(target, delta, b / n, steps, accountant=accountant,
                                                  sampling="shuffle", dataset_size=n))
  gaussian = float(jaxrdp.calibrate_noise_multiplier(target, delta, 1.0, 30, accountant=accountant))
  assert sigma == 2 * gaussian
  eps = jaxrdp.dpsgd_epsilon(b / n, sigma, steps, delta, accountant=accountant,
                             sampling="shuffle", dataset_size=n)
  assert float(eps) <= target


def test_calibrated_steps_of_shuffled_batches_are_whole_epochs():
  n, b, sigma, delta, target = 60_000, 256, 4.0, 1e-5, 8.0
  steps = int(jaxrdp.calibrate_steps(target, delta, b / n, sigma, sampling="shuffle",
                                     dataset_size=n))
  at = lambda t: float(jaxrdp.dpsgd_epsilon(b / n, sigma, t, delta, sampling="shuffle",
                                            dataset_size=n))
  assert steps % 234 == 0 and steps > 0
  assert at(steps) <= target < at(steps + 1)
  capped = jaxrdp.calibrate_steps(target, delta, b / n, sigma, sampling="shuffle",
                                  dataset_size=n, max_steps=300)
  assert int(capped) == 300


def test_calibrating_the_rate_of_shuffled_batches_is_refused():
  with pytest.raises(ValueError, match="does not offer sampling='shuffle'"):
    jaxrdp.calibrate_sampling_rate(8.0, 1e-5, 2.0, 1000, sampling="shuffle")


# ----- the sampler and the transform


@pytest.mark.parametrize("n, b", [(10, 3), (10, 7), (10, 10), (60_000, 256), (1, 1)])
def test_fixed_sample_draws_distinct_examples_in_range(n, b):
  idx = np.asarray(jaxrdp.fixed_sample(jax.random.key(0), n, b))
  assert idx.shape == (b,) and idx.dtype == np.int32
  assert len(set(idx.tolist())) == b and idx.min() >= 0 and idx.max() < n


@pytest.mark.parametrize("b", [2, 4])   # the direct path (2b <= n) and the complement's
def test_fixed_sample_is_uniform_over_subsets(b):
  # Chi-square against the uniform law on the C(5, b) subsets, 50,000 draws with a fixed seed:
  # the statistic's p-value is far from the 1e-3 rejection level for a uniform sampler (a
  # smallest-index or modulo-biased sampler fails it).
  from scipy import stats
  keys = jax.random.split(jax.random.key(3), 50_000)
  draws = np.asarray(jax.jit(jax.vmap(lambda k: jnp.sort(jaxrdp.fixed_sample(k, 5, b))))(keys))
  _, counts = np.unique(draws @ (5 ** np.arange(b)), return_counts=True)
  assert counts.size == math.comb(5, b)
  assert stats.chisquare(counts).pvalue > 1e-3


@pytest.mark.parametrize("args, error, match", [
    ((jax.random.key(0), 10, 11), ValueError, r"batch_size must lie in \[1, dataset_size=10\]; got 11"),
    ((jax.random.key(0), 10, 0), ValueError, "batch_size must be >= 1"),
    ((jax.random.key(0), 10.0, 3), TypeError, "dataset_size must be a Python int"),
    ((0, 10, 3), TypeError, "key must be a PRNG key"),
])
def test_fixed_sample_names_bad_arguments(args, error, match):
  with pytest.raises(error, match=match):
    jaxrdp.fixed_sample(*args)


def test_transform_with_fixed_batches_accounts_what_fixed_sample_draws():
  n, b, delta = 1_000, 50, 1e-5
  sigma = lambda count: jnp.where(count < 10, 1.0, 1.3)   # a schedule: two segments
  tx = jaxrdp.dpsgd(0.1, 1.0, sigma, jax.random.key(0), sampling_rate=b / n,
                    expected_batch_size=b, sampling="fixed")
  params = jnp.zeros(3)

  @jax.jit
  def step(state, key):
    idx = jaxrdp.fixed_sample(key, n, b)
    grads = jnp.ones((b, 3)) * idx[:, None] / n
    return tx.update(grads, state, params)[1]
  state = tx.init(params)
  for key in jax.random.split(jax.random.key(1), 25):
    state = step(state, key)
  eps, _ = jaxrdp.privacy_spent(state, delta)
  expected = jaxrdp.dpsgd_epsilon(b / n, jnp.array([1.0, 1.3]), jnp.array([10.0, 15.0]), delta,
                                  sampling="fixed", refine_order=False)
  assert float(eps) == pytest.approx(float(expected), rel=1e-12)


def test_transform_refuses_a_pld_log_for_fixed_batches_and_unknown_samplers():
  with pytest.raises(ValueError, match="pld_phases applies to sampling='poisson' and "
                                      "'truncated_poisson' only"):
    jaxrdp.differentially_private_aggregate(1.0, 1.0, 0, sampling_rate=0.05, expected_batch_size=50,
                                            sampling="fixed", pld_phases=4)
  with pytest.raises(ValueError, match=r"sampling must be one of \('poisson', 'truncated_poisson', "
                                      r"'fixed'\), got 'shuffle'"):
    jaxrdp.differentially_private_aggregate(1.0, 1.0, 0, sampling_rate=0.05, expected_batch_size=50,
                                            sampling="shuffle")


# ----- sweeps and the command line


@pytest.mark.parametrize("kwargs", [dict(sampling="fixed"),
                                    dict(sampling="shuffle", dataset_size=60_000),
                                    dict(sampling="truncated_poisson", dataset_size=60_000,
                                         max_batch_size=300)])
def test_sweep_cells_equal_dpsgd_epsilon_on_the_grid_orders(kwargs):
  q = np.array([64 / 60_000, 256 / 60_000])
  sigma, t, delta = np.array([0.8, 2.0]), np.array([0.0, 233.0, 235.0, 14_063.0]), np.array([1e-5])
  eps = np.asarray(jaxrdp.sweep(q, sigma, t, delta, **kwargs))
  expected = np.array([[[[float(jaxrdp.dpsgd_epsilon(a, s, n, d, refine_order=False, **kwargs))
                          for d in delta] for n in t] for s in sigma] for a in q])
  np.testing.assert_allclose(eps, expected, rtol=1e-12)
  if kwargs["sampling"] == "truncated_poisson":
    # Batches of 256 on average overflow 300 often enough over 14,063 steps to exceed δ/2
    # (+inf), and batches of 64 never do in effect (the Poisson ε, a little more).
    poisson = np.asarray(jaxrdp.sweep(q, sigma, t, delta))
    assert np.all(np.isinf(eps[1, :, 3])) and np.all(np.isfinite(eps[0]))
    assert np.all(eps[0] >= poisson[0]) and np.all(eps[0] <= poisson[0] * 1.01 + 1e-12)


def test_sweep_refuses_truncated_poisson_without_its_sizes():
  axes = (np.array([0.01]), np.array([1.0]), np.array([10.0]), np.array([1e-5]))
  with pytest.raises(ValueError, match="max_batch_size"):
    jaxrdp.sweep(*axes, sampling="truncated_poisson", dataset_size=1000)
  with pytest.raises(ValueError, match="dataset_size"):
    jaxrdp.sweep(*axes, sampling="truncated_poisson", max_batch_size=10)
  with pytest.raises(ValueError, match="max_batch_size"):
    jaxrdp.sweep(*axes, sampling="truncated_poisson", dataset_size=1000, max_batch_size=0)
  with pytest.raises(TypeError, match="max_batch_size"):
    jaxrdp.sweep(*axes, sampling="truncated_poisson", dataset_size=1000, max_batch_size=[10, 20])
  with pytest.raises(ValueError, match="max_batch_size applies"):
    jaxrdp.sweep(*axes, max_batch_size=10)


def test_cli_sweeps_truncated_poisson_batches(tmp_path, capsys):
  from jaxrdp.cli import main as cli
  out = tmp_path / "eps.csv"
  argv = ["sweep", "--sampling-rates", "0.004,0.005", "--noise-multipliers", "1,1.5", "--steps",
          "1000", "--deltas", "1e-5", "--sampling", "truncated_poisson", "--dataset-size",
          "60000", "--max-batch-size", "320", "--out", str(out)]
  assert cli.main(argv) == 0
  assert "truncated Poisson" in capsys.readouterr().out
  rows = np.loadtxt(out, delimiter=",", skiprows=1)
  expected = [float(jaxrdp.dpsgd_epsilon(a, s, 1000, 1e-5, refine_order=False,
                                         sampling="truncated_poisson", dataset_size=60_000,
                                         max_batch_size=320)) for a, s in rows[:, :2]]
  np.testing.assert_allclose(rows[:, 4], expected, rtol=1e-9)


def test_a_sweep_written_for_one_sampler_is_not_resumed_with_another(tmp_path):
  pytest.importorskip("pyarrow")
  axes = (np.array([0.001]), np.array([1.0, 2.0]), np.array([1000.0]), np.array([1e-5]))
  jaxrdp.sweep(*axes, output=tmp_path / "s", sampling="fixed")
  with pytest.raises(ValueError, match="its sampler differ"):
    jaxrdp.sweep(*axes, output=tmp_path / "s", resume=True)
  again = jaxrdp.sweep(*axes, output=tmp_path / "s", resume=True, sampling="fixed")
  np.testing.assert_array_equal(jaxrdp.read_sweep(again),
                                np.asarray(jaxrdp.sweep(*axes, sampling="fixed")))


def test_cli_answers_fixed_batches_of_256_over_60000_examples_for_60_epochs(capsys):
  from jaxrdp.cli import main as cli
  argv = ["epsilon", "--dataset-size", "60000", "--batch-size", "256", "--epochs", "60",
          "--noise-multiplier", "1.1", "--delta", "1e-5", "--sampling", "fixed", "--json"]
  assert cli.main(argv) == 0
  got = json.loads(capsys.readouterr().out)
  expected = jaxrdp.dpsgd_epsilon(256 / 60_000, 1.1, 14_063, 1e-5, sampling="fixed")
  assert got["epsilon"] == pytest.approx(float(expected), rel=1e-12)
  assert (got["sampling"], got["neighboring"], got["steps"]) == ("fixed", "replace_one", 14_063)


def test_cli_answers_truncated_poisson_batches_in_one_command(capsys):
  from jaxrdp.cli import main as cli
  argv = ["epsilon", "--dataset-size", "60000", "--batch-size", "256", "--epochs", "60",
          "--noise-multiplier", "1.1", "--delta", "1e-5", "--sampling", "truncated_poisson",
          "--max-batch-size", "320", "--accountant", "pld", "--json"]
  assert cli.main(argv) == 0
  got = json.loads(capsys.readouterr().out)
  expected = jaxrdp.dpsgd_epsilon(256 / 60_000, 1.1, 14_063, 1e-5, accountant="pld",
                                  sampling="truncated_poisson", dataset_size=60_000,
                                  max_batch_size=320)
  assert got["epsilon"] == pytest.approx(float(expected), rel=1e-12)
  assert (got["sampling"], got["neighboring"], got["max_batch_size"]) == (
      "truncated_poisson", "add_or_remove", 320)


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--sampling-rates", "0.01", "--noise-multipliers", "1", "--steps", "10",
      "--deltas", "1e-5", "--out", "x.csv", "--sampling", "shuffle"], "--dataset-size"),
    (["sweep", "--sampling-rates", "0.01", "--noise-multipliers", "1", "--steps", "10",
      "--deltas", "1e-5", "--out", "x.csv", "--sampling", "truncated_poisson"],
     "--max-batch-size"),
    (["sweep", "--sampling-rates", "0.01", "--noise-multipliers", "1", "--steps", "10",
      "--deltas", "1e-5", "--out", "x.csv", "--max-batch-size", "10"], "--max-batch-size"),
    (["sweep", "--sampling-rates", "0.01", "--noise-multipliers", "1", "--steps", "10",
      "--deltas", "1e-5", "--out", "x.csv", "--dataset-size", "100"], "--dataset-size applies"),
    (["sweep", "--sampling-rates", "0.0105", "--noise-multipliers", "1", "--steps", "10",
      "--deltas", "1e-5", "--out", "x.csv", "--sampling", "shuffle", "--dataset-size", "1000"],
     "whole batches"),
])
def test_cli_sweep_names_bad_sampler_flags(argv, message, capsys, tmp_path, monkeypatch):
  from jaxrdp.cli import main as cli
  monkeypatch.chdir(tmp_path)
  with pytest.raises(SystemExit) as info:
    cli.main(argv)
  assert info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("jaxrdp: error: ") and message in err, err


# Orders above fixed_epsilon's first stage (256): for schedules of more than 16 phases their
# terms are computed only where the bound from the orders up to 256 leaves them in play. The
# schedules below are one phase cut into 20 equal ones (the same composition).
LARGE_ORDERS = np.concatenate([ORDERS, [320.0, 512.0, 1024.0, 2048.0]])


def _in_phases(steps, count=20):
  return np.full(count, steps / count)


def test_fixed_batches_with_orders_above_256_bounded_out_equal_dp_accounting():
  n, b, sigma, steps, delta = 60_000, 256, 1.0, 14_060, 1e-5   # the best order is below 256
  expected = _dp_accounting(
      [(dp_event.SampledWithoutReplacementDpEvent(n, b, dp_event.GaussianDpEvent(sigma / 2)),
        steps)], delta, LARGE_ORDERS)
  for t in (steps, _in_phases(steps)):
    eps = jaxrdp.dpsgd_epsilon(b / n, sigma, t, delta, orders=LARGE_ORDERS, sampling="fixed")
    assert float(eps) == pytest.approx(expected, rel=1e-9)


def test_fixed_batches_with_the_best_order_above_256_are_the_exact_curves_minimum():
  # q = 1e-3, σ = 20, 100 steps: the best order is 1024. Above order 256 dp_accounting uses a
  # looser bound than Theorem 27's exact sum (here 4.4e-5 against 6.5e-6 per step at order
  # 320), so its ε is larger; ours is the minimum over the grid of the exact per-step curve
  # (tested against mpmath in test_without_replacement.py), composed and converted.
  q, sigma, steps, delta = 1e-3, 20.0, 100.0, 1e-5
  per_step = jaxrdp.rdp_sampled_gaussian_without_replacement(q, sigma / 2, LARGE_ORDERS,
                                                             max_order=2048)
  expected, order = jaxrdp.compute_epsilon(LARGE_ORDERS, steps * per_step, delta)
  assert float(order) > 256
  for t in (steps, _in_phases(steps)):
    eps = jaxrdp.dpsgd_epsilon(q, sigma, t, delta, orders=LARGE_ORDERS, sampling="fixed")
    assert float(eps) == pytest.approx(float(expected), rel=1e-12)
  n = 100_000
  looser = _dp_accounting(
      [(dp_event.SampledWithoutReplacementDpEvent(n, int(q * n), dp_event.GaussianDpEvent(sigma / 2)),
        int(steps))], delta, LARGE_ORDERS)
  assert float(eps) <= looser
