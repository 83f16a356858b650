"""``pyverbs.enums``: the libibverbs enumerations (see :mod:`.libibverbs_enums`)."""

from .libibverbs_enums import *  # noqa: F403
from .libibverbs_enums import __all__  # noqa: F401
