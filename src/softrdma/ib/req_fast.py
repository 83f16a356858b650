"""The requester's UD fast path: a run of UD SENDs, each one packet (IBA 9.8.2), sent in
one loop (:func:`emit_ud_run`), as :meth:`softrdma.ib.requester.Requester.pump` sends
them one WQE at a time.

``pump`` makes the same decisions for every WQE of such a run: no window, no AckReq, no
fence, no static rate, one packet that completes when it is sent (IBA 10.8.3). The loop
takes a WQE only when ``pump`` would send it unchanged: a SEND or SEND with immediate
of at most the path MTU, not yet started, on a QP in RTS whose address vector and the
WQE's address handle have no static rate, with local keys that resolve. It leaves
everything else (a local error, a static rate, the GSI QP) at the cursor for ``pump``,
which then goes on as ever. ``tests/ib/test_ud_send_fast_path.py`` checks that the
packets, PSNs, completions and counters are the same with the fast path on and off.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..enums import ibv_send_flags as SF
from ..seam.memory import resolve_sges
from ..seam.states import RTS
from ..seam.types import PSN_MASK, WQE_DONE, WQE_UNSENT, SendWQE
from ..wire import ib as wib
from ..wire import opcodes as op
from .send_ops import W_SEND, W_SEND_IMM, ud_qkey
from .views import QpView

__all__ = ["emit_ud_run"]

_SEND_SOLICITED = int(SF.IBV_SEND_SOLICITED)  # a plain int: IntFlag '&' is slow per WR


def emit_ud_run(qp: QpView, sq: Sequence[SendWQE], idx: int, psn: int) -> tuple[int, int]:
    """Send the UD SENDs of ``sq`` from the cursor ``idx`` on that
    :meth:`~softrdma.ib.requester.Requester.pump` would send as they are (see the module
    docstring), each as its SEND ONLY packet with a DETH (IBA 9.8.3; ImmDt last, IBA
    9.3.7), numbered from ``psn`` (IBA 9.7.1); stops at the first WQE it does not take.
    Returns the cursor and the next PSN after those it sent, for ``pump``."""
    if qp.state != RTS or qp.qpn == 1 or qp.rate_limit_bps:
        return idx, psn
    n = len(sq)
    mtu = qp.mtu
    mrs = qp.port.mrs
    pd = qp.pd
    pkey = qp.pkey
    qpn = qp.qpn
    own_qkey = qp.qkey
    tx = qp.tx
    bth = wib.bth
    deths: dict[int, bytes] = {}
    while idx < n:
        wqe = sq[idx]
        o = wqe.opcode
        ah = wqe.ah
        length = wqe.length
        if (wqe.state != WQE_UNSENT or (o != W_SEND and o != W_SEND_IMM) or length > mtu
                or ah is None or ah.rate_bps):
            break
        inline = wqe.inline_data
        if inline is not None:
            segs = [memoryview(inline)]
        else:
            got = resolve_sges(mrs, pd, wqe.sg_list, 0)
            if got is None:  # pump fails it (IBV_WC_LOC_PROT_ERR)
                break
            segs = got
        wqe.segs = segs
        # Requester._start: one packet, its PSN (IBA 9.7.1)
        wqe.first_psn = wqe.last_psn = psn
        wqe.npkts = 1
        psn = (psn + 1) & PSN_MASK
        # Requester._send_pkt: SEND ONLY (with immediate) + DETH (IBA 9.8.3)
        qkey = ud_qkey(wqe.remote_qkey, own_qkey)
        deth = deths.get(qkey)
        if deth is None:
            deth = deths[qkey] = wib.deth(qkey, qpn)
        pad = -length & 3
        se = wqe.send_flags & _SEND_SOLICITED != 0
        if o == W_SEND:
            hdr = bth(op.UD_SEND_ONLY, pkey, wqe.remote_qpn, wqe.first_psn, se, pad) + deth
        else:
            hdr = (bth(op.UD_SEND_ONLY_IMM, pkey, wqe.remote_qpn, wqe.first_psn, se, pad)
                   + deth + wib.immdt(wqe.imm_data))
        if not length or not segs:
            parts: list[bytes | bytearray | memoryview] = [hdr]
        else:
            parts = [hdr, *segs]
        if pad:
            parts.append(wib.pad_bytes(length))
        wqe.state = WQE_DONE
        tx(parts, len(hdr) + length + pad, ah)
        idx += 1
    return idx, psn
