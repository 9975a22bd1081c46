"""Training: the optax gradient transformations for DP-SGD and the pieces they are made of.
Imports ``jaxrdp._internal``, ``jaxrdp.mechanisms`` and ``jaxrdp.accounting``.

* ``transform`` — ``differentially_private_aggregate``, ``dpsgd``, ``privacy_spent`` (the
  accountant lives in the optimizer state).
* ``accountant`` — that accountant: ``RdpAccountantState`` and its pure ``init``, ``step``,
  ``accumulated_rdp`` (segments of constant (q, σ), Kahan-summed).
* ``relative_gaussian_transform`` — the relative Gaussian noise transform.
* ``sampling`` — Poisson sampling inside ``jit`` with static shapes.
* ``microbatch`` — per-example clipping and summation in microbatches.

This package's ``__init__`` imports nothing, so that ``import jaxrdp`` does not import optax.
"""
