"""Capturing softrdma's trace (``softrdma.trace``) in tests."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator

from softrdma import trace


@contextlib.contextmanager
def captured_trace(kinds: str) -> Iterator[io.StringIO]:
    """Trace ``kinds`` (as ``SOFTRDMA_TRACE``) into a buffer; restore the loggers after."""
    names = [f"softrdma.{k}" for k in trace.KINDS]
    saved = {n: logging.getLogger(n).level for n in names}
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    top = logging.getLogger("softrdma")
    top.addHandler(handler)
    trace.configure(kinds, buf)
    try:
        yield buf
    finally:
        top.removeHandler(handler)
        for h in list(top.handlers):
            if h.get_name() == "softrdma-trace":
                top.removeHandler(h)
        for n, lvl in saved.items():
            logging.getLogger(n).setLevel(lvl)
