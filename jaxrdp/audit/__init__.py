"""Empirical privacy audit of a DP-SGD transform (canary gradients, Clopper–Pearson bounds).
Sits on top of ``jaxrdp.training``; nothing below imports it."""
