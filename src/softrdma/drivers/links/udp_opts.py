"""What the UDP link (:class:`~softrdma.drivers.links.udp.UdpLink`) needs from Linux and
counts: socket option values (Python's socket module lacks several of them), the errno
classes that decide whether a failure loses one datagram or stops batching, the
ancillary-data sizes of a receive, and :class:`UdpLinkStats`.
"""

from __future__ import annotations

import errno
import socket
import struct

from ...seam.counters import SlotCounters

# Linux <netinet/in.h> / <linux/in.h> / <linux/in6.h> values (Python 3.11's socket
# module lacks several of them).
IP_TOS = 1
IP_TTL = 2
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)
IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_RECVTTL = getattr(socket, "IP_RECVTTL", 12)
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
IPV6_UNICAST_HOPS = getattr(socket, "IPV6_UNICAST_HOPS", 16)
IPV6_MTU_DISCOVER = getattr(socket, "IPV6_MTU_DISCOVER", 23)
IPV6_PMTUDISC_DO = getattr(socket, "IPV6_PMTUDISC_DO", 2)
IPV6_V6ONLY = getattr(socket, "IPV6_V6ONLY", 26)
IPV6_RECVPKTINFO = getattr(socket, "IPV6_RECVPKTINFO", 49)
IPV6_PKTINFO = getattr(socket, "IPV6_PKTINFO", 50)
IPV6_RECVHOPLIMIT = getattr(socket, "IPV6_RECVHOPLIMIT", 51)
IPV6_HOPLIMIT = getattr(socket, "IPV6_HOPLIMIT", 52)
IPV6_RECVTCLASS = getattr(socket, "IPV6_RECVTCLASS", 66)
IPV6_TCLASS = getattr(socket, "IPV6_TCLASS", 67)
SOL_UDP = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)  # <linux/udp.h>, Linux 4.18
UDP_GRO = getattr(socket, "UDP_GRO", 104)  # <linux/udp.h>, Linux 5.0
UDP_MAX_SEGMENTS = 64  # <net/udp.h> (128 since Linux 6.10; 64 is accepted by every version)
GRO_SLOT = 65536  # a coalesced receive holds up to 64 KiB of UDP payload
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)  # <asm-generic/socket.h>, Linux 2.6.33

DEFAULT_TTL = 64

# Send failures that lose the datagram, as the network would (the transport retries).
_LOSSY_SEND = frozenset({
    errno.EAGAIN, errno.ENOBUFS, errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH,
    errno.EHOSTDOWN, errno.ENETDOWN, errno.EMSGSIZE, errno.EPERM, errno.ENOMEM,
    errno.ECONNRESET,
})
# Errors a receive can report for an earlier send (ICMP) or a transient condition.
_TRANSIENT_RECV = frozenset({
    errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN,
    errno.ENETDOWN, errno.EMSGSIZE, errno.ECONNRESET, errno.ENOMEM, errno.ENOBUFS,
    errno.EPROTO, errno.ETIMEDOUT,
})
# UDP_SEGMENT refused by the kernel for every destination (EIO: the route's device has no
# checksum offload, udp_send_skb; ENOPROTOOPT/EOPNOTSUPP: no UDP GSO at all) ...
_GSO_REFUSED_LINK = frozenset({errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP})
# ... or for one destination (EINVAL/EMSGSIZE: a segment over the route's MTU).
_GSO_REFUSED_DST = frozenset({errno.EINVAL, errno.EMSGSIZE})
# A source port that cannot be bound: fall back to the main socket.
_SPORT_UNAVAILABLE = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EPERM})

_INT = struct.Struct("=i")
_U16 = struct.Struct("=H")
_MSG_TRUNC = int(socket.MSG_TRUNC)  # a plain int: IntFlag '&' is slow per packet
# IP_PKTINFO + TOS + TTL + UDP_GRO's int + SO_RXQ_OVFL's u32
_ANC_SIZE = (socket.CMSG_SPACE(20) + 4 * socket.CMSG_SPACE(4))
_SOL_SOCKET = int(socket.SOL_SOCKET)
_U32 = struct.Struct("=I")


class UdpLinkStats(SlotCounters):
    """Counters of a :class:`UdpLink`.

    ``sent``/``received``: datagrams; ``send_dropped``: sends lost to a network error
    (``last_send_errno`` tells which); ``recv_errors``: transient receive errors (ICMP);
    ``truncated``: datagrams larger than ``max_datagram``, dropped; ``sport_binds``:
    source-port sockets created; ``sport_evictions``: idle ones closed to make room;
    ``sport_fallbacks``: requests served from the main socket instead.

    UDP GSO/GRO (counted in ``sent``/``received`` too, per segment): ``gso_sends``:
    batched sends, ``gso_segments``: the datagrams they carried; ``gso_refused``: batches
    the kernel refused (``gso_last_errno`` tells why), ``gso_fallback_segments``: their
    datagrams, then sent one by one; ``gro_receives``: coalesced receives,
    ``gro_segments``: the datagrams split from them; ``gro_id_hint_misses``: segments
    whose ICRC did not hold under the ID hint (then solved for, :func:`~softrdma.wire.
    roce.recover_ipv4_id`); ``gro_id_failures``: those no ID explained (dropped,
    ``rcvd_icrc_err``); ``gro_refused``: 1 if the kernel refused ``UDP_GRO``.

    Receive buffer (issue 25): ``rcvbuf``: the receive socket's buffer in bytes as the
    kernel granted it; ``rcvbuf_clamped``: 1 if that is less than asked (the kernel caps
    ``SO_RCVBUF`` at ``net.core.rmem_max``; ``SO_RCVBUFFORCE``, tried first, needs
    ``CAP_NET_ADMIN``); ``rx_overflow``: datagrams the kernel dropped because a receive
    socket's queue was full (``SO_RXQ_OVFL``, socket(7)), which the transport then
    retransmits.
    """

    __slots__ = ("sent", "received", "send_dropped", "last_send_errno", "recv_errors",
                 "truncated", "sport_binds", "sport_evictions", "sport_fallbacks",
                 "gso_sends", "gso_segments", "gso_refused", "gso_last_errno",
                 "gso_fallback_segments", "gro_receives", "gro_segments",
                 "gro_id_hint_misses", "gro_id_failures", "gro_refused", "rcvbuf",
                 "rcvbuf_clamped", "rx_overflow")

    sent: int
    received: int
    send_dropped: int
    last_send_errno: int
    recv_errors: int
    truncated: int
    sport_binds: int
    sport_evictions: int
    sport_fallbacks: int
    gso_sends: int
    gso_segments: int
    gso_refused: int
    gso_last_errno: int
    gso_fallback_segments: int
    gro_receives: int
    gro_segments: int
    gro_id_hint_misses: int
    gro_id_failures: int
    gro_refused: int
    rcvbuf: int
    rcvbuf_clamped: int
    rx_overflow: int


def _set_buf(sock: socket.socket, force_opt: int, opt: int, size: int) -> None:
    """Set a socket buffer size, beyond ``rmem_max``/``wmem_max`` when privileged."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, force_opt, size)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, opt, size)
