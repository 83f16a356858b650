"""``pyverbs.qp``: queue pairs, their attributes and the extended post-send API (IBA
10.2.4, 11.2.4; rdma-core ``pyverbs/qp.pyx`` API).

:class:`QP` is a :class:`softrdma.verbs.QP`. ``QP(pd, QPInitAttr)`` is ``ibv_create_qp``
and ``QP(ctx, QPInitAttrEx)`` is ``ibv_create_qp_ex``. With a ``qp_attr`` the QP is moved
as far towards RTS as pyverbs does (UD to RTS, RC/UC to INIT). Errors carry libibverbs's
errno: an unsupported QP type (RAW_PACKET, XRC without an XRC domain, driver QPs) or
creation flags give EOPNOTSUPP (XRC: ``IBV_QPT_XRC_SEND`` on a PD,
``IBV_QPT_XRC_RECV`` on an XRCD given with ``IBV_QP_INIT_ATTR_XRCD``), out-of-range capacities EINVAL (rxe ``rxe_qp_chk_cap``),
and :meth:`QP.modify` applies the kernel's ``ib_modify_qp_is_ok`` table (EINVAL).

:class:`QPEx` adds the ``ibv_wr_*`` API: ``wr_start``, one call per operation
(``wr_send``, ``wr_rdma_write`` ...), the ``wr_set_*`` setters for the last operation,
and ``wr_complete`` which posts them all (or ``wr_abort``). ``send_ops_flags`` must list
operations the QP type supports (EOPNOTSUPP otherwise, as rxe).
"""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Callable
from typing import Any

from softrdma import verbs as _v
from softrdma.errors import SoftRdmaError
from softrdma.seam.types import SendWQE
from softrdma.verbs.wr import build_send_wqe

from . import libibverbs_enums as e
from ._qp_attrs import (
    ECE,
    DataBuffer,
    QPAttr,
    QPCap,
    QPInitAttr,
    QPInitAttrEx,
    qp_attr_from_verbs,
)
from .addr import AH
from .base import PyverbsCM, inc_rkey, rdma_error
from .device import Context
from .mr import MW, bind_wqe
from .pd import PD
from .pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError
from .utils import qp_state_to_str, qp_type_to_str
from .wr import SGE, RecvWR, SendWR
from .xrcd import XRCD

__all__ = ["QPCap", "QPInitAttr", "QPInitAttrEx", "QPAttr", "QP", "QPEx", "ECE",
           "DataBuffer"]

RC, UC, UD = int(e.IBV_QPT_RC), int(e.IBV_QPT_UC), int(e.IBV_QPT_UD)
XRC_SEND, XRC_RECV = int(e.IBV_QPT_XRC_SEND), int(e.IBV_QPT_XRC_RECV)
_SUPPORTED_QPT = frozenset({RC, UC, UD, XRC_SEND, XRC_RECV})
_KNOWN_QPT = frozenset(int(t) for t in e.ibv_qp_type)
M = e.ibv_qp_attr_mask
_INIT_MASK = {
    RC: M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT | M.IBV_QP_ACCESS_FLAGS,
    UC: M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT | M.IBV_QP_ACCESS_FLAGS,
    UD: M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT | M.IBV_QP_QKEY,
    XRC_SEND: M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT | M.IBV_QP_ACCESS_FLAGS,
    XRC_RECV: M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT | M.IBV_QP_ACCESS_FLAGS,
}
_RTR_MASK = {
    RC: (M.IBV_QP_AV | M.IBV_QP_PATH_MTU | M.IBV_QP_DEST_QPN | M.IBV_QP_RQ_PSN
         | M.IBV_QP_MAX_DEST_RD_ATOMIC | M.IBV_QP_MIN_RNR_TIMER),
    UC: M.IBV_QP_AV | M.IBV_QP_PATH_MTU | M.IBV_QP_DEST_QPN | M.IBV_QP_RQ_PSN,
    UD: 0,
    XRC_SEND: M.IBV_QP_AV | M.IBV_QP_PATH_MTU | M.IBV_QP_DEST_QPN | M.IBV_QP_RQ_PSN,
    XRC_RECV: (M.IBV_QP_AV | M.IBV_QP_PATH_MTU | M.IBV_QP_DEST_QPN | M.IBV_QP_RQ_PSN
               | M.IBV_QP_MAX_DEST_RD_ATOMIC | M.IBV_QP_MIN_RNR_TIMER),
}
_RTS_MASK = {
    RC: (M.IBV_QP_TIMEOUT | M.IBV_QP_RETRY_CNT | M.IBV_QP_RNR_RETRY | M.IBV_QP_SQ_PSN
         | M.IBV_QP_MAX_QP_RD_ATOMIC),
    UC: M.IBV_QP_SQ_PSN,
    UD: M.IBV_QP_SQ_PSN,
    XRC_SEND: (M.IBV_QP_TIMEOUT | M.IBV_QP_RETRY_CNT | M.IBV_QP_RNR_RETRY | M.IBV_QP_SQ_PSN
               | M.IBV_QP_MAX_QP_RD_ATOMIC),
    XRC_RECV: M.IBV_QP_TIMEOUT | M.IBV_QP_SQ_PSN,
}

# ibv_wr_* operations each QP type accepts (rxe's send_ops support, restricted to what the
# softrdma engine executes).
Q = e.ibv_qp_create_send_ops_flags
_SEND_OPS: dict[int, int] = {
    RC: int(Q.IBV_QP_EX_WITH_RDMA_WRITE | Q.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
            | Q.IBV_QP_EX_WITH_SEND | Q.IBV_QP_EX_WITH_SEND_WITH_IMM
            | Q.IBV_QP_EX_WITH_RDMA_READ | Q.IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
            | Q.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | Q.IBV_QP_EX_WITH_LOCAL_INV
            | Q.IBV_QP_EX_WITH_SEND_WITH_INV | Q.IBV_QP_EX_WITH_BIND_MW
            | Q.IBV_QP_EX_WITH_ATOMIC_WRITE),
    UC: int(Q.IBV_QP_EX_WITH_RDMA_WRITE | Q.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
            | Q.IBV_QP_EX_WITH_SEND | Q.IBV_QP_EX_WITH_SEND_WITH_IMM
            | Q.IBV_QP_EX_WITH_SEND_WITH_INV | Q.IBV_QP_EX_WITH_BIND_MW),
    UD: int(Q.IBV_QP_EX_WITH_SEND | Q.IBV_QP_EX_WITH_SEND_WITH_IMM),
}
_SEND_OPS[XRC_SEND] = _SEND_OPS[RC] & ~int(Q.IBV_QP_EX_WITH_ATOMIC_WRITE)
IA = e.ibv_qp_init_attr_mask
_KNOWN_INIT_MASK = sum(int(m) for m in IA)


def _chain(wr: Any, convert: Callable[[Any], Any]) -> list[Any]:
    """``convert`` of each WR of ``wr``'s ``next_wr`` chain, in order."""
    out = []
    w = wr
    while w is not None:
        out.append(convert(w))
        w = w.next_wr
    return out

class QP(_v.QP, PyverbsCM):
    """A queue pair (``ibv_create_qp`` / ``ibv_create_qp_ex``)."""

    def __init__(self, creator: Any, init_attr: Any, qp_attr: QPAttr | None = None) -> None:
        if creator is None or init_attr is None:
            raise PyverbsUserError("QP needs a creator and init attributes")
        if isinstance(creator, Context):
            if not isinstance(init_attr, QPInitAttrEx):
                raise PyverbsUserError("A QP created on a Context needs a QPInitAttrEx")
            pd = self._check_ex(creator, init_attr)
        elif isinstance(creator, PD):
            if not isinstance(init_attr, QPInitAttr) or isinstance(init_attr, QPInitAttrEx):
                raise PyverbsUserError("A QP created on a PD needs a QPInitAttr")
            pd = creator
        else:
            raise PyverbsUserError(f"QP creator must be a PD or a Context, not {type(creator)}")
        qpt = init_attr.qp_type
        if qpt not in _SUPPORTED_QPT:
            code = errno.EOPNOTSUPP if qpt in _KNOWN_QPT else errno.EINVAL
            raise PyverbsRDMAError("Failed to create QP", code)
        if qpt == XRC_RECV:  # an XRC TGT QP has no CQs, queues or PD
            pass
        elif init_attr.scq is None or (init_attr.rcq is None and qpt != XRC_SEND):
            raise PyverbsRDMAError("Failed to create QP", errno.EINVAL)
        c = init_attr._cap
        vinit = _v.QPInitAttr(qpt, init_attr.qp_context, init_attr.scq, init_attr.rcq,
                              init_attr.srq,
                              _v.QPCap(c.max_send_wr, c.max_recv_wr, c.max_send_sge,
                                       c.max_recv_sge, c.max_inline_data),
                              int(init_attr.sq_sig_all))
        try:
            super().__init__(pd, vinit)
        except SoftRdmaError as exc:
            raise rdma_error("Failed to create QP", exc) from exc
        self.context = creator if isinstance(creator, Context) else None
        if qp_attr is not None:
            if qpt == UD:
                self.to_rts(qp_attr)
            else:
                self.to_init(qp_attr)

    @staticmethod
    def _check_ex(ctx: Any, a: QPInitAttrEx) -> Any:
        if a.comp_mask & ~_KNOWN_INIT_MASK:
            raise PyverbsRDMAError("Failed to create QP", errno.EINVAL)
        if a.qp_type == XRC_RECV:
            if not a.comp_mask & IA.IBV_QP_INIT_ATTR_XRCD or not isinstance(a.xrcd, XRCD) \
                    or a.xrcd.ctx is not ctx:
                raise PyverbsRDMAError("Failed to create QP", errno.EINVAL)
            return a.xrcd
        if not a.comp_mask & IA.IBV_QP_INIT_ATTR_PD or not isinstance(a.pd, PD):
            raise PyverbsRDMAError("Failed to create QP", errno.EINVAL)
        if a.pd.ctx is not ctx:
            raise PyverbsRDMAError("Failed to create QP", errno.EINVAL)
        if a.comp_mask & IA.IBV_QP_INIT_ATTR_CREATE_FLAGS and a.create_flags:
            raise PyverbsRDMAError("Failed to create QP", errno.EOPNOTSUPP)
        if a.comp_mask & (IA.IBV_QP_INIT_ATTR_MAX_TSO_HEADER | IA.IBV_QP_INIT_ATTR_IND_TABLE
                          | IA.IBV_QP_INIT_ATTR_RX_HASH):
            raise PyverbsRDMAError("Failed to create QP", errno.EOPNOTSUPP)
        if a.comp_mask & IA.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS:
            ops = int(a.send_ops_flags)
            if ops & ~_SEND_OPS.get(int(a.qp_type), 0):
                raise PyverbsRDMAError("Failed to create QP", errno.EOPNOTSUPP)
        return a.pd

    # ---- state transitions -----------------------------------------------------------------
    def _mask(self, table: dict[int, Any]) -> int:
        return int(table[self.qp_type]) | int(M.IBV_QP_STATE)

    def to_init(self, qp_attr: QPAttr) -> None:  # type: ignore[override]
        """-> INIT with the attributes pyverbs sends for this QP type."""
        qp_attr.qp_state = int(e.IBV_QPS_INIT)
        self._modify(qp_attr, self._mask(_INIT_MASK), "Failed to modify QP state to init")

    def to_rtr(self, qp_attr: QPAttr) -> None:  # type: ignore[override]
        """-> RTR (through INIT unless already there)."""
        if self.qp_state != e.IBV_QPS_INIT:
            self.to_init(qp_attr)
        qp_attr.qp_state = int(e.IBV_QPS_RTR)
        self._modify(qp_attr, self._mask(_RTR_MASK), "Failed to modify QP state to RTR")

    def to_rts(self, qp_attr: QPAttr) -> None:  # type: ignore[override]
        """-> RTS (through INIT and RTR unless already in RTR)."""
        if self.qp_state != e.IBV_QPS_RTR:
            self.to_rtr(qp_attr)
        qp_attr.qp_state = int(e.IBV_QPS_RTS)
        self._modify(qp_attr, self._mask(_RTS_MASK), "Failed to modify QP state to RTS")

    def _modify(self, qp_attr: QPAttr, mask: int, msg: str) -> None:
        if not isinstance(qp_attr, QPAttr):
            raise PyverbsUserError(f"Expected QPAttr, got {type(qp_attr).__name__}")
        try:
            super().modify(qp_attr.to_verbs(mask), int(mask))
        except SoftRdmaError as exc:
            raise rdma_error(msg, exc) from exc
        if mask & M.IBV_QP_STATE and qp_attr.qp_state == e.IBV_QPS_RESET:
            self._clean_cqs()

    def _clean_cqs(self) -> None:
        """Drop this QP's completions still queued in its CQs: a QP moved to RESET
        starts afresh, as the hardware providers' ``modify_qp`` (mlx4/mlx5
        ``*_cq_clean``) makes it."""
        qpn = self.qp_num
        with self._runtime.lock:
            for cq in {self.scq, self.rcq} - {None}:
                q = cq._q
                if any(w.qp_num == qpn for w in q):
                    keep = [w for w in q if w.qp_num != qpn]
                    q.clear()
                    q.extend(keep)

    def modify(self, qp_attr: QPAttr, comp_mask: int) -> None:  # type: ignore[override]
        """``ibv_modify_qp``."""
        self._modify(qp_attr, comp_mask, "Failed to modify QP")

    def query(self, attr_mask: int = 0) -> tuple[QPAttr, QPInitAttr]:  # type: ignore[override]
        """``ibv_query_qp``: every attribute (rxe returns them all) and the init attrs."""
        try:
            va, vi = super().query(attr_mask)
        except SoftRdmaError as exc:
            raise rdma_error("Failed to query QP", exc) from exc
        a = qp_attr_from_verbs(va)
        ic = vi.cap
        init = QPInitAttr(vi.qp_type, vi.qp_context, self.scq, self.rcq, self.srq,
                          QPCap(ic.max_send_wr, ic.max_recv_wr, ic.max_send_sge,
                                ic.max_recv_sge, ic.max_inline_data), vi.sq_sig_all)
        return a, init

    # ---- posting ------------------------------------------------------------------------------
    def post_recv(self, wr: RecvWR, bad_wr: RecvWR | None = None) -> None:  # type: ignore[override]
        """``ibv_post_recv`` (the ``next_wr`` chain)."""
        if not isinstance(wr, RecvWR):
            raise PyverbsUserError(f"Expected RecvWR, got {type(wr).__name__}")
        try:
            super().post_recv(_chain(wr, lambda w: w.to_verbs()))
        except SoftRdmaError as exc:
            raise rdma_error("Failed to post recv", exc) from exc

    def post_send(self, wr: SendWR, bad_wr: SendWR | None = None) -> None:  # type: ignore[override]
        """``ibv_post_send`` (the ``next_wr`` chain)."""
        if not isinstance(wr, SendWR):
            raise PyverbsUserError(f"Expected SendWR, got {type(wr).__name__}")
        self._post(_chain(wr, self._verbs_wr), "Failed to post send")

    def _verbs_wr(self, w: SendWR) -> Any:
        if w.opcode == e.IBV_WR_BIND_MW:
            if w.mw is None:
                raise PyverbsRDMAError("Failed to post send", errno.EINVAL)
            return bind_wqe(w.mw, w.bind_info, w.rkey, w.wr_id, w.send_flags)
        return w.to_verbs()

    def _post(self, wrs: list[Any], msg: str) -> None:
        """Validate and post verbs SendWRs and prebuilt BIND_MW WQEs, in order; the
        requests before a bad one stay posted (``bad_wr``)."""
        self._check()
        wqes: list[SendWQE] = []
        err: Exception | None = None
        for w in wrs:
            try:
                if isinstance(w, SendWQE):  # BIND_MW (RC/UC)
                    if self.qp_type not in (RC, UC):
                        raise PyverbsRDMAError(msg, errno.EINVAL)
                    wqes.append(w)
                else:
                    wqes.append(build_send_wqe(w, self.qp_type, self._max_send_sge,
                                               self._max_inline, self._port, self.pd))
            except (SoftRdmaError, PyverbsError) as exc:
                err = exc
                break
        try:
            if wqes:
                self._runtime.post_send(self.engine, wqes)
        except SoftRdmaError as exc:
            raise rdma_error(msg, exc) from exc
        if isinstance(err, SoftRdmaError):
            raise rdma_error(msg, err) from err
        if err is not None:
            raise err

    # ---- misc -------------------------------------------------------------------------------
    def query_data_in_order(self, op: int, flags: int = 0) -> int:
        """``ibv_query_qp_data_in_order``: 1, softrdma places every message's data in
        order (payload packets are executed in PSN order)."""
        self._check()
        return 1

    def set_ece(self, ece: ECE) -> None:
        """``ibv_set_ece``: a zero vendor id is ignored; otherwise EOPNOTSUPP."""
        if ece.vendor_id == 0:
            return
        raise PyverbsRDMAError("Failed to set ECE", errno.EOPNOTSUPP)

    def query_ece(self) -> ECE:
        raise PyverbsRDMAError("Failed to query ECE", errno.EOPNOTSUPP)

    def bind_mw(self, mw: Any, mw_bind: Any) -> None:  # type: ignore[override]
        """``ibv_bind_mw``: bind a type-1 window (EINVAL for type 2); the window's
        ``rkey`` is its next key from now on (``ibv_inc_rkey``)."""
        if not isinstance(mw, MW) or mw.type != 1:
            raise PyverbsRDMAError("Failed to Bind MW", errno.EINVAL)
        new_key = inc_rkey(mw.rkey)
        wqe = bind_wqe(mw, mw_bind.bind_info, new_key, mw_bind.wr_id, mw_bind.send_flags)
        self._post([wqe], "Failed to Bind MW")
        mw._rkey = new_key

    def close(self) -> None:
        """Destroy the QP (``ibv_destroy_qp``)."""
        _v.QP.close(self)

    def __str__(self) -> str:
        return (f"QP type: {qp_type_to_str(self.qp_type)}, number: {self.qp_num}, state: "
                f"{qp_state_to_str(self.qp_state)}")


class QPEx(QP):
    """A QP with the extended post-send API (``ibv_qp_ex``)."""

    def __init__(self, creator: Any, init_attr: Any, qp_attr: QPAttr | None = None) -> None:
        super().__init__(creator, init_attr, qp_attr)
        self.send_ops_flags = int(getattr(init_attr, "send_ops_flags", 0))
        self.comp_mask = 0
        self.wr_id = 0
        self.wr_flags = 0
        self._pending: list[Any] | None = None
        self._error: PyverbsError | None = None
        self.ind_table = getattr(init_attr, "ind_table", None)

    def _new(self, opcode: int, op_flag: int) -> _v.SendWR | None:
        if self._pending is None:
            raise PyverbsUserError("wr_start() must be called first")
        if not self.send_ops_flags & op_flag and self._error is None:
            self._error = PyverbsRDMAError("ibv_wr_complete failed.", errno.EINVAL)
        w = _v.SendWR(self.wr_id, None, 0, None, opcode, self.wr_flags)
        self._pending.append(w)
        return w

    def _last(self) -> _v.SendWR:
        if not self._pending or not isinstance(self._pending[-1], _v.SendWR):
            raise PyverbsUserError("no work request to set")
        return self._pending[-1]

    def wr_start(self) -> None:
        """Begin a batch (``ibv_wr_start``)."""
        self._pending = []
        self._error = None

    def wr_send(self) -> None:
        self._new(int(e.IBV_WR_SEND), int(Q.IBV_QP_EX_WITH_SEND))

    def wr_send_imm(self, data: int) -> None:
        w = self._new(int(e.IBV_WR_SEND_WITH_IMM), int(Q.IBV_QP_EX_WITH_SEND_WITH_IMM))
        if w is not None:
            w.imm_data = data & 0xFFFFFFFF

    def wr_send_inv(self, invalidate_rkey: int) -> None:
        w = self._new(int(e.IBV_WR_SEND_WITH_INV), int(Q.IBV_QP_EX_WITH_SEND_WITH_INV))
        if w is not None:
            w.invalidate_rkey = invalidate_rkey

    def wr_rdma_write(self, rkey: int, remote_addr: int) -> None:
        w = self._new(int(e.IBV_WR_RDMA_WRITE), int(Q.IBV_QP_EX_WITH_RDMA_WRITE))
        if w is not None:
            w.set_wr_rdma(rkey, remote_addr)

    def wr_rdma_write_imm(self, rkey: int, remote_addr: int, data: int) -> None:
        w = self._new(int(e.IBV_WR_RDMA_WRITE_WITH_IMM),
                      int(Q.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM))
        if w is not None:
            w.set_wr_rdma(rkey, remote_addr)
            w.imm_data = data & 0xFFFFFFFF

    def wr_rdma_read(self, rkey: int, remote_addr: int) -> None:
        w = self._new(int(e.IBV_WR_RDMA_READ), int(Q.IBV_QP_EX_WITH_RDMA_READ))
        if w is not None:
            w.set_wr_rdma(rkey, remote_addr)

    def wr_atomic_cmp_swp(self, rkey: int, remote_addr: int, compare: int, swap: int) -> None:
        w = self._new(int(e.IBV_WR_ATOMIC_CMP_AND_SWP), int(Q.IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP))
        if w is not None:
            w.set_wr_atomic(rkey, remote_addr, compare, swap)

    def wr_atomic_fetch_add(self, rkey: int, remote_addr: int, add: int) -> None:
        w = self._new(int(e.IBV_WR_ATOMIC_FETCH_AND_ADD),
                      int(Q.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD))
        if w is not None:
            w.set_wr_atomic(rkey, remote_addr, add, 0)

    def wr_atomic_write(self, rkey: int, remote_addr: int, atomic_wr: bytes) -> None:
        """RDMA Atomic Write of the first 8 bytes of ``atomic_wr`` (``ibv_wr_atomic_write``)."""
        w = self._new(int(e.IBV_WR_ATOMIC_WRITE), int(Q.IBV_QP_EX_WITH_ATOMIC_WRITE))
        if w is not None:
            w.set_wr_atomic_write(rkey, remote_addr, bytes(atomic_wr)[:8])

    def wr_local_inv(self, invalidate_rkey: int) -> None:
        w = self._new(int(e.IBV_WR_LOCAL_INV), int(Q.IBV_QP_EX_WITH_LOCAL_INV))
        if w is not None:
            w.invalidate_rkey = invalidate_rkey

    def wr_bind_mw(self, mw: Any, rkey: int, bind_info: Any) -> None:
        self._new(int(e.IBV_WR_BIND_MW), int(Q.IBV_QP_EX_WITH_BIND_MW))
        assert self._pending is not None
        self._pending[-1] = bind_wqe(mw, bind_info, rkey, self.wr_id, self.wr_flags)

    def wr_send_tso(self, hdr: int, hdr_sz: int, mss: int) -> None:
        self._new(int(e.IBV_WR_TSO), int(Q.IBV_QP_EX_WITH_TSO))

    def wr_set_ud_addr(self, ah: AH, remote_qpn: int, remote_qkey: int) -> None:
        self._last().set_wr_ud(ah, remote_qpn, remote_qkey)

    def wr_set_xrc_srqn(self, remote_srqn: int) -> None:
        """The remote XRC SRQ of the last operation (``ibv_wr_set_xrc_srqn``)."""
        self._last().set_qp_type_xrc(remote_srqn)

    def wr_set_sge(self, sge: SGE) -> None:
        w = self._last()
        w.sg = [SGE(sge.addr, sge.length, sge.lkey)]

    def wr_set_sge_list(self, num_sge: int, sg_list: list[SGE]) -> None:
        w = self._last()
        w.sg = [SGE(s.addr, s.length, s.lkey) for s in sg_list[:num_sge]]

    def wr_set_inline_data(self, addr: int, length: int) -> None:
        w = self._last()
        w.inline_data = ctypes.string_at(addr, length) if length else b""
        w.send_flags |= int(e.IBV_SEND_INLINE)

    def wr_set_inline_data_list(self, num_buf: int, buf_list: list[DataBuffer]) -> None:
        w = self._last()
        w.inline_data = b"".join(ctypes.string_at(b.addr, b.length) for b in buf_list[:num_buf]
                                 if b.length)
        w.send_flags |= int(e.IBV_SEND_INLINE)

    def wr_complete(self) -> None:
        """Post the batch (``ibv_wr_complete``); nothing is posted if any WR is invalid."""
        pending, self._pending = self._pending, None
        if pending is None:
            raise PyverbsUserError("wr_start() must be called first")
        if self._error is not None:
            raise self._error
        self._post(pending, "ibv_wr_complete failed.")

    def wr_abort(self) -> None:
        """Drop the batch (``ibv_wr_abort``)."""
        self._pending = None

