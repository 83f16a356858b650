"""The XRC transport in the engine: XRC domains, XRC SRQs, initiator and target QPs
(IBA 9.8.5 / Annex A14 "Extended Reliable Connected Transport Service"; rdma-core
``ibv_open_xrcd``, ``IBV_SRQT_XRC``, ``IBV_QPT_XRC_SEND`` / ``IBV_QPT_XRC_RECV``).

XRC is RC with the receive side split off: an XRC INI QP (``IBV_QPT_XRC_SEND``) is an RC
requester whose every request names, in an XRCETH after the BTH, the XRC SRQ that is to
receive it; an XRC TGT QP (``IBV_QPT_XRC_RECV``) is an RC responder with no receive
queue and no PD of its own, which takes each request's receive WQE from the SRQ the
XRCETH names, checks its memory accesses against that SRQ's PD and completes into that
SRQ's CQ. An XRC domain (XRCD) limits which SRQs a TGT QP may deliver to.

Both QPs run the RC engines of :mod:`softrdma.ib.requester` / :mod:`.responder`
unchanged except for the wire: their packets carry the XRC opcodes (transport prefix
101b = 0xA0, IBA 9.2 Table 35: the RC operation codes), requests with the XRCETH
(Resv(8) | XRCSRQ(24), the XRCETH of Annex A14), responses without it. The engine QP type stays RC;
the verbs layer reports the XRC types.

Responder rules for the XRCETH (Annex A14): the XRCSRQ must name an XRC SRQ of the TGT
QP's XRC domain. An unknown SRQ number ("invalid XRCETH") or an SRQ of another domain
("XRC domain violation") is a local access violation of the TGT QP (IBA 11.6.3.2; the
hns driver reports both events as ``IB_EVENT_QP_ACCESS_ERR``): the request is NAKed
with Remote Access Error, the TGT QP goes to ERR and raises QP_ACCESS_ERR, as for an
R_Key violation. The packets of one message must name the same SRQ. A duplicate request
naming a bad SRQ is dropped. Packets of the wrong direction (requests to an INI QP,
responses to a TGT QP) or of another transport are dropped and counted as
``rcvd_bad_opcode`` (IBA 9.6.1.2).

XRC SRQ numbers come from the device's QP number space (unique across the processes of
a shared device). A domain opened on a file is shared by the processes of a shared
device that open that file (``verbs/xrcd.py``; :attr:`XrcDomain.relay` set): a TGT QP
bound to an SRQ of another process (:class:`RemoteSRQ`, found through the relay) keeps
the transport (PSN checks, ACKs, NAKs) and hands each SEND packet over, through the
device's daemon (``drivers/devd/xrc.py``), to the SRQ's owner, which places it in the
receive WQE it takes from the SRQ and completes it on the SRQ's CQ with the TGT QP's
number (IBA 10.2.9; :meth:`XrcSRQ.hand_over`). Packets of one TGT QP arrive in order;
while the SRQ has no receive WQE they wait (up to :data:`MAX_HANDOVER_BYTES`). Only
SENDs cross processes: an RDMA WRITE, READ or atomic naming another process's SRQ is
NAKed as an invalid XRCETH (its R_Key is in that process's memory). A hand-over the
daemon cannot take now is answered with an RNR NAK (the INI QP sends again).

Flow control (IBA 9.7.5.2.8, end to end): a TGT QP acknowledges a handed-over packet,
so the owner must never lose one. Each (TGT QPN, SRQ number) pair may have at most
:data:`HANDOVER_CREDITS` packets handed over that the owner has not yet consumed
(placed in a receive WQE, or completed in error); the owner returns consumed packets as
credit records (``XF_CREDIT``, at least :data:`CREDIT_BATCH` at a time, through devd to
the TGT QP's process). Without credit the TGT QP answers with an RNR NAK, as a responder
without a receive WQE does, and the INI QP sends again after its RNR timer. So a SRQ
without receive WQEs, a slow owner or a full channel to it stops the sender instead of
dropping what was acknowledged. ``XF_ABORT`` records take no credit.
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass
from typing import ClassVar, Protocol

from ..enums import ibv_access_flags as _ACC
from ..enums import ibv_qp_type as _QPT
from ..enums import ibv_wc_flags as _WCF
from ..enums import ibv_wc_opcode as _WCO
from ..enums import ibv_wc_status as _WCS
from ..errors import ResourceError
from ..seam.memory import resolve_sges, scatter
from ..seam.queues import EngineSRQ, QPInit
from ..seam.states import QPT_RC
from ..seam.types import PSN_MASK, AddressHandle, CompletionSink, RecvWQE, WorkCompletion
from ..wire.ib import IBPacket
from ..wire.opcodes import Kind, Pos, Transport
from ..wire.xrc import XRCETH_SIZE, xrc_request_header, xrc_response_header, xrceth_srqn
from .mw import remotely_invalidatable
from .packet import RxMeta
from .port import Port
from .qp import EngineQP
from .rd_atomic import RequestNak
from .responder import _RNR, Responder

__all__ = ["XrcDomain", "XrcSRQ", "XrcIniQP", "XrcTgtQP", "XrcRelay", "RemoteSRQ", "srq_table",
           "MAX_SRQN", "MAX_HANDOVER_BYTES", "XF_FIRST", "XF_LAST", "XF_IMM", "XF_INV", "XF_SE",
           "XF_ABORT", "XF_CREDIT", "HANDOVER_CREDITS", "CREDIT_BATCH"]

MAX_SRQN = 0xFFFFFF  # XRCSRQ is 24 bits (XRCETH)
_XRC = int(Transport.XRC)

# the flags of a handed-over SEND packet (XrcRelay.relay, XrcSRQ.hand_over)
XF_FIRST = 0x01  # the first packet of a message: the owner takes a receive WQE
XF_LAST = 0x02  # the last packet: the owner completes the WQE
XF_IMM = 0x04  # SEND with Immediate: ``word`` is the immediate data
XF_INV = 0x08  # SEND with Invalidate: ``word`` is the R_Key to invalidate
XF_SE = 0x10  # the last packet's Solicited Event bit
XF_ABORT = 0x20  # the TGT QP left its message unfinished (error): flush its WQE
#: (owner -> TGT QP's process) ``word`` handed-over packets of TGT QP ``tgt_qpn`` for
#: SRQ ``srqn`` were consumed: that many more may be handed over (module docstring)
XF_CREDIT = 0x40
#: packets a (TGT QP, SRQ) pair may have handed over and not yet consumed by the owner
HANDOVER_CREDITS = 64
#: the owner returns credit once this many packets of a pair are consumed (<= the window:
#: a sender that used all its credit always gets some back)
CREDIT_BATCH = 16
_XF_OVERFLOW = 0x100  # (owner side) a packet of the message could not be kept
#: bytes of handed-over packets an XRC SRQ keeps while it has no receive WQE; past it
#: a new message is dropped and a message in progress completes in error
MAX_HANDOVER_BYTES = 16 << 20
_LOCAL_WRITE = int(_ACC.IBV_ACCESS_LOCAL_WRITE)
_POS_LAST = int(Pos.LAST)


class XrcRelay(Protocol):
    """The driver's side of a domain shared by processes (``verbs/xrcd.py``)."""

    def lookup(self, srqn: int) -> bool:
        """Whether another process registered XRC SRQ ``srqn`` in this domain."""
        ...

    def relay(self, flags: int, srqn: int, tgt_qpn: int, src_qp: int, word: int,
              payload: memoryview) -> bool:
        """Hand one SEND packet over to SRQ ``srqn``'s owner; False: not now."""
        ...

    def credit(self, srqn: int, tgt_qpn: int, count: int) -> bool:
        """(The owner's side) return ``count`` consumed packets of TGT QP ``tgt_qpn`` to
        its process (an ``XF_CREDIT`` record); False: not now (kept, sent later)."""
        ...


class XrcDomain:
    """An XRC domain (Annex A14 ``XRCD``): the SRQs and TGT QPs that belong together;
    ``relay``: the domain is shared with other processes (the module docstring)."""

    __slots__ = ("port", "srqs", "tgt_qps", "closed", "relay", "remote_srqs", "__weakref__")

    def __init__(self, port: Port) -> None:
        self.port = port
        self.srqs: set[XrcSRQ] = set()
        self.tgt_qps: dict[int, XrcTgtQP] = {}
        self.closed = False
        self.relay: XrcRelay | None = None
        self.remote_srqs: dict[int, RemoteSRQ] = {}

    def in_use(self) -> bool:
        return bool(self.srqs) or bool(self.tgt_qps)

    def remote_srq(self, srqn: int) -> RemoteSRQ | None:
        """SRQ ``srqn`` of this domain in another process, or None (asked of the relay
        once, then remembered)."""
        got = self.remote_srqs.get(srqn)
        if got is None and self.relay is not None and self.relay.lookup(srqn):
            got = self.remote_srqs[srqn] = RemoteSRQ(self, srqn)
        return got


class RemoteSRQ:
    """An XRC SRQ of a shared domain that another process owns: what a TGT QP binds to
    hand SENDs over (the module docstring)."""

    __slots__ = ("xrcd", "srqn", "pd", "closed")

    def __init__(self, xrcd: XrcDomain, srqn: int) -> None:
        self.xrcd = xrcd
        self.srqn = srqn
        self.pd = object()  # no memory region of this process is in it
        self.closed = False


class _SrqTable:
    """The XRC SRQs of one port by SRQ number.

    SRQ numbers come from the port's QP number allocator, so that on a shared device
    they are unique across processes (devd allocates them): a request that names
    another process's SRQ is then an invalid XRCETH here, never a delivery into this
    process's SRQ of the same number."""

    __slots__ = ("by_srqn", "port", "in_flight")

    def __init__(self, port: Port) -> None:
        self.by_srqn: dict[int, XrcSRQ] = {}
        self.port = port
        #: (TGT QPN, SRQ number) -> packets this process's TGT QP handed over that the
        #: owner has not returned as consumed (the module docstring's flow control)
        self.in_flight: dict[tuple[int, int], int] = {}

    def may_hand_over(self, tgt_qpn: int, srqn: int) -> bool:
        """Whether TGT QP ``tgt_qpn`` has credit for one more packet to SRQ ``srqn``."""
        return self.in_flight.get((tgt_qpn, srqn), 0) < HANDOVER_CREDITS

    def handed_over(self, tgt_qpn: int, srqn: int) -> None:
        """One packet of ``tgt_qpn`` went to SRQ ``srqn``'s owner: one credit used."""
        key = (tgt_qpn, srqn)
        self.in_flight[key] = self.in_flight.get(key, 0) + 1

    def credited(self, tgt_qpn: int, srqn: int, count: int) -> None:
        """The owner consumed ``count`` packets of ``tgt_qpn`` (an ``XF_CREDIT``
        record); a count above those in flight (a confused or hostile owner) clears them."""
        key = (tgt_qpn, srqn)
        left = self.in_flight.get(key, 0) - count
        if left > 0:
            self.in_flight[key] = left
        else:
            self.in_flight.pop(key, None)

    def hand_over(self, flags: int, srqn: int, tgt_qpn: int, src_qp: int, word: int,
                  payload: memoryview) -> None:
        """A SEND packet handed over by another process's TGT QP (the link's
        ``xrc_sink``): to the SRQ it names; counted and dropped if there is none. A
        credit record (``XF_CREDIT``) is for this process's TGT QP ``tgt_qpn``."""
        if flags & XF_CREDIT:
            self.credited(tgt_qpn, srqn, word)
            return
        srq = self.by_srqn.get(srqn)
        if srq is None or srq.closed:
            self.port.counters.rcvd_unknown_qp += 1
            return
        srq.hand_over(flags, tgt_qpn, src_qp, word, payload)

    def alloc(self) -> int:
        for _ in range(MAX_SRQN):
            n = self.port.alloc_qpn()
            if n not in self.by_srqn:
                return n
        raise ResourceError("no free SRQ number")

    def free(self, srqn: int) -> None:
        self.by_srqn.pop(srqn, None)
        self.port.free_qpn(srqn)


_TABLES: weakref.WeakKeyDictionary[Port, _SrqTable] = weakref.WeakKeyDictionary()


def srq_table(port: Port) -> _SrqTable:
    """The XRC SRQ table of ``port`` (created on first use)."""
    t = _TABLES.get(port)
    if t is None:
        t = _TABLES[port] = _SrqTable(port)
    return t


@dataclass(eq=False, slots=True)
class _Inbound:
    """A handed-over message being placed: its receive WQE, buffers, offset, status."""

    rwqe: RecvWQE
    segs: list[memoryview] | None
    offset: int = 0
    status: int = 0


class XrcSRQ(EngineSRQ):
    """An XRC SRQ (``IBV_SRQT_XRC``): an SRQ with a number, an XRC domain and its own CQ,
    which receives the completions of every message delivered into it (IBA 10.2.9)."""

    def __init__(self, port: Port, pd: object, xrcd: XrcDomain, cq: CompletionSink,
                 max_wr: int, max_sge: int, srq_limit: int = 0) -> None:
        super().__init__(port.events, pd, max_wr, max_sge, srq_limit)
        self.port = port
        self.xrcd = xrcd
        self.cq = cq
        table = srq_table(port)
        self.srqn = table.alloc()
        table.by_srqn[self.srqn] = self
        xrcd.srqs.add(self)
        # handed-over messages (module docstring): in progress by TGT QPN, and the
        # packets waiting for a receive WQE, in their order of arrival
        self.inbound: dict[int, _Inbound] = {}
        self.waiting: deque[tuple[int, int, int, int, bytes]] = deque()
        self.waiting_bytes = 0
        self.dropping: set[int] = set()  # TGT QPNs whose message is being dropped
        #: TGT QPN -> packets consumed and not yet returned as credit (flow control)
        self.unreturned: dict[int, int] = {}
        self.owed = False  # a credit record could not be sent (retried, _return_owed)

    def post_recv(self, rwqe: RecvWQE) -> None:
        super().post_recv(rwqe)
        if self.waiting:
            self._drain()
        if self.owed:
            self._return_owed()

    def hand_over(self, flags: int, tgt_qpn: int, src_qp: int, word: int,
                  payload: memoryview) -> None:
        """One SEND packet that TGT QP ``tgt_qpn`` of another process took for this SRQ
        (``flags``: ``XF_*``): placed now, or kept until a receive WQE is posted. Each
        packet but an abort is returned as credit once consumed (module docstring)."""
        if self.owed:
            self._return_owed()
        if tgt_qpn in self.dropping:  # the rest of a message that could not be kept
            if not flags & XF_FIRST:
                if flags & (XF_LAST | XF_ABORT):
                    self.dropping.discard(tgt_qpn)
                self._consumed(flags, tgt_qpn)
                return
            self.dropping.discard(tgt_qpn)
        if not self.waiting and self._place(flags, tgt_qpn, src_qp, word, payload):
            self._consumed(flags, tgt_qpn)
            return
        if self.waiting_bytes + len(payload) > MAX_HANDOVER_BYTES:
            # (only a sender that ignores its credit gets here)
            self.port.counters.rcvd_no_buffer += 1
            if not flags & XF_LAST:
                self.dropping.add(tgt_qpn)
            if flags & XF_FIRST:
                self._consumed(flags, tgt_qpn)
                return  # the whole message is dropped, as a lost one
            flags, payload = _XF_OVERFLOW, memoryview(b"")
        self.waiting.append((flags, tgt_qpn, src_qp, word, bytes(payload)))
        self.waiting_bytes += len(payload)

    def _drain(self) -> None:
        waiting = self.waiting
        while waiting:
            flags, tgt, src, word, data = waiting[0]
            if not self._place(flags, tgt, src, word, memoryview(data)):
                return
            waiting.popleft()
            self.waiting_bytes -= len(data)
            self._consumed(flags, tgt)

    def _consumed(self, flags: int, tgt: int) -> None:
        """A handed-over packet of TGT QP ``tgt`` left this SRQ's keeping (placed, or
        completed or dropped in error): its credit goes back to the sender, in batches
        of :data:`CREDIT_BATCH` (an abort took none)."""
        if flags & XF_ABORT:
            return
        unreturned = self.unreturned
        n = unreturned.get(tgt, 0) + 1
        unreturned[tgt] = n
        if n >= CREDIT_BATCH:
            self._return(tgt, n)

    def _return(self, tgt: int, n: int) -> None:
        relay = self.xrcd.relay
        if relay is None:
            return
        if relay.credit(self.srqn, tgt, n):
            del self.unreturned[tgt]
        else:  # the channel to devd is full: again at the next packet or receive WQE
            self.owed = True

    def _return_owed(self) -> None:
        """Send the credit records a full channel refused before."""
        self.owed = False
        for tgt, n in list(self.unreturned.items()):
            if n >= CREDIT_BATCH:
                self._return(tgt, n)

    def _place(self, flags: int, tgt: int, src: int, word: int, payload: memoryview) -> bool:
        """Place one handed-over packet (IBA 9.7.4.1.5, as the responder's ``_send_data``
        does); False, with nothing done, when a message starts and no WQE is posted."""
        msg = self.inbound.get(tgt)
        if flags & (XF_ABORT | _XF_OVERFLOW):
            if msg is not None:
                del self.inbound[tgt]
                self.cq(WorkCompletion(msg.rwqe.wr_id, int(
                    _WCS.IBV_WC_WR_FLUSH_ERR if flags & XF_ABORT else _WCS.IBV_WC_GENERAL_ERR),
                    int(_WCO.IBV_WC_RECV), tgt))
            return True
        if flags & XF_FIRST:
            if msg is not None:  # its previous message never ended (the TGT QP reset)
                del self.inbound[tgt]
                self.cq(WorkCompletion(msg.rwqe.wr_id, int(_WCS.IBV_WC_WR_FLUSH_ERR),
                                       int(_WCO.IBV_WC_RECV), tgt))
            rwqe = self.take()
            if rwqe is None:
                return False
            segs = resolve_sges(self.port.mrs, self.pd, rwqe.sg_list, _LOCAL_WRITE)
            msg = _Inbound(rwqe, segs, 0, 0 if segs is not None
                           else int(_WCS.IBV_WC_LOC_PROT_ERR))
            self.inbound[tgt] = msg
        elif msg is None:  # the start of its message was lost
            self.port.counters.rcvd_no_buffer += 1
            return True
        if not msg.status and len(payload):
            assert msg.segs is not None
            if not scatter(msg.segs, msg.offset, payload):
                msg.status = int(_WCS.IBV_WC_LOC_LEN_ERR)
        msg.offset += len(payload)
        if flags & XF_LAST:
            del self.inbound[tgt]
            self.cq(self._completion(msg, flags, tgt, src, word))
        return True

    def _completion(self, msg: _Inbound, flags: int, tgt: int, src: int,
                    word: int) -> WorkCompletion:
        wc_flags = imm = inv = 0
        status = msg.status
        if flags & XF_IMM:
            wc_flags, imm = int(_WCF.IBV_WC_WITH_IMM), word
        elif flags & XF_INV and not status:
            mr = self.port.lookup_mr(word)
            if mr is None or mr.pd is not self.pd or not remotely_invalidatable(mr):
                status = int(_WCS.IBV_WC_REM_INV_REQ_ERR)
            else:
                mr.valid = False
                wc_flags, inv = int(_WCF.IBV_WC_WITH_INV), word
        if status:
            return WorkCompletion(msg.rwqe.wr_id, status, int(_WCO.IBV_WC_RECV), tgt)
        wc = WorkCompletion(msg.rwqe.wr_id, int(_WCS.IBV_WC_SUCCESS), int(_WCO.IBV_WC_RECV),
                            tgt, byte_len=msg.offset, imm_data=imm, src_qp=src,
                            wc_flags=wc_flags, invalidated_rkey=inv)
        wc.solicited = bool(flags & XF_SE)
        return wc

    def destroy(self) -> None:
        self.closed = True
        self.waiting.clear()
        self.inbound.clear()
        self.unreturned.clear()
        table = srq_table(self.port)
        if table.by_srqn.get(self.srqn) is self:
            table.free(self.srqn)
        self.xrcd.srqs.discard(self)


def _ignore_completion(wc: WorkCompletion) -> None:
    """A TGT QP completes into the SRQ's CQ; this stands in until a request binds one."""


class _XrcQP(EngineQP):
    """What the XRC INI and TGT QPs share: the RC machinery on XRC opcodes (IBA 9.2.3,
    Table 35), taking one direction only: an INI QP responses, a TGT QP requests."""

    fast_rc = False  # XRC opcodes, and an XRCETH on every request (``tx``)
    #: True: this QP takes XRC responses (INI); False: XRC requests (TGT)
    takes_responses: ClassVar[bool]
    #: the verbs type the CM connects it as (``qp_type`` stays RC: the engines are RC's):
    #: ``IBV_QPT_XRC_SEND`` (Linux ``IB_QPT_XRC_INI``) or ``IBV_QPT_XRC_RECV`` (``XRC_TGT``)
    xrc_qp_type: ClassVar[int]

    def __init__(self, port: Port, init: QPInit, qpn: int | None = None) -> None:
        super().__init__(port, init, qpn)
        self.bth_transport = _XRC

    def receive(self, pkt: IBPacket, meta: RxMeta, now: float) -> None:
        """Only XRC packets of this QP's direction (an INI QP: ACK/NAK, READ responses,
        atomic ACKs; a TGT QP: requests, each of which first binds the SRQ it names)."""
        info = pkt.info
        if info.transport != _XRC or not (
                info.is_response if self.takes_responses else info.is_request):
            self.count("rcvd_bad_opcode")
            return
        super().receive(pkt, meta, now)


class XrcIniQP(_XrcQP):
    """XRC initiator (send) QP: the RC requester, whose requests carry the XRC opcodes and
    the XRCETH naming each work request's remote SRQ (``SendWQE.xrc_srqn``)."""

    takes_responses = True
    xrc_qp_type = int(_QPT.IBV_QPT_XRC_SEND)

    def __init__(self, port: Port, init: QPInit) -> None:
        if init.qp_type != QPT_RC or init.srq is not None or init.max_recv_wr:
            raise ValueError("an XRC INI QP is created with the RC type and no receive queue")
        super().__init__(port, init)

    def tx(self, parts: list[bytes | bytearray | memoryview], length: int,
           av: AddressHandle | None = None) -> None:
        """Queue one request: the RC header becomes the XRC one with the XRCETH of the
        work request being sent (the requester's cursor, ``sq[tx_idx]``)."""
        req = self.req
        wqe = req.sq[req.tx_idx]
        parts[0] = xrc_request_header(bytes(parts[0]), wqe.xrc_srqn)
        super().tx(parts, length + XRCETH_SIZE, av)

    def post_recv(self, rwqe: RecvWQE) -> None:
        raise ResourceError("an XRC INI QP has no receive queue")


class _HandOverResponder(Responder):
    """The responder of an XRC TGT QP: a SEND bound to an SRQ of another process
    (:class:`RemoteSRQ`) is handed over packet by packet instead of placed here; the
    transport (sequence, length, PSN, ACK) is the RC responder's."""

    def __init__(self, qp: XrcTgtQP) -> None:
        super().__init__(qp)
        self.tgt = qp

    def _send_data(self, pkt: IBPacket, plen: int) -> None:
        remote = self.tgt.bound
        if not isinstance(remote, RemoteSRQ):
            super()._send_data(pkt, plen)
            return
        info = pkt.info
        flags = 0 if self.cur else XF_FIRST
        word = 0
        last = info.pos_int & _POS_LAST
        if last:
            flags |= XF_LAST | (XF_SE if pkt.se else 0)
            if info.imm:
                flags, word = flags | XF_IMM, pkt.imm
            elif info.inv:
                flags, word = flags | XF_INV, pkt.inv_rkey
        if not self._relay(remote, flags, word, pkt.payload):
            raise _RNR()  # the daemon cannot take it now: the requester sends it again
        if not self.cur:
            self.cur = Kind.SEND
            self.offset = 0
        self.offset += plen
        if last:
            self.msn = (self.msn + 1) & PSN_MASK
            self._clear_msg()

    def _relay(self, remote: RemoteSRQ, flags: int, word: int, payload: memoryview) -> bool:
        """Hand one packet over if the owner gave credit for it (an abort needs none);
        False: not now (the caller RNR NAKs, IBA 9.7.5.2.8)."""
        relay = remote.xrcd.relay
        if relay is None:
            return False
        qp = self.tgt
        if flags & XF_ABORT:
            return relay.relay(flags, remote.srqn, qp.qpn, qp.dest_qpn, word, payload)
        table = srq_table(qp.port)
        if not table.may_hand_over(qp.qpn, remote.srqn) or not relay.relay(
                flags, remote.srqn, qp.qpn, qp.dest_qpn, word, payload):
            return False
        table.handed_over(qp.qpn, remote.srqn)
        return True

    def _abort_remote(self) -> None:
        remote = self.tgt.bound
        if self.cur and isinstance(remote, RemoteSRQ):
            self._relay(remote, XF_ABORT, 0, memoryview(b""))

    def abort(self) -> None:
        self._abort_remote()
        super().abort()

    def reset(self) -> None:
        self._abort_remote()
        super().reset()

    def _error(self, pkt: IBPacket, e: RequestNak) -> None:
        self._abort_remote()
        super()._error(pkt, e)


class XrcTgtQP(_XrcQP):
    """XRC target (receive) QP: the RC responder, delivering each request to the XRC SRQ
    its XRCETH names (checked against this QP's domain), answering with XRC opcodes."""

    takes_responses = False
    xrc_qp_type = int(_QPT.IBV_QPT_XRC_RECV)
    port: Port  # (an EngineQP names only the view of its port it needs, ib.views.QpPort)

    def __init__(self, port: Port, xrcd: XrcDomain, qpn: int | None = None) -> None:
        super().__init__(port, QPInit(QPT_RC, None, _ignore_completion, _ignore_completion,
                                      None, 0, 0, 0, 0, 0, False), qpn)
        self.xrcd: XrcDomain | None = xrcd
        # the SRQ of the request being executed (another process's: RemoteSRQ)
        self.bound: XrcSRQ | RemoteSRQ | None = None
        self.resp = _HandOverResponder(self)
        xrcd.tgt_qps[self.qpn] = self

    def tx(self, parts: list[bytes | bytearray | memoryview], length: int,
           av: AddressHandle | None = None) -> None:
        """Queue one response with its XRC opcode (no XRCETH on responses)."""
        parts[0] = xrc_response_header(bytes(parts[0]))
        super().tx(parts, length, av)

    def bind_srq(self, pkt: IBPacket) -> bool:
        """Make the SRQ named by ``pkt``'s XRCETH this QP's SRQ for the request (its
        receive WQEs, PD and CQ); False when the XRCETH is invalid for this QP (unknown
        SRQ, an SRQ of another XRC domain, a destroyed SRQ, or another SRQ than the one
        of the message in progress)."""
        srqn = xrceth_srqn(pkt.xrceth)
        srq = srq_table(self.port).by_srqn.get(srqn)
        if srq is None:
            # another process's SRQ of a shared domain: SENDs only (module docstring)
            xrcd = self.xrcd
            remote = xrcd.remote_srq(srqn) if xrcd is not None else None
            if remote is None or pkt.info.kind != Kind.SEND:
                return False
            if self.resp.cur != 0 and remote is not self.bound:
                return False
            self.bound = remote
            return True
        if srq.closed or srq.xrcd is not self.xrcd:
            return False
        if self.resp.cur != 0 and srq is not self.bound:
            return False
        if srq is not self.bound:
            self.bound = srq
            self.take_rwqe = srq.take
            self.return_rwqe = srq.push_front
            self.pd = srq.pd
            self.complete_recv = srq.cq
        return True

    def post_recv(self, rwqe: RecvWQE) -> None:
        raise ResourceError("an XRC TGT QP receives through XRC SRQs")

    def destroy(self) -> None:
        xrcd = self.xrcd
        if xrcd is not None and xrcd.tgt_qps.get(self.qpn) is self:
            del xrcd.tgt_qps[self.qpn]
        super().destroy()
