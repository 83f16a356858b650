"""Latency under contention (issue 25): an application's busy poll spins for a while
(SPIN), then sleeps in the kernel until its link has input (:class:`PollPacer`).

Spinning keeps a ping-pong fast beside a busy process too (each peer keeps its core);
sleeping at once costs two wake-ups per round trip and, through the kernel's synchronous
wake-up, puts both peers on one core: the median half round trip doubled (42 -> 80-100
us on a 2-core VM). So a spin that lost the CPU for a while spins on; only a streak that
has spun SPIN sleeps.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from softrdma import verbs as v
from softrdma.drivers import progress as pg
from softrdma.drivers.udp import UdpLink


class _Clock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.wall = 100.0

    def run(self, dt: float) -> None:
        self.wall += dt


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _pacer(fd: int, c: _Clock, spin: float = 200e-6) -> pg.PollPacer:
    return pg.PollPacer(fd, spin, clock=lambda: c.wall)


def test_spins_then_sleeps_until_input(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    c = _Clock()
    p = _pacer(a.fileno(), c)
    for _ in range(5):  # within the spin time: no sleep
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
    assert p.idle(0.001) is False and p.sleeps == 3  # a streak that slept sleeps on
    p.busy()  # a poll that got something: the next streak spins again
    assert p.idle(None) is False and p.sleeps == 3


def test_a_spin_that_lost_the_cpu_spins_on(pair: tuple[socket.socket, socket.socket]) -> None:
    """Descheduled in the middle of a spin (the wall clock moved, this thread did not
    run): the streak spins on until it has spun its time, and so does the next one.
    (A pacer that took the lost CPU for contention slept at once from then on, which
    doubled a ping-pong's median half round trip beside one busy process.)"""
    a, b = pair
    c = _Clock()
    p = _pacer(a.fileno(), c, spin=0.01)
    assert p.idle(None) is False
    c.run(50e-6)
    assert p.idle(None) is False
    c.run(0.002)  # descheduled for 2 ms (a scheduler slice) while spinning
    b.send(b"x")  # the answer is there: a spinning poll returns at once, no sleep
    assert p.idle(None) is False and p.sleeps == 0
    a.recv(1)
    p.busy()
    for _ in range(3):  # the next streak spins too
        assert p.idle(None) is False
        c.run(1e-3)
    assert p.sleeps == 0
    c.run(0.01)
    assert p.idle(0.001) is False and p.sleeps == 1  # spun its time: it sleeps


def test_the_default_spin_outlasts_a_round_trip_and_a_slice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SPIN (1 ms by default) covers several ping-pong round trips (~90 us) and a
    descheduled peer's usual absence, yet an idle poller sleeps after it."""
    monkeypatch.delenv("SOFTRDMA_SPIN_US", raising=False)
    assert 0.0005 <= pg._spin_from_env() <= pg.BLOCK_MAX


def test_no_descriptor_never_sleeps() -> None:
    c = _Clock()
    p = pg.PollPacer(None, 0.0, clock=lambda: c.wall)
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
