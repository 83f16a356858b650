"""``python -m softrdma``: the ``softrdma`` command line (:mod:`softrdma.tools.cli`)."""

import sys

from softrdma.tools.cli import main

sys.exit(main())
