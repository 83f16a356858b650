"""What a tool created, destroyed newest first (a QP before its CQ, an MR before its PD)."""

from __future__ import annotations

from typing import Any

from ..errors import SoftRdmaError

__all__ = ["Closers"]


class Closers:
    """The verbs objects a tool opened, in order; :meth:`close` closes them newest first
    and goes on past one that fails (its resources are gone with the process anyway)."""

    def __init__(self) -> None:
        self._objs: list[Any] = []

    def append(self, obj: Any) -> None:
        """Close ``obj`` (anything with ``close()``) before all added earlier."""
        self._objs.append(obj)

    def close(self) -> None:
        while self._objs:
            obj = self._objs.pop()
            try:
                obj.close()
            except SoftRdmaError:
                pass
