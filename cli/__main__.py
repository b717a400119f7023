"""``python -m shoal.cli ...`` runs the ``shoal`` command."""
import sys

from . import main

sys.exit(main())
