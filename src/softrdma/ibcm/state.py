"""The CM state machine of IBA Vol 1 §12.9 as data: ``(state, input) -> (action, next state)``.

States are those of IBA Figures 149-153 (connection establishment, release, SIDR) with
Linux's names (``enum ib_cm_state``); inputs are the typed frozen dataclasses of
:mod:`softrdma.ibcm.model`: consumer requests (:class:`~.model.Connect`,
:class:`~.model.AcceptConn` ...), received messages (:class:`~.model.Received` of a
``softrdma.wire.cm`` body, a duplicate being just another receipt of the same message in
a later state), timer expiries and the QP's communication-established event.

:data:`TRANSITIONS` is the whole machine: a pair that is not in the table is not a legal
transition. A consumer request outside the table raises
:class:`~softrdma.errors.StateError`; a message outside the table is dropped and
counted (IBA 12.9: a message a state does not expect is discarded). An action is a plain function ``(id, now, input) -> CmState | None`` of
:mod:`.establish`, :mod:`.release`, :mod:`.mra_lap`, :mod:`.retry` or :mod:`.sidr`; it
may return a different next state when its outcome decides it (a timer that still has
retries left stays, one that has none moves on). Every row is built by :func:`_on` or
:func:`_on_msg`, whose signatures make mypy check that the action takes the row's input.

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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar, cast

from ..wire import cm as wcm
from . import establish as es
from . import mra_lap as ml
from . import release as rl
from . import sidr as sd
from .model import (
    PENDING_STATES,
    AcceptConn,
    CmInput,
    CmState,
    CommEst,
    Connect,
    Disconnect,
    Establish,
    Listen,
    Received,
    Reject,
    SendDrep,
    SendMra,
    SidrResolve,
    Timeout,
)
from .retry import retry_or_fail

if TYPE_CHECKING:
    from .cmid import IbCmId

__all__ = ["CmState", "PENDING_STATES", "Row", "TRANSITIONS", "InputKind", "input_kind",
           "transition"]

InT = TypeVar("InT", bound=CmInput, contravariant=True)
MsgT = TypeVar("MsgT", bound=wcm.CmMessage)

#: what the table is keyed by besides the state: an input class, or for
#: :class:`~.model.Received` the class of the message received
InputKind = type


@dataclass(frozen=True, slots=True)
class Row(Generic[InT]):
    """One transition: the action run on the input, and the state after it (unless the
    action returns another); ``spawns``: the state of the new id the action may create
    (a listener's REQ or SIDR_REQ, IBA Figures 150 and 153)."""

    action: Callable[[IbCmId, float, InT], CmState | None]
    next_state: CmState
    spawns: CmState | None = None


TRANSITIONS: dict[tuple[CmState, InputKind], Row[CmInput]] = {}


def _on(state: CmState, kind: type[InT], action: Callable[[IbCmId, float, InT], CmState | None],
        nxt: CmState) -> None:
    """Row for a consumer request, timer or event input of class ``kind``."""
    assert (state, kind) not in TRANSITIONS, (state, kind)
    TRANSITIONS[(state, kind)] = cast("Row[CmInput]", Row(action, nxt))


def _on_msg(state: CmState, kind: type[MsgT],
            action: Callable[[IbCmId, float, Received[MsgT]], CmState | None],
            nxt: CmState, spawns: CmState | None = None) -> None:
    """Row for receiving a message of class ``kind``."""
    assert (state, kind) not in TRANSITIONS, (state, kind)
    TRANSITIONS[(state, kind)] = cast("Row[CmInput]", Row(action, nxt, spawns))


def input_kind(inp: CmInput) -> InputKind:
    """The table key of an input: its class, or the received message's class."""
    return type(inp.msg) if isinstance(inp, Received) else type(inp)


def transition(state: CmState, inp: InT) -> Row[InT] | None:
    """The table row for ``(state, inp)``, None when the pair is not a transition. The
    row's action takes ``inp`` (each row was checked so when it was built)."""
    return cast("Row[InT] | None", TRANSITIONS.get((state, input_kind(inp))))


S = CmState
# ---- active side: IBA Figure 149 (REQ_SENT ... ESTABLISHED)
_on(S.IDLE, Connect, es.send_req, S.REQ_SENT)
for _s in (S.REQ_SENT, S.MRA_REQ_RCVD):
    _on_msg(_s, wcm.Rep, es.rep_received, S.REP_RCVD)
    _on_msg(_s, wcm.Mra, ml.mra_received, S.MRA_REQ_RCVD)
    _on_msg(_s, wcm.Rej, rl.rej_received, S.IDLE)
    _on(_s, Timeout, retry_or_fail, _s)
    _on(_s, Disconnect, es.abort_req, S.IDLE)
_on(S.REP_RCVD, Establish, es.send_rtu, S.ESTABLISHED)
_on(S.REP_RCVD, SendMra, ml.send_mra, S.MRA_REP_SENT)
_on_msg(S.REP_RCVD, wcm.Rep, ml.dup_rep_mra, S.MRA_REP_SENT)
_on(S.MRA_REP_SENT, Establish, es.send_rtu, S.ESTABLISHED)
_on_msg(S.MRA_REP_SENT, wcm.Rep, ml.resend, S.MRA_REP_SENT)
for _s in (S.REP_RCVD, S.MRA_REP_SENT):
    _on(_s, Reject, rl.send_rej, S.TIMEWAIT)
    _on(_s, Disconnect, rl.send_rej, S.TIMEWAIT)
    _on_msg(_s, wcm.Rej, rl.rej_received, S.TIMEWAIT)
    _on_msg(_s, wcm.Dreq, rl.dreq_received, S.DREQ_RCVD)
# ---- passive side: IBA Figure 150 (REQ_RCVD ... ESTABLISHED)
_on(S.REQ_RCVD, SendMra, ml.send_mra, S.MRA_REQ_SENT)
_on_msg(S.REQ_RCVD, wcm.Req, ml.dup_req_mra, S.MRA_REQ_SENT)
_on_msg(S.MRA_REQ_SENT, wcm.Req, ml.resend, S.MRA_REQ_SENT)
for _s in (S.REQ_RCVD, S.MRA_REQ_SENT):
    _on(_s, AcceptConn, es.send_rep, S.REP_SENT)
    _on(_s, Reject, rl.send_rej, S.IDLE)
    _on(_s, Disconnect, rl.send_rej, S.IDLE)
    _on_msg(_s, wcm.Rej, rl.rej_received, S.IDLE)
_on_msg(S.REP_SENT, wcm.Req, ml.resend, S.REP_SENT)
for _s in (S.REP_SENT, S.MRA_REP_RCVD):
    _on_msg(_s, wcm.Rtu, es.rtu_received, S.ESTABLISHED)
    _on(_s, CommEst, es.comm_est, S.ESTABLISHED)
    _on_msg(_s, wcm.Mra, ml.mra_received, S.MRA_REP_RCVD)
    _on_msg(_s, wcm.Rej, rl.rej_received, S.IDLE)
    _on_msg(_s, wcm.Dreq, rl.dreq_received, S.DREQ_RCVD)
    _on(_s, Timeout, retry_or_fail, _s)
    _on(_s, Disconnect, rl.send_dreq, S.DREQ_SENT)
# ---- established: IBA Figure 151 (connection release) and 12.8 (LAP)
_on_msg(S.ESTABLISHED, wcm.Rep, ml.resend, S.ESTABLISHED)
_on(S.ESTABLISHED, Disconnect, rl.send_dreq, S.DREQ_SENT)
_on_msg(S.ESTABLISHED, wcm.Dreq, rl.dreq_received, S.DREQ_RCVD)
_on_msg(S.ESTABLISHED, wcm.Rej, rl.rej_received, S.TIMEWAIT)
_on_msg(S.ESTABLISHED, wcm.Lap, ml.lap_received, S.ESTABLISHED)
_on_msg(S.DREQ_SENT, wcm.Drep, rl.drep_received, S.TIMEWAIT)
_on_msg(S.DREQ_SENT, wcm.Dreq, rl.dreq_received, S.DREQ_RCVD)
_on_msg(S.DREQ_SENT, wcm.Rej, rl.rej_received, S.TIMEWAIT)
_on(S.DREQ_SENT, Timeout, retry_or_fail, S.DREQ_SENT)
_on(S.DREQ_SENT, Disconnect, rl.noop, S.DREQ_SENT)
_on(S.DREQ_RCVD, SendDrep, rl.send_drep, S.TIMEWAIT)
_on(S.DREQ_RCVD, Disconnect, rl.send_drep, S.TIMEWAIT)
_on_msg(S.TIMEWAIT, wcm.Dreq, rl.drep_again, S.TIMEWAIT)
_on_msg(S.TIMEWAIT, wcm.Req, rl.rej_stale, S.TIMEWAIT)
_on(S.TIMEWAIT, Timeout, rl.timewait_exit, S.IDLE)
_on(S.TIMEWAIT, Disconnect, rl.noop, S.TIMEWAIT)
# ---- SIDR: IBA Figure 153 (12.11)
_on(S.IDLE, SidrResolve, sd.send_sidr_req, S.SIDR_REQ_SENT)
_on_msg(S.SIDR_REQ_SENT, wcm.SidrRep, sd.sidr_rep_received, S.IDLE)
_on(S.SIDR_REQ_SENT, Timeout, retry_or_fail, S.SIDR_REQ_SENT)
_on(S.SIDR_REQ_SENT, Disconnect, sd.cancel, S.IDLE)
_on(S.SIDR_REQ_RCVD, AcceptConn, sd.send_sidr_rep, S.IDLE)
_on(S.SIDR_REQ_RCVD, Reject, sd.send_sidr_rej, S.IDLE)
_on(S.SIDR_REQ_RCVD, Disconnect, sd.send_sidr_rej, S.IDLE)
# ---- a listener: the passive open, IBA Figure 150 (REQ) and 12.11.2 (SIDR_REQ); the
# listener stays in LISTEN, each request it takes is a new id (Linux cm_req_handler)
_on(S.IDLE, Listen, es.start_listen, S.LISTEN)
_on_msg(S.LISTEN, wcm.Req, es.req_received, S.LISTEN, spawns=S.REQ_RCVD)
_on_msg(S.LISTEN, wcm.SidrReq, sd.sidr_req_received, S.LISTEN, spawns=S.SIDR_REQ_RCVD)
_on(S.LISTEN, Disconnect, rl.noop, S.IDLE)
del S, _s
