"""ibv_modify_qp rules: the kernel's qp_state_table as encoded in verbs.qp_rules, and the
attribute checks of QP.modify (rxe_qp_chk_attr), on contexts over the in-memory fabric."""

from __future__ import annotations

import errno
import itertools

import pytest

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.errors import InvalidArgument, NotSupported
from softrdma.verbs import qp_rules as R

M = e.ibv_qp_attr_mask
RC, UC, UD = int(e.IBV_QPT_RC), int(e.IBV_QPT_UC), int(e.IBV_QPT_UD)
RESET, INIT, RTR, RTS = 0, 1, 2, 3
SQD, SQE, ERR = 4, 5, 6

# Transcribed by hand from linux drivers/infiniband/core/verbs.c qp_state_table
# (independent of the module's own table): (cur, next, type) -> (required, optional).
KERNEL = {
    (RESET, INIT, UD): (M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT | M.IBV_QP_QKEY, 0),
    (RESET, INIT, RC): (M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT | M.IBV_QP_ACCESS_FLAGS, 0),
    (RESET, INIT, UC): (M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT | M.IBV_QP_ACCESS_FLAGS, 0),
    (INIT, INIT, UD): (0, M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT | M.IBV_QP_QKEY),
    (INIT, RTR, UD): (0, M.IBV_QP_PKEY_INDEX | M.IBV_QP_QKEY),
    (INIT, RTR, UC): (M.IBV_QP_AV | M.IBV_QP_PATH_MTU | M.IBV_QP_DEST_QPN | M.IBV_QP_RQ_PSN,
                      M.IBV_QP_ALT_PATH | M.IBV_QP_ACCESS_FLAGS | M.IBV_QP_PKEY_INDEX),
    (INIT, RTR, RC): (M.IBV_QP_AV | M.IBV_QP_PATH_MTU | M.IBV_QP_DEST_QPN | M.IBV_QP_RQ_PSN
                      | M.IBV_QP_MAX_DEST_RD_ATOMIC | M.IBV_QP_MIN_RNR_TIMER,
                      M.IBV_QP_ALT_PATH | M.IBV_QP_ACCESS_FLAGS | M.IBV_QP_PKEY_INDEX),
    (RTR, RTS, UD): (M.IBV_QP_SQ_PSN, M.IBV_QP_CUR_STATE | M.IBV_QP_QKEY),
    (RTR, RTS, UC): (M.IBV_QP_SQ_PSN, M.IBV_QP_CUR_STATE | M.IBV_QP_ALT_PATH
                     | M.IBV_QP_ACCESS_FLAGS | M.IBV_QP_PATH_MIG_STATE),
    (RTR, RTS, RC): (M.IBV_QP_TIMEOUT | M.IBV_QP_RETRY_CNT | M.IBV_QP_RNR_RETRY | M.IBV_QP_SQ_PSN
                     | M.IBV_QP_MAX_QP_RD_ATOMIC,
                     M.IBV_QP_CUR_STATE | M.IBV_QP_ALT_PATH | M.IBV_QP_ACCESS_FLAGS
                     | M.IBV_QP_MIN_RNR_TIMER | M.IBV_QP_PATH_MIG_STATE),
    (RTS, RTS, RC): (0, M.IBV_QP_CUR_STATE | M.IBV_QP_ACCESS_FLAGS | M.IBV_QP_ALT_PATH
                     | M.IBV_QP_PATH_MIG_STATE | M.IBV_QP_MIN_RNR_TIMER),
    (RTS, SQD, UD): (0, M.IBV_QP_EN_SQD_ASYNC_NOTIFY),
    (SQD, SQD, RC): (0, M.IBV_QP_PORT | M.IBV_QP_AV | M.IBV_QP_TIMEOUT | M.IBV_QP_RETRY_CNT
                     | M.IBV_QP_RNR_RETRY | M.IBV_QP_MAX_QP_RD_ATOMIC
                     | M.IBV_QP_MAX_DEST_RD_ATOMIC | M.IBV_QP_ALT_PATH | M.IBV_QP_ACCESS_FLAGS
                     | M.IBV_QP_PKEY_INDEX | M.IBV_QP_MIN_RNR_TIMER | M.IBV_QP_PATH_MIG_STATE),
    (SQD, SQD, UC): (0, M.IBV_QP_AV | M.IBV_QP_ALT_PATH | M.IBV_QP_ACCESS_FLAGS
                     | M.IBV_QP_PKEY_INDEX | M.IBV_QP_PATH_MIG_STATE),
    (SQE, RTS, UC): (0, M.IBV_QP_CUR_STATE | M.IBV_QP_ACCESS_FLAGS),
    (SQE, RTS, UD): (0, M.IBV_QP_CUR_STATE | M.IBV_QP_QKEY),
    (ERR, RESET, RC): (0, 0),
    (RTS, ERR, UC): (0, 0),
}
# Transitions that are not in the kernel table at all.
ILLEGAL = [(RESET, RTR), (RESET, RTS), (RESET, ERR), (INIT, RTS), (RTR, INIT), (RTS, INIT),
           (RTS, RTR), (ERR, INIT), (ERR, RTS), (SQD, INIT), (SQE, SQD), (RTR, SQD)]


@pytest.mark.parametrize("key", sorted(KERNEL))
@pytest.mark.iba("10.3.1", "11.2.4.2")
def test_table_matches_kernel(key: tuple[int, int, int]) -> None:
    cur, nxt, qpt = key
    req, opt = KERNEL[key]
    assert R.required_mask(cur, nxt, qpt) == req
    assert R.optional_mask(cur, nxt, qpt) == opt


@pytest.mark.iba("10.3.1")
def test_sqe_to_rts_and_illegal_transitions() -> None:
    # the kernel lists no RC attributes for SQE->RTS (an RC QP never is in SQE)
    assert R.modify_is_ok(SQE, RTS, RC, M.IBV_QP_STATE)
    assert not R.modify_is_ok(SQE, RTS, RC, M.IBV_QP_STATE | M.IBV_QP_CUR_STATE)
    assert R.modify_is_ok(SQE, RTS, UC, M.IBV_QP_STATE | M.IBV_QP_CUR_STATE)
    for (cur, nxt), qpt in itertools.product(ILLEGAL, (RC, UC, UD)):
        assert R.rule_for(cur, nxt) is None
        assert not R.modify_is_ok(cur, nxt, qpt, M.IBV_QP_STATE)


@pytest.mark.iba("11.2.4.2")
def test_every_rule_required_optional_forbidden() -> None:
    """For every encoded transition: exactly required passes, one missing required bit
    fails, every optional bit passes, every other standard bit fails."""
    checked = 0
    for cur, row in R.QP_STATE_TABLE.items():
        for nxt, rule in row.items():
            for qpt in (RC, UC, UD):
                req = rule.required.get(qpt, 0)
                opt = rule.optional.get(qpt, 0)
                assert R.modify_is_ok(cur, nxt, qpt, req | M.IBV_QP_STATE)
                for bit in (1 << i for i in range(21)):
                    mask = req | M.IBV_QP_STATE
                    if bit & req:
                        assert not R.modify_is_ok(cur, nxt, qpt, mask & ~bit)
                    elif bit & opt:
                        ok_cur = bit != M.IBV_QP_CUR_STATE or cur in (RTR, RTS, SQD, SQE)
                        assert R.modify_is_ok(cur, nxt, qpt, mask | bit) == ok_cur
                    elif bit != M.IBV_QP_STATE:
                        assert not R.modify_is_ok(cur, nxt, qpt, mask | bit), (cur, nxt, qpt, bit)
                checked += 1
    assert checked >= 40


# ---- QP.modify on a real context ------------------------------------------------------------
@pytest.fixture()
def ctx():
    clock = VirtualClock()
    fab = Fabric(clock)
    c = v.Context(fabric=fab.link("10.1.0.1"))
    peer = v.Context(fabric=fab.link("10.1.0.2"))
    yield c, peer
    c.close()
    peer.close()


def _qp(c: v.Context, qpt: int) -> v.QP:
    pd = v.PD(c)
    cq = v.CQ(c, 8)
    return v.QP(pd, v.QPInitAttr(qpt, scq=cq, rcq=cq, cap=v.QPCap(4, 4, 1, 1, 0)))


def _full_attr(peer: v.Context, dest_qpn: int = 0x11) -> v.QPAttr:
    a = v.QPAttr(port_num=1)
    a.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_LOCAL_WRITE
    a.qkey = 0x11111111
    a.path_mtu = e.IBV_MTU_1024
    a.dest_qp_num = dest_qpn
    a.rq_psn = 100
    a.sq_psn = 200
    a.max_dest_rd_atomic = 4
    a.max_rd_atomic = 4
    a.min_rnr_timer = 12
    a.timeout = 14
    a.retry_cnt = 7
    a.rnr_retry = 7
    a.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=peer.query_gid(1, 0), sgid_index=0))
    return a


@pytest.mark.parametrize("qpt", [RC, UC, UD])
def test_pyverbs_helpers_reach_rts(ctx, qpt: int) -> None:
    c, peer = ctx
    qp = _qp(c, qpt)
    assert qp.qp_state == RESET
    a = _full_attr(peer)
    qp.to_init(a)
    assert qp.qp_state == INIT
    qp.to_rtr(a)
    assert qp.qp_state == RTR
    qp.to_rts(a)
    assert qp.qp_state == RTS
    attr, init = qp.query(0)
    assert attr.qp_state == RTS and init.qp_type == qpt
    assert attr.sq_psn == 200
    if qpt == UD:
        assert attr.qkey == 0x11111111
    else:
        assert attr.dest_qp_num == 0x11
        assert attr.path_mtu == e.IBV_MTU_1024
        assert attr.ah_attr is not None and attr.ah_attr.gr is not None
        assert attr.ah_attr.gr.dgid == peer.query_gid(1, 0)
    if qpt == RC:
        assert attr.timeout == 14 and attr.max_dest_rd_atomic == 4
    # any state -> ERR -> RESET -> INIT again
    qp.modify(v.QPAttr(qp_state=ERR), M.IBV_QP_STATE)
    assert qp.qp_state == ERR
    qp.modify(v.QPAttr(qp_state=RESET), M.IBV_QP_STATE)
    qp.to_init(a)
    assert qp.qp_state == INIT


def test_qp_attr_in_constructor(ctx) -> None:
    c, peer = ctx
    pd = v.PD(c)
    cq = v.CQ(c, 4)
    ud = v.QP(pd, v.QPInitAttr(UD, scq=cq, rcq=cq), v.QPAttr(qkey=5))
    assert ud.qp_state == RTS
    rc = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq), _full_attr(peer))
    assert rc.qp_state == INIT


def _err(fn, argument: str | None = None) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as ei:
        fn()
    assert ei.value.errno == errno.EINVAL
    if argument is not None:
        assert ei.value.argument == argument
    return ei.value


@pytest.mark.iba("11.2.4.2")
def test_illegal_transition_missing_and_forbidden(ctx) -> None:
    c, peer = ctx
    qp = _qp(c, RC)
    a = _full_attr(peer)
    a.qp_state = RTR
    ex = _err(lambda: qp.modify(a, M.IBV_QP_STATE), "attr_mask")
    assert "illegal transition RESET->RTR" in str(ex)
    a.qp_state = INIT
    ex = _err(lambda: qp.modify(a, M.IBV_QP_STATE | M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT))
    assert "requires ACCESS_FLAGS" in str(ex)
    ex = _err(lambda: qp.modify(a, R.required_mask(RESET, INIT, RC) | M.IBV_QP_STATE | M.IBV_QP_QKEY))
    assert "does not allow QKEY" in str(ex)
    assert qp.qp_state == RESET  # nothing applied
    # CUR_STATE from RESET is refused by ib_modify_qp_is_ok
    a.cur_qp_state = RESET
    ex = _err(lambda: qp.modify(a, R.required_mask(RESET, INIT, RC) | M.IBV_QP_STATE | M.IBV_QP_CUR_STATE))
    assert "CUR_STATE" in str(ex)


@pytest.mark.iba("11.2.4.2")
def test_cur_qp_state_mismatch_and_match(ctx) -> None:
    c, peer = ctx
    qp = _qp(c, RC)
    qp.to_rts(_full_attr(peer))
    a = v.QPAttr(qp_state=RTS, cur_qp_state=RTR)
    _err(lambda: qp.modify(a, M.IBV_QP_STATE | M.IBV_QP_CUR_STATE), "qp_attr.cur_qp_state")
    a.cur_qp_state = RTS
    a.min_rnr_timer = 3
    qp.modify(a, M.IBV_QP_STATE | M.IBV_QP_CUR_STATE | M.IBV_QP_MIN_RNR_TIMER)
    assert qp.query()[0].min_rnr_timer == 3


@pytest.mark.parametrize(("field", "value", "argument"), [
    ("timeout", 32, "qp_attr.timeout"),
    ("retry_cnt", 8, "qp_attr.retry_cnt"),
    ("rnr_retry", 8, "qp_attr.rnr_retry"),
    ("max_rd_atomic", 129, "qp_attr.max_rd_atomic"),
])
@pytest.mark.iba("11.2.4.2")
def test_rtr_to_rts_ranges(ctx, field: str, value: int, argument: str) -> None:
    c, peer = ctx
    qp = _qp(c, RC)
    a = _full_attr(peer)
    qp.to_rtr(a)
    setattr(a, field, value)
    _err(lambda: qp.to_rts(a), argument)
    assert qp.qp_state == RTR


@pytest.mark.parametrize(("field", "value", "argument"), [
    ("path_mtu", 6, "qp_attr.path_mtu"),
    ("path_mtu", 0, "qp_attr.path_mtu"),
    ("min_rnr_timer", 32, "qp_attr.min_rnr_timer"),
    ("max_dest_rd_atomic", 129, "qp_attr.max_dest_rd_atomic"),
    ("dest_qp_num", 1 << 24, "qp_attr.dest_qp_num"),
])
@pytest.mark.iba("11.2.4.2")
def test_init_to_rtr_ranges(ctx, field: str, value: int, argument: str) -> None:
    c, peer = ctx
    qp = _qp(c, RC)
    a = _full_attr(peer)
    qp.to_init(a)
    setattr(a, field, value)
    _err(lambda: qp.to_rtr(a), argument)


@pytest.mark.iba("11.2.4.2")
def test_path_mtu_above_active(ctx) -> None:
    c, peer = ctx
    fab = Fabric(VirtualClock())
    small = v.Context(fabric=fab.link("10.9.0.1"))
    try:
        # a 1500-byte netdev: active MTU 1024, like rxe on Ethernet (captures README)
        small.active_mtu = 3
        qp = _qp(small, RC)
        a = _full_attr(peer)
        a.path_mtu = e.IBV_MTU_2048
        ex = _err(lambda: qp.to_rtr(a), "qp_attr.path_mtu")
        assert "active MTU 1024" in str(ex)
        a.path_mtu = e.IBV_MTU_1024
        qp.to_rtr(a)
    finally:
        small.close()


@pytest.mark.iba("11.2.4.2")
def test_port_and_pkey_index(ctx) -> None:
    c, peer = ctx
    qp = _qp(c, RC)
    a = _full_attr(peer)
    a.port_num = 2
    _err(lambda: qp.to_init(a), "qp_attr.port_num")
    a.port_num = 1
    a.pkey_index = 1  # the table has one entry (0xFFFF)
    _err(lambda: qp.to_init(a), "qp_attr.pkey_index")


@pytest.mark.iba("11.2.4.2")
def test_ud_qkey_bit31_allowed_and_psn_masked(ctx) -> None:
    c, peer = ctx
    qp = _qp(c, UD)
    a = v.QPAttr(qkey=0x80010000, sq_psn=0x1234567)
    qp.to_rts(a)
    attr, _ = qp.query()
    assert attr.qkey == 0x80010000
    assert attr.sq_psn == 0x234567


@pytest.mark.iba("11.2.5.3")
def test_address_vector_checks(ctx) -> None:
    c, peer = ctx
    qp = _qp(c, RC)
    a = _full_attr(peer)
    qp.to_init(a)
    a.ah_attr = v.AHAttr(is_global=0, gr=None)
    _err(lambda: qp.to_rtr(a), "qp_attr.ah_attr.is_global")
    a.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=peer.query_gid(1, 0), sgid_index=5))
    with pytest.raises(InvalidArgument) as ei:  # an empty entry: ENODATA, as Linux
        qp.to_rtr(a)
    assert ei.value.errno == errno.ENODATA and "qp_attr.ah_attr.gr.sgid_index" in str(ei.value)
    a.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid="fd00::1", sgid_index=0))
    _err(lambda: qp.to_rtr(a), "qp_attr.ah_attr.gr.dgid")  # IPv6 GID from an IPv4 source
    a.ah_attr = v.AHAttr(port_num=2, gr=v.GlobalRoute(dgid=peer.query_gid(1, 0)))
    _err(lambda: qp.to_rtr(a), "qp_attr.ah_attr.port_num")
    a.ah_attr = None
    _err(lambda: qp.to_rtr(a), "qp_attr.ah_attr")
    assert qp.qp_state == INIT


def test_alt_path_and_nonstandard_bits(ctx) -> None:
    c, peer = ctx
    qp = _qp(c, RC)
    a = _full_attr(peer)
    qp.to_init(a)
    mask = R.required_mask(INIT, RTR, RC) | M.IBV_QP_STATE
    a.qp_state = RTR
    _err(lambda: qp.modify(a, mask | M.IBV_QP_ALT_PATH), "qp_attr.alt_ah_attr")
    with pytest.raises(NotSupported) as ei:
        qp.modify(a, mask | M.IBV_QP_RATE_LIMIT)
    assert ei.value.errno == errno.EOPNOTSUPP
    _err(lambda: qp.modify(a, -1), "attr_mask")


def test_bad_attribute_name() -> None:
    _err(lambda: v.QPAttr(no_such_field=1), "qp_attr.no_such_field")


@pytest.mark.iba("11.2.4.1")
def test_create_qp_checks(ctx) -> None:
    c, peer = ctx
    pd = v.PD(c)
    cq = v.CQ(c, 4)
    other_cq = v.CQ(peer, 4)
    _err(lambda: v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=None)), "init_attr.rcq")
    _err(lambda: v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=other_cq)), "init_attr.rcq")
    _err(lambda: v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, cap=v.QPCap(max_send_wr=0x4001))),
         "init_attr.cap.max_send_wr")
    _err(lambda: v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, cap=v.QPCap(max_send_sge=33))),
         "init_attr.cap.max_send_sge")
    _err(lambda: v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, cap=v.QPCap(max_inline_data=401))),
         "init_attr.cap.max_inline_data")
    _err(lambda: v.QP(pd, v.QPInitAttr(77, scq=cq, rcq=cq)), "init_attr.qp_type")
    with pytest.raises(NotSupported):
        v.QP(pd, v.QPInitAttr(int(e.IBV_QPT_DRIVER), scq=cq, rcq=cq))
    # with an SRQ the receive capacities are not checked (rxe_qp_chk_cap has_srq)
    srq = v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=8)))
    qp = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, srq=srq, cap=v.QPCap(max_recv_wr=1 << 20)))
    assert qp.query()[1].srq is srq


def test_xrc_qps_ignore_what_the_kernel_ignores() -> None:
    """An application's Modify QP on an XRC QP may set bits that type has no use for:
    the kernel removes them before its checks (uverbs ``modify_qp_mask``) and applies
    nothing of them, even out of range. perftest's ``-c XRC`` sets MIN_RNR_TIMER and
    MAX_DEST_RD_ATOMIC on its XRC_SEND QP at INIT -> RTR ("Failed to modify QP to RTR"
    before); a TGT QP ignores MAX_QP_RD_ATOMIC, RETRY_CNT and RNR_RETRY. An RC QP still
    refuses an out-of-range value."""
    fab = Fabric(VirtualClock())
    c = v.Context(fabric=fab.link("10.4.0.1"))
    try:
        gid = c.query_gid(1, 0)
        pd = v.PD(c)
        cq = v.CQ(c, 8)
        ini = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_XRC_SEND, scq=cq, cap=v.QPCap(4, 0, 1, 0)))
        tgt = v.QP(v.XRCD(c), v.QPInitAttr(qp_type=e.IBV_QPT_XRC_RECV))
        valid = dict(max_dest_rd_atomic=4, min_rnr_timer=12, max_rd_atomic=4, retry_cnt=7,
                     rnr_retry=7)
        for qp, ignored, bad in (
                (ini, M.IBV_QP_MAX_DEST_RD_ATOMIC | M.IBV_QP_MIN_RNR_TIMER,
                 dict(max_dest_rd_atomic=1000, min_rnr_timer=99)),
                (tgt, M.IBV_QP_MAX_QP_RD_ATOMIC | M.IBV_QP_RETRY_CNT | M.IBV_QP_RNR_RETRY,
                 dict(max_rd_atomic=1000, retry_cnt=99, rnr_retry=99))):
            assert R.user_mask(qp.qp_type, -1) == -1 & ~int(ignored)
            a = v.QPAttr(qp_access_flags=0, dest_qp_num=0x11, rq_psn=1, sq_psn=2, timeout=14,
                         **{**valid, **bad})
            a.ah_attr = v.AHAttr(is_global=1, gr=v.GlobalRoute(dgid=gid, sgid_index=0),
                                 port_num=1)
            qp.to_init(a)
            for cur, nxt in ((INIT, RTR), (RTR, RTS)):
                a.qp_state = nxt
                qp.modify(a, R.required_mask(cur, nxt, qp.qp_type) | M.IBV_QP_STATE | ignored)
                assert qp.qp_state == nxt
            attr, _ = qp.query(int(M.IBV_QP_MAX_DEST_RD_ATOMIC | M.IBV_QP_MAX_QP_RD_ATOMIC
                                   | M.IBV_QP_MIN_RNR_TIMER | M.IBV_QP_RETRY_CNT))
            assert attr.max_dest_rd_atomic <= 128 and attr.min_rnr_timer <= 31
            assert attr.max_rd_atomic <= 128 and attr.retry_cnt <= 7
        rc = _qp(c, RC)
        a.min_rnr_timer = 99
        a.qp_state = INIT
        rc.to_init(a)
        a.qp_state = RTR
        ex = _err(lambda: rc.modify(a, R.required_mask(INIT, RTR, RC) | M.IBV_QP_STATE),
                  "qp_attr.min_rnr_timer")
        assert "31" in str(ex) and rc.qp_state == INIT
    finally:
        c.close()
