"""The timer thread of the iWARP connection setup (softrdma.drivers.cm.deadlines)."""

from __future__ import annotations

import functools
import gc
import threading
import time
import weakref

from softrdma.drivers.cm.deadlines import Deadlines


def wait_for(cond: object, timeout: float = 30.0) -> None:
    assert callable(cond)
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_callbacks_run_in_deadline_order_and_cancelled_ones_do_not() -> None:
    d = Deadlines("test-deadlines")
    ran: list[str] = []
    now = time.monotonic()
    d.at(now + 0.3, lambda: ran.append("late"))
    d.at(now + 0.1, lambda: ran.append("early"))
    d.at(now + 0.2, lambda: ran.append("cancelled")).cancel()

    def fails() -> None:
        raise RuntimeError("a failing callback is logged; the others run")
    d.at(now + 0.15, fails)
    wait_for(lambda: len(ran) == 2)
    assert ran == ["early", "late"]
    assert d.pending() == 0


def test_a_cancelled_entry_lets_go_of_its_callback_and_the_heap_is_swept() -> None:
    """A connection's timer holds the connection: cancelled (the connection was set up)
    it must not keep it for the whole timeout, nor pile up in the heap."""

    class Conn:
        pass
    d = Deadlines("test-deadlines")
    conn = Conn()
    ref = weakref.ref(conn)
    far = time.monotonic() + 3600
    keep = d.at(far, functools.partial(print, conn, end=""))  # holds conn
    keep.cancel()
    del conn
    gc.collect()
    assert ref() is None
    for _ in range(1000):
        d.at(far, lambda: None).cancel()
    assert len(d._heap) < 100
    assert d.pending() == 0


def test_an_earlier_entry_wakes_the_waiting_thread() -> None:
    d = Deadlines("test-deadlines")
    d.at(time.monotonic() + 3600, lambda: None)
    wait_for(lambda: d._wake_at > time.monotonic())  # the thread sleeps for an hour
    done = threading.Event()
    d.at(time.monotonic() + 0.05, done.set)
    assert done.wait(30)
