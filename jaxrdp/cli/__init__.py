"""The command line, ``jaxrdp`` / ``python -m jaxrdp`` (``main``). Sits on top of everything."""
