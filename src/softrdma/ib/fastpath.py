"""Fast paths of the RC transport: the middle packets of a large message, small SENDs.

Most packets of a 1 MiB RDMA WRITE or SEND at path MTU 4096 are MIDDLE packets (IBA
9.7.1: 254 of 256), and every one of them is the same header with the next PSN: a
BTH with the MIDDLE opcode, no pad, no Solicited Event, the QP's P_Key and destination
QPN, and AckReq by the requester's rule. :func:`emit_middles` sends a run of them in
one tight loop instead of one pass of the requester's general loop per packet (no
opcode dispatch, no window recomputation, no per-packet counter updates): the same
bytes (tests/test_fastpath.py compares them with the general path byte for byte).

:func:`post_one` sends a message of one packet (SEND, SEND with immediate, RDMA WRITE,
RDMA WRITE with immediate up to the path MTU: the ping-pong's message) as soon as it is
posted, with the requester's rules for that case only (PSN, window, AckReq, ACK timer).

On receive, :func:`receive_middles` places a run of in-sequence MIDDLE packets of one
QP (the segments of one coalesced UDP GRO read) in one loop, and :func:`receive_send_only` executes an in-sequence SEND ONLY (the
ping-pong's message) without decoding it into an IBPacket and without the general
responder's layers, with the same checks and the same completion; anything unusual
is left to the general path, which then handles (NAKs, RNR-NAKs, drops) it.

:data:`ENABLED` switches the fast paths off, which the equivalence tests use.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..enums import ibv_send_flags as SF
from ..enums import ibv_wc_flags as WCF
from ..enums import ibv_wc_opcode as WCO
from ..enums import ibv_wc_status as WCS
from ..enums import ibv_wr_opcode as WRO
from ..seam.memory import gather, resolve_sges, scatter
from ..seam.states import QPT_RC, RTR, SQE
from ..seam.types import (
    PSN_MASK,
    WQE_DONE,
    WQE_SENT,
    SendWQE,
    WorkCompletion,
    psn_diff,
)
from ..wire import ib as wib
from ..wire import opcodes as op
from .packet import ICRC_SIZE, TxPacket

if TYPE_CHECKING:
    from .port import Port
    from .qp import EngineQP
    from .requester import Requester
    from .responder import Responder

__all__ = ["ENABLED", "ACKREQ_EVERY", "ACKREQ_BIT", "emit_middles", "post_one",
           "receive_middles", "receive_send_only"]

#: the fast paths are used (tests switch them off to compare with the general path)
ENABLED = True
#: AckReq every N packets of a long message (rxe: RXE_MAX_PKT_PER_ACK)
ACKREQ_EVERY = 32
#: the AckReq bit of the BTH's PSN word (IBA 9.2: A bit)
ACKREQ_BIT = 0x80000000
_BTH_SIZE = wib.BTH.size
_BTH_PACK = wib.BTH.pack
_IMMDT_SIZE = 4
_BTH_SE = 0x80
_ACCESS_LOCAL_WRITE = 1  # IBV_ACCESS_LOCAL_WRITE: a receive buffer must grant it
_WC_WITH_IMM = int(WCF.IBV_WC_WITH_IMM)
_WC_SUCCESS = WCS.IBV_WC_SUCCESS
_WC_RECV = WCO.IBV_WC_RECV
_FENCE = int(SF.IBV_SEND_FENCE)
_SOLICITED = int(SF.IBV_SEND_SOLICITED)
_RETH_PACK = wib.RETH.pack
_U32_PACK = wib.U32.pack
_W1W2_UNPACK = struct.Struct("!II").unpack_from  # BTH words 1 and 2: DestQP, PSN
_PAD = (b"", b"\0", b"\0\0", b"\0\0\0")
# WR opcode -> (ONLY opcode, RETH needed, ImmDt carried): the one-packet messages of post_one
_ONLY = {
    int(WRO.IBV_WR_SEND): (op.RC_SEND_ONLY, False, False),
    int(WRO.IBV_WR_SEND_WITH_IMM): (op.RC_SEND_ONLY_IMM, False, True),
    int(WRO.IBV_WR_RDMA_WRITE): (op.RC_WRITE_ONLY, True, False),
    int(WRO.IBV_WR_RDMA_WRITE_WITH_IMM): (op.RC_WRITE_ONLY_IMM, True, True),
}


def emit_middles(req: Requester, wqe: SendWQE, k: int, head: int, is_write: bool) -> int:
    """Queue the MIDDLE packets of RC ``wqe`` from packet index ``k`` (0 < k < npkts-1)
    up to its last packet (excluded) or the send window's edge; returns the index of
    the next packet to send (IBA 9.7.1, 9.7.5.1.1; the AckReq rule of
    ``Requester._send_pkt``: every :data:`ACKREQ_EVERY` packets and at a full window).

    ``head`` is the oldest unacknowledged PSN: it does not move while packets are
    queued (ACKs are processed between calls), so the window is checked by counting.
    The caller has checked that packet ``k`` fits in the window, so at least one is sent.
    """
    qp = req.qp
    port = qp.port
    av = qp.av
    assert av is not None
    gids = port.gids
    i = av.sgid_index if av.sgid_index < len(gids) else 0
    sgid, dgid, sport = gids[i], av.dgid, qp.sport
    tclass, hop, flow, v1, sl = av.traffic_class, av.hop_limit, av.flow_label, port.gid_v1[i], av.sl
    mtu = qp.mtu
    length = _BTH_SIZE + mtu
    opcode = op.RC_WRITE_MIDDLE if is_write else op.RC_SEND_MIDDLE
    pkey = qp.pkey
    dqpn = qp.dest_qpn
    first_psn = wqe.first_psn
    cwnd = req.cwnd
    end = wqe.npkts - 1
    d = psn_diff((first_psn + k) & PSN_MASK, head)
    segs = wqe.segs or []
    seg = segs[0] if len(segs) == 1 else None
    append = port.tx.append
    off = k * mtu
    start = k
    edge = req.ack_edge
    every = ACKREQ_EVERY
    while k < end and d < cwnd:
        edge = d + 1 >= cwnd
        w2 = (first_psn + k) & PSN_MASK
        if edge or k % every == every - 1:
            w2 |= ACKREQ_BIT
        hdr = _BTH_PACK(opcode, 0, pkey, dqpn, w2)
        if seg is not None:
            parts: list[bytes | bytearray | memoryview] = [hdr, seg[off:off + mtu]]
        else:
            parts = [hdr, *gather(segs, off, mtu)]
        append(TxPacket(sgid, dgid, sport, parts, length, tclass, hop, flow, v1, sl))
        k += 1
        off += mtu
        d += 1
    req.ack_edge = edge
    sent = k - start
    c = port.counters
    c.sent_pkts += sent
    c.sent_bytes += sent * (length + ICRC_SIZE)
    qp.counters.sent_pkts += sent
    return k


def post_one(req: Requester, wqe: SendWQE, now: float) -> bool:
    """Send RC ``wqe``, just posted as the only unsent WQE of an RTS QP, if it is a message
    of one packet (SEND, SEND with immediate, RDMA WRITE, RDMA WRITE with immediate, at
    most the path MTU) that the window admits; returns False, having changed nothing,
    for anything else (``Requester.pump`` then runs).

    The packet, PSN, window edge, ACK timer and WQE state are those of the general path
    (``Requester._start`` and ``_send_pkt``; IBA 9.7.1, 9.7.5.1.1, 9.7.6.1.3): an ONLY
    opcode (IBA 9.2.1), RETH for a WRITE, ImmDt when it has one, the Solicited Event bit
    as asked (a WRITE sets it only with immediate, IBA 9.2.1 SE), AckReq set (the end
    of a message), pad to 4 bytes. The caller checked: RC transport, QP in RTS, no RNR
    wait, not retransmitting, fast paths enabled.
    """
    qp = req.qp
    o = _ONLY.get(wqe.opcode)
    length = wqe.length
    if (o is None or length > qp.mtu or qp.qp_type != QPT_RC or wqe.send_flags & _FENCE
            or wqe.ah is not None):
        return False
    av = qp.av
    if av is None or av.rate_bps or qp.rate_limit_bps:
        return False
    sq = req.sq
    # The window (Requester.pump): the oldest unacknowledged PSN is an older WQE's, or
    # this one's own (distance 0) when nothing older is outstanding.
    head = req._una() if sq[0] is not wqe else None
    psn = req.next_psn
    d = 0 if head is None else psn_diff(psn, head)
    cwnd = req.cwnd
    if d >= cwnd:
        return False
    inline = wqe.inline_data
    if inline is not None:
        segs = [memoryview(inline)]
    else:
        found = resolve_sges(qp.port.mrs, qp.pd, wqe.sg_list, 0)
        if found is None:
            return False  # pump completes it with a local protection error
        segs = found
    opcode, reth, imm = o
    wqe.segs = segs
    wqe.npkts = 1
    wqe.first_psn = wqe.last_psn = psn
    req.next_psn = (psn + 1) & PSN_MASK
    req.ack_edge = d + 1 >= cwnd
    ext = _RETH_PACK(wqe.remote_addr, wqe.rkey, length) if reth else b""
    if imm:
        ext += _U32_PACK(wqe.imm_data & 0xFFFFFFFF)
    pad = (-length) & 3
    b1 = pad << 4
    if wqe.send_flags & _SOLICITED and (imm or not reth):
        b1 |= _BTH_SE
    hdr = _BTH_PACK(opcode, b1, qp.pkey, qp.dest_qpn, ACKREQ_BIT | psn) + ext
    parts: list[bytes | bytearray | memoryview] = [hdr, *segs] if length else [hdr]
    if pad:
        parts.append(_PAD[pad])
    qp.tx(parts, len(hdr) + length + pad)
    wqe.state = WQE_SENT
    req.tx_idx += 1
    req.tx_pkt = 0
    if qp.deadline is None and qp.timeout:
        qp.set_deadline(now + req.timer_period())
    if sq[0].state == WQE_DONE:
        req._complete_head()
    return True


def receive_middles(port: Port, qp: EngineQP, bodies: Sequence[memoryview]) -> int:
    """Execute the longest prefix of ``bodies`` that ``Port.receive`` would hand, one by
    one, to ``Responder.fast_middle``, and return its length (0: nothing done).

    ``bodies`` are transport packets (BTH .. pad, ICRC checked) for ``qp``, whose
    addresses, P_Key and state the caller (``Port.receive_run``) has checked. A packet
    is taken when it is an RC SEND or RDMA WRITE MIDDLE of the message in progress, of
    the path MTU, with TVer 0, no pad, neither FECN nor BECN, the QP's P_Key and the
    expected PSN, and its payload fits the message's buffer (IBA 9.7.1, 9.7.4.1.5): the
    same placement, PSN, counters and coalesced ACK (IBA 9.7.5.1.1) as one packet at a
    time. The first packet that is not is left, with the rest, to the general path.
    """
    resp = qp.resp
    first = bodies[0]
    opcode = first[0]
    if opcode == op.RC_WRITE_MIDDLE:
        kind = op.Kind.WRITE
    elif opcode == op.RC_SEND_MIDDLE:
        kind = op.Kind.SEND
    else:
        return 0
    if resp.cur != kind:
        return 0
    mtu = qp.mtu
    size = _BTH_SIZE + mtu
    wbuf = resp.wbuf if kind == op.Kind.WRITE else None
    segs = resp.segs if kind == op.Kind.SEND else None
    if wbuf is None and segs is None:
        return 0
    wlen = resp.wlen
    pkey = qp.fast_pkey
    dqpn = qp.qpn
    epsn = resp.epsn
    off = resp.offset
    ack_psn = -1
    k = 0
    for data in bodies:
        if (len(data) != size or data[0] != opcode or data[1] & 0x3F or data[4] & 0xC0
                or (data[2] << 8 | data[3]) != pkey):
            break
        w1, w2 = _W1W2_UNPACK(data, 4)
        if w1 & 0xFFFFFF != dqpn:
            break
        psn = w2 & PSN_MASK
        if psn != epsn:
            break
        if wbuf is not None:
            if off + mtu > wlen:
                break
            wbuf[off:off + mtu] = data[_BTH_SIZE:]
        elif segs is None or not scatter(segs, off, data[_BTH_SIZE:]):
            break
        off += mtu
        epsn = (psn + 1) & PSN_MASK
        if w2 & ACKREQ_BIT:
            ack_psn = psn
        k += 1
    if k:
        resp.offset = off
        resp.nak_sent = False
        resp.epsn = epsn
        c = port.counters
        c.rcvd_pkts += k
        c.rcvd_bytes += k * (size + ICRC_SIZE)
        if ack_psn >= 0:
            resp.schedule_ack(ack_psn)
    return k


def receive_send_only(resp: Responder, data: memoryview, opcode: int) -> bool:
    """Execute an RC SEND ONLY (with immediate when ``opcode`` is SEND_ONLY_IMM) whose
    header checks ``Port.receive`` has done: the expected PSN, no message in progress,
    a payload within the path MTU, a receive WQE whose buffers take it. Then it is
    completed exactly as ``Responder._send_data`` completes it (IBA 9.7.4.1.5,
    9.7.5.1; the completion of IBA 11.4.2.1) and acknowledged by the same coalesced ACK.

    Returns False, having changed nothing, for anything else: the general path then
    runs (a receive WQE it took is given back first, so that path takes it again).
    """
    qp = resp.qp
    st = qp.state
    if st < RTR or st > SQE or resp.cur:
        return False
    w2 = int.from_bytes(data[8:12], "big")
    psn = w2 & PSN_MASK
    if psn != resp.epsn:
        return False
    imm = 0
    off = _BTH_SIZE
    if opcode == op.RC_SEND_ONLY_IMM:
        imm = int.from_bytes(data[_BTH_SIZE:_BTH_SIZE + _IMMDT_SIZE], "big")
        off += _IMMDT_SIZE
    plen = len(data) - off
    if plen < 0 or plen > qp.mtu:
        return False
    rwqe = qp.take_rwqe()
    if rwqe is None:
        return False  # the general path answers with an RNR NAK
    segs = resolve_sges(qp.port.mrs, qp.pd, rwqe.sg_list, _ACCESS_LOCAL_WRITE)
    if segs is None or (plen and not scatter(segs, 0, data[off:])):
        qp.return_rwqe(rwqe)
        return False
    resp.nak_sent = False
    wc = WorkCompletion(rwqe.wr_id, _WC_SUCCESS, _WC_RECV, qp.qpn, byte_len=plen,
                        imm_data=imm, src_qp=qp.dest_qpn,
                        wc_flags=_WC_WITH_IMM if opcode == op.RC_SEND_ONLY_IMM else 0)
    wc.solicited = bool(data[1] & _BTH_SE)
    resp.msn = (resp.msn + 1) & PSN_MASK
    resp.clear_msg()
    qp.complete_recv(wc)
    resp.epsn = (psn + 1) & PSN_MASK
    if w2 & ACKREQ_BIT:
        resp.schedule_ack(psn)
    resp.check_comm_est()
    return True
