"""QPs the consumer creates and moves itself, and the attributes the CM computes for them.

librdmacm lets an application connect a QP that is not the rdma_cm id's: it creates the
QP with ``ibv_create_qp``, names it by number in ``rdma_conn_param.qp_num`` and moves it
through INIT, RTR and RTS with the attributes of ``rdma_init_qp_attr`` (Linux
``ib_cm_init_qp_attr``: ``cm_init_qp_init_attr``/``cm_init_qp_rtr_attr``/
``cm_init_qp_rts_attr``); the active side then completes the connection with
``rdma_establish`` (the RTU) after CONNECT_RESPONSE. rping's ``-q`` does this. The CM
announces :class:`UserQp` ``qpn`` in its REQ or REP and never modifies that QP (nor
moves it to ERR on a disconnect: the application does, as rping's ``rping_disconnect``).

PSNs follow Linux's convention (see :mod:`.establish`): each side receives at
the Starting PSN it announces and sends from the peer's (``rdma_init_qp_attr`` sets
``rq_psn`` to the id's ``seq_num``, the PSN its REQ or REP carries). A passive side asked
for RTR before its REP draws that PSN then and the REP announces it
(the Starting PSN fields of the REQ and the REP, IBA 12.6.5 and 12.6.8).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import InvalidArgument, StateError
from ..wire import cm as wcm
from ..wire.cm import TransportServiceType
from . import qpctl
from .model import CmState
from .params import CmPath, ConnParams, SidrParams

__all__ = ["UserQp", "CONNECTED", "REQ_TRANSPORT", "req_qp_type", "connects_as", "qp_info",
           "cm_qp_attr",
           "passive_psn", "QpAttrId", "QpAttrAgent"]


class QpAttrAgent(Protocol):
    """What the QP attributes read of the CM agent: its PSN draws, the port's MTU code
    and GID table."""

    @property
    def rng(self) -> random.Random: ...
    @property
    def mtu(self) -> int: ...

    def sgid_index(self, sgid: bytes) -> int: ...


class QpAttrId(Protocol):
    """What :func:`cm_qp_attr` and :func:`passive_psn` read of a connection
    (:class:`~.cmid.IbCmId`): its state, messages, path and parameters; the passive
    side's Starting PSN is drawn into it at the first need."""

    local_psn: int
    psn_drawn: bool

    @property
    def agent(self) -> QpAttrAgent: ...
    @property
    def state(self) -> CmState: ...
    @property
    def req(self) -> wcm.Req | None: ...
    @property
    def rep(self) -> wcm.Rep | None: ...
    @property
    def path(self) -> CmPath | None: ...
    @property
    def params(self) -> ConnParams | SidrParams | None: ...
    @property
    def ack_timeout(self) -> int: ...
    @property
    def remote_qpn(self) -> int: ...

_PASSIVE = (CmState.REQ_RCVD, CmState.MRA_REQ_SENT, CmState.REP_SENT, CmState.MRA_REP_RCVD,
            CmState.ESTABLISHED)
_ACTIVE = (CmState.REP_RCVD, CmState.MRA_REP_SENT)


@dataclass(frozen=True, slots=True)
class UserQp:
    """A QP the consumer owns, named by number (``rdma_conn_param.qp_num``)."""

    qpn: int
    qp_type: int = qpctl.QPT_RC
    srq: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.qpn <= 0xFFFFFF:
            raise InvalidArgument("qp_num", f"a QP number is 24 bits and not 0, got "
                                            f"{self.qpn:#x}")
        if self.qp_type not in CONNECTED:
            raise InvalidArgument("qp_type", "a connection's QP is RC, UC or XRC")


#: the QP types a REQ/REP connection is made for (IBA 12.6.5; XRC: Annex A14)
CONNECTED = (qpctl.QPT_RC, qpctl.QPT_UC, qpctl.QPT_XRC_INI, qpctl.QPT_XRC_TGT)


#: a REQ's Transport Service Type and Extended Transport Type by the active side's QP
#: type (IBA 12.6.5 Table 107; Annex A14: 3 "see Extended Transport Type", 1 = XRC), and
#: the QP type a REQ's two fields ask the passive side for (linux cm_req_get_qp_type)
REQ_TRANSPORT = {qpctl.QPT_RC: (TransportServiceType.RC, 0),
                 qpctl.QPT_UC: (TransportServiceType.UC, 0),
                 qpctl.QPT_XRC_INI: (TransportServiceType.EXTENDED, 1)}
_PASSIVE_QPT: dict[tuple[int, int], int] = {
    (TransportServiceType.RC, 0): qpctl.QPT_RC,
    (TransportServiceType.UC, 0): qpctl.QPT_UC,
    (TransportServiceType.EXTENDED, 1): qpctl.QPT_XRC_TGT}


def connects_as(qp_type: int, conn_type: int) -> bool:
    """Whether a QP of ``qp_type`` can be connected by a REQ/REP of ``conn_type``: its
    own, or (an XRC QP) RC's, as Linux's rdma_cm connects an ``RDMA_PS_TCP`` id's XRC INI
    QP and accepts with an XRC TGT QP (the kernel's id is RC there, ``ucma_get_qp_type``;
    libfabric's XRC endpoints)."""
    return qp_type == conn_type or (
        conn_type == qpctl.QPT_RC and qp_type in (qpctl.QPT_XRC_INI, qpctl.QPT_XRC_TGT))


def req_qp_type(req: wcm.Req) -> int | None:
    """The QP type ``req`` asks the passive side for (RC, UC or XRC TGT), None for a
    transport this CM does not connect (a REJ "Invalid Transport Service Type"). The
    Extended Transport Type is read only with Transport Service Type 3 (IBA 12.6.5)."""
    ext = req.extended_transport_type if req.transport_service_type == \
        TransportServiceType.EXTENDED else 0
    return _PASSIVE_QPT.get((req.transport_service_type, ext))


def qp_info(qp: object) -> tuple[int, int, bool, qpctl.CmQp | None]:
    """``(qpn, qp_type, has_srq, engine QP or None)`` of a CM-moved QP or a
    :class:`UserQp` (engine None: the CM must leave it alone). An XRC QP's type is its
    XRC one (``xrc_qp_type``), not its engine's RC; an XRC TGT QP counts as having an
    SRQ (each request names the one it goes to)."""
    if isinstance(qp, UserQp):
        return qp.qpn, qp.qp_type, qp.srq or qp.qp_type == qpctl.QPT_XRC_TGT, None
    eq = qpctl.engine_of(qp)
    qpt = int(getattr(eq, "xrc_qp_type", eq.qp_type))
    return eq.qpn, qpt, qpt == qpctl.QPT_XRC_TGT or getattr(eq, "srq", None) is not None, eq


def passive_psn(cid: QpAttrId) -> int:
    """The Starting PSN the passive side's REP announces, drawn at the first need."""
    if not cid.psn_drawn:
        cid.local_psn = cid.agent.rng.getrandbits(24)
        cid.psn_drawn = True
    return cid.local_psn


def cm_qp_attr(cid: QpAttrId, qp_state: int) -> dict[str, Any]:
    """``ib_cm_init_qp_attr``: the attributes for moving this connection's QP to
    ``qp_state`` (INIT, RTR or RTS), as ``ibv_qp_attr`` field names (``ah_attr`` is the
    path: ``dgid``, ``sgid_index``, ``hop_limit``, ``traffic_class``, ``flow_label``)."""
    if qp_state == qpctl.INIT:
        if cid.state not in (*_PASSIVE, *_ACTIVE, CmState.REQ_SENT, CmState.MRA_REQ_RCVD):
            raise StateError(f"no QP attributes in CM state {cid.state.name}")
        return {"qp_state": qpctl.INIT, "pkey_index": 0, "port_num": 1,
                "qp_access_flags": qpctl.DEFAULT_ACCESS}
    req, rep, path = cid.req, cid.rep, cid.path
    if req is None or path is None:
        raise StateError(f"no QP attributes in CM state {cid.state.name} (no REQ yet)")
    av = {"dgid": path.dgid, "sgid_index": cid.agent.sgid_index(path.sgid),
          "hop_limit": path.hop_limit, "traffic_class": path.traffic_class,
          "flow_label": path.flow_label}
    if cid.state in _ACTIVE and rep is not None:
        p = cid.params
        assert isinstance(p, ConnParams)
        if qp_state == qpctl.RTR:
            return {"qp_state": qpctl.RTR, "dest_qp_num": cid.remote_qpn,
                    "rq_psn": cid.local_psn, "path_mtu": req.path_mtu,
                    "max_dest_rd_atomic": min(rep.initiator_depth, p.responder_resources),
                    "min_rnr_timer": p.min_rnr_timer, "ah_attr": av}
        if qp_state == qpctl.RTS:
            return {"qp_state": qpctl.RTS, "sq_psn": rep.starting_psn,
                    "timeout": cid.ack_timeout, "retry_cnt": p.retry_count,
                    "rnr_retry": rep.rnr_retry_count,
                    "max_rd_atomic": min(rep.responder_resources, p.initiator_depth)}
    elif cid.state in _PASSIVE:
        if qp_state == qpctl.RTR:
            mtu = min(req.path_mtu, cid.agent.mtu) if req.path_mtu else cid.agent.mtu
            return {"qp_state": qpctl.RTR, "dest_qp_num": req.local_qpn,
                    "rq_psn": passive_psn(cid), "path_mtu": mtu,
                    "max_dest_rd_atomic": req.initiator_depth, "min_rnr_timer": 0,
                    "ah_attr": av}
        if qp_state == qpctl.RTS:
            return {"qp_state": qpctl.RTS, "sq_psn": req.starting_psn,
                    "timeout": req.primary_local_ack_timeout, "retry_cnt": req.retry_count,
                    "rnr_retry": req.rnr_retry_count,
                    "max_rd_atomic": req.responder_resources}
    else:
        raise StateError(f"no QP attributes in CM state {cid.state.name}")
    raise InvalidArgument("qp_state", f"INIT, RTR or RTS, got {qp_state}")
