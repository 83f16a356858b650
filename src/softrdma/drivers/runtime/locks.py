"""Lock acquisitions that a Ctrl-C cannot leave held.

CPython runs a Python signal handler at the check it makes after every call of a C
function, so Ctrl-C's :class:`KeyboardInterrupt` may be raised just after
``lock.acquire()`` returned and before the caller's ``try`` began::

    if lock.acquire(False):   # taken; the handler raises here
        try: ...              # never reached: the lock stays held
        finally: lock.release()

A tool interrupted in its busy poll then hung for ever in its teardown, on the engine
lock its own interrupted poll had taken. A ``with lock:`` block is safe (the
interpreter enters it without that check); an acquisition that cannot be one (a
non-blocking try, a timeout) goes through :func:`acquire`, which has C code store the
result before the check, so a lock taken by an interrupted call is released before the
exception goes on.
"""

from __future__ import annotations

import threading

__all__ = ["acquire"]


def acquire(lock: threading.Lock, blocking: bool = True, timeout: float = -1) -> bool:
    """``lock.acquire(blocking, timeout)``, but an exception raised by a signal handler
    once it returned (Ctrl-C) finds the lock released, not held by nobody's code."""
    got: list[bool] = []
    try:
        # list.extend runs map, and map the acquire, all in C: the result is stored
        # before the interpreter's next signal check
        got.extend(map(lock.acquire, (blocking,), (timeout,)))
    except BaseException:
        if got and got[0]:
            lock.release()
        raise
    return got[0]
