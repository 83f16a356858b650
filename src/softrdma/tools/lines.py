"""Whole lines on a tool's output, from any thread.

``print`` writes the text and its newline as two writes, so two threads printing at
once can leave ``AB\\n\\n`` where rping.c's ``printf`` of one buffer leaves ``A\\nB\\n``
(``softrdma rping -s -P`` serves each client in its own thread). :func:`say` writes
the line and its newline as one write, under one lock, and flushes it.
"""

from __future__ import annotations

import sys
import threading
from typing import Protocol

_LOCK = threading.Lock()


class TextOut(Protocol):
    """What :func:`say` writes to: a text file (``sys.stdout``, ``sys.stderr``)."""

    def write(self, s: str, /) -> int: ...

    def flush(self) -> None: ...


def say(text: str, file: TextOut | None = None) -> None:
    """Write ``text`` and a newline to ``file`` (standard output when None) as one line,
    whole even when other threads write lines at the same time, and flush it."""
    out: TextOut = sys.stdout if file is None else file
    with _LOCK:
        out.write(text + "\n")
        out.flush()
