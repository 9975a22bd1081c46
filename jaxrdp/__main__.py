"""``python -m jaxrdp``: the command-line interface (see :mod:`jaxrdp.cli`)."""

import sys

from jaxrdp.cli import main

sys.exit(main())
