"""The progress core both device runtimes compose: lock, wake-up, thread, deferred calls.

A sans-I/O engine (design.md, "Sans-I/O engines") is driven by a runtime that owns its
I/O: :class:`~softrdma.drivers.runtime.roce.Runtime` (RoCE: a datagram link) and
:class:`~softrdma.drivers.runtime.tcp.TcpRuntime` (iWARP: TCP sockets). What they share
lives here, composed (each runtime holds one :class:`ProgressCore`), not inherited:

* :attr:`ProgressCore.lock` around every engine call;
* deferred calls (:meth:`~ProgressCore.defer`): work queued from finalizers or callbacks
  that runs under the lock at the next engine operation;
* the wake-up of a thread that waits for input (:class:`WakePipe` for ``select``-based
  waits, :class:`EventWaiter` for a link without a descriptor);
* the progress thread (:meth:`~ProgressCore.start`), which stands back while an
  application thread busy-polls (:meth:`~ProgressCore.standing_back`) and is stopped
  and joined by :meth:`~ProgressCore.close`;
* the virtual-timer mode (:class:`VirtualTimer`): with a simulated clock, the engine's
  next deadline is scheduled on that clock, so a simulation runs by itself.

How the RoCE runtime waits for input is a :class:`Waiter` strategy: :class:`SelectWaiter`
(a link with a descriptor) or :class:`EventWaiter` (the in-memory fabric, which calls
back). :func:`progress_mode` names the four combinations a runtime can run in.
"""

from __future__ import annotations

import enum
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ...errors import ClosedError, DeviceError, InvalidArgument
from ..links.link import VirtualClock
from .fdwait import Readable
from .locks import acquire
from .threads import QuietThread

if TYPE_CHECKING:
    from ..links.link import Link

__all__ = ["DeviceRuntime", "ProgressCore", "WakePipe", "Waiter", "SelectWaiter", "EventWaiter", "VirtualTimer",
           "VirtualClock", "ProgressMode", "progress_mode", "check_mode", "POLL_GRACE",
           "STAND_BACK_MAX", "SERVE_S", "DRAIN_TIMEOUT"]

T = TypeVar("T")

POLL_GRACE = 0.005  # the progress thread stands back this long after an application poll (s)
#: the longest one wait of a progress thread that stands back (s): each wait while the
#: application keeps busy-polling doubles, from POLL_GRACE up to this (see standing_back)
STAND_BACK_MAX = 0.04
#: after input waited unread through a stand-back, the progress thread serves (does not
#: stand back) for this long (s): see ProgressCore.took
SERVE_S = 1.0
DRAIN_TIMEOUT = 1.0  # at close, how long to wait for the lock (a finalizer may hold it) (s)
JOIN_TIMEOUT = 5.0  # at close, how long to wait for the progress thread to end (s)
_WAKE_READ = 4096  # bytes drained from the wake pipe at once


MODES = ("thread", "manual")


class ProgressMode(enum.Enum):
    """How a runtime makes progress (see :func:`progress_mode`)."""

    #: a progress thread waits in ``select`` on the link's descriptor and a wake pipe
    THREAD_SELECT = "thread-select"
    #: a progress thread waits on an event the link's ``on_readable`` callback sets
    THREAD_EVENT = "thread-event"
    #: no thread: the application's ``progress()`` / CQ polls drive the engine
    MANUAL = "manual"
    #: no thread: the link's virtual clock fires the engine's timers (simulation)
    VIRTUAL = "virtual"


def check_mode(mode: str) -> str:
    """``mode`` if it is ``"thread"`` or ``"manual"``, else :class:`InvalidArgument`."""
    if mode not in MODES:
        raise InvalidArgument("progress", f"must be 'thread' or 'manual', got {mode!r}")
    return mode


def progress_mode(threaded: bool, has_fd: bool, virtual: bool) -> ProgressMode:
    """The mode a runtime runs in: a thread (waiting on a descriptor or on an event),
    or none (driven by the application, or by a virtual clock)."""
    if threaded:
        return ProgressMode.THREAD_SELECT if has_fd else ProgressMode.THREAD_EVENT
    return ProgressMode.VIRTUAL if virtual else ProgressMode.MANUAL


class DeviceRuntime(Protocol):
    """What the verbs layer drives: the RoCE :class:`~softrdma.drivers.runtime.roce.Runtime`
    or the iWARP :class:`~softrdma.drivers.runtime.tcp.TcpRuntime`. Engine calls run
    under :attr:`lock`; ``post_send`` is the latency path (post and transmit at once)."""

    lock: threading.Lock
    threaded: bool
    now: Callable[[], float]

    @property
    def link(self) -> Link | None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def fatal(self) -> str | None: ...

    def call(self, fn: Callable[..., T], *args: object) -> T: ...

    def call_now(self, fn: Callable[..., T], *args: object) -> T: ...

    def post_send(self, qp: Any, wqes: Sequence[Any]) -> None: ...

    def defer(self, fn: Callable[[], None]) -> None: ...

    def progress(self, timeout: float = 0.0) -> int: ...

    def progress_nonblocking(self, stop_on: Any = None, taken: bool = False,
                             polls: int = 1) -> int: ...

    def rx_pending(self) -> bool:
        """Datagrams read and not processed yet: the last busy-poll step stopped at a
        completion of the CQ it polled (``stop_on``) and left those behind it."""

    def ack_awaited(self) -> bool:
        """The application's last post was to a QP whose earlier requests were all
        complete (it awaits each request's completion, as ``ibv_rc_pingpong``), and
        that post still awaits its ACK: it arrives soon, and the program polls for it."""

    def serving(self) -> bool:
        """The progress thread serves now, not standing back however recent the polls:
        the application left input unread while it polled (:meth:`ProgressCore.took`)."""

    def kick(self) -> None: ...

    def about_to_block(self) -> None: ...

    def device_counters(self) -> dict[str, int]: ...

    def close(self, close_link: bool = True) -> None: ...


class WakePipe:
    """A non-blocking pipe whose read end a ``select`` watches, to wake the waiter."""

    __slots__ = ("r", "w")

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)

    def wake(self) -> None:
        if self.w >= 0:
            try:
                os.write(self.w, b"\0")
            except OSError:
                pass

    def drain(self) -> None:
        try:
            os.read(self.r, _WAKE_READ)
        except OSError:  # BlockingIOError included: nothing to read
            pass

    def close(self) -> None:
        for fd in (self.r, self.w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.r = self.w = -1

    def __del__(self) -> None:
        # collected unclosed (a completion channel dropped without close): os.pipe's
        # descriptors are plain ints, which nothing else would ever close
        self.close()


class Waiter(Protocol):
    """How a runtime waits for input: :meth:`wait` returns when input may be there, when
    :meth:`wake` was called, or after ``timeout`` seconds; False once it cannot wait any
    more (its descriptor was closed under it)."""

    def wait(self, timeout: float) -> bool: ...

    def wake(self) -> None: ...

    def close(self) -> None: ...


class SelectWaiter:
    """Wait in ``select`` on a link's descriptor (and a :class:`WakePipe` if given)."""

    def __init__(self, fd: int, pipe: WakePipe | None) -> None:
        self.fd = fd
        self.pipe = pipe
        self._rlist = [fd] if pipe is None else [fd, pipe.r]
        self._ready = Readable(self._rlist)

    def wait(self, timeout: float) -> bool:
        try:
            ready = self._ready.wait(timeout)
        except (OSError, ValueError):  # descriptor closed under us: shutting down
            return False
        pipe = self.pipe
        if pipe is not None and pipe.r in ready:
            pipe.drain()
        return True

    def wake(self) -> None:
        if self.pipe is not None:
            self.pipe.wake()

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()


class EventWaiter:
    """Wait on an event that the link's ``on_readable`` callback (or :meth:`wake`) sets:
    for links without a descriptor, such as the in-memory fabric."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def wait(self, timeout: float) -> bool:
        self.event.wait(timeout)
        self.event.clear()
        return True

    def wake(self) -> None:
        self.event.set()

    def close(self) -> None:
        self.event.set()


class VirtualTimer:
    """The virtual-timer mode: the engine's next deadline scheduled on a simulated clock.

    :meth:`arm` schedules ``fire`` at a deadline unless an earlier or equal one is already
    pending; ``fire`` runs from the clock (with the deadline as its argument)."""

    __slots__ = ("clock", "fire", "at")

    def __init__(self, clock: VirtualClock, fire: Callable[[], None]) -> None:
        self.clock = clock
        self.fire = fire
        self.at: float | None = None

    def arm(self, deadline: float | None) -> None:
        if deadline is None:
            return
        at = self.at
        if at is not None and at <= deadline:
            return
        self.at = deadline
        self.clock.call_at(deadline, self._on_clock, deadline)

    def _on_clock(self, when: float) -> None:
        if self.at == when:
            self.at = None
        self.fire()


class _Polling(threading.local):
    """The runtime (its :class:`ProgressCore`) this thread busy-polled last."""

    core: weakref.ref[ProgressCore] | None = None


_polling = _Polling()


class ProgressCore:
    """Lock, deferred calls, engine calls, thread and shutdown shared by the runtimes.

    ``threaded``: the runtime runs a progress thread (started by :meth:`start`);
    ``now``: the clock engine calls are given (monotonic seconds, or a virtual clock);
    ``after``: the runtime's housekeeping at the end of every locked engine call (it is
    given ``acks``: False leaves coalesced acknowledgements pending).
    """

    def __init__(self, *, threaded: bool, now: Callable[[], float],
                 after: Callable[[bool], None]) -> None:
        self.threaded = threaded
        self.now = now
        self.after = after
        self.lock = threading.Lock()
        self.deferred: deque[Callable[[], None]] = deque()
        self.stop = threading.Event()
        self.kicked = threading.Event()
        self.last_poll = 0.0  # when an application thread last busy-polled (monotonic)
        self.back_wait = POLL_GRACE  # the progress thread's next wait while it stands back
        #: the progress thread's last stand-back ran out (no kick): what its next step
        #: receives waited unread through it (:meth:`took`)
        self.resumed = False
        self.waited_at = float("-inf")  # when input last waited unread through one
        self.serve_until = 0.0  # until then the progress thread does not stand back
        self.closed = False
        #: why the device failed (e.g. its devd died), else None: calls then raise
        #: :class:`DeviceError` and the progress thread ends
        self.fatal: str | None = None
        self._thread: threading.Thread | None = None
        self._wakers: list[Callable[[], None]] = []

    # ---- engine calls ---------------------------------------------------------------------
    def gone(self) -> ClosedError | DeviceError:
        """The error a call on a closed runtime raises: the device's failure if it failed."""
        if self.fatal is not None:
            return DeviceError(self.fatal)
        return ClosedError("the device runtime is closed")

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` under the engine lock, then the housekeeping (transmit what it
        queued; coalesced acknowledgements stay pending)."""
        if self.closed or self.fatal is not None:
            raise self.gone()
        with self.lock:
            try:
                return fn(*args)
            finally:
                self.after(False)

    def call_now(self, fn: Callable[..., T], *args: object) -> T:
        """Like :meth:`call` with the current time appended to the arguments."""
        if self.closed or self.fatal is not None:
            raise self.gone()
        with self.lock:
            try:
                return fn(*args, self.now())
            finally:
                self.after(True)

    # ---- deferred calls -----------------------------------------------------------------
    def defer(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` under the lock at the next engine operation (safe from finalizers)."""
        self.deferred.append(fn)

    def run_deferred(self) -> None:
        """Run the deferred calls (the caller holds the lock)."""
        deferred = self.deferred
        while deferred:
            deferred.popleft()()

    # ---- the application and the thread -------------------------------------------------
    def try_lock(self) -> bool:
        """For an application thread that busy-polls a CQ: note the poll (the progress
        thread stands back, :meth:`standing_back`) and take the lock if it is free. If the
        progress thread holds it, give that thread the GIL now rather than spin for a
        whole switch interval (5 ms) while it waits for us, and return False."""
        self.last_poll = time.monotonic()
        polled = _polling.core
        if polled is None or polled() is not self:
            self._polled_from_here(polled)
        if acquire(self.lock, False):
            return True
        time.sleep(0)
        return False

    def _polled_from_here(self, before: weakref.ref[ProgressCore] | None) -> None:
        """This thread busy-polls this runtime now, ``before`` another one (or none): that
        one's progress thread resumes at once (:meth:`_stand_down`) rather than stand back
        for :data:`POLL_GRACE` while nobody polls it. A thread that polls the CQs of two
        devices in turn (rdma-core's XRC traffic tests: client and server contexts in one
        process) otherwise left each device unserved for most of the grace after every
        switch: their SEND and its ACK waited about 2.5 ms each (22 s a test, 4,000
        messages)."""
        other = before() if before is not None else None
        _polling.core = weakref.ref(self)
        if other is not None:  # not kick(): a thread that waits for input waits on
            other._stand_down()

    def standing_back(self) -> bool:
        """In the progress thread: True (after a wait) while an application thread
        busy-polls and so makes progress itself (it polled within :data:`POLL_GRACE`);
        the two threads then do not fight over the lock and the GIL on every packet.

        Each wait while the polls go on is twice the last, from :data:`POLL_GRACE` up to
        :data:`STAND_BACK_MAX`; a :meth:`kick` or :meth:`_stand_down` ends it at once. A
        thread that woke every 5 ms to look took the GIL from the poller each time: it
        waited for it while the poller spun in Python, and every release of the GIL (each
        system call of the spin) woke it again, on the core that the peer's poller held.
        Two shared-device ping-pong processes (``ibv_rc_pingpong`` under ``softrdma run``,
        or ``softrdma rc-pingpong``) were slowed by it, on 2 cores (docs/design.md). A
        program that stops polling without a kick (it computes, or blocks elsewhere) is
        served again within :data:`STAND_BACK_MAX`."""
        now = time.monotonic()
        if now - self.last_poll < POLL_GRACE and now >= self.serve_until:
            wait = self.back_wait
            self.resumed = not self.kicked.wait(wait)
            self.kicked.clear()
            self.back_wait = min(2.0 * wait, STAND_BACK_MAX)
            return True
        self.back_wait = POLL_GRACE
        return False

    def took(self, n: int) -> None:
        """In the progress thread's step, after its receive: it took ``n`` datagrams.
        Taken right after a stand-back that ran out, they waited unread through it: the
        application polls its CQ but does not wait there for this input. ``ib_write_lat``
        does so: it polls for its WRITE's completion, then spins on the memory the peer
        writes, and every peer WRITE waited out a stand-back (5.4 ms a half round trip
        where ``ib_send_lat`` took 51 us). The second time within :data:`SERVE_S` the
        thread serves for :data:`SERVE_S` (it does not stand back; the polls and the
        thread may both take input), then stands back again. Once is no such program:
        one that polls through its connection set-up, then waits on a socket for its
        peer's first message, leaves it so (iWARP ``ib_send_lat -R`` under ``softrdma
        run``: 105-140 us rather than 47, served with its C polls asleep)."""
        if self.resumed:
            self.resumed = False
            if n:
                now = time.monotonic()
                if now - self.waited_at < SERVE_S:
                    self.serve_until = now + SERVE_S
                self.waited_at = now

    def serving(self) -> bool:
        """The thread serves now (:meth:`took`): it does not stand back."""
        return time.monotonic() < self.serve_until

    def _stand_down(self) -> None:
        """No application thread busy-polls this runtime now: a progress thread that
        stands back (:meth:`standing_back`) resumes at once."""
        self.last_poll = 0.0
        self.kicked.set()

    def kick(self) -> None:
        """The application stops busy-polling (it is about to block): the progress thread
        resumes at once, woken also if it waits for input."""
        self._stand_down()
        for wake in self._wakers:
            wake()

    def about_to_block(self) -> None:
        """An application thread is about to block without polling (a C program's
        ``ibv_get_cq_event``, which waits on the channel's descriptor in C): as
        :meth:`kick` if an application thread busy-polled since the last kick (the
        progress thread may stand back for up to :data:`STAND_BACK_MAX`, with the ACKs
        the polls left pending), else nothing: a thread that serves the device already
        needs no wake-up, which an event-driven program would pay once per event."""
        if self.last_poll:
            self.kick()

    def on_wake(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` when the thread must look now (:meth:`kick`, :meth:`close`)."""
        self._wakers.append(wake)

    def start(self, step: Callable[[], bool], name: str) -> None:
        """In threaded mode, start the progress thread: it runs ``step`` (one wait and
        one round of work; False ends the thread) until :meth:`close` or a device
        failure, standing back while the application busy-polls."""
        if self.threaded:
            self._thread = QuietThread(target=self._main, args=(step,), name=name, daemon=True)
            self._thread.start()

    def _main(self, step: Callable[[], bool]) -> None:
        stop = self.stop
        while not stop.is_set() and self.fatal is None:
            if self.standing_back():
                continue
            try:
                if not step():
                    return
            except ClosedError:
                return

    # ---- shutdown -------------------------------------------------------------------------
    def close(self, drain: Callable[[], None] | None = None) -> None:
        """Stop and join the thread, then, under the lock, run the deferred calls and
        ``drain`` (best effort). A finalizer may run this from a thread that holds the
        lock (cyclic GC inside an engine call): the lock is never waited for long."""
        self.closed = True
        self.stop.set()
        self.kicked.set()
        for wake in self._wakers:
            wake()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=JOIN_TIMEOUT)
        self._thread = None
        if acquire(self.lock, timeout=DRAIN_TIMEOUT):
            try:
                while self.deferred:
                    try:
                        self.deferred.popleft()()
                    except Exception:  # noqa: BLE001 - best effort cleanup at shutdown
                        pass
                if drain is not None:
                    drain()
            finally:
                self.lock.release()
