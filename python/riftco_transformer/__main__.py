"""``python -m riftco_transformer``: the ``riftco`` command line (see :mod:`.cli`)."""

import sys

from .cli import main

sys.exit(main())
