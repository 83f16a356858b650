"""Completion queues and completion channels (IBA 11.4.2; ``ibv_create_cq``).

A :class:`CQ` holds at most ``cqe`` work completions. The engine pushes completions
into it through its :class:`CqSink` (the QP's ``CompletionSink``); :meth:`CQ.poll`
takes them out. The sink refers to the CQ weakly: an engine QP lives until its destroy
runs, which for a QP collected unclosed is the next progress call, and must not keep the
CQ, and through it the context, alive meanwhile.

* Overrun (IBA 11.4.2.1, C11-26): when a completion arrives at a full CQ, the CQ enters
  the error state, the completion is lost, later completions are discarded, and an
  affiliated asynchronous ``IBV_EVENT_CQ_ERR`` is raised (rxe ``rxe_cq_post``). The
  completions already queued stay pollable.
* Notification (IBA 11.4.2.2): :meth:`CQ.req_notify` arms the CQ for one event; with
  ``solicited_only`` only a completion of a message that carried the Solicited Event
  bit, or an unsuccessful completion, fires it (rxe passes solicited=1 for flushed
  receives). The event is delivered on the CQ's :class:`CompChannel`.
* Busy polling: in "thread" progress mode an empty :meth:`CQ.poll` first runs one
  non-blocking engine step, so an application that spins on ``poll`` gets packets
  without waiting for the progress thread.
* ``await cq.wait()`` suits asyncio.
* Completion timestamps (``ibv_create_cq_ex`` with
  ``IBV_WC_EX_WITH_COMPLETION_TIMESTAMP``): a CQ made with ``timestamps=True`` stamps
  each completion as it is queued (``WorkCompletion.timestamp``: :func:`completion_clock`,
  ``CLOCK_MONOTONIC`` in ns). The device's completion clock is that clock, as
  :data:`COMPLETION_TIMESTAMP_MASK` and :data:`HCA_CORE_CLOCK_KHZ` say (the C interface's
  too, so C and Python programs on one device read the same clock; rxe has none).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING

from .. import enums as e
from ..drivers.runtime import aio
from ..drivers.runtime.eventpipe import EventPipe
from ..drivers.runtime.fdwait import readable
from ..errors import InvalidArgument, StateError
from ..seam.types import WorkCompletion
from ._args import timeout as check_timeout
from ._object import VerbsObject
from .device import MAX_CQE, AsyncEvent, Context

if TYPE_CHECKING:
    import asyncio

__all__ = ["CQ", "CqSink", "CompChannel", "WC", "wc_status_str", "completion_clock",
           "COMPLETION_TIMESTAMP_MASK", "HCA_CORE_CLOCK_KHZ"]

#: the completion clock's width (``completion_timestamp_mask``): it never wraps
COMPLETION_TIMESTAMP_MASK = (1 << 64) - 1
#: its rate (``hca_core_clock``, kHz): one count a nanosecond
HCA_CORE_CLOCK_KHZ = 1_000_000
#: the completion clock (``ibv_query_rt_values_ex``'s raw clock): ``CLOCK_MONOTONIC`` ns
completion_clock = time.monotonic_ns

WC = WorkCompletion

_WC_STATUS_STR = (
    "success", "local length error", "local QP operation error",
    "local EE context operation error", "local protection error", "Work Request Flushed Error",
    "memory management operation error", "bad response error", "local access error",
    "remote invalid request error", "remote access error", "remote operation error",
    "transport retry counter exceeded", "RNR retry counter exceeded",
    "local RDD violation error", "remote invalid RD request", "aborted error",
    "invalid EE context number", "invalid EE context state", "fatal error",
    "response timeout error", "general error", "TM error", "TM software rendezvous",
)


def wc_status_str(status: int) -> str:
    """``ibv_wc_status_str``: the libibverbs text of a work-completion status."""
    if isinstance(status, int) and 0 <= status < len(_WC_STATUS_STR):
        return _WC_STATUS_STR[status]
    return "unknown"


class CompChannel(VerbsObject):
    """A completion event channel (``ibv_create_comp_channel``).

    ``fileno()`` polls readable while CQ events are pending; :meth:`get_cq_event`
    returns the CQ of the next event.
    """

    _close_rank = 6

    def __init__(self, ctx: Context) -> None:
        super().__init__()
        if not isinstance(ctx, Context):
            raise InvalidArgument("ctx", f"expected a Context, got {type(ctx).__name__}")
        self._depend_on(ctx)
        self.ctx = ctx
        self._events: deque[CQ] = deque()
        self._lock = threading.Lock()
        self._bell = EventPipe()

    def fileno(self) -> int:
        self._check()
        return self._bell.r

    def _notify(self, cq: CQ) -> None:
        with self._lock:
            self._events.append(cq)
        self._bell.wake()

    def get_cq_event(self, timeout: float | None = None) -> CQ:
        """The CQ of the next completion event (``ibv_get_cq_event``).

        Blocks up to ``timeout`` seconds (None: forever) and raises TimeoutError. In
        manual progress mode it runs the engine while it waits.
        """
        self._check()
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        runtime = self.ctx.runtime
        while True:
            with self._lock:
                if self._events:
                    cq = self._events.popleft()
                    self._bell.take()
                    cq._events_got += 1
                    return cq
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError("no completion event")
            if not runtime.threaded:
                runtime.progress()
                wait = 0.001 if left is None else min(left, 0.001)
            else:
                runtime.kick()  # about to block: the progress thread takes over at once
                wait = 0.1 if left is None else min(left, 0.1)
            self._check()
            readable([self._bell.r], wait)

    def _release(self) -> None:
        self._bell.close()


class CqSink:
    """The engine's completion sink of one CQ (``CompletionSink``): calls its :meth:`CQ.push`
    while the CQ exists, and drops completions once it was collected."""

    __slots__ = ("_cq",)

    def __init__(self, cq: CQ) -> None:
        self._cq = weakref.ref(cq)

    def __call__(self, wc: WorkCompletion) -> None:
        cq = self._cq()
        if cq is not None:
            cq.push(wc)

    @property
    def cq(self) -> CQ | None:
        """The CQ, or None once it was collected."""
        return self._cq()


class CQ(VerbsObject):
    """A completion queue of ``ctx`` with room for ``cqe`` completions."""

    _close_rank = 4
    #: empty polls one busy-poll step may make while the device's pacer spins (the
    #: runtime's ``progress_nonblocking``): one, as an application's own loop polls
    #: again at once; softrdma.capi's RingCQ, whose steps each enter Python from C, more
    _step_polls = 1

    def __init__(self, ctx: Context, cqe: int, cq_context: object = None,
                 channel: CompChannel | None = None, comp_vector: int = 0, *,
                 timestamps: bool = False) -> None:
        super().__init__()
        if not isinstance(ctx, Context):
            raise InvalidArgument("ctx", f"expected a Context, got {type(ctx).__name__}")
        if not isinstance(cqe, int) or not 1 <= cqe <= MAX_CQE:
            raise InvalidArgument("cqe", f"must be 1..{MAX_CQE}, got {cqe!r}")
        if comp_vector != 0:
            raise InvalidArgument("comp_vector", f"the device has 1 completion vector, got {comp_vector!r}")
        if channel is not None:
            if not isinstance(channel, CompChannel):
                raise InvalidArgument("channel", f"expected a CompChannel, got {type(channel).__name__}")
            if channel.ctx is not ctx:
                raise InvalidArgument("channel", "belongs to another context")
        ctx._check()
        self._count_on(ctx.objects, "max_cq")
        if channel is not None:
            self._depend_on(ctx, channel)
        else:
            self._depend_on(ctx)
        self.ctx = ctx
        self.cqe = cqe
        self.cq_context = cq_context
        self.channel = channel
        self.comp_vector = comp_vector
        #: completions are stamped as they are queued (see the module docstring)
        self.timestamps = bool(timestamps)
        self._q: deque[WorkCompletion] = deque()
        self._armed = 0  # 0 not armed, 1 next completion, 2 solicited only
        self._error = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._events_got = 0
        self._events_acked = 0
        self._runtime = ctx.runtime
        self._busy_poll = ctx.runtime.threaded
        self._taken = False  # completions were taken since the last busy-poll step
        # what a busy-poll step stops on once it is true (a completion for this CQ): the
        # queue; a CQ that stores elsewhere (softrdma.capi's RingCQ) marks its own
        self._stop_on: object = self._q
        #: what the engine delivers this CQ's completions to (:class:`CqSink`)
        self.sink = CqSink(self)

    # ---- engine side -----------------------------------------------------------------------
    def push(self, wc: WorkCompletion) -> None:
        """Add a completion (the engine's CompletionSink). Never raises."""
        if self._error or self._closed:
            return
        if self.timestamps:
            wc.timestamp = completion_clock()
        if not self._store(wc):
            self._error = True
            self.ctx._post_event(AsyncEvent(int(e.IBV_EVENT_CQ_ERR), self))
            return
        armed = self._armed
        if armed and (armed == 1 or wc.solicited or wc.status != 0):
            self._armed = 0
            if self.channel is not None and not self.channel.closed:
                self.channel._notify(self)
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for loop, fut in waiters:
                try:
                    loop.call_soon_threadsafe(_wake, fut)
                except RuntimeError:  # loop closed
                    pass

    def _store(self, wc: WorkCompletion) -> bool:
        """Queue ``wc`` for :meth:`poll`; False when the CQ is full (overrun). A subclass
        may keep completions elsewhere (softrdma.capi: a ring in C memory)."""
        q = self._q
        if len(q) >= self.cqe:
            return False
        q.append(wc)
        return True

    # ---- application side ---------------------------------------------------------------
    def poll(self, num_entries: int = 1) -> tuple[int, list[WorkCompletion]]:
        """Up to ``num_entries`` completions, oldest first (``ibv_poll_cq``)."""
        if self._closed:
            self._check()
        q = self._q
        if not q and self._busy_poll:
            # taken: the completions since the last step end the step's idle streak
            self._runtime.progress_nonblocking(self._stop_on, self._taken, self._step_polls)
            self._taken = False
        if num_entries == 1:
            if q:
                self._taken = True
                return 1, [q.popleft()]
            return 0, []
        if not isinstance(num_entries, int) or num_entries < 0:
            raise InvalidArgument("num_entries", f"must be >= 0, got {num_entries!r}")
        if not q:  # an empty poll (a busy poll's most common answer)
            return 0, []
        self._taken = True
        out: list[WorkCompletion] = []
        pop = q.popleft
        while q and len(out) < num_entries:
            out.append(pop())
        return len(out), out

    def taken(self) -> None:
        """The application took completions without :meth:`poll` (softrdma.capi: from
        the C ring that :meth:`_store` fills): the next empty poll's busy-poll step begins
        a new idle streak, as after a poll that returned them."""
        self._taken = True

    def req_notify(self, solicited_only: bool = False) -> None:
        """Arm the CQ for one completion event (``ibv_req_notify_cq``)."""
        self._check()
        if self._error:
            raise StateError("the CQ is in the error state (overrun)")
        self._armed = 2 if solicited_only else 1

    def ack_events(self, num_events: int) -> None:
        """Acknowledge events taken with ``get_cq_event`` (``ibv_ack_cq_events``)."""
        self._check()
        if not isinstance(num_events, int) or num_events < 0:
            raise InvalidArgument("num_events", f"must be >= 0, got {num_events!r}")
        if self._events_acked + num_events > self._events_got:
            raise InvalidArgument("num_events", "more events acknowledged than received")
        self._events_acked += num_events

    @property
    def error(self) -> bool:
        """True after an overrun (IBA 11.4.2.1)."""
        return self._error

    def __len__(self) -> int:
        return len(self._q)

    async def wait(self, timeout: float | None = None) -> list[WorkCompletion]:
        """Wait (asyncio) until the CQ has completions and return all of them.

        Raises TimeoutError after ``timeout`` seconds. In manual progress mode the
        engine is run while waiting.
        """
        self._check()
        timeout = check_timeout(timeout)
        loop = aio.running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        manual = not self._runtime.threaded
        while True:
            n, wcs = self.poll(self.cqe)
            if n:
                return wcs
            self._check()
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise TimeoutError("no completion")
            if manual:
                self._runtime.progress()
                if self._q:
                    continue
                await aio.sleep(0.001 if left is None else min(left, 0.001))
                continue
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, fut))
            self._runtime.kick()  # about to await: the progress thread takes over at once
            if self._q:  # raced with a push
                continue
            try:
                await aio.wait_for(fut, left)
            except TimeoutError:
                pass

    def _release(self) -> None:
        waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:
                pass
        self._q.clear()

    def __repr__(self) -> str:
        return f"<CQ cqe={self.cqe} queued={len(self._q)}{' error' if self._error else ''}>"


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
