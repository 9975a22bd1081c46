"""``dpsgd_epsilon`` and the calibrations of σ, q and T, by their former module name.

The code lives in :mod:`jaxrdp.accounting.epsilon` (ε of a schedule and its order search),
:mod:`jaxrdp.accounting.envelope` (its derivative), :mod:`jaxrdp.accounting.roots` (the
calibrations' root finder) and :mod:`jaxrdp.accounting.calibration`; this module re-exports
the names that code written against it uses. The internals below are bindings, not the
globals the functions look up: to patch one (monkeypatch), patch it in the module that
defines it (e.g. ``epsilon._grid_evaluation``, ``epsilon._BINNED_PHASES``).
"""

from jaxrdp.accounting.calibration import (calibrate_noise_multiplier, calibrate_sampling_rate,
                                           calibrate_sigma_unchecked, calibrate_steps)
from jaxrdp.accounting.composition import schedule_phases
from jaxrdp.accounting.epsilon import (ACCOUNTANTS, REFINE_STEPS, dpsgd_epsilon,
                                       dpsgd_epsilon_unchecked, order_grid, schedule_rdp, use_pld)

# Internals that tests read through this module.
from jaxrdp.accounting.envelope import _concrete_gradient, _epsilon_gradient, _gradient_at
from jaxrdp.accounting.epsilon import (_BINNED_PHASES, _concrete_epsilon, _grid_evaluation,
                                       _search_epsilon)

__all__ = [
    "ACCOUNTANTS",
    "REFINE_STEPS",
    "calibrate_noise_multiplier",
    "calibrate_sampling_rate",
    "calibrate_sigma_unchecked",
    "calibrate_steps",
    "dpsgd_epsilon",
    "dpsgd_epsilon_unchecked",
    "order_grid",
    "schedule_phases",
    "schedule_rdp",
    "use_pld",
]
