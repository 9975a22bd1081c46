r"""Private full-batch gradient descent with the Relative Gaussian Mechanism (optax).

``relative_gaussian_noise`` is an optax ``GradientTransformation`` that releases the update
pytree g (flattened into one vector of dimension d) as

.. math:: \tilde g = g + (\gamma \|g\|_2 + \sigma)\, N(0, I_d),

the mechanism of Hendrikx, Mangold, Bellet (2024), Def. 3 with the noise standard deviation
affine in the norm of the output (as in the authors' code). Chain it first, before the
optimiser: ``optax.chain(relative_gaussian_noise(...), optax.sgd(lr))``.

``rdp_relative_gaussian_descent`` is the privacy cost of T such steps: the RDP of one step
(``jaxrdp.rdp_relative_gaussian``) times T, by adaptive composition (Mironov 2017, Prop. 1).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrdp._internal import deprecation
from jaxrdp._internal import validation
from jaxrdp.mechanisms.relative_gaussian import rdp_relative_gaussian
from jaxrdp.training.noise import standard_normals


class RelativeGaussianNoiseState(NamedTuple):
  """State of :func:`relative_gaussian_noise`.

  Attributes:
    rng_key: the PRNG key for the next step.
    count: the number of steps taken.
  """

  rng_key: jax.Array
  count: jax.Array


def _typed_key(key) -> jax.Array:
  """A typed PRNG key from a typed key, a raw ``uint32`` key or an int seed; never a default."""
  data, impl = validation.canonical_key(key)
  return jax.random.wrap_key_data(data) if impl is None else jax.random.wrap_key_data(data, impl=impl)


def relative_gaussian_noise(eta: jax.typing.ArrayLike, gamma: jax.typing.ArrayLike,
                            sigma: jax.typing.ArrayLike, key: jax.Array | int, *,
                            r_rel: jax.typing.ArrayLike | None = None
                            ) -> optax.GradientTransformation:
  r"""Adds (γ‖g‖ + σ)·N(0, I) to the update g: the Relative Gaussian Mechanism as an optax transform.

  ‖g‖ is the global L2 norm of the whole update pytree, and one standard deviation
  γ‖g‖ + σ is shared by all leaves (the released vector is the flattened pytree). Noise is
  drawn and added in at least float32, then cast back to each leaf's dtype. The key is split
  at every step, so each step uses fresh noise; works under ``jax.jit``.

  **What the user must establish.** The privacy guarantee
  (:func:`rdp_relative_gaussian_descent`) holds when the updates fed to this transform are a
  query with (η, R_rel)-relative L2 sensitivity: for *every* pair of neighbouring datasets
  D, D′ and *every* parameter value θ at which the update is computed (the whole trajectory,
  which depends on the earlier noisy releases),

  .. math:: \|g_D(\theta) - g_{D'}(\theta)\| \le \min\big(\eta\|g_D(\theta)\| + R_{rel},\;
            \eta\|g_{D'}(\theta)\| + R_{rel}\big),

  and :math:`\sigma \ge \gamma R_{rel}/\eta`. η and R_rel must be valid for all neighbours,
  hence not computed from the private data alone (a value read off the data, as in the
  authors' code, gives a guarantee conditional on that value). For full-batch ridge regression
  with a public normaliser n, datasets of at most m records, :math:`\|x\| \le X`,
  :math:`|y| \le Y` and regularisation λ, add/remove neighbours give η = X²/(nλ) and
  R_rel = η·X·Y·m/n + X·Y/n (the gradient is :math:`A\theta - b` with :math:`A \succeq
  \lambda I` and :math:`\|b\| \le mXY/n`; see ``examples/relative_gaussian_ridge.py``).
  Any transformation chained before this one is part of the query. With (η, γ, σ) fixed, the
  transform is the RGM for every query with relative sensitivity (η, R_rel), R_rel ≤ ησ/γ.

  Args:
    eta: η > 0, the multiplicative part of the relative sensitivity the noise is calibrated
      for. It does not change the noise; it fixes which queries are covered (R_rel ≤ ησ/γ),
      is used in the check against ``r_rel``, and is the η to pass to
      :func:`rdp_relative_gaussian_descent`.
    gamma: γ > 0, noise standard deviation per unit of update norm.
    sigma: σ ≥ 0, the norm-independent part of the standard deviation.
    key: a jax PRNG key (typed, or a raw ``uint32`` key from ``jax.random.PRNGKey``) or an int
      seed. Required: there is no default key.
    r_rel: optional R_rel ≥ 0; when given, σ ≥ γ·R_rel/η is checked (ValueError otherwise).

  Returns:
    An ``optax.GradientTransformation`` whose state is a :class:`RelativeGaussianNoiseState`.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued, or a key that is neither a PRNG key nor
      an int seed.

  References:
    Hendrikx, Mangold, Bellet, "The Relative Gaussian Mechanism and its Application to Private
    Gradient Descent", AISTATS 2024, arXiv:2308.15250, Def. 2, Def. 3, Sec. 5 (private
    gradient descent); code github.com/HadrienHx/RGM (``noisers.py``).
  """
  validation.check("eta", eta)
  validation.check("gamma", gamma)
  validation.check("relative_sigma", sigma, name="sigma")
  if r_rel is not None:
    validation.check("r_rel", r_rel)
    if validation.is_concrete((eta, gamma, sigma, r_rel)):
      need = np.asarray(gamma, np.float64) * np.asarray(r_rel, np.float64)
      have = np.asarray(sigma, np.float64) * np.asarray(eta, np.float64)
      if np.any(have < need * (1 - 4 * np.finfo(np.float64).eps)):
        raise ValueError("sigma must be >= gamma * r_rel / eta for the privacy guarantee; got "
                         f"sigma={sigma!r} < {float(np.max(need / np.asarray(eta, np.float64)))!r}.")
  key = _typed_key(key)

  def init_fn(params):
    del params
    return RelativeGaussianNoiseState(rng_key=key, count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    del params
    leaves, treedef = jax.tree.flatten(updates)
    wide = [jnp.promote_types(leaf.dtype, jnp.float32) for leaf in leaves]
    sq = sum((jnp.sum(jnp.square(leaf.astype(w))) for leaf, w in zip(leaves, wide)),
             jnp.zeros([], jnp.result_type(jnp.float32, *wide)))
    std = gamma * jnp.sqrt(sq) + sigma
    next_key, key = jax.random.split(state.rng_key)
    noise = standard_normals(key, [jax.ShapeDtypeStruct(leaf.shape, w)
                                   for leaf, w in zip(leaves, wide)])
    noised = [(leaf.astype(w) + std.astype(w) * z).astype(leaf.dtype)
              for leaf, w, z in zip(leaves, wide, noise)]
    return (jax.tree.unflatten(treedef, noised),
            RelativeGaussianNoiseState(rng_key=next_key, count=state.count + 1))

  return optax.GradientTransformation(init_fn, update_fn)


@deprecation.positional_in_old_order("alpha", "eta", "gamma", "dim", "steps",
                                     renamed={"alpha": "orders"})
def rdp_relative_gaussian_descent(*, eta: jax.typing.ArrayLike, gamma: jax.typing.ArrayLike,
                                  dim: jax.typing.ArrayLike, steps: jax.typing.ArrayLike,
                                  orders: jax.typing.ArrayLike) -> jax.Array:
  r"""RDP of ``steps`` releases of the Relative Gaussian Mechanism: T · ε_RGM(α; η, γ, d).

  Adaptive composition (Mironov 2017, Prop. 1) of :func:`jaxrdp.rdp_relative_gaussian`, valid
  when the relative sensitivity holds at every iterate (see :func:`relative_gaussian_noise`).
  Zero steps cost 0 even at orders where one step is infinite. Convert to (ε, δ) with
  ``jaxrdp.compute_epsilon(orders, rdp, delta)``.

  **Changed in 1.0:** the orders come last and are named ``orders`` (0.1.0:
  ``rdp_relative_gaussian_descent(alpha, eta, gamma, dim, steps)``). For this release the
  arguments are keyword-only, ``rdp_relative_gaussian_descent(eta=η, gamma=γ, dim=d, steps=T,
  orders=α)``; a positional call is read in the 0.1.0 order, as before, and warns
  (``DeprecationWarning``), as does the keyword ``alpha``. The next release takes
  ``(eta, gamma, dim, steps, orders)`` by position.

  Args:
    eta: η > 0.
    gamma: γ > 0.
    dim: d, the total number of entries of the update pytree (positive integer).
    steps: T ≥ 0, the number of noisy updates released.
    orders: Rényi orders α ≥ 1 (``inf`` allowed).

  Returns:
    T · ε_RGM(α), broadcast over all arguments; +inf for α ≥ (1 + η)²/(2η + η²) when T > 0.
    Under ``jax.jit`` negative or NaN ``steps`` give NaN.

  Raises:
    ValueError: an argument outside its range (the message names it, the range and the
      value).
    TypeError: an argument that is not real-valued.

  References:
    Hendrikx, Mangold, Bellet (2024), arXiv:2308.15250, Thm. 1; Mironov, "Rényi differential
    privacy", CSF 2017, arXiv:1702.07476, Prop. 1.
  """
  validation.check("steps", steps)
  validation.check_broadcast(eta=eta, gamma=gamma, dim=dim, steps=steps, orders=orders)
  rdp = rdp_relative_gaussian(eta=eta, gamma=gamma, dim=dim, orders=orders)
  t = validation.as_float_array(steps).astype(rdp.dtype)
  out = jnp.where(t == 0, jnp.zeros_like(rdp), t * rdp)
  return jnp.where(validation.in_domain("steps", t), out, jnp.nan)
