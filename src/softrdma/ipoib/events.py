"""What the IPoIB interface engine asks its driver to do (typed; frozen but for the
per-packet three, :class:`TunWrite`, :class:`UdSend` and :class:`ConnSend`, which a
frozen dataclass would make four times as slow to create)."""

from __future__ import annotations

from dataclasses import dataclass

from .hwaddr import HwAddr

__all__ = ["TunWrite", "UdSend", "ConnSend", "ConnOpen", "ConnAccept", "ConnReject",
           "ConnClose", "McastJoin", "McastLeave", "Output"]

Buffer = bytes | memoryview


@dataclass(slots=True)
class TunWrite:
    """Hand an IP packet to the host stack."""

    packet: Buffer


@dataclass(slots=True)
class UdSend:
    """Send ``encap(ethertype) + payload`` on the UD QP to ``dest`` (QPN 0xFFFFFF and an
    MGID for multicast)."""

    dest: HwAddr
    ethertype: int
    payload: Buffer


@dataclass(slots=True)
class ConnSend:
    """Send ``encap(ethertype) + payload`` as one message on connection ``conn_id``."""

    conn_id: int
    ethertype: int
    payload: Buffer


@dataclass(frozen=True, slots=True)
class ConnOpen:
    """Create a connected QP and send a REQ to ``peer`` (Service ID from its UD QPN)."""

    conn_id: int
    peer: HwAddr
    transport: str
    service_id: int
    private_data: bytes


@dataclass(frozen=True, slots=True)
class ConnAccept:
    """Answer the REQ ``token`` with a REP for the new connection ``conn_id``."""

    token: int
    conn_id: int
    transport: str
    private_data: bytes


@dataclass(frozen=True, slots=True)
class ConnReject:
    """REJ the REQ ``token`` (``private_data`` carries our UD QPN)."""

    token: int
    reason: int
    private_data: bytes
    why: str


@dataclass(frozen=True, slots=True)
class ConnClose:
    """Disconnect (DREQ) and destroy connection ``conn_id``."""

    conn_id: int


@dataclass(frozen=True, slots=True)
class McastJoin:
    mgid: bytes


@dataclass(frozen=True, slots=True)
class McastLeave:
    mgid: bytes


Output = (TunWrite | UdSend | ConnSend | ConnOpen | ConnAccept | ConnReject | ConnClose
          | McastJoin | McastLeave)
