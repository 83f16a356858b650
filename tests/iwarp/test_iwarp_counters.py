"""iWARP devices count too (issue 24 §3): FPDUs and stream octets each way, Terminates
sent and received, MPA CRC errors, in the device's port counters (``softrdma stats``,
``Context.query_port_counters``). Engine-level, on the in-memory byte pipe."""

from __future__ import annotations

import pytest
from harness.iwarp import Side, connect_pair, pump

from softrdma import enums as e
from softrdma.iwarp.engine import ConnState
from softrdma.iwarp.mpa_setup import MpaConfig


@pytest.mark.parametrize("direct", [False, True])
def test_fpdus_and_octets_are_counted(direct: bool) -> None:
    a, b = Side("a"), Side("b")
    cfg = MpaConfig(crc=True)
    connect_pair(a, b, cfg, cfg)
    wire_a, wire_b = len(a.wire), len(b.wire)
    assert a.dev.counters.sent_bytes == wire_a == b.dev.counters.rcvd_bytes
    assert b.dev.counters.sent_bytes == wire_b == a.dev.counters.rcvd_bytes
    assert a.dev.counters.sent_pkts == b.dev.counters.rcvd_pkts == 0  # MPA frames only
    src, dst = a.mr(4000, fill=7), b.mr(4000)
    b.post_recv(dst, 4000)
    a.post(e.IBV_WR_SEND, src, 3000)  # three FPDUs at MSS 1460
    a.post(e.IBV_WR_RDMA_WRITE, src, 4000, rkey=dst.rkey, raddr=dst.addr)  # three more
    log: list[tuple[int, bytes]] = []
    pump(a, b, direct=direct, log=log)
    sent = sum(1 for who, _ in log if who == 0)
    assert sent == 6
    ca, cb = a.dev.counters, b.dev.counters
    assert ca.sent_pkts == cb.rcvd_pkts == sent
    assert ca.sent_bytes == len(a.wire) == cb.rcvd_bytes
    assert cb.sent_pkts == ca.rcvd_pkts == 0  # no ACKs in iWARP: TCP carries them
    assert ca.sent_terminate == cb.rcvd_terminate == 0 and cb.rcvd_icrc_err == 0


def test_terminates_and_crc_errors_are_counted() -> None:
    a, b = Side("a"), Side("b")
    cfg = MpaConfig(crc=True)
    connect_pair(a, b, cfg, cfg)
    src, dst = a.mr(100, fill=7), b.mr(100)
    b.post_recv(dst, 100)
    a.post(e.IBV_WR_SEND, src, 100)
    bufs = a.conn.pull_tx()
    data = bytearray(b"".join(bytes(x) for x in bufs))
    a.conn.tx_sent(len(data))
    data[-5] ^= 0xFF  # a payload octet: the FPDU's CRC32c no longer matches
    b.conn.receive(data)
    assert b.conn.state == ConnState.FAILED
    pump(a, b)  # b's Terminate reaches a
    ca, cb = a.dev.counters, b.dev.counters
    assert cb.rcvd_icrc_err == 1 and cb.rcvd_pkts == 0
    assert cb.sent_terminate == 1 and ca.rcvd_terminate == 1
    assert ca.sent_terminate == 0 and ca.rcvd_icrc_err == 0
