"""``python -m jaxrdp``: the command-line interface (see :mod:`jaxrdp.cli.main`)."""

import sys

from jaxrdp.cli.main import main

sys.exit(main())
