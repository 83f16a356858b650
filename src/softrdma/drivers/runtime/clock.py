"""Clocks for the drivers: a virtual clock for tests and the monotonic wall clock.

The sans-I/O engines never read a clock (design.md, "Sans-I/O engines"): their driver
passes ``now`` in. Tests drive everything from a :class:`VirtualClock`, whose time only
moves when the test says so (``advance``/``run_until``/``run``) and jumps from event to
event, so a retransmission timeout of seconds costs no real time. The runtime uses a
:class:`RealClock`. Both have the same read interface, ``now() -> float`` (seconds).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from ...errors import InvalidArgument, StateError


class Clock(Protocol):
    """The read interface shared by :class:`VirtualClock` and :class:`RealClock`."""

    def now(self) -> float:
        """The current time in seconds (arbitrary origin, never decreasing)."""
        ...


class RealClock:
    """``time.monotonic()`` behind the :class:`Clock` interface."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class TimerHandle:
    """A callback scheduled on a :class:`VirtualClock`; ``cancel()`` unschedules it."""

    __slots__ = ("when", "fn", "args", "cancelled")

    def __init__(self, when: float, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.when = when
        self.fn = fn
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        """Unschedule the callback (a no-op if it already ran or was cancelled)."""
        self.cancelled = True

    def __repr__(self) -> str:
        state = " cancelled" if self.cancelled else ""
        return f"<TimerHandle at {self.when:.9f}{state} {self.fn!r}>"


class VirtualClock:
    """Simulated time: an event heap and a ``now`` that only moves forward.

    Events at the same time run in the order they were scheduled. An event scheduled in
    the past runs at the current time (time never goes back). Callbacks may schedule
    more events; those due before the ``run_until`` horizon run in the same call.
    """

    __slots__ = ("_now", "_heap", "_seq", "_running")

    def __init__(self, start: float = 0.0) -> None:
        if not math.isfinite(start):
            raise InvalidArgument("start", "must be a finite number of seconds")
        self._now = float(start)
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = 0
        self._running = False

    def now(self) -> float:
        return self._now

    # ---- scheduling ------------------------------------------------------------------
    def call_at(self, when: float, fn: Callable[..., object], *args: Any) -> TimerHandle:
        """Run ``fn(*args)`` at virtual time ``when`` (clamped to ``now``)."""
        if not when >= self._now:  # also catches NaN
            if math.isnan(when):
                raise InvalidArgument("when", "is NaN")
            when = self._now
        if when == math.inf:
            raise InvalidArgument("when", "must be finite")
        handle = TimerHandle(when, fn, args)
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, handle))
        return handle

    def call_later(self, delay: float, fn: Callable[..., object], *args: Any) -> TimerHandle:
        """Run ``fn(*args)`` ``delay`` seconds from now."""
        if not delay >= 0.0:
            raise InvalidArgument("delay", f"must be >= 0, got {delay!r}")
        return self.call_at(self._now + delay, fn, *args)

    def next_event_time(self) -> float | None:
        """When the earliest pending (not cancelled) event is due, or None if idle."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def pending(self) -> int:
        """How many events are scheduled (cancelled ones not yet discarded included)."""
        return len(self._heap)

    # ---- running ---------------------------------------------------------------------
    def run_until(self, t: float) -> int:
        """Run every event due at or before ``t``, then set ``now`` to ``t``.

        Returns the number of callbacks run. A ``t`` in the past runs the events due now
        and leaves ``now`` unchanged.
        """
        if math.isnan(t) or t == math.inf:
            raise InvalidArgument("t", "must be a finite time")
        n = self._run(t if t > self._now else self._now, None)
        if t > self._now:
            self._now = t
        return n

    def advance(self, dt: float) -> int:
        """``run_until(now + dt)``."""
        if not dt >= 0.0:
            raise InvalidArgument("dt", f"must be >= 0, got {dt!r}")
        return self.run_until(self._now + dt)

    def run(self, until: float | None = None, max_events: int | None = None) -> int:
        """Run events until none is left (or the next is after ``until``).

        ``now`` ends at the last event run (not at ``until``). ``max_events`` bounds the
        work, so a callback that keeps rescheduling itself cannot hang a test.
        """
        horizon = math.inf if until is None else until
        if math.isnan(horizon):
            raise InvalidArgument("until", "is NaN")
        if max_events is not None and max_events < 0:
            raise InvalidArgument("max_events", "must be >= 0")
        return self._run(horizon, max_events)

    def _run(self, horizon: float, max_events: int | None) -> int:
        if self._running:
            raise StateError("VirtualClock.run* called from inside a clock callback")
        self._running = True
        heap = self._heap
        pop = heapq.heappop
        n = 0
        try:
            while heap and heap[0][0] <= horizon:
                if max_events is not None and n >= max_events:
                    break
                when, _, handle = pop(heap)
                if handle.cancelled:
                    continue
                if when > self._now:
                    self._now = when
                handle.fn(*handle.args)
                n += 1
        finally:
            self._running = False
        return n
