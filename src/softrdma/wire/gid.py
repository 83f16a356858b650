"""GIDs and IP addresses: the one place that converts between them.

A RoCEv2 GID is an IPv6 address; an IPv4 address appears as the IPv4-mapped IPv6 address
``::ffff:a.b.c.d`` (RFC 4291 §2.5.5.2, as Linux rxe builds it with
``ipv6_addr_set_v4mapped``; Annex A17). Every module that
maps one to the other uses these helpers rather than spelling the prefix out.
"""

from __future__ import annotations

from ..errors import InvalidArgument

__all__ = ["V4_MAPPED_PREFIX", "GID_SIZE", "IPV4_SIZE", "is_v4_mapped", "gid_to_ip",
           "ip_to_gid", "ipv4_mapped", "unmap_ipv4"]

GID_SIZE = 16  # IBA 4.1.1: a GID is a 128-bit IPv6 address
IPV4_SIZE = 4
#: the first 12 bytes of an IPv4-mapped IPv6 address (RFC 4291 §2.5.5.2)
V4_MAPPED_PREFIX = bytes(10) + b"\xff\xff"
_PREFIX_LEN = len(V4_MAPPED_PREFIX)


def is_v4_mapped(gid: bytes | bytearray | memoryview) -> bool:
    """True if ``gid`` is ``::ffff:a.b.c.d`` (an IPv4 address as a GID)."""
    return bytes(gid[:_PREFIX_LEN]) == V4_MAPPED_PREFIX


def gid_to_ip(gid: bytes | bytearray | memoryview) -> bytes:
    """The IP address a RoCEv2 GID stands for: 4 bytes for ``::ffff:a.b.c.d``, else the
    16 bytes of the GID."""
    if bytes(gid[:_PREFIX_LEN]) == V4_MAPPED_PREFIX:
        return bytes(gid[_PREFIX_LEN:GID_SIZE])
    return bytes(gid)


def ip_to_gid(ip: bytes | bytearray | memoryview) -> bytes:
    """The RoCEv2 GID of an IP address: IPv4 (4 bytes) -> ``::ffff:a.b.c.d``, IPv6 as is."""
    if len(ip) == IPV4_SIZE:
        return V4_MAPPED_PREFIX + bytes(ip)
    return bytes(ip)


def ipv4_mapped(addr4: bytes | bytearray | memoryview) -> bytes:
    """``::ffff:a.b.c.d`` for exactly 4 IPv4 bytes (others: :class:`InvalidArgument`)."""
    if len(addr4) != IPV4_SIZE:
        raise InvalidArgument("addr4", f"must be {IPV4_SIZE} bytes, got {len(addr4)}")
    return V4_MAPPED_PREFIX + bytes(addr4)


def unmap_ipv4(addr: bytes | bytearray | memoryview) -> bytes:
    """``addr`` with a 16-byte IPv4-mapped address turned into its 4 IPv4 bytes."""
    if len(addr) == GID_SIZE and bytes(addr[:_PREFIX_LEN]) == V4_MAPPED_PREFIX:
        return bytes(addr[_PREFIX_LEN:])
    return bytes(addr)
