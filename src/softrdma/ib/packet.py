"""What the IB transport engine exchanges with its driver, packet by packet: the
network-header facts of a received packet (:class:`RxMeta`), a packet to send
(:class:`TxPacket`), and the port's fixed numbers (IBA 9.6, Annex A16/A17)."""

from __future__ import annotations

from dataclasses import dataclass

from ..seam.tables import DEFAULT_PKEY, GID_TYPE_ROCE_V1, GID_TYPE_ROCE_V2, MULTICAST_QPN

__all__ = ["DEFAULT_PKEY", "GID_TYPE_ROCE_V1", "GID_TYPE_ROCE_V2", "ICRC_SIZE",
           "LOOPBACK_GID", "MULTICAST_QPN", "QP0", "RxMeta", "TxPacket"]

QP0 = 0  # the SMI's QP, undefined on RoCE (A16.4.3)
ICRC_SIZE = 4
LOOPBACK_GID = bytes(15) + b"\x01"  # ::1, reserved for Raw services (A16.7.2)
DEFAULT_HOP_LIMIT = 64  # the GRH Hop Limit / IP TTL of a packet without a GRH of its own


@dataclass(slots=True, eq=False)
class RxMeta:
    """Network-header facts about a received packet that the transport needs.

    ``sgid``/``dgid`` are 16-byte GIDs (IPv4 addresses as ``::ffff:a.b.c.d``),
    ``grh`` is the 40-byte area a UD receive places at the front of its buffer (for
    IPv4, 20 zero bytes then the IPv4 header, as rxe does; for IPv6, the IPv6 header).

    ``v1`` marks a RoCEv1 packet (Annex A16): ``grh`` is then the packet's own GRH.
    """

    sgid: bytes
    dgid: bytes
    sport: int = 0
    tclass: int = 0
    hop_limit: int = DEFAULT_HOP_LIMIT
    flow_label: int = 0
    grh: bytes = b""
    ipv4: bool = True
    v1: bool = False


@dataclass(slots=True, eq=False)
class TxPacket:
    """One packet for the driver: addressing plus the buffers of BTH .. pad (no ICRC).

    ``parts`` is a list of bytes-like objects (headers, a memoryview slice of the MR for
    the payload, pad) so payload bytes are not copied before ``sendmsg``. ``v1``: send as
    RoCEv1 (the source GID has type "IB/RoCE v1", Annex A16); ``sl`` is the service level,
    which RoCEv1 carries in the 802.1Q priority (A16.8.1).
    """

    sgid: bytes
    dgid: bytes
    sport: int
    parts: list[bytes | bytearray | memoryview]
    length: int
    tclass: int = 0
    hop_limit: int = DEFAULT_HOP_LIMIT
    flow_label: int = 0
    v1: bool = False
    sl: int = 0
