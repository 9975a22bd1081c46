"""How entry points are traced and compiled: no nested jits, loops kept, programs prepared together.

``jaxrdp._internal.compilation.jit`` traces an entry point's body under ``jax.disable_jit()``
(every ``jax.numpy`` function then binds its primitives straight into the one jaxpr instead of
being traced as a nested jaxpr first). Under ``jax.disable_jit()`` the ``lax`` loops would run
in Python (``scan``, ``map``, ``fori_loop`` unrolled; ``while_loop``'s body traced twice), so
jaxrdp's loops go through ``jaxrdp._internal.loops``, which keeps them loops.
"""

import pathlib
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from jaxrdp._internal import compilation
from jaxrdp._internal import loops

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "jaxrdp"


def _equations(jaxpr):
  """Every equation of ``jaxpr`` and of the jaxprs inside it."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          yield from _equations(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          yield from _equations(sub)


def _primitives(jaxpr):
  return [eqn.primitive.name for eqn in _equations(jaxpr)]


def test_an_entry_point_traces_without_nested_jits_and_its_loops_stay_loops():
  calls = {"body": 0, "cond": 0, "fori": 0, "scan": 0, "map": 0}
  disabled = []

  def counted(name, fn):
    def call(*args):
      calls[name] += 1
      disabled.append(jax.config.jax_disable_jit)
      return fn(*args)
    return call

  def program(x):
    disabled.append(jax.config.jax_disable_jit)
    # A while loop whose counter starts concrete: run in Python, its body would be traced
    # once eagerly and once more as the loop.
    total, _ = loops.while_loop(counted("cond", lambda c: c[1] < 5),
                                counted("body", lambda c: (c[0] + jnp.sum(x), c[1] + 1)),
                                (jnp.zeros((), x.dtype), np.int32(0)))
    total = loops.fori_loop(0, 7, counted("fori", lambda i, t: t * 1.5), total)
    total, ys = loops.scan(counted("scan", lambda t, v: (t + v, v * v)), total, x)
    squares = loops.map(counted("map", lambda v: v * 2.0), ys)
    return total + jnp.sum(squares)

  f = compilation.jit(program)
  x = np.arange(1.0, 10.0)
  names = _primitives(f.trace(x).jaxpr.jaxpr)
  # fori_loop with static bounds and map are scans too.
  assert names.count("while") == 1 and names.count("scan") == 3, names
  assert calls == {"body": 1, "cond": 1, "fori": 1, "scan": 1, "map": 1}
  # Nested jits disabled in the body and inside every loop.
  assert disabled and all(disabled)
  expected = 5 * x.sum() * 1.5 ** 7 + x.sum() + 2 * (x * x).sum()
  np.testing.assert_allclose(float(f(x)), expected, rtol=1e-12)
  # Outside an entry point they are plain lax loops, with jit as it was.
  disabled.clear()
  np.testing.assert_allclose(float(jax.jit(program)(x)), expected, rtol=1e-12)
  assert disabled and not any(disabled)


def test_a_user_s_disable_jit_still_gets_loops_and_the_same_values():
  # Op by op (the user's setting is honoured), with the loops still compiled loops: the same
  # values to rounding (the compiled program fuses the same operations).
  import jaxrdp
  orders = [1.5, 2.0]
  plain = np.asarray(jaxrdp.compute_rdp(0.01, 1.1, 10, orders))
  with jax.disable_jit():
    debugged = np.asarray(jaxrdp.compute_rdp(0.01, 1.1, 10, orders))
  np.testing.assert_allclose(debugged, plain, rtol=1e-13)


def test_jaxrdp_has_no_other_loops():
  pattern = re.compile(r"\blax\.(while_loop|fori_loop|scan|map)\(")
  offenders = [f"{path.relative_to(PACKAGE)}:{i}"
               for path in sorted(PACKAGE.rglob("*.py")) if path.name != "loops.py"
               for i, line in enumerate(path.read_text().splitlines(), 1)
               if pattern.search(line) and "``" not in line]
  assert not offenders, offenders


def test_an_entry_point_inside_another_is_a_nested_jit_traced_once():
  # Inside an entry point's trace jit is disabled, but jaxrdp's own entry points called there
  # stay real nested jits: their jaxpr is traced once and reused by every program calling it.
  traced = []

  @compilation.jit
  def inner(v):
    traced.append(jax.config.jax_disable_jit)
    return jnp.exp(v) * 2.0

  first = compilation.jit(lambda v: inner(v) + 1.0)
  second = compilation.jit(lambda v: inner(v) - 1.0)
  x = np.arange(3.0)
  np.testing.assert_allclose(np.asarray(first(x)), np.exp(x) * 2.0 + 1.0, rtol=1e-15)
  np.testing.assert_allclose(np.asarray(second(x)), np.exp(x) * 2.0 - 1.0, rtol=1e-15)
  assert traced == [True]


def test_prepared_programs_compile_in_the_background_once_and_errors_reach_the_call(monkeypatch):
  # compilation.jit(f).prepare(args) traces and lowers now and compiles in a background
  # thread; the call with the same arguments waits for that compilation instead of starting
  # its own, and a compilation that fails raises at the call. (The dispatch layer on, also
  # in a JAXRDP_PLAIN_JIT=1 run: these entry points are made here.)
  monkeypatch.setattr(compilation, "plain_jit", lambda: False)
  traced = []

  def program(v):
    traced.append(1)
    return jnp.sin(v) * 3.0

  f = compilation.jit(program)
  x = np.linspace(0.0, 1.0, 5)
  f.prepare(x)
  f.prepare(x)   # already prepared: nothing more
  ahead_of_time = jax.default_backend() == "cpu"   # elsewhere jax.jit's own cache: no-op
  assert len(traced) == (1 if ahead_of_time else 0)
  np.testing.assert_allclose(np.asarray(f(x)), np.sin(x) * 3.0, rtol=1e-15)
  assert len(traced) == 1
  if not ahead_of_time:
    return

  def failing(lowered):
    raise RuntimeError("compilation failed")
  monkeypatch.setattr(compilation, "_compile_with_options", failing)
  g = compilation.jit(lambda v: v + 1.0)
  g.prepare(x)   # the error surfaces at the call, not here
  try:
    g(x)
  except RuntimeError as error:
    assert "compilation failed" in str(error)
  else:
    raise AssertionError("the failed compilation did not raise")


def test_a_chained_computation_compiles_its_second_program_once_for_the_first_ones_outputs(
    monkeypatch):
  # compilation.chained(first, a, second, b) is second(first(*a), *b). Eager, the second
  # program is traced and compiled for the shapes (and placement) of the first's outputs
  # before the first runs, and the call then uses that very executable (a key that did not
  # match would compile a second one); a later call compiles nothing. Traced, it is the nested
  # call: the same values under jax.jit.
  monkeypatch.setattr(compilation, "plain_jit", lambda: False)
  traced = []

  def steps(v, w):
    traced.append("first")
    return (v * 2.0, jnp.sum(w)), jnp.arange(3)

  def combine(pair_and_index, y):
    traced.append("second")
    (doubled, total), index = pair_and_index
    return doubled * total + y + index

  first, second = compilation.jit(steps), compilation.jit(combine)
  x, w, y = np.arange(3.0), np.float64(1.5), np.float64(0.25)
  value = compilation.chained(first, (x, w), second, (y,))
  np.testing.assert_array_equal(np.asarray(value), x * 2.0 * 1.5 + 0.25 + np.arange(3))
  if jax.default_backend() != "cpu":   # elsewhere jax.jit's own cache
    return
  assert len(first.executables) == len(second.executables) == 1
  assert traced == ["first", "second"]
  again = compilation.chained(first, (x, w), second, (y,))
  assert len(first.executables) == len(second.executables) == 1 and len(traced) == 2
  np.testing.assert_array_equal(np.asarray(again), np.asarray(value))
  jitted = jax.jit(lambda v: compilation.chained(first, (v, w), second, (y,)))(x)
  np.testing.assert_array_equal(np.asarray(jitted), np.asarray(value))
  # With a light step between the two (run eagerly, op by op), the second is compiled for the
  # shapes that step gives the first's outputs: once, and that executable is the one used.
  pad = lambda outputs: ((jnp.pad(outputs[0][0], (0, 2)), outputs[0][1]),
                         jnp.pad(outputs[1], (0, 2)))
  count = len(traced)
  widened = compilation.chained(first, (x, w), second, (y,), between=pad)
  np.testing.assert_array_equal(np.asarray(widened), [0.25, 4.25, 8.25, 0.25, 0.25])
  assert len(second.executables) == 2 and traced[count:] == ["second"]


def test_a_mixed_grid_is_two_programs_whose_columns_land_where_their_orders_are():
  # compute_rdp's eager path evaluates the integer orders (exact sums) and the others
  # (shared nodes) of one grid as two programs and puts each column back at its order.
  import jaxrdp
  orders = np.array([3.0, 1.5, 64.0, 2.25, 2.0, 10.5, 1.0, 128.0, np.inf, 7.75])
  q, sigma = np.array([0.01, 0.2, 0.003]), np.array([1.1, 3.0, 0.8])
  mixed = np.asarray(jaxrdp.compute_rdp(q, sigma, 100, orders))
  integer = np.isin(orders, [3.0, 64.0, 2.0, 128.0])
  alone = np.empty_like(mixed)
  alone[:, integer] = np.asarray(jaxrdp.compute_rdp(q, sigma, 100, orders[integer]))
  alone[:, ~integer] = np.asarray(jaxrdp.compute_rdp(q, sigma, 100, orders[~integer]))
  np.testing.assert_array_equal(mixed, alone)
  # And the values themselves: the closed form at alpha = 2, A_2 = 1 + q^2 (e^{1/sigma^2} - 1).
  np.testing.assert_allclose(mixed[:, 4], 100 * np.log1p(q * q * np.expm1(1 / sigma ** 2)),
                             rtol=1e-13)


def test_an_eager_derivative_of_epsilon_prepares_its_program_before_the_search(monkeypatch):
  # jax.grad of dpsgd_epsilon outside jax.jit: the derivative's program is prepared (compiled
  # in the background) before the search runs, for the directions that carry tangents and a
  # fractional order; the derivative is the one jax.jit computes.
  import jaxrdp
  from jaxrdp.accounting import dpsgd
  seen = []
  prepare = dpsgd._gradient_at.prepare
  monkeypatch.setattr(dpsgd._gradient_at, "prepare",
                      lambda *a, **k: (seen.append((a[0][0], k["wanted"])), prepare(*a, **k)))
  f = lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 10_000, 1e-5)
  eager = float(jax.grad(f)(1.1))
  assert seen == [(1.5, (False, True, False, False))]
  traced = float(jax.jit(jax.grad(f))(1.1))
  assert len(seen) == 1   # nothing to prepare inside a trace
  np.testing.assert_allclose(eager, traced, rtol=1e-9)
  assert eager < 0   # more noise, less epsilon


def test_a_mixed_grid_prepares_its_two_programs_once_and_reassembles_the_columns():
  # by_order_parts prepares both programs on the first call of a signature only (a search
  # calls it at every step), runs both, and puts each column back at its order.
  from jaxrdp.accounting import composition
  from jaxrdp.mechanisms import sampled_gaussian
  orders = np.array([1.5, 2.0, 2.5, 3.0, 7.25])
  split = sampled_gaussian.order_split(orders)
  tables = sampled_gaussian.order_tables(orders, split)
  prepared, ran = [], []

  def program(x, part_orders, part_split, part_tables):
    ran.append(part_split)
    return (x[:, None] * part_orders[None, :], x[:, None] + part_orders[None, :])

  program.prepare = lambda *args: prepared.append(args[2])
  x = np.array([1.0, 2.0])
  for _ in range(3):
    product, total = composition.by_order_parts(program, (x,), orders, split, tables)
    np.testing.assert_array_equal(product, x[:, None] * orders[None, :])
    np.testing.assert_array_equal(total, x[:, None] + orders[None, :])
  assert len(prepared) == 2 and len(ran) == 6
  assert {len(s.sums) for s in prepared} == {0, 1}   # one part with the sums, one without
  composition.by_order_parts(program, (np.ones(3),), orders, split, tables)   # new shape
  assert len(prepared) == 4


def test_batched_as_batches_a_loop_body_in_one_pass():
  # vmap batches a while loop's body again for each state variable that becomes batched after
  # a pass, and each pass runs the batching rules of the kernels inside it (traced anew).
  # With batched_as, the initial state is batched at once: one pass, the same values.
  rules = []

  @jax.custom_batching.custom_vmap
  def kernel(x):
    return 2 * x

  @kernel.def_vmap
  def _rule(axis_size, in_batched, x):
    rules.append(axis_size)
    return 2 * x, in_batched[0]

  def run(x, batched_as):
    body = lambda c: (c[0] + 1, kernel(c[1] + x))
    return loops.while_loop(lambda c: c[0] < 3, body, (0, jnp.zeros(())),
                            batched_as=batched_as)[1]
  xs = jnp.arange(4.0)
  plain = jax.vmap(lambda x: run(x, ()))(xs)
  assert len(rules) >= 2   # (3 with jax 0.10)
  rules.clear()
  once = jax.vmap(lambda x: run(x, (x,)))(xs)
  assert rules == [4]
  np.testing.assert_array_equal(once, plain)
  np.testing.assert_array_equal(once, 14 * xs)
  assert float(run(1.0, (jnp.ones(()),))) == 14.0   # nothing batched: unchanged


def test_any_lane_keeps_an_optional_branch_a_cond_under_vmap():
  # A batched predicate turns lax.cond into a select that runs both branches in every lane;
  # loops.any_lane makes it one scalar (any lane's), so the branch runs only where some lane
  # asks, for the whole batch.
  def f(x):
    return jax.lax.cond(loops.any_lane(x > 1.0), lambda v: jnp.sin(v) * 2.0, lambda v: v, x)
  jaxpr = jax.make_jaxpr(jax.vmap(f))(jnp.array([0.5, 0.7]))
  names = _primitives(jaxpr.jaxpr)
  assert "cond" in names and "select_n" not in names and "reduce_or" in names
  np.testing.assert_array_equal(jax.vmap(f)(jnp.array([0.5, 0.7])), [0.5, 0.7])
  # One lane asks: the branch runs in both (the caller's branch must suit every lane).
  np.testing.assert_allclose(jax.vmap(f)(jnp.array([0.5, 2.0])), 2.0 * np.sin([0.5, 2.0]))
  assert float(f(2.0)) == float(2.0 * jnp.sin(2.0)) and float(f(0.5)) == 0.5
  # Differentiable (a cond), nested vmaps reduce at each level.
  np.testing.assert_allclose(jax.vmap(jax.grad(f))(jnp.array([0.5, 0.7])), [1.0, 1.0])
  nested = jax.vmap(jax.vmap(f))(jnp.array([[0.5, 0.7], [0.2, 3.0]]))
  np.testing.assert_allclose(nested, [[0.5, 0.7], 2.0 * np.sin([0.2, 3.0])])


def test_what_a_derivative_rule_computes_from_its_primals_is_not_partially_evaluated(monkeypatch):
  # A custom_jvp rule whose search (a while loop) depends on the primals alone: under jax.grad
  # the rule runs in a partial-evaluation trace, which re-traces a loop bound there even when
  # all its inputs are known; through loops.of_primals it is handed to the enclosing trace.
  from jax._src.interpreters import partial_eval as pe
  evaluated = []
  rule = pe.custom_partial_eval_rules[jax.lax.while_p]
  monkeypatch.setitem(pe.custom_partial_eval_rules, jax.lax.while_p,
                      lambda *a, **k: evaluated.append(1) or rule(*a, **k))

  def search(x):   # the root of y^3 = x by bisection: a loop of the primal alone
    def halve(c):
      mid = 0.5 * (c[0] + c[1])
      return jnp.where(mid**3 > x, jnp.stack([c[0], mid]), jnp.stack([mid, c[1]]))
    lo, hi = jax.lax.while_loop(lambda c: c[1] - c[0] > 1e-12, halve, jnp.stack([0.0, 8.0]))
    return 0.5 * (lo + hi)

  def make(wrap):
    @jax.custom_jvp
    def root(x):
      return search(x)

    @root.defjvp
    def _(primals, tangents):
      y = wrap(search)(*primals)
      return y, tangents[0] / (3 * y**2)
    return root

  plain, wrapped = make(lambda f: f), make(loops.of_primals)
  x = jnp.float64(2.0)
  expected = jax.jit(jax.grad(plain))(x)
  assert evaluated
  evaluated.clear()
  np.testing.assert_array_equal(jax.jit(jax.grad(wrapped))(x), expected)
  assert not evaluated
  np.testing.assert_allclose(expected, 1 / (3 * 2.0 ** (2 / 3)), rtol=1e-9)
  # A second derivative reaches the wrapper's own rule: NaN, in every order of the modes.
  for second in (jax.hessian, lambda f: jax.jacfwd(jax.grad(f)), lambda f: jax.grad(jax.grad(f))):
    assert np.isnan(second(wrapped)(x)), second
  np.testing.assert_allclose(jax.hessian(plain)(x), 0.0)   # what differentiating it gave


def _entry_fusions(text):
  """The fusions (kernels) of an optimised HLO module's entry computation."""
  entry = text[text.index("\nENTRY "):]
  entry = entry[:entry.index("\n}")]
  return re.findall(r"= \S+ fusion\(", entry)


def test_in_body_keeps_what_a_loop_computes_from_its_parameters_in_the_body():
  # XLA moves a computation of values that every step sees unchanged out of the loop, where it
  # is one more kernel to compile (tools/kernel_census.py: ~10 of them in jax.jit of ε).
  # Through loops.in_body the same computation stays in the body's kernels, with the same
  # values.
  x = np.linspace(0.5, 2.0, 7)

  def loop(keep):
    def f(v):
      def body(carry):
        i, acc = carry
        w = loops.in_body(v, i) if keep else v
        per = jnp.log(w) / (1.0 + jnp.sqrt(w))   # a function of the parameter alone
        return i + 1, acc * 0.5 + per * jnp.cos(acc + i)
      return loops.while_loop(lambda c: c[0] < 5, body, (0, v))[1]   # (no kernel of its own)
    return jax.jit(f).lower(x).compile()

  hoisted, kept = loop(False), loop(True)
  assert _entry_fusions(hoisted.as_text())   # XLA hoisted the parameter's function
  assert not _entry_fusions(kept.as_text())
  np.testing.assert_array_equal(np.asarray(kept(x)), np.asarray(hoisted(x)))
  # A pytree of values, in and out in the same structure.
  out = loops.in_body({"a": jnp.ones(2), "b": (jnp.zeros(3),)}, jnp.int32(1))
  assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(
      {"a": 0, "b": (0,)})


def test_long_loops_read_an_array_in_their_conditions():
  # A loop whose condition is one operation on one value of its state makes XLA extract, in
  # several passes, all of the body that computes that value (its trip-count analysis; ~0.1 s
  # of jax.jit(dpsgd_epsilon)'s compilation): jaxrdp's long loops compare an entry of an array,
  # or read more than one value of their state (jaxrdp._internal.loops.while_loop). Checked on
  # the programs of dpsgd_epsilon, its gradient and a calibration under jax.jit.
  import jaxrdp
  programs = [
      jax.make_jaxpr(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 1000, 1e-5))(1.1),
      jax.make_jaxpr(jax.grad(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 1000, 1e-5)))(1.1),
      jax.make_jaxpr(lambda e: jaxrdp.calibrate_noise_multiplier(e, 1e-5, 0.01, 1000))(2.0),
  ]
  long_loops = 0
  for closed in programs:
    for eqn in (e for e in _equations(closed.jaxpr) if e.primitive.name == "while"):
      body = eqn.params["body_jaxpr"].jaxpr
      if len(_primitives(body)) < 100:   # a short body costs XLA little to extract
        continue
      long_loops += 1
      cond = eqn.params["cond_jaxpr"].jaxpr
      carry = cond.invars[eqn.params["cond_nconsts"]:]
      used = set()
      for e in cond.eqns:
        used.update(v for v in e.invars if isinstance(v, jax.extend.core.Var))
      used.update(v for v in cond.outvars if isinstance(v, jax.extend.core.Var))
      read = [v for v in carry if v in used]
      # One value read: an array, and the condition computes (a reshape is looked through).
      root = next(e for e in cond.eqns if cond.outvars[0] in e.outvars)
      computes = root.primitive.name not in ("squeeze", "reshape", "slice", "copy",
                                             "convert_element_type")
      assert len(read) > 1 or (read[0].aval.shape != () and computes), (
          f"a loop of {len(_primitives(body))} operations stops on one value of its state")
  assert long_loops >= 3   # the nested grids' and the order search's loops at least


def test_the_kernels_batching_rules_trace_them_without_nested_jits(monkeypatch):
  # Under a user's jax.jit(jax.vmap(...)) the kernels' custom_vmap rules run when vmap
  # batches the search's loop, outside the entry point's jax.disable_jit(): each rule disables
  # nested jits itself (loops.without_nested_jit). Before, ~190 jax.numpy functions were traced
  # there as nested jaxprs of their own (~0.1 s of the first call).
  import traceback
  import jaxrdp
  from jax._src import pjit
  trace_for_jit, nested = pjit._trace_for_jit, []

  def recorded(*args, **kwargs):
    frames = [f.filename for f in traceback.extract_stack() if "/jaxrdp/" in f.filename]
    nested.append(frames[-1] if frames else "")
    return trace_for_jit(*args, **kwargs)

  monkeypatch.setattr(pjit, "_trace_for_jit", recorded)
  jax.jit(jax.vmap(lambda s: jaxrdp.dpsgd_epsilon(0.01, s, 10_000, 1e-5))).trace(
      jnp.linspace(0.6, 3.0, 64))
  assert nested   # (the hook saw the trace: the checks outside the kernels are nested jits)
  assert not [f for f in nested if "/mechanisms/" in f], nested
