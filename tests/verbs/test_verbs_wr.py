"""Work-request validation at post time (rxe_post_send_kernel / validate_send_wr /
post_one_recv) and the errors that are completions instead (bad lkey)."""

from __future__ import annotations

import errno

import pytest
from harness.verbs_wr import RC, UC, UD, Pair, _sge

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.errors import InvalidArgument, NotSupported, ResourceError, StateError

W = e.ibv_wr_opcode


@pytest.fixture()
def rc():
    p = Pair(RC)
    yield p
    p.close()


def _einval(fn, argument: str) -> None:
    with pytest.raises(InvalidArgument) as ei:
        fn()
    assert ei.value.errno == errno.EINVAL
    assert ei.value.argument == argument


def test_sge_field_ranges() -> None:
    _einval(lambda: v.SGE(-1, 1, 1), "sge.addr")
    _einval(lambda: v.SGE(0, 1 << 32, 1), "sge.length")
    _einval(lambda: v.SGE(0, 1, 1 << 32), "sge.lkey")
    _einval(lambda: v.SendWR(1, num_sge=2, sg=[v.SGE(0, 1, 1)]), "wr.num_sge")
    w = v.SendWR(1, sg=[v.SGE(0, 1, 1), v.SGE(8, 1, 1)])  # num_sge 0: all of sg
    assert w.num_sge == 2
    assert v.RecvWR(1, 1, [v.SGE(0, 1, 1), v.SGE(8, 1, 1)]).num_sge == 1  # pyverbs: first n


@pytest.mark.parametrize(("qpt", "opcode"), [
    (UD, W.IBV_WR_RDMA_WRITE), (UD, W.IBV_WR_RDMA_READ), (UD, W.IBV_WR_ATOMIC_FETCH_AND_ADD),
    (UD, W.IBV_WR_SEND_WITH_INV), (UC, W.IBV_WR_RDMA_READ), (UC, W.IBV_WR_ATOMIC_CMP_AND_SWP),
    (UC, W.IBV_WR_LOCAL_INV), (RC, W.IBV_WR_TSO), (RC, 99),
])
@pytest.mark.iba("11.4.1.1")
def test_opcode_not_valid_for_qp_type(qpt: int, opcode: int) -> None:
    p = Pair(qpt)
    try:
        _, _, qp, mr = p.sides[0]
        w = v.SendWR(1, opcode=int(opcode), sg=[_sge(mr)])
        _einval(lambda: qp.post_send(w), "wr.opcode")
    finally:
        p.close()


def test_unimplemented_opcodes(rc: Pair) -> None:
    _, _, qp, mr = rc.sides[0]
    # an Atomic Write takes its 8 bytes from set_wr_atomic_write (ibv_wr_atomic_write) only
    with pytest.raises(NotSupported) as ei:
        qp.post_send(v.SendWR(1, opcode=int(W.IBV_WR_ATOMIC_WRITE), sg=[_sge(mr)]))
    assert ei.value.errno == errno.EOPNOTSUPP
    # BIND_MW is implemented (tests/verbs/test_verbs_mw.py); without a type 2 MW it is EINVAL
    _einval(lambda: qp.post_send(v.SendWR(1, opcode=int(W.IBV_WR_BIND_MW))), "wr.mw")


def test_atomic_write_stores_its_eight_bytes(rc: Pair) -> None:
    """RDMA Atomic Write (IBA 1.5, opcode 0x1D): the 8 bytes land at the aligned remote
    address and nowhere else, the completion is IBV_WC_ATOMIC_WRITE; a bad length, an
    unaligned address, IBV_SEND_INLINE, a UC QP are EINVAL at post."""
    _, cqa, qp, _ = rc.sides[0]
    _, _, _, mrb = rc.sides[1]
    mrb.write(b"\xee" * 32, 32, 0)

    def aw(data: bytes, off: int = 8, flags: int = int(e.IBV_SEND_SIGNALED)) -> v.SendWR:
        w = v.SendWR(7, opcode=int(W.IBV_WR_ATOMIC_WRITE), send_flags=flags)
        w.set_wr_atomic_write(mrb.rkey, mrb.addr + off, data)
        return w

    qp.post_send(aw(b"ABCDEFGH"))
    rc.clock.run()
    n, wcs = cqa.poll(4)
    assert n == 1 and wcs[0].wr_id == 7 and wcs[0].status == e.IBV_WC_SUCCESS
    assert wcs[0].opcode == e.IBV_WC_ATOMIC_WRITE
    assert mrb.read(32, 0) == b"\xee" * 8 + b"ABCDEFGH" + b"\xee" * 16
    _einval(lambda: qp.post_send(aw(b"ABCDEFG")), "wr.atomic_wr")
    _einval(lambda: qp.post_send(aw(b"ABCDEFGH", off=4)), "wr.remote_addr")
    _einval(lambda: qp.post_send(aw(b"ABCDEFGH", flags=int(e.IBV_SEND_INLINE))),
            "wr.send_flags")
    uc = Pair(UC)
    try:
        _einval(lambda: uc.sides[0][2].post_send(aw(b"ABCDEFGH")), "wr.opcode")
    finally:
        uc.close()


@pytest.mark.iba("11.4.1.1")
def test_sge_count_inline_and_atomic_rules(rc: Pair) -> None:
    _, _, qp, mr = rc.sides[0]
    _einval(lambda: qp.post_send(v.SendWR(1, sg=[_sge(mr, 1)] * 3)), "wr.num_sge")
    big = v.SendWR(1, sg=[_sge(mr, 65)], send_flags=int(e.IBV_SEND_INLINE | e.IBV_SEND_SIGNALED))
    _einval(lambda: qp.post_send(big), "wr.sg")
    rd = v.SendWR(1, opcode=int(W.IBV_WR_RDMA_READ), sg=[_sge(mr)], send_flags=int(e.IBV_SEND_INLINE))
    _einval(lambda: qp.post_send(rd), "wr.send_flags")
    at = v.SendWR(1, opcode=int(W.IBV_WR_ATOMIC_FETCH_AND_ADD), sg=[_sge(mr, 4)])
    at.set_wr_atomic(mr.rkey, mr.addr, 1)
    _einval(lambda: qp.post_send(at), "wr.sg")
    at = v.SendWR(1, opcode=int(W.IBV_WR_ATOMIC_FETCH_AND_ADD), sg=[_sge(mr, 8)])
    at.set_wr_atomic(mr.rkey, mr.addr + 4, 1)
    _einval(lambda: qp.post_send(at), "wr.remote_addr")
    w = v.SendWR(1, opcode=int(W.IBV_WR_SEND_WITH_IMM), sg=[_sge(mr)])
    w.imm_data = 1 << 32
    _einval(lambda: qp.post_send(w), "wr.imm_data")
    _einval(lambda: qp.post_send(v.SendWR(1, sg=[_sge(mr)], send_flags=1 << 10)), "wr.send_flags")
    w = v.SendWR(1, opcode=int(W.IBV_WR_RDMA_WRITE), sg=[_sge(mr)])
    w.set_wr_rdma(mr.rkey, -5)
    _einval(lambda: qp.post_send(w), "wr.remote_addr")
    _einval(lambda: qp.post_send(v.RecvWR(1)), "wr")  # type: ignore[arg-type]
    _einval(lambda: qp.post_recv(v.RecvWR(1, 3, [_sge(mr, 1)] * 3)), "wr.num_sge")


def test_ud_needs_ah_of_same_pd() -> None:
    p = Pair(UD)
    try:
        pd, _, qp, mr = p.sides[0]
        _einval(lambda: qp.post_send(v.SendWR(1, sg=[_sge(mr)])), "wr.ah")
        other_pd = v.PD(p.a)
        ah = v.AH(other_pd, v.AHAttr(gr=v.GlobalRoute(dgid=p.b.query_gid(1, 0))))
        w = v.SendWR(1, sg=[_sge(mr)])
        w.set_wr_ud(ah, p.sides[1][2].qp_num, 0x1234)
        _einval(lambda: qp.post_send(w), "wr.ah")
        ah2 = v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid=p.b.query_gid(1, 0))))
        w.set_wr_ud(ah2, 1 << 24, 0x1234)
        _einval(lambda: qp.post_send(w), "wr.remote_qpn")
        for bad_qpn in (-1, "7", 2.0):
            w.set_wr_ud(ah2, 7, 0x1234)
            w.remote_qpn = bad_qpn  # type: ignore[assignment]
            _einval(lambda: qp.post_send(w), "wr.remote_qpn")
        for bad_qkey in (-1, 1 << 32, None):
            w.set_wr_ud(ah2, 7, 0x1234)
            w.remote_qkey = bad_qkey  # type: ignore[assignment]
            _einval(lambda: qp.post_send(w), "wr.remote_qkey")
        w.set_wr_ud(ah2, True, 0x1234)  # an int subclass is taken by its value (pyverbs)
        qp.post_send(w)
        ah2.close()
        w.set_wr_ud(ah2, 7, 0x1234)
        _einval(lambda: qp.post_send(w), "wr.ah")  # closed
    finally:
        p.close()


@pytest.mark.iba("11.4.1.1")
def test_sq_full_is_enomem_and_state_errors(rc: Pair) -> None:
    _, cq, qp, mr = rc.sides[0]
    for i in range(4):  # max_send_wr 4: never progressed, nothing completes
        qp.post_send(v.SendWR(i, sg=[_sge(mr)]))
    with pytest.raises(ResourceError) as ei:
        qp.post_send(v.SendWR(9, sg=[_sge(mr)]))
    assert ei.value.errno == errno.ENOMEM
    pd = v.PD(rc.a)
    fresh = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq))
    with pytest.raises(StateError):  # RESET: rxe returns EINVAL
        fresh.post_send(v.SendWR(1, sg=[_sge(mr)]))
    with pytest.raises(StateError):
        fresh.post_recv(v.RecvWR(1, 1, [_sge(mr)]))


@pytest.mark.iba("11.4.1.1")
def test_chain_posts_prefix_then_raises(rc: Pair) -> None:
    _, cqa, qa, ma = rc.sides[0]
    _, cqb, qb, mb = rc.sides[1]
    qb.post_recv([v.RecvWR(10, 1, [_sge(mb, 64)]), v.RecvWR(11, 1, [_sge(mb, 64, 64)])])
    good = v.SendWR(1, sg=[_sge(ma)])
    bad = v.SendWR(2, opcode=99, sg=[_sge(ma)])
    good.wr_next = bad
    _einval(lambda: qa.post_send(good), "wr.opcode")
    rc.clock.run()
    n, wcs = cqa.poll(4)
    assert [(w.wr_id, w.status) for w in wcs] == [(1, 0)]
    assert [w.wr_id for w in cqb.poll(4)[1]] == [10]


@pytest.mark.iba("10.6.3.1")
def test_unknown_lkey_is_a_completion_error(rc: Pair) -> None:
    _, cq, qp, mr = rc.sides[0]
    qp.post_send(v.SendWR(5, sg=[v.SGE(mr.addr, 8, mr.lkey ^ 0x5A5A)]))
    rc.clock.run()
    n, wcs = cq.poll(4)
    assert n == 1 and wcs[0].wr_id == 5 and wcs[0].status == e.IBV_WC_LOC_PROT_ERR
    assert qp.qp_state == e.IBV_QPS_ERR


@pytest.mark.iba("11.4.1.2", "10.2.9")
def test_post_recv_on_srq_qp(rc: Pair) -> None:
    pd, cq, _, mr = rc.sides[0]
    srq = v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=4)))
    qp = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, srq=srq))
    _einval(lambda: qp.post_recv(v.RecvWR(1, 1, [_sge(mr)])), "qp")


def test_inline_needs_registered_bytes_or_set_inline_data(rc: Pair) -> None:
    _, cqa, qa, ma = rc.sides[0]
    _, cqb, qb, mb = rc.sides[1]
    w = v.SendWR(1, sg=[v.SGE(0x1000, 8, 0)], send_flags=int(e.IBV_SEND_INLINE | e.IBV_SEND_SIGNALED))
    _einval(lambda: qa.post_send(w), "wr.sg")
    qb.post_recv(v.RecvWR(7, 1, [_sge(mb, 64)]))
    ma.write(b"inline!!", 8)
    w = v.SendWR(2, sg=[v.SGE(ma.addr, 8, 0)],  # lkey ignored for inline, as in rxe
                 send_flags=int(e.IBV_SEND_INLINE | e.IBV_SEND_SIGNALED))
    qa.post_send(w)
    ma.write(b"changed!", 8)  # inline data was copied at post time
    rc.clock.run()
    assert cqb.poll()[1][0].byte_len == 8
    assert mb.read(8, 0) == b"inline!!"
    qb.post_recv(v.RecvWR(8, 1, [_sge(mb, 64)]))
    w = v.SendWR(3)
    w.set_inline_data(b"direct")
    qa.post_send(w)
    rc.clock.run()
    assert mb.read(6, 0) == b"direct"
    assert [x.wr_id for x in cqa.poll(4)[1]] == [2, 3]


def test_inline_room_is_at_least_the_sges_bytes() -> None:
    """A QP asked for no inline data still takes as many inline bytes as its send SGEs
    describe (16 each), as Linux rxe's does (rdma_xclient sends 16 inline bytes with
    max_inline_data 0 and one SGE); the actual room is what the QP reports, and one byte
    more is refused."""
    p = Pair(RC, v.QPCap(4, 8, 2, 2, 0))
    try:
        qa = p.sides[0][2]
        _, cqb, qb, mb = p.sides[1]
        assert qa.cap.max_inline_data == 32
        assert qa.query(0)[1].cap.max_inline_data == 32
        qb.post_recv(v.RecvWR(1, 1, [_sge(mb, 64)]))
        w = v.SendWR(1, send_flags=int(e.IBV_SEND_INLINE | e.IBV_SEND_SIGNALED))
        w.set_inline_data(bytes(range(32)))
        qa.post_send(w)
        p.clock.run()
        assert cqb.poll()[1][0].byte_len == 32
        assert mb.read(32, 0) == bytes(range(32))
        w.set_inline_data(bytes(33))
        _einval(lambda: qa.post_send(w), "wr.sg")
        big = Pair(RC, v.QPCap(4, 8, 2, 2, 100))  # asked for more: that is the room
        try:
            assert big.sides[0][2].cap.max_inline_data == 100
        finally:
            big.close()
    finally:
        p.close()


@pytest.mark.iba("10.5.2")
def test_multicast_attach_rules() -> None:
    p = Pair(UD)
    try:
        _, _, qp, _ = p.sides[0]
        port = p.a.port
        mgid = v.GID("::ffff:224.1.2.3")
        qp.attach_mcast(mgid)
        assert qp.engine in port.mcast[mgid.raw]
        _einval(lambda: qp.attach_mcast("::ffff:10.0.0.1"), "gid")  # not a multicast group
        qp.attach_mcast("ff12::1")
        qp.detach_mcast(mgid)
        assert mgid.raw not in port.mcast
        _einval(lambda: qp.detach_mcast(mgid), "gid")
        qp.close()
        assert not port.mcast.get(v.GID("ff12::1").raw)
    finally:
        p.close()
    r = Pair(RC)
    try:
        _einval(lambda: r.sides[0][2].attach_mcast("::ffff:224.1.2.3"), "qp")
    finally:
        r.close()


# ---- a list of WRs built at once (build_recv_wqes / build_send_wqes) --------------------------
def _one_by_one(wrs, build, kind):
    """The reference: :func:`chain`'s walk, :func:`build_*_wqe` per WR."""
    from softrdma.verbs.wr import chain
    out = []
    try:
        for w in chain(wrs, kind):
            out.append(build(w))
    except (InvalidArgument, NotSupported) as exc:
        return out, exc
    return out, None


def _same(got, want) -> None:
    (wqes, err), (ref, ref_err) = got, want
    assert [(q.wr_id, q.length, [(s.addr, s.length, s.lkey) for s in q.sg_list]) for q in wqes] \
        == [(q.wr_id, q.length, [(s.addr, s.length, s.lkey) for s in q.sg_list]) for q in ref]
    assert type(err) is type(ref_err)
    if err is not None:
        assert (err.argument, str(err)) == (ref_err.argument, str(ref_err))


class _SubRecvWR(v.RecvWR):
    __slots__ = ()


def _recv_cases():
    sge = v.SGE(0x1000, 64, 7)
    two = [v.SGE(0x1000, 64, 7), v.SGE(0x2000, 32, 7)]
    three = [*two, v.SGE(0x3000, 16, 7)]
    chained = v.RecvWR(5, 1, [sge], wr_next=v.RecvWR(6, 1, [sge]))
    bad_id = v.RecvWR(3, 1, [sge])
    bad_id.wr_id = -1  # set after the constructor checked it
    return {
        "one": v.RecvWR(1, 1, [sge]),
        "plain list": [v.RecvWR(i, 1, [sge]) for i in range(8)],
        "two SGEs": [v.RecvWR(1, 2, two), v.RecvWR(2, 1, [sge])],
        "empty list": [],
        "no SGE": [v.RecvWR(9, 0, [])],
        "too many SGEs mid-list": [v.RecvWR(1, 1, [sge]), v.RecvWR(2, 3, three),
                                   v.RecvWR(3, 1, [sge])],
        "bad wr_id mid-list": [v.RecvWR(1, 1, [sge]), bad_id, v.RecvWR(4, 1, [sge])],
        "not a WR mid-list": [v.RecvWR(1, 1, [sge]), "wr", v.RecvWR(2, 1, [sge])],
        "a chain in the list": [v.RecvWR(1, 1, [sge]), chained],
        "a subclass": [_SubRecvWR(1, 1, [sge]), v.RecvWR(2, 1, [sge])],
        "a tuple": (v.RecvWR(1, 1, [sge]), v.RecvWR(2, 1, [sge])),
        "a chain": chained,
    }


@pytest.mark.parametrize("case", list(_recv_cases()))
def test_recv_wqes_of_a_list_as_one_by_one(case: str) -> None:
    """``build_recv_wqes`` gives the WQEs and the error of the walk, WR by WR, for every
    shape: the fast path for a plain list must not change what is posted or raised."""
    from softrdma.verbs.wr import build_recv_wqe, build_recv_wqes
    wrs = _recv_cases()[case]
    _same(build_recv_wqes(wrs, 2), _one_by_one(wrs, lambda w: build_recv_wqe(w, 2), v.RecvWR))


def test_send_wqes_of_a_list_as_one_by_one(rc: Pair) -> None:
    """``build_send_wqes`` against the walk: a plain list, a bad WR in the middle (too many
    SGEs, an opcode the QP has not, one softrdma does not implement), a chain."""
    from softrdma.verbs.wr import build_send_wqe, build_send_wqes
    _, _, qp, mr = rc.sides[0]
    sge = _sge(mr, 64)
    args = (qp.qp_type, qp._max_send_sge, qp._max_inline, qp._port, qp.pd)

    def wr(i: int, opcode: int = W.IBV_WR_SEND, n: int = 1) -> v.SendWR:
        return v.SendWR(i, opcode=opcode, sg=[sge] * n)

    cases = [
        [wr(i) for i in range(5)],
        [wr(1), wr(2, n=qp._max_send_sge + 1), wr(3)],
        [wr(1), wr(2, opcode=W.IBV_WR_SEND_WITH_INV), wr(3)],
        [wr(1), wr(2, opcode=W.IBV_WR_TSO)],
        [wr(1), v.SendWR(2, sg=[sge], wr_next=wr(3))],
        [wr(1), None, wr(2)],
        v.SendWR(1, sg=[sge], wr_next=wr(2)),
        [],
    ]
    for wrs in cases:
        _same(build_send_wqes(wrs, *args),
              _one_by_one(wrs, lambda w: build_send_wqe(w, *args), v.SendWR))
