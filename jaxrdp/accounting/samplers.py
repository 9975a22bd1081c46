r"""How DP-SGD draws its batches, and which neighbouring datasets its ε is about.

ε is a statement about neighbouring datasets, and what the sampler amplifies depends on
which neighbours: the three samplers here, each with the relation it is accounted under
(``neighboring`` may say so explicitly; the other relation is an error, never a silent
choice):

* ``"poisson"`` (add/remove one example): each example joins each batch independently with
  probability q; the sampled Gaussian mechanism (Mironov, Talwar, Zhang 2019), what Opacus,
  TF Privacy and dp_accounting's ``PoissonSampledDpEvent`` account. A replacement is a removal
  and an addition: not offered (it would be group privacy of two).
* ``"truncated_poisson"`` (add/remove one example, the dataset size n and a largest batch B):
  Poisson sampling whose batches of more than B examples are cut to B of them chosen
  uniformly at random (:func:`jaxrdp.poisson_sample`, which draws batches with static shapes
  this way). PLD: tight, the mixture of each step's Poisson pair and, with the probability
  that the other examples alone fill a batch, a replace-one pair at σ/2
  (:mod:`jaxrdp.accounting.pld.truncation`; arXiv 2508.15089, dp_accounting's
  ``TruncatedSubsampledGaussianDpEvent``). RDP: the Poisson RDP with the additive δ of the
  overflows (:func:`additive_epsilon`), sound for any truncation rule, loose unless
  overflows are much rarer than δ.
* ``"fixed"`` (replace one example, the dataset size n public): each batch is B = q·n examples
  drawn uniformly without replacement. RDP by Wang, Balle, Kasiviswanathan (2019), Thm. 27
  (:func:`jaxrdp.rdp_sampled_gaussian_without_replacement`), dp_accounting's
  ``SampledWithoutReplacementDpEvent``. Replacing one example moves the sum of clipped
  gradients by up to **2C** (C the clipping norm), so the Gaussian it runs has noise
  multiplier σ/2 relative to that sensitivity: ε here equals dp_accounting's
  ``SampledWithoutReplacementDpEvent(n, B, GaussianDpEvent(σ/2))``. Passing σ itself there (as
  jax_privacy 2.0's ``fixed_dpsgd_event`` does) assumes a sensitivity of C, which a
  replacement does not have: ε too small. Under add/remove neighbours a fixed batch size has
  no such bound (the other examples' batches change with n): not offered. No PLD.
* ``"shuffle"`` (replace one example, one batch size B for the whole schedule): each epoch the
  examples are permuted and cut into ⌊n/B⌋ batches of B (the remainder dropped, or kept as a
  smaller last batch: epochs of ⌈n/B⌉ steps; both are counted, the larger charged; a pipeline
  that carries the remainder into the next epoch's first batch can put an example twice in one
  batch and is not covered). An example takes part in at most one batch per epoch, so each epoch is,
  for it, one Gaussian mechanism at noise multiplier σ/2 (as above) and nothing else (the
  permutation is independent of the data: the bound holds for each one, hence for their
  mixture); epochs compose.
  This is the sound account of shuffling without any amplification by the shuffle (which
  has no matching tight bound for DP-SGD; accounting shuffled batches as Poisson can
  under-report ε, Chua et al. 2024, "How private are DP-SGD implementations?"). A phase of
  the schedule is charged once for every epoch it overlaps (an epoch split between two phases
  is charged to both: an upper bound).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import validation
from jaxrdp.accounting.conversion import epsilon_at_orders
from jaxrdp.accounting.pld.truncation import log_choose, truncation_weights
from jaxrdp.mechanisms import without_replacement

SAMPLINGS = ("poisson", "truncated_poisson", "fixed", "shuffle")
NEIGHBORINGS = ("add_or_remove", "replace_one")
RELATION = {"poisson": "add_or_remove", "truncated_poisson": "add_or_remove",
            "fixed": "replace_one", "shuffle": "replace_one"}

_WHY_NOT = {
    "poisson": "Poisson sampling is accounted for add_or_remove neighbours (a replacement is a "
               "removal and an addition: the group privacy of two, not offered)",
    "truncated_poisson": "truncated Poisson sampling is accounted for add_or_remove neighbours "
                         "(as Poisson sampling)",
    "fixed": "fixed-size batches are accounted for replace_one neighbours (Wang, Balle, "
             "Kasiviswanathan 2019: the dataset size is public; under add_or_remove no bound "
             "of this kind holds)",
    "shuffle": "shuffled fixed-size batches are accounted for replace_one neighbours (one "
               "participation per epoch holds for a dataset of a fixed size)",
}


def check_sampling(sampling: str, neighboring: str | None, dataset_size, accountant: str,
                   max_batch_size=None, truncation: bool = False) -> None:
  """ValueError (naming the argument, the allowed values and the value) for an unknown
  sampler or relation, a relation the sampler is not accounted under, a ``dataset_size``
  missing for ``"shuffle"`` or ``"truncated_poisson"`` or given for another sampler, a
  ``max_batch_size`` missing for ``"truncated_poisson"`` or given for another,
  ``"truncated_poisson"`` where the caller does not account it (``truncation`` False), and
  ``"fixed"`` with the PLD accountant; TypeError for sizes that are not ints."""
  validation.check_choice("sampling", sampling, SAMPLINGS)
  if neighboring is not None:
    validation.check_choice("neighboring", neighboring, NEIGHBORINGS)
    if neighboring != RELATION[sampling]:
      raise ValueError(f"sampling={sampling!r} with neighboring={neighboring!r} is not offered: "
                       f"{_WHY_NOT[sampling]}.")
  if sampling == "truncated_poisson" and not truncation:
    raise ValueError("sampling='truncated_poisson' is accounted by dpsgd_epsilon, the "
                     "calibrations, pld_epsilon and pld_delta; this function does not take it "
                     "yet.")
  if sampling in ("shuffle", "truncated_poisson"):
    if dataset_size is None:
      raise ValueError(f"sampling={sampling!r} needs dataset_size (the number of examples n).")
    validation.check_int("dataset_size", dataset_size, lo=1)
  elif dataset_size is not None:
    raise ValueError(f"dataset_size applies to sampling='shuffle' and 'truncated_poisson' only; "
                     f"sampling={sampling!r} got dataset_size={dataset_size!r}.")
  if sampling == "truncated_poisson":
    if max_batch_size is None:
      raise ValueError("sampling='truncated_poisson' needs max_batch_size (the largest batch B: "
                       "a batch of more examples is cut to B of them, chosen uniformly).")
    validation.check_ints("max_batch_size", max_batch_size, lo=1)
  elif max_batch_size is not None:
    raise ValueError(f"max_batch_size applies to sampling='truncated_poisson' only; "
                     f"sampling={sampling!r} got max_batch_size={max_batch_size!r}.")
  if sampling == "fixed" and accountant == "pld":
    raise ValueError("accountant='pld' does not account sampling='fixed' (no tight privacy-loss "
                     "distribution of sampling without replacement is implemented); use "
                     "accountant='rdp' (Wang, Balle, Kasiviswanathan 2019).")


def overflow_mass(q, t, dataset_size, max_batch_size, total=True):
  r"""An upper bound on Σ_i T_i·P[Binomial(N + 1, q_i) > B_i]: the expected number of steps
  whose Poisson batch overflows B (on the larger neighbour, N + 1 examples), in the graph
  (:func:`jaxrdp.accounting.pld.truncation.truncation_weights`' w_hi with N + 1 others);
  ``total=False``: each phase's T_i·P[...] (no sum)."""
  b = np.broadcast_to(np.asarray(max_batch_size, np.int64), t.shape)
  pairs = [log_choose(dataset_size + 1, int(v) + 1) for v in np.unique(b)]
  table = dict(zip(np.unique(b).tolist(), pairs))
  log_c = jnp.asarray([table[v][0] for v in b.tolist()], q.dtype)
  error = jnp.asarray([table[v][1] for v in b.tolist()], q.dtype)
  return _overflow_mass(q, t, float(dataset_size + 2), np.asarray(b + 1, np.float64), log_c,
                        error, total=total)


@compilation.jit(static_argnames=("total",))
def _overflow_mass(q, t, n, b, log_c, error, *, total=True):
  _, overflow, _ = truncation_weights(q, n, b, log_c, error)
  per_phase = jnp.where(t > 0, t * overflow, 0.0)
  return jnp.sum(per_phase) if total else per_phase


def additive_epsilon(epsilon_at, delta, overflow):
  r"""ε of truncated Poisson sampling by the additive account: if the untruncated run is
  (ε, δ')-DP, the truncated one is (ε, δ' + (1 + e^ε)·P)-DP with P the expected number of
  overflowing steps (:func:`jaxrdp.training.sampling.poisson_truncation_delta`'s proof). ε at
  δ/2 bounds ε at any δ' ≥ δ/2, so with P' = (1 + e^{ε(δ/2)})·P ≤ δ/2 the answer is ε at
  δ − P' (whose ε is at most ε(δ/2): the δ it charges is at most δ); +inf otherwise.
  ``epsilon_at(δ)`` returns ε, or a tuple whose first entry is ε (the rest returned as
  they are at δ − P')."""
  first = epsilon_at(delta / 2)
  first = first[0] if isinstance(first, tuple) else first
  charged = (1 + jnp.exp(jnp.minimum(first, 700.0))) * overflow * (1 + 1e-9)
  ok = jnp.isfinite(first) & (charged <= delta / 2)
  result = epsilon_at(delta - jnp.where(ok, charged, 0.0))
  if isinstance(result, tuple):
    return (jnp.where(ok, result[0], jnp.inf),) + result[1:]
  return jnp.where(ok, result, jnp.inf)


def check_batches(sampling_rate, dataset_size) -> None:
  """ValueError where q·n is not a whole batch size of at least one example, or differs
  between phases (the epochs are cut in batches of one size), for concrete q."""
  if not validation.is_concrete(sampling_rate):
    return
  rates = np.asarray(sampling_rate, np.float64)
  if rates.size > 1 and np.any(rates != rates.ravel()[0]):
    raise ValueError("sampling='shuffle' needs one batch size for the whole schedule (the epochs "
                     f"are cut in batches of q·n): sampling_rate varies between phases, "
                     f"{float(rates.min())!r} to {float(rates.max())!r}.")
  sizes = rates * dataset_size
  whole = np.round(sizes)
  bad = (np.abs(sizes - whole) > 1e-6 * np.maximum(whole, 1.0)) | (whole < 1)
  if np.any(bad):
    example = float(np.asarray(sampling_rate, np.float64)[bad].ravel()[0]) \
        if np.ndim(sampling_rate) else float(sampling_rate)
    raise ValueError(f"sampling='shuffle' needs batches of a whole number of examples, at least "
                     f"one: sampling_rate * dataset_size = {example!r} * {dataset_size} is not.")


def whole_batches(q, dataset_size):
  """Under jit, whether q·n is one whole batch size of at least one example for every phase
  (the mask of :func:`check_batches`); True for concrete ``q`` (checked eagerly)."""
  if validation.is_concrete(q):
    return np.True_
  size = q * dataset_size
  whole = jnp.round(size)
  return jnp.all((jnp.abs(size - whole) <= 1e-6 * jnp.maximum(whole, 1.0)) & (whole >= 1)
                 & (q == jnp.ravel(q)[0]))


def fixed_rdp(q, sigma, t, orders, n_max):
  r"""RDP of a schedule of fixed-size batches at each of ``orders`` (1-D): phase i adds
  :math:`T_i\,\varepsilon'_{\mathrm{WBK}}(\alpha; q_i, \sigma_i/2)` (σ/2: replace-one
  sensitivity 2C, see the module docstring); ``n_max`` the static largest order computed."""
  per_step = without_replacement.without_replacement_unchecked(q[:, None], sigma[:, None] / 2,
                                                                orders[None, :], n_max)
  return jnp.sum(jnp.where(t[:, None] == 0, 0.0, t[:, None] * per_step), axis=0)


_SMALL_ORDERS = 256   # fixed_epsilon evaluates orders up to this first ...
_FEW_PHASES = 16      # ... for schedules of more phases than this (fewer: every order at once)


@compilation.jit(static_argnames=("n_max", "method"))
def fixed_epsilon(q, sigma, t, delta, orders, n_max, method="improved"):
  """ε of fixed-size batches: the best of ``orders`` under the conversion ``method``
  (:func:`jaxrdp.compute_epsilon`'s). Between integer orders the bound is Corollary 10's
  interpolation, so the order is not refined beyond the grid.

  Schedules of more than _FEW_PHASES phases take the orders up to _SMALL_ORDERS first (their
  terms cost a sixteenth of those up to 4096, per phase: most of a long schedule's time; with
  fewer phases the second kernel's compilation would cost more than it saves). The composed
  bound is non-decreasing in α (checked
  on q ∈ [1e-4, 0.9], σ ∈ [0.3, 20], every integer order to 4096), so the largest of those
  values bounds every larger order's from below, and with it their ε; the larger orders are
  evaluated (a ``lax.cond``) only where that bound is below the best ε found. Either way the
  result is ε at an evaluated order, so it is a valid bound even if the bound were not
  monotone somewhere (it could then only be larger than the best over every order)."""
  orders = jnp.asarray(orders)
  eps_of = lambda rdp: jnp.where(jnp.isnan(e := epsilon_at_orders(orders, rdp, delta, method)),
                                 jnp.inf, e)
  if n_max <= _SMALL_ORDERS or q.shape[0] <= _FEW_PHASES:
    return jnp.min(eps_of(fixed_rdp(q, sigma, t, orders, n_max)))
  small = fixed_rdp(q, sigma, t, orders, _SMALL_ORDERS)   # +inf above _SMALL_ORDERS
  best = jnp.min(eps_of(small))
  covered = jnp.isfinite(orders) & (orders <= _SMALL_ORDERS)
  floor = jnp.max(jnp.where(covered & ~jnp.isnan(small), small, 0.0)) * (1 - 1e-12)
  larger = jnp.isfinite(orders) & (orders > _SMALL_ORDERS) & (orders <= n_max)
  bound = jnp.min(jnp.where(larger, eps_of(jnp.full_like(orders, floor)), jnp.inf))
  return lax.cond(bound < best,
                  lambda: jnp.minimum(best, jnp.min(eps_of(fixed_rdp(q, sigma, t, orders, n_max)))),
                  lambda: best)


def max_order(orders) -> int:
  """The static number of terms of the fixed-size bound for ``orders`` (its default rule)."""
  return without_replacement.static_max_order(orders, None)


def steps_per_epoch(q, dataset_size):
  """S = ⌊n/B⌋, B = round(q n) (at least one of each): the steps of one epoch of shuffled
  batches when the remainder is dropped."""
  batch = jnp.maximum(jnp.round(q * dataset_size), 1.0)
  return jnp.maximum(jnp.floor(dataset_size / batch), 1.0)


def epochs_from_start(steps, per_epoch):
  """Epochs of ``per_epoch`` steps (:func:`steps_per_epoch`) that ``steps`` steps from the start
  overlap: ⌊(⌈T⌉ − 1)/S⌋ + 1 (0 without steps); from the start, the shorter epochs give the
  larger count (:func:`shuffle_participations` for one phase)."""
  steps = jnp.ceil(steps)
  return jnp.where(steps > 0, jnp.floor((steps - 1) / per_epoch) + 1, 0.0)


def shuffle_participations(q, t, dataset_size):
  r"""Epochs each phase overlaps. With B = round(q n), an epoch is S = ⌊n/B⌋ steps (the
  remainder dropped) or ⌈n/B⌉ (kept as a smaller last batch); phase i covers steps
  [a_i, a_i + ⌈T_i⌉) (a_i the steps before it) and overlaps
  :math:`\lfloor (a_i + \lceil T_i
ceil - 1)/S 
floor - \lfloor a_i/S 
floor + 1` epochs of
  S steps (none without steps): the larger of the counts for the two epoch lengths (a phase
  that starts inside the schedule can overlap more of the longer epochs). Each epoch is one
  participation of an example at most. Exact while the steps up to the end of the schedule
  stay below 2^24 in float32 (2^53 in float64): a quotient of two such whole numbers is
  rounded correctly, and it is at least 1/a below the next integer when not one itself, so
  its floor is exact."""
  batch = jnp.maximum(jnp.round(q * dataset_size), 1.0)
  steps = jnp.ceil(t)
  start = jnp.cumsum(steps) - steps
  overlapped = lambda s: jnp.floor((start + steps - 1) / s) - jnp.floor(start / s) + 1
  count = jnp.maximum(overlapped(steps_per_epoch(q, dataset_size)),
                      overlapped(jnp.maximum(jnp.ceil(dataset_size / batch), 1.0)))
  return jnp.where(steps > 0, count, 0.0).astype(t.dtype)


_ZOOM = 256   # orders per refinement stage of :func:`shuffle_epsilon` (two stages)


def _gaussian_rho(sigma, participations):
  """ρ with RDP(α) = ρ α: Σ_i k_i · 2/σ_i² (k_i Gaussian mechanisms at σ_i/2, each α/(2(σ_i/2)²);
  a phase without participations adds nothing, σ = 0 with some makes it infinite)."""
  per = jnp.where(sigma > 0, 2.0 / jnp.where(sigma > 0, sigma, 1.0) ** 2, jnp.inf)
  return jnp.sum(jnp.where(participations > 0, participations * per, 0.0))


@compilation.jit(static_argnames=("dataset_size", "method", "refine"))
def shuffle_epsilon(q, sigma, t, delta, orders, dataset_size, method="improved", refine=True):
  r"""RDP ε of shuffled batches: the epochs' Gaussian mechanisms compose to RDP(α) = ρα
  (:func:`_gaussian_rho`; Mironov 2017, Prop. 7 and Prop. 1), converted at the best of
  ``orders`` (``method`` as :func:`jaxrdp.compute_epsilon`); with ``refine`` (improved
  conversion) two more stages of _ZOOM orders each, equally spaced between the grid
  neighbours of the best order so far: every value is ε at an evaluated order (a valid bound),
  the order found to ~1e-5 of a grid spacing, with no loop."""
  rho = _gaussian_rho(sigma, shuffle_participations(q, t, dataset_size))
  eps_at = lambda alphas: jnp.where(jnp.isnan(e := epsilon_at_orders(alphas, rho * alphas, delta,
                                                                     method)), jnp.inf, e)
  eps = eps_at(orders)
  best = jnp.min(eps)
  if not refine or method != "improved":
    return best
  points = jnp.asarray(orders)
  for _ in range(2):
    i = jnp.argmin(eps)
    usable = jnp.isfinite(points) & (points > 1)
    below = jnp.max(jnp.where(usable & (points < points[i]), points, 1.0))
    above = jnp.min(jnp.where(usable & (points > points[i]), points, jnp.inf))
    above = jnp.where(jnp.isfinite(above), above, points[i])
    points = jnp.linspace(below, above, _ZOOM)   # its ends too: always two neighbours
    eps = eps_at(points)
    best = jnp.minimum(best, jnp.min(eps))
  return best


@functools.partial(jax.jit, static_argnames=("dataset_size",))
def shuffle_schedule(q, sigma, t, dataset_size):
  """(q, σ, T) of the Gaussian mechanisms that bound shuffled batches: q = 1 (the one batch
  with the example), σ/2 (replace-one sensitivity 2C) and one step per epoch overlapped."""
  return jnp.ones_like(q), sigma / 2, shuffle_participations(q, t, dataset_size)
