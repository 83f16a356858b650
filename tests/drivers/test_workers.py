"""The worker pool of blocking connection setup (softrdma.drivers.runtime.workers):
reuse, a job's report run once the worker counts as idle, failures logged."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from softrdma.drivers.runtime.workers import Workers

DEADLINE_S = 60.0  # a busy machine


def _pool() -> Workers:
    return Workers("test-worker", logging.getLogger("test.workers"), "a job failed")


def test_a_job_submitted_by_a_report_goes_to_the_same_worker() -> None:
    """The next connect, made because the last one's outcome was reported, reuses the
    worker: the report runs only once the worker counts as idle (deterministic: the
    submit happens inside the report itself, before the worker is back at its wait)."""
    pool = _pool()
    ran: list[threading.Thread] = []
    done = threading.Event()

    def job(n: int) -> Callable[[], None]:
        ran.append(threading.current_thread())

        def report() -> None:
            if n < 3:
                pool.submit(lambda: job(n + 1))
            else:
                done.set()
        return report
    pool.submit(lambda: job(1))
    assert done.wait(DEADLINE_S)
    assert len(ran) == 3 and len({t.ident for t in ran}) == 1


def test_a_job_without_a_report_and_a_failing_one_leave_the_worker_going(
        caplog: pytest.LogCaptureFixture) -> None:
    pool = _pool()
    order: list[str] = []
    done = threading.Event()

    def failing() -> None:
        order.append("fails")
        raise RuntimeError("boom")

    def failing_report() -> Callable[[], None]:
        order.append("reports")

        def report() -> None:
            raise RuntimeError("report boom")
        return report

    def last() -> None:
        order.append("last")
        done.set()
    def failures() -> int:
        return sum("a job failed" in r.getMessage() for r in caplog.records)
    tick = threading.Event()
    with caplog.at_level(logging.ERROR, "test.workers"):
        for job in (failing, failing_report, last):  # a worker each, or reused
            pool.submit(job)
        assert done.wait(DEADLINE_S)
        for _ in range(int(DEADLINE_S / 0.01)):
            if failures() == 2:
                break
            tick.wait(0.01)
    assert sorted(order) == ["fails", "last", "reports"]
    assert failures() == 2


def test_an_idle_worker_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Workers, "IDLE_S", 0.05)
    pool = _pool()
    ran: list[threading.Thread] = []
    pool.submit(lambda: ran.append(threading.current_thread()))
    tick = threading.Event()
    for _ in range(int(DEADLINE_S / 0.01)):
        if ran and not ran[0].is_alive():
            break
        tick.wait(0.01)
    assert ran and not ran[0].is_alive()
