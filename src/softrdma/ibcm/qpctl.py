"""QP transitions made by the CM (IBA 12.9.6-12.9.7, 11.2.5; linux ``cm_init_qp_*_attr``).

The CM moves a connection's QP RESET -> INIT -> RTR -> RTS from the REQ/REP parameters
and to ERR on teardown (IBA 12.9.8: a DREQ sent or received flushes the QP). It works
on the engine QP (:class:`softrdma.ib.qp.EngineQP`, or a verbs ``QP`` whose ``engine``
attribute is one) under the runtime lock, where the verbs layer's own lock cannot be
taken again, so the attributes are built here already valid for the transition.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from ..enums import ibv_access_flags as Access
from ..enums import ibv_qp_state as Qps
from ..enums import ibv_qp_type as Qpt
from ..errors import InvalidArgument
from ..ib.qp import AddressVector, EngineQP

__all__ = ["CmQp", "engine_of", "to_init", "to_rtr", "to_rts", "ud_to_rts", "to_err", "drained", "RESET", "INIT",
           "RTR", "RTS", "ERR", "QPT_RC", "QPT_UC", "QPT_UD", "QPT_XRC_INI", "QPT_XRC_TGT",
           "DEFAULT_ACCESS"]

RESET = int(Qps.IBV_QPS_RESET)
INIT = int(Qps.IBV_QPS_INIT)
RTR = int(Qps.IBV_QPS_RTR)
RTS = int(Qps.IBV_QPS_RTS)
ERR = int(Qps.IBV_QPS_ERR)
QPT_RC = int(Qpt.IBV_QPT_RC)
QPT_UC = int(Qpt.IBV_QPT_UC)
QPT_UD = int(Qpt.IBV_QPT_UD)
#: XRC (IBA Annex A14): the initiator and target QPs (verbs ``IBV_QPT_XRC_SEND`` /
#: ``IBV_QPT_XRC_RECV``, Linux ``IB_QPT_XRC_INI`` / ``IB_QPT_XRC_TGT``); their engine
#: QPs are RC ones (``softrdma.ib.xrc``) that name the XRC type in ``xrc_qp_type``
QPT_XRC_INI = int(Qpt.IBV_QPT_XRC_SEND)
QPT_XRC_TGT = int(Qpt.IBV_QPT_XRC_RECV)

# rdma_cm (cma.c ``cma_init_ib_qp`` / ``rdma_init_qp_attr``): remote read and write,
# plus local write for receives; atomics are granted too (rxe supports them).
DEFAULT_ACCESS = int(Access.IBV_ACCESS_LOCAL_WRITE | Access.IBV_ACCESS_REMOTE_WRITE
                     | Access.IBV_ACCESS_REMOTE_READ | Access.IBV_ACCESS_REMOTE_ATOMIC)


class CmQp(Protocol):
    """What the CM needs of a QP (``softrdma.ib.qp.EngineQP`` has it)."""

    qpn: int
    qp_type: int
    state: int
    srq: Any
    qkey: int

    def modify(self, attrs: dict[str, Any], now: float) -> None: ...


def engine_of(qp: object) -> CmQp:
    """The engine QP behind ``qp`` (a verbs QP's ``engine``, or ``qp`` itself)."""
    eq = getattr(qp, "engine", qp)
    for attr in ("qpn", "qp_type", "state", "modify"):
        if not hasattr(eq, attr):
            raise InvalidArgument("qp", f"not a QP (no {attr!r}): {qp!r}")
    return cast(CmQp, eq)  # its attributes were checked above


def to_init(qp: CmQp, now: float, *, qkey: int | None = None,
            access: int = DEFAULT_ACCESS) -> None:
    """RESET -> INIT (P_Key index 0, port 1; UD: the Q_Key). A QP already past RESET is
    left alone (the consumer prepared it)."""
    if qp.state != RESET:
        return
    attrs: dict[str, Any] = {"qp_state": INIT, "pkey_index": 0, "port_num": 1}
    if qp.qp_type == QPT_UD:
        attrs["qkey"] = qkey if qkey is not None else qp.qkey
    else:
        attrs["access_flags"] = access
    qp.modify(attrs, now)


def to_rtr(qp: CmQp, now: float, *, dest_qpn: int, rq_psn: int, path_mtu: int,
           max_dest_rd_atomic: int, min_rnr_timer: int, av: AddressVector) -> None:
    """INIT -> RTR with the remote QPN, the expected PSN, path MTU and address vector
    (linux ``cm_init_qp_rtr_attr``)."""
    if qp.state != INIT:
        raise InvalidArgument("qp", f"the QP must be in INIT to become RTR, it is in "
                                    f"{Qps(qp.state).name}")
    attrs: dict[str, Any] = {"qp_state": RTR, "path_mtu": path_mtu, "dest_qp_num": dest_qpn,
                             "rq_psn": rq_psn, "ah": av}
    if qp.qp_type == QPT_RC:
        attrs["max_dest_rd_atomic"] = max_dest_rd_atomic
        attrs["min_rnr_timer"] = min_rnr_timer
    qp.modify(attrs, now)


def to_rts(qp: CmQp, now: float, *, sq_psn: int, timeout: int, retry_cnt: int,
           rnr_retry: int, max_rd_atomic: int) -> None:
    """RTR -> RTS with the send PSN and the retry parameters (``cm_init_qp_rts_attr``)."""
    if qp.state != RTR:
        raise InvalidArgument("qp", f"the QP must be in RTR to become RTS, it is in "
                                    f"{Qps(qp.state).name}")
    attrs: dict[str, Any] = {"qp_state": RTS, "sq_psn": sq_psn}
    if qp.qp_type == QPT_RC:
        attrs.update(timeout=timeout, retry_cnt=retry_cnt, rnr_retry=rnr_retry,
                     max_rd_atomic=max_rd_atomic)
    qp.modify(attrs, now)


def ud_to_rts(qp: CmQp, now: float, qkey: int) -> None:
    """A UD QP of a SIDR service: RESET -> INIT (Q_Key) -> RTR -> RTS if still in RESET."""
    if qp.state != RESET:
        return
    to_init(qp, now, qkey=qkey)
    qp.modify({"qp_state": RTR}, now)
    qp.modify({"qp_state": RTS, "sq_psn": 0}, now)


def to_err(qp: CmQp | None, now: float) -> None:
    """Move to ERR, flushing every outstanding WQE (IBA 10.3.1.7), unless RESET or ERR."""
    if qp is None or qp.state in (RESET, ERR) or getattr(qp, "destroyed", False):
        return
    qp.modify({"qp_state": ERR}, now)


def drained(qp: object) -> bool:
    """True if ``qp`` is an RC engine QP in RTR, RTS or SQD with nothing in flight: no
    send WQE transmitted and not yet acknowledged (IBA 9.7.5.1: a request stays
    outstanding until its ACK or response came back, so every packet it sent has reached
    its responder) and no coalesced ACK of its own pending. A DREQ between two such QPs
    of one port overtakes no packet of theirs (IBA 12.9.6: the DREQ moves the peer's QP
    to ERR). False for any other QP: UC and UD complete their sends before the packets
    arrive, and a QP in ERR (or SQE) flushed WQEs whose packets may still be on their way
    (IBA 10.3.1.7)."""
    eq = getattr(qp, "engine", qp)
    if not isinstance(eq, EngineQP) or eq.qp_type != QPT_RC or eq.destroyed:
        return False
    return eq.state in _SENT_ALL_IT_SAYS and eq.ack_psn < 0 and not eq.req.in_flight()


#: the states where a QP's send queue still tells what it has in flight
_SENT_ALL_IT_SAYS = (RTR, RTS, int(Qps.IBV_QPS_SQD))
