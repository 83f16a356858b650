"""RoCEv2 multicast on Linux sockets: MGID -> IP group, joining, sending (Annex A17).

On RoCEv2 there is no subnet administrator: a multicast GID *is* an IP multicast
address, as Linux maps it (``cma_set_mgid``/``cma_igmp_send`` in drivers/infiniband/core/
cma.c, ``rxe_rcv_mcast_pkt``):

* an IPv4-mapped MGID ``::ffff:a.b.c.d`` is the IPv4 group ``a.b.c.d`` (224.0.0.0/4);
* any other MGID is an IPv6 multicast address (``ff00::/8``) and is the IPv6 group itself.

A host joins the group with ``IP_ADD_MEMBERSHIP`` / ``IPV6_JOIN_GROUP`` on the device's
interface (the kernel then speaks IGMP/MLD), so switches and bridges deliver the group's
frames to it; a datagram to DestQP 0xFFFFFF (IBA 10.5) then arrives at the socket bound
to ``(group, 4791)``. Senders pick the device's interface with ``IP_MULTICAST_IF`` /
``IPV6_MULTICAST_IF`` and carry the address vector's hop limit as the TTL (the same
default as unicast, not the socket default of 1).

This module holds the mapping and the socket options; :class:`~.udp.UdpLink` owns the
sockets.
"""

from __future__ import annotations

import socket
import struct

from ...errors import DeviceError, InvalidArgument
from ...wire.gid import is_v4_mapped, unmap_ipv4
from ..host import netdev as _netdev

__all__ = ["mgid_to_group", "is_mgid", "ifindex_of", "join", "leave", "configure_sender",
           "MCAST_DEFAULT_TTL"]

# <linux/in.h> / <linux/in6.h> values absent from some Python builds
IP_MULTICAST_IF = getattr(socket, "IP_MULTICAST_IF", 32)
IP_MULTICAST_TTL = getattr(socket, "IP_MULTICAST_TTL", 33)
IP_MULTICAST_LOOP = getattr(socket, "IP_MULTICAST_LOOP", 34)
IP_ADD_MEMBERSHIP = getattr(socket, "IP_ADD_MEMBERSHIP", 35)
IP_DROP_MEMBERSHIP = getattr(socket, "IP_DROP_MEMBERSHIP", 36)
IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)
IPV6_MULTICAST_IF = getattr(socket, "IPV6_MULTICAST_IF", 17)
IPV6_MULTICAST_HOPS = getattr(socket, "IPV6_MULTICAST_HOPS", 18)
IPV6_MULTICAST_LOOP = getattr(socket, "IPV6_MULTICAST_LOOP", 19)
IPV6_JOIN_GROUP = getattr(socket, "IPV6_JOIN_GROUP", 20)
IPV6_LEAVE_GROUP = getattr(socket, "IPV6_LEAVE_GROUP", 21)
IPV6_MULTICAST_ALL = 29

# Multicast datagrams leave with the same TTL as unicast ones when the address vector
# asks for nothing else (the socket default would be 1).
MCAST_DEFAULT_TTL = 64

_MREQN = struct.Struct("4s4si")  # struct ip_mreqn: group, local address, ifindex
_MREQ6 = struct.Struct("16sI")  # struct ipv6_mreq: group, ifindex


def is_mgid(gid: bytes) -> bool:
    """True for a multicast GID: ``ff00::/8`` or an IPv4-mapped 224.0.0.0/4 address."""
    if len(gid) != 16:
        return False
    if is_v4_mapped(gid):
        return gid[12] & 0xF0 == 0xE0
    return gid[0] == 0xFF


def mgid_to_group(mgid: bytes) -> bytes:
    """The IP multicast group of an MGID: 4 bytes (IPv4) or 16 bytes (IPv6), Annex A17."""
    if not isinstance(mgid, (bytes, bytearray)) or len(mgid) != 16:
        raise InvalidArgument("mgid", "an MGID is 16 bytes")
    if not is_mgid(bytes(mgid)):
        raise InvalidArgument("mgid", "not a multicast GID (ff00::/8 or ::ffff:224.0.0.0/4)")
    return unmap_ipv4(mgid)


def ifindex_of(ip: bytes, scope_id: int = 0) -> int:
    """The index of the interface that holds address ``ip`` (0 if none is found).

    IPv6 reads ``/proc/net/if_inet6``; IPv4 looks through every interface's addresses.
    """
    if scope_id:
        return scope_id
    try:
        if len(ip) == 16:
            for name in _netdev.list_names():
                for a in _netdev.ipv6_addresses(name):
                    if a.address == ip:
                        return a.ifindex
            return 0
        for name in _netdev.list_names():
            if ip in _netdev.ipv4_addresses(name):
                return socket.if_nametoindex(name)
    except (OSError, DeviceError):
        return 0
    return 0


def configure_sender(sock: socket.socket, local_ip: bytes, ifindex: int) -> None:
    """Make ``sock`` send multicast out of the device's interface with the unicast TTL.

    Best effort: an interface without multicast (``lo``) keeps the kernel's defaults.
    """
    try:
        if len(local_ip) == 4:
            sock.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_IF,
                            _MREQN.pack(bytes(4), local_ip, ifindex))
            sock.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_TTL, MCAST_DEFAULT_TTL)
        else:
            if ifindex:
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MULTICAST_IF, ifindex)
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MULTICAST_HOPS, MCAST_DEFAULT_TTL)
    except OSError:
        pass


def join(sock: socket.socket, group: bytes, local_ip: bytes, ifindex: int) -> None:
    """``IP_ADD_MEMBERSHIP`` / ``IPV6_JOIN_GROUP`` for ``group`` on the device's interface.

    ``IP_MULTICAST_ALL`` is cleared so the socket receives only the groups it joined
    (Linux's default delivers every group joined by any socket on the host).
    """
    if len(group) == 4:
        sock.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
        sock.setsockopt(socket.IPPROTO_IP, IP_ADD_MEMBERSHIP,
                        _MREQN.pack(group, local_ip, ifindex))
    else:
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MULTICAST_ALL, 0)
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_JOIN_GROUP, _MREQ6.pack(group, ifindex))


def leave(sock: socket.socket, group: bytes, local_ip: bytes, ifindex: int) -> None:
    """Undo :func:`join` (closing the socket would too; this sends the IGMP/MLD leave
    at once)."""
    try:
        if len(group) == 4:
            sock.setsockopt(socket.IPPROTO_IP, IP_DROP_MEMBERSHIP,
                            _MREQN.pack(group, local_ip, ifindex))
        else:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_LEAVE_GROUP, _MREQ6.pack(group, ifindex))
    except OSError:
        pass
