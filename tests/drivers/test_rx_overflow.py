"""The kernel's receive-queue drops and the receive buffer it grants (issue 25).

A datagram the kernel drops because a receive socket's queue is full costs the
transport a retransmission; ``SO_RXQ_OVFL`` makes those drops visible: they are counted
in the link's ``rx_overflow`` and the port counter ``rcvd_rx_overflow`` (``softrdma
stats``). A receive buffer smaller than asked (``net.core.rmem_max``) is reported.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest

from softrdma import verbs as v
from softrdma.drivers.links import udp
from softrdma.drivers.links.udp import UdpLink
from softrdma.drivers.runtime.roce import Runtime
from softrdma.seam.counters import DropReason

SMALL = 4096  # bytes: a few datagrams fill it
DEADLINE = 10.0


def _flood(port: int, n: int, size: int = 1000) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(n):
            s.sendto(bytes(size), ("127.0.0.1", port))


def _read_until(link: UdpLink, cond: object) -> None:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        link.recv_batch(64)
        if callable(cond) and cond():
            return


def _rmem_max() -> int:
    try:
        return int(Path("/proc/sys/net/core/rmem_max").read_text())
    except (OSError, ValueError):
        return 212992


def test_kernel_drops_on_a_full_queue_are_counted() -> None:
    with UdpLink("127.0.0.1", 0, rcvbuf=SMALL) as link:
        assert link.port is not None
        _flood(link.port, 300)  # nobody reads: most are dropped by the kernel
        while link.recv_batch(64):
            pass
        _flood(link.port, 1)  # the next datagram carries the socket's drop count
        _read_until(link, lambda: link.stats.rx_overflow > 0)
        assert link.stats.rx_overflow >= 200, link.stats
        assert link.stats.received < 100


def test_port_counters_show_the_kernel_drops() -> None:
    link = UdpLink("127.0.0.1", 0, rcvbuf=SMALL)
    ctx = v.Context(link=link, progress="manual")
    try:
        rt = ctx.runtime
        assert isinstance(rt, Runtime) and link.port is not None
        _flood(link.port, 300)
        end = time.monotonic() + DEADLINE
        counters = rt.port.counters
        while time.monotonic() < end and counters.rcvd_rx_overflow == 0:
            rt.progress()
            _flood(link.port, 1)
            rt.progress(0.01)
        assert counters.rcvd_rx_overflow == link.stats.rx_overflow >= 200
        assert counters.drops()[DropReason.RX_OVERFLOW.value] == counters.rcvd_rx_overflow
        assert rt.device_counters()["rcvd_rx_overflow"] == counters.rcvd_rx_overflow
    finally:
        ctx.close()


def test_a_clamped_receive_buffer_is_reported(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    # Without CAP_NET_ADMIN, SO_RCVBUFFORCE is refused and SO_RCVBUF is capped at
    # rmem_max: asking SO_RCVBUF (not the force option) does the same as root.
    monkeypatch.setattr(udp, "SO_RCVBUFFORCE", socket.SO_RCVBUF)
    want = 2 * _rmem_max()
    with caplog.at_level(logging.WARNING, logger="softrdma.link"):
        with UdpLink("127.0.0.1", 0, rcvbuf=want) as link:
            assert link.stats.rcvbuf_clamped == 1
            assert 0 < link.stats.rcvbuf < want
    assert any("rmem_max" in r.getMessage() for r in caplog.records)


def test_a_granted_receive_buffer_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="softrdma.link"):
        with UdpLink("127.0.0.1", 0, rcvbuf=SMALL) as link:
            assert link.stats.rcvbuf >= SMALL and link.stats.rcvbuf_clamped == 0
    assert not caplog.records
