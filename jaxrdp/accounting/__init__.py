"""Accounting: from RDP curves to (ε, δ). Imports ``jaxrdp._internal`` and ``jaxrdp.mechanisms``.

* ``orders`` — the default order grid.
* ``composition`` — ``compute_rdp``: T steps of the sampled Gaussian (Mironov 2017, Prop. 1).
* ``conversion`` — RDP → (ε, δ) and back (Balle et al. 2020, Thm. 21; Mironov 2017, Prop. 3).
* ``order_search`` — the continuous refinement of the best order and its branch and bound.
* ``dpsgd`` — ``dpsgd_epsilon`` and the calibrations of σ, q and T.
* ``schedules`` — ε along a training run, and noise schedules optimised by gradient.
* ``sweep`` — ε and calibrated σ over large parameter grids.
"""
