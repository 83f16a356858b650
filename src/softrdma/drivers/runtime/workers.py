"""Daemon threads for connection setup that blocks (a TCP connect and MPA exchange, an
accept loop): :class:`Workers`, a pool kept for reuse, and :func:`start_daemon`. Used by
the rdma_cm layer's iWARP connection manager (:mod:`softrdma.cm.rdma_transport`), so that
the threads live with the other I/O of the drivers.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .threads import QuietThread

__all__ = ["Workers", "start_daemon"]


class Workers:
    """Daemon threads that run blocking jobs (an iWARP connect each), kept for reuse: an
    idle worker takes the next job, a new one starts only when none is idle, and one idle
    for :data:`IDLE_S` seconds ends. Starting a thread per connect cost about 60 us of CPU
    and 300 us of latency on a busy host, a hand-off to a waiting worker about a sixth of
    that (issue 26). A job that raises is logged as ``failure`` on ``log``; the worker
    goes on.

    A job may return its report (a call that tells the outcome, such as an event the
    application waits for); the worker counts itself idle before it runs it, so that a
    job submitted because of that outcome (the application's next connect) goes to this
    worker rather than to a new thread. Counted idle only once the report has run, a
    worker on a busy machine was often not yet back at its wait when the next job came,
    and a thread was started for it."""

    IDLE_S = 5.0

    def __init__(self, thread_name: str, log: logging.Logger, failure: str) -> None:
        self._thread_name = thread_name
        self._log = log
        self._failure = failure
        self._cv = threading.Condition(threading.Lock())
        self._jobs: deque[Callable[[], Callable[[], None] | None]] = deque()
        self._idle = 0  # workers waiting for a job

    def submit(self, job: Callable[[], Callable[[], None] | None]) -> None:
        with self._cv:
            self._jobs.append(job)
            if self._idle >= len(self._jobs):
                self._cv.notify()
                return
        QuietThread(target=self._main, name=self._thread_name, daemon=True).start()

    def _main(self) -> None:
        counted = False  # counted idle already (while it ran the last job's report)
        while True:
            with self._cv:
                if not counted:
                    self._idle += 1
                counted = False
                try:
                    while not self._jobs:
                        if not self._cv.wait(self.IDLE_S) and not self._jobs:
                            return
                finally:
                    self._idle -= 1
                job = self._jobs.popleft()
            report = self._run(job)
            if report is not None:
                with self._cv:
                    self._idle += 1
                counted = True
                self._run(report)

    def _run(self, fn: Callable[[], Callable[[], None] | None]) -> Callable[[], None] | None:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - a bug in one job must not end the worker
            self._log.exception(self._failure)
            return None

    def after_fork(self) -> None:
        """In a child after ``fork()``: the parent's workers do not exist here."""
        self._cv = threading.Condition(threading.Lock())
        self._jobs = deque()
        self._idle = 0


def start_daemon(target: Callable[..., None], *args: Any, name: str) -> None:
    """Run ``target(*args)`` in a new daemon thread called ``name``."""
    QuietThread(target=target, args=args, name=name, daemon=True).start()
