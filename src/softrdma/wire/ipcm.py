"""RDMA IP CM Service (IBA Annex A11) and the rdma_cm Service IDs (A11.2).

* :class:`IpCmHeader`: the CM REQ private data format of A11.4 Table 1 (CA11-1): MajV(4)
  MinV(4) IPV(4) Res(4) SourcePort(16), Source IP(128), Destination IP(128), then up to
  56 bytes of consumer private data in a REQ (92 - 36); Linux also puts it in SIDR_REQ
  (180 bytes of consumer data; cma.c ``cma_format_hdr``). IPv4 addresses occupy bits
  31-0 of the 128-bit fields and bits 127-32 are zero (CA11-5), which is exactly what
  Linux writes (``struct cma_hdr``, kzalloc'ed).
* :func:`check_req`: the connection server's checks CA11-2, CA11-3.1.1/3.1.2, CA11-4,
  CA11-5 in the order CA11-11 requires (versions first), answering with the Table 5 ARI.
* Service IDs of A11.5 Table 2 (CA11-6): ``0x0000000001 <protocol:8> <port:16>``.
* :class:`IpCmReject` / :class:`UlpReject`: the REJ ARI of A11.7 Tables 3-5 for REJ
  reason 28 (Consumer Reject), and :func:`reject` to build that REJ.
* rdma_cm port spaces (librdmacm ``enum rdma_port_space``): Service ID = ps << 16 | port.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Collection
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

from ..errors import DecodeError, InvalidArgument
from .cm import ARI_SIZE, MsgType, Rej, RejReason
from .fields import check_bits
from .gid import V4_MAPPED_PREFIX
from .mad import Body, Layout, raw, u8, u16

__all__ = [
    "IPPROTO_TCP", "IPPROTO_UDP", "IPPROTO_SCTP", "IP_CM_SERVICE_ID_PREFIX",
    "IP_CM_SERVICE_ID_MASK", "IPCM_HEADER_SIZE", "IPCM_MAJOR_VERSION", "IPCM_MINOR_VERSION",
    "IPCM_REQ_CONSUMER_MAX", "IPCM_SIDR_CONSUMER_MAX", "IpAddress", "IpCmHeader", "IpFields",
    "pack_ip_field", "unpack_ip_field",
    "ip_cm_service_id", "parse_ip_cm_service_id", "is_ip_cm_service_id",
    "RejectionLayer", "IpCmAri", "IpCmReject", "UlpReject", "decode_consumer_ari", "reject",
    "check_req", "RdmaPortSpace", "rdma_cm_service_id", "parse_rdma_cm_service_id",
    "RDMA_IB_IP_PS_MASK", "RDMA_IB_IP_PORT_MASK", "RDMA_UDP_QKEY", "IB_SDP_SERVICE_ID",
]

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

IPPROTO_TCP = 6
IPPROTO_UDP = 17
IPPROTO_SCTP = 132

IP_CM_SERVICE_ID_PREFIX = 0x0000000001000000  # A11.5: prefix 0x0000000001
IP_CM_SERVICE_ID_MASK = 0xFFFFFFFFFF000000

IPCM_HEADER_SIZE = 36
IPCM_MAJOR_VERSION = 0  # A11.4.1
IPCM_MINOR_VERSION = 0  # A11.4.2
IPCM_REQ_CONSUMER_MAX = 92 - IPCM_HEADER_SIZE  # 56 (Table 1, bytes 36-91)
IPCM_SIDR_CONSUMER_MAX = 216 - IPCM_HEADER_SIZE  # 180 (Linux SIDR_REQ)

_V4_ZERO_PREFIX = bytes(12)


class IpFields:
    """What the A11 header and the Hello (``softrdma.wire.iwarp_ib``) share: an IP
    version ``ipv`` and two 16-byte IP fields, read as addresses by :attr:`src_addr` and
    :attr:`dst_addr` (IPv4: the last 4 bytes; DecodeError for a reserved version)."""

    __slots__ = ()
    #: the header's name in a DecodeError
    IP_WHAT: ClassVar[str]
    ipv: int
    src_ip: bytes
    dst_ip: bytes

    @property
    def src_addr(self) -> IpAddress:
        """Source IP as ``ipv`` says."""
        return unpack_ip_field(self.ipv, self.src_ip, f"{self.IP_WHAT} source")

    @property
    def dst_addr(self) -> IpAddress:
        """Destination IP as ``ipv`` says."""
        return unpack_ip_field(self.ipv, self.dst_ip, f"{self.IP_WHAT} destination")


# --------------------------------------------------------------------------- Table 1
@dataclass(slots=True)
class IpCmHeader(Body, IpFields):
    """A11 Table 1: the first 36 bytes of the REQ private data, then consumer data.

    ``src_ip`` / ``dst_ip`` are the raw 16-byte fields; :attr:`src_addr` /
    :attr:`dst_addr` interpret them by ``ipv``. :meth:`decode_private_data` also returns
    the consumer data: everything after byte 36 (56 bytes for a REQ, trailing zeros
    included, since the CM carries no length).
    """

    majv: int = IPCM_MAJOR_VERSION
    minv: int = IPCM_MINOR_VERSION
    ipv: int = 4
    res: int = 0
    src_port: int = 0
    src_ip: bytes = bytes(16)
    dst_ip: bytes = bytes(16)

    IP_WHAT: ClassVar[str] = "IP CM"
    LAYOUT: ClassVar[Layout] = Layout("ipcm", (
        u8(("majv", 4), ("minv", 4)), u8(("ipv", 4), ("res", 4)), u16("src_port"),
        raw(16, "src_ip"), raw(16, "dst_ip"),
    ))

    @classmethod
    def make(cls, src: IpAddress | str, dst: IpAddress | str, src_port: int) -> IpCmHeader:
        """A version 0.0 header for ``src:src_port -> dst`` (both of one IP version)."""
        s = ipaddress.ip_address(src)
        d = ipaddress.ip_address(dst)
        if s.version != d.version:
            raise InvalidArgument("dst", f"IPv{s.version} source with IPv{d.version} destination")
        return cls(ipv=s.version, src_port=src_port, src_ip=pack_ip_field(s),
                   dst_ip=pack_ip_field(d))


    @classmethod
    def decode_private_data(cls, pd: bytes | bytearray | memoryview
                            ) -> tuple[IpCmHeader, bytes]:
        """(header, consumer private data) from REQ/SIDR_REQ private data."""
        if len(pd) < IPCM_HEADER_SIZE:
            raise DecodeError(f"IP CM private data needs {IPCM_HEADER_SIZE} bytes, "
                              f"got {len(pd)}")
        return cls.decode(pd), bytes(pd[IPCM_HEADER_SIZE:])

    def private_data(self, consumer: bytes = b"", *,
                     limit: int = IPCM_REQ_CONSUMER_MAX) -> bytes:
        """Header + consumer data, for a REQ (``limit`` 56) or SIDR_REQ (180)."""
        if len(consumer) > limit:
            raise InvalidArgument("consumer", f"at most {limit} bytes of consumer private "
                                              f"data fit, got {len(consumer)}")
        return self.encode() + bytes(consumer)


IpCmHeader.check_fields()


def pack_ip_field(a: IpAddress) -> bytes:
    """A 128-bit Table 1 address field (CA11-5: IPv4 in bits 31-0, the rest zero)."""
    return a.packed if a.version == 6 else _V4_ZERO_PREFIX + a.packed


def unpack_ip_field(ipv: int, raw16: bytes, which: str = "IP") -> IpAddress:
    """The address in a 128-bit field for IP version ``ipv`` (IPv4: bits 31-0 only)."""
    if ipv == 4:
        return ipaddress.IPv4Address(raw16[12:16])
    if ipv == 6:
        return ipaddress.IPv6Address(raw16)
    raise DecodeError(f"{which} address: IP version {ipv} is reserved (A11.4.3)")


# --------------------------------------------------------------------------- Table 2
def ip_cm_service_id(proto: int, port: int) -> int:
    """The A11 Service ID for IP protocol ``proto`` and destination ``port`` (Table 2)."""
    if not 0 <= proto <= 0xFF:
        raise InvalidArgument("proto", f"IP protocol number must be 0..255, got {proto}")
    if not 0 <= port <= 0xFFFF:
        raise InvalidArgument("port", f"port must be 0..65535, got {port}")
    return IP_CM_SERVICE_ID_PREFIX | proto << 16 | port


def is_ip_cm_service_id(sid: int) -> bool:
    """True if ``sid`` is in the RDMA IP CM Service range (prefix 0x0000000001, CA11-7)."""
    return sid & IP_CM_SERVICE_ID_MASK == IP_CM_SERVICE_ID_PREFIX


def parse_ip_cm_service_id(sid: int) -> tuple[int, int] | None:
    """(protocol, port) of an A11 Service ID, None outside the range."""
    if not is_ip_cm_service_id(sid):
        return None
    return (sid >> 16) & 0xFF, sid & 0xFFFF


# --------------------------------------------------------------------------- Tables 3-5
class RejectionLayer(IntEnum):
    """Table 3 byte 0 of the REJ ARI for reason 28."""

    IP_CM = 0x00
    ULP = 0x01


class IpCmAri(IntEnum):
    """Table 5: the RDMA IP CM Service layer ARI (byte 1 of the REJ ARI)."""

    UNSPECIFIED = 0x00
    MAJOR_VERSION = 0x01
    MINOR_VERSION = 0x02
    IPV = 0x03
    SOURCE_IP = 0x04
    DESTINATION_IP = 0x05
    UNKNOWN_IP = 0x06


_ARI_HEAD = struct.Struct("!BBBB")
_SUGGESTED_MAX = ARI_SIZE - _ARI_HEAD.size  # 68


@dataclass(slots=True)
class IpCmReject:
    """Table 4: layer 0x00, the Table 5 code, a suggested value (oA11-2), a filler byte.

    The suggested value's format is not defined by A11; Linux sends none.
    """

    code: int = IpCmAri.UNSPECIFIED
    suggested: bytes = b""
    filler: int = 0

    def encode(self) -> bytes:
        """The ARI bytes in use (4 + len(suggested)); :func:`reject` zero-fills to 72."""
        check_bits("code", self.code, 8)
        check_bits("filler", self.filler, 8)
        if len(self.suggested) > _SUGGESTED_MAX:
            raise InvalidArgument("suggested", f"at most {_SUGGESTED_MAX} bytes, "
                                               f"got {len(self.suggested)}")
        return (_ARI_HEAD.pack(RejectionLayer.IP_CM, self.code, len(self.suggested),
                               self.filler) + bytes(self.suggested))


@dataclass(slots=True)
class UlpReject:
    """Table 3 with layer 0x01: the RDMA-aware ULP's own ARI (bytes 1-71)."""

    data: bytes = b""

    def encode(self) -> bytes:
        """Layer byte + ULP data."""
        if len(self.data) > ARI_SIZE - 1:
            raise InvalidArgument("data", f"at most {ARI_SIZE - 1} bytes, got {len(self.data)}")
        return bytes((RejectionLayer.ULP,)) + bytes(self.data)


def decode_consumer_ari(ari: bytes | bytearray | memoryview) -> IpCmReject | UlpReject:
    """Split the ARI of a reason-28 REJ by Table 3 (give it ``Rej.ari_data``).

    Raises DecodeError when it is empty, names an unknown layer, or a Table 4 ARI is
    shorter than its suggested-value length says.
    """
    if len(ari) == 0:
        raise DecodeError("consumer-reject ARI is empty: no rejection layer")
    layer = ari[0]
    if layer == RejectionLayer.ULP:
        return UlpReject(bytes(ari[1:]))
    if layer != RejectionLayer.IP_CM:
        raise DecodeError(f"consumer-reject ARI: unknown rejection layer {layer:#04x}")
    if len(ari) < _ARI_HEAD.size:
        raise DecodeError(f"IP CM Service ARI needs {_ARI_HEAD.size} bytes, got {len(ari)}")
    _layer, code, slen, filler = _ARI_HEAD.unpack_from(ari, 0)
    if slen > min(_SUGGESTED_MAX, len(ari) - _ARI_HEAD.size):
        raise DecodeError(f"IP CM Service ARI: suggested value length {slen} exceeds the "
                          f"{len(ari) - _ARI_HEAD.size} bytes present")
    return IpCmReject(code, bytes(ari[4:4 + slen]), filler)


def reject(local_comm_id: int, remote_comm_id: int, ari: IpCmReject | UlpReject, *,
           private_data: bytes = b"") -> Rej:
    """A REJ of a REQ with reason 28 (Consumer Reject) carrying a Table 3 ARI (oA11-1)."""
    body = ari.encode()
    return Rej(local_comm_id=local_comm_id, remote_comm_id=remote_comm_id,
               message_rejected=MsgType.REQ, ari_length=len(body),
               reason=RejReason.CONSUMER_DEFINED, ari=body, private_data=private_data)


def check_req(hdr: IpCmHeader, *, major: int = IPCM_MAJOR_VERSION,
              minor: int = IPCM_MINOR_VERSION, ip_versions: Collection[int] = (4, 6),
              local_addrs: Collection[IpAddress] | None = None,
              accept_v4_mapped: bool = True) -> IpCmReject | None:
    """The server-side A11 checks; None to accept, else the ARI to reject with.

    Order (CA11-11): MajV (CA11-2), MinV (CA11-3.1.1: higher than ours is rejected,
    equal or lower accepted per CA11-3.1.2), IPV (CA11-4), address formats (CA11-5:
    bits 127-32 of an IPv4 field are zero; ``accept_v4_mapped`` also takes the
    ``::ffff:a.b.c.d`` form, as Linux does by reading only bits 31-0), then the
    destination against ``local_addrs`` if given (code 0x06). Suggested values carry the
    supported version (1 byte) or IP versions (1 byte each).
    """
    if hdr.majv != major:
        return IpCmReject(IpCmAri.MAJOR_VERSION, bytes((major,)))
    if hdr.minv > minor:
        return IpCmReject(IpCmAri.MINOR_VERSION, bytes((minor,)))
    if hdr.ipv not in ip_versions:
        return IpCmReject(IpCmAri.IPV, bytes(sorted(ip_versions)))
    if hdr.ipv == 4:
        ok = (_V4_ZERO_PREFIX, V4_MAPPED_PREFIX) if accept_v4_mapped else (_V4_ZERO_PREFIX,)
        if bytes(hdr.src_ip[:12]) not in ok:
            return IpCmReject(IpCmAri.SOURCE_IP)
        if bytes(hdr.dst_ip[:12]) not in ok:
            return IpCmReject(IpCmAri.DESTINATION_IP)
    if local_addrs is not None and hdr.dst_addr not in local_addrs:
        return IpCmReject(IpCmAri.UNKNOWN_IP)
    return None


# --------------------------------------------------------------------------- rdma_cm
class RdmaPortSpace(IntEnum):
    """librdmacm ``enum rdma_port_space`` (rdma_cma.h)."""

    IPOIB = 0x0002
    TCP = 0x0106
    UDP = 0x0111
    IB = 0x013F


RDMA_IB_IP_PS_MASK = 0xFFFFFFFFFFFF0000
RDMA_IB_IP_PORT_MASK = 0x000000000000FFFF
RDMA_UDP_QKEY = 0x01234567  # Q_Key of RDMA_PS_UDP / RDMA_PS_IB UD ids
IB_SDP_SERVICE_ID = 0x0000000000010000  # SDP range, mask RDMA_IB_IP_PS_MASK


def rdma_cm_service_id(ps: int, port: int) -> int:
    """cma.c ``cma_get_service_id``: ``ps << 16 | port`` (RDMA_PS_TCP 0x0106 -> 0x...0106xxxx)."""
    if not 0 <= ps <= 0xFFFF:
        raise InvalidArgument("ps", f"port space must be 0..0xffff, got {ps:#x}")
    if not 0 <= port <= 0xFFFF:
        raise InvalidArgument("port", f"port must be 0..65535, got {port}")
    return ps << 16 | port


def parse_rdma_cm_service_id(sid: int) -> tuple[RdmaPortSpace, int] | None:
    """(port space, port) when ``sid`` is in one of the rdma_cm port spaces, else None."""
    if sid >> 32:
        return None
    try:
        ps = RdmaPortSpace(sid >> 16)
    except ValueError:
        return None
    return ps, sid & 0xFFFF
