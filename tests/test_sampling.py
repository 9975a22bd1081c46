"""Poisson sampling in jit (jaxrdp.training.sampling) and the binomial overflow tail.

References: exact binomial tails summed in mpmath (50 digits) and scipy.stats.binom; the
sampler is tested against its distribution with stated false-failure rates.
"""

import collections
import itertools
import math

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest
from scipy import stats

from jaxrdp.training.sampling import (poisson_max_batch_size, poisson_overflow_probability, poisson_sample,
                             poisson_truncation_delta)


def _exact_tail(n, q, m):
  """P[Binomial(n, q) > m], exactly (mpmath, 50 digits)."""
  with mpmath.workdps(50):
    q = mpmath.mpf(q)
    return float(mpmath.fsum(mpmath.binomial(n, k) * q ** k * (1 - q) ** (n - k)
                             for k in range(m + 1, n + 1)))


@pytest.mark.parametrize("n,q,m", [(200, 0.1, 30), (200, 0.1, 60), (1000, 0.05, 80),
                                   (50, 0.9, 48), (100, 0.3, 20), (300, 0.02, 1), (1437, 64 / 1437, 128)])
def test_overflow_probability_is_the_binomial_tail_never_below_it(n, q, m):
  exact = _exact_tail(n, q, m)
  p = poisson_overflow_probability(n, q, m)
  assert exact <= p <= exact * (1 + 1e-9) + 1e-300


def test_overflow_probability_for_large_datasets_matches_scipy():
  for n, q, m, rel in [(10 ** 6, 0.01, 10_500, 1e-5), (10 ** 9, 1e-3, 10 ** 6 + 5000, 2e-4)]:
    ref = stats.binom.sf(m, n, q)
    p = poisson_overflow_probability(n, q, m)
    # Ours is raised by the bound on lgamma's rounding (relative 8 eps lgamma(n) ~ 1e-4 at 1e9).
    assert ref * (1 - 1e-9) <= p <= ref * (1 + rel)


def test_overflow_probability_edge_cases():
  assert poisson_overflow_probability(100, 0.3, 100) == 0.0
  assert poisson_overflow_probability(100, 0.3, 250) == 0.0
  assert poisson_overflow_probability(100, 1.0, 99) == 1.0
  exact = -math.expm1(100 * math.log1p(-0.01))  # P[X > 0] = 1 - (1 - q)^n
  assert exact <= poisson_overflow_probability(100, 0.01, 0) <= exact * (1 + 1e-10)


def test_max_batch_size_is_the_smallest_safe_size():
  n, q, target = 1437, 64 / 1437, 1e-12
  m = poisson_max_batch_size(n, q, target)
  assert stats.binom.sf(m, n, q) <= target < stats.binom.sf(m - 1, n, q)
  assert poisson_max_batch_size(10, 0.5, 0.0) == 10


def test_truncation_delta_is_one_plus_e_eps_times_steps_times_the_tail_at_n_plus_one():
  n, q, m, steps, eps = 200, 0.1, 45, 1000, 2.0
  expected = (1 + math.exp(eps)) * steps * _exact_tail(n + 1, q, m)
  got = poisson_truncation_delta(n, q, m, steps, eps)
  assert expected <= got <= expected * (1 + 1e-9)
  assert poisson_truncation_delta(n, q, n + 1, steps, eps) == 0.0
  assert poisson_truncation_delta(n, q, m, steps, math.inf) == 1.0


def _draws(n, q, m, count, seed=0):
  keys = jax.random.split(jax.random.key(seed), count)
  idx, mask = jax.jit(jax.vmap(lambda k: poisson_sample(k, n, q, m)))(keys)
  return np.asarray(idx), np.asarray(mask)


def test_samples_are_sorted_distinct_prefix_masked_and_padded_with_zero():
  idx, mask = _draws(40, 0.25, 40, 500)
  assert idx.dtype == np.int32 and mask.dtype == np.bool_ and idx.shape == (500, 40)
  for i, m in zip(idx, mask):
    k = int(m.sum())
    assert m[:k].all() and not m[k:].any()  # the selected ones come first
    assert np.all(np.diff(i[:k]) > 0) and np.all((i[:k] >= 0) & (i[:k] < 40))
    assert np.all(i[k:] == 0)


def test_inclusion_frequencies_and_batch_sizes_follow_poisson_sampling():
  n, q, draws = 40, 0.25, 4000
  idx, mask = _draws(n, q, n, draws, seed=1)
  counts = np.zeros(n)
  for i, m in zip(idx, mask):
    counts[i[m]] += 1
  # Each example's count ~ Binomial(draws, q), independent across examples: the standardised
  # squares sum to ~ χ²(n). False-failure rate 1e-6 (normal approximation, draws·q = 1000).
  z2 = (counts - draws * q) ** 2 / (draws * q * (1 - q))
  assert np.sum(z2) < stats.chi2.isf(1e-6, n)
  # Batch size ~ Binomial(n, q): chi-square goodness of fit over sizes 4..16 and the two tails.
  sizes = mask.sum(axis=1)
  edges = np.arange(4, 17)
  observed = [np.sum(sizes < 4)] + [np.sum(sizes == k) for k in edges] + [np.sum(sizes > 16)]
  probs = ([stats.binom.cdf(3, n, q)] + [stats.binom.pmf(k, n, q) for k in edges]
           + [stats.binom.sf(16, n, q)])
  chi2 = np.sum((np.array(observed) - draws * np.array(probs)) ** 2 / (draws * np.array(probs)))
  assert chi2 < stats.chi2.isf(1e-6, len(observed) - 1)


def test_rate_is_rounded_down_never_up():
  idx, mask = _draws(30, 1.0, 30, 3)
  assert mask.all() and np.all(idx == np.arange(30))
  # q = 1e-12 < 2^-32: rounded down to 0, nothing is ever selected.
  _, mask = _draws(30, 1e-12, 30, 200)
  assert not mask.any()


def test_overflow_is_refused_unless_accepted_and_then_keeps_selected_examples():
  key = jax.random.key(3)
  with pytest.raises(ValueError, match="sampling='truncated_poisson'"):
    poisson_sample(key, 1000, 0.5, 400)
  full_idx, full_mask = poisson_sample(key, 1000, 0.5, 1000)
  idx, mask = poisson_sample(key, 1000, 0.5, 10, max_overflow_probability=1.0)
  assert np.asarray(mask).all() and len(set(np.asarray(idx).tolist())) == 10
  selected = set(np.asarray(full_idx)[np.asarray(full_mask)].tolist())
  assert set(np.asarray(idx).tolist()) <= selected


@pytest.mark.parametrize("n, q, m", [(6, 0.7, 3), (5, 1.0, 2), (70_000, 2e-4, 2)])
def test_overflowing_batches_are_cut_uniformly(n, q, m):
  # The kept set has the law of truncated Poisson sampling, which its tight account assumes:
  # P(S) = Σ_{A ⊇ S} P(A selected)·(1{A = S} if |A| ≤ m else 1/C(|A|, m)). Exactly, by
  # enumeration, for 6 and 5 examples (χ² over every kept set, 1e-6 level); over two chunks
  # of 65,536 examples (about 14 selected, 2 kept), the kept indices uniform over the dataset
  # (χ² of 7 bins of 10,000 examples, both slots).
  draws = 20_000 if n < 100 else 2_000
  keys = jax.random.split(jax.random.key(11), draws)
  q_drawn = math.floor(min(q, float(np.float32(q))) * 2**32) / 2**32 if q < 1 else 1.0
  # In batches of 50 draws (the same draws as one vmap over all: each is a function of its
  # key): 2,000 at once would hold 2,000 x 65,536 random words.
  idx, mask = jax.lax.map(lambda k: poisson_sample(k, n, q, m, max_overflow_probability=1.0),
                          keys, batch_size=50)
  idx, mask = np.asarray(idx), np.asarray(mask)
  if n >= 100:
    assert mask.all()
    assert np.all(idx[:, 0] != idx[:, 1])
    counts = np.bincount(idx.ravel() // 10_000, minlength=7)
    expected = np.full(7, idx.size / 7)
    assert np.sum((counts - expected) ** 2 / expected) < stats.chi2.isf(1e-6, 6)
    return
  sets = [frozenset(row[keep].tolist()) for row, keep in zip(idx, mask)]
  law = collections.Counter()
  for size in range(n + 1):
    for chosen in itertools.combinations(range(n), size):
      p = q_drawn**size * (1 - q_drawn) ** (n - size)
      if size <= m:
        law[frozenset(chosen)] += p
      else:
        for kept in itertools.combinations(chosen, m):
          law[frozenset(kept)] += p / math.comb(size, m)
  observed = collections.Counter(sets)
  assert set(observed) <= set(law)
  support = [s for s in law if law[s] * draws > 5]
  chi2 = sum((observed[s] - draws * law[s]) ** 2 / (draws * law[s]) for s in support)
  assert chi2 < stats.chi2.isf(1e-6, len(support) - 1)


def test_one_compilation_for_any_traced_rate():
  traces = []

  @jax.jit
  def sample(key, q):
    traces.append(1)
    return poisson_sample(key, 40, q, 40)

  a = sample(jax.random.key(0), 0.25)
  sample(jax.random.key(0), 0.5)
  assert len(traces) == 1
  # A traced rate selects the same examples as the same concrete rate.
  b = poisson_sample(jax.random.key(0), 40, 0.25, 40)
  np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]))
  np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[1]))


def test_large_dataset_is_sampled_in_chunks():
  n, q = 150_000, 2e-3  # three chunks of 65,536
  m = poisson_max_batch_size(n, q, 1e-12)
  idx, mask = jax.jit(lambda k: poisson_sample(k, n, q, m))(jax.random.key(5))
  sel = np.asarray(idx)[np.asarray(mask)]
  assert abs(len(sel) - n * q) < 6 * math.sqrt(n * q)  # fails with probability ~2e-9
  assert np.all(np.diff(sel) > 0) and sel[-1] < n
  for lo in (0, 65_536, 131_072):  # each chunk contributes (none: probability e^-37)
    assert np.any((sel >= lo) & (sel < lo + 65_536))


def test_errors_name_the_argument():
  key = jax.random.key(0)
  with pytest.raises(TypeError, match="key"):
    poisson_sample(0, 10, 0.5, 10)
  with pytest.raises(TypeError, match="dataset_size"):
    poisson_sample(key, 10.0, 0.5, 10)
  with pytest.raises(ValueError, match="max_batch_size"):
    poisson_sample(key, 10, 0.5, 0)
  for q in (0.0, 1.5):
    with pytest.raises(ValueError, match="sampling_rate"):
      poisson_sample(key, 10, q, 10)
  with pytest.raises(ValueError, match="sampling_rate"):
    poisson_overflow_probability(10, -0.1, 3)
