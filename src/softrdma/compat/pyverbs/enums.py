"""``pyverbs.enums``: the libibverbs enumerations (see :mod:`.libibverbs_enums`)."""

from typing import Any

from .libibverbs_enums import *  # noqa: F403
from .libibverbs_enums import __all__  # noqa: F401


def __getattr__(name: str) -> Any:
    """Every name of :mod:`.libibverbs_enums` is imported above; its ``__all__`` is computed,
    which a type checker cannot follow, so this (PEP 562) tells it that the names exist."""
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
