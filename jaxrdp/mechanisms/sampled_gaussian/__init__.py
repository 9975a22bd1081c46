r"""Rényi DP of the Poisson-sampled Gaussian mechanism, exact for every real order.

Mironov, Talwar, Zhang (2019), "Rényi Differential Privacy of the Sampled Gaussian
Mechanism", arXiv:1908.10530, Section 3. With :math:`\mu_0 = N(0,\sigma^2)`,
:math:`L(z) = \mu_1(z)/\mu_0(z) = e^{(2z-1)/(2\sigma^2)}` and sampling rate :math:`q`,

.. math::  A_\alpha = E_{z\sim\mu_0}\big[(1 - q + q L(z))^\alpha\big],
           \qquad \mathrm{RDP}(\alpha) = \frac{\log A_\alpha}{\alpha - 1}.

How it is computed (one kernel for integer and fractional orders, any float dtype):

* Because :math:`E_{\mu_0}[L - 1] = 0`, with :math:`x = q(L-1)`,

  .. math:: \frac{A_\alpha - 1}{\alpha - 1} = E_{\mu_0}\Big[\frac{(1+x)^\alpha - 1 - \alpha x}{\alpha - 1}\Big],

  the expectation of a **non-negative** function (convexity of :math:`(1+x)^\alpha`). Summing
  non-negative terms cannot cancel, so :math:`A_\alpha - 1` keeps full relative precision even
  when it is :math:`10^{-30}` and even in float32; at :math:`\alpha = 1` the integrand becomes
  :math:`(1+x)\log(1+x) - x` and the same formula gives the KL divergence (the RDP limit).
* The expectation is a trapezoidal sum over :math:`z` in log space. For integrands analytic
  in a strip (here :math:`|\Im z| < \pi\sigma^2`, the branch point of :math:`\log(1+x)`), the
  trapezoidal rule converges exponentially in the number of nodes, at a known rate. The
  integrand has at most three bumps (near 0, near 2, and the right mode of
  :math:`z = \alpha p(z)`, :math:`p = qL/(1-q+qL)`), so nodes are placed in two windows found
  by bracketed bisection (:func:`integrand._placement`).
* Every result is certified: the error of the rule is estimated from its differences with
  the rules on every second and every fourth node and the known convergence rate
  (:func:`quadrature._assess`: two grid phases, so that a coarse rule that is exact by
  accident cannot vouch for the fine one), and the integrand must have decayed at the window
  edges. Elements that fail get twice the nodes (only the new midpoints are evaluated, only
  for those elements), up to 4097 per window
  (more than 257 only below sigma ~ 0.035, where the strip of analyticity, of half-width
  pi sigma^2, is narrower than their spacing; as many as the finest grid of the shared
  nodes below, whose derivatives take 129 nodes only and otherwise this kernel: where the
  shared nodes certify a value, its derivative must be certified too, not left zero); a
  result that still fails is returned as ``+inf`` (a valid, if useless, upper bound), never as
  a smaller number.
* Derivatives (any of q, sigma, alpha; jvp and vjp) are the same quadrature applied to the
  integrand's derivative, accumulated on the nodes of the primal computation itself, at the
  level each element reached (:func:`quadrature._log_j`): no second pass.

How it is organised for compilation and batching: the integrand is traced three times per
graph — once for the placement probes (all at once, an extra axis), once for the first level
and once inside the refinement loop, whose body refines any level one block of midpoints at a
time (static shapes). The kernel works on flat arrays; under :func:`jax.vmap` a batching rule
(:func:`jax.custom_batching.custom_vmap`) flattens the batch into the same flat kernel, so
``vmap(f)(q, sigma)`` runs exactly the code of ``f(q_array, sigma_array)``.

A concrete grid of orders (:func:`log_a_and_rdp_at_orders`, used by ``compute_rdp`` and
``sweep``) is cheaper: integer orders up to 4096 are the exact binomial sum
(:func:`integer_orders._log_j_integer`), and fractional orders up to 64 share one grid of
nodes per (q, sigma) and group of orders (:func:`shared_levels._log_j_levels`: the logarithms
of the integrand once per node, two exponentials and one expm1 per (node, order); every
second node first, the midpoints level by level only where needed, all in one loop with the
integrand traced once; derivatives on one grid of nodes in the same pass,
:func:`shared_nodes._log_j_shared`), certified per order in the same way; the per-order kernel
above computes whatever is left.

The modules, one job each (each imports only modules above it in this list):

* ``common`` — helpers and constants that several of the others share;
* ``integrand`` — the integrand and where the per-order nodes go;
* ``quadrature`` — the per-order kernel: certified rule, refinement, derivatives, batching rule;
* ``terms`` — log A and the RDP from log J, with the special cases (q = 0 or 1, σ = 0, α = 1
  or ∞);
* ``integer_orders`` — the exact binomial sums at integer orders;
* ``order_split`` — :class:`OrderSplit`: which orders of a concrete grid go where;
* ``shared_nodes``, ``shared_levels``, ``shared_values`` — fractional orders on shared nodes: the
  integrand at the nodes and the rule on one grid with tangents, the nested grids (values), and
  the groups of a split with their derivatives (:func:`rdp_tangent_at_order`);
* ``curve`` — the entry points (:func:`log_a`, :func:`rdp_sampled_gaussian`,
  :func:`log_a_and_rdp`, :func:`log_a_and_rdp_at_orders`, :func:`fill_pending`) and the dispatch.
"""

from jaxrdp.mechanisms.sampled_gaussian.curve import (fill_pending, log_a, log_a_and_rdp,
                                                      log_a_and_rdp_at_orders,
                                                      rdp_sampled_gaussian)
from jaxrdp.mechanisms.sampled_gaussian.order_split import OrderSplit, order_split, order_tables
from jaxrdp.mechanisms.sampled_gaussian.shared_values import rdp_tangent_at_order

# Internals read through this package by tests and benchmarks. These are bindings, not the
# module globals the kernels look up: to patch one (monkeypatch), patch it in the module that
# defines it (curve._quadrature_values, quadrature._log_j_flat, ...).
from jaxrdp.mechanisms.sampled_gaussian.curve import _quadrature_values
from jaxrdp.mechanisms.sampled_gaussian.quadrature import _CHUNK, _log_j_flat
from jaxrdp.mechanisms.sampled_gaussian.shared_nodes import _grid_nodes

__all__ = [
    "OrderSplit",
    "fill_pending",
    "log_a",
    "log_a_and_rdp",
    "log_a_and_rdp_at_orders",
    "order_split",
    "order_tables",
    "rdp_sampled_gaussian",
    "rdp_tangent_at_order",
]
