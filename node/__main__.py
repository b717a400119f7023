"""``python -m shoal.node``: see :mod:`shoal.node.cli`."""
import sys

from shoal.node.cli import main

sys.exit(main())
