"""The CM state machine of IBA Vol 1 §12.9 as data: ``(state, event) -> (action, next state)``.

States are those of IBA Figure 149-153 (connection establishment, release, SIDR) with
Linux's names (``enum ib_cm_state``). Events are either consumer requests (``API_*``),
received messages (``RECV_*``, a duplicate being just another receipt of the same
message in a later state), timer expiries or the QP's communication-established event.

:data:`TRANSITIONS` is the whole machine: a pair that is not in the table is not a legal
transition. A consumer request outside the table raises
:class:`~softrdma.errors.StateError`; a message outside the table is dropped and
counted (IBA 12.9; as Linux ``cm.c``: "messages received in a state that does not expect them are
discarded"). Each action is a method ``_a_<action>`` of
:class:`~softrdma.cm.ibcm.CmId`; it may return a different next state when its outcome
decides it (a timer that still has retries left stays, one that has none moves on).

The choices where IBA leaves room follow Linux ``drivers/infiniband/core/cm.c``:

* a duplicate REQ in REQ_RCVD is answered with an MRA (the consumer is still deciding;
  rdma_cm's ``CMA_CM_MRA_SETTING``), in MRA_REQ_SENT the MRA is resent, in REP_SENT the
  REP is resent, in TIMEWAIT the REQ is rejected as stale (``cm_dup_req_handler``);
* a duplicate REP in ESTABLISHED resends the RTU, in MRA_REP_SENT the MRA
  (``cm_dup_rep_handler``);
* a REJ moves REQ_SENT/REQ_RCVD/REP_SENT to IDLE (TIMEWAIT for "stale connection") and
  REP_RCVD/ESTABLISHED/DREQ_SENT to TIMEWAIT (``cm_rej_handler``);
* a DREQ is answered with a DREP at once (the connection is gone either way) and a DREQ
  received in TIMEWAIT gets the DREP again (``cm_dreq_handler``).
"""

from __future__ import annotations

from enum import Enum, IntEnum

__all__ = ["CmState", "CmEv", "TRANSITIONS", "API_EVENTS", "transition"]


class CmState(IntEnum):
    """Communication states (IBA 12.9; linux ``enum ib_cm_state``)."""

    IDLE = 0
    LISTEN = 1
    REQ_SENT = 2
    REQ_RCVD = 3
    MRA_REQ_SENT = 4
    MRA_REQ_RCVD = 5
    REP_SENT = 6
    REP_RCVD = 7
    MRA_REP_SENT = 8
    MRA_REP_RCVD = 9
    ESTABLISHED = 10
    DREQ_SENT = 11
    DREQ_RCVD = 12
    TIMEWAIT = 13
    SIDR_REQ_SENT = 14
    SIDR_REQ_RCVD = 15


class CmEv(Enum):
    """Inputs of the state machine."""

    API_CONNECT = "connect"
    API_ACCEPT = "accept"
    API_REJECT = "reject"
    API_RTU = "establish"
    API_MRA = "send_mra"
    API_DISCONNECT = "disconnect"
    API_DREP = "drep"
    API_SIDR = "sidr_resolve"
    RECV_REQ = "REQ"
    RECV_MRA = "MRA"
    RECV_REJ = "REJ"
    RECV_REP = "REP"
    RECV_RTU = "RTU"
    RECV_DREQ = "DREQ"
    RECV_DREP = "DREP"
    RECV_LAP = "LAP"
    RECV_SIDR_REP = "SIDR_REP"
    TIMEOUT = "timeout"
    COMM_EST = "comm_est"


API_EVENTS = frozenset(e for e in CmEv if e.name.startswith("API_"))

S = CmState
E = CmEv

# (state, event) -> (action, next state)
TRANSITIONS: dict[tuple[CmState, CmEv], tuple[str, CmState]] = {
    # ---- active side: IBA Figure 149 (REQ_SENT ... ESTABLISHED)
    (S.IDLE, E.API_CONNECT): ("send_req", S.REQ_SENT),
    (S.REQ_SENT, E.RECV_REP): ("rep_received", S.REP_RCVD),
    (S.REQ_SENT, E.RECV_MRA): ("mra_received", S.MRA_REQ_RCVD),
    (S.REQ_SENT, E.RECV_REJ): ("rej_received", S.IDLE),
    (S.REQ_SENT, E.TIMEOUT): ("retry_or_fail", S.REQ_SENT),
    (S.REQ_SENT, E.API_DISCONNECT): ("abort_req", S.IDLE),
    (S.MRA_REQ_RCVD, E.RECV_REP): ("rep_received", S.REP_RCVD),
    (S.MRA_REQ_RCVD, E.RECV_MRA): ("mra_received", S.MRA_REQ_RCVD),
    (S.MRA_REQ_RCVD, E.RECV_REJ): ("rej_received", S.IDLE),
    (S.MRA_REQ_RCVD, E.TIMEOUT): ("retry_or_fail", S.MRA_REQ_RCVD),
    (S.MRA_REQ_RCVD, E.API_DISCONNECT): ("abort_req", S.IDLE),
    (S.REP_RCVD, E.API_RTU): ("send_rtu", S.ESTABLISHED),
    (S.REP_RCVD, E.API_MRA): ("send_mra", S.MRA_REP_SENT),
    (S.REP_RCVD, E.RECV_REP): ("dup_rep_mra", S.MRA_REP_SENT),
    (S.REP_RCVD, E.API_REJECT): ("send_rej", S.TIMEWAIT),
    (S.REP_RCVD, E.API_DISCONNECT): ("send_rej", S.TIMEWAIT),
    (S.REP_RCVD, E.RECV_REJ): ("rej_received", S.TIMEWAIT),
    (S.REP_RCVD, E.RECV_DREQ): ("dreq_received", S.DREQ_RCVD),
    (S.MRA_REP_SENT, E.API_RTU): ("send_rtu", S.ESTABLISHED),
    (S.MRA_REP_SENT, E.RECV_REP): ("resend", S.MRA_REP_SENT),
    (S.MRA_REP_SENT, E.API_REJECT): ("send_rej", S.TIMEWAIT),
    (S.MRA_REP_SENT, E.API_DISCONNECT): ("send_rej", S.TIMEWAIT),
    (S.MRA_REP_SENT, E.RECV_REJ): ("rej_received", S.TIMEWAIT),
    (S.MRA_REP_SENT, E.RECV_DREQ): ("dreq_received", S.DREQ_RCVD),
    # ---- passive side: IBA Figure 150 (REQ_RCVD ... ESTABLISHED)
    (S.REQ_RCVD, E.API_ACCEPT): ("send_rep", S.REP_SENT),
    (S.REQ_RCVD, E.API_REJECT): ("send_rej", S.IDLE),
    (S.REQ_RCVD, E.API_DISCONNECT): ("send_rej", S.IDLE),
    (S.REQ_RCVD, E.API_MRA): ("send_mra", S.MRA_REQ_SENT),
    (S.REQ_RCVD, E.RECV_REQ): ("dup_req_mra", S.MRA_REQ_SENT),
    (S.REQ_RCVD, E.RECV_REJ): ("rej_received", S.IDLE),
    (S.MRA_REQ_SENT, E.API_ACCEPT): ("send_rep", S.REP_SENT),
    (S.MRA_REQ_SENT, E.API_REJECT): ("send_rej", S.IDLE),
    (S.MRA_REQ_SENT, E.API_DISCONNECT): ("send_rej", S.IDLE),
    (S.MRA_REQ_SENT, E.RECV_REQ): ("resend", S.MRA_REQ_SENT),
    (S.MRA_REQ_SENT, E.RECV_REJ): ("rej_received", S.IDLE),
    (S.REP_SENT, E.RECV_RTU): ("rtu_received", S.ESTABLISHED),
    (S.REP_SENT, E.COMM_EST): ("rtu_received", S.ESTABLISHED),
    (S.REP_SENT, E.RECV_MRA): ("mra_received", S.MRA_REP_RCVD),
    (S.REP_SENT, E.RECV_REQ): ("resend", S.REP_SENT),
    (S.REP_SENT, E.RECV_REJ): ("rej_received", S.IDLE),
    (S.REP_SENT, E.RECV_DREQ): ("dreq_received", S.DREQ_RCVD),
    (S.REP_SENT, E.TIMEOUT): ("retry_or_fail", S.REP_SENT),
    (S.REP_SENT, E.API_DISCONNECT): ("send_dreq", S.DREQ_SENT),
    (S.MRA_REP_RCVD, E.RECV_RTU): ("rtu_received", S.ESTABLISHED),
    (S.MRA_REP_RCVD, E.COMM_EST): ("rtu_received", S.ESTABLISHED),
    (S.MRA_REP_RCVD, E.RECV_MRA): ("mra_received", S.MRA_REP_RCVD),
    (S.MRA_REP_RCVD, E.RECV_REJ): ("rej_received", S.IDLE),
    (S.MRA_REP_RCVD, E.RECV_DREQ): ("dreq_received", S.DREQ_RCVD),
    (S.MRA_REP_RCVD, E.TIMEOUT): ("retry_or_fail", S.MRA_REP_RCVD),
    (S.MRA_REP_RCVD, E.API_DISCONNECT): ("send_dreq", S.DREQ_SENT),
    # ---- established: IBA Figure 151 (connection release) and 12.8 (LAP)
    (S.ESTABLISHED, E.RECV_REP): ("resend", S.ESTABLISHED),
    (S.ESTABLISHED, E.API_DISCONNECT): ("send_dreq", S.DREQ_SENT),
    (S.ESTABLISHED, E.RECV_DREQ): ("dreq_received", S.DREQ_RCVD),
    (S.ESTABLISHED, E.RECV_REJ): ("rej_received", S.TIMEWAIT),
    (S.ESTABLISHED, E.RECV_LAP): ("lap_received", S.ESTABLISHED),
    (S.DREQ_SENT, E.RECV_DREP): ("drep_received", S.TIMEWAIT),
    (S.DREQ_SENT, E.RECV_DREQ): ("dreq_received", S.DREQ_RCVD),
    (S.DREQ_SENT, E.RECV_REJ): ("rej_received", S.TIMEWAIT),
    (S.DREQ_SENT, E.TIMEOUT): ("retry_or_fail", S.DREQ_SENT),
    (S.DREQ_SENT, E.API_DISCONNECT): ("noop", S.DREQ_SENT),
    (S.DREQ_RCVD, E.API_DREP): ("send_drep", S.TIMEWAIT),
    (S.DREQ_RCVD, E.API_DISCONNECT): ("send_drep", S.TIMEWAIT),
    (S.TIMEWAIT, E.RECV_DREQ): ("drep_again", S.TIMEWAIT),
    (S.TIMEWAIT, E.RECV_REQ): ("rej_stale", S.TIMEWAIT),
    (S.TIMEWAIT, E.TIMEOUT): ("timewait_exit", S.IDLE),
    (S.TIMEWAIT, E.API_DISCONNECT): ("noop", S.TIMEWAIT),
    # ---- SIDR: IBA Figure 153
    (S.IDLE, E.API_SIDR): ("send_sidr_req", S.SIDR_REQ_SENT),
    (S.SIDR_REQ_SENT, E.RECV_SIDR_REP): ("sidr_rep_received", S.IDLE),
    (S.SIDR_REQ_SENT, E.TIMEOUT): ("retry_or_fail", S.SIDR_REQ_SENT),
    (S.SIDR_REQ_SENT, E.API_DISCONNECT): ("cancel", S.IDLE),
    (S.SIDR_REQ_RCVD, E.API_ACCEPT): ("send_sidr_rep", S.IDLE),
    (S.SIDR_REQ_RCVD, E.API_REJECT): ("send_sidr_rej", S.IDLE),
    (S.SIDR_REQ_RCVD, E.API_DISCONNECT): ("send_sidr_rej", S.IDLE),
    # ---- a listener
    (S.LISTEN, E.API_DISCONNECT): ("stop_listen", S.IDLE),
}

del S, E


def transition(state: CmState, ev: CmEv) -> tuple[str, CmState] | None:
    """The table row for ``(state, ev)``, None when the pair is not a transition."""
    return TRANSITIONS.get((state, ev))
