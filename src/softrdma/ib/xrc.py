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
a shared device); an SRQ and every TGT QP that delivers into it live in one process
(the XRCD is this process's, see ``verbs/xrcd.py``).
"""

from __future__ import annotations

import weakref
from typing import ClassVar

from ..errors import ResourceError
from ..seam.queues import EngineSRQ, QPInit
from ..seam.states import QPT_RC
from ..seam.types import AddressHandle, CompletionSink, RecvWQE, WorkCompletion
from ..wire.ib import IBPacket
from ..wire.opcodes import Transport
from ..wire.xrc import XRCETH_SIZE, xrc_request_header, xrc_response_header, xrceth_srqn
from .packet import RxMeta
from .port import Port
from .qp import EngineQP

__all__ = ["XrcDomain", "XrcSRQ", "XrcIniQP", "XrcTgtQP", "srq_table", "MAX_SRQN"]

MAX_SRQN = 0xFFFFFF  # XRCSRQ is 24 bits (XRCETH)
_XRC = int(Transport.XRC)


class XrcDomain:
    """An XRC domain (Annex A14 ``XRCD``): the SRQs and TGT QPs that belong together."""

    __slots__ = ("port", "srqs", "tgt_qps", "closed", "__weakref__")

    def __init__(self, port: Port) -> None:
        self.port = port
        self.srqs: set[XrcSRQ] = set()
        self.tgt_qps: dict[int, XrcTgtQP] = {}
        self.closed = False

    def in_use(self) -> bool:
        return bool(self.srqs) or bool(self.tgt_qps)


class _SrqTable:
    """The XRC SRQs of one port by SRQ number.

    SRQ numbers come from the port's QP number allocator, so that on a shared device
    they are unique across processes (devd allocates them): a request that names
    another process's SRQ is then an invalid XRCETH here, never a delivery into this
    process's SRQ of the same number."""

    __slots__ = ("by_srqn", "port")

    def __init__(self, port: Port) -> None:
        self.by_srqn: dict[int, XrcSRQ] = {}
        self.port = port

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

    def destroy(self) -> None:
        self.closed = True
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


class XrcTgtQP(_XrcQP):
    """XRC target (receive) QP: the RC responder, delivering each request to the XRC SRQ
    its XRCETH names (checked against this QP's domain), answering with XRC opcodes."""

    takes_responses = False
    port: Port  # (an EngineQP names only the view of its port it needs, ib.views.QpPort)

    def __init__(self, port: Port, xrcd: XrcDomain, qpn: int | None = None) -> None:
        super().__init__(port, QPInit(QPT_RC, None, _ignore_completion, _ignore_completion,
                                      None, 0, 0, 0, 0, 0, False), qpn)
        self.xrcd: XrcDomain | None = xrcd
        self.bound: XrcSRQ | None = None  # the SRQ of the request being executed
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
        srq = srq_table(self.port).by_srqn.get(xrceth_srqn(pkt.xrceth))
        if srq is None or srq.closed or srq.xrcd is not self.xrcd:
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
