"""``python -m shoal.node``: see :mod:`shoal.node.cli`."""
import sys

from .cli import main

sys.exit(main())
