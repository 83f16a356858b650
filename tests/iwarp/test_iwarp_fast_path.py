"""The fused fast paths of the iWARP data path (softrdma.iwarp.fast_path) against the
general path they stand in for.

* Transmit: :func:`frame_run` gives byte-identical buffers to ``segment`` + ``frame``
  for every message shape, MULPDU and pull limit; an engine with the fused loop sends
  the same byte stream, pull by pull, as one without it.
* Receive: a responder with :func:`write_run` and one without it, fed the same stream
  (RDMA Writes to several STags, Sends, a Send with Invalidate between Writes to the
  STag it invalidates, Read Requests, errors) cut at every boundary or at random
  (hypothesis), end in the same state: registered memory, completions, async events,
  connection state and reason, the Terminate they send (layer, type, code, bytes).
  Mutated streams (a bad CRC, a bad STag, a TO outside the region, a TO that jumps
  within a message) give the same Terminates.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from harness.iwarp import Side, connect_pair, pump
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softrdma import enums as e
from softrdma.iwarp import fast_path, rdmap, rdmap_tx, stag
from softrdma.iwarp.ddp_place import RDMAP_RV, TxMsg, segment
from softrdma.iwarp.engine import ConnState, IwarpConn
from softrdma.iwarp.mpa_setup import MpaConfig
from softrdma.iwarp.mpa_stream import Buf, frame
from softrdma.wire import crc, ddp, mpa
from softrdma.wire.crc import crc32c
from softrdma.wire.crc import crc32c_reg_at as isal_crc32c_reg_at
from softrdma.wire.mpa import FpduEncoder

MB = 1 << 20
OK = int(e.IBV_WC_SUCCESS)


@contextmanager
def seeded_stags(seed: int) -> Iterator[None]:
    """The STag allocator's bits from a seeded generator instead of the OS: the same STags
    every run, so two engines built one after the other are comparable byte for byte."""
    saved = getattr(stag, "os_randbits")  # noqa: B009
    setattr(stag, "os_randbits", random.Random(seed).getrandbits)  # noqa: B010
    try:
        yield
    finally:
        setattr(stag, "os_randbits", saved)  # noqa: B010


def _flat(bufs: list[Buf]) -> bytes:
    return b"".join(bytes(b) for b in bufs)


# --- transmit: frame_run is segment + frame ------------------------------------------------


def _msg(tagged: bool, payload: memoryview, off: int) -> TxMsg:
    if tagged:
        m = TxMsg(int(ddp.RdmapOpcode.RDMA_WRITE), [payload], len(payload), tagged=True,
                  stag=0x12345678, to=(1 << 64) - 700)  # the TO wraps within the message
    else:
        m = TxMsg(int(ddp.RdmapOpcode.SEND_INVALIDATE), [payload], len(payload), tagged=False,
                  rsvdulp=0xCAFEF00D, qn=0, msn=0xFFFFFFFF)
    m.off = off
    return m


def _general_pull(enc: FpduEncoder, msg: TxMsg, mt: int, mu: int, room: int,
                  max_bufs: int) -> tuple[list[Buf], int, bool]:
    """What RdmapTx.pull's loop does for one message without the fused path."""
    out: list[Buf] = []
    total = 0
    last = False
    while total < room and len(out) < max_bufs:
        parts, paylen, last = segment(msg, mt, mu)
        bufs, n = frame(enc, parts, paylen)
        out.extend(bufs)
        total += n
        if last:
            break
    return out, total, last


@settings(max_examples=300, deadline=None)
@given(tagged=st.booleans(), crc=st.booleans(), size=st.integers(1, 5000),
       off_frac=st.floats(0, 0.99), mt=st.integers(1, 1500), mu=st.integers(1, 1500),
       room=st.integers(1, 9000), max_bufs=st.integers(1, 40), start=st.integers(0, 1 << 20),
       writable=st.booleans(), isal=st.booleans())
def test_frame_run_is_byte_identical_to_segment_and_frame(
        tagged: bool, crc: bool, size: int, off_frac: float, mt: int, mu: int, room: int,
        max_bufs: int, start: int, writable: bool, isal: bool) -> None:
    # writable (registered memory) where ISA-L is the faster: the CRC by address (ISA-L);
    # read-only, or the crc32c package the faster: crc32c
    raw = random.Random(size).randbytes(size)
    payload = memoryview(bytearray(raw) if writable else raw)
    off = int(size * off_frac)
    m1, m2 = _msg(tagged, payload, off), _msg(tagged, payload, off)
    e1 = FpduEncoder(crc=crc, markers=False, stream_offset=start)
    e2 = FpduEncoder(crc=crc, markers=False, stream_offset=start)
    assert fast_path.fast_tx_ok(e1, m1)
    fast: list[Buf] = []
    real_at = isal_crc32c_reg_at
    by_address = []

    def at(addr: int, n: int, value: int) -> int:
        by_address.append(n)
        assert real_at is not None
        return real_at(addr, n, value)

    real_choice = getattr(fast_path, "crc32c_by_address")  # noqa: B009
    setattr(fast_path, "crc32c_reg_at", at if real_at is not None else None)  # noqa: B010
    setattr(fast_path, "crc32c_by_address", lambda: isal)  # noqa: B010
    try:
        n1, last1 = fast_path.frame_run(e1, m1, mt, mu, fast, room, max_bufs)
    finally:
        setattr(fast_path, "crc32c_reg_at", real_at)  # noqa: B010
        setattr(fast_path, "crc32c_by_address", real_choice)  # noqa: B010
    # registered (writable) memory: the payload's CRC by address, ISA-L (where it has it
    # and it is the faster)
    assert bool(by_address) == (crc and writable and real_at is not None and isal)
    gen, n2, last2 = _general_pull(e2, m2, mt, mu, room, max_bufs)
    assert [bytes(b) for b in fast] == [bytes(b) for b in gen]  # buffer by buffer
    assert (n1, last1, m1.off, e1.offset) == (n2, last2, m2.off, e2.offset)
    assert n1 == len(_flat(fast))
    # and the wire decoder reads it back
    fp = mpa.FpduDeframer(crc=crc, markers=False).feed(_flat(fast))
    assert sum(len(f.ulpdu) - (14 if tagged else 18) for f in fp) == m1.off - off


def test_fast_tx_refuses_what_it_does_not_cut() -> None:
    enc = FpduEncoder(crc=True, markers=False)
    pay = memoryview(bytes(100))
    assert not fast_path.fast_tx_ok(FpduEncoder(crc=True, markers=True), _msg(True, pay, 0))
    two = TxMsg(0, [pay[:50], pay[50:]], 100, tagged=True)
    assert not fast_path.fast_tx_ok(enc, two)  # a gather list
    assert not fast_path.fast_tx_ok(enc, TxMsg(0, [], 0, tagged=True))  # zero length
    rr = TxMsg(1, [pay], 100, tagged=False, extra=bytes(28))
    assert not fast_path.fast_tx_ok(enc, rr)  # a header extension
    done = _msg(True, pay, 100)
    assert not fast_path.fast_tx_ok(enc, done)


def _sender_stream(monkeypatch: pytest.MonkeyPatch, fast: bool, crc: bool) -> list[bytes]:
    """Every pull of a sender posting a mix of work requests, with or without the fused
    transmit loop."""
    with seeded_stags(1):
        return _sender_pulls(monkeypatch, fast, crc)


def _sender_pulls(monkeypatch: pytest.MonkeyPatch, fast: bool, crc: bool) -> list[bytes]:
    if not fast:
        monkeypatch.setattr(rdmap_tx, "fast_tx_ok", lambda enc, msg: False)
    a, b = Side("a"), Side("b")
    a.conn = IwarpConn(a.dev, initiator=True, cfg=MpaConfig(crc=crc), qp=a.qp, mss=1460)
    b.conn = IwarpConn(b.dev, initiator=False, cfg=MpaConfig(crc=crc))
    b.conn.receive(_flat(a.conn.pull_tx()))
    b.conn.accept(b.qp)
    a.conn.receive(_flat(b.conn.pull_tx()))
    assert a.conn.state == ConnState.RTS
    src = a.mr(300_000, fill=0x5A)
    src.buf[:] = random.Random(7).randbytes(300_000)
    for i, (op, n) in enumerate([(e.IBV_WR_RDMA_WRITE, 200_000), (e.IBV_WR_SEND, 5000),
                                 (e.IBV_WR_RDMA_WRITE, 1), (e.IBV_WR_RDMA_READ, 4000),
                                 (e.IBV_WR_RDMA_WRITE, 0), (e.IBV_WR_SEND, 0),
                                 (e.IBV_WR_RDMA_WRITE, 99_999)]):
        a.post(op, src, n, i, wr_id=i, rkey=0xABCDEF01, raddr=0x10000 + i)
    out = []
    for room, nb in [(1, 1), (5000, 3), (1 << 17, 512), (70_000, 7), (1 << 21, 512)] * 20:
        bufs = a.conn.pull_tx(room, nb)
        if not bufs:
            break
        data = _flat(bufs)
        a.conn.tx_sent(len(data))
        out.append(data)
    monkeypatch.setattr(rdmap_tx, "fast_tx_ok", fast_path.fast_tx_ok)
    return out


@pytest.mark.parametrize("crc", [False, True])
def test_engine_sends_the_same_stream_with_and_without_the_fused_loop(
        monkeypatch: pytest.MonkeyPatch, crc: bool) -> None:
    calls = []
    real = fast_path.frame_run

    def counting(*args: Any) -> tuple[int, bool]:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(rdmap_tx, "frame_run", counting)
    with_fast = _sender_stream(monkeypatch, True, crc)
    assert calls  # the fused loop ran
    without = _sender_stream(monkeypatch, False, crc)
    assert with_fast == without
    assert sum(map(len, with_fast)) > 300_000


# --- receive: write_run is the general path ------------------------------------------------


class Responder:
    """A responder engine with three MRs and three posted receives; ``fast=False``
    disables write_run (the general path takes every FPDU)."""

    def __init__(self, crc: bool, fast: bool, peer: IwarpConn) -> None:
        self.side = s = Side("r")
        self.mrs = [s.mr(70_000), s.mr(4096), s.mr(300)]
        self.inv = self.mrs[2]
        for i in range(3):
            s.post_recv(self.mrs[0], 2000, 60_000, wr_id=100 + i)
        s.conn = IwarpConn(s.dev, initiator=False, cfg=MpaConfig(crc=crc))
        self.fast = fast
        self.fast_taken = 0
        s.conn.receive(_flat(peer.pull_tx()))
        s.conn.accept(s.qp)
        self.reply = _flat(s.conn.pull_tx())
        self.out = bytearray()

    def feed(self, data: bytes | bytearray | memoryview, cuts: list[int]) -> None:
        real = fast_path.write_run

        def counting(*args: Any) -> tuple[int, int, int]:
            k = real(*args)
            self.fast_taken += k[0] > 0
            return k

        def off(*args: Any) -> tuple[int, int, int]:
            return 0, 0, 0

        setattr(rdmap, "write_run", counting if self.fast else off)  # noqa: B010
        try:
            self._feed(data, cuts)
        finally:
            setattr(rdmap, "write_run", real)  # noqa: B010

    def _feed(self, data: bytes | bytearray | memoryview, cuts: list[int]) -> None:
        conn = self.side.conn
        mv = memoryview(data)
        i = 0
        for c in cuts:
            if i >= len(mv):
                break
            conn.receive(mv[i:i + c])
            i += c
            self._drain()
        if i < len(mv):
            conn.receive(mv[i:])
        self._drain()

    def _drain(self) -> None:
        out = _flat(self.side.conn.pull_tx())
        self.side.conn.tx_sent(len(out))
        self.out += out

    def state(self) -> dict[str, Any]:
        s = self.side
        conn = s.conn
        return {
            "mrs": [bytes(m.buf) for m in self.mrs],
            "valid": [m.valid for m in self.mrs],
            "rcq": [(w.wr_id, w.status, w.byte_len, w.invalidated_rkey) for w in s.rcq],
            "scq": [(w.wr_id, w.status) for w in s.scq],
            "events": [ev.type for ev in s.events],
            "conn": (conn.state, conn.reason, conn.want_close),
            "term": None if conn.fault is None else conn.fault.terminate().encode(),
            "out": bytes(self.out),
            "qp": s.qp.state,
            "rx_msn": list(conn.rdmap.ddp.rx_msn),
        }


def _initiator(crc: bool, mss: int = 1460) -> tuple[Side, IwarpConn]:
    a = Side("i")
    a.conn = IwarpConn(a.dev, initiator=True, cfg=MpaConfig(crc=crc), qp=a.qp, mss=mss)
    return a, a.conn


def _stream(crc: bool, mss: int, rkeys: list[tuple[int, int]], inv: int,
            reply: bytes, a: Side, cross_end: bool = False) -> bytes:
    """The initiator's FPDUs after the MPA exchange: Writes to each region (several
    segments, a TO that wraps nowhere, the end of a region), Sends, a Send with
    Invalidate of the third region, then a Write to it (refused), a Read."""
    a.conn.receive(reply)
    assert a.conn.state == ConnState.RTS
    src = a.mr(80_000)
    src.buf[:] = random.Random(mss).randbytes(80_000)
    (k0, v0), (k1, v1), (k2, v2) = rkeys
    a.post(e.IBV_WR_RDMA_WRITE, src, 9000, 3, wr_id=1, rkey=k0, raddr=v0 + 11)
    a.post(e.IBV_WR_RDMA_WRITE, src, 4096, 5, wr_id=2, rkey=k1, raddr=v1)
    a.post(e.IBV_WR_SEND, src, 1500, 7, wr_id=3)
    a.post(e.IBV_WR_RDMA_WRITE, src, 1, 0, wr_id=4, rkey=k0, raddr=v0 + 69_999)
    a.post(e.IBV_WR_RDMA_WRITE, src, 3000, 9, wr_id=5, rkey=k0, raddr=v0 + 40_000)
    if cross_end:  # contiguous TOs, in bounds for its first segment, past the end later
        a.post(e.IBV_WR_RDMA_WRITE, src, 5000, wr_id=55, rkey=k0, raddr=v0 + 68_000)
    a.post(e.IBV_WR_RDMA_WRITE, src, 300, 1, wr_id=6, rkey=k2, raddr=v2)
    a.post(e.IBV_WR_SEND_WITH_INV, src, 10, wr_id=7, inv=inv)
    a.post(e.IBV_WR_RDMA_WRITE, src, 20_000, 2, wr_id=8, rkey=k0, raddr=v0)
    a.post(e.IBV_WR_RDMA_READ, src, 100, wr_id=9, rkey=k1, raddr=v1)
    a.post(e.IBV_WR_RDMA_WRITE, src, 200, wr_id=10, rkey=k2, raddr=v2)  # invalidated
    a.post(e.IBV_WR_RDMA_WRITE, src, 500, wr_id=11, rkey=k0, raddr=v0 + 100)
    return _flat(a.conn.pull_tx(1 << 22, 1 << 16))


def _pair(crc: bool, mss: int, seed: int,
          cross_end: bool = False) -> Iterator[tuple[Responder, bytes]]:
    """The same responder twice (fast path on, then off) with its stream."""
    for fast in (True, False):
        with seeded_stags(seed):
            a, peer = _initiator(crc, mss)
            r = Responder(crc, fast, peer)
            keys = [(m.rkey, m.addr) for m in r.mrs]
            stream = _stream(crc, mss, keys, r.inv.rkey, r.reply, a, cross_end)
        yield r, stream


def _compare(crc: bool, mss: int, mutate: Any, cuts: list[int], seed: int = 3,
             cross_end: bool = False, writable: bool = False) -> Responder:
    """``writable``: the chunks are views of a bytearray, as the TCP runtime's receive
    buffer; else of bytes."""
    runs = []
    for r, stream in _pair(crc, mss, seed, cross_end):
        mutated = mutate(bytearray(stream))
        data = bytearray(mutated) if writable else bytes(mutated)
        r.feed(data, cuts)
        r.side.conn.on_eof()
        r._drain()
        runs.append(r)
    fast, slow = runs
    assert fast.state() == slow.state()
    return fast


def _same(b: bytearray) -> bytearray:
    return b


@pytest.mark.parametrize("isal", [False, True])
@pytest.mark.parametrize("writable", [False, True])
@pytest.mark.parametrize("crc", [False, True])
@pytest.mark.parametrize("mss", [1460, 9000, 65483])
def test_whole_stream_same_state_and_fast_path_taken(crc: bool, mss: int, writable: bool,
                                                     isal: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real_at = isal_crc32c_reg_at
    by_address: list[int] = []

    def at(addr: int, n: int, value: int) -> int:
        if sys._getframe(1).f_code is fast_path.write_run.__code__:  # not the sender's
            by_address.append(n)
        assert real_at is not None
        return real_at(addr, n, value)

    if real_at is not None:
        monkeypatch.setattr(fast_path, "crc32c_reg_at", at)
    monkeypatch.setattr(fast_path, "crc32c_by_address", lambda: isal)
    r = _compare(crc, mss, _same, [], writable=writable)
    assert r.fast_taken > 0
    # a writable chunk (the runtime's receive buffer): the CRCs of a run by address, ISA-L
    # (where ISA-L is the faster)
    assert bool(by_address) == (crc and writable and real_at is not None and isal)
    st_ = r.state()
    # the Write after the Send with Invalidate met an invalid STag: Terminate, QP in error
    assert st_["valid"][2] is False
    assert st_["term"] is not None
    assert st_["conn"][0] == ConnState.FAILED


def test_every_split_point_gives_the_same_state() -> None:
    """One cut at every octet of the first 30 KB (coalesced and split FPDUs, every
    boundary between and inside headers, payloads, PADs and CRCs)."""
    # build once to know the stream length
    _r, stream = next(_pair(True, 1460, 3))
    for cut in range(1, min(len(stream), 30_000), 7):
        _compare(True, 1460, _same, [cut])
    for cut in range(1, 200):
        _compare(True, 1460, _same, [cut, 1, 2, 3, 4, 5, 6, 7, 8, 1000 - cut])


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
cuts_st = st.lists(st.integers(1, 20_000), max_size=20)


@FUZZ
@given(crc=st.booleans(), mss=st.sampled_from([300, 1460, 16_000, 65483]), cuts=cuts_st,
       writable=st.booleans())
def test_random_cuts_same_state(crc: bool, mss: int, cuts: list[int], writable: bool) -> None:
    _compare(crc, mss, _same, cuts, writable=writable)


mutation = st.tuples(st.sampled_from(["flip", "set", "delete"]), st.integers(0, 10**6),
                     st.integers(0, 255))


@FUZZ
@given(crc=st.booleans(), muts=st.lists(mutation, min_size=1, max_size=3), cuts=cuts_st)
def test_mutated_streams_same_terminate(crc: bool, muts: list[tuple[str, int, int]],
                                        cuts: list[int]) -> None:
    def mutate(data: bytearray) -> bytearray:
        for kind, pos, val in muts:
            i = pos % len(data)
            if kind == "flip":
                data[i] ^= 1 << (val % 8)
            elif kind == "set":
                data[i] = val
            else:
                del data[i:i + 1 + val % 7]
        return data

    _compare(crc, 1460, mutate, cuts)


def _tagged_field(stream: bytes, k: int) -> int:
    """Offset of the k-th tagged FPDU's header (after its ULPDU_Length)."""
    i = 0
    seen = 0
    while i < len(stream):
        ulen = int.from_bytes(stream[i:i + 2])
        if stream[i + 2] & ddp.DDP_T:
            if seen == k:
                return i + 2
            seen += 1
        i += 2 + ulen + (-(2 + ulen) & 3) + 4
    raise AssertionError("no such FPDU")


@pytest.mark.parametrize("writable", [False, True])
@pytest.mark.parametrize("what", ["crc", "stag", "to-outside", "to-jump", "opcode"])
def test_errors_inside_a_run_give_the_general_paths_terminate(what: str, writable: bool) -> None:
    """Corrupt the third tagged FPDU of the first Write (mid-run) in a way each check
    must catch; recompute the CRC so that only the check under test fires."""

    def mutate(data: bytearray) -> bytearray:
        h = _tagged_field(bytes(data), 2)
        ulen = int.from_bytes(data[h - 2:h])
        if what == "crc":
            data[h + 20] ^= 0x40
            return data
        if what == "stag":
            data[h + 2:h + 6] = (int.from_bytes(data[h + 2:h + 6]) ^ 0x100).to_bytes(4)
        elif what == "to-outside":
            data[h + 6:h + 14] = (int.from_bytes(data[h + 6:h + 14]) + (1 << 20)).to_bytes(8)
        elif what == "to-jump":
            data[h + 6:h + 14] = (int.from_bytes(data[h + 6:h + 14]) + 4).to_bytes(8)
        else:
            data[h + 1] = RDMAP_RV | int(ddp.RdmapOpcode.RDMA_READ_RESPONSE)
        end = h + ulen + (-(2 + ulen) & 3)
        data[end:end + 4] = crc32c(bytes(data[h - 2:end])).to_bytes(4, "little")
        return data

    r = _compare(True, 1460, mutate, [], writable=writable)
    st_ = r.state()
    assert st_["term"] is not None and st_["conn"][0] == ConnState.FAILED
    assert r.fast_taken > 0  # the first two FPDUs of the Write went the fast way


@pytest.mark.parametrize("cuts", [[], [5000], [1, 20_000]])
def test_write_running_past_the_region_end_mid_run(cuts: list[int]) -> None:
    """The bounds of later segments of one Write are checked by arithmetic in the run:
    the segment that crosses the region's end gets the general path's Terminate."""
    r = _compare(True, 1460, _same, cuts, cross_end=True)
    st_ = r.state()
    assert st_["term"] is not None and st_["conn"][0] == ConnState.FAILED
    term = ddp.Terminate.decode(st_["term"], 0)
    assert (term.layer, term.etype, term.code) == (
        ddp.TerminateLayer.DDP, ddp.DdpEtype.TAGGED_BUFFER,
        int(ddp.DdpTaggedErrorCode.BASE_OR_BOUNDS_VIOLATION))
    assert r.fast_taken > 0
    assert bytes(r.mrs[0].buf[68_000:70_000]) != bytes(2000)  # the first segment landed


def test_fast_path_off_with_markers_and_while_awaiting_rtr(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    real = fast_path.write_run

    def spy(*args: Any) -> tuple[int, int, int]:
        r = real(*args)
        seen.append(r[0])
        return r

    monkeypatch.setattr(rdmap, "write_run", spy)
    a, b = Side("a"), Side("b")
    connect_pair(a, b, MpaConfig(crc=True, markers=True), MpaConfig(markers=True))
    src, dst = a.mr(50_000, fill=1), b.mr(50_000)
    a.post(e.IBV_WR_RDMA_WRITE, src, 50_000, wr_id=1, rkey=dst.rkey, raddr=dst.addr)
    pump(a, b)
    assert bytes(dst.buf) == bytes(src.buf) and seen == []  # markers: never
    # a responder awaiting the RTR: the Write-type RTR goes through the checks
    rr = b.conn.rdmap
    rr.await_rtr = "write"
    assert rr.fast_run(memoryview(bytes(64)), 0, 64) == 0 and seen == []


def test_crc32c_keeping_the_gil_is_the_same_crc() -> None:
    data = random.Random(3385).randbytes(100_000)
    mv = memoryview(bytearray(data))
    assert crc.crc32c_gil(mv, 0, crc.KEEP_GIL) == crc.crc32c(data) == crc.crc32c_py(data)
    assert crc.crc32c_gil(mv[40_000:], crc.crc32c(mv[:40_000]), crc.KEEP_GIL) == \
        crc.crc32c(data)
    assert crc.crc32c(b"123456789") == 0xE3069283  # RFC 3720 B.4 check value


def test_crc32c_by_address_is_the_same_crc() -> None:
    """ISA-L's CRC-32C by address (the fast paths' on writable memory) is crc32c's."""
    if crc.crc32c_at is None or crc.crc32c_reg_at is None:
        pytest.skip("this isal build does not export crc32_iscsi (crc32c is used)")
    data = bytearray(random.Random(5044).randbytes(100_003))
    base = crc.buffer_address(data)
    assert base is not None
    m = crc.CRC_MASK
    for off, n, value in ((0, 100_003, 0), (1, 65_535, 0), (3, 14, 0x1234_5678),
                          (40_000, 7, 0xFFFF_FFFF), (5, 0, 9)):
        assert crc.crc32c_at(base + off, n, value) == crc.crc32c(data[off:off + n], value)
        assert crc.crc32c_reg_at(base + off, n, value ^ m) ^ m == crc.crc32c_at(base + off, n,
                                                                               value)
    assert crc.buffer_address(memoryview(data)[10:]) == base + 10
    # what has no address the fast paths can use: read-only, empty, strided
    assert crc.buffer_address(bytes(data)) is None
    assert crc.buffer_address(bytearray()) is None
    assert crc.buffer_address(memoryview(data)[::2]) is None


def test_the_crc32c_choice_is_measured_once_or_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """crc32c_by_address: $SOFTRDMA_CRC32C decides (isal: by address where ISA-L exports
    crc32_iscsi; crc32c: never); unset, both are timed and the faster kept; either way
    decided once per process."""
    have = crc.crc32c_reg_at is not None
    assert crc._choose_by_address("isal") is have
    assert crc._choose_by_address("crc32c") is False
    timed: list[str] = []
    real_best = crc._best_ns

    def best_ns(fn: Any, calls: int = 8, rounds: int = 5) -> int:
        timed.append("isal" if not timed else "crc32c")
        real_best(fn, calls, rounds)  # each candidate runs on the 64 KiB buffer
        return {"isal": 5, "crc32c": 9}[timed[-1]]  # ISA-L the faster in this test

    monkeypatch.setattr(crc, "_best_ns", best_ns)
    assert crc._choose_by_address("") is have
    assert timed == (["isal", "crc32c"] if have else [])
    # once per process: the environment is read at the first call only
    monkeypatch.setattr(crc, "_by_address", None)
    monkeypatch.setenv(crc.CRC32C_CHOICE_ENV, "crc32c")
    assert crc.crc32c_by_address() is False
    monkeypatch.setenv(crc.CRC32C_CHOICE_ENV, "isal")
    assert crc.crc32c_by_address() is False
