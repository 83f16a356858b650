"""``python -m softrdma.interop``: the same as ``softrdma interop``."""

import sys

from .cli import main

sys.exit(main())
