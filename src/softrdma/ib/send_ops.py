"""What the requester sends for each work request opcode (IBA 9.2.1, 9.3, 10.6; rxe_req.c,
rxe_opcode.c).

* :data:`MSG_OPS`: the packets of a SEND or RDMA WRITE message, by position (IBA 9.2.1,
  Table 35); the requester builds their headers (softrdma.ib.requester).
* :func:`send_request`: the one request packet of an RDMA READ (IBA 9.3.3, 9.7.5.1.5), an
  atomic (IBA 9.3.4) or an RDMA Atomic Write.
* :func:`local_operation`: LOCAL_INV and BIND_MW, executed in send queue order without
  a packet (IBA 10.6.5, 10.6.7.2).
* :data:`WC_OPCODE`: the completion opcode of each (IBA 11.4.2.1).
"""

from __future__ import annotations

from ..enums import ibv_wc_opcode as WCO
from ..enums import ibv_wc_status as WCS
from ..enums import ibv_wr_opcode as WRO
from ..seam.memory import gather
from ..seam.types import SendWQE
from ..wire import ib as wib
from ..wire import opcodes as op
from .mw import BindRequest
from .views import QpView

W_WRITE = int(WRO.IBV_WR_RDMA_WRITE)  # plain ints: IntEnum comparisons are slow per WR
W_WRITE_IMM = int(WRO.IBV_WR_RDMA_WRITE_WITH_IMM)
W_SEND = int(WRO.IBV_WR_SEND)
W_SEND_IMM = int(WRO.IBV_WR_SEND_WITH_IMM)
W_READ = int(WRO.IBV_WR_RDMA_READ)
W_CAS = int(WRO.IBV_WR_ATOMIC_CMP_AND_SWP)
W_FAA = int(WRO.IBV_WR_ATOMIC_FETCH_AND_ADD)
W_LOCAL_INV = int(WRO.IBV_WR_LOCAL_INV)
W_SEND_INV = int(WRO.IBV_WR_SEND_WITH_INV)
W_BIND_MW = int(WRO.IBV_WR_BIND_MW)
W_ATOMIC_WRITE = int(WRO.IBV_WR_ATOMIC_WRITE)

WC_OPCODE = {
    W_WRITE: WCO.IBV_WC_RDMA_WRITE, W_WRITE_IMM: WCO.IBV_WC_RDMA_WRITE,
    W_SEND: WCO.IBV_WC_SEND, W_SEND_IMM: WCO.IBV_WC_SEND, W_SEND_INV: WCO.IBV_WC_SEND,
    W_READ: WCO.IBV_WC_RDMA_READ, W_CAS: WCO.IBV_WC_COMP_SWAP, W_FAA: WCO.IBV_WC_FETCH_ADD,
    W_LOCAL_INV: WCO.IBV_WC_LOCAL_INV, W_BIND_MW: WCO.IBV_WC_BIND_MW,
    W_ATOMIC_WRITE: WCO.IBV_WC_ATOMIC_WRITE,
}

# The packets of a SEND or WRITE (IBA 9.2.1, Table 35): WR opcode -> for each position
# in the message (MIDDLE, FIRST, LAST, ONLY: index ``last << 1 | first``) the RC opcode,
# whether the packet carries an RETH (a WRITE's first, IBA 9.3.3), what follows the BTH
# at the end of the message: nothing (0), an ImmDt (1) or an IETH (2) (IBA 9.3.7-9.3.8),
# and whether its Solicited Event bit may be set (a message's last packet; a WRITE's only
# with immediate)
PktOps = tuple[int, bool, int, bool]


def _positions(only: int, first: int, middle: int, last: int, reth: bool,
               after: int) -> tuple[PktOps, PktOps, PktOps, PktOps]:
    se = not reth or after == 1
    return ((middle, False, 0, False), (first, reth, 0, False), (last, False, after, se),
            (only, reth, after, se))


MSG_OPS = {
    W_SEND: _positions(op.RC_SEND_ONLY, op.RC_SEND_FIRST, op.RC_SEND_MIDDLE, op.RC_SEND_LAST,
                       False, 0),
    W_SEND_IMM: _positions(op.RC_SEND_ONLY_IMM, op.RC_SEND_FIRST, op.RC_SEND_MIDDLE,
                           op.RC_SEND_LAST_IMM, False, 1),
    W_SEND_INV: _positions(op.RC_SEND_ONLY_INV, op.RC_SEND_FIRST, op.RC_SEND_MIDDLE,
                           op.RC_SEND_LAST_INV, False, 2),
    W_WRITE: _positions(op.RC_WRITE_ONLY, op.RC_WRITE_FIRST, op.RC_WRITE_MIDDLE,
                        op.RC_WRITE_LAST, True, 0),
    W_WRITE_IMM: _positions(op.RC_WRITE_ONLY_IMM, op.RC_WRITE_FIRST, op.RC_WRITE_MIDDLE,
                            op.RC_WRITE_LAST_IMM, True, 1),
}
# WR opcodes of the one-packet messages ``Requester.post_one`` sends as they are posted
ONE_PACKET = frozenset((W_SEND, W_SEND_IMM, W_WRITE, W_WRITE_IMM))
# WR opcodes that need a responder resource (IBA 9.7.7.1: RDMA READ and the atomics)
RD_ATOMIC = frozenset((W_READ, W_CAS, W_FAA))
Q_KEY_FROM_QP = 0x80000000  # a WR's Q_Key with the high bit set: the QP's own (IBA 10.2.5)


def ud_qkey(wr_qkey: int, own_qkey: int) -> int:
    """The Q_Key a UD SEND's DETH carries (IBA 9.8.3): the work request's, or the QP's own
    ``own_qkey`` when the request's has its high bit set (IBA 10.2.5)."""
    return own_qkey if wr_qkey & Q_KEY_FROM_QP else wr_qkey


def send_request(qp: QpView, wqe: SendWQE) -> None:
    """Queue the request packet of the started ``wqe``, an RDMA READ (from its first
    missing response, IBA 9.7.5.1.5), an atomic (IBA 9.3.4) or an RDMA Atomic Write
    (opcode 0x1D: RETH and the 8 bytes), each with AckReq (IBA 9.7.5.1.1)."""
    o = wqe.opcode
    pkey = qp.pkey
    if o == W_READ:
        got = wqe.read_received
        psn = wqe.first_psn + got // qp.mtu
        hdr = wib.bth(op.RC_READ_REQUEST, pkey, qp.dest_qpn, psn, ackreq=True) + \
            wib.reth(wqe.remote_addr + got, wqe.rkey, wqe.length - got)
        qp.tx([hdr], len(hdr))
    elif o == W_CAS or o == W_FAA:
        opcode = op.RC_CMP_SWAP if o == W_CAS else op.RC_FETCH_ADD
        if o == W_CAS:
            swap_add, compare = wqe.swap, wqe.compare_add
        else:
            swap_add, compare = wqe.compare_add, 0
        hdr = wib.bth(opcode, pkey, qp.dest_qpn, wqe.first_psn, ackreq=True) + \
            wib.atmeth(wqe.remote_addr, wqe.rkey, swap_add, compare)
        qp.tx([hdr], len(hdr))
    else:  # W_ATOMIC_WRITE
        hdr = wib.bth(op.RC_ATOMIC_WRITE, pkey, qp.dest_qpn, wqe.first_psn, ackreq=True) + \
            wib.reth(wqe.remote_addr, wqe.rkey, 8)
        qp.tx([hdr, *gather(wqe.segs or [], 0, 8)], len(hdr) + 8)


def local_operation(qp: QpView, wqe: SendWQE) -> int:
    """Execute LOCAL_INV (invalidate an MR of the QP's PD, IBA 10.6.5) or BIND_MW (bind a
    memory window, IBA 10.6.7.2) at its turn in the send queue; the completion status
    when it fails, 0 when done."""
    if wqe.opcode == W_LOCAL_INV:
        mr = qp.port.lookup_mr(wqe.invalidate_rkey)
        if mr is None or mr.pd is not qp.pd:
            return int(WCS.IBV_WC_MW_BIND_ERR)
        mr.valid = False
        return 0
    bind = wqe.bind
    if not isinstance(bind, BindRequest):
        return int(WCS.IBV_WC_MW_BIND_ERR)
    return bind.execute(qp.port, qp, qp.pd)


__all__ = ["MSG_OPS", "ONE_PACKET", "Q_KEY_FROM_QP", "RD_ATOMIC", "WC_OPCODE", "PktOps",
           "local_operation", "send_request", "ud_qkey"]
