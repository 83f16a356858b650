"""Bulk fast paths of the RC transport: the middle packets of a large message.

Most packets of a 1 MiB RDMA WRITE or SEND at path MTU 4096 are MIDDLE packets (IBA
9.7.1: 254 of 256), and every one of them is the same header with the next PSN: a
BTH with the MIDDLE opcode, no pad, no Solicited Event, the QP's P_Key and destination
QPN, and AckReq by the requester's rule. :func:`emit_middles` sends a run of them in
one tight loop instead of one pass of the requester's general loop per packet (no
opcode dispatch, no window recomputation, no per-packet counter updates): the same
bytes (tests/test_fastpath.py compares them with the general path byte for byte).

:data:`ENABLED` switches the fast paths off, which the equivalence tests use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..seam.memory import gather
from ..seam.types import PSN_MASK, SendWQE, psn_diff
from ..wire import ib as wib
from ..wire import opcodes as op
from .packet import ICRC_SIZE, TxPacket

if TYPE_CHECKING:
    from .requester import Requester

__all__ = ["ENABLED", "ACKREQ_EVERY", "ACKREQ_BIT", "emit_middles"]

#: the fast paths are used (tests switch them off to compare with the general path)
ENABLED = True
#: AckReq every N packets of a long message (rxe: RXE_MAX_PKT_PER_ACK)
ACKREQ_EVERY = 32
#: the AckReq bit of the BTH's PSN word (IBA 9.2: A bit)
ACKREQ_BIT = 0x80000000
_BTH_SIZE = wib.BTH.size
_BTH_PACK = wib.BTH.pack


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
    return k
