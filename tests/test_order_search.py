"""Branch and bound over the orders (jaxrdp/accounting/order_search.py) finds the grid's best order.

Reference: the plain minimum of compute_epsilon over every order of the grid (all orders
evaluated). The search must return the same order and the same ε up to a few ulps (orders are
converted one at a time), while evaluating far fewer orders. Random phased schedules over
q ∈ [1e-4, 1], σ ∈ [0.3, 30], T ∈ [1, 1e5], δ ∈ [1e-12, 1e-2], fixed seed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrdp
from jaxrdp.accounting.order_search import grid_epsilon
from jaxrdp.accounting.dpsgd import schedule_rdp


@pytest.mark.parametrize("dtype, rel", [(jnp.float64, 4e-15), (jnp.float32, 1e-6)])
def test_search_equals_the_full_grid_minimum_with_fewer_evaluations(dtype, rel):
  grid = jnp.asarray(jaxrdp.DEFAULT_ORDERS, dtype)
  search = jax.jit(lambda q, s, t, d: grid_epsilon(lambda a: schedule_rdp(q, s, t, a), grid, d,
                                                   return_evaluations=True))
  full = jax.jit(lambda q, s, t, d: jaxrdp.compute_epsilon(grid, schedule_rdp(q, s, t, grid), d))
  rng = np.random.default_rng(7)
  counts = []
  for _ in range(25):
    q = jnp.asarray(10 ** rng.uniform(-4, 0, 2), dtype)
    s = jnp.asarray(10 ** rng.uniform(-0.5, 1.5, 2), dtype)
    t = jnp.asarray(np.round(10 ** rng.uniform(0, 5, 2)), dtype)
    d = jnp.asarray(10 ** rng.uniform(-12, -2), dtype)
    eps, order, n = search(q, s, t, d)
    eps_full, order_full = full(q, s, t, d)
    assert float(order) == float(order_full)
    assert float(eps) == pytest.approx(float(eps_full), rel=rel, abs=0)
    counts.append(int(n))
  assert np.median(counts) <= 48 < grid.shape[0]


def test_an_infinite_order_is_handled_like_the_full_grid():
  grid = jnp.concatenate([jnp.asarray(jaxrdp.DEFAULT_ORDERS), jnp.array([jnp.inf])])
  q, s, t, d = jnp.array([0.5]), jnp.array([0.2]), jnp.array([3.0]), jnp.asarray(1e-5)
  eps, order = grid_epsilon(lambda a: schedule_rdp(q, s, t, a), grid, d)
  eps_full, order_full = jaxrdp.compute_epsilon(grid, schedule_rdp(q, s, t, grid), d)
  assert float(eps) == pytest.approx(float(eps_full), rel=4e-15)
  assert float(order) == float(order_full)


def test_no_noise_gives_infinite_epsilon_and_terminates():
  # σ = 0: the RDP is +inf at every order; the search must stop (a regression: it looped).
  assert float(jaxrdp.dpsgd_epsilon(0.001, 0.0, 10, 1e-5, refine_order=False)) == np.inf
  assert float(jaxrdp.dpsgd_epsilon(0.001, 0.0, 10, 1e-5)) == np.inf


@pytest.mark.parametrize("size", [2, 6])
def test_a_traced_grid_smaller_than_a_batch_is_refined_like_a_concrete_one(size):
  # A regression: a traced grid of fewer than BATCH - 1 orders crashed in lax.top_k (k = 8 picks
  # among k + 1 positions). Reference: the same grid passed concretely (refined on the host,
  # to a bracket 10^6 times narrower, in steps of one row of shared nodes: `size` orders here;
  # the branch and bound 8,300 times, in steps of 8): the two evaluate different orders and
  # agree to the coarser one's resolution (the bracket between grid orders 2 and 64 is wide),
  # the concrete one never above.
  grid = np.geomspace(2.0, 64.0, size)
  traced = jax.jit(lambda g: jaxrdp.dpsgd_epsilon(0.01, 1.1, 100.0, 1e-5, orders=g))(grid)
  concrete = jaxrdp.dpsgd_epsilon(0.01, 1.1, 100.0, 1e-5, orders=grid)
  assert float(traced) == pytest.approx(float(concrete), rel=1e-7)
  assert float(concrete) <= float(traced) * (1 + 1e-13)


@pytest.mark.parametrize("grid", [[1.5, 2.0, 4.0, 8.0], [1.5, 2.5], [3.25]])
def test_a_grid_with_a_group_of_one_or_two_fractional_orders_is_refined(grid):
  # A regression: one fractional order made a refinement row of one order, whose step does not
  # narrow the bracket (ZeroDivisionError counting the steps). Rows are at least 8 orders wide:
  # eager and jit agree, and the refined ε is never above the grid's.
  eps = lambda s, **kw: jaxrdp.dpsgd_epsilon(0.01, s, 1000.0, 1e-5, orders=grid, **kw)
  eager = float(eps(1.1))
  assert np.isfinite(eager) and eager <= float(eps(1.1, refine_order=False))
  assert float(jax.jit(eps)(1.1)) == pytest.approx(eager, rel=1e-12)


def test_a_trajectory_over_a_small_grid_equals_each_prefix_epsilon():
  # A regression: the trajectory refines every prefix with grid_epsilon, which crashed on a
  # grid of two orders. Reference: dpsgd_epsilon of each prefix on the same grid.
  grid = [2.0, 8.0]
  eps = jaxrdp.epsilon_trajectory(0.01, 1.1, 100, 1e-5, np.array([10.0, 50.0]), orders=grid)
  expected = [float(jaxrdp.dpsgd_epsilon(0.01, 1.1, t, 1e-5, orders=grid)) for t in (10.0, 50.0)]
  np.testing.assert_allclose(np.asarray(eps), expected, rtol=1e-12)


# The refinement's model steps (order_search.model_windows): after the first refinement step,
# each places its orders in a window around the vertex of the parabola through the best order
# and its neighbours, as narrow as the parabola's error estimate and rounding allow.

from jaxrdp.accounting import order_search
from jaxrdp.accounting import epsilon as epsilon_module


def _window(values, x, j):
  """model_windows' window for the best at position j (lo, hi), NaN where none."""
  windows = order_search.model_windows(np.asarray(x), np.asarray(values), np)
  return windows[:, j - 2]


def test_a_model_window_holds_the_vertex_of_a_parabola_at_its_narrowest():
  x = np.arange(1.0, 33.0) * 0.25   # 32 orders 0.25 apart
  for vertex in (3.3, 3.37, 3.49, 5.0):
    values = 2.0 + 0.7 * (x - vertex) ** 2
    j = int(np.argmin(values))
    lo, hi = _window(values, x, j)
    assert lo < vertex < hi
    # The narrowest window: ZOOM of the bracket (two spacings), rounded: 2 s ZOOM wide.
    assert hi - lo == pytest.approx(2 * 0.25 * order_search.ZOOM, rel=1e-12)


def test_a_model_window_widens_with_the_parabola_s_error_and_still_holds_the_minimum():
  x = np.arange(1.0, 33.0) * 0.25
  widths = []
  for b in (0.0, 0.03, 0.1, 0.2):   # a cubic term moves the vertex of the parabola
    vertex = 4.1
    f = lambda u: 1.0 + (u - vertex) ** 2 + b * (u - vertex) ** 3
    values = f(x)
    j = int(np.argmin(values))
    lo, hi = _window(values, x, j)
    dense = np.linspace(x[j - 1], x[j + 1], 200001)
    minimum = dense[np.argmin(f(dense))]
    assert lo <= minimum <= hi
    widths.append(hi - lo)
  assert widths == sorted(widths) and widths[-1] > widths[0]


def test_no_model_window_where_values_are_flat_or_not_finite():
  x = np.arange(1.0, 33.0)
  flat = np.full(32, 3.0)
  flat[10] = 3.0 - 1e-16   # a difference at the rounding's scale
  assert np.all(np.isnan(_window(flat, x, 10)))
  values = 1.0 + (x - 11.2) ** 2
  values[9] = np.inf
  assert np.all(np.isnan(_window(values, x, 11)))


def _search_steps(monkeypatch, q, sigma, steps, delta):
  calls = []
  update = order_search.search_update
  monkeypatch.setattr(order_search, "search_update",
                      lambda *a, **k: calls.append(1) or update(*a, **k))
  grid = np.asarray(jaxrdp.DEFAULT_ORDERS)
  eps, order = epsilon_module._concrete_epsilon(*(jnp.asarray([v]) for v in (q, sigma, steps)),
                                                jnp.asarray(delta), grid, True)
  return len(calls), float(eps), float(order)


@pytest.mark.parametrize("case, most", [((0.01, 1.1, 10_000, 1e-5), 3), ((0.01, 0.7, 10_000, 1e-5), 3),
                                        ((0.05, 2.0, 2_000, 1e-6), 3), ((0.2, 0.35, 100, 1e-5), 3),
                                        ((0.001, 5.0, 100, 1e-5), 6)])
def test_the_refinement_takes_three_model_steps_to_a_millionth_of_a_spacing(monkeypatch, case,
                                                                            most):
  # Three refinement steps where ε is close to a parabola around its minimum (ordinary steps
  # took five); at an optimal order of 345 (spacing 64, the sharp rise of RDP beyond it) the
  # model gives way to ordinary steps, up to the cap (refinement_steps). Reference: the
  # optimal order with the bracket narrowed 1e12 times (up to ten steps).
  steps, eps, order = _search_steps(monkeypatch, *case)
  monkeypatch.setattr(order_search, "SHRINK", 1e12)
  _, eps_ref, order_ref = _search_steps(monkeypatch, *case)
  assert steps - 1 <= most <= epsilon_module.refinement_steps(32)
  grid = np.sort(np.asarray(jaxrdp.DEFAULT_ORDERS))
  spacing = np.diff(grid)[np.searchsorted(grid, order) - 1]
  assert abs(order - order_ref) <= 2e-6 * spacing
  assert eps == pytest.approx(eps_ref, rel=1e-13)
