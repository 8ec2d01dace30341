"""``python -m apexrl ...``: the same as the ``apexrl`` command."""

import sys

from apexrl.cli import main

sys.exit(main())
