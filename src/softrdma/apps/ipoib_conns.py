"""The connections of the IPoIB process in connected mode (RFC 4755): one RC or UC QP per
peer on the shared SRQ, set up and torn down through the IB CM (IBA 12.6) on the Service ID
``0x1000000000000000 | UD QPN`` (RFC 4755 §3.5), as the interface engine
(:mod:`softrdma.ipoib.iface`) asks with ``ConnOpen``/``ConnAccept``/``ConnClose``, and the
CM's events handed back to it. :class:`IpoibConnections` is a base of
:class:`softrdma.apps.ipoib_runtime.IpoibRuntime`, which owns the resources it uses.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from .. import enums as e
from .. import verbs as v
from ..drivers.cm.gsi import CmBinding
from ..errors import SoftRdmaError
from ..ibcm.agent import AcceptParams, ConnParams
from ..ibcm.cmid import IbCmId
from ..ibcm.events import CmEvent, CmEventType
from ..ipoib.events import ConnAccept, ConnOpen, Output
from ..ipoib.iface import IpoibInterface
from ..wire.cm import TransportServiceType

__all__ = ["SEND_SLOTS", "CONN_SEND_WR", "IpoibConnections"]

SEND_SLOTS = 256  # the process's 64 KiB send slots (ipoib_runtime)
CONN_SEND_WR = SEND_SLOTS  # one connection may hold every send slot


@dataclass(slots=True)
class _Conn:
    qp: v.QP
    cm_id: IbCmId
    active: bool


class IpoibConnections:
    """Connected mode's QPs and CM identifiers (the resources: the runtime's)."""

    engine: IpoibInterface
    pd: v.PD
    cq: v.CQ
    rc_rcq: v.CQ
    srq: v.SRQ | None
    gid: bytes
    cm: CmBinding | None
    _conns: dict[int, _Conn]  # conn_id -> its QP and CM id
    _by_qpn: dict[int, int]  # QPN -> conn_id
    _by_cmid: dict[int, int]  # id(cm_id) -> conn_id
    _requests: dict[int, IbCmId]  # the engine's token -> a REQ's CM id, until accepted
    _tokens: int
    _cm_events: deque[CmEvent]
    _graveyard: list[v.QP]  # QPs of dropped connections, destroyed by the loop

    def _init_connections(self) -> None:
        self.cm = None  # attached in connected mode
        self._conns = {}
        self._by_qpn = {}
        self._by_cmid = {}
        self._requests = {}
        self._tokens = 0
        self._cm_events = deque()
        self._graveyard = []

    def _execute(self, outputs: Sequence[Output]) -> None:
        raise NotImplementedError  # the runtime's

    def _new_qp(self, transport: str) -> v.QP:
        assert self.srq is not None
        qpt = e.IBV_QPT_RC if transport == "RC" else e.IBV_QPT_UC
        cap = v.QPCap(max_send_wr=CONN_SEND_WR, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        return v.QP(self.pd, v.QPInitAttr(qp_type=qpt, scq=self.cq, rcq=self.rc_rcq,
                                          srq=self.srq, cap=cap))

    def _register(self, conn_id: int, qp: v.QP, cm_id: IbCmId, active: bool) -> None:
        self._conns[conn_id] = _Conn(qp, cm_id, active)
        self._by_qpn[qp.qp_num] = conn_id
        self._by_cmid[id(cm_id)] = conn_id

    def _open_conn(self, o: ConnOpen) -> None:
        assert self.cm is not None
        qp = self._new_qp(o.transport)
        cm_id = self.cm.agent.create_id(self._cm_event)
        self._register(o.conn_id, qp, cm_id, True)
        try:
            # Linux ipoib_cm_send_req: no retries of its own over a reliable fabric; we
            # keep RNR retries unbounded since the SRQ may run dry under load.
            cm_id.connect(qp, ConnParams(service_id=o.service_id, dgid=o.peer.gid,
                                         sgid=self.gid, private_data=o.private_data,
                                         responder_resources=0, initiator_depth=0,
                                         retry_count=7, rnr_retry_count=7))
        except SoftRdmaError:
            self._drop_conn(o.conn_id, disconnect=False)
            self.engine.conn_closed(o.conn_id, time.monotonic(), refused=True)
            raise

    def _accept(self, o: ConnAccept) -> None:
        cm_id = self._requests.pop(o.token, None)
        if cm_id is None:
            return
        qp = self._new_qp(o.transport)
        self._register(o.conn_id, qp, cm_id, False)
        try:
            cm_id.accept(qp, AcceptParams(private_data=o.private_data, responder_resources=0,
                                          initiator_depth=0, rnr_retry_count=7))
        except SoftRdmaError:
            self._drop_conn(o.conn_id, disconnect=False)
            self.engine.conn_closed(o.conn_id, time.monotonic())
            raise

    def _drop_conn(self, conn_id: int, *, disconnect: bool) -> None:
        c = self._conns.pop(conn_id, None)
        if c is None:
            return
        self._by_qpn.pop(c.qp.qp_num, None)
        self._by_cmid.pop(id(c.cm_id), None)
        try:
            c.cm_id.destroy()  # sends the DREQ (or REJ) the state calls for
        except SoftRdmaError:
            pass
        self._graveyard.append(c.qp)

    # ---- CM events -----------------------------------------------------------------
    def _cm_event(self, ev: CmEvent) -> None:
        """Called by the CM binding's event delivery: queue, act from the loop."""
        self._cm_events.append(ev)

    def _handle_cm(self, now: float) -> None:
        while self._cm_events:
            ev = self._cm_events.popleft()
            cid = ev.cm_id
            if ev.type is CmEventType.CONNECT_REQUEST:
                self._tokens += 1
                self._requests[self._tokens] = cid
                req = ev.req
                uc = req is not None and req.transport_service_type == TransportServiceType.UC
                transport = "UC" if uc else "RC"
                peer = cid.path.dgid if cid.path is not None else bytes(16)
                self.engine.conn_request(self._tokens, peer, ev.private_data, transport, now)
                continue
            conn_id = self._by_cmid.get(id(cid))
            if conn_id is None:
                continue
            c = self._conns[conn_id]
            if ev.type is CmEventType.ESTABLISHED:
                self.engine.conn_established(
                    conn_id, now, rep_private_data=ev.private_data if c.active else None,
                    local_qpn=c.qp.qp_num, remote_qpn=cid.remote_qpn)
            elif ev.type in (CmEventType.REJECTED, CmEventType.UNREACHABLE,
                             CmEventType.CONNECT_ERROR, CmEventType.DISCONNECTED):
                self._drop_conn(conn_id, disconnect=False)
                self.engine.conn_closed(conn_id, now,
                                        refused=ev.type is not CmEventType.DISCONNECTED)
            self._execute(self.engine.take_output())
        self._execute(self.engine.take_output())
