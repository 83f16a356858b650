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
import resource
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

if TYPE_CHECKING:
    from ..links.link import Link

__all__ = ["DeviceRuntime", "ProgressCore", "WakePipe", "Waiter", "SelectWaiter", "EventWaiter", "VirtualTimer",
           "VirtualClock", "ProgressMode", "progress_mode", "check_mode", "POLL_GRACE",
           "DRAIN_TIMEOUT", "PollPacer", "SPIN", "BLOCK_MAX", "SHARED_LOSS"]

T = TypeVar("T")

POLL_GRACE = 0.005  # the progress thread stands back this long after an application poll (s)
DRAIN_TIMEOUT = 1.0  # at close, how long to wait for the lock (a finalizer may hold it) (s)
JOIN_TIMEOUT = 5.0  # at close, how long to wait for the progress thread to end (s)
#: how long an application's busy poll may spin on an empty link before it sleeps in the
#: kernel (s; ``SOFTRDMA_SPIN_US`` overrides; see :class:`PollPacer`)
def _spin_from_env(default_us: float = 200.0) -> float:
    """``SOFTRDMA_SPIN_US`` in seconds (a value that is not a number >= 0: the default)."""
    try:
        us = float(os.environ.get("SOFTRDMA_SPIN_US", default_us))
    except ValueError:
        us = default_us
    return (us if us >= 0.0 else default_us) * 1e-6


SPIN = _spin_from_env()
BLOCK_MAX = 0.002  # the longest one such sleep (s): below POLL_GRACE, so the thread stays back
PREEMPTED = 0.0002  # a spin that lost the CPU this long (s) lost it to another task
#: two such spins this close together (s) show the machine contended: one alone may be the
#: hypervisor taking our vCPU for a moment (seen on an idle 2-vCPU guest), which a calm
#: period would turn into half a second of sleeping polls and cross-core wake-ups
LOST_GAP = 0.25
CALM = 0.5  # then polls sleep at once for this long (s) before spinning is tried again
#: a request's send (``sendmsg``) that took this long (s) lost the CPU meanwhile: on
#: loopback the send wakes the peer, and a peer that shares our core runs first
SHARED_LOSS = 0.00005
SHARED_SENDS = 8  # such sends in a row, each within SHARED_GAP of the last: a shared core
SHARED_GAP = 0.02  # (s)
SHARED = 0.5  # then coalesced ACKs may be held for this long (s) (AckHold)
_WAKE_READ = 4096  # bytes drained from the wake pipe at once


def thread_switches() -> tuple[int, int]:
    """The calling thread's context switches so far, (voluntary, involuntary)
    (``getrusage(RUSAGE_THREAD)``): a spin whose thread the kernel never switched out lost
    its CPU to the hypervisor, not to another task of this machine; one whose thread was
    only switched out voluntarily waited (for the GIL or a lock of its own process) and
    was not preempted."""
    ru = resource.getrusage(resource.RUSAGE_THREAD)
    return ru.ru_nvcsw, ru.ru_nivcsw


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

    def kick(self) -> None: ...

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


class PollPacer:
    """Spin, then sleep: the pace of an application thread that busy-polls a CQ.

    An empty poll starts (or continues) an idle streak. While the machine has a core
    for us, the first :data:`SPIN` seconds of a streak spin (a poll returns at once, so
    an answer that comes within a round trip is seen without a wake-up); after that
    each empty poll sleeps in ``select`` on the link's descriptor until a datagram
    arrives, the engine's next deadline, or :data:`BLOCK_MAX`.

    Beside a busy process, spinning is what makes a ping-pong slow: the two spinning
    peers and the busy loop are three runnable tasks on two cores, and the scheduler
    time-slices them, so an answer waits in the socket for its reader's next slice
    (milliseconds, where the round trip is tens of microseconds). A sleeper is woken
    when its datagram arrives and finds the core its peer just left. So a spin that
    lost the CPU (the thread's CPU time fell :data:`PREEMPTED` behind the wall clock)
    within :data:`LOST_GAP` of another that did marks the machine contended, and for
    :data:`CALM` seconds every empty poll sleeps at once; then spinning is tried again.
    A lone lost spin only restarts the spin's measure: on a virtual machine the
    hypervisor takes an idle-looking vCPU for a moment now and then, and half a second
    of sleeping polls made each round trip pay a cross-core wake-up (50-180 us here).
    Nor does a spin count whose thread was never switched out (``switches``, the
    thread's context switches, unchanged since the spin began): no task of this machine
    took its CPU, so no task would gain by our sleeping; the hypervisor did. And of two
    lost spins, at least one must have been preempted (an involuntary switch): a spin
    switched out only voluntarily waited for the GIL or a lock that a thread of its own
    process held (at start-up, the progress thread finishing the input it woke for), and
    two such waits at start-up put a whole short ping-pong into a calm period, every
    round trip then paying a cross-core wake-up. A poll that got something, or a
    completion the application took, ends the streak (:meth:`busy`).

    A spinner that shares its core with the peer is not seen that way: the peer, woken
    by our request, preempts us at once and gives the core back when it waits, so no
    spin loses the CPU for long. Its sign is the request's send instead: on loopback
    ``sendmsg`` wakes the peer, which runs before the call returns (:meth:`sent`: a send
    that took :data:`SHARED_LOSS`). :data:`SHARED_SENDS` of them, each within
    :data:`SHARED_GAP` of the one before, mark the core shared for :data:`SHARED` seconds
    (:meth:`hold_acks`: the ACK hold's contention, not the sleep's).
    """

    __slots__ = ("fd", "spin", "since", "cpu0", "calm_until", "sleeps", "contended",
                 "clock", "cpu_clock", "lost", "lost_until", "shared_until", "shared",
                 "lost_at", "switches", "switches0", "preempted", "_ready")

    def __init__(self, fd: int | None, spin: float = SPIN, *,
                 clock: Callable[[], float] = time.monotonic,
                 cpu_clock: Callable[[], float] = time.thread_time,
                 switches: Callable[[], tuple[int, int]] = thread_switches) -> None:
        self.fd = fd
        self._ready = None if fd is None else Readable([fd])
        self.spin = spin
        self.clock = clock  # wall time (s)
        self.cpu_clock = cpu_clock  # the polling thread's CPU time (s)
        self.since = 0.0  # when the idle streak began (monotonic), 0.0 outside one
        self.cpu0 = 0.0  # the thread's CPU time then; -1.0 once the streak slept
        self.switches = switches  # the polling thread's context switches so far
        self.switches0 = (0, 0)  # ... when its spin began
        self.preempted = False  # the last spin that lost the CPU was preempted
        self.calm_until = 0.0  # empty polls sleep at once until then (monotonic)
        self.sleeps = 0  # how many times a poll slept (tests, diagnostics)
        self.contended = 0  # how many times a spin found it had lost the CPU
        self.lost_at = -LOST_GAP  # when a spin last lost the CPU (clock)
        self.lost = 0  # slow sends in the current run (each within SHARED_GAP of the last)
        self.lost_until = 0.0  # when that run ends without another slow send
        self.shared_until = 0.0  # coalesced ACKs may be held until then (monotonic)
        self.shared = 0  # how many times a run of slow sends marked the core shared

    def sent(self, t0: float) -> None:
        """A request's send that began at ``t0`` (:attr:`clock`) returned: a slow one is
        a sign that the peer it woke runs on our core."""
        now = self.clock()
        if now - t0 < SHARED_LOSS:
            return
        if now > self.lost_until:
            self.lost = 0
        self.lost += 1
        self.lost_until = now + SHARED_GAP
        if self.lost >= SHARED_SENDS:
            if self.shared_until < now:
                self.shared += 1
            self.shared_until = now + SHARED

    def hold_acks(self) -> bool:
        """True while the machine is contended (:meth:`calm_now`) or our core is shared
        with the peer (:meth:`sent`): coalesced ACKs may then be held back."""
        now = self.clock()
        return self.calm_until > now or self.shared_until > now

    def busy(self) -> None:
        """The poll got something: the streak ends."""
        self.since = 0.0

    def calm_now(self) -> bool:
        """True while a spin lately found the machine contended (its polls sleep at once)."""
        return self.calm_until > self.clock()

    def idle(self, deadline_in: float | None) -> bool:
        """An empty poll (outside the engine lock): spin on, or sleep until input,
        ``deadline_in`` seconds (the engine's next timer; None: none) or BLOCK_MAX.
        True if it slept and input ended the sleep (the caller reads it at once)."""
        ready = self._ready
        if ready is None:
            return False
        now = self.clock()
        since = self.since
        if since == 0.0:
            self.since = since = now
            if now >= self.calm_until:  # a spin starts (calm: the streak sleeps at once)
                self.cpu0 = self.cpu_clock()
                self.switches0 = self.switches()
                return False
        elif self.cpu0 >= 0.0 and now >= self.calm_until:  # spinning so far
            spent = now - since
            cpu = self.cpu_clock()
            if spent - (cpu - self.cpu0) >= PREEMPTED:
                switches = self.switches()
                if switches == self.switches0:  # the hypervisor's: spin on, afresh
                    self.since, self.cpu0 = now, cpu
                    return False
                self.contended += 1  # the spin lost the CPU to another task
                last, self.lost_at = self.lost_at, now
                preempted = switches[1] != self.switches0[1]  # not only waits of ours
                either = preempted or self.preempted
                self.preempted = preempted
                if now - last > LOST_GAP or not either:  # spin on, measured afresh
                    self.since, self.cpu0, self.switches0 = now, cpu, switches
                    return False
                self.calm_until = now + CALM  # again soon: the machine is contended
            elif spent < self.spin:
                return False  # spinning, and we keep the CPU
        wait = BLOCK_MAX if deadline_in is None else min(BLOCK_MAX, deadline_in)
        if wait <= 0.0:
            return False
        self.cpu0 = -1.0  # this streak sleeps from now on (its wall time is no CPU loss)
        self.sleeps += 1
        try:
            return bool(ready.wait(wait))
        except (OSError, ValueError):  # descriptor closed under us: the next call says so
            return False


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
        """In the progress thread: True (after waiting up to :data:`POLL_GRACE`) while an
        application thread busy-polls and so makes progress itself; the two threads then
        do not fight over the lock and the GIL on every packet."""
        if time.monotonic() - self.last_poll < POLL_GRACE:
            self.kicked.wait(POLL_GRACE)
            self.kicked.clear()
            return True
        return False

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

    def on_wake(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` when the thread must look now (:meth:`kick`, :meth:`close`)."""
        self._wakers.append(wake)

    def start(self, step: Callable[[], bool], name: str) -> None:
        """In threaded mode, start the progress thread: it runs ``step`` (one wait and
        one round of work; False ends the thread) until :meth:`close` or a device
        failure, standing back while the application busy-polls."""
        if self.threaded:
            self._thread = threading.Thread(target=self._main, args=(step,), name=name,
                                            daemon=True)
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
