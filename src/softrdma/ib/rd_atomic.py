"""The responder's RDMA READ and atomic side (IBA 9.7.4.1.4, 9.7.5.1.4; rxe_resp.c).

An RDMA READ request is answered by READ responses from the R_Key's region (IBA
9.7.4.1.4); a Compare & Swap or Fetch & Add (IBA 9.4.4) is executed once, on an
8-byte aligned address, and answered by an atomic acknowledge carrying the original
data; an RDMA Atomic Write (opcode 0x1D) stores 8 bytes in one go. Each READ and atomic
takes a responder resource (:class:`Resource`) so that a duplicate request is answered
again without being executed again (IBA 9.7.5.1.4, C9-105; rxe ``duplicate_request``).

The R_Key checks of a request (:func:`rkey_view`, IBA 10.6.3.1) serve RDMA WRITE too; a
failed check aborts the request with :class:`RequestNak` (the NAK code of IBA Table 44
and the completion status the responder's QP errors with, if any).
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from ..enums import ibv_access_flags as ACC
from ..enums import ibv_wc_status as WCS
from ..seam.types import PSN_MASK, psn_diff
from ..wire import ib as wib
from ..wire import opcodes as op
from .views import QpView

MAX_MSG = 1 << 31  # IBA: maximum message size 2^31 (rxe check_rkey)
ACK_SYNDROME = wib.AETH_ACK | wib.AETH_CREDIT_INVALID  # rxe: AETH_ACK_UNLIMITED
_HOST_U64 = struct.Struct("=Q")
_ACCESS_REMOTE_READ = int(ACC.IBV_ACCESS_REMOTE_READ)  # plain ints on the hot path
_ACCESS_REMOTE_ATOMIC = int(ACC.IBV_ACCESS_REMOTE_ATOMIC)
_ACCESS_REMOTE_WRITE = int(ACC.IBV_ACCESS_REMOTE_WRITE)
K_READ = op.Kind.READ_REQ
K_CAS = op.Kind.CMP_SWAP


@dataclass(eq=False, slots=True)
class Resource:
    """A responder resource kept for duplicate READ/atomic requests (IBA 9.7.5.1.4)."""

    kind: int
    first_psn: int
    last_psn: int
    orig: int = 0
    va: int = 0
    rkey: int = 0
    length: int = 0


class Responder(Protocol):
    """What this side uses of the :class:`~.responder.Responder` that calls it: its QP,
    the expected PSN and MSN it advances, its resources and its ACK scheduling."""

    msn: int
    epsn: int

    @property
    def qp(self) -> QpView: ...
    @property
    def resources(self) -> deque[Resource]: ...

    def schedule_ack(self, psn: int) -> None: ...

    def flush_pending_ack(self) -> None: ...


class RequestNak(Exception):
    """Internal: abort processing of a request with a NAK (and maybe a responder error)."""

    def __init__(self, code: int, wc_status: int = 0) -> None:
        super().__init__(code)
        self.code = code
        self.wc_status = wc_status


def rkey_view(qp: QpView, rkey: int, va: int, length: int, need: int) -> memoryview:
    """The ``length`` bytes at ``va`` of the region ``rkey`` names, after the R_Key, PD,
    access and bounds checks (IBA 10.6.3.1; rxe ``check_rkey``); NAK 0x61 (invalid
    request: the QP does not grant ``need``) or 0x62 (remote access) on failure."""
    if not qp.access_flags & need:
        raise RequestNak(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_REM_INV_REQ_ERR)
    if length == 0:
        return memoryview(bytearray())  # writable: a WRITE of 0 bytes places nothing in it
    mr = qp.port.mrs.get(rkey)
    if mr is None or not mr.valid or mr.pd is not qp.pd or not mr.access & need:
        raise RequestNak(wib.NAK_REMOTE_ACCESS, WCS.IBV_WC_REM_ACCESS_ERR)
    off = mr.offset_of(va, length)
    if off < 0:
        raise RequestNak(wib.NAK_REMOTE_ACCESS, WCS.IBV_WC_REM_ACCESS_ERR)
    return mr.buf[off:off + length]


def execute_read(resp: Responder, pkt: wib.IBPacket) -> None:
    """An RDMA READ request in sequence (IBA 9.7.4.1.4): a resource covering its response
    PSNs, the expected PSN past them, then the responses."""
    if pkt.dma_len > MAX_MSG:
        raise RequestNak(wib.NAK_INVALID_REQUEST)
    qp = resp.qp
    view = rkey_view(qp, pkt.rkey, pkt.va, pkt.dma_len, _ACCESS_REMOTE_READ)
    mtu = qp.mtu
    npkts = (pkt.dma_len + mtu - 1) // mtu if pkt.dma_len else 1
    resp.msn = (resp.msn + 1) & PSN_MASK
    resp.resources.append(Resource(K_READ, pkt.psn, (pkt.psn + npkts - 1) & PSN_MASK,
                                   va=pkt.va, rkey=pkt.rkey, length=pkt.dma_len))
    resp.epsn = (resp.epsn + npkts) & PSN_MASK
    read_responses(resp, pkt.psn, view)


def execute_atomic(resp: Responder, pkt: wib.IBPacket, kind: int) -> None:
    """A Compare & Swap or Fetch & Add in sequence (IBA 9.4.4, 9.7.4.1.4): on an 8-byte
    aligned address, executed once, its original data kept in a resource and sent back
    in the atomic acknowledge."""
    if pkt.va & 7:
        raise RequestNak(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_REM_INV_REQ_ERR)
    view = rkey_view(resp.qp, pkt.rkey, pkt.va, 8, _ACCESS_REMOTE_ATOMIC)
    orig = _HOST_U64.unpack_from(view)[0]
    if kind == K_CAS:
        if orig == pkt.compare:
            _HOST_U64.pack_into(view, 0, pkt.swap_add)
    else:
        _HOST_U64.pack_into(view, 0, (orig + pkt.swap_add) & 0xFFFFFFFFFFFFFFFF)
    resp.msn = (resp.msn + 1) & PSN_MASK
    resp.resources.append(Resource(kind, pkt.psn, pkt.psn, orig=orig))
    resp.epsn = (resp.epsn + 1) & PSN_MASK
    atomic_ack(resp, pkt.psn, orig)


def execute_atomic_write(resp: Responder, pkt: wib.IBPacket) -> None:
    """RDMA Atomic Write (opcode 0x1D, IBA 1.5; rxe ``atomic_write_reply``): 8 bytes to an
    aligned VA in one store, needs REMOTE_WRITE; acknowledged like a write (rxe)."""
    if pkt.va & 7 or pkt.dma_len != 8 or len(pkt.payload) != 8:
        raise RequestNak(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_REM_INV_REQ_ERR)
    view = rkey_view(resp.qp, pkt.rkey, pkt.va, 8, _ACCESS_REMOTE_WRITE)
    view[0:8] = pkt.payload
    resp.msn = (resp.msn + 1) & PSN_MASK
    resp.epsn = (resp.epsn + 1) & PSN_MASK
    if pkt.ackreq:
        resp.schedule_ack(pkt.psn)


def read_responses(resp: Responder, psn: int, view: memoryview) -> None:
    """Emit the RDMA READ response packets for ``view`` starting at ``psn`` (IBA 9.7.4.1.4):
    ONLY, or FIRST .. MIDDLE .. LAST, with an AETH on all but the MIDDLEs (IBA 9.3.5)."""
    resp.flush_pending_ack()
    qp = resp.qp
    mtu = qp.mtu
    n = len(view)
    npkts = (n + mtu - 1) // mtu if n else 1
    pkey = qp.pkey
    dqpn = qp.dest_qpn
    aeth = wib.aeth(ACK_SYNDROME, resp.msn)
    for k in range(npkts):
        off = k * mtu
        plen = n - off if n - off < mtu else mtu
        if npkts == 1:
            opcode = op.RC_READ_RESPONSE_ONLY
        elif k == 0:
            opcode = op.RC_READ_RESPONSE_FIRST
        elif k == npkts - 1:
            opcode = op.RC_READ_RESPONSE_LAST
        else:
            opcode = op.RC_READ_RESPONSE_MIDDLE
        pad = (-plen) & 3
        hdr = wib.bth(opcode, pkey, dqpn, psn + k, pad=pad)
        if opcode != op.RC_READ_RESPONSE_MIDDLE:
            hdr += aeth
        parts: list[bytes | bytearray | memoryview] = [hdr]
        if plen:
            parts.append(view[off:off + plen])
        if pad:
            parts.append(wib.pad_bytes(plen))
        qp.tx(parts, len(hdr) + plen + pad)


def atomic_ack(resp: Responder, psn: int, orig: int) -> None:
    """The atomic acknowledge of PSN ``psn``: AETH and AtomicAckETH (IBA 9.3.5-9.3.6)."""
    resp.flush_pending_ack()
    qp = resp.qp
    hdr = wib.bth(op.RC_ATOMIC_ACK, qp.pkey, qp.dest_qpn, psn) + \
        wib.aeth(ACK_SYNDROME, resp.msn) + wib.atmack(orig)
    qp.tx([hdr], 24)


def replay(resp: Responder, pkt: wib.IBPacket) -> None:
    """A duplicate READ or atomic request (IBA 9.7.5.1.4, C9-105): the resource covering
    its PSN answers it again, a READ re-read from memory (from the duplicate's own VA and
    length, its MSN unchanged) and an atomic with the saved original data, never executed
    again. A request too old to be in the resources, or of another kind, is dropped."""
    kind = pkt.info.kind
    for r in reversed(resp.resources):
        if psn_diff(pkt.psn, r.first_psn) >= 0 and psn_diff(pkt.psn, r.last_psn) <= 0:
            if r.kind != kind:
                return
            if kind == K_READ:
                try:
                    view = rkey_view(resp.qp, pkt.rkey, pkt.va, pkt.dma_len,
                                     _ACCESS_REMOTE_READ)
                except RequestNak:
                    return
                saved = resp.msn
                read_responses(resp, pkt.psn, view)
                resp.msn = saved
            else:
                atomic_ack(resp, pkt.psn, r.orig)
            return


__all__ = ["ACK_SYNDROME", "MAX_MSG", "RequestNak", "Resource", "atomic_ack", "execute_atomic",
           "execute_atomic_write", "execute_read", "read_responses", "replay", "rkey_view"]
