"""The pace of an application thread that busy-polls a CQ (issue 25): spin, then sleep.

:class:`PollPacer` decides, for each empty poll of a busy poll
(:meth:`~softrdma.drivers.runtime.roce.Runtime.progress_nonblocking`), whether the thread
spins on or sleeps in the kernel until its link has input, and whether the machine is
contended or our core shared with the peer, in which case coalesced ACKs may be held
(``roce.AckHold``). Its clocks and its context-switch count are parameters, so the tests
run it on clocks they move.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable

from .fdwait import Readable

__all__ = ["PollPacer", "thread_switches", "SPIN", "BLOCK_MAX", "PREEMPTED", "LOST_GAP", "CALM",
           "SHARED_LOSS", "SHARED_SENDS", "SHARED_GAP", "SHARED"]

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
BLOCK_MAX = 0.002  # the longest one such sleep (s): below progress.POLL_GRACE (the thread stays back)
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


def thread_switches() -> tuple[int, int]:
    """The calling thread's context switches so far, (voluntary, involuntary)
    (``getrusage(RUSAGE_THREAD)``): a spin whose thread the kernel never switched out lost
    its CPU to the hypervisor, not to another task of this machine; one whose thread was
    only switched out voluntarily waited (for the GIL or a lock of its own process) and
    was not preempted."""
    ru = resource.getrusage(resource.RUSAGE_THREAD)
    return ru.ru_nvcsw, ru.ru_nivcsw


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
            # The CPU time can lag the wall clock by PREEMPTED only once PREEMPTED has
            # passed: before, no CPU clock read (a system call, 0.6 us here, where the
            # rest of an empty poll of a ping-pong's spin takes a few us).
            cpu = self.cpu_clock() if spent >= PREEMPTED else -1.0
            if cpu >= 0.0 and spent - (cpu - self.cpu0) >= PREEMPTED:
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
