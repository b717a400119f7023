import sys

from shoal.router.cli import main

sys.exit(main())
