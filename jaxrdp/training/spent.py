r"""What a run has spent: the RDP (:func:`rdp_spent`) and the (ε, δ) guarantee
(:func:`privacy_spent`) of the :class:`jaxrdp.DifferentiallyPrivateAggregateState` found in an
optimizer state.

The RDP is the accountant's accumulated sum over the steps (Mironov 2017, Prop. 1), converted to
ε by :func:`jaxrdp.compute_epsilon` (Balle et al. 2020, Thm. 21); with ``accountant="pld"`` the
run's (q, σ) phases are composed by their privacy-loss distribution
(:func:`jaxrdp.pld_epsilon`).
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

from jaxrdp._internal import compilation
from jaxrdp._internal import validation
from jaxrdp.accounting import pld
from jaxrdp.accounting import samplers
from jaxrdp.accounting.epsilon import use_pld
from jaxrdp.accounting.conversion import compute_epsilon
from jaxrdp.training import accountant as rdp_accountant
from jaxrdp.training.state import (DifferentiallyPrivateAggregateState, _check_state,
                                   _fields_0_1_0)


def _find_accountant(opt_state) -> DifferentiallyPrivateAggregateState:
  is_state = lambda x: (isinstance(x, DifferentiallyPrivateAggregateState)
                        or _fields_0_1_0(x) is not None)
  found = [x for x in jax.tree.leaves(opt_state, is_leaf=is_state) if is_state(x)]
  for x in found:
    _check_state(x)
  if not found:
    raise ValueError("opt_state contains no DifferentiallyPrivateAggregateState: was the "
                     "optimizer built with jaxrdp.differentially_private_aggregate or jaxrdp.dpsgd?")
  if len(found) > 1:
    raise ValueError(f"opt_state contains {len(found)} DifferentiallyPrivateAggregateStates; "
                     "pass the one to report (e.g. opt_state[0]).")
  return found[0]


def rdp_spent(opt_state) -> tuple[jax.Array, jax.Array]:
  r"""(orders, RDP) accumulated so far by the accountant found anywhere in ``opt_state``.

  .. math:: \mathrm{RDP}(\alpha) = \sum_t \varepsilon_{q_t, \sigma_t}(\alpha) = \text{closed segments} + n \cdot \varepsilon_{q, \sigma}(\alpha)

  Args:
    opt_state: an optimizer state (nested tuples, NamedTuples, dicts, optax wrapper states)
      holding exactly one :class:`DifferentiallyPrivateAggregateState`.

  Returns:
    ``(orders, rdp)``, both of shape (K,), in the accountant's dtype.

  Raises:
    ValueError: ``opt_state`` holds no such state, or more than one.
    TypeError: it holds a state in jaxrdp 0.1.0's flat form (the message says how to convert
      it, see :func:`state_from_0_1_0`).
  """
  return rdp_accountant.accumulated_rdp(_find_accountant(opt_state).accountant)


@compilation.on_host
def privacy_spent(opt_state, delta: jax.typing.ArrayLike, *,
                  orders: jax.typing.ArrayLike | None = None, accountant: str = "rdp",
                  pld_grid: pld.PldGrid | None = None) -> tuple[jax.Array, jax.Array]:
  r"""(ε, order): the (ε, δ)-DP guarantee of the training so far.

  Finds the single :class:`DifferentiallyPrivateAggregateState` in ``opt_state`` (error if
  there is none or more than one) and converts its accumulated RDP with
  :func:`jaxrdp.compute_epsilon` (improved conversion, rounded up, minimised over orders).
  Jittable. A transform built with ``sampling="truncated_poisson"`` is accounted for its cut
  batches: with ``accountant="pld"`` tightly (:func:`jaxrdp.pld_epsilon` with
  ``dataset_size`` and ``max_batch_size``), with RDP by adding the chance of a cut batch to
  δ (+inf when cuts are not much rarer than δ); both need the run's (q, σ) phases, as the
  PLD of a schedule does (a constant (q, σ), or ``pld_phases``).

  Args:
    opt_state: the optimizer state.
    delta: δ in (0, 1) (a scalar or an array of δ values).
    orders: optional subset of the accountant's orders to minimise over (each must be one of
      them); default: all of them. Under ``jax.jit`` (no check) an order outside [1, inf]
      gives NaN, and an order in range that is not one of them is skipped: ε = +inf when
      none of ``orders`` is.
    accountant: ``"rdp"`` (default: the state's accumulated RDP) or ``"pld"``: the tight ε
      of the run by its privacy-loss distribution (:func:`jaxrdp.pld_epsilon`; float64).
      A transform built with ``pld_phases=K`` logs its (q, σ) phases and any schedule of up
      to K phases is accounted. Without the log the state keeps only the current (q, σ) and
      its step count (closed segments are summed as RDP): a run at constant (q, σ) is
      accounted exactly, and after a change of (q, σ) the PLD is refused with a ValueError
      (NaN under ``jax.jit``), as is an overflowed log. Under ``jax.jit`` with a traced state,
      pass ``pld_grid`` (:func:`jaxrdp.pld_grid`).
    pld_grid: the static grid sizes for ``accountant="pld"`` under ``jax.jit``.

  Returns:
    ``(epsilon, order)``. ε = +inf for a non-private run (σ = 0). With ``accountant="pld"``
    the order is NaN (there is none).

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued, or ``opt_state`` holding a state in
      jaxrdp 0.1.0's flat form (the message says how to convert it).

  References:
    Balle et al., AISTATS 2020, Thm. 21; Mironov 2017, Prop. 1 and 3.
  """
  if use_pld(accountant, orders=orders, pld_grid=pld_grid):
    return _pld_spent(_find_accountant(opt_state), delta, pld_grid)
  truncation = _find_accountant(opt_state).truncation
  state_orders, rdp = rdp_spent(opt_state)
  if orders is not None:
    validation.check("orders", orders)
    wanted = jnp.atleast_1d(jnp.asarray(orders, state_orders.dtype))
    if wanted.ndim != 1:
      raise ValueError(f"orders must be a scalar or 1-D, got shape {wanted.shape}.")
    hit = wanted[:, None] == state_orders[None, :]
    if validation.is_concrete((hit,)) and not bool(jnp.all(jnp.any(hit, axis=1))):
      missing = np.asarray(wanted)[~np.asarray(jnp.any(hit, axis=1))]
      raise ValueError(f"orders {missing.tolist()} are not among the accountant's orders.")
    # Orders not asked for are marked NaN, which compute_epsilon skips.
    rdp = jnp.where(jnp.any(hit, axis=0), rdp, jnp.nan)
    # Under jit the checks above do not run. An order outside [1, inf] (NaN included) is an
    # invalid argument: NaN. A valid order that is not among the accountant's matches nothing
    # and is skipped like the orders not asked for (ε = +inf when none is left).
    return validation.nan_where_invalid(validation.all_in_domains(orders=wanted),
                                        _rdp_epsilon(opt_state, state_orders, rdp, delta))
  return _rdp_epsilon(opt_state, state_orders, rdp, delta)


def _rdp_epsilon(opt_state, orders, rdp, delta):
  """(ε, order) of the accumulated RDP, with the additive δ of cut batches where the
  transform truncates (:func:`jaxrdp.accounting.samplers.additive_epsilon`)."""
  state = _find_accountant(opt_state)
  if state.truncation is None:
    return compute_epsilon(orders, rdp, delta)
  validation.check("delta", delta)
  q, _, steps, known = _run_phases(state, "accountant='rdp' of truncated Poisson batches")
  overflow = samplers.overflow_mass(q.astype(rdp.dtype), steps.astype(rdp.dtype),
                                    state.truncation.dataset_size,
                                    state.truncation.max_batch_size)
  eps, order = samplers.additive_epsilon(lambda d: compute_epsilon(orders, rdp, d),
                                         jnp.asarray(delta, rdp.dtype), overflow)
  return jnp.where(known, eps, jnp.nan), order


def _pld_spent(state: DifferentiallyPrivateAggregateState, delta, grid):
  """(ε by the PLD, NaN): the phase log's schedule, or the accountant's single segment."""
  validation.check("delta", delta)
  q, sigma, steps, known = _run_phases(state, "accountant='pld'")
  sizes = {} if state.truncation is None else {
      "dataset_size": state.truncation.dataset_size,
      "max_batch_size": state.truncation.max_batch_size}
  eps = pld.pld_epsilon(q, sigma, steps, delta, pld_grid=grid, **sizes)
  return jnp.where(known, eps, jnp.nan), jnp.asarray(jnp.nan, eps.dtype)


def _run_phases(state: DifferentiallyPrivateAggregateState, what: str):
  """(q, σ, steps, known) of the run (float64 under x64): the phase log's phases, or the accountant's
  single segment (before the first step a zero-step placeholder). ``known`` is False (and
  eagerly a ValueError, naming ``what`` needs them) where the log overflowed, or without a
  log after a change of (q, σ)."""
  if state.phases is not None:
    log = state.phases
    if validation.is_concrete(log.overflowed) and bool(log.overflowed):
      raise ValueError(f"the run has more (sampling_rate, noise_multiplier) phases than the "
                       f"{log.steps.shape[0]} its transform logs (pld_phases): build it with a "
                       f"larger pld_phases for {what}, or use accountant='rdp'.")
    return (log.sampling_rate, log.noise_multiplier, log.steps.astype(jnp.float64),
            ~log.overflowed)
  account = state.accountant
  dtype = jnp.result_type(float)   # float64 under x64 (the PLD's; it refuses float32)
  q, sigma = (jnp.asarray(v, dtype) for v in account.mechanism)
  steps = account.segment_steps.astype(dtype)
  one_segment = jnp.all(account.rdp == 0) & jnp.all(account.rdp_compensation == 0)
  if validation.is_concrete((account, one_segment)) and not bool(one_segment):
    raise ValueError(f"{what} needs the run's phases: this state changed "
                     "(sampling_rate, noise_multiplier) (a schedule) and keeps the earlier "
                     "phases only as RDP. Build the transform with pld_phases=K (it then logs "
                     "up to K phases), account the schedule with jaxrdp.dpsgd_epsilon(q_phases, "
                     "sigma_phases, steps_phases, delta, ...), or use accountant='rdp'"
                     + (" (of Poisson batches)." if "rdp" in what else "."))
  no_steps = account.segment_steps == 0
  # Before the first step θ is NaN: a zero-step schedule at a placeholder (q, σ), ε = 0.
  q, sigma = jnp.where(no_steps, 0.0, q), jnp.where(no_steps, 1.0, sigma)
  return q[None], sigma[None], steps[None], one_segment
