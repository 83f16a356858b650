"""Parameters, results and small helpers of the CM (IBA Vol 1 ch. 12,
§12.6 messages).

Dataclasses for what a consumer asks for (:class:`ConnParams` for a REQ,
:class:`AcceptParams` for a REP or SIDR_REP, :class:`SidrParams` for a SIDR_REQ), the
agent's settings (:class:`CmConfig`, with the A16 CA16-9 timer defaults), the
:class:`Dialect` protocol that private-data conventions (A11 IP CM, Hello) implement,
and the RoCE guard :func:`check_roce_message` (A16.5.2 CA16-11, CA16-13).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import InvalidArgument
from ..wire import cm as wcm
from ..wire.cm import (
    ROCE_FORBIDDEN_APR_STATUS,
    ROCE_FORBIDDEN_REJ_REASONS,
    Rej,
    RejReason,
    time_code_s,
)
from ..wire.ipcm import IpAddress

__all__ = [
    "ALL_ONES_MASK", "CmConfig", "CmPath", "ConnParams", "AcceptParams", "SidrParams",
    "OutMad", "ReqVerdict", "DialectReject", "Dialect", "DialectId", "DialectAgent", "CmCounters", "mtu_enum",
    "check_roce_message", "make_rej", "check_pd",
]

ALL_ONES_MASK = 0xFFFFFFFFFFFFFFFF


def mtu_enum(mtu_bytes: int) -> int:
    """The IB MTU code of a byte size (IBA 9.2: 1 = 256 ... 5 = 4096)."""
    for code, size in ((5, 4096), (4, 2048), (3, 1024), (2, 512), (1, 256)):
        if mtu_bytes >= size:
            return code
    raise InvalidArgument("mtu", f"{mtu_bytes} bytes is smaller than the IB minimum 256")


# --------------------------------------------------------------------------- parameters
@dataclass(slots=True)
class CmConfig:
    """Per-agent CM settings.

    ``resp_time_value`` (our RespTimeValue, A16 CA16-9 default 19) goes in the REQ as
    Local CM Response Timeout; ``remote_cm_response_timeout`` is what we assume of the
    peer (Remote CM Response Timeout; Linux rdma_cm puts 20 in both); ``subnet_timeout``
    is the PacketLifeTime estimate (CA16-9 default 18). ``mra_service_timeout`` is the
    service timeout of the MRA answering a duplicate REQ (rdma_cm's 24).
    ``max_peer_response_timeout`` bounds what a peer's REQ makes us wait for its RTU:
    its Local CM Response Timeout is taken up to this time code (20, what Linux rdma_cm
    announces for itself: ``CMA_CM_RESPONSE_TIMEOUT`` in drivers/infiniband/core/cma.c),
    its PacketLifeTime (Local ACK Timeout - 1) up to ``subnet_timeout`` and its Max CM
    Retries up to ``max_cm_retries`` (``CMA_MAX_CM_RETRIES`` 15); Linux's
    ``cm_req_handler`` takes the REQ's values unbounded (``cm_convert_to_ms(31)`` is
    2.3 h a try), so a few forged REQs could hold a listener's backlog for hours.
    ``timewait_s`` overrides the TimeWait duration. ``ip_cm_supported`` False makes
    the agent answer every A11 Service ID with REJ 8 (CA11-8).
    """

    resp_time_value: int = 19
    remote_cm_response_timeout: int = 19
    subnet_timeout: int = 18
    max_cm_retries: int = 15
    mra_service_timeout: int = 24
    timewait_s: float | None = None
    ip_cm_supported: bool = True
    default_backlog: int = 1024
    max_peer_response_timeout: int = 20

    def __post_init__(self) -> None:
        for name in ("resp_time_value", "remote_cm_response_timeout", "subnet_timeout",
                     "mra_service_timeout", "max_peer_response_timeout"):
            v = getattr(self, name)
            if not isinstance(v, int) or not 0 <= v <= 31:
                raise InvalidArgument(name, f"an IBA time code is 0..31, got {v!r}")
        if not 0 <= self.max_cm_retries <= 15:
            raise InvalidArgument("max_cm_retries", f"must be 0..15, got {self.max_cm_retries}")
        if self.timewait_s is not None and not self.timewait_s >= 0:
            raise InvalidArgument("timewait_s", f"must be >= 0, got {self.timewait_s!r}")

    @property
    def packet_life_s(self) -> float:
        return time_code_s(self.subnet_timeout)


@dataclass(slots=True)
class CmPath:
    """The path of a connection's MADs and QP: GIDs and GRH fields (RoCE v2)."""

    sgid: bytes
    dgid: bytes
    hop_limit: int = 64
    traffic_class: int = 0
    flow_label: int = 0


@dataclass(slots=True)
class ConnParams:
    """What the active side asks for in its REQ (cma.c ``cma_connect_ib``)."""

    service_id: int
    dgid: bytes
    sgid: bytes | None = None
    private_data: bytes = b""
    responder_resources: int = 1
    initiator_depth: int = 1
    retry_count: int = 7
    rnr_retry_count: int = 7
    flow_control: bool = False
    path_mtu: int | None = None
    hop_limit: int = 64
    traffic_class: int = 0
    flow_label: int = 0
    min_rnr_timer: int = 0
    auto_rtu: bool = True
    #: the connection type the REQ names (Linux: the rdma_cm id's type, ``cma_connect_ib``'s
    #: ``req.qp_type``): None, the QP's; RC for an XRC INI QP connected as an RC id's, as
    #: Linux does for an ``RDMA_PS_TCP`` id's (libfabric's XRC endpoints)
    qp_type: int | None = None


@dataclass(slots=True)
class AcceptParams:
    """What the passive side answers in its REP (or SIDR_REP: ``qkey``)."""

    private_data: bytes = b""
    responder_resources: int = 1
    initiator_depth: int = 1
    rnr_retry_count: int = 7
    flow_control: bool = False
    target_ack_delay: int = 15
    min_rnr_timer: int = 0
    qkey: int | None = None


@dataclass(slots=True)
class SidrParams:
    """A SIDR_REQ: resolve ``service_id`` at ``dgid`` to a UD QPN and Q_Key (IBA 12.11)."""

    service_id: int
    dgid: bytes
    sgid: bytes | None = None
    private_data: bytes = b""
    pkey: int = 0xFFFF


@dataclass(slots=True)
class OutMad:
    """One MAD for the driver to send from QP1 to QP1 of ``dgid``."""

    sgid: bytes
    dgid: bytes
    mad: bytes
    hop_limit: int = 64
    traffic_class: int = 0
    flow_label: int = 0
    dqpn: int = 1
    reversible: bool = False  # a response built from a received MAD (IBA 13.5.4, A16.4.4)
    #: ``dgid`` is a GID of this port and the message is for this agent (a REQ or SIDR_REQ
    #: its own listener takes, an answer naming one of its comm or request IDs): the
    #: driver may hand it straight back (:meth:`CmAgent.on_mad`) without the wire
    local: bool = False


@dataclass(slots=True)
class ReqVerdict:
    """A dialect's acceptance of a REQ: the consumer's private data and the addressing
    the REQ carried (A11: IP addresses and ports)."""

    private_data: bytes
    remote_ip: IpAddress | None = None
    remote_port: int | None = None
    local_ip: IpAddress | None = None
    local_port: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class DialectReject:
    """A dialect's refusal of a REQ: the REJ reason (or SIDR status) and its ARI."""

    reason: int
    ari: bytes = b""
    private_data: bytes = b""
    sidr_status: int | None = None


class DialectAgent(Protocol):
    """What a dialect reads of the CM agent of its id: the port's GID table."""

    @property
    def gids(self) -> Sequence[bytes]: ...


class DialectId(Protocol):
    """What a dialect sees of the id it serves (the listener a REQ came to, the
    connection a REP is for; :class:`~.cmid.IbCmId`): the id itself, as a key, and its
    agent, whose GIDs are the addresses a wildcard A11 listener answers on (CA11-8)."""

    @property
    def agent(self) -> DialectAgent: ...


class Dialect(Protocol):
    """A private-data convention on top of the CM (A11 IP CM, Hello, ...)."""

    name: str

    def check_req(self, listener: DialectId, service_id: int, private_data: bytes,
                  sidr: bool) -> ReqVerdict | DialectReject:
        """Server side: parse/validate the REQ (or SIDR_REQ) private data."""
        ...

    def rep_private_data(self, cm_id: DialectId, private_data: bytes) -> bytes:
        """Server side: the REP private data for the consumer's ``private_data``."""
        ...

    def parse_rep(self, cm_id: DialectId, private_data: bytes) -> tuple[bytes, dict[str, Any]]:
        """Client side: the consumer's part of the REP private data and extra facts."""
        ...


class CmCounters:
    """What the agent did (all integers)."""

    __slots__ = ("mads_in", "mads_out", "retransmits", "bad_mads", "ignored",
                 "unknown_id", "stale", "no_listener", "backlog_drops", "duplicates",
                 "unclaimed", "timeouts", "errors", "drep_limited", "half_open_evicted")

    def __init__(self) -> None:
        self.mads_in = 0
        self.mads_out = 0
        self.retransmits = 0
        self.bad_mads = 0
        self.ignored = 0
        self.unknown_id = 0
        self.stale = 0
        self.no_listener = 0
        self.backlog_drops = 0
        self.duplicates = 0
        self.unclaimed = 0
        self.timeouts = 0
        self.errors = 0
        self.drep_limited = 0  # DREPs for unknown comm IDs not sent (per-source limit)
        self.half_open_evicted = 0  # unanswered REPs given up to let a new REQ in

    def as_dict(self) -> dict[str, int]:
        return {n: getattr(self, n) for n in self.__slots__}


def check_roce_message(msg: wcm.CmMessage) -> None:
    """Refuse what A16.5.2 forbids between RoCE ports: REJ reasons 13 and 19 (CA16-11),
    APR status 7 (CA16-13)."""
    if isinstance(msg, Rej) and msg.reason in ROCE_FORBIDDEN_REJ_REASONS:
        raise InvalidArgument("reason", f"REJ reason {msg.reason} ({RejReason(msg.reason).name}) "
                                        "must not be sent between RoCE ports (CA16-11)")
    if isinstance(msg, wcm.Apr) and msg.status in ROCE_FORBIDDEN_APR_STATUS:
        raise InvalidArgument("status", "APR status 7 (invalid LID) must not be sent between "
                                        "RoCE ports (CA16-13)")


def make_rej(local_id: int, remote_id: int, rejected: int, reason: int, ari: bytes = b"",
             private_data: bytes = b"") -> Rej:
    """A REJ body; ``ari`` at most 72 bytes, ``private_data`` at most 148."""
    if len(ari) > wcm.ARI_SIZE:
        raise InvalidArgument("ari", f"at most {wcm.ARI_SIZE} bytes, got {len(ari)}")
    if not 0 <= reason <= 0xFFFF:
        raise InvalidArgument("reason", f"must be 0..65535, got {reason}")
    return Rej(local_comm_id=local_id, remote_comm_id=remote_id, message_rejected=rejected,
               ari_length=len(ari), reason=reason, ari=bytes(ari),
               private_data=bytes(private_data))


def check_pd(private_data: bytes, attr: wcm.CmAttr) -> bytes:
    limit = wcm.PRIVATE_DATA_SIZE[attr]
    if len(private_data) > limit:
        raise InvalidArgument("private_data", f"at most {limit} bytes fit in a {attr.name}, "
                                              f"got {len(private_data)}")
    return bytes(private_data)
