"""A garbage collection at an exact point, in a thread that holds a lock (the deadlock of
stop 46: a collection runs finalizers in whichever thread it starts in, inside whatever
that thread holds, and a context's finalizer takes locks its own thread may hold).

* :class:`Cyclic`: an object only a collection frees (it refers to itself);
* :func:`collector_paused`: no automatic collection while a test arranges its garbage;
* :func:`finishes`: run a target in a daemon thread, False if it is still running at the
  deadline (a thread that waits for itself never ends; the daemon flag lets the run end);
* :func:`collect_while_holding`: :func:`finishes` of ``gc.collect()`` under ``lock``.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

__all__ = ["Cyclic", "DEADLINE", "collector_paused", "finishes", "collect_while_holding"]


class Cyclic:
    """An object only a garbage collection frees (it refers to itself)."""

    def __init__(self) -> None:
        self.me = self


@contextmanager
def collector_paused() -> Iterator[None]:
    """Automatic collection off for the block (explicit ``gc.collect()`` still runs),
    as it was after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


DEADLINE = 60.0  # s: a collection and its finalizers take milliseconds, even under load


def finishes(target: Callable[[], object], deadline: float = DEADLINE) -> bool:
    """Run ``target`` in a daemon thread; False if it is still running at ``deadline``."""
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(deadline)
    return not t.is_alive()


def collect_while_holding(lock: AbstractContextManager[object]) -> bool:
    """A thread takes ``lock`` and collects under it; False if it never finished (a
    finalizer the collection ran waited for the lock its own thread held)."""
    def run() -> None:
        with lock:
            gc.collect()
    return finishes(run)
