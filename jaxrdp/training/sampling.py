r"""Poisson sampling inside ``jit`` with a static batch shape, and the price of truncating it.

DP-SGD's accountant (the sampled Gaussian mechanism, Mironov, Talwar, Zhang 2019) assumes
Poisson sampling: every example joins the batch independently with probability q, so the
batch size is Binomial(N, q) and private. Under ``jit`` shapes are static, so
:func:`poisson_sample` returns ``max_batch_size`` slots and a mask.

* Selection is exact: example i is kept when 32 random bits fall below
  :math:`\lfloor q\,2^{32} \rfloor`, i.e. with probability :math:`q' \le q` (q rounded DOWN to
  a multiple of :math:`2^{-32}`, and to its float32 value: the accountant's q is never smaller
  than the true rate, so the reported ε stays an upper bound). When at most
  ``max_batch_size`` are selected this IS Poisson sampling.
* **Overflow policy.** When more than ``max_batch_size`` examples are selected, the batch is
  truncated to M of them chosen uniformly at random (reservoir sampling). This is truncated
  Poisson sampling, which ``sampling="truncated_poisson"`` accounts tightly by its PLD
  (:mod:`jaxrdp.accounting.pld.truncation`). Accounted as Poisson sampling, it is not; it
  happens with probability :math:`p = P[\mathrm{Binomial}(N, q) > M]`
  (:func:`poisson_overflow_probability`, a certified upper bound), and for that account both
  policies apply:

  1. ``poisson_sample`` refuses (ValueError, at trace time) when p exceeds
     ``max_overflow_probability`` (default 1e-12); :func:`poisson_max_batch_size` gives the
     smallest safe M;
  2. the remaining p must be added to δ: over T steps the truncated run is
     :math:`(\varepsilon, \delta + (1 + e^{\varepsilon})\,T\,p_{N+1})`-DP
     (:func:`poisson_truncation_delta`). Proof: the truncated and ideal runs coincide unless
     some step overflows, so their total-variation distance is at most :math:`T p`; for
     neighbours D, D' and any event S, :math:`P[M'(D) \in S] \le P[M(D) \in S] + T p_D \le
     e^\varepsilon (P[M'(D') \in S] + T p_{D'}) + \delta + T p_D`, and p is increasing in the
     dataset size, so :math:`p_{N+1}` bounds both.

* Cost: O(N) random bits per step in chunks of 65,536 examples (``lax.fori_loop``), so the
  working memory is O(chunk + M) for any dataset size; one compilation per (N, M).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

from jaxrdp._internal import loops
from jaxrdp._internal import validation
from jaxrdp.accounting.binomial import overflow_probability as _overflow_probability

_CHUNK = 1 << 16          # examples whose random bits are drawn at once


def _check_static_int(name, x, lo):
  if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
    raise TypeError(f"{name} must be a Python int (it fixes array shapes), got {x!r}.")
  if x < lo:
    raise ValueError(f"{name} must be >= {lo}, got {x}.")
  return int(x)


def _threshold(q):
  """(t, all): an example is selected when its uint32 bits are < t (or always, if all).

  t = floor(q' 2^32) with q' = min(q, float32(q)): the selection probability t / 2^32 is at
  most q in both float64 and float32, whichever dtype the accountant uses."""
  if validation.is_concrete(q):
    qv = float(np.asarray(q, np.float64))
    qv = min(qv, float(np.float32(qv)))
    if qv >= 1.0:
      return jnp.uint32(0), True
    return jnp.uint32(math.floor(qv * 2.0 ** 32)), False
  q = jnp.asarray(q)
  if q.dtype != jnp.float32:
    q = jnp.minimum(q, q.astype(jnp.float32).astype(q.dtype))
  # Exact: q * 2^32 only shifts the exponent, floor of a float is exact. q < 1 gives t < 2^32.
  t = jnp.floor(jnp.clip(q, 0, 1) * 2.0 ** 32)
  valid = validation.in_domain("positive_sampling_rate", q)
  everything = valid & (q >= 1)
  t = jnp.where(valid & ~everything, t, 0)
  return t.astype(jnp.uint32), everything


def poisson_sample(key: jax.Array, dataset_size: int, sampling_rate: jax.typing.ArrayLike,
                   max_batch_size: int, *, max_overflow_probability: float = 1e-12
                   ) -> tuple[jax.Array, jax.Array]:
  r"""Poisson-sampled batch indices with a static size: (idx int32[M], mask bool[M]).

  Each of the ``dataset_size`` examples is selected independently with probability
  ``sampling_rate`` (rounded down to a multiple of 2^-32); the selected indices fill the
  first slots of ``idx`` in increasing order (unless the batch overflows), ``mask`` marks them, and the remaining slots
  hold index 0 with ``mask`` False. Use ``batch = data[idx]`` and pass ``mask`` to the DP
  transform. Jittable with one compilation per (dataset_size, max_batch_size); the rate may
  be traced (a schedule), in which case no overflow check can run and an invalid rate gives
  an empty batch.

  Overflow (more than ``max_batch_size`` selected): ``max_batch_size`` of the selected
  examples are kept, every subset of that size equally likely (reservoir sampling), in no
  particular order. This is the sampler that ``sampling="truncated_poisson"`` accounts
  tightly (``jaxrdp.dpsgd_epsilon(q, σ, T, δ, accountant="pld", sampling="truncated_poisson",
  dataset_size=N, max_batch_size=M)``). With concrete inputs this raises ``ValueError`` when
  the overflow probability exceeds ``max_overflow_probability`` (a guard for the Poisson
  account: raise it when accounting the truncation that way, or add
  :func:`poisson_truncation_delta` to δ, see the module docstring).

  Args:
    key: a PRNG key, used once (pass a fresh key every step).
    dataset_size: N, a Python int ≥ 1.
    sampling_rate: q in (0, 1].
    max_batch_size: M, a Python int ≥ 1 (the static batch shape).
    max_overflow_probability: the largest accepted P[Binomial(N, q) > M].

  Returns:
    ``(idx, mask)``.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued, or a key that is neither a PRNG key nor
      an int seed.

  References:
    Abadi et al., CCS 2016 (Poisson-sampled DP-SGD); Mironov, Talwar, Zhang 2019, Sec. 3.
  """
  if key is None or isinstance(key, (int, np.integer)):
    raise TypeError("key must be a PRNG key (jax.random.key(...)), split freshly for every "
                    f"batch; got {key!r}.")
  validation.canonical_key(key)  # a TypeError / ValueError naming the key for anything else
  n = _check_static_int("dataset_size", dataset_size, 1)
  m = _check_static_int("max_batch_size", max_batch_size, 1)
  if n >= 2 ** 31:
    raise ValueError(f"dataset_size must be below 2**31 (int32 indices), got {n}.")
  validation.check("positive_sampling_rate", sampling_rate, name="sampling_rate")
  if jnp.ndim(sampling_rate) != 0:
    raise ValueError(f"sampling_rate must be a scalar, got shape {jnp.shape(sampling_rate)}.")
  validation.check("max_overflow_probability", max_overflow_probability)
  if np.ndim(max_overflow_probability) != 0:
    raise ValueError("max_overflow_probability must be a scalar, got shape "
                     f"{np.shape(max_overflow_probability)}.")
  max_overflow_probability = float(max_overflow_probability)
  if validation.is_concrete(sampling_rate):
    p = _overflow_probability(n, float(np.asarray(sampling_rate)), m)
    if p > max_overflow_probability:
      suggestion = poisson_max_batch_size(n, float(np.asarray(sampling_rate)),
                                          max_overflow_probability)
      raise ValueError(
          f"max_batch_size={m} is too small: a Poisson batch from dataset_size={n} at "
          f"sampling_rate={float(np.asarray(sampling_rate))} exceeds it with probability {p:.3g} > "
          f"max_overflow_probability={max_overflow_probability:g}. Use max_batch_size >= "
          f"{suggestion}, or raise max_overflow_probability and account the truncation: "
          "dpsgd_epsilon(..., sampling='truncated_poisson', dataset_size=N, max_batch_size=M) "
          "(tight with accountant='pld'), or add poisson_truncation_delta(...) to delta.")
  threshold, everything = _threshold(sampling_rate)
  return _sample(key, threshold, everything, n, m)


@functools.partial(jax.jit, static_argnames=("n", "m"))
def _sample(key, threshold, everything, n, m):
  chunk = min(n, _CHUNK)
  num_chunks = -(-n // chunk)
  offsets = jnp.arange(chunk, dtype=jnp.int32)

  def body(c, carry):
    count, idx = carry
    bits = jax.random.bits(jax.random.fold_in(key, c), (chunk,), jnp.uint32)
    index = c * chunk + offsets
    selected = ((bits < threshold) | everything) & (index < n)
    ranks = jnp.cumsum(selected, dtype=jnp.int32)
    slot = count + ranks - 1
    # Slots >= m (overflow) and unselected examples go to slot m: dropped by the scatter.
    slot = jnp.where(selected & (slot < m), slot, m)
    idx = idx.at[slot].set(index, mode="drop")
    total = count + ranks[-1]
    # The selected examples past the m-th: reservoir sampling, one at a time (rare).
    first = jnp.maximum(count, m)
    idx = loops.fori_loop(first, jnp.maximum(total, first),
                          lambda r, idx: _reservoir_step(key, n, r, index, ranks - 1 + count, idx),
                          idx)
    return total, idx

  carry = (jnp.zeros((), jnp.int32), jnp.zeros((m,), jnp.int32))
  if num_chunks == 1:
    count, idx = body(0, carry)
  else:
    count, idx = loops.fori_loop(0, num_chunks, body, carry)
  mask = jnp.arange(m, dtype=jnp.int32) < count
  return jnp.where(mask, idx, 0), mask


def _reservoir_step(key, n, r, index, rank, idx):
  """Algorithm R's step for the selected example of rank r ≥ m (0-based, in index order; its
  position in this chunk found from the chunk's ranks): it replaces slot j, drawn uniformly
  from [0, r], when j < m. After every step the m slots hold a uniformly random m-subset of
  the examples seen (Vitter 1985, Algorithm R). j is exact: 32 random bits, rejected at or
  above the largest multiple of r + 1 below 2^32 (no modulo bias), redrawn from the next key."""
  k = (r + 1).astype(jnp.uint32)
  rem = (jnp.uint32(0) - k) % k                         # 2^32 mod (r + 1)
  stream = jax.random.fold_in(jax.random.fold_in(key, n), r)

  def draw(carry):
    attempt, _, _ = carry
    bits = jax.random.bits(jax.random.fold_in(stream, attempt), (), jnp.uint32)
    return attempt + 1, bits, (rem == 0) | (bits < jnp.uint32(0) - rem)

  _, bits, _ = loops.while_loop(lambda c: ~c[2], draw,
                                (jnp.int32(0), jnp.uint32(0), jnp.bool_(False)))
  j = (bits % k).astype(jnp.int32)
  position = jnp.searchsorted(rank, r)                  # the first entry of rank r
  m = idx.shape[0]
  return idx.at[jnp.where(j < m, j, m)].set(index[position], mode="drop")


def fixed_sample(key: jax.Array, dataset_size: int, batch_size: int) -> jax.Array:
  r"""Indices of a batch of exactly ``batch_size`` distinct examples, uniformly without
  replacement: int32[B], in no particular order (a static shape; jittable).

  The sampler that ``sampling="fixed"`` accounts (Wang, Balle, Kasiviswanathan 2019: every
  subset of size B equally likely). Exactly uniform: each round draws the open slots uniformly
  from [0, N) (32 random bits, rejected above the largest multiple of N: no modulo bias) and
  opens again every slot whose value an earlier slot holds; no rule depends on the examples'
  labels, so every subset of size B is equally likely (a relabelling of the examples maps the
  process onto itself). Expected rounds are few: after the first, about B²/(2N) slots are open
  and each round leaves a fraction ≤ B/N of them. For B > N/2 the N − B examples left out are
  drawn this way instead.

  Args:
    key: a PRNG key, used once (pass a fresh key every step).
    dataset_size: N, a Python int ≥ 1.
    batch_size: B, a Python int in [1, N].

  Returns:
    ``idx`` (int32[B]): ``batch = data[idx]``; every slot is an example (no mask).

  Raises:
    ValueError: an argument outside its range (named, with the range and the value).
    TypeError: a key that is not a PRNG key, or sizes that are not ints.

  References:
    Wang, Balle, Kasiviswanathan, "Subsampled Rényi differential privacy and analytical
    moments accountant", AISTATS 2019 (sampling without replacement).
  """
  if key is None or isinstance(key, (int, np.integer)):
    raise TypeError("key must be a PRNG key (jax.random.key(...)), split freshly for every "
                    f"batch; got {key!r}.")
  validation.canonical_key(key)
  n = _check_static_int("dataset_size", dataset_size, 1)
  b = _check_static_int("batch_size", batch_size, 1)
  if n >= 2 ** 31:
    raise ValueError(f"dataset_size must be below 2**31 (int32 indices), got {n}.")
  if b > n:
    raise ValueError(f"batch_size must lie in [1, dataset_size={n}]; got {b}.")
  return _fixed_sample(key, n, b)


@functools.partial(jax.jit, static_argnames=("n", "b"))
def _fixed_sample(key, n, b):
  if 2 * b <= n:
    return _distinct(key, n, b)
  left_out = _distinct(key, n, n - b)
  kept = jnp.ones((n,), bool).at[left_out].set(False)
  return jnp.nonzero(kept, size=b)[0].astype(jnp.int32)


def _distinct(key, n, k):
  """k distinct values, uniform over the subsets of [0, n) (see :func:`fixed_sample`)."""
  if k == 0:
    return jnp.zeros((0,), jnp.int32)
  limit = (2 ** 32 // n) * n   # bits below this are uniform modulo n
  position = jnp.arange(k, dtype=jnp.int32)

  def body(carry):
    key, values, open_ = carry
    key, draw_key = jax.random.split(key)
    bits = jax.random.bits(draw_key, (k,), jnp.uint32)
    accepted = bits < jnp.uint32(limit) if limit < 2 ** 32 else jnp.ones((k,), bool)
    drawn = (bits % jnp.uint32(n)).astype(jnp.int32)
    values = jnp.where(open_ & accepted, drawn, values)
    filled = ~open_ | accepted
    # A slot is open again if its value sits in an earlier filled slot (or it was rejected):
    # sort (value, slot) and compare each with its predecessor.
    key_values = jnp.where(filled, values, n)   # unfilled slots hold no value
    sorted_values, sorted_slots = lax.sort((key_values, position), num_keys=2)
    repeated = jnp.concatenate([jnp.zeros((1,), bool),
                                (sorted_values[1:] == sorted_values[:-1]) & (sorted_values[1:] < n)])
    repeat = jnp.zeros((k,), bool).at[sorted_slots].set(repeated)
    return key, values, ~filled | repeat

  init = (key, jnp.zeros((k,), jnp.int32), jnp.ones((k,), bool))
  _, values, _ = loops.while_loop(lambda c: jnp.any(c[2]), body, init)
  return values


def _scalar_rate(sampling_rate, domain="sampling_rate") -> float:
  validation.check(domain, sampling_rate, name="sampling_rate")
  if np.ndim(sampling_rate) != 0:
    raise ValueError(f"sampling_rate must be a scalar, got shape {np.shape(sampling_rate)}.")
  return float(sampling_rate)


def poisson_overflow_probability(dataset_size: int, sampling_rate: float, max_batch_size: int) -> float:
  r"""Upper bound on :math:`P[\mathrm{Binomial}(N, q) > M]`: a Poisson batch overflows M slots.

  Summed in log space from the binomial pmf (``lgamma``), never by subtracting a CDF from 1
  in the tail: for M above the mode the terms :math:`t_k`, k > M, decrease with ratio
  :math:`r_k = \frac{(N-k) q}{(k+1)(1-q)} < 1`, itself decreasing in k, so after summing to K
  the rest is at most :math:`t_K r_K / (1 - r_K)`, which is added. The sum is raised by the
  bound on the rounding error of ``lgamma``, so the result is never below the true tail.
  For M below the mode (a large probability) it is one minus a lower bound on the CDF.

  Args:
    dataset_size: N ≥ 0.
    sampling_rate: q in [0, 1].
    max_batch_size: M ≥ 0.

  Returns:
    A float in [0, 1] (0 when M ≥ N).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Feller, "An Introduction to Probability Theory", Vol. 1, VI.3 (ratio of binomial terms).
  """
  # Checked before the cache, which needs hashable arguments.
  n = _check_static_int("dataset_size", dataset_size, 0)
  m = _check_static_int("max_batch_size", max_batch_size, 0)
  return _overflow_probability(n, _scalar_rate(sampling_rate), m)


def poisson_max_batch_size(dataset_size: int, sampling_rate: float,
                           overflow_probability: float = 1e-12) -> int:
  r"""Smallest M with :func:`poisson_overflow_probability` (N, q, M) ≤ ``overflow_probability``.

  Args:
    dataset_size: N ≥ 1.
    sampling_rate: q in (0, 1].
    overflow_probability: the accepted probability that a batch exceeds M, in [0, 1).

  Returns:
    M, an int in [0, N].

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.
  """
  n = _check_static_int("dataset_size", dataset_size, 1)
  q = _scalar_rate(sampling_rate, "positive_sampling_rate")
  validation.check("overflow_probability", overflow_probability)
  p = lambda m: poisson_overflow_probability(n, q, m)
  mean, sd = n * q, math.sqrt(n * q * (1 - q))
  hi = min(n, math.ceil(mean + 8 * sd + 16))
  while p(hi) > overflow_probability and hi < n:
    hi = min(n, 2 * hi)
  lo = -1  # p(lo) > target by convention
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if mid >= 0 and p(mid) <= overflow_probability:
      hi = mid
    else:
      lo = mid
  return hi


def poisson_truncation_delta(dataset_size: int, sampling_rate: float, max_batch_size: int,
                             steps: int, epsilon: float) -> float:
  r"""δ to add for truncating T Poisson batches at M: :math:`(1 + e^\varepsilon)\,T\,p_{N+1}`.

  With :math:`p_{N+1}` = :func:`poisson_overflow_probability` (N + 1, q, M): if the ideal
  (untruncated) run is (ε, δ)-DP, the truncated run is (ε, δ + this)-DP (proof in the module
  docstring). Report ε together with the total δ.

  Args:
    dataset_size: N.
    sampling_rate: q.
    max_batch_size: M.
    steps: T, the number of batches drawn (a scalar ≥ 0).
    epsilon: the ε the guarantee is stated at (a scalar ≥ 0, may be inf).

  Returns:
    The extra δ, at most 1.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value), or one that is not a scalar (named, with its shape).
    TypeError: an argument that is not real-valued.
  """
  n = _check_static_int("dataset_size", dataset_size, 0)
  validation.check("steps", steps)
  validation.check("epsilon", epsilon)
  validation.check_scalar(steps=steps, epsilon=epsilon)
  steps, epsilon = float(steps), float(epsilon)
  p = poisson_overflow_probability(n + 1, sampling_rate, max_batch_size)
  if p == 0.0 or steps == 0:
    return 0.0
  if not math.isfinite(epsilon) or epsilon > 700:
    return 1.0
  return float(min(1.0, (1 + math.exp(epsilon)) * steps * p * (1 + 1e-12)))
