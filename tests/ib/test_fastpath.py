"""The RC fast paths (Requester.post_one and emit_middles: one-packet posts and MIDDLE
runs on send; Responder.place_middles and send_only, Completer.fast_ack: MIDDLE runs, the ACK
and the SEND ONLY on receive) behave exactly as the general path: the same packets byte for
byte, in the same order and at the same times, the same placement, completions and
counters, with and without loss, duplication and reordering (IBA 9.7)."""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from harness.engine import Endpoint, Net, connect
from harness.property_budget import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softrdma import enums as e
from softrdma.drivers.devd.client import DevdLink
from softrdma.ib.completer import Completer
from softrdma.ib.port import Port, RxMeta
from softrdma.ib.requester import Requester
from softrdma.ib.responder import Responder
from softrdma.seam.types import SGE, RecvWQE, SendWQE
from softrdma.wire import ib as wib

SIG = int(e.IBV_SEND_SIGNALED)
SOLICITED = int(e.IBV_SEND_SOLICITED)
REGION = 1 << 20
KINDS = ("write", "write_imm", "send", "send_imm", "write2")  # write2: two SGEs


@contextmanager
def fast(enabled: bool) -> Iterator[dict[str, int]]:
    """Switch the fast paths on or off; count how often each one took a packet."""
    hits = {"emit": 0, "middle": 0, "ack": 0, "only": 0, "post": 0, "first": 0, "last": 0}
    saved = (Port.fast_paths, Requester.emit_middles, Responder.place_middles,
             Completer.fast_ack, Responder.send_only, Requester.post_one,
             Responder.send_first, Responder.send_last)
    emit, middle, ack, only, post = saved[1], saved[2], saved[3], saved[4], saved[5]
    first, last = saved[6], saved[7]

    def first_spy(self: Responder, data: memoryview) -> bool:
        ok = first(self, data)
        hits["first"] += ok
        return ok

    def last_spy(self: Responder, data: memoryview) -> bool:
        ok = last(self, data)
        hits["last"] += ok
        return ok

    def post_spy(self: Requester, wqe: SendWQE, now: float) -> bool:
        ok = post(self, wqe, now)
        hits["post"] += ok
        return ok

    def emit_spy(self: Requester, wqe: SendWQE, k: int, head: int) -> int:
        hits["emit"] += 1
        return emit(self, wqe, k, head)

    def middle_spy(self: Responder, bodies: Sequence[memoryview]) -> int:
        k = middle(self, bodies)
        hits["middle"] += k
        return k

    def ack_spy(self: Completer, data: memoryview, now: float) -> bool:
        ok = ack(self, data, now)
        hits["ack"] += ok
        return ok

    def only_spy(self: Responder, data: memoryview, opcode: int) -> bool:
        ok = only(self, data, opcode)
        hits["only"] += ok
        return ok

    Port.fast_paths = enabled
    Requester.post_one = post_spy  # type: ignore[method-assign]
    Responder.send_first = first_spy  # type: ignore[method-assign,assignment]
    Responder.send_last = last_spy  # type: ignore[method-assign,assignment]
    Requester.emit_middles = emit_spy  # type: ignore[method-assign]
    Responder.place_middles = middle_spy  # type: ignore[method-assign,assignment]
    Completer.fast_ack = ack_spy  # type: ignore[method-assign]
    Responder.send_only = only_spy  # type: ignore[method-assign,assignment]
    try:
        yield hits
    finally:
        Port.fast_paths = saved[0]
        Requester.emit_middles = saved[1]  # type: ignore[method-assign]
        Responder.place_middles = saved[2]  # type: ignore[method-assign]
        Completer.fast_ack = saved[3]  # type: ignore[method-assign]
        Responder.send_only = saved[4]  # type: ignore[method-assign]
        Requester.post_one = saved[5]  # type: ignore[method-assign]
        Responder.send_first = saved[6]  # type: ignore[method-assign]
        Responder.send_last = saved[7]  # type: ignore[method-assign]


def run(ops: list[tuple[str, int]], *, seed: int = 0, loss: float = 0.0, dup: float = 0.0,
        reorder: float = 0.0, mtu: int = 5, cwnd: int | None = None) -> dict[str, Any]:
    """Post ``ops`` from a to b at once, run the network, and return everything observable:
    every packet sent (time, bytes), both buffers, completions and counters."""
    trace: list[tuple[float, bytes]] = []
    net = Net(seed=seed, drop=loss, dup=dup, reorder=reorder)

    def record(data: bytes) -> bool:
        trace.append((net.now, data))
        return False

    net.drop_rule = record
    # keys from a counter, not random: both runs' RETHs carry the same R_Key
    a = Endpoint(net.add_port(1, max_mtu=4096, key_alloc=itertools.count(0x100).__next__),
                 size=2 * REGION, max_wr=64)
    b = Endpoint(net.add_port(2, max_mtu=4096, key_alloc=itertools.count(0x200).__next__),
                 size=3 * REGION, max_wr=64)
    connect(a, b, mtu=mtu, timeout=4, retry_cnt=7)
    if cwnd is not None:
        a.qp.req.cwnd = cwnd
    a.buf[:REGION] = bytes((i * 7 + 3) & 0xFF for i in range(256)) * (REGION // 256)
    for i, (kind, size) in enumerate(ops):
        sge = [SGE(a.mr.addr, size, a.mr.lkey)]
        if kind == "write2":  # two SGEs: the send side gathers across them
            half = size // 2
            sge = [SGE(a.mr.addr + 5, half, a.mr.lkey),
                   SGE(a.mr.addr + REGION // 2, size - half, a.mr.lkey)]
        if kind in ("send", "send_imm", "write_imm"):
            b.qp.post_recv(RecvWQE(100 + i, [SGE(b.mr.addr + 2 * REGION, REGION, b.mr.lkey)]))
        if kind.startswith("send"):
            op = e.IBV_WR_SEND if kind == "send" else e.IBV_WR_SEND_WITH_IMM
            w = SendWQE(i, int(op), SIG | (SOLICITED if i % 2 else 0), sge, imm_data=i)
        else:
            op = e.IBV_WR_RDMA_WRITE_WITH_IMM if kind == "write_imm" else e.IBV_WR_RDMA_WRITE
            w = SendWQE(i, int(op), SIG, sge, remote_addr=b.mr.addr + REGION, rkey=b.mr.rkey,
                        imm_data=i)
        a.qp.post_send(w, 0.0)
    net.run()
    wcs = [(w.wr_id, w.status, int(w.opcode), w.byte_len, w.imm_data, w.wc_flags, w.src_qp,
            w.solicited) for w in a.scq + b.rcq]
    return {"trace": trace, "a": hashlib.sha256(a.buf).digest(),
            "b": hashlib.sha256(b.buf).digest(), "wcs": wcs,
            "counters": (a.port.counters.as_dict(), b.port.counters.as_dict()),
            "states": (a.qp.state, b.qp.state), "now": net.now}


def both(ops: list[tuple[str, int]], **kw: Any) -> tuple[dict[str, Any], dict[str, int]]:
    with fast(False) as off_hits:
        slow = run(ops, **kw)
    assert not any(off_hits.values())
    with fast(True) as hits:
        quick = run(ops, **kw)
    assert quick["trace"] == slow["trace"]  # the same packets, byte for byte, same times
    for key in ("a", "b", "wcs", "counters", "states", "now"):
        assert quick[key] == slow[key], key
    return quick, hits


@pytest.mark.parametrize("mtu", [1, 3, 5])
@pytest.mark.parametrize("kind", KINDS)
def test_same_packets_lossless(kind: str, mtu: int) -> None:
    size = 256 * 1024 + 100  # not a multiple of any MTU: a short LAST packet
    quick, hits = both([(kind, size), (kind, 3 * (128 << mtu))], mtu=mtu)
    assert all(w[1] == 0 for w in quick["wcs"])
    assert hits["emit"] > 0 and hits["middle"] > 0 and hits["ack"] > 0


@pytest.mark.parametrize("tail", [0, 1, 4])
def test_send_first_and_last_take_the_fast_path(tail: int) -> None:
    """A multi-packet SEND's FIRST and LAST (a LAST with a pad too) are taken by the
    fast paths, with the general path's packets, placement and completions (IBA 9.7.4.1.5)."""
    ops = [("send", 3 * 1024 + tail), ("send", 2 * 1024 + tail)]
    quick, hits = both(ops, mtu=3)
    assert [w[1] for w in quick["wcs"]].count(0) == len(quick["wcs"]) > 0
    assert hits["first"] == hits["last"] == 2


def test_placement_is_the_senders_bytes() -> None:
    """The fast paths place the right bytes (not only the same as the general path)."""
    net = Net()
    a = Endpoint(net.add_port(1, max_mtu=4096), size=2 * REGION)
    b = Endpoint(net.add_port(2, max_mtu=4096), size=2 * REGION)
    connect(a, b, mtu=5)
    data = bytes((i * 13 + 1) & 0xFF for i in range(REGION))
    a.buf[:REGION] = data
    with fast(True) as hits:
        a.qp.post_send(SendWQE(1, int(e.IBV_WR_RDMA_WRITE), SIG, [SGE(a.mr.addr, REGION, a.mr.lkey)],
                               remote_addr=b.mr.addr + 3, rkey=b.mr.rkey), 0.0)
        net.run()
    assert bytes(b.buf[3:3 + REGION]) == data
    assert [(w.wr_id, w.status) for w in a.scq] == [(1, 0)]
    assert hits["middle"] == REGION // 4096 - 2


@pytest.mark.parametrize("cwnd", [8, 9, 33, 100])
@pytest.mark.iba("9.7.5.1.1")
def test_window_edges(cwnd: int) -> None:
    """A send window smaller than the message: runs stop at its edge, with AckReq on the
    packet that fills it (as the general path marks it)."""
    quick, hits = both([("write", REGION), ("send", 70_000)], cwnd=cwnd)
    assert all(w[1] == 0 for w in quick["wcs"])
    assert hits["emit"] > 1


@settings(max_examples=examples(12), deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(st.tuples(st.sampled_from(KINDS),
                              st.one_of(st.integers(0, 20_000), st.sampled_from([REGION, 300_000]))),
                    min_size=1, max_size=5),
       seed=st.integers(0, 2**16), loss=st.floats(0.0, 0.1), dup=st.floats(0.0, 0.1),
       reorder=st.floats(0.0, 0.2), mtu=st.integers(3, 5))
@pytest.mark.iba("9.7.6.1", "9.7.5.1.3")
def test_same_behaviour_under_faults(ops: list[tuple[str, int]], seed: int, loss: float,
                                     dup: float, reorder: float, mtu: int) -> None:
    """Loss, duplication and reordering (go-back-N, NAKs, duplicates, retransmission
    timers): the fast paths change nothing observable."""
    quick, _ = both(ops, seed=seed, loss=loss, dup=dup, reorder=reorder, mtu=mtu)
    assert all(w[1] == 0 for w in quick["wcs"])


def _ack(qp_dst: int, psn: int, pkey: int = 0xFFFF, extra: bytes = b"", b1: int = 0) -> memoryview:
    return memoryview(wib.BTH.pack(0x11, b1, pkey, qp_dst, psn) + wib.U32.pack(0x1F << 24)
                      + extra)


@pytest.mark.parametrize("enabled", [False, True])
@pytest.mark.iba("9.6", "9.6.1.1", "9.6.1.3")
def test_odd_acks_go_the_general_way(enabled: bool) -> None:
    """ACKs the fast path must not take are handled as the general path handles them:
    trailing bytes (malformed), TVer 1, a foreign P_Key, a ghost PSN, a stranger's GIDs."""
    net = Net()
    a = Endpoint(net.add_port(1, max_mtu=4096))
    b = Endpoint(net.add_port(2, max_mtu=4096))
    connect(a, b, mtu=5)
    with fast(enabled) as hits:
        a.qp.post_send(SendWQE(1, int(e.IBV_WR_RDMA_WRITE), SIG, [SGE(a.mr.addr, 64, a.mr.lkey)],
                               remote_addr=b.mr.addr, rkey=b.mr.rkey), 0.0)
        a.port.take_tx()  # the WRITE is lost: only forged ACKs arrive
        psn = 0xFFFFF0
        meta = RxMeta(b.port.gids[0], a.port.gids[0])
        c = a.port.counters
        port = a.port
        port.receive(_ack(a.qp.qpn, psn, extra=b"\0\0\0\0"), meta, 0.0)
        assert c.rcvd_malformed == 1
        port.receive(_ack(a.qp.qpn, psn, b1=1), meta, 0.0)
        assert c.rcvd_bad_tver == 1
        port.receive(_ack(a.qp.qpn, psn, pkey=0x8123), meta, 0.0)
        assert c.rcvd_bad_pkey == 1
        port.receive(_ack(a.qp.qpn, psn + 1), meta, 0.0)
        assert c.rcvd_seq_err == 1
        port.receive(_ack(a.qp.qpn, psn), RxMeta(bytes(10) + b"\xff\xff\x0a\0\0\x09",
                                                  a.port.gids[0]), 0.0)
        assert c.rcvd_bad_addr == 1
        assert not a.scq and hits["ack"] == 0
        port.receive(_ack(a.qp.qpn, psn), meta, 0.0)  # the real one completes the WRITE
        assert [(w.wr_id, w.status) for w in a.scq] == [(1, 0)]
        assert hits["ack"] == int(enabled)


@pytest.mark.iba("10.9.3")
def test_limited_member_pkey_is_not_fast() -> None:
    """A QP whose P_Key is a limited-member one accepts no packet with it (IBA 10.9.3:
    two limited members do not match), so no fast path may take one either."""
    net = Net()
    a = Endpoint(net.add_port(1, max_mtu=4096, pkeys=(0x7FFF,)))
    b = Endpoint(net.add_port(2, max_mtu=4096, pkeys=(0x7FFF,)))
    connect(a, b, mtu=1, retry_cnt=0)
    assert b.qp.fast_pkey == -1
    with fast(True) as hits:
        a.qp.post_send(SendWQE(1, int(e.IBV_WR_RDMA_WRITE), SIG,
                               [SGE(a.mr.addr, 4096, a.mr.lkey)],
                               remote_addr=b.mr.addr, rkey=b.mr.rkey), 0.0)
        net.run()
    assert hits["middle"] == 0 and b.port.counters.rcvd_bad_pkey > 0
    assert a.scq and a.scq[0].status == e.IBV_WC_RETRY_EXC_ERR
    assert struct.unpack_from("=Q", b.buf, 256)[0] == 0


@pytest.mark.parametrize("kind", ["send", "send_imm"])
@pytest.mark.iba("9.7.5.2.8")
def test_small_sends(kind: str) -> None:
    """SEND ONLY of a few sizes (a pad, the MTU, over it), no receive posted for some
    (RNR NAK and the retry after the RNR timer), a buffer too small for another
    (the general path's NAK and the QP in error): the same as the general path."""
    ops = [(kind, n) for n in (4, 64, 1024, 4093, 4096, 4100)]
    quick, hits = both(ops)
    assert all(w[1] == 0 for w in quick["wcs"])
    assert hits["only"] >= 3

    def starved(enabled: bool) -> tuple[Any, ...]:
        with fast(enabled) as hits:
            net = Net(seed=3)
            a = Endpoint(net.add_port(1, max_mtu=4096), max_wr=64)
            b = Endpoint(net.add_port(2, max_mtu=4096), max_wr=64)
            connect(a, b, mtu=5, min_rnr_timer=1)
            op = e.IBV_WR_SEND if kind == "send" else e.IBV_WR_SEND_WITH_IMM
            for i in range(4):
                a.qp.post_send(SendWQE(i, int(op), SIG, [SGE(a.mr.addr, 64, a.mr.lkey)],
                                       imm_data=7), 0.0)
            net.run(until=1e-3)  # RNR NAKs: no receive WQE yet
            b.qp.post_recv(RecvWQE(50, [SGE(b.mr.addr, 64, b.mr.lkey)]))
            b.qp.post_recv(RecvWQE(51, [SGE(b.mr.addr, 64, b.mr.lkey)]))
            b.qp.post_recv(RecvWQE(52, [SGE(b.mr.addr, 8, b.mr.lkey)]))  # too small
            net.run()
        return ([(w.wr_id, w.status, w.byte_len, w.imm_data, w.solicited) for w in a.scq + b.rcq],
                a.port.counters.as_dict(), b.port.counters.as_dict(), a.qp.state, b.qp.state,
                hits["only"])

    slow, quick2 = starved(False), starved(True)
    assert slow[:-1] == quick2[:-1]
    assert quick2[-1] == 2 and slow[2]["send_rnr_nak"] > 0
    assert quick2[4] == e.IBV_QPS_ERR  # the too-small buffer: NAK, responder in error


INLINE = int(e.IBV_SEND_INLINE)
FENCE = int(e.IBV_SEND_FENCE)
# (opcode, size, flags, how): how = "sge" | "inline" | "two" (two SGEs) | "badkey"
ONE_PACKET_OPS: list[tuple[int, int, int, str]] = [
    (int(e.IBV_WR_SEND), 64, SIG, "sge"),
    (int(e.IBV_WR_SEND), 0, SIG | SOLICITED, "sge"),
    (int(e.IBV_WR_SEND_WITH_IMM), 13, SOLICITED, "inline"),
    (int(e.IBV_WR_RDMA_WRITE), 4096, SIG | SOLICITED, "two"),  # SE not set on a WRITE
    (int(e.IBV_WR_RDMA_WRITE_WITH_IMM), 4093, SIG | SOLICITED, "sge"),
    (int(e.IBV_WR_RDMA_WRITE), 7, SIG | FENCE, "inline"),  # FENCE: the general way
    (int(e.IBV_WR_SEND), 4097, SIG, "sge"),  # two packets: the general way
    (int(e.IBV_WR_SEND), 64, SIG, "badkey"),  # local protection error
]


def _one_packet_run(ops: list[tuple[int, int, int, str]], *, cwnd: int | None = None,
                    pingpong: bool = True, seed: int = 0, loss: float = 0.0) -> dict[str, Any]:
    """Post ``ops`` from a to b, one at a time with the network run between posts (a
    ping-pong's pattern: the previous message's ACK may still be out) or all at once."""
    trace: list[tuple[float, bytes]] = []
    net = Net(seed=seed, drop=loss)

    def record(data: bytes) -> bool:
        trace.append((net.now, data))
        return False

    net.drop_rule = record
    a = Endpoint(net.add_port(1, max_mtu=4096, key_alloc=itertools.count(0x100).__next__),
                 size=REGION, max_wr=64)
    b = Endpoint(net.add_port(2, max_mtu=4096, key_alloc=itertools.count(0x200).__next__),
                 size=REGION, max_wr=64)
    connect(a, b, mtu=5, timeout=4, retry_cnt=7)
    if cwnd is not None:
        a.qp.req.cwnd = cwnd
    a.buf[:8192] = bytes(range(256)) * 32
    for i, (opcode, size, flags, how) in enumerate(ops * 2):
        b.qp.post_recv(RecvWQE(100 + i, [SGE(b.mr.addr + 65536, 8192, b.mr.lkey)]))
        sge = [SGE(a.mr.addr + i, size, a.mr.lkey)]
        inline = None
        if how == "two":
            sge = [SGE(a.mr.addr + 1, size // 3, a.mr.lkey),
                   SGE(a.mr.addr + 5000, size - size // 3, a.mr.lkey)]
        elif how == "inline":
            inline, sge, flags = bytes(a.buf[i:i + size]), [], flags | INLINE
        elif how == "badkey":
            sge = [SGE(a.mr.addr, size, a.mr.lkey ^ 0x5A5A00)]
        w = SendWQE(i, opcode, flags, sge, imm_data=0xC0DE0000 + i, inline_data=inline,
                    remote_addr=b.mr.addr + 16 * i, rkey=b.mr.rkey)
        a.qp.post_send(w, net.now)
        if pingpong:
            net.run(until=net.now + 2e-6)  # the packet is on its way, its ACK not yet back
    net.run()
    wcs = [(w.wr_id, w.status, int(w.opcode), w.byte_len, w.imm_data, w.wc_flags, w.solicited)
           for w in a.scq + b.rcq]
    return {"trace": trace, "a": hashlib.sha256(a.buf).digest(),
            "b": hashlib.sha256(b.buf).digest(), "wcs": wcs,
            "counters": (a.port.counters.as_dict(), b.port.counters.as_dict()),
            "states": (a.qp.state, b.qp.state), "now": net.now, "psn": a.qp.req.next_psn}


@pytest.mark.parametrize("pingpong", [True, False])
@pytest.mark.parametrize("cwnd", [None, 1, 2])
def test_one_packet_posts_as_the_general_path(pingpong: bool, cwnd: int | None) -> None:
    """post_one (a message of one packet sent as it is posted) against the general path:
    SEND, SEND with immediate, RDMA WRITE (with immediate), inline data, two SGEs, zero
    length, the Solicited Event bit, a full window (cwnd 1 and 2), a FENCE, a message of
    two packets and a bad L_Key after it (which stops the QP): the same packets byte for
    byte at the same times, buffers, completions, counters and states."""
    ops = ONE_PACKET_OPS[:-1] if cwnd is None else ONE_PACKET_OPS[:5]
    runs = []
    for enabled in (False, True):
        with fast(enabled) as hits:
            runs.append((_one_packet_run(ops, cwnd=cwnd, pingpong=pingpong), dict(hits)))
    (slow, slow_hits), (quick, quick_hits) = runs
    assert slow_hits["post"] == 0
    assert quick["trace"] == slow["trace"]
    for key in ("a", "b", "wcs", "counters", "states", "now", "psn"):
        assert quick[key] == slow[key], key
    eligible = 2 * sum(1 for o in ops if o[1] <= 4096 and not o[2] & FENCE)
    if cwnd is None:  # every message of one packet without FENCE
        assert quick_hits["post"] == eligible
    else:  # and some that the full window left to the general path
        assert 1 <= quick_hits["post"] < eligible
    assert all(w[1] == 0 for w in quick["wcs"])


@pytest.mark.iba("10.8.3", "10.7.3.1")
def test_one_packet_post_with_a_bad_lkey_fails_as_the_general_path() -> None:
    """A bad L_Key: post_one completes the WQE as the general path does, with a local
    protection error and moves the QP to the error state (IBA 10.8.3)."""
    runs = []
    for enabled in (False, True):
        with fast(enabled):
            runs.append(_one_packet_run(ONE_PACKET_OPS[:1] + ONE_PACKET_OPS[-1:]))
    assert runs[0] == runs[1]
    statuses = [w[1] for w in runs[1]["wcs"]]
    assert e.IBV_WC_LOC_PROT_ERR in statuses and runs[1]["states"][0] == e.IBV_QPS_ERR


@settings(max_examples=examples(10), deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(st.sampled_from(ONE_PACKET_OPS[:-1]), min_size=1, max_size=6),
       seed=st.integers(0, 2**16), loss=st.floats(0.0, 0.2), pingpong=st.booleans(),
       cwnd=st.sampled_from([None, 1, 3]))
def test_one_packet_posts_under_loss(ops: list[tuple[int, int, int, str]], seed: int,
                                     loss: float, pingpong: bool, cwnd: int | None) -> None:
    """With loss (retransmission after the ACK timer, go-back-N): the same as the general
    path."""
    runs = []
    for enabled in (False, True):
        with fast(enabled):
            runs.append(_one_packet_run(ops, cwnd=cwnd, pingpong=pingpong, seed=seed,
                                        loss=loss))
    assert runs[0] == runs[1]


class _GroLink:
    """A direct link whose receive brings a whole GRO batch, more than asked for."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.asked: list[int] = []

    def recv_batch(self, max_n: int = 64, readable: bool = False) -> list[int]:
        if max_n < 0:
            raise AssertionError("negative max_n")
        assert readable  # the client's epoll said so (UdpLink.recv_batch)
        self.asked.append(max_n)
        return list(range(self.n))


def test_shared_device_direct_links_take_a_batch_larger_than_asked() -> None:
    """A busy poll asks for one datagram (runtime.progress_nonblocking); a GRO receive
    on the first of a shared device's direct sockets may return several: the next
    socket is then not asked for a negative count (it said "max_n: must be >= 0")."""
    first, second = _GroLink(3), _GroLink(2)
    link = DevdLink.__new__(DevdLink)
    link._closed = False
    link._direct = (first, second)  # type: ignore[assignment]
    link._direct_fds = {10: first, 11: second}  # type: ignore[dict-item]
    link._ep = _BothReady()  # type: ignore[assignment]
    link.counters = {"rx_direct": 0}
    got = link.recv_batch(1)
    assert got == [0, 1, 2] and second.asked == [] and link.counters["rx_direct"] == 3


class _BothReady:
    """The direct path's epoll, saying that both sockets (fds 10, 11) have input."""

    def poll(self, timeout: float = -1) -> list[tuple[int, int]]:
        return [(10, 1), (11, 1)]


@pytest.mark.iba("10.9.3")
def test_a_run_of_middles_after_a_pkey_change_is_not_placed() -> None:
    """What place_middles requires of a MIDDLE is computed when the message starts and
    recomputed when the QP is modified (Responder.want_middles): after the responder's
    P_Key index moves to another key mid-WRITE, a run of MIDDLEs still carrying the old
    P_Key is not placed (IBA 10.9.3: the P_Key must match the QP's)."""
    net = Net(seed=0)
    keys = (0xFFFF, 0xC123)
    a = Endpoint(net.add_port(1, max_mtu=4096, pkeys=keys), size=1 << 16)
    b = Endpoint(net.add_port(2, max_mtu=4096, pkeys=keys), size=1 << 16)
    connect(a, b, mtu=1)  # 256 B payloads
    a.qp.req.cwnd = 64
    a.mr.buf[:8192] = bytes(range(256)) * 32
    a.qp.post_send(SendWQE(1, int(e.IBV_WR_RDMA_WRITE), int(e.IBV_SEND_SIGNALED),
                           [SGE(a.mr.addr, 8192, a.mr.lkey)], remote_addr=b.mr.addr,
                           rkey=b.mr.rkey), 0.0)
    bodies = [memoryview(b"".join(bytes(p) for p in pkt.parts)) for pkt in a.port.take_tx()]
    assert len(bodies) == 32
    meta = RxMeta(a.port.gids[0], b.port.gids[0])
    b.port.receive(bodies[0], meta, 0.0)  # the FIRST: the WRITE is in progress
    assert b.port.receive_run(bodies[1:3], meta) == 2  # MIDDLEs with the QP's P_Key
    b.qp.modify({"pkey_index": 1}, 0.0)
    before = bytes(b.mr.buf[:8192])
    assert b.port.receive_run(bodies[3:8], meta) == 0
    assert bytes(b.mr.buf[:8192]) == before
