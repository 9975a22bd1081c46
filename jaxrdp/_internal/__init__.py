"""Internals shared by every layer: the table of argument ranges (``domains``) and the checks
that read it (``validation``), elementary functions that stay accurate in float32
(``numerics``), how entry points are compiled (``compilation``) and the 0.1.0 call forms kept
for one release (``deprecation``). Nothing here imports another part of jaxrdp; nothing here
is public API."""
