"""Mechanisms: one RDP curve per module, the papers' math. Imports only ``jaxrdp._internal``.

* ``sampled_gaussian`` — the Poisson-sampled Gaussian, log A_α exact at every order
  (Mironov, Talwar, Zhang 2019): the numerical core.
* ``gaussian``, ``laplace``, ``randomized_response`` — Mironov 2017, Table II.
* ``zcdp`` — zCDP / tCDP curves and their (ε, δ) conversions (Bun, Steinke 2016; Bun et al. 2018).
* ``closed_form`` — MTZ 2019 Thm. 11, a closed-form upper bound.
* ``without_replacement`` — sampling without replacement (Wang, Balle, Kasiviswanathan 2019, Thm. 27).
* ``relative_gaussian`` — the relative Gaussian mechanism.
"""
