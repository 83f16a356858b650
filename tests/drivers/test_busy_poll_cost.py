"""What an empty busy poll costs (issue 25, the contended ping-pong).

Beside a busy process both ping-pong processes share one core, so a round trip costs
the CPU work of both sides, empty polls included. These tests pin down the savings on
that path, and that the shortcuts still do what the full path did (timers, ACKs).
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from softrdma import verbs as v
from softrdma.drivers.links.udp import UdpLink
from softrdma.drivers.runtime import pacer as pg
from softrdma.drivers.runtime.roce import Runtime

LO4 = socket.inet_pton(socket.AF_INET, "127.0.0.1")


class _CountingSocket:
    """A receive socket that counts its ``recvmsg_into`` calls."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.calls = 0

    def recvmsg_into(self, *args: Any) -> Any:
        self.calls += 1
        return self.sock.recvmsg_into(*args)


def _wait_readable(link: UdpLink) -> None:
    fd = link.fileno()
    assert fd is not None
    assert select.select([fd], [], [], 10.0)[0], "the datagram did not arrive in 10 s"


Links = tuple[UdpLink, UdpLink, _CountingSocket, int]


@pytest.fixture()
def links() -> Iterator[Links]:
    """Two loopback links, the second one's receive socket counting its reads, and the
    second one's port; both closed afterwards."""
    a = UdpLink("127.0.0.1", 0)
    b = UdpLink("127.0.0.1", 0)
    try:
        assert b._rx is not None and b.port is not None
        counting = _CountingSocket(b._rx)
        b._rx = counting  # type: ignore[assignment]
        b._rx_socks = (counting,)  # type: ignore[assignment]
        yield a, b, counting, b.port
    finally:
        a.close()
        b.close()


def test_a_read_that_drained_the_socket_makes_the_next_empty_poll_ask_the_epoll(
        links: Links) -> None:
    """A read that ended on EAGAIN left the socket empty: the next call asks the epoll
    (0.3 us) instead of a recvmsg that raises BlockingIOError (1-3 us). A ping-pong's
    busy poll makes such a read and then such a call every round trip."""
    a, b, counting, port = links
    for _ in range(2):
        a.send(LO4, port, a.fallback_sport, [b"x" * 40])
        _wait_readable(b)
        before = counting.calls
        got = b.recv_batch(4)
        assert len(got) == 1 and bytes(got[0].data) == b"x" * 40
        # the datagram; then the epoll, not a recvmsg raising EAGAIN, says no more
        assert counting.calls == before + 1
        assert b.recv_batch(4) == []
        assert counting.calls == before + 1, "an empty poll after a drain read the socket"


def test_a_read_asks_the_epoll_before_its_second_recvmsg(links: Links) -> None:
    """After a call's first datagram, whether another one is queued is asked of the epoll
    (0.3 us), not of a recvmsg that raises EAGAIN (1.4 us): the busy poll's reads of a
    ping-pong (one datagram, then the probe for more) pay that on every other step, the
    step that takes the ACK an application awaits among them. Datagrams that are queued
    are all read, as before."""
    a, b, counting, port = links
    a.send(LO4, port, a.fallback_sport, [b"p" * 40])
    _wait_readable(b)
    b._was_empty = False  # a full read before: this call reads without asking first
    before = counting.calls
    assert [bytes(d.data) for d in b.recv_batch(2)] == [b"p" * 40]
    assert counting.calls == before + 1, "the probe for a second datagram read the socket"
    for c in (b"q", b"r", b"s"):
        a.send(LO4, port, a.fallback_sport, [c * 40])
    end = time.monotonic() + 10.0
    got: list[bytes] = []
    while len(got) < 3 and time.monotonic() < end:  # loopback delivers them in order
        got += [bytes(d.data) for d in b.recv_batch(8)]
    assert got == [b"q" * 40, b"r" * 40, b"s" * 40]


def test_a_one_datagram_read_makes_the_next_empty_poll_ask_the_epoll(links: Links) -> None:
    """A busy poll reads one datagram first (a ping-pong's answer); the call after it,
    most often empty, asks the epoll rather than a recvmsg that raises EAGAIN; a datagram
    queued behind the first is still read by it."""
    a, b, counting, port = links
    a.send(LO4, port, a.fallback_sport, [b"x" * 40])
    _wait_readable(b)
    before = counting.calls
    assert len(b.recv_batch(1)) == 1 and counting.calls == before + 1
    assert b.recv_batch(2) == []
    assert counting.calls == before + 1, "an empty poll after a one-datagram read"
    a.send(LO4, port, a.fallback_sport, [b"y" * 40])
    a.send(LO4, port, a.fallback_sport, [b"z" * 40])
    _wait_readable(b)
    got = b.recv_batch(1)
    assert [bytes(d.data) for d in got] == [b"y" * 40]
    end = time.monotonic() + 10.0
    more: list[bytes] = []
    while not more and time.monotonic() < end:
        more = [bytes(d.data) for d in b.recv_batch(2)]
    assert more == [b"z" * 40]


class _CountingEpoll:
    """An epoll that counts its ``poll`` calls."""

    def __init__(self, ep: Any) -> None:
        self.ep = ep
        self.calls = 0

    def poll(self, *args: Any) -> Any:
        self.calls += 1
        return self.ep.poll(*args)

    def __getattr__(self, name: str) -> Any:  # fileno, close: the real epoll's
        return getattr(self.ep, name)


def test_a_caller_that_knows_the_socket_readable_is_not_asked_again(links: Links) -> None:
    """A shared device's client asks its own epoll (the direct path's sockets and its data
    channel) before it reads: ``recv_batch(readable=True)`` then reads at once, where a
    link left empty by its last read would ask its epoll first, a second system call for
    the same answer. The probe for a second datagram stays."""
    a, b, counting, port = links
    ep = _CountingEpoll(b._ep)
    b._ep = ep  # type: ignore[assignment]
    for readable, asked in ((False, 2), (True, 1)):
        a.send(LO4, port, a.fallback_sport, [b"k" * 40])
        _wait_readable(b)
        b._was_empty = True  # the last read drained the socket
        ep.calls = 0
        before = counting.calls
        got = b.recv_batch(4, readable=readable)
        assert [bytes(d.data) for d in got] == [b"k" * 40]
        assert counting.calls == before + 1 and ep.calls == asked, (readable, ep.calls)


def test_a_calm_poll_sleeps_without_reading_the_cpu_clock() -> None:
    """While the machine is contended (calm), an empty poll sleeps at once: it does not
    read the thread's CPU time (a system call) that only a spin needs."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        reads: list[float] = []
        wall = [100.0]

        def cpu() -> float:
            reads.append(wall[0])
            return 5.0

        p = pg.PollPacer(a.fileno(), 0.01, clock=lambda: wall[0], cpu_clock=cpu)
        p.calm_until = wall[0] + pg.CALM
        b.send(b"x")
        assert p.idle(None) is True and p.sleeps == 1
        assert reads == []
        a.recv(1)
        p.busy()
        wall[0] += pg.CALM + 0.1  # calm is over: a spin starts, and it needs the CPU clock
        assert p.idle(None) is False and len(reads) == 1
    finally:
        a.close()
        b.close()


class _Due:
    """A timer owner of the engine (``Timed``) whose deadline has passed."""

    def __init__(self) -> None:
        self.deadline: float | None = 0.0
        self.fired: list[float] = []

    def on_timer(self, now: float) -> None:
        self.fired.append(now)
        self.deadline = None


class _AckOwner:
    """An engine QP with a coalesced ACK pending (``Port.ack_pending``)."""

    def __init__(self) -> None:
        self.flushed = 0
        self.ack_psn = 0

    def flush_ack(self) -> None:
        self.flushed += 1


@pytest.fixture
def rt() -> Iterator[Runtime]:
    """A RoCE runtime on loopback that progresses only when the test calls it."""
    ctx = v.Context(link=UdpLink("127.0.0.1", 0), progress="manual")
    try:
        runtime = ctx.runtime
        assert isinstance(runtime, Runtime)
        yield runtime
    finally:
        ctx.close()


def test_an_empty_busy_poll_still_runs_due_timers_and_sends_pending_acks(rt: Runtime) -> None:
    """An empty busy poll skips the housekeeping when nothing is queued; a due timer or a
    coalesced ACK still gets it, as before."""
    port = rt.port
    due = _Due()
    port.arm(due)
    end = time.monotonic() + 10.0
    while not due.fired and time.monotonic() < end:
        assert rt.progress_nonblocking() == 0
    assert len(due.fired) == 1
    owner = _AckOwner()
    port.ack_pending.append(owner)
    assert rt.progress_nonblocking() == 0
    assert owner.flushed == 1 and not port.ack_pending
    assert rt.progress_nonblocking() == 0  # nothing queued: nothing run
    assert owner.flushed == 1 and len(due.fired) == 1


def test_the_housekeeping_shortcut_still_runs_timers_deferred_calls_and_acks(
        rt: Runtime) -> None:
    """The end of every locked operation (``Runtime._after_locked``) returns at once when
    nothing is queued and no timer is due; a due timer, a deferred call or a coalesced ACK
    still runs (here through ``ctx.progress()``)."""
    port = rt.port
    due = _Due()
    port.arm(due)
    ran: list[int] = []
    rt.defer(lambda: ran.append(1))
    owner = _AckOwner()
    port.ack_pending.append(owner)
    assert rt.progress() == 0
    assert len(due.fired) == 1 and ran == [1] and owner.flushed == 1
    due.deadline = time.monotonic() + 3600.0  # armed, not due
    port.arm(due)
    assert rt.progress() == 0
    assert len(due.fired) == 1 and ran == [1] and owner.flushed == 1
    due.deadline = 0.0  # due again
    assert rt.progress() == 0
    assert len(due.fired) == 2


def _counting_polls(rt: Runtime, monkeypatch: pytest.MonkeyPatch,
                    after: Any = None) -> list[int]:
    """Count the runtime's receive polls (``_poll_rx_locked``); ``after(k)`` runs after
    the k-th (from 1)."""
    calls = [0]
    real = rt._poll_rx_locked

    def poll(stop_on: Any, ask: int) -> int:
        calls[0] += 1
        n = real(stop_on, ask)
        if after is not None:
            after(calls[0])
        return n

    monkeypatch.setattr(rt, "_poll_rx_locked", poll)
    return calls


def test_a_step_of_several_polls_spins_in_python_until_input_or_its_completion(
        rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """``progress_nonblocking(polls=N)`` (a C program's step, softrdma.capi) makes up to
    N empty polls while the pacer spins, and returns at once on input or on its CQ's
    completion (``stop_on``)."""
    # the spin never ends here, nor turns calm on a busy machine (a spin that lost the
    # CPU without a context switch is the hypervisor's: it spins on): no poll sleeps
    rt._pacer.spin = 60.0
    rt._pacer.switches = lambda: (0, 0)
    calls = _counting_polls(rt, monkeypatch)
    assert rt.progress_nonblocking(polls=5) == 0
    assert calls[0] == 5 and rt._pacer.sleeps == 0
    assert rt.progress_nonblocking() == 0  # one poll, as a Python program's step
    assert calls[0] == 6
    # input: the step returns after the poll that read it
    link = rt.link
    assert isinstance(link, UdpLink) and link.port is not None
    sender = UdpLink("127.0.0.1", 0)
    try:
        sender.send(LO4, link.port, sender.fallback_sport, [b"not a RoCE packet" * 3])
        _wait_readable(link)
        assert rt.progress_nonblocking(polls=5) == 1
        assert calls[0] == 7
    finally:
        sender.close()
    # its CQ's completion (here set by the third poll) ends the step too
    stop: list[bool] = []
    monkeypatch.undo()
    calls = _counting_polls(rt, monkeypatch, lambda k: stop.append(True) if k == 3 else None)
    assert rt.progress_nonblocking(stop, polls=5) == 0
    assert calls[0] == 3 and stop


def test_a_step_of_several_polls_returns_after_the_pacer_sleeps(
        rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the pacer's spin is over a poll sleeps in the kernel (until input, a timer
    or BLOCK_MAX); the step returns after that sleep instead of polling on."""
    rt._pacer.spin = 0.0
    calls = _counting_polls(rt, monkeypatch)
    assert rt.progress_nonblocking(polls=50) == 0
    # one sleep, and no poll after it: the poll that began the streak, the one that
    # slept, and on a busy machine one more for a spin that lost the CPU (its measure
    # begins afresh, PollPacer.idle)
    assert rt._pacer.sleeps == 1
    assert 2 <= calls[0] < 50
