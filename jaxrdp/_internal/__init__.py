"""Internals shared by every layer: argument validation (``validation``), elementary functions
that stay accurate in float32 (``numerics``) and how entry points are compiled
(``compilation``). Nothing here imports another part of jaxrdp; nothing here is public API."""
