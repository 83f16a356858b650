"""Fuzzing the iWARP receive path and decoders with hypothesis.

Random bytes and mutated valid streams (bytes flipped, cut, inserted, dropped; delivered
in random chunks) go into the engine's receive path in every phase (MPA Request, MPA
Reply, full operation with CRC/markers on and off). Properties: no exception escapes;
the engine never needed its last-resort catch-all (``internal_errors == 0``: every
malformed input is detected by a real check); after the peer's EOF the QP is in ERR
and every posted work request has completed exactly once (no hung QP); whatever the
engine sent back decodes. The wire decoders raise only DecodeError on garbage.
"""

from __future__ import annotations

from collections import Counter

from harness.iwarp import Side
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softrdma import enums as e
from softrdma.errors import DecodeError
from softrdma.iwarp.engine import ConnState, IwarpConn
from softrdma.iwarp.mpa_setup import MpaConfig
from softrdma.wire import ddp, mpa

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Sut:
    """A responder with posted work requests, connected by a real initiator engine whose
    FPDUs (every operation, aimed at the responder's own STags) are kept, not delivered:
    :attr:`stream` is the valid byte stream the tests mutate."""

    def __init__(self, crc: bool, markers: bool) -> None:
        self.side = s = Side("sut")
        self.mr = s.mr(3000)
        self.inv = s.mr(64)
        self.posted = 0
        # two receives for three Sends: the third meets "no buffer"
        for i in range(2):
            s.post_recv(self.mr, 3000, wr_id=100 + i)
            self.posted += 1
        a = Side("peer")
        a.conn = IwarpConn(a.dev, initiator=True, cfg=MpaConfig(crc=crc), qp=a.qp, mss=300)
        s.conn = IwarpConn(s.dev, initiator=False, cfg=MpaConfig(markers=markers))
        s.conn.receive(b"".join(bytes(x) for x in a.conn.pull_tx()))
        assert s.conn.state == ConnState.ACCEPT_WAIT
        s.conn.accept(s.qp)
        self.out = bytearray(b"".join(bytes(x) for x in s.conn.pull_tx()))
        a.conn.receive(bytes(self.out))
        assert a.conn.state == ConnState.RTS
        src = a.mr(3000)
        src.buf[:] = bytes(range(256)) * 11 + bytes(184)
        a.post(e.IBV_WR_SEND, src, 700, wr_id=1)
        a.post(e.IBV_WR_RDMA_WRITE, src, 900, wr_id=2, rkey=self.mr.rkey, raddr=self.mr.addr)
        a.post(e.IBV_WR_RDMA_READ, src, 800, wr_id=3, rkey=self.mr.rkey, raddr=self.mr.addr)
        a.post(e.IBV_WR_SEND_WITH_INV, src, 10, wr_id=4, inv=self.inv.rkey,
               flags=int(e.IBV_SEND_SIGNALED | e.IBV_SEND_SOLICITED))
        a.post(e.IBV_WR_SEND, src, 0, wr_id=5)
        self.stream = b"".join(bytes(x) for x in a.conn.pull_tx())
        self.crc = crc

    def feed(self, data: bytes, cuts: list[int]) -> None:
        conn = self.side.conn
        assert conn is not None
        i = 0
        for c in cuts:
            conn.receive(data[i:i + c])
            i += c
            self.drain()
        conn.receive(data[i:])
        self.drain()

    def drain(self) -> None:
        conn = self.side.conn
        assert conn is not None
        if conn.state == ConnState.RTS and conn.qp is not None and conn.qp.peek_send() is None:
            self.side.post(e.IBV_WR_RDMA_WRITE, self.mr, 5, wr_id=900 + self.posted,
                           rkey=0x1234, raddr=0)
            self.posted += 1
        out = b"".join(bytes(x) for x in conn.pull_tx())
        conn.tx_sent(len(out))
        self.out += out

    def finish(self) -> None:
        conn = self.side.conn
        assert conn is not None
        conn.on_eof()
        self.drain()
        s = self.side
        assert conn.internal_errors == 0, conn.reason
        assert s.qp.state == int(e.IBV_QPS_ERR)
        done = Counter(w.wr_id for w in s.scq + s.rcq)
        assert sum(done.values()) == self.posted and max(done.values()) == 1
        # what it sent decodes: the Reply, then FPDUs (a Terminate at most once, last)
        n = 20 + int.from_bytes(self.out[18:20], "big")
        segs = [ddp.decode_segment(f.ulpdu) for f in
                mpa.FpduDeframer(crc=self.crc, markers=False).feed(bytes(self.out[n:]))]
        terms = [x for x in segs if x.terminate is not None]
        assert len(terms) <= 1 and (not terms or segs[-1] is terms[0])


cuts_st = st.lists(st.integers(1, 200), max_size=12)


@FUZZ
@given(crc=st.booleans(), markers=st.booleans(), data=st.binary(max_size=600), cuts=cuts_st)
def test_random_bytes_in_full_operation(crc: bool, markers: bool, data: bytes,
                                        cuts: list[int]) -> None:
    sut = Sut(crc, markers)
    sut.feed(data, cuts)
    sut.finish()


mutation = st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "cut"]),
                     st.integers(0, 10**6), st.integers(0, 255))


@FUZZ
@given(crc=st.booleans(), markers=st.booleans(), muts=st.lists(mutation, min_size=1, max_size=4),
       cuts=cuts_st)
def test_mutated_valid_streams(crc: bool, markers: bool, muts: list[tuple[str, int, int]],
                               cuts: list[int]) -> None:
    sut = Sut(crc, markers)
    data = bytearray(sut.stream)
    for kind, pos, val in muts:
        if not data:
            break
        i = pos % len(data)
        if kind == "flip":
            data[i] ^= 1 << (val % 8)
        elif kind == "set":
            data[i] = val
        elif kind == "insert":
            data[i:i] = bytes([val]) * (1 + val % 5)
        elif kind == "delete":
            del data[i:i + 1 + val % 7]
        else:
            del data[i:]
    sut.feed(bytes(data), cuts)
    sut.finish()


@FUZZ
@given(data=st.binary(max_size=300), initiator=st.booleans(), cuts=cuts_st)
def test_random_bytes_during_mpa_setup(data: bytes, initiator: bool, cuts: list[int]) -> None:
    s = Side("s")
    s.post_recv(s.mr(64), 64, wr_id=1)
    conn = IwarpConn(s.dev, initiator=initiator, qp=s.qp if initiator else None)
    s.conn = conn
    head = mpa.KEY_REP if initiator else mpa.KEY_REQ
    for blob in (data, head + data):
        i = 0
        for c in cuts:
            conn.receive(blob[i:i + c])
            i += c
        conn.receive(blob[i:])
        if conn.state == ConnState.ACCEPT_WAIT:
            conn.accept(s.qp)
        conn.pull_tx()
    conn.on_eof()
    assert conn.internal_errors == 0
    assert conn.state in (ConnState.FAILED, ConnState.CLOSED)
    if initiator or conn.qp is not None:
        assert s.qp.state == int(e.IBV_QPS_ERR)
        assert [w.wr_id for w in s.rcq] == [1]


@FUZZ
@given(data=st.binary(max_size=120))
def test_wire_decoders_raise_only_decode_error(data: bytes) -> None:
    for fn in (ddp.decode_segment, ddp.decode_ddp, ddp.Terminate.decode,
               ddp.ReadRequest.decode, mpa.decode_mpa_frame):
        try:
            fn(data)
        except DecodeError:
            pass
    p = mpa.MpaFrameParser()
    try:
        p.feed(data)
    except DecodeError:
        pass
    for crc in (False, True):
        for markers in (False, True):
            try:
                mpa.FpduDeframer(crc=crc, markers=markers).feed(data)
            except DecodeError:
                pass
