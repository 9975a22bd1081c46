"""The PLD accountant behind the public API: ``accountant="pld"`` on dpsgd_epsilon, the three
calibrations and privacy_spent, and the CLI's ``--accountant``.

References: ``jaxrdp.pld_epsilon`` itself is checked against dp_accounting and the PRV
accountant in tests/test_pld.py; here the calibrations are checked by their defining property
(the answer meets the target, one step beyond it does not), privacy_spent against the same
schedule given to pld_epsilon, and the CLI against the library.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrdp
from jaxrdp.cli import main as cli

TARGET, DELTA, Q, SIGMA, T = 2.0, 1e-5, 0.01, 1.1, 3000


@pytest.fixture(autouse=True)
def _x64():
  with jax.enable_x64(True):
    yield


def _pld(q, sigma, steps):
  return float(jaxrdp.dpsgd_epsilon(q, sigma, steps, DELTA, accountant="pld"))


def test_dpsgd_epsilon_with_the_pld_accountant_is_pld_epsilon_and_below_rdp():
  pld = _pld(Q, SIGMA, T)
  assert pld == float(jaxrdp.pld_epsilon(Q, SIGMA, T, DELTA))
  assert pld < float(jaxrdp.dpsgd_epsilon(Q, SIGMA, T, DELTA))


def test_calibrated_noise_multiplier_is_safe_and_tight():
  sigma = float(jaxrdp.calibrate_noise_multiplier(TARGET, DELTA, Q, T, accountant="pld"))
  assert _pld(Q, sigma, T) <= TARGET                    # safe: checked by dpsgd_epsilon itself
  assert _pld(Q, sigma * (1 - 1e-5), T) > TARGET        # tight: a little less noise misses it
  assert sigma < float(jaxrdp.calibrate_noise_multiplier(TARGET, DELTA, Q, T))   # tighter than RDP


def test_calibrated_sampling_rate_is_safe_and_tight():
  q = float(jaxrdp.calibrate_sampling_rate(TARGET, DELTA, SIGMA, T, accountant="pld"))
  assert _pld(q, SIGMA, T) <= TARGET
  assert _pld(q * (1 + 1e-5), SIGMA, T) > TARGET
  assert q > float(jaxrdp.calibrate_sampling_rate(TARGET, DELTA, SIGMA, T))


def test_calibrated_steps_are_the_largest_count_meeting_the_target():
  steps = int(jaxrdp.calibrate_steps(TARGET, DELTA, Q, SIGMA, accountant="pld"))
  assert _pld(Q, SIGMA, steps) <= TARGET < _pld(Q, SIGMA, steps + 1)
  assert steps > int(jaxrdp.calibrate_steps(TARGET, DELTA, Q, SIGMA))


def test_rdp_options_with_the_pld_accountant_are_refused_naming_them():
  with pytest.raises(ValueError, match="orders"):
    jaxrdp.dpsgd_epsilon(Q, SIGMA, T, DELTA, accountant="pld", orders=[2.0, 3.0])
  with pytest.raises(ValueError, match="method"):
    jaxrdp.dpsgd_epsilon(Q, SIGMA, T, DELTA, accountant="pld", method="classic")
  with pytest.raises(ValueError, match="pld_grid"):
    jaxrdp.dpsgd_epsilon(Q, SIGMA, T, DELTA, pld_grid=jaxrdp.pld_grid(Q, SIGMA, T))


def _trained_state(steps, sigmas):
  tx = jaxrdp.differentially_private_aggregate(1.0, SIGMA, 0, sampling_rate=Q,
                                               expected_batch_size=10.0)
  if sigmas is not None:
    tx = jaxrdp.differentially_private_aggregate(1.0, lambda count: jnp.where(count < 2, *sigmas),
                                                 0, sampling_rate=Q, expected_batch_size=10.0)
  params = jnp.zeros(3)
  state = tx.init(params)
  update = jax.jit(tx.update)   # one compilation instead of every operation's own
  for _ in range(steps):
    _, state = update(jnp.ones((4, 3)), state, params)
  return state


def test_privacy_spent_by_pld_is_the_epsilon_of_the_run():
  state = _trained_state(5, None)
  eps, order = jaxrdp.privacy_spent(state, DELTA, accountant="pld")
  assert float(eps) == pytest.approx(_pld(Q, SIGMA, 5), rel=1e-9)
  assert np.isnan(float(order))
  assert float(jaxrdp.privacy_spent(_trained_state(0, None), DELTA, accountant="pld")[0]) == 0.0


def test_privacy_spent_by_pld_refuses_a_state_whose_phases_were_summed_as_rdp():
  state = _trained_state(4, (2.0, 1.0))   # σ changes after two steps: two segments
  with pytest.raises(ValueError, match="schedule"):
    jaxrdp.privacy_spent(state, DELTA, accountant="pld")


def test_cli_epsilon_with_the_pld_accountant_matches_the_library(capsys):
  cli.main(["epsilon", "--sampling-rate", str(Q), "--noise-multiplier", str(SIGMA), "--steps",
            str(T), "--delta", str(DELTA), "--accountant", "pld", "--json"])
  out = json.loads(capsys.readouterr().out)
  assert out["accountant"] == "pld"
  assert out["epsilon"] == pytest.approx(_pld(Q, SIGMA, T), rel=1e-12)


def test_cli_dpsgd_prints_both_epsilons(capsys):
  cli.main(["dpsgd", "--dataset-size", "1000", "--batch-size", "10", "--epochs", "30",
            "--noise-multiplier", str(SIGMA), "--delta", str(DELTA), "--json"])
  out = json.loads(capsys.readouterr().out)
  assert out["epsilon_pld"] == pytest.approx(_pld(Q, SIGMA, T), rel=1e-12)
  assert out["epsilon_pld"] < out["epsilon_refined"]


def _logged_run(sigmas_by_step, capacity):
  tx = jaxrdp.differentially_private_aggregate(
      1.0, lambda count: jnp.asarray(sigmas_by_step)[count], 0, sampling_rate=Q,
      expected_batch_size=10.0, pld_phases=capacity)
  params = jnp.zeros(3)
  state = tx.init(params)
  update = jax.jit(tx.update)
  for _ in range(len(sigmas_by_step)):
    _, state = update(jnp.ones((4, 3)), state, params)
  return state


def test_privacy_spent_by_pld_composes_the_logged_phases_of_a_schedule():
  # σ = 2 for 3 steps, then 1.2 for 2, then 2 again for 1: three phases, in order.
  state = _logged_run([2.0, 2.0, 2.0, 1.2, 1.2, 2.0], capacity=4)
  assert int(state.phases.used) == 3
  eps, _ = jaxrdp.privacy_spent(state, DELTA, accountant="pld")
  want = jaxrdp.dpsgd_epsilon([Q, Q, Q], [2.0, 1.2, 2.0], [3, 2, 1], DELTA, accountant="pld")
  assert float(eps) == pytest.approx(float(want), rel=1e-9)


def test_privacy_spent_by_pld_refuses_an_overflowed_phase_log():
  state = _logged_run([2.0, 1.5, 1.2], capacity=2)
  assert bool(state.phases.overflowed)
  with pytest.raises(ValueError, match="pld_phases"):
    jaxrdp.privacy_spent(state, DELTA, accountant="pld")


def test_default_transform_state_keeps_the_0_1_0_leaves():
  tx = jaxrdp.differentially_private_aggregate(1.0, SIGMA, 0, sampling_rate=Q,
                                               expected_batch_size=10.0)
  assert len(jax.tree.leaves(tx.init(jnp.zeros(3)))) == 9   # no phase log unless asked for


@pytest.mark.parametrize("steps_kept", [True, False])
def test_many_phases_are_composed_in_chunks_with_the_same_value_and_gradient(monkeypatch,
                                                                           steps_kept):
  # Schedules with more phases than a sub-chunk holds are summed sub-chunk by sub-chunk in a
  # lax.scan under jax.checkpoint (bounded memory, value and gradient), their step PMFs kept
  # from one pass to the next where they fit in MAX_ELEMENTS, else recomputed in each pass;
  # forcing sub-chunks of 2 phases (5 = 2 + 2 + 1 padded) must give the value and the gradient
  # of the single-pass computation.
  from jaxrdp.accounting.pld import convolution, discretisation, readout
  q, sigma, steps = np.full(5, 0.02), np.linspace(1.0, 2.0, 5), np.full(5, 50.0)
  grid = jaxrdp.pld_grid(q, sigma, steps)
  values, sizes = discretisation.lattice(grid)
  # The two programs' kernels themselves, traced afresh below.
  steps_of, epsilon_of = readout._poisson_steps.__wrapped__, readout._epsilon_of_steps.__wrapped__
  epsilon = lambda s: epsilon_of(steps_of(q, s, None, values, pmf_bins=sizes[0]), steps,
                                 jnp.float64(DELTA), values, sizes=sizes)
  run = lambda: jax.jit(jax.value_and_grad(epsilon))(sigma)   # a new trace, no cached one
  assert convolution._sub_chunk(grid) >= 5 and convolution._phase_chunk(grid) >= 5
  whole, whole_grad = run()
  two = 2 * 2 * max(grid.bins, grid.pmf_bins)
  monkeypatch.setattr(convolution, "_SUB_ELEMENTS", two)
  if not steps_kept:
    monkeypatch.setattr(convolution, "MAX_ELEMENTS", 2 * 2 * grid.pmf_bins)
  assert convolution._sub_chunk(grid) == 2
  assert (convolution._phase_chunk(grid) >= 5) == steps_kept
  chunked, chunked_grad = run()
  assert float(chunked) == pytest.approx(float(whole), rel=1e-10)   # summation order only
  np.testing.assert_allclose(chunked_grad, whole_grad, rtol=1e-10)


def test_grids_differing_in_one_size_share_the_program_that_does_not_depend_on_it():
  # A query's two programs each depend on their own sizes: the step PMFs on pmf_bins alone,
  # the composition on bins and the length the PMFs are zero-padded to (bins / 4^k). So
  # grids that differ in pmf_bins below that length share the composition program (the
  # larger), grids that differ in bins share the step PMFs' program, and the padding changes
  # nothing computed: the same bits as composing the PMFs as computed.
  from jaxrdp.accounting.pld import discretisation, readout
  grids = [jaxrdp.PldGrid(1e-4, pmf_bins, bins, 1e-15)
           for pmf_bins, bins in ((40_960, 98_304), (65_536, 98_304), (65_536, 131_072))]
  assert [readout._padded_length(g.pmf_bins, g.bins) for g in grids] == [98_304] * 2 + [131_072]
  programs = (readout._poisson_steps, readout._epsilon_of_steps)
  before = [len(p.executables) for p in programs]
  values = [float(jaxrdp.pld_epsilon(0.01, 1.1, 1000, DELTA, pld_grid=g)) for g in grids]
  # 2 of each (at most: 0 with JAXRDP_PLAIN_JIT=1, or compiled by an earlier test), not 3.
  assert all(len(p.executables) - b <= 2 for p, b in zip(programs, before))
  q, s, t = (np.array([v], np.float64) for v in (0.01, 1.1, 1000.0))
  for g, value in zip(grids, values):
    lattice_values, sizes = discretisation.lattice(g)
    unpadded = jax.jit(lambda s_: readout._epsilon_of_steps.__wrapped__(
        readout._poisson_steps.__wrapped__(q, s_, None, lattice_values, pmf_bins=sizes[0]), t,
        np.float64(DELTA), lattice_values, sizes=sizes))(s)
    assert float(unpadded) == value
  assert values[0] > values[1]   # the shorter PMF leaves more of each step's tail in p_inf


def test_calibrated_steps_when_rdp_allows_only_a_few():
  # Few steps (RDP allows 4, PLD 6): the search grows the bracket by whole steps; and a
  # target that not even one step meets is refused under PLD as under RDP.
  steps = int(jaxrdp.calibrate_steps(2.0, DELTA, 0.3, 2.0, accountant="pld"))
  assert _pld(0.3, 2.0, steps) <= 2.0 < _pld(0.3, 2.0, steps + 1)
  with pytest.raises(ValueError, match="even with one step"):
    jaxrdp.calibrate_steps(0.3, DELTA, 0.3, 2.0, accountant="pld")


def test_epsilon_read_from_a_window_wider_than_700_is_never_below_the_truth():
  # A window 2048 wide at Δ = 1 (e^{l_top − l} would overflow below top − 709): its ε must
  # meet δ by the direct sum δ(ε) = Σ_k p_k (1 − e^{ε − l_k})₊ (no reference point, no
  # overflow), and be tight within one grid step. (Read-out weights once capped at e^700
  # made the far bins count too little and the ε too small.)
  from jaxrdp.accounting.pld import readout
  window = np.zeros((1, 2048))
  window[0, [90, 100, 1500, 2000]] = [0.1, 0.4, 0.3, 0.2]
  first, p_inf, interval = jnp.zeros(1, jnp.int64), jnp.zeros(1), 1.0
  for delta in (0.75, 0.6, 0.45, 0.1):
    log_mass = jnp.log(jnp.asarray(window))
    eps = float(readout._epsilon_of(first, log_mass, p_inf, delta, interval)[0])
    exact = lambda e: float(readout._delta_of(first, log_mass, p_inf, e, interval)[0])
    assert exact(eps) <= delta * (1 + 1e-12), (delta, eps, exact(eps))
    assert exact(max(eps - interval, 0.0)) > delta or eps == 0.0, (delta, eps)


@pytest.mark.parametrize("m", [1, 7, 512, 513, 1120])
def test_suffix_sums_of_logarithms_match_a_direct_sum(m):
  # readout._suffix: log Σ_{j>k} e^{x_j}, as one masked reduction up to 512 terms and in groups
  # of about √m beyond (padded where m is not a multiple); terms spread over 1,400 nats (no
  # shift fits them all) and -inf among them. The reference sums each suffix in extended
  # precision from its largest term.
  from jaxrdp.accounting.pld import readout
  rng = np.random.default_rng(m)
  x = rng.uniform(-700.0, 700.0, (2, m))
  x[:, rng.integers(0, m, m // 3)] = -np.inf
  got = np.asarray(readout._suffix(jnp.asarray(x)))
  for row, out in zip(x, got):
    for k in range(m):
      tail = row[k + 1:]
      if not np.isfinite(tail).any():
        assert out[k] == -np.inf
        continue
      top = tail.max()
      exact = float(top + np.log(np.sum(np.exp(np.longdouble(tail - top)))))
      assert abs(out[k] - exact) <= 1e-13 * (abs(exact) + 1), (k, out[k], exact)


def test_grid_sizes_come_three_per_octave_so_that_nearby_schedules_share_them():
  # Each size is a multiple of its block, at least the need and at most a third above it
  # (1, 2 or 3 blocks, then 2^a times 4, 5 or 6): few sizes, so few compiled programs.
  from jaxrdp.accounting.pld import sizing
  for multiple in (64, 512):
    needs = np.unique(np.geomspace(1, 2e7, 4000).astype(int))
    sizes = np.array([sizing._fast_size(n, multiple) for n in needs])
    blocks = sizes // multiple
    assert np.all(sizes % multiple == 0) and np.all(sizes >= needs)
    least = -(-needs // multiple)
    assert np.all((blocks == least) | (blocks < least * 4 / 3))
    octave = 2 ** np.floor(np.log2(np.maximum(blocks, 4) / 4))
    assert set(blocks[blocks >= 4] / octave[blocks >= 4]) == {4.0, 5.0, 6.0}
  # 21 noise multipliers in [1, 1.2] (T = 10,000, q = 0.01, read at δ = 1e-5): 4 grids (16 with
  # the next FFT-friendly length above each need).
  grids = {jaxrdp.pld_grid(0.01, s, 10_000, delta=1e-5) for s in np.linspace(1.0, 1.2, 21)}
  assert len(grids) <= 5, grids


def test_grids_of_the_same_sizes_run_one_program_whatever_their_interval_and_tail_mass():
  # The interval and the tail mass are values of the program, not constants in it: queries at
  # several δ (whose grids aim at tail masses below each δ) or intervals on grids of the same
  # sizes compile once. The grids' values still reach the result.
  from jaxrdp.accounting.pld import discretisation, readout
  grid = jaxrdp.pld_grid(0.05, 2.0, 300, interval=2e-3)
  other = grid._replace(interval=3.0137e-3, tail_mass=1e-13)   # values first met in a jit
  first = float(jax.jit(lambda s_: jaxrdp.pld_epsilon(0.05, s_, 300, 1e-6, pld_grid=other))(2.0))
  q, s, t = (np.array([v], np.float64) for v in (0.05, 2.0, 300.0))
  sizes = discretisation.lattice(grid)[1]
  for second in (readout._epsilon_of_steps, readout._delta_of_steps):
    program = lambda v: second(readout._poisson_steps(q, s, None, v, pmf_bins=sizes[0]), t,
                               np.float64(1e-6), v, sizes=sizes)
    jaxprs = [str(jax.make_jaxpr(program)(discretisation.lattice(g)[0])) for g in (grid, other)]
    assert jaxprs[0] == jaxprs[1]
  programs = (readout._poisson_steps, readout._epsilon_of_steps)
  before = [len(p.executables) for p in programs]
  values = [float(jaxrdp.pld_epsilon(0.05, 2.0, 300, 1e-6, pld_grid=g)) for g in (grid, other)]
  compiled = [len(p.executables) - b for p, b in zip(programs, before)]
  assert max(compiled) <= 1   # 0 with JAXRDP_PLAIN_JIT=1 (jax.jit's own cache)
  assert values[0] != values[1] and all(np.isfinite(values))
  # The same values as the grids' own traced programs (the user's jax.jit: constants there).
  assert first == values[1]
  for g, value in zip((grid, other), values):
    jitted = jax.jit(lambda s_: jaxrdp.pld_epsilon(0.05, s_, 300, 1e-6, pld_grid=g))
    assert float(jitted(2.0)) == value
