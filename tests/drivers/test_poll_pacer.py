"""Latency under contention (issue 25): an application's busy poll spins only briefly,
then sleeps in the kernel until its link has input (:class:`PollPacer`).

Beside a busy process, two spinning ping-pong peers and the busy loop are three runnable
tasks on two cores: the scheduler time-slices them and each answer waits for its reader's
next slice (ms, against a ~40 us round trip). A poller that sleeps is woken when its
datagram arrives. Two spins that lost the CPU close together mark the machine contended:
polls then sleep at once for a while.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.udp import UdpLink
from softrdma.drivers.runtime import pacer as pg
from softrdma.seam.types import WorkCompletion


class _Clocks:
    """A wall clock, a CPU clock and the context-switch counts (voluntary, involuntary)
    the test moves."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 5.0
        self.voluntary = 0
        self.involuntary = 0

    @property
    def switches(self) -> tuple[int, int]:
        return self.voluntary, self.involuntary

    def run(self, dt: float, on_cpu: bool = True, switched: bool = True,
            waited: bool = False) -> None:
        """``dt`` seconds pass; off the CPU, the thread was preempted (another task took
        its core) unless ``switched`` is False (the hypervisor took the vCPU) or
        ``waited`` (it waited for the GIL or a lock of its own process: a voluntary
        switch)."""
        self.wall += dt
        if on_cpu:
            self.cpu += dt
        elif waited:
            self.voluntary += 1
        elif switched:
            self.involuntary += 1


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _pacer(fd: int, c: _Clocks, spin: float = 200e-6) -> pg.PollPacer:
    return pg.PollPacer(fd, spin, clock=lambda: c.wall, cpu_clock=lambda: c.cpu,
                        switches=lambda: c.switches)


def _spinning(fd: int) -> tuple[_Clocks, pg.PollPacer]:
    """A pacer on the test's clocks (a 10 ms spin) whose first empty poll began a spin."""
    c = _Clocks()
    p = _pacer(fd, c, spin=0.01)
    assert p.idle(None) is False
    return c, p


def _lost_spins(p: pg.PollPacer, c: _Clocks, n: int, **how: bool) -> None:
    """``n`` spins in a row that each lost the CPU (``how``: as :meth:`_Clocks.run`), each
    followed by a poll on the CPU; none of the polls sleeps."""
    for _ in range(n):
        c.run(3 * pg.PREEMPTED, on_cpu=False, **how)
        assert p.idle(None) is False
        c.run(20e-6)
        assert p.idle(None) is False


def test_spins_then_sleeps_until_input(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    c = _Clocks()
    p = _pacer(a.fileno(), c)
    for _ in range(5):  # within the spin time, on the CPU: no sleep
        assert p.idle(None) is False
        c.run(30e-6)
    assert p.sleeps == 0
    c.run(100e-6)  # past the spin time: the poll sleeps; input ends the sleep
    b.send(b"x")
    assert p.idle(None) is True and p.sleeps == 1
    a.recv(1)
    t0 = time.monotonic()
    assert p.idle(0.05) is False  # no input: the sleep ends at the engine's deadline
    assert p.sleeps == 2 and time.monotonic() - t0 < 5.0
    c.run(0.01, on_cpu=False)  # asleep is not preempted: no contention is seen
    assert p.idle(0.001) is False and p.sleeps == 3 and p.contended == 0
    p.busy()  # a poll that got something: the next streak spins again
    assert p.idle(None) is False and p.sleeps == 3


def test_a_spin_reads_the_cpu_clock_only_once_it_could_have_lost_the_cpu(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """The CPU clock (a system call) is read when a spin begins and then only once the
    spin has lasted PREEMPTED: before, its CPU time cannot lag the wall clock by that
    much, and the empty polls of a ping-pong's spin skip the read. A spin descheduled for
    longer is still seen at the next poll."""
    a, _ = pair
    c = _Clocks()
    reads: list[float] = []

    def cpu_clock() -> float:
        reads.append(c.wall)
        return c.cpu

    p = pg.PollPacer(a.fileno(), 2 * pg.PREEMPTED, clock=lambda: c.wall,
                     cpu_clock=cpu_clock, switches=lambda: c.switches)
    assert p.idle(None) is False and len(reads) == 1  # the spin begins
    for _ in range(9):
        c.run(pg.PREEMPTED / 10)
        assert p.idle(None) is False
    assert len(reads) == 1 and p.contended == 0
    c.run(pg.PREEMPTED / 10)
    assert p.idle(None) is False and len(reads) == 2  # PREEMPTED has passed: read
    p.busy()
    assert p.idle(None) is False and len(reads) == 3  # a new spin
    c.run(2 * pg.PREEMPTED, on_cpu=False)  # descheduled: seen at once
    assert p.idle(None) is False and len(reads) == 4 and p.contended == 1


def test_spins_that_lost_the_cpu_make_polls_sleep_at_once(
        pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    c, p = _spinning(a.fileno())
    c.run(50e-6)
    assert p.idle(None) is False  # spinning on the CPU
    c.run(2 * pg.PREEMPTED, on_cpu=False)  # descheduled while spinning: once, spin on
    assert p.idle(None) is False and p.contended == 1 and p.sleeps == 0
    p.busy()
    assert p.idle(None) is False
    c.run(2 * pg.PREEMPTED, on_cpu=False)  # again within LOST_GAP: contended
    b.send(b"x")
    assert p.idle(None) is True and p.contended == 2 and p.sleeps == 1
    a.recv(1)
    p.busy()
    b.send(b"y")
    assert p.idle(None) is True and p.sleeps == 2  # contended: the first empty poll sleeps
    a.recv(1)
    c.run(pg.CALM + 0.1)  # later, spinning is tried again
    p.busy()
    assert p.idle(None) is False and p.sleeps == 2


def test_a_lone_lost_spin_keeps_spinning(pair: tuple[socket.socket, socket.socket]) -> None:
    """One spin that lost the CPU (a hypervisor taking the vCPU for a moment) does not
    make the polls sleep; neither does another more than LOST_GAP later. The spin's
    measure restarts after a loss: the same loss is not counted twice."""
    a, _ = pair
    c, p = _spinning(a.fileno())
    c.run(3 * pg.PREEMPTED, on_cpu=False)
    assert p.idle(None) is False and p.contended == 1 and not p.calm_now()
    c.run(50e-6)
    assert p.idle(None) is False and p.contended == 1  # the same loss is not seen again
    c.run(pg.LOST_GAP + 0.01)  # on the CPU, so no loss; the streak's spin time is over
    p.busy()
    assert p.idle(None) is False
    c.run(3 * pg.PREEMPTED, on_cpu=False)  # a second loss, long after the first
    assert p.idle(None) is False and p.contended == 2 and not p.calm_now()
    assert p.sleeps == 0


def test_a_spin_never_switched_out_lost_its_cpu_to_the_hypervisor(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """Spins that lost the CPU while the kernel never switched their thread out (its
    context switches unchanged): the hypervisor took the vCPU, no task of this machine
    did, and none would gain by our sleeping. Such losses, even many close together,
    never make the polls sleep; a loss with a switch still counts."""
    a, _ = pair
    c, p = _spinning(a.fileno())
    _lost_spins(p, c, 5, switched=False)
    assert p.contended == 0 and not p.calm_now() and p.sleeps == 0
    c.run(3 * pg.PREEMPTED, on_cpu=False)  # another task took the core: counted
    assert p.idle(None) is False and p.contended == 1
    c.run(3 * pg.PREEMPTED, on_cpu=False)  # and again at once: contended (it sleeps)
    p.idle(None)
    assert p.calm_now() and p.contended == 2 and p.sleeps == 1


def test_spins_that_only_waited_for_their_own_process_do_not_make_polls_sleep(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """Spins that lost the CPU with only voluntary switches waited for the GIL or a lock
    of their own process (at start-up: the progress thread finishing the input it woke
    for); however close together, they never start a calm period, which at start-up
    made a whole short ping-pong sleep on every poll. A preempted spin within LOST_GAP
    of such a wait does: one of the two lost the core to another task."""
    a, _ = pair
    c, p = _spinning(a.fileno())
    _lost_spins(p, c, 4, waited=True)
    assert p.contended == 4 and not p.calm_now() and p.sleeps == 0
    c.run(3 * pg.PREEMPTED, on_cpu=False)  # preempted, soon after a wait: contended
    p.idle(None)
    assert p.calm_now() and p.contended == 5 and p.sleeps == 1


def test_slow_request_sends_in_a_row_mark_a_shared_core(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """A peer that shares our core runs inside our request's ``sendmsg`` (it woke): after
    SHARED_SENDS such slow sends in a row, ACKs may be held for SHARED seconds; the polls
    still spin (calm_now is the sleep's rule, unchanged). Fast sends never count, and a
    gap longer than SHARED_GAP starts the run again."""
    a, _ = pair
    c = _Clocks()
    p = _pacer(a.fileno(), c)
    for _ in range(3 * pg.SHARED_SENDS):  # fast sends (the peer on another core)
        t0 = c.wall
        c.run(pg.SHARED_LOSS / 2)
        p.sent(t0)
    assert not p.hold_acks() and p.lost == 0

    def slow() -> None:
        t0 = c.wall
        c.run(2 * pg.SHARED_LOSS, on_cpu=False)  # the woken peer ran on our core meanwhile
        p.sent(t0)
        c.run(100e-6)

    for _ in range(pg.SHARED_SENDS - 1):
        slow()
    assert not p.hold_acks()
    c.run(pg.SHARED_GAP)  # too long since the last one: the run starts again
    for _ in range(pg.SHARED_SENDS - 1):
        slow()
    assert not p.hold_acks() and p.shared == 0
    slow()
    assert p.hold_acks() and p.shared == 1 and not p.calm_now()
    assert p.idle(None) is False and p.sleeps == 0  # the poll still spins
    c.run(pg.SHARED)
    assert not p.hold_acks()


def test_no_descriptor_never_sleeps() -> None:
    c = _Clocks()
    p = pg.PollPacer(None, 0.0, clock=lambda: c.wall, cpu_clock=lambda: c.cpu)
    for _ in range(3):
        c.run(1.0)
        assert p.idle(None) is False
    assert p.sleeps == 0


def test_a_busy_poll_of_an_idle_device_sleeps_instead_of_spinning() -> None:
    """A CQ busy-polled for 0.5 s with nothing arriving: a few hundred polls (each empty
    one sleeps up to BLOCK_MAX), not a spinning loop of tens of thousands."""
    link = UdpLink("127.0.0.1", 0)
    ctx = v.Context(link=link)  # threaded progress: cq.poll busy-polls the link
    try:
        cq = v.CQ(ctx, 16)
        polls = 0
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            assert cq.poll(1)[0] == 0
            polls += 1
        assert polls < 5000, f"{polls} polls in 0.5 s: the poller spun"
    finally:
        ctx.close()


def test_a_sleeping_poller_is_woken_by_its_datagram() -> None:
    """Past its spin, the poller sleeps in the kernel; a datagram for it ends the sleep at
    once (not after BLOCK_MAX): counted by the link as received."""
    link = UdpLink("127.0.0.1", 0)
    ctx = v.Context(link=link)
    try:
        cq = v.CQ(ctx, 16)
        port = link.port
        assert port is not None
        sent = threading.Event()

        def send_later() -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                time.sleep(0.05)  # the poller is asleep by then (spin: 200 us)
                s.sendto(bytes(40), ("127.0.0.1", port))
                sent.set()

        t = threading.Thread(target=send_later)
        t.start()
        end = time.monotonic() + 10.0
        while link.stats.received == 0 and time.monotonic() < end:
            cq.poll(1)
        t.join()
        assert sent.is_set() and link.stats.received == 1
    finally:
        ctx.close()


def _paced_ctx(c: _Clocks) -> tuple[v.Context, pg.PollPacer]:
    """A UDP device (its CQs are busy-polled) whose pacer runs on the test's clocks."""
    ctx = v.Context(link=UdpLink("127.0.0.1", 0))
    rt = ctx.runtime
    pacer = _pacer(rt._pacer.fd, c)  # type: ignore[attr-defined]
    rt._pacer = pacer  # type: ignore[attr-defined]
    return ctx, pacer


def _polls_until_sleep(poll: Callable[[], object], pacer: pg.PollPacer) -> bool:
    """Empty polls until one sleeps (a poll may find the progress thread in the engine
    lock and return without pacing): True if one did within 10 s."""
    end = time.monotonic() + 10.0
    while pacer.sleeps == 0 and time.monotonic() < end:
        poll()
    return pacer.sleeps > 0


def test_completions_taken_outside_a_step_begin_a_new_streak() -> None:
    """The progress thread stored a completion and the application's poll took it from
    the queue, without a busy-poll step that received it: the next empty poll spins
    afresh. Before, the streak the last step began went on (it never saw its answer
    arrive), outlasted the spin, and every later empty poll slept: each round trip of a
    C program (whose ring the progress thread fills now and then) paid a wake-up."""
    c = _Clocks()
    ctx, pacer = _paced_ctx(c)
    try:
        cq = v.CQ(ctx, 16)
        assert cq.poll(1)[0] == 0  # a streak begins (it spins)
        c.run(300e-6)  # on the CPU, past the 200 us spin
        cq.push(WorkCompletion(7, 0, int(e.IBV_WC_RECV), 0x11))  # as the progress thread
        n, wcs = cq.poll(1)
        assert n == 1 and wcs[0].wr_id == 7
        for _ in range(20):
            assert cq.poll(1)[0] == 0
        assert pacer.sleeps == 0, "the streak went on after a completion was taken"
        # the new streak is paced as any other: past its spin, a poll sleeps
        c.run(300e-6)
        assert _polls_until_sleep(lambda: cq.poll(1), pacer)
    finally:
        ctx.close()


def test_a_c_programs_receive_step_after_taking_from_its_ring_spins_afresh() -> None:
    """softrdma.capi: ibv_poll_cq took completions from the C ring since the thread's last
    receive step (sr_py_progress's ``taken``): that step begins a new idle streak; without
    it the old streak goes on and the step sleeps."""
    from softrdma.capi import bridge
    from softrdma.capi import handles as hd

    c = _Clocks()
    ctx, pacer = _paced_ctx(c)
    try:
        cq = bridge.RingCQ(ctx, 16, None, 0, None)  # no ring: nothing is stored
        h = hd._add(cq)
        try:
            assert bridge._progress(h, 0) == 0  # a streak begins
            c.run(300e-6)
            for _ in range(20):
                bridge._progress(h, 1)  # completions were taken before each step
            assert pacer.sleeps == 0
            c.run(300e-6)  # nothing taken: the streak outlasts its spin and sleeps
            assert _polls_until_sleep(lambda: bridge._progress(h, 0), pacer)
        finally:
            hd._forget(h)
    finally:
        ctx.close()


@contextlib.contextmanager
def _ring_cq(monkeypatch: pytest.MonkeyPatch,
             push: Callable[..., int]) -> Iterator[tuple[Any, int]]:
    """A softrdma.capi ``RingCQ`` of a fresh UDP context and its handle (what C's
    ``sr_py_progress`` names), with the C ring's ``sr_ring_push`` replaced by ``push``."""
    from types import SimpleNamespace

    from softrdma.capi import bridge
    from softrdma.capi import handles as hd

    monkeypatch.setattr(hd, "_lib", SimpleNamespace(sr_ring_push=push), raising=False)
    ctx = v.Context(link=UdpLink("127.0.0.1", 0))
    try:
        cq = bridge.RingCQ(ctx, 16, None, 0, object())
        h = hd._add(cq)
        try:
            yield cq, h
        finally:
            hd._forget(h)
    finally:
        ctx.close()


def test_a_c_programs_step_that_stopped_at_a_completion_runs_the_next_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """softrdma.capi: a RingCQ's receive step stops once it stored a receive's completion
    into the ring (its ``stored`` mark is the step's ``stop_on``, as a Python CQ's queue
    is; a send's completion does not stop it), and
    ``sr_py_progress`` returns 1 when that left datagrams behind (the ACK a program that
    awaits its own SEND's completion needs next): shim.c then runs the next step at the
    next empty poll, without its spin; also while the program's last SEND awaits its ACK
    and the program awaited each earlier one (``ack_awaited``). 0 otherwise."""
    from softrdma.capi import bridge

    pushed: list[int] = []

    def push(ring: object, wr_id: int, *rest: object) -> int:
        pushed.append(wr_id)
        return 0

    with _ring_cq(monkeypatch, push) as (cq, h):
        rt = cq.ctx.runtime
        stops: list[object] = []
        pending = [True]

        def step(stop_on: object = None, taken: bool = False, polls: int = 1) -> int:
            stops.append(stop_on)
            # a step from C spins in Python (bridge.STEP_POLLS), not by entering again
            assert polls == bridge.STEP_POLLS > 1
            assert not stop_on  # cleared before the step
            cq.push(WorkCompletion(8, 0, int(e.IBV_WC_SEND), 0x11))
            assert not stop_on  # a send's completion: a bulk sender's steps go on
            cq.push(WorkCompletion(9, 0, int(e.IBV_WC_RECV), 0x11))  # a receive's ...
            assert stop_on  # ... stops the step
            return 1

        monkeypatch.setattr(rt, "progress_nonblocking", step)
        monkeypatch.setattr(rt, "rx_pending", lambda: pending[0])
        awaited = [False]
        monkeypatch.setattr(rt, "ack_awaited", lambda: awaited[0])
        assert bridge._progress(h, 0) == 1
        assert stops == [cq.stored] and pushed == [8, 9]
        pending[0] = False  # nothing left behind the completion
        assert bridge._progress(h, 0) == 0
        pending[0] = True
        monkeypatch.setattr(rt, "progress_nonblocking",
                            lambda stop_on=None, taken=False, polls=1: 0)
        assert bridge._progress(h, 0) == 0  # no completion stored: no stop
        # the program's last SEND awaits its ACK (it awaited each earlier one): the
        # next empty poll steps at once, with or without a completion stored
        awaited[0] = True
        assert bridge._progress(h, 0) == 1


def test_a_c_programs_step_sleeps_while_the_progress_thread_serves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """softrdma.capi: while the device's progress thread serves (the program left input
    unread as it polled, ``ProgressCore.took``: ``ib_write_lat``), ``sr_py_progress``
    returns -1 without a receive step, and shim.c sleeps until the thread completes into
    the ring; once the serving is over, the steps run again."""
    from softrdma.capi import bridge

    with _ring_cq(monkeypatch, lambda *a: 0) as (cq, h):
        rt = cq.ctx.runtime
        steps: list[int] = []

        def step(stop_on: object = None, taken: bool = False, polls: int = 1) -> int:
            steps.append(1)
            return 0

        monkeypatch.setattr(rt, "progress_nonblocking", step)
        roce: Any = rt  # the RoCE Runtime
        core = roce.core  # its ProgressCore
        assert not rt.serving()
        assert bridge._progress(h, 0) == 0 and steps == [1]
        core.serve_until = time.monotonic() + 60.0  # the thread serves
        assert rt.serving()
        assert bridge._progress(h, 1) == -1 and steps == [1]  # no step
        core.serve_until = 0.0
        assert bridge._progress(h, 0) == 0 and steps == [1, 1]
