"""Per-port counters: traffic, retransmissions, RNR NAKs and drops by reason.

Every incoming packet gets the link, network and transport checks of CA16-23 ("the
RoCE endnode shall perform the link, network and transport layer checks ... on every
incoming packet"); a packet that fails one is dropped silently (IBA 9.6) and counted
under its own reason. The reasons are a table (:class:`DropReason`, :data:`DROP_REASONS`):
adding a check means adding one member and one row, and it shows up in the API
(:meth:`Counters.drops`), ``softrdma devinfo -v`` and ``softrdma stats``.

Names follow the rxe/rdma-core hw counters where one exists (``rdma statistic``:
``sent_pkts``, ``rcvd_pkts``, ``duplicate_request``, ``out_of_seq_request``,
``rcvd_rnr_err`` ...); the others are softrdma's. Bytes count the IB transport packet
(BTH through ICRC), as the network carries it above the IP/UDP or GRH header.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["DropReason", "DROP_REASONS", "TRAFFIC_COUNTERS", "Counters", "QP_COUNTERS", "QpCounters"]


class DropReason(StrEnum):
    """Why a received packet was dropped; the value is the counter's name."""

    ICRC = "rcvd_icrc_err"
    MALFORMED = "rcvd_malformed"
    BAD_TVER = "rcvd_bad_tver"
    LOOPBACK_GID = "rcvd_loopback_gid"
    QP0 = "rcvd_qp0"
    UNKNOWN_QP = "rcvd_unknown_qp"
    BAD_OPCODE = "rcvd_bad_opcode"
    BAD_PKEY = "rcvd_bad_pkey"
    BAD_QKEY = "rcvd_bad_qkey"
    BAD_STATE = "rcvd_bad_state"
    BAD_ADDR = "rcvd_bad_addr"
    OUT_OF_SEQ = "out_of_seq_request"
    BAD_RESP_PSN = "rcvd_seq_err"
    BAD_LENGTH = "rcvd_bad_length"
    UC_DROPPED = "dropped_uc"
    UD_NO_WQE = "ud_no_wqe"
    NO_BUFFER = "rcvd_no_buffer"
    RX_OVERFLOW = "rcvd_rx_overflow"


# reason -> (layer, what failed, where the rule is)
DROP_REASONS: dict[DropReason, tuple[str, str, str]] = {
    DropReason.ICRC: ("link", "ICRC mismatch", "IBA 7.8.1, Annex A17"),
    DropReason.MALFORMED: ("transport", "headers too short or do not decode", "IBA 9.6"),
    DropReason.BAD_TVER: ("transport", "BTH TVer is not 0", "IBA 9.6.1.1"),
    DropReason.LOOPBACK_GID: ("network", "SGID or DGID is the loopback GID ::1",
                              "A16.7.2, CA16-22"),
    DropReason.QP0: ("transport", "destination QP0 (no SMI on RoCE)", "CA16-8"),
    DropReason.UNKNOWN_QP: ("transport", "no such destination QP or multicast group",
                            "IBA 9.6.1.4"),
    DropReason.BAD_OPCODE: ("transport", "opcode not valid for the QP type", "IBA 9.6.1.2"),
    DropReason.BAD_PKEY: ("transport", "P_Key mismatch", "IBA 9.6.1.3, 10.9.3"),
    DropReason.BAD_QKEY: ("transport", "Q_Key mismatch", "IBA 10.2.5"),
    DropReason.BAD_STATE: ("transport", "QP state cannot receive", "IBA 10.3.1"),
    DropReason.BAD_ADDR: ("network", "connected QP: source address is not its peer's",
                          "IBA 9.6.1.5; rxe check_addr"),
    DropReason.OUT_OF_SEQ: ("transport", "request PSN ahead of the expected PSN",
                            "IBA 9.7.5.1.3"),
    DropReason.BAD_RESP_PSN: ("transport", "response PSN never requested",
                              "IBA 9.7.5.1.1"),
    DropReason.BAD_LENGTH: ("transport", "payload length invalid for the opcode/MTU",
                            "IBA 9.7.4.1.5, C9-87"),
    DropReason.UC_DROPPED: ("transport", "UC message dropped (sequence or resources)",
                            "IBA 9.9.4"),
    DropReason.UD_NO_WQE: ("transport", "UD packet with no receive WQE", "IBA 9.8.3"),
    DropReason.NO_BUFFER: ("link", "receiving process's queue full (devd)", "design.md"),
    DropReason.RX_OVERFLOW: ("link", "kernel socket receive queue full (SO_RXQ_OVFL)",
                             "socket(7); issue 25"),
}

# Counters that are not drops, in display order.
TRAFFIC_COUNTERS: tuple[str, ...] = (
    "sent_pkts",
    "rcvd_pkts",
    "sent_bytes",
    "rcvd_bytes",
    "retransmitted_pkts",
    "completer_retry",
    "duplicate_request",
    "retry_exceeded_err",
    "rnr_nak_retry_err",
    "send_rnr_nak",
    "rcvd_rnr_nak",
    "rcvd_nak",
    "sent_nak",
    "link_downed",
    "rcvd_cnp",
    "rcvd_fecn",
    "rcvd_becn",
    "rcvd_mpa_req_reject",
    "sent_terminate",
    "rcvd_terminate",
)


class SlotCounters:
    """Integer counters named by ``__slots__``, all zero at first; :meth:`as_dict` gives
    them by name and ``repr`` lists them. The port counters below and the links' and the
    fabric's statistics are such counters."""

    __slots__: tuple[str, ...] = ()

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        """Every counter by name, in ``__slots__`` order."""
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.as_dict().items())
        return f"{type(self).__name__}({inner})"


class Counters(SlotCounters):
    """The counters of one port: the traffic ones then one per :class:`DropReason`.

    Plain integer attributes (the engines increment them on the hot path);
    :meth:`drop` counts a drop by reason.
    """

    __slots__ = (*TRAFFIC_COUNTERS, *(r.value for r in DropReason))

    sent_pkts: int
    rcvd_pkts: int
    sent_bytes: int
    rcvd_bytes: int
    retransmitted_pkts: int
    completer_retry: int
    duplicate_request: int
    retry_exceeded_err: int
    rnr_nak_retry_err: int
    send_rnr_nak: int
    rcvd_rnr_nak: int
    rcvd_nak: int
    sent_nak: int
    link_downed: int
    rcvd_cnp: int
    rcvd_fecn: int
    rcvd_becn: int
    rcvd_mpa_req_reject: int  # iWARP: MPA Requests with R set, refused in MPA (RFC 5044 §7.1)
    sent_terminate: int  # iWARP: Terminate messages sent (RFC 5040 §5.4)
    rcvd_terminate: int  # iWARP: Terminate messages received
    rcvd_icrc_err: int
    rcvd_malformed: int
    rcvd_bad_tver: int
    rcvd_loopback_gid: int
    rcvd_qp0: int
    rcvd_unknown_qp: int
    rcvd_bad_opcode: int
    rcvd_bad_pkey: int
    rcvd_bad_qkey: int
    rcvd_bad_state: int
    rcvd_bad_addr: int
    out_of_seq_request: int
    rcvd_seq_err: int
    rcvd_bad_length: int
    dropped_uc: int
    ud_no_wqe: int
    rcvd_no_buffer: int
    rcvd_rx_overflow: int

    def drop(self, reason: DropReason) -> None:
        """Count one packet dropped for ``reason``."""
        name = reason.value
        setattr(self, name, getattr(self, name) + 1)

    def drops(self) -> dict[str, int]:
        """Dropped packets by reason (every reason, zeros included)."""
        return {r.value: getattr(self, r.value) for r in DropReason}

    @property
    def total_drops(self) -> int:
        return sum(getattr(self, r.value) for r in DropReason)

    def add(self, values: dict[str, int]) -> None:
        """Add ``values`` (as :meth:`as_dict` gives) to these counters; unknown names
        (a newer peer's reasons) are ignored."""
        for name, value in values.items():
            if name in _NAMES:
                setattr(self, name, getattr(self, name) + int(value))


_NAMES = frozenset(Counters.__slots__)


#: The counters each QP keeps besides its port's (``softrdma res show qp -d``, ``rdma
#: statistic qp show``): its traffic, retransmissions, NAKs, RNR NAKs and the packets it
#: dropped by reason; the names are the port counters' (each is counted in both).
QP_COUNTERS: tuple[str, ...] = (
    "sent_pkts",
    "retransmitted_pkts",
    "completer_retry",
    "retry_exceeded_err",
    "rnr_nak_retry_err",
    "rcvd_nak",
    "sent_nak",
    "rcvd_rnr_nak",
    "send_rnr_nak",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_seq_err",
    "rcvd_malformed",
    "rcvd_bad_length",
    "rcvd_bad_state",
    "rcvd_bad_opcode",
    "rcvd_bad_addr",
    "rcvd_bad_pkey",
    "dropped_uc",
)


class QpCounters(SlotCounters):
    """The counters of one QP (:data:`QP_COUNTERS`), plain integers the engine increments
    next to its port's."""

    __slots__ = QP_COUNTERS

    sent_pkts: int
    retransmitted_pkts: int
    completer_retry: int
    retry_exceeded_err: int
    rnr_nak_retry_err: int
    rcvd_nak: int
    sent_nak: int
    rcvd_rnr_nak: int
    send_rnr_nak: int
    duplicate_request: int
    out_of_seq_request: int
    rcvd_seq_err: int
    rcvd_malformed: int
    rcvd_bad_length: int
    rcvd_bad_state: int
    rcvd_bad_opcode: int
    rcvd_bad_addr: int
    rcvd_bad_pkey: int
    dropped_uc: int
