"""Accounting: from RDP curves to (ε, δ). Imports ``jaxrdp._internal`` and ``jaxrdp.mechanisms``.

* ``orders`` — the default order grid.
* ``composition`` — ``compute_rdp``: T steps of the sampled Gaussian (Mironov 2017, Prop. 1).
* ``conversion`` — RDP → (ε, δ) and back (Balle et al. 2020, Thm. 21; Mironov 2017, Prop. 3).
* ``order_search`` — the continuous refinement of the best order and its branch and bound.
* ``epsilon`` — ``dpsgd_epsilon``: ε of a DP-SGD schedule, its order search.
* ``envelope`` — the derivative of that ε (envelope theorem at the optimal order).
* ``roots`` — the safe-side bracketing root finder of the calibrations.
* ``calibration`` — the calibrations of σ, q and T.
* ``dpsgd`` — the names of ``epsilon`` and ``calibration`` under their former module name.
* ``schedules`` — ε along a training run, and noise schedules optimised by gradient.
* ``sweep`` — ε and calibrated σ over large parameter grids.
"""
