"""Run engine code with its receive fast paths on or off, counting what one of them takes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from softrdma.ib.port import Port


@contextlib.contextmanager
def fast_paths_counted(enabled: bool, cls: type, name: str) -> Iterator[list[int]]:
    """``Port.fast_paths`` set to ``enabled``, and the method ``cls.name`` wrapped so that
    what each call returns (a packet count, or True for one packet) is added to
    ``taken[0]`` of the list yielded; both are restored at the end."""
    taken = [0]
    real = getattr(cls, name)

    def spy(*args: Any) -> Any:
        got = real(*args)
        taken[0] += got
        return got

    saved = Port.fast_paths
    Port.fast_paths = enabled
    setattr(cls, name, spy)
    try:
        yield taken
    finally:
        Port.fast_paths = saved
        setattr(cls, name, real)
