"""The address message of ``ibv_xsrq_pingpong`` (rdma-core
``libibverbs/examples/xsrq_pingpong.c``): ``MSG_FORMAT "%04x:%06x:%06x:%06x:%06x:%32s"``
(LID, RECV QPN, SEND QPN, PSN, SRQN, GID as 32 hex digits) and its NUL, 66 bytes, and
the ``ADDR_FORMAT`` line the tool prints. Used by ``softrdma xsrq-pingpong`` and by
``pcap-check`` (:mod:`softrdma.tools.capture.pcap_oob`), so it imports no verbs.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from ...errors import DecodeError, InvalidArgument

__all__ = ["MSG_SIZE", "XDest", "encode_xdest", "decode_xdest", "address_line"]

MSG_SIZE = 66  # "%04x:%06x:%06x:%06x:%06x:%32s" and its NUL


@dataclass(frozen=True, slots=True)
class XDest:
    """``struct pingpong_dest`` of xsrq_pingpong.c as exchanged."""

    lid: int
    recv_qpn: int
    send_qpn: int
    psn: int
    srqn: int
    gid: bytes  # 16 bytes, network order


def encode_xdest(d: XDest) -> bytes:
    """``sprintf(MSG_FORMAT, lid, recv_qpn, send_qpn, psn, srqn, wire_gid)`` + NUL."""
    for name, val, hi in (("lid", d.lid, 0xFFFF), ("recv_qpn", d.recv_qpn, 0xFFFFFF),
                          ("send_qpn", d.send_qpn, 0xFFFFFF), ("psn", d.psn, 0xFFFFFF),
                          ("srqn", d.srqn, 0xFFFFFF)):
        if not 0 <= val <= hi:
            raise InvalidArgument(f"dest.{name}", f"{val:#x} does not fit the exchange message")
    if len(d.gid) != 16:
        raise InvalidArgument("dest.gid", f"a GID is 16 bytes, not {len(d.gid)}")
    return (f"{d.lid:04x}:{d.recv_qpn:06x}:{d.send_qpn:06x}:{d.psn:06x}:{d.srqn:06x}:"
            f"{d.gid.hex()}\x00").encode("ascii")


def decode_xdest(msg: bytes) -> XDest:
    """Parse a peer's message as ``sscanf("%x:%x:%x:%x:%x:%s")`` + ``wire_gid_to_gid``."""
    text = msg.split(b"\x00", 1)[0].decode("ascii", "replace")
    parts = text.split(":")
    try:
        if len(parts) != 6 or len(parts[5]) != 32:
            raise ValueError(text)
        lid, rq, sq, psn, srqn = (int(x, 16) for x in parts[:5])
        gid = bytes.fromhex(parts[5])
    except ValueError as exc:
        raise DecodeError(f"bad xsrq_pingpong address message {text!r}") from exc
    if lid > 0xFFFF or max(rq, sq, psn, srqn) > 0xFFFFFF:
        raise DecodeError(f"xsrq_pingpong address field out of range: {text!r}")
    return XDest(lid, rq, sq, psn, srqn, gid)


def address_line(which: str, d: XDest) -> str:
    """``ADDR_FORMAT``: ``   local: LID 0000, QPN RECV 000012 SEND 000013, PSN ..., SRQN
    ..., GID ...``."""
    return (f"{which:>8}: LID {d.lid:04x}, QPN RECV {d.recv_qpn:06x} SEND {d.send_qpn:06x}, "
            f"PSN {d.psn:06x}, SRQN {d.srqn:06x}, GID {socket.inet_ntop(socket.AF_INET6, d.gid)}")
