"""MPA connection setup: what to send and what was agreed (RFC 5044 §7.1, RFC 6581).

Pure functions over :mod:`softrdma.wire.mpa` frames, with siw's rules (``siw_cm.c``
``siw_proc_mpareq``, ``siw_accept``, ``siw_proc_mpareply``; RFC 5044 §7.1, RFC 6581):

* C (CRC) is used in both directions if either frame sets it (RFC 5044: "CRC MUST be used
  if peer requests it"); M is per direction: the sender of a frame with M asks the peer
  to put markers in the FPDUs it sends to it.
* Revision 2 with the Enhanced flag carries the IRD/ORD block first in the private data.
  The responder replies with its IRD and ``min(its ORD, the initiator's IRD)``; the
  initiator then takes ``IRD := reply ORD`` and ``ORD := reply IRD``. With
  ``strict_ird`` (siw's ``relaxed_ird_negotiation = false``) an initiator whose IRD is
  below the reply's ORD, or whose ORD is above the reply's IRD, fails with an LLP
  Terminate "Insufficient IRD resources" (0x06); relaxed (siw's default) fails only when
  the reply's ORD exceeds the device maximum.
* Peer-to-peer / RTR (RFC 6581 §4): the initiator offers RTR types; the responder picks
  one (Write if offered, else Read, else Send; siw never picks Send, and picks Write when
  nothing is offered); a reply that picks none of the offered types fails with
  "No matching RTR option" (0x07).
* An Enhanced request must be answered by a revision 2 Enhanced reply; anything else, a
  wrong key or a malformed frame is "Invalid MPA Request/Reply frame" (0x04).
"""

from __future__ import annotations

import errno as _errno
from dataclasses import dataclass, replace

from ..errors import InvalidArgument, SoftRdmaError
from ..wire.ddp import MpaErrorCode
from ..wire.mpa import MPA_REVISION_1, MPA_REVISION_2, MpaFrame, MpaReply, MpaRequest, MpaV2Params
from .terminate import IwarpFault

__all__ = ["MpaConfig", "Negotiated", "ConnectionRejected", "build_request", "respond",
           "check_reply", "MAX_RD_DEPTH", "RTR_WRITE", "RTR_READ", "RTR_SEND",
           "MPA_CRC_ENV", "parse_on_off", "device_mpa_crc", "with_device_crc"]

MAX_RD_DEPTH = 128  # siw SIW_MAX_ORD_QP / SIW_MAX_IRD_QP
RTR_WRITE = "write"
RTR_READ = "read"
RTR_SEND = "send"


class ConnectionRejected(SoftRdmaError):
    """The responder refused the connection (MPA Reply with R set); ``private_data`` is
    the user part of its private data. rdma_cm reports this as ECONNREFUSED."""

    errno = _errno.ECONNREFUSED

    def __init__(self, private_data: bytes) -> None:
        super().__init__("the peer rejected the connection (MPA Reply with R set)")
        self.private_data = private_data


# A Linux siw behaviour we allow for: siw_accept() (drivers/infiniband/sw/siw/siw_cm.c)
# sends the MPA Reply before it hands the socket to the QP (siw_qp_socket_assoc, or the RTR
# upcalls in peer-to-peer mode). An FPDU that arrives in between wakes only the CM's
# data_ready, which ignores it, and stays unread in the socket until the next segment
# arrives. RFC 5044 §7.1.2 lets the initiator send at once, but then a siw responder can
# hang (seen live: rping against the lab's siw, about 3 runs in 4 under load). So the
# initiator holds its first FPDU this long after the Reply; a first post that comes later
# is not delayed. (The responder's hold is RESPONDER_HOLD_S.)
FIRST_FPDU_HOLD_S = 0.05
# RFC 5044 §7.1.2: a Responder does not send FPDUs until it has received the Initiator's
# first FPDU (RFC 6581's RTR messages exist for the applications whose responder speaks
# first). Linux siw enforces it: siw_recv_mpa_rr reads up to 4 octets past the Reply's
# private data and fails the connection (EPROTO, an rdma_cm CONNECT_ERROR) when an FPDU
# is already there. rstream's server sends at once: against a siw client, 2 runs of 18
# failed so (the client's rpoll saw the error). A responder without RTR holds its FPDUs
# until the Initiator's first FPDU arrives, or at most this long (a softrdma or Linux
# peer whose responder speaks first waits that long once, rather than for ever).
RESPONDER_HOLD_S = 0.25


@dataclass(frozen=True, slots=True)
class MpaConfig:
    """One side's MPA wishes. ``markers``: ask the peer for markers; ``crc``: ask for CRC;
    ``ird``/``ord``: inbound/outbound RDMA Read depth; ``p2p``: request (initiator) an RTR
    message of one of the ``rtr_*`` types; ``revision`` 1 or 2 (2 sends the Enhanced block);
    ``first_fpdu_hold``: seconds the initiator holds its first FPDU after the Reply (see
    :data:`FIRST_FPDU_HOLD_S`); ``responder_hold``: at most how long a responder without
    RTR holds its FPDUs awaiting the initiator's first (:data:`RESPONDER_HOLD_S`)."""

    revision: int = MPA_REVISION_2
    crc: bool = False
    markers: bool = False
    ird: int = 16
    ord: int = 16
    p2p: bool = False
    rtr_write: bool = True
    rtr_read: bool = True
    rtr_send: bool = False
    strict_ird: bool = False
    first_fpdu_hold: float = FIRST_FPDU_HOLD_S
    responder_hold: float = RESPONDER_HOLD_S

    def __post_init__(self) -> None:
        if self.revision not in (MPA_REVISION_1, MPA_REVISION_2):
            raise InvalidArgument("revision", f"MPA revision must be 1 or 2, not {self.revision!r}")
        for name in ("ird", "ord"):
            v = getattr(self, name)
            if not isinstance(v, int) or not 0 <= v <= MAX_RD_DEPTH:
                raise InvalidArgument(name, f"must be 0..{MAX_RD_DEPTH}, got {v!r}")
        for name in ("first_fpdu_hold", "responder_hold"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 10:
                raise InvalidArgument(name, f"must be 0..10 seconds, got {v!r}")
        if self.p2p and self.revision != MPA_REVISION_2:
            raise InvalidArgument("p2p", "RTR negotiation needs MPA revision 2")


#: The environment override of a device's MPA CRC setting (``1``/``on``: ask for CRC,
#: ``0``/``off``: do not), read when an iWARP device is opened.
MPA_CRC_ENV = "SOFTRDMA_MPA_CRC"
_ON = ("1", "on", "yes", "true")
_OFF = ("0", "off", "no", "false")


def parse_on_off(value: str, argument: str) -> bool:
    """``on``/``off`` (also ``1``/``0``, ``yes``/``no``, ``true``/``false``) as a bool;
    :class:`InvalidArgument` naming ``argument`` for anything else."""
    v = value.strip().lower()
    if v in _ON:
        return True
    if v in _OFF:
        return False
    raise InvalidArgument(argument, f"must be on or off (1 or 0), not {value!r}")


def device_mpa_crc(device_setting: bool, env_value: str | None) -> bool:
    """A device's effective MPA CRC wish: ``env_value`` (the value of
    :data:`MPA_CRC_ENV`, None or empty when unset) overrides the device's
    ``mpa_crc`` setting (``softrdma link ... mpa_crc on``)."""
    if env_value is None or not env_value.strip():
        return device_setting
    return parse_on_off(env_value, MPA_CRC_ENV)


def with_device_crc(cfg: MpaConfig, device_crc: bool) -> MpaConfig:
    """``cfg`` with C requested when the device asks for CRC, as Linux siw's
    ``mpa_crc_required`` module parameter does: the initiator sets C in its Request, the
    responder sets C in its Reply even if the Request had none, and CRC is then used in
    both directions (RFC 5044 §7.1: "CRC MUST be used if peer requests it")."""
    if device_crc and not cfg.crc:
        return replace(cfg, crc=True)
    return cfg


@dataclass(frozen=True, slots=True)
class Negotiated:
    """The outcome of the exchange, from one side's point of view."""

    crc: bool
    markers_tx: bool  # this side inserts markers into what it sends
    markers_rx: bool  # the peer inserts markers into what this side receives
    ird: int
    ord: int
    revision: int
    rtr: str | None  # agreed RTR type (RFC 6581), None without peer-to-peer
    peer_private_data: bytes  # the peer's user private data (v2 block removed)


def build_request(cfg: MpaConfig, user_data: bytes = b"") -> MpaRequest:
    """The initiator's MPA Request (siw ``siw_connect``)."""
    v2 = None
    if cfg.revision == MPA_REVISION_2:
        v2 = MpaV2Params(cfg.ird, cfg.ord, cfg.p2p, cfg.p2p and cfg.rtr_send,
                         cfg.p2p and cfg.rtr_write, cfg.p2p and cfg.rtr_read)
    frame = MpaRequest.build(v2=v2, user_data=user_data, crc=cfg.crc, markers=cfg.markers,
                             revision=cfg.revision)
    assert isinstance(frame, MpaRequest)
    return frame


def _bad(reason: str) -> IwarpFault:
    return IwarpFault.llp(MpaErrorCode.INVALID_REQ_REP, reason)


def respond(req: MpaFrame, cfg: MpaConfig, user_data: bytes = b"",
            reject: bool = False) -> tuple[MpaReply, Negotiated]:
    """The responder's Reply to ``req`` and what it agrees to (raises :class:`IwarpFault`
    for a request that cannot be answered)."""
    if not isinstance(req, MpaRequest):
        raise _bad("expected an MPA Request frame")
    if req.reject:
        raise _bad("an MPA Request must not set R")
    enhanced = req.enhanced and req.revision == MPA_REVISION_2
    peer = req.v2
    if enhanced and peer is None:
        raise _bad("Enhanced MPA v2 request without its IRD/ORD block")
    revision = min(req.revision, cfg.revision) if req.revision >= MPA_REVISION_1 else MPA_REVISION_1
    crc = req.crc or cfg.crc
    v2 = None
    ird, ord_ = cfg.ird, cfg.ord
    rtr: str | None = None
    if enhanced and cfg.revision == MPA_REVISION_2 and peer is not None:
        revision = MPA_REVISION_2
        ord_ = min(cfg.ord, peer.ird)
        if peer.peer_to_peer:
            if peer.rtr_write:
                rtr = RTR_WRITE
            elif peer.rtr_read:
                rtr = RTR_READ
            elif peer.rtr_send:
                rtr = RTR_SEND
            else:
                rtr = RTR_WRITE
        v2 = MpaV2Params(ird, ord_, rtr is not None, rtr == RTR_SEND, rtr == RTR_WRITE,
                         rtr == RTR_READ)
    reply = MpaReply.build(v2=v2, user_data=user_data, crc=crc, markers=cfg.markers,
                           reject=reject, revision=revision)
    assert isinstance(reply, MpaReply)
    return reply, Negotiated(crc, req.markers, cfg.markers, ird, ord_, revision, rtr,
                             req.user_data)


def check_reply(cfg: MpaConfig, req: MpaRequest, rep: MpaFrame) -> Negotiated:
    """The initiator's view of ``rep`` (siw ``siw_proc_mpareply``); raises
    :class:`ConnectionRejected` for R, :class:`IwarpFault` (LLP) for a bad reply."""
    if not isinstance(rep, MpaReply):
        raise _bad("expected an MPA Reply frame")
    if rep.reject:
        raise ConnectionRejected(rep.user_data)
    if rep.revision not in (MPA_REVISION_1, MPA_REVISION_2) and rep.revision != 0:
        raise _bad(f"MPA reply revision {rep.revision}")
    crc = req.crc or rep.crc
    ird, ord_ = cfg.ird, cfg.ord
    rtr: str | None = None
    if req.enhanced:
        v2 = rep.v2
        if rep.revision != MPA_REVISION_2 or not rep.enhanced or v2 is None:
            raise _bad("an Enhanced MPA request needs a revision 2 Enhanced reply")
        insufficient = (cfg.ird < v2.ord and (cfg.strict_ird or v2.ord > MAX_RD_DEPTH)) \
            or (cfg.strict_ird and cfg.ord > v2.ird)
        if insufficient:
            raise IwarpFault.llp(MpaErrorCode.INSUFFICIENT_IRD,
                                 f"IRD {cfg.ird}/ORD {cfg.ord} vs reply IRD {v2.ird}/ORD {v2.ord}")
        ird, ord_ = min(v2.ord, MAX_RD_DEPTH), v2.ird
        offered = req.v2
        if offered is not None and offered.peer_to_peer:
            if v2.rtr_write and offered.rtr_write:
                rtr = RTR_WRITE
            elif v2.rtr_read and offered.rtr_read:
                rtr = RTR_READ
            elif v2.rtr_send and offered.rtr_send:
                rtr = RTR_SEND
            else:
                raise IwarpFault.llp(MpaErrorCode.NO_MATCHING_RTR,
                                     "the reply picks no RTR type the request offered")
    return Negotiated(crc, rep.markers, req.markers, ird, ord_, rep.revision, rtr, rep.user_data)
