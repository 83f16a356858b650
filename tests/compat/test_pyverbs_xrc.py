"""XRC through the pyverbs compatibility layer, as rdma-core's tests use it
(``tests/base.py`` ``XRCResources``, ``utils.xrc_traffic``): ``XRCD`` on a file,
``SRQ(ctx, SrqInitAttrEx(srq_type=IBV_SRQT_XRC))`` and ``get_srq_num``, XRC RECV QPs on
the XRCD and XRC SEND QPs on the PD, the legacy ``set_qp_type_xrc`` and the extended
``wr_set_xrc_srqn`` post-send APIs, and the errno of bad XRC calls."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.ports import free_port

from softrdma.compat.pyverbs import device as d
from softrdma.compat.pyverbs import enums as e
from softrdma.compat.pyverbs.addr import AHAttr, GlobalRoute
from softrdma.compat.pyverbs.cq import CQ
from softrdma.compat.pyverbs.mr import MR
from softrdma.compat.pyverbs.pd import PD
from softrdma.compat.pyverbs.pyverbs_error import PyverbsRDMAError
from softrdma.compat.pyverbs.qp import QP, QPAttr, QPCap, QPEx, QPInitAttrEx
from softrdma.compat.pyverbs.srq import SRQ, SrqInitAttrEx
from softrdma.compat.pyverbs.wr import SGE, RecvWR, SendWR
from softrdma.compat.pyverbs.xrcd import XRCD, XRCDInitAttr
from softrdma.drivers.host import registry

SIZE = 1024
NUM = 20


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    mp = pytest.MonkeyPatch()
    mp.setenv("SOFTRDMA_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    registry.add("pvx0", "lo", "roce", free_port())
    yield "pvx0"
    mp.undo()


class Side:
    """``XRCResources`` of rdma-core's tests/base.py, for one QP pair."""

    def __init__(self, dev: str, tmp: Path, ex: bool) -> None:
        self.ctx = d.Context(name=dev)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 100)
        self.mr = MR(self.pd, SIZE, e.IBV_ACCESS_LOCAL_WRITE)
        self.fd = os.open(tmp / f"xrcd-{id(self)}", os.O_RDONLY | os.O_CREAT,
                          stat.S_IRUSR | stat.S_IRGRP)
        self.xrcd = XRCD(self.ctx, XRCDInitAttr(
            e.IBV_XRCD_INIT_ATTR_FD | e.IBV_XRCD_INIT_ATTR_OFLAGS, os.O_CREAT, self.fd))
        attr = SrqInitAttrEx(max_wr=NUM)
        attr.srq_type = e.IBV_SRQT_XRC
        attr.pd, attr.xrcd, attr.cq = self.pd, self.xrcd, self.cq
        attr.comp_mask = (e.IBV_SRQ_INIT_ATTR_TYPE | e.IBV_SRQ_INIT_ATTR_PD
                          | e.IBV_SRQ_INIT_ATTR_CQ | e.IBV_SRQ_INIT_ATTR_XRCD)
        self.srq = SRQ(self.ctx, attr)
        qa = QPAttr(port_num=1)
        qa.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        self.rqp = QP(self.ctx, QPInitAttrEx(qp_type=e.IBV_QPT_XRC_RECV,
                                             comp_mask=e.IBV_QP_INIT_ATTR_XRCD,
                                             xrcd=self.xrcd), qa)
        init = QPInitAttrEx(qp_type=e.IBV_QPT_XRC_SEND, sq_sig_all=1, pd=self.pd, scq=self.cq,
                            cap=QPCap(max_send_wr=NUM, max_recv_wr=0, max_recv_sge=0),
                            comp_mask=e.IBV_QP_INIT_ATTR_PD | (
                                e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS if ex else 0),
                            send_ops_flags=e.IBV_QP_EX_WITH_SEND_WITH_IMM if ex else 0)
        qa.qp_access_flags = 0
        self.sqp: Any = (QPEx if ex else QP)(self.ctx, init, qa)

    def to_rts(self, peer: Side) -> None:
        gid = self.ctx.query_gid(1, 0)
        a = QPAttr()
        a.max_rd_atomic = a.max_dest_rd_atomic = 1
        a.min_rnr_timer, a.timeout, a.retry_cnt, a.rnr_retry = 12, 14, 7, 7
        a.ah_attr = AHAttr(port_num=1, is_global=True, gr=GlobalRoute(dgid=gid, sgid_index=0))
        a.dest_qp_num, a.rq_psn, a.sq_psn = peer.sqp.qp_num, 0x10, 0x20
        self.rqp.to_rts(a)
        a.dest_qp_num, a.rq_psn, a.sq_psn = peer.rqp.qp_num, 0x20, 0x10
        self.sqp.to_rts(a)

    def close(self) -> None:
        self.ctx.close()
        os.close(self.fd)


def _poll(cq: CQ) -> Any:
    for _ in range(200000):
        n, wcs = cq.poll()
        if n:
            assert wcs[0].status == e.IBV_WC_SUCCESS, wcs[0]
            return wcs[0]
    raise AssertionError("no completion")


@pytest.mark.parametrize("ex", [False, True], ids=["post_send", "wr_api"])
@pytest.mark.iba("9.8.5")
def test_xrc_traffic(dev: str, tmp_path: Path, ex: bool) -> None:
    """``utils.xrc_traffic``: messages both ways, each to the peer's XRC SRQ."""
    a, b = Side(dev, tmp_path, ex), Side(dev, tmp_path, ex)
    try:
        a.to_rts(b)
        b.to_rts(a)
        for s in (a, b):
            assert s.srq.get_srq_num() > 0 and s.sqp.qp_type == e.IBV_QPT_XRC_SEND
            assert s.rqp.qp_type == e.IBV_QPT_XRC_RECV
            for _ in range(NUM):
                s.srq.post_recv(RecvWR(num_sge=1, sg=[SGE(s.mr.buf, SIZE, s.mr.lkey)]))
        for i in range(NUM):
            for src, dst in ((a, b), (b, a)):
                src.mr.write(bytes([i]) * SIZE, SIZE)
                sge = SGE(src.mr.buf, SIZE, src.mr.lkey)
                if ex:
                    src.sqp.wr_start()
                    src.sqp.wr_id = i
                    src.sqp.wr_flags = e.IBV_SEND_SIGNALED
                    src.sqp.wr_send_imm(0x1234)
                    src.sqp.wr_set_xrc_srqn(dst.srq.get_srq_num())
                    src.sqp.wr_set_sge(sge)
                    src.sqp.wr_complete()
                else:
                    wr = SendWR(wr_id=i, num_sge=1, sg=[sge])
                    wr.set_qp_type_xrc(dst.srq.get_srq_num())
                    src.sqp.post_send(wr)
                assert _poll(src.cq).opcode == e.IBV_WC_SEND
                wc = _poll(dst.cq)
                assert wc.opcode == e.IBV_WC_RECV and wc.qp_num == dst.rqp.qp_num
                assert dst.mr.read(SIZE, 0) == bytes([i]) * SIZE
    finally:
        a.close()
        b.close()


def test_xrc_errno(dev: str, tmp_path: Path) -> None:
    ctx = d.Context(name=dev)
    try:
        pd = PD(ctx)
        cq = CQ(ctx, 4)
        xrcd = XRCD(ctx, XRCDInitAttr(e.IBV_XRCD_INIT_ATTR_FD | e.IBV_XRCD_INIT_ATTR_OFLAGS,
                                      os.O_CREAT, -1))
        assert ctx.query_device().device_cap_flags & e.IBV_DEVICE_XRC
        odp = ctx.query_device_ex().odp_caps.xrc_odp_caps
        assert odp & (e.IBV_ODP_SUPPORT_SEND | e.IBV_ODP_SUPPORT_SRQ_RECV) == \
            e.IBV_ODP_SUPPORT_SEND | e.IBV_ODP_SUPPORT_SRQ_RECV
        # an XRC SRQ needs its PD, XRCD and CQ in the mask
        attr = SrqInitAttrEx(max_wr=4)
        attr.srq_type = e.IBV_SRQT_XRC
        attr.pd, attr.xrcd, attr.cq = pd, xrcd, cq
        attr.comp_mask = e.IBV_SRQ_INIT_ATTR_TYPE | e.IBV_SRQ_INIT_ATTR_PD
        with pytest.raises(PyverbsRDMAError) as ei:
            SRQ(ctx, attr)
        assert ei.value.error_code == errno.EINVAL
        # an XRC RECV QP needs its XRCD
        with pytest.raises(PyverbsRDMAError) as ei:
            QP(ctx, QPInitAttrEx(qp_type=e.IBV_QPT_XRC_RECV, comp_mask=e.IBV_QP_INIT_ATTR_PD,
                                 pd=pd))
        assert ei.value.error_code == errno.EINVAL
        # a basic SRQ has no number
        basic = SrqInitAttrEx(max_wr=4)
        basic.pd = pd
        basic.comp_mask = e.IBV_SRQ_INIT_ATTR_PD
        with pytest.raises(PyverbsRDMAError) as ei:
            SRQ(ctx, basic).get_srq_num()
        assert ei.value.error_code == errno.EOPNOTSUPP
        # a file without a domain and no O_CREAT: EINVAL
        fd = os.open(tmp_path / "nodomain", os.O_RDONLY | os.O_CREAT, 0o400)
        try:
            with pytest.raises(PyverbsRDMAError) as ei:
                XRCD(ctx, XRCDInitAttr(e.IBV_XRCD_INIT_ATTR_FD | e.IBV_XRCD_INIT_ATTR_OFLAGS,
                                       0, fd))
            assert ei.value.error_code == errno.EINVAL
        finally:
            os.close(fd)
    finally:
        ctx.close()
