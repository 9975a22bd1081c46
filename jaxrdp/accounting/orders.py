"""The default grid of Rényi orders.

It contains every order of dp_accounting's default grid (1.1, 1.2, ..., 10.9, 11, ..., 63,
128, 256, 512, 1024), so that an ε minimised over it is never looser than dp_accounting's on
the same problem (jaxrdp's RDP is exact at fractional orders, where dp_accounting
over-estimates, and equal at integer orders). A few more orders are added where the grid
is coarse: near 1 (large ε), between 63 and 1024, and 2048 and 4096 (very small ε).
"""

from __future__ import annotations

import numpy as np

_DP_ACCOUNTING_ORDERS = ([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64))
                         + [128, 256, 512, 1024])
_EXTRA_ORDERS = [1.02, 1.05, 1.075, 72, 80, 96, 112, 160, 192, 320, 384, 768, 2048, 4096]

DEFAULT_ORDERS = np.array(sorted(set(float(a) for a in _DP_ACCOUNTING_ORDERS + _EXTRA_ORDERS)),
                          dtype=np.float64)
DEFAULT_ORDERS.flags.writeable = False
"""The default Rényi orders: a read-only float64 array of 170 orders, dp_accounting's 156
defaults (1.1, 1.2, ..., 10.9, 11, ..., 63, 128, 256, 512, 1024) plus 1.02, 1.05, 1.075, 72,
80, 96, 112, 160, 192, 320, 384, 768, 2048 and 4096."""
