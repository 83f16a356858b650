"""A responder under fuzzing: :class:`Sut` (moved from tests/iwarp/test_iwarp_fuzz.py; the
fuzz targets use it too)."""

from __future__ import annotations

from collections import Counter

from harness.iwarp import Side
from softrdma import enums as e
from softrdma.iwarp.engine import ConnState, IwarpConn
from softrdma.iwarp.mpa_setup import MpaConfig
from softrdma.wire import ddp, mpa

__all__ = ["Sut", "MUTATIONS", "mutated", "end_setup"]

#: what :func:`mutated` does to a stream at one place
MUTATIONS = ("flip", "set", "insert", "delete", "cut")


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


def mutated(stream: bytes, muts: list[tuple[str, int, int]]) -> bytes:
    """``stream`` with each ``(kind, pos, val)`` of ``muts`` applied in turn at ``pos``
    (modulo the length then): a bit flipped, a byte set, ``val`` inserted 1-5 times, 1-7
    bytes deleted, or the rest cut (:data:`MUTATIONS`)."""
    data = bytearray(stream)
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
    return bytes(data)


def end_setup(s: Side, initiator: bool) -> None:
    """The peer's EOF during (or right after) MPA setup on ``s.conn``, whose side posted one
    receive (wr_id 1): the connection ends failed or closed, with no internal error; an
    initiator's QP, or an accepted responder's, is in ERR with that receive flushed."""
    conn = s.conn
    assert conn is not None
    conn.on_eof()
    assert conn.internal_errors == 0, conn.reason
    assert conn.state in (ConnState.FAILED, ConnState.CLOSED)
    if initiator or conn.qp is not None:
        assert s.qp.state == int(e.IBV_QPS_ERR)
        assert [w.wr_id for w in s.rcq] == [1]
