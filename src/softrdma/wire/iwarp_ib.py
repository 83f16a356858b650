"""iWARP/TCP connections mapped to InfiniBand: the Hello / HelloReply private data.

Implements "Mapping of iWarp/TCP connections to InfiniBand" (Y. Haviv, v0.30, 2004), which
reuses the SDP (IBA Annex A4) CM private data formats with the SDP-only fields reserved:

* :class:`Hello` (CM REQ private data, MID 0; Figure 1 "CM Hello private data structure"),
  64 bytes. The figure numbers each 32-bit row by its end offset (04 .. 64)::

      0 MID(8) Rsvd(8) bufs(16) | 4 len(32) | 8 Reserved(32) | 12 Reserved(32)
      16 MajVer(4) MinVer(4) IPVer(4) FlowC(4) Reserved(16)
      20 DesRemRcvSz(32) | 24 LocalRcvSz(32) | 28 Local Port(16) Reserved(16)
      32 Src IP(128) | 48 Dst IP(128)

* :class:`HelloReply` (CM REP private data, MID 1; "CM Reply private data structure"),
  24 bytes: the same first 16 bytes, then ``16 MajVer(4) MinVer(4) Reserved(24)`` and
  ``20 ActRcvSz(32)``.
* :class:`SdpHeader`: the 16-byte header the transport embeds at the start of every RC
  Send when FlowC = 0 ("just like SDP does"). Its layout is the first 16 bytes of both
  figures, which is SDP's Base Sockets Direct Header (``struct sdp_bsdh``): MID(8),
  flags(8) (Rsvd in the figures), bufs(16) (credits), len(32), and the two words the
  figures reserve, SDP's mseq(32) and mseq_ack(32).
* Service ID: IBTA_IWARP_PREFIX 0x0000000000020000 + the listener's TCP port. (The same
  value as rdma_cm's RDMA_PS_IPOIB port space.)

IP addresses follow SDP's ``union cma_ip_addr``: IPv4 in the last 4 bytes, the first 12
zero (as A11 CA11-5). All fields are big-endian; reserved bits are kept for exactness.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

from ..errors import DecodeError, InvalidArgument
from .ipcm import IpAddress, IpFields, pack_ip_field
from .mad import Body, Layout, raw, u8, u16, u32

__all__ = [
    "MID_HELLO", "MID_HELLO_REPLY", "FlowControl", "IWARP_IB_SERVICE_ID_PREFIX",
    "IWARP_IB_SERVICE_ID_MASK", "HELLO_SIZE", "HELLO_REPLY_SIZE", "SDP_HEADER_SIZE",
    "SDP_MAJOR_VERSION", "SDP_MINOR_VERSION", "Hello", "HelloReply", "SdpHeader",
    "iwarp_ib_service_id", "parse_iwarp_ib_service_id",
]

MID_HELLO = 0
MID_HELLO_REPLY = 1
HELLO_SIZE = 64
HELLO_REPLY_SIZE = 24
SDP_HEADER_SIZE = 16
# The draft gives no version numbers of its own; the fields "have the same functionality
# as defined in SDP", whose Hello carries version 2.2 (Linux/OFED sdp.h SDP_MAJV_MINV 0x22).
SDP_MAJOR_VERSION = 2
SDP_MINOR_VERSION = 2

IWARP_IB_SERVICE_ID_PREFIX = 0x0000000000020000  # IBTA_IWARP_PREFIX
IWARP_IB_SERVICE_ID_MASK = 0xFFFFFFFFFFFF0000


class FlowControl(IntEnum):
    """The FlowC nibble of the Hello."""

    TRANSPORT = 0  # the transport owns flow control and puts a 16-byte header in each Send
    ULP = 1  # the ULP owns flow control and the whole Send buffer (e.g. iSER)


_BSDH = (
    u8("mid"), u8("rsvd_1"), u16("bufs"), u32("length"), u32("rsvd_8"), u32("rsvd_12"),
)


@dataclass(slots=True)
class _HelloBase(Body):
    """What the Hello and the HelloReply start with: the 16 bytes of SDP's BSDH (the
    SDP-only fields reserved) and the version nibbles. ``decode`` rejects a MID other
    than the class's ``MID``."""

    MID: ClassVar[int]
    mid: int = 0
    rsvd_1: int = 0
    bufs: int = 0
    length: int = 0
    rsvd_8: int = 0
    rsvd_12: int = 0
    majv: int = SDP_MAJOR_VERSION
    minv: int = SDP_MINOR_VERSION

    def check_decoded(self) -> None:
        if self.mid != self.MID:
            raise DecodeError(f"{type(self).__name__}: MID {self.mid}, expected {self.MID}")


@dataclass(slots=True)
class Hello(_HelloBase, IpFields):
    """The Hello (CM REQ private data), MID 0."""

    IP_WHAT: ClassVar[str] = "Hello"
    MID: ClassVar[int] = MID_HELLO
    mid: int = MID_HELLO
    ipv: int = 4
    flowc: int = FlowControl.ULP
    rsvd_18: int = 0
    des_rem_rcv_sz: int = 0
    local_rcv_sz: int = 0
    local_port: int = 0
    rsvd_30: int = 0
    src_ip: bytes = bytes(16)
    dst_ip: bytes = bytes(16)

    LAYOUT: ClassVar[Layout] = Layout("hello", (
        *_BSDH,
        u8(("majv", 4), ("minv", 4)), u8(("ipv", 4), ("flowc", 4)), u16("rsvd_18"),
        u32("des_rem_rcv_sz"), u32("local_rcv_sz"), u16("local_port"), u16("rsvd_30"),
        raw(16, "src_ip"), raw(16, "dst_ip"),
    ))


    @classmethod
    def make(cls, src: IpAddress | str, dst: IpAddress | str, local_port: int, *,
             flowc: int = FlowControl.ULP, bufs: int = 0, des_rem_rcv_sz: int = 0,
             local_rcv_sz: int = 0) -> Hello:
        """A Hello from ``src:local_port`` to ``dst`` (one IP version for both)."""
        src = ipaddress.ip_address(src)
        dst = ipaddress.ip_address(dst)
        if src.version != dst.version:
            raise InvalidArgument("dst", f"IPv{src.version} source with IPv{dst.version} "
                                         "destination")
        return cls(bufs=bufs, ipv=src.version, flowc=flowc, des_rem_rcv_sz=des_rem_rcv_sz,
                   local_rcv_sz=local_rcv_sz, local_port=local_port,
                   src_ip=pack_ip_field(src), dst_ip=pack_ip_field(dst))


@dataclass(slots=True)
class HelloReply(_HelloBase):
    """The HelloReply (CM REP private data), MID 1."""

    MID: ClassVar[int] = MID_HELLO_REPLY
    mid: int = MID_HELLO_REPLY
    rsvd_17: int = 0
    rsvd_18: int = 0
    act_rcv_sz: int = 0

    LAYOUT: ClassVar[Layout] = Layout("hello_reply", (
        *_BSDH,
        u8(("majv", 4), ("minv", 4)), u8("rsvd_17"), u16("rsvd_18"), u32("act_rcv_sz"),
    ))



@dataclass(slots=True)
class SdpHeader(Body):
    """The 16-byte per-Send header used when FlowC = 0 (SDP BSDH layout)."""

    mid: int = 0
    flags: int = 0
    bufs: int = 0
    length: int = 0
    mseq: int = 0
    mseq_ack: int = 0

    LAYOUT: ClassVar[Layout] = Layout("sdp_header", (
        u8("mid"), u8("flags"), u16("bufs"), u32("length"), u32("mseq"), u32("mseq_ack"),
    ))


for _c in (Hello, HelloReply, SdpHeader):
    _c.check_fields()
assert (Hello.LAYOUT.size, HelloReply.LAYOUT.size, SdpHeader.LAYOUT.size) == (
    HELLO_SIZE, HELLO_REPLY_SIZE, SDP_HEADER_SIZE)


def iwarp_ib_service_id(port: int) -> int:
    """IBTA_IWARP_PREFIX + the listener's TCP port."""
    if not 0 <= port <= 0xFFFF:
        raise InvalidArgument("port", f"port must be 0..65535, got {port}")
    return IWARP_IB_SERVICE_ID_PREFIX + port


def parse_iwarp_ib_service_id(sid: int) -> int | None:
    """The TCP port of an iWARP-emulation Service ID, None for any other Service ID."""
    if sid & IWARP_IB_SERVICE_ID_MASK != IWARP_IB_SERVICE_ID_PREFIX:
        return None
    return sid & 0xFFFF
