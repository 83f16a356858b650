"""Bad arguments to the verbs entry points (issue 21 item 8): each raises a softrdma
:class:`~softrdma.errors.InvalidArgument` (EINVAL) naming the argument, never a
``TypeError``/``AttributeError`` and never silent acceptance: ``None`` or a non-WR
posted, ``wr_id`` outside ``__u64``, non-bytes data, out-of-range ``__u32``/``__u64``
fields, bad timeouts. The checks are one helper (softrdma.verbs._args)."""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator

import pytest
from harness.verbs_wr import RC, Pair, _sge

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.errors import InvalidArgument


@pytest.fixture()
def rc() -> Iterator[Pair]:
    p = Pair(RC)
    yield p
    p.close()


def _einval(fn: Callable[[], object], argument: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as ei:
        fn()
    assert ei.value.errno == errno.EINVAL
    assert ei.value.argument == argument
    return ei.value


@pytest.mark.parametrize("data", [None, 5, 1.5, object()])
def test_mr_write_of_non_bytes(rc: Pair, data: object) -> None:
    mr = rc.sides[0][3]
    _einval(lambda: mr.write(data), "data")  # type: ignore[arg-type]
    _einval(lambda: mr.write(b"abc", length=-1), "length")
    mr.write("text", offset=8)  # str: UTF-8, as pyverbs
    assert mr.read(4, 8) == b"text"


@pytest.mark.parametrize("wr", [None, 5, "wr", v.RecvWR(1)])
def test_post_send_of_no_send_wr(rc: Pair, wr: object) -> None:
    qp = rc.sides[0][2]
    _einval(lambda: qp.post_send(wr), "wr")  # type: ignore[arg-type]


@pytest.mark.parametrize("wr", [None, 5, v.SendWR(1)])
def test_post_recv_of_no_recv_wr(rc: Pair, wr: object) -> None:
    pd, _, qp, _ = rc.sides[0]
    _einval(lambda: qp.post_recv(wr), "wr")  # type: ignore[arg-type]
    srq = v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=4)))
    _einval(lambda: srq.post_recv(wr), "wr")  # type: ignore[arg-type]


def test_a_list_posts_the_wrs_before_the_first_bad_element(rc: Pair) -> None:
    """As ``ibv_post_send``'s ``bad_wr``: the WRs before the bad element are posted."""
    _, cqa, qa, ma = rc.sides[0]
    _, cqb, qb, mb = rc.sides[1]
    recvs = [v.RecvWR(10, 1, [_sge(mb, 64)]), v.RecvWR(11, 1, [_sge(mb, 64, 64)]), None]
    err = _einval(lambda: qb.post_recv(recvs), "wr[2]")  # type: ignore[arg-type]
    assert "expected a RecvWR, got NoneType" in str(err)
    _einval(lambda: qa.post_send([v.SendWR(1, sg=[_sge(ma)]), 7]), "wr[1]")  # type: ignore[list-item]
    chained = v.SendWR(2, sg=[_sge(ma)])
    chained.wr_next = 7  # type: ignore[assignment]
    _einval(lambda: qa.post_send(chained), "wr.wr_next")
    rc.clock.run()
    assert [(w.wr_id, w.status) for w in cqa.poll(4)[1]] == [(1, 0), (2, 0)]
    assert [w.wr_id for w in cqb.poll(4)[1]] == [10, 11]


@pytest.mark.parametrize("wr_id", [-1, 1 << 64, None, "1", 1.0])
def test_wr_id_outside_u64(rc: Pair, wr_id: object) -> None:
    _, _, qp, mr = rc.sides[0]
    _einval(lambda: v.SendWR(wr_id), "wr.wr_id")  # type: ignore[arg-type]
    _einval(lambda: v.RecvWR(wr_id), "wr.wr_id")  # type: ignore[arg-type]
    s, r = v.SendWR(1, sg=[_sge(mr)]), v.RecvWR(1, 1, [_sge(mr)])
    s.wr_id = r.wr_id = wr_id  # type: ignore[assignment]
    _einval(lambda: qp.post_send(s), "wr.wr_id")
    _einval(lambda: qp.post_recv(r), "wr.wr_id")
    mw = v.MW(rc.sides[0][0])
    _einval(lambda: qp.bind_mw(mw, v.MWBindInfo(None, 0, 0, 0), wr_id=wr_id),  # type: ignore[arg-type]
            "wr.wr_id")


def test_the_largest_wr_id_completes(rc: Pair) -> None:
    _, cqa, qa, ma = rc.sides[0]
    _, _, qb, mb = rc.sides[1]
    top = (1 << 64) - 1
    qb.post_recv(v.RecvWR(top, 1, [_sge(mb, 64)]))
    qa.post_send(v.SendWR(top, sg=[_sge(ma)]))
    rc.clock.run()
    assert [w.wr_id for w in cqa.poll(2)[1]] == [top]


def test_wr_fields_of_the_wrong_type(rc: Pair) -> None:
    _, _, qp, mr = rc.sides[0]
    w = v.SendWR(1, sg=[_sge(mr)])
    w.opcode = [int(e.IBV_WR_SEND)]  # type: ignore[assignment]
    _einval(lambda: qp.post_send(w), "wr.opcode")
    _einval(lambda: v.SendWR(1, sg=5), "wr.sg")  # type: ignore[arg-type]
    _einval(lambda: v.SendWR(1, num_sge=None), "wr.num_sge")  # type: ignore[arg-type]
    _einval(lambda: v.SendWR(1).set_inline_data(None), "data")  # type: ignore[arg-type]
    w = v.SendWR(1)
    w.set_inline_data(b"ab")
    assert w.inline_data == b"ab"
    w = v.SendWR(1, opcode=int(e.IBV_WR_RDMA_WRITE), sg=[_sge(mr)])
    w.set_wr_rdma(mr.rkey, 1 << 64)
    _einval(lambda: qp.post_send(w), "wr.remote_addr")


def test_mw_bind_info_ranges(rc: Pair) -> None:
    mr = rc.sides[0][3]
    _einval(lambda: v.MWBindInfo(mr, 1 << 64, 8, 0), "bind_info.addr")
    _einval(lambda: v.MWBindInfo(mr, 0, 1 << 64, 0), "bind_info.length")
    _einval(lambda: v.MWBindInfo(mr, 0, 8, 1 << 32), "bind_info.mw_access_flags")
    _einval(lambda: v.MWBindInfo(mr, None, 8, 0), "bind_info.addr")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [None, "x", -1, float("nan")])
def test_progress_and_event_timeouts(rc: Pair, bad: object) -> None:
    ctx = rc.a
    _einval(lambda: ctx.progress(bad), "timeout")  # type: ignore[arg-type]
    if bad is not None:  # None: wait forever
        _einval(lambda: ctx.get_async_event(bad), "timeout")  # type: ignore[arg-type]
        _einval(lambda: v.CompChannel(ctx).get_cq_event(bad), "timeout")  # type: ignore[arg-type]
    _einval(lambda: ctx.ack_async_event(bad), "event")  # type: ignore[arg-type]
    assert ctx.progress(0) >= 0
