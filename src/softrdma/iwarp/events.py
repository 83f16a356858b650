"""What an iWARP connection tells the layers above it: typed, frozen connection events.

An :class:`~.engine.IwarpConn` appends one of these to :attr:`~.engine.IwarpConn.events`
each time its stream changes phase; the driver (the TCP runtime) or the connection
manager takes them with :meth:`~.engine.IwarpConn.pop_events` after an engine call and
acts on them outside the engine (wakes a waiting ``connect``/``accept``, reports
DISCONNECTED). A connection emits at most three in its life: :class:`MpaRequestReceived`
(responder only), :class:`Established`, then one of the end events.

The phases are those of the MPA connection setup (RFC 5044 §7.1), full operation
(FPDUs, RFC 5044 §4) and stream teardown (RFC 5040 §5.4 Terminate, §6.2 LLP close), as Linux's
iw_cm reports them (``IW_CM_EVENT_CONNECT_REQUEST``, ``_ESTABLISHED``, ``_CONNECT_REPLY``
with -ECONNREFUSED, ``_CLOSE``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..wire.ddp import Terminate
from ..wire.mpa import MpaRequest
from .mpa_setup import ConnectionRejected, Negotiated
from .terminate import IwarpFault

__all__ = ["ConnEvent", "MpaRequestReceived", "Established", "Rejected", "Failed",
           "Terminated", "Closed"]


@dataclass(frozen=True, slots=True)
class MpaRequestReceived:
    """Responder: the peer's MPA Request parsed (RFC 5044 §7.1); the connection now
    waits for :meth:`~.engine.IwarpConn.accept` or :meth:`~.engine.IwarpConn.reject`."""

    request: MpaRequest


@dataclass(frozen=True, slots=True)
class Established:
    """MPA setup done, the stream is in full operation (RFC 5044 §7.1)."""

    negotiated: Negotiated


@dataclass(frozen=True, slots=True)
class Rejected:
    """Initiator: the responder's Reply had R set (RFC 5044 §7.1.1)."""

    rejected: ConnectionRejected


@dataclass(frozen=True, slots=True)
class Failed:
    """The stream ended on an error: this side's fault (its Terminate is queued,
    RFC 5040 §7.1), or the peer's FIN before full operation. ``during_setup`` is true
    when MPA setup had not completed."""

    reason: str
    fault: IwarpFault | None
    during_setup: bool


@dataclass(frozen=True, slots=True)
class Terminated:
    """The peer sent a Terminate (RFC 5040 §5.4); ``term`` is None if it was malformed."""

    reason: str
    term: Terminate | None


@dataclass(frozen=True, slots=True)
class Closed:
    """The peer closed the stream in full operation (LLP close, RFC 5040 §6.2)."""

    reason: str


ConnEvent = MpaRequestReceived | Established | Rejected | Failed | Terminated | Closed
