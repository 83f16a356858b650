"""``QP.set_recv_feed``: receives stored outside ``post_recv`` (softrdma.capi's C receive
ring, seam.queues.RecvFeed) on the in-memory fabric. A producer stores a receive only
while the feed is open and its entries plus the queue's length as last told stay below
the capacity, as shim.c does; the queue takes the entries when it runs empty, and all of
them before a post, a flush or a reset (IBA 11.4.1.2, 10.3.1.7)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness.verbs_pair import RC, FabricPair

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.errors import InvalidArgument, StateError
from softrdma.seam import queues

CAP = 16  # the fabric pair's max_recv_wr
SLOT = 64


class ListFeed:
    """A receive ring with shim.c's producer rules, kept in a list."""

    def __init__(self, cap: int = CAP) -> None:
        self.cap = cap
        self.entries: list[tuple[int, int, int, int]] = []
        self.open = False
        self.qlen = 0
        self.drains: list[tuple[int, int, bool]] = []

    def store(self, wr_id: int, sge: v.SGE) -> bool:
        """``ibv_post_recv``'s fast path: False when the receive must go through Python."""
        if not self.open or len(self.entries) + self.qlen >= self.cap:
            return False
        self.entries.append((wr_id, sge.addr, sge.length, sge.lkey))
        return True

    def drain(self, qlen: int, most: int, close: bool) -> list[tuple[int, int, int, int]]:
        self.drains.append((qlen, most, close))
        n = most or len(self.entries)
        out, self.entries = self.entries[:n], self.entries[n:]
        self.qlen = qlen + len(out)
        if close:
            self.open = False
        return out

    def reopen(self, qlen: int) -> None:
        self.qlen = qlen
        self.open = True


@pytest.fixture()
def fp() -> Iterator[FabricPair]:
    p = FabricPair(RC)
    yield p
    p.close()


def _post(fp: FabricPair, feed: ListFeed, wr_id: int, slot: int) -> bool:
    """Store the receive in the feed, or post it (as shim.c does); True: it was stored."""
    sge = fp.b.sge(SLOT * slot, SLOT)
    if feed.store(wr_id, sge):
        return True
    fp.b.qp.post_recv(v.RecvWR(wr_id, sg=[sge], num_sge=1))
    return False


def _send(fp: FabricPair, n: int) -> list[bytes]:
    payloads = [bytes([0x40 + i]) * SLOT for i in range(n)]
    for i, p in enumerate(payloads):
        fp.a.buf[4096 + SLOT * i:4096 + SLOT * (i + 1)] = p
        fp.a.qp.post_send(v.SendWR(0xA0 + i, opcode=int(e.IBV_WR_SEND),
                                   sg=[fp.a.sge(4096 + SLOT * i, SLOT)]))
    fp.run()
    return payloads


def _recvs(fp: FabricPair) -> list[tuple[int, int, int]]:
    got: list[tuple[int, int, int]] = []
    while True:
        n, wcs = fp.b.cq.poll(16)
        if not n:
            return got
        got += [(w.wr_id, int(w.status), w.byte_len) for w in wcs
                if w.opcode == e.IBV_WC_RECV]


def test_fed_receives_land_in_posting_order_with_posts_between(fp: FabricPair) -> None:
    feed = ListFeed()
    fp.b.qp.set_recv_feed(feed)
    assert not _post(fp, feed, 1, 0)  # closed until a post succeeds, which opens it
    assert feed.open and feed.qlen == 1
    assert [_post(fp, feed, i, i - 1) for i in (2, 3, 4)] == [True] * 3
    fp.b.qp.post_recv(v.RecvWR(5, sg=[fp.b.sge(SLOT * 4, SLOT)], num_sge=1))  # two SGEs, say
    assert feed.entries == [] and feed.drains == [(1, 0, False)]  # the stored ones went first
    assert feed.qlen == 5
    assert [_post(fp, feed, i, i - 1) for i in (6, 7)] == [True] * 2
    payloads = _send(fp, 7)
    assert _recvs(fp) == [(i, 0, SLOT) for i in range(1, 8)]
    for i, p in enumerate(payloads):
        assert bytes(fp.b.buf[SLOT * i:SLOT * (i + 1)]) == p


def test_an_empty_queue_takes_a_batch_of_fed_receives(fp: FabricPair,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queues, "FEED_BATCH", 4)
    feed = ListFeed()
    fp.b.qp.set_recv_feed(feed)
    _post(fp, feed, 0, 0)
    assert all(_post(fp, feed, i, i) for i in range(1, 10))
    _send(fp, 2)  # the first takes the posted one, the second four from the feed
    assert _recvs(fp) == [(0, 0, SLOT), (1, 0, SLOT)]
    assert feed.drains == [(0, 4, False)] and len(feed.entries) == 5
    assert feed.qlen == 4  # an upper bound of the queue's 3: the producer stays safe
    _send(fp, 8)
    assert _recvs(fp) == [(i, 0, SLOT) for i in range(2, 10)]


def test_the_producer_never_overfills_the_queue(fp: FabricPair) -> None:
    """Stored and posted receives together: exactly CAP fit, the next is refused with
    the queue's own error, and after receives are used the refill fits exactly again."""
    feed = ListFeed()
    fp.b.qp.set_recv_feed(feed)
    for i in range(CAP):
        _post(fp, feed, i, i % 8)
    with pytest.raises(Exception, match="receive queue full"):
        _post(fp, feed, 99, 0)
    _send(fp, 5)
    assert [w[0] for w in _recvs(fp)] == list(range(5))
    for i in range(5):
        _post(fp, feed, 100 + i, i)
    with pytest.raises(Exception, match="receive queue full"):
        _post(fp, feed, 199, 0)


def test_err_flushes_fed_receives_in_order_and_closes_the_feed(fp: FabricPair) -> None:
    feed = ListFeed()
    fp.b.qp.set_recv_feed(feed)
    for i in range(6):
        _post(fp, feed, i, i)
    assert len(feed.entries) == 5
    fp.b.qp.modify(v.QPAttr(qp_state=int(e.IBV_QPS_ERR)), int(e.IBV_QP_STATE))
    fp.run()
    flush = int(e.IBV_WC_WR_FLUSH_ERR)
    assert _recvs(fp) == [(i, flush, 0) for i in range(6)]
    assert not feed.open and feed.drains[-1][2]
    assert not _post(fp, feed, 50, 0)  # in ERR: through post_recv, flushed at once
    fp.run()
    assert _recvs(fp) == [(50, flush, 0)]
    assert not feed.open


def test_reset_drops_fed_receives_and_refuses_posts_until_init(fp: FabricPair) -> None:
    feed = ListFeed()
    fp.b.qp.set_recv_feed(feed)
    for i in range(4):
        _post(fp, feed, i, i)
    fp.b.qp.modify(v.QPAttr(qp_state=int(e.IBV_QPS_RESET)), int(e.IBV_QP_STATE))
    assert not feed.open and feed.entries == []
    with pytest.raises(StateError, match="RESET"):
        _post(fp, feed, 10, 0)
    fp.b.qp.to_init(v.QPAttr(qkey=1))
    assert not _post(fp, feed, 11, 0) and feed.open and feed.qlen == 1
    fp.b.qp.modify(v.QPAttr(qp_state=int(e.IBV_QPS_ERR)), int(e.IBV_QP_STATE))
    fp.run()
    assert [w[0] for w in _recvs(fp)] == [11]  # none of the receives before the reset


def test_detaching_keeps_the_stored_receives(fp: FabricPair) -> None:
    feed = ListFeed()
    fp.b.qp.set_recv_feed(feed)
    for i in range(3):
        _post(fp, feed, i, i)
    fp.b.qp.set_recv_feed(None)
    assert feed.entries == [] and not feed.open
    _send(fp, 3)
    assert [w[0] for w in _recvs(fp)] == [0, 1, 2]


def test_set_recv_feed_arguments(fp: FabricPair) -> None:
    with pytest.raises(InvalidArgument, match="feed"):
        fp.b.qp.set_recv_feed(object())  # type: ignore[arg-type]
    srq = v.SRQ(fp.b.pd, v.SrqInitAttr(v.SrqAttr(max_wr=8, max_sge=1)))
    qp = v.QP(fp.b.pd, v.QPInitAttr(RC, scq=fp.b.cq, rcq=fp.b.cq, srq=srq,
                                    cap=v.QPCap(4, 0, 1, 1, 0)))
    try:
        with pytest.raises(InvalidArgument, match="qp"):
            qp.set_recv_feed(ListFeed())
    finally:
        qp.close()
        srq.close()


def test_srq_set_recv_feed_arguments(fp: FabricPair) -> None:
    """An SRQ takes a feed (its capacity: the SRQ's max_wr now); an XRC SRQ, whose receives
    the XRC domain's TGT QPs take, refuses one; an object without drain/reopen is refused."""
    from softrdma.verbs.xrcd import XRCD, XrcSRQ
    srq = v.SRQ(fp.b.pd, v.SrqInitAttr(v.SrqAttr(max_wr=8, max_sge=1)))
    xrcd = XRCD(fp.b.ctx)
    xsrq = XrcSRQ(fp.b.pd, xrcd, fp.b.cq, v.SrqInitAttr(v.SrqAttr(max_wr=8, max_sge=1)))
    try:
        with pytest.raises(InvalidArgument, match="feed"):
            srq.set_recv_feed(object())  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="srq"):
            xsrq.set_recv_feed(ListFeed(8))
        feed = ListFeed(8)
        srq.set_recv_feed(feed)
        srq.post_recv(v.RecvWR(1, sg=[fp.b.sge(0, SLOT)], num_sge=1))  # opens the feed
        assert feed.open and feed.qlen == 1
        assert feed.store(2, fp.b.sge(SLOT, SLOT))
        srq.set_recv_feed(None)  # detached: the stored receive is taken in
        assert [w.wr_id for w in srq.engine.q] == [1, 2] and not feed.entries
    finally:
        xsrq.close()
        xrcd.close()
        srq.close()
