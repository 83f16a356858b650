"""Ctrl-C never leaves an engine lock held (drivers/runtime/locks.py).

CPython raises a signal handler's exception (Ctrl-C's KeyboardInterrupt) at the check it
makes after a call of a C function, or on entering a Python function. These tests raise
one at each such point in turn, through ``sys.setprofile`` (its ``c_return`` and
``call`` events are those points), and check the lock after each: a CI run of
``write-bw --run_infinitely`` hung in its teardown on the engine lock that its Ctrl-C'd
busy poll had taken."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest
from harness.verbs_pair import udp_pair  # noqa: F401

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.runtime import progress as pg
from softrdma.drivers.runtime.locks import acquire


class _Interrupt(KeyboardInterrupt):
    """The injected Ctrl-C."""


def _interrupt_at(k: int, fn: Callable[[], Any]) -> bool:
    """Run ``fn`` with a KeyboardInterrupt raised at its ``k``-th interruption point;
    True if it was raised (``fn`` had that many), False if ``fn`` ended first."""
    seen = 0
    me = threading.get_ident()

    def hook(frame: FrameType, event: str, arg: object) -> None:
        nonlocal seen
        if event in ("call", "c_return") and threading.get_ident() == me:
            seen += 1
            if seen == k:
                raise _Interrupt
    sys.setprofile(hook)
    try:
        fn()
    except _Interrupt:
        return True
    finally:
        sys.setprofile(None)
    return False


def _every_point(fn: Callable[[], Any], after: Callable[[], None],
                 limit: int = 5000) -> int:
    """An interrupt at every point of ``fn`` in turn, ``after()`` after each; how many."""
    for k in range(1, limit):
        if not _interrupt_at(k, fn):
            return k - 1
        after()
    raise AssertionError(f"{fn} has more than {limit} interruption points")


def test_a_bare_acquire_can_be_left_held() -> None:
    """The hazard itself: the interrupt after ``lock.acquire(False)`` returned True."""
    lock = threading.Lock()

    def bare() -> None:
        if lock.acquire(False):
            try:
                pass
            finally:
                lock.release()

    leaked = 0

    def after() -> None:
        nonlocal leaked
        if lock.locked():
            leaked += 1
            lock.release()

    assert _every_point(bare, after) >= 1
    assert leaked == 1


@pytest.mark.parametrize("blocking,timeout", [(False, -1), (True, -1), (True, 0.5)])
def test_acquire_releases_what_an_interrupted_call_took(blocking: bool, timeout: float) -> None:
    lock = threading.Lock()

    def take() -> None:
        assert acquire(lock, blocking, timeout)
        lock.release()

    def after() -> None:
        assert not lock.locked()

    assert _every_point(take, after) >= 2
    assert acquire(lock, False) and not acquire(lock, False)
    lock.release()


def test_acquire_reports_a_lock_held_elsewhere() -> None:
    lock = threading.Lock()
    lock.acquire()
    assert not acquire(lock, False) and not acquire(lock, True, 0.01)
    assert lock.locked()


def test_a_wait_that_releases_the_lock_gives_it_back() -> None:
    """TcpRuntime.wait's shape (manual mode): the caller's ``with`` holds the lock, the
    wait releases it inside its ``try`` and takes it back in ``finally``: wherever the
    interrupt lands, the ``with`` ends holding the lock it releases."""
    lock = threading.Lock()

    def wait_like() -> None:
        with lock:
            try:
                lock.release()
                time.sleep(0)
            finally:
                lock.acquire()

    def after() -> None:
        assert not lock.locked()

    assert _every_point(wait_like, after) >= 2


def test_progress_core_try_lock_never_leaks() -> None:
    core = pg.ProgressCore(threaded=False, now=lambda: 0.0, after=lambda acks: None)

    def poll_step() -> None:
        if core.try_lock():
            core.lock.release()

    def after() -> None:
        assert not core.lock.locked()

    assert _every_point(poll_step, after) >= 2


def test_busy_poll_and_post_send_never_leak_the_engine_lock(udp_pair: Any) -> None:  # noqa: F811
    """A RoCE pair's post_send and busy poll interrupted at every point; the engine
    lock is free after each, and the pair is torn down without a hang."""
    a, b = udp_pair
    lock = a.ctx.runtime.lock
    wr = v.SendWR(1, None, 1, [a.sge(0, 64)], e.IBV_WR_RDMA_WRITE, e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(b.mr.rkey, b.mr.addr)

    def after() -> None:
        assert acquire(lock, True, 5.0), "the engine lock was left held"
        lock.release()

    # every point of a post_send (the engine and the socket), then of a poll
    posts = _every_point(lambda: a.qp.post_send(wr), after, limit=20000)
    polls = _every_point(lambda: a.cq.poll(4), after, limit=20000)
    assert posts > 15 and polls > 10, (posts, polls)  # 27 and 18 when written
