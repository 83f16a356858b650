"""RoCEv2 over Linux UDP sockets (Annex A17).

:class:`UdpLink` receives on one unconnected, non-blocking socket bound to
``(local_ip, port)`` (4791 for RoCEv2) and sends from unconnected sockets too:

* every sending socket has ``IP_MTU_DISCOVER = IP_PMTUDISC_DO`` (IPv6:
  ``IPV6_MTU_DISCOVER``), so Linux sends IPv4 Identification 0 with DF set, and never
  fragments. The ICRC covers the Identification and Flags (IBA 7.8.1, Annex A17), so the runtime
  can compute it before the kernel builds the header; a connected socket would get a
  per-socket ID counter instead (as captures of Linux senders show);
* the RoCEv2 UDP source port carries flow entropy (0xC000-0xFFFF, Annex A17). A send
  leaves from a socket bound to the requested source port, taken from a bounded LRU
  pool. When that port cannot be bound (in use, privileged) or the pool is full of
  recently used sockets, the send leaves from the link's main socket instead. Because
  the ICRC covers the source port, the caller asks :meth:`UdpLink.effective_sport`
  first and computes the ICRC with the port it returns;
* received datagrams are read with ``recvmsg_into`` into a preallocated ring;
  ``IP_PKTINFO``/``IPV6_RECVPKTINFO`` give the destination address, ``IP_RECVTOS``/
  ``IP_RECVTTL`` (``IPV6_RECVTCLASS``/``IPV6_RECVHOPLIMIT``) the TOS and TTL.

Multicast (Annex A17, :mod:`.mcast`): :meth:`UdpLink.attach_mcast` joins the IP group
of an MGID on the link's interface with its own socket bound to ``(group, port)``;
:meth:`UdpLink.fileno` is an epoll descriptor over the main receive socket and the group
sockets, so one ``select`` serves them all. Every sending socket sends multicast out of
the link's interface with the unicast TTL.

Batching through the kernel (design.md, "RoCEv2 batching: GSO and GRO"):

* :meth:`UdpLink.send_gso` sends a run of equal-sized datagrams (the last may be shorter)
  in one ``sendmsg`` with a ``UDP_SEGMENT`` control message (UDP GSO, Linux 4.18). From
  an unconnected socket with DF the kernel numbers the segments' IPv4 Identifications
  0, 1 .. n-1 (``inet_gso_segment``), which the runtime puts in each segment's ICRC.
  If the kernel refuses the option (EIO from a device without checksum offload,
  EINVAL, ENOPROTOOPT, EMSGSIZE for a segment over the path MTU ...) the link stops
  batching, for the whole link or for that destination, and the runtime sends the
  segments one by one: nothing is lost and the refusal is counted;
* the receive socket has ``UDP_GRO`` (Linux 5.0): a coalesced receive comes back with
  its segment size in a ``UDP_GRO`` control message, and :meth:`UdpLink.recv_batch`
  splits it into one :class:`~.link.Datagram` per segment (views, no copy) whose
  ``ident`` is the segment's index, the ID a softrdma sender gave it;
* ``SOFTRDMA_GSO=0`` in the environment turns both off, ``SOFTRDMA_GRO=0`` the receive
  side only; :attr:`UdpLink.gso` / :attr:`UdpLink.gro` say what is in use.

ICMP errors: Linux queues them only on connected sockets or with ``IP_RECVERR``, neither
of which is used; if one still surfaces (``ECONNREFUSED`` ...), it is counted and the
link carries on. Network-level send failures lose the datagram (counted in
:attr:`UdpLink.stats`), as the network would.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..errors import ClosedError, DeviceError, InvalidArgument, StateError
from ..seam.counters import SlotCounters
from ..wire.opcodes import CONNECTED_OPCODES
from . import mcast
from .link import (
    ROCE_V2_UDP_PORT,
    Datagram,
    LinkState,
    check_port,
    check_u8,
    ip_bytes,
    ip_text,
)

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

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
GSO_MAX_PAYLOAD = 65507  # bytes of UDP payload in one send: 65535 - IPv4 - UDP header
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
_LOG = logging.getLogger("softrdma.link")
_UNAVAILABLE_RETRY = 1.0  # seconds before binding a refused source port is tried again


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


class UdpLink(LinkState):
    """A RoCEv2 datagram link over UDP sockets (implements :class:`~.link.Link`).

    ``local_ip``: the link's IPv4 or IPv6 address (text, 4 or 16 bytes; an IPv4-mapped
    GID means IPv4; text may carry ``%iface`` for an IPv6 scope). It must be a specific
    address: the ICRC covers the source address. ``port``: the receive port (4791; 0
    picks a free one, see :attr:`port`). ``bind_port=False`` makes a send-only link
    (no receive socket), as used by processes behind the device demultiplexer.
    ``sport_pool``: how many source-port sockets are kept; a pooled socket unused for
    ``pool_idle`` seconds may be replaced when a new port is requested. ``ring``
    receive buffers of ``max_datagram`` bytes each back :meth:`recv_batch`.
    ``reuseport``: the receive socket joins the port's ``SO_REUSEPORT`` group (a shared
    device's direct path, :mod:`softrdma.drivers.devd.reuseport`).
    """

    gso = True  # UDP_SEGMENT sends (GsoLink); an instance: False when SOFTRDMA_GSO=0
    multicast = True  # IP multicast groups

    def __init__(self, local_ip: str | bytes, port: int = ROCE_V2_UDP_PORT, *,
                 rcvbuf: int = 8 << 20, sndbuf: int = 4 << 20, bind_port: bool = True,
                 sport_pool: int = 64, pool_idle: float = 1.0, ring: int = 64,
                 max_datagram: int = 16384, scope_id: int = 0, reuseport: bool = False) -> None:
        raw = ip_bytes(local_ip, "local_ip")
        if raw == bytes(len(raw)):
            raise InvalidArgument("local_ip", "must be a specific address, not the wildcard "
                                  "(the ICRC covers the source address)")
        check_port(port, "port")
        if sport_pool < 0:
            raise InvalidArgument("sport_pool", "must be >= 0")
        if ring < 1:
            raise InvalidArgument("ring", "must be >= 1")
        if not 64 <= max_datagram <= 65535:
            raise InvalidArgument("max_datagram", "must be 64..65535")
        if rcvbuf < 0 or sndbuf < 0:
            raise InvalidArgument("rcvbuf" if rcvbuf < 0 else "sndbuf", "must be >= 0")
        if isinstance(local_ip, str) and "%" in local_ip:
            name = local_ip.split("%", 1)[1]
            try:
                scope_id = int(name) if name.isdigit() else socket.if_nametoindex(name)
            except OSError:
                raise InvalidArgument("local_ip", f"unknown interface {name!r}") from None
        self.ip = raw
        self.family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
        self.scope_id = scope_id
        self.stats = UdpLinkStats()
        self.overflow_stats = self.stats  # SO_RXQ_OVFL: the kernel's receive drops
        self._ips = (raw,)
        self._text = ip_text(raw)
        self._rcvbuf = rcvbuf
        self._sndbuf = sndbuf
        self._pool_size = sport_pool
        self._pool_idle = pool_idle
        self._closed = False
        self._lru: OrderedDict[int, float] = OrderedDict()  # pooled sport -> last use
        self._socks: dict[int, socket.socket] = {}  # sport -> socket (main included)
        self._unavailable: dict[int, float] = {}  # sport -> retry time
        self._addr_cache: dict[tuple[bytes, int], tuple[Any, ...]] = {}
        self._ip_cache: dict[str, bytes] = {}
        self._ifindex = mcast.ifindex_of(raw, scope_id)
        self._groups: dict[bytes, tuple[socket.socket, int]] = {}  # MGID -> (socket, refs)
        self._rx_socks: tuple[socket.socket, ...] = ()
        self._reuseport = reuseport
        self._ep: select.epoll | None = None
        # Set by the engine runtime: RC/UC datagrams need no TOS/TTL/destination ancillary
        # data (only a UD receive's GRH area does), so recv_batch skips parsing it.
        self.fast_rc_meta = False
        if bind_port:
            self._rx: socket.socket | None = self._open_main(port, True)
            main = self._rx
            self._rx_socks = (main,)
            self._ep = select.epoll()
            self._ep.register(main.fileno(), select.EPOLLIN)
        else:
            self._rx = None
            main = self._open_main(0, False)
        self._main = main
        bound = main.getsockname()[1]
        self.port: int | None = bound if bind_port else None
        self.fallback_sport: int = bound
        self._socks[bound] = main
        self._ring_n = ring
        self._ring = bytearray(ring * max_datagram)
        view = memoryview(self._ring)
        self._slots = [view[i * max_datagram:(i + 1) * max_datagram] for i in range(ring)]
        self._v4 = self.family == socket.AF_INET
        self._was_empty = False
        self._ovfl: dict[int, int] = {}  # receive socket index -> its SO_RXQ_OVFL total
        self._init_offloads(max_datagram)

    def _init_offloads(self, max_datagram: int) -> None:
        """UDP GSO on send and GRO on receive, unless ``SOFTRDMA_GSO=0`` (both off) or
        ``SOFTRDMA_GRO=0`` (receive off) say otherwise, or the kernel refuses."""
        self.gso = os.environ.get("SOFTRDMA_GSO", "1") != "0"
        self._max_datagram = max_datagram
        self.gro = False
        self._gso_refused: set[bytes] = set()  # destinations that refused UDP_SEGMENT
        rx = self._rx
        if rx is None or not self.gso or os.environ.get("SOFTRDMA_GRO", "1") == "0":
            return
        try:
            rx.setsockopt(SOL_UDP, UDP_GRO, 1)
        except OSError:  # a kernel before 5.0: one datagram per receive
            self.stats.gro_refused = 1
            return
        self.gro = True
        if max_datagram < GRO_SLOT:  # a coalesced receive must fit in one slot
            self._ring = bytearray(self._ring_n * GRO_SLOT)  # calloc: pages touched on use
            view = memoryview(self._ring)
            self._slots = [view[i * GRO_SLOT:(i + 1) * GRO_SLOT] for i in range(self._ring_n)]

    def disable_gro(self) -> None:
        """Receive one datagram per call from now on (``UDP_GRO`` off)."""
        if self.gro and self._rx is not None:
            self._rx.setsockopt(SOL_UDP, UDP_GRO, 0)
        self.gro = False

    # ---- sockets ---------------------------------------------------------------------
    def _sockaddr(self, port: int, group: bytes | None = None) -> tuple[Any, ...]:
        text = self._text if group is None else ip_text(group)
        if self.family == socket.AF_INET:
            return (text, port)
        return (text, port, 0, self.scope_id if group is None else self._ifindex)

    def _open(self, port: int, *, receive: bool, group: bytes | None = None) -> socket.socket:
        """A non-blocking unconnected UDP socket bound to (local_ip, port), or to
        (group, port) for a multicast group's receive socket (then joined)."""
        sock = socket.socket(self.family, socket.SOCK_DGRAM)
        try:
            if group is not None:  # several devices/processes of a host may join a group
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            elif receive and self._reuseport:  # set before bind (socket(7))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            mcast.configure_sender(sock, self.ip, self._ifindex)
            if self.family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
                sock.setsockopt(socket.IPPROTO_IP, IP_TTL, DEFAULT_TTL)
            else:
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_V6ONLY, 1)
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_UNICAST_HOPS, DEFAULT_TTL)
            if self._sndbuf:
                _set_buf(sock, SO_SNDBUFFORCE, socket.SO_SNDBUF, self._sndbuf)
            if receive:
                if self._rcvbuf:
                    _set_buf(sock, SO_RCVBUFFORCE, socket.SO_RCVBUF, self._rcvbuf)
                    self._check_rcvbuf(sock)
                try:  # count the kernel's drops for a full queue (SO_RXQ_OVFL)
                    sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
                except OSError:
                    pass
                if self.family == socket.AF_INET:
                    sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
                    sock.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
                    sock.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
                else:
                    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVPKTINFO, 1)
                    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
                    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVHOPLIMIT, 1)
            else:
                # Source-port sockets are not read: keep what strays into them small.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            sock.setblocking(False)
            sock.bind(self._sockaddr(port, group))
            if group is not None:
                mcast.join(sock, group, self.ip, self._ifindex)
        except BaseException:
            sock.close()
            raise
        return sock

    def _check_rcvbuf(self, sock: socket.socket) -> None:
        """Note the receive buffer the kernel granted; say so when it is less than asked
        (``net.core.rmem_max`` without ``CAP_NET_ADMIN``): a window of packets larger
        than the buffer overflows it, and each drop costs a retransmission."""
        got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2  # socket(7): doubled
        st = self.stats
        if st.rcvbuf == 0 or got < st.rcvbuf:
            st.rcvbuf = got
        if got < self._rcvbuf and not st.rcvbuf_clamped:
            st.rcvbuf_clamped = 1
            _LOG.warning("UDP receive buffer on %s: %d bytes asked, %d granted (the kernel "
                         "caps it at net.core.rmem_max; raise that sysctl, or run with "
                         "CAP_NET_ADMIN): a burst beyond it is dropped and retransmitted",
                         self._text, self._rcvbuf, got)

    def _open_main(self, port: int, receive: bool) -> socket.socket:
        try:
            return self._open(port, receive=receive)
        except OSError as e:
            raise DeviceError(f"cannot bind UDP {self._text} port {port}: {e.strerror}",
                              errno=e.errno) from e

    # ---- Link interface ----------------------------------------------------------------
    def fileno(self) -> int | None:
        """A descriptor that polls readable when a receive socket (the main one or a
        multicast group's) has data: an epoll over them (None for a send-only or closed
        link)."""
        return self._ep.fileno() if self._ep is not None and not self._closed else None

    # ---- multicast (Annex A17) --------------------------------------------------------
    @property
    def mcast_groups(self) -> tuple[bytes, ...]:
        """The MGIDs this link has joined."""
        return tuple(self._groups)

    def attach_mcast(self, mgid: bytes) -> None:
        """Join the IP group of ``mgid`` on the link's interface (reference counted).

        Datagrams to the group's ``port`` then come out of :meth:`recv_batch` with the
        group as ``dst_ip``. :class:`InvalidArgument` for a non-multicast GID or one of
        the other address family; :class:`DeviceError` if the kernel refuses the join.
        """
        if self._closed:
            raise ClosedError("UdpLink is closed")
        group = mcast.mgid_to_group(mgid)
        if len(group) != len(self.ip):
            raise InvalidArgument("mgid", f"an IPv{4 if len(group) == 4 else 6} group cannot "
                                  f"be joined on the IPv{4 if self._v4 else 6} link {self._text}")
        if self._rx is None or self._ep is None:
            raise StateError("a send-only UdpLink (bind_port=False) cannot join a group")
        key = bytes(mgid)
        got = self._groups.get(key)
        if got is not None:
            self._groups[key] = (got[0], got[1] + 1)
            return
        try:
            sock = self._open(self._rx.getsockname()[1], receive=True, group=group)
        except OSError as e:
            raise DeviceError(f"cannot join multicast group {ip_text(group)} on {self._text}: "
                              f"{e.strerror}", errno=e.errno) from e
        self._groups[key] = (sock, 1)
        self._ep.register(sock.fileno(), select.EPOLLIN)
        self._rx_socks = (self._rx, *(s for s, _ in self._groups.values()))

    def detach_mcast(self, mgid: bytes) -> None:
        """Undo one :meth:`attach_mcast`; the last one leaves the group (IGMP/MLD leave)."""
        key = bytes(mgid)
        got = self._groups.get(key)
        if got is None:
            raise InvalidArgument("mgid", "this link has not joined that group")
        sock, refs = got
        if refs > 1:
            self._groups[key] = (sock, refs - 1)
            return
        del self._groups[key]
        if self._ep is not None:
            self._ep.unregister(sock.fileno())
        mcast.leave(sock, mcast.mgid_to_group(key), self.ip, self._ifindex)
        sock.close()
        assert self._rx is not None
        self._rx_socks = (self._rx, *(s for s, _ in self._groups.values()))

    def effective_sport(self, requested: int) -> int:
        """Bind (or reuse) a socket on source port ``requested``; the port sends will use.

        Returns ``requested`` when a socket on it is (or could be made) available, else
        :attr:`fallback_sport` (the main socket's port). 0 means "any": the fallback.
        """
        if self._closed:
            raise ClosedError("UdpLink is closed")
        if requested in self._socks:
            lru = self._lru
            if requested in lru:
                lru.move_to_end(requested)
                lru[requested] = time.monotonic()
            return requested
        check_port(requested, "requested")
        if requested == 0 or self._pool_size == 0:
            self.stats.sport_fallbacks += 1
            return self.fallback_sport
        now = time.monotonic()
        retry = self._unavailable.get(requested)
        if retry is not None:
            if now < retry:
                self.stats.sport_fallbacks += 1
                return self.fallback_sport
            del self._unavailable[requested]
        lru = self._lru
        if len(lru) >= self._pool_size:
            oldest, last = next(iter(lru.items()))
            if now - last < self._pool_idle:  # the pool would thrash
                self.stats.sport_fallbacks += 1
                return self.fallback_sport
            del lru[oldest]
            self._socks.pop(oldest).close()
            self.stats.sport_evictions += 1
        try:
            sock = self._open(requested, receive=False)
        except OSError as e:
            if e.errno not in _SPORT_UNAVAILABLE:
                raise DeviceError(f"cannot open a UDP socket on {self._text} port "
                                  f"{requested}: {e.strerror}", errno=e.errno) from e
            if len(self._unavailable) >= 4096:
                self._unavailable.clear()
            self._unavailable[requested] = now + _UNAVAILABLE_RETRY
            self.stats.sport_fallbacks += 1
            return self.fallback_sport
        self._socks[requested] = sock
        lru[requested] = now
        self.stats.sport_binds += 1
        return requested

    def _dst_addr(self, dst_ip: bytes, dport: int) -> tuple[Any, ...]:
        if type(dst_ip) is not bytes:
            dst_ip = ip_bytes(dst_ip, "dst_ip")
        key = (dst_ip, dport)
        addr = self._addr_cache.get(key)
        if addr is not None:
            return addr
        raw = ip_bytes(dst_ip, "dst_ip")
        if len(raw) != len(self.ip):
            raise InvalidArgument("dst_ip", "address family differs from the link's")
        check_port(dport, "dport")
        if self._v4:
            addr = (ip_text(raw), dport)
        else:
            scope = self.scope_id if raw[0] == 0xFE and raw[1] & 0xC0 == 0x80 else 0
            addr = (ip_text(raw), dport, 0, scope)
        if len(self._addr_cache) >= 4096:
            self._addr_cache.clear()
        self._addr_cache[key] = addr
        return addr

    def send(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[ReadableBuffer],
             tos: int = 0, ttl: int = 64) -> None:
        """Send ``parts`` (gathered by ``sendmsg``, not copied) from UDP port ``sport``.

        ``sport`` must come from :meth:`effective_sport` (it was used in the ICRC);
        asking for a port that cannot be used raises :class:`InvalidArgument`.
        """
        sock = self._sock_for(sport)
        addr = self._dst_addr(dst_ip, dport)
        anc = [] if tos == 0 and ttl == DEFAULT_TTL else self._tos_ttl(tos, ttl)
        try:
            sock.sendmsg(parts, anc, 0, addr)
        except OSError as e:
            if self._closed:
                raise ClosedError("UdpLink is closed") from e
            if e.errno in _LOSSY_SEND:
                self.stats.send_dropped += 1
                self.stats.last_send_errno = e.errno or 0
                return
            raise DeviceError(f"UDP send to {addr[0]} port {dport} failed: {e.strerror}",
                              errno=e.errno) from e
        self.stats.sent += 1

    def _sock_for(self, sport: int) -> socket.socket:
        sock = self._socks.get(sport)
        if sock is None:
            if self._closed:
                raise ClosedError("UdpLink is closed")
            if self.effective_sport(sport) != sport:
                raise InvalidArgument("sport", f"UDP source port {sport} is not available; "
                                      "use the port effective_sport() returns")
            sock = self._socks[sport]
        elif sport in self._lru:
            self._lru.move_to_end(sport)
            self._lru[sport] = time.monotonic()
        return sock

    def _tos_ttl(self, tos: int, ttl: int) -> list[tuple[int, int, bytes]]:
        check_u8(tos, "tos")
        check_u8(ttl, "ttl")
        if self._v4:
            return [(socket.IPPROTO_IP, IP_TOS, _INT.pack(tos)),
                    (socket.IPPROTO_IP, IP_TTL, _INT.pack(ttl))]
        return [(socket.IPPROTO_IPV6, IPV6_TCLASS, _INT.pack(tos)),
                (socket.IPPROTO_IPV6, IPV6_HOPLIMIT, _INT.pack(ttl))]

    # ---- UDP GSO (GsoLink) ---------------------------------------------------------------
    def gso_limit(self, dst_ip: bytes) -> int:
        """Segments one :meth:`send_gso` to ``dst_ip`` may carry; 0 when batching is off
        (``SOFTRDMA_GSO=0``, or the kernel refused it for the link or that destination)."""
        if not self.gso or dst_ip in self._gso_refused:
            return 0
        return UDP_MAX_SEGMENTS

    def send_gso(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[ReadableBuffer],
                 seg_size: int, nseg: int, tos: int = 0, ttl: int = 64) -> bool:
        """One ``sendmsg`` of ``nseg`` datagrams of ``seg_size`` bytes (the last may be
        shorter) whose buffers, in order, are ``parts`` (not copied), by UDP GSO.

        Returns False when the kernel refuses ``UDP_SEGMENT`` (nothing sent): the link
        stops batching, for every destination (EIO, ENOPROTOOPT, EOPNOTSUPP) or for this
        one (EINVAL, EMSGSIZE), and the caller sends the datagrams one by one. Network
        errors lose the whole batch, as the network would (``send_dropped`` counts each
        datagram); the transport retries.
        """
        if not 1 <= seg_size <= 0xFFFF:
            raise InvalidArgument("seg_size", "must be 1..65535")
        if not 1 <= nseg <= UDP_MAX_SEGMENTS:
            raise InvalidArgument("nseg", f"must be 1..{UDP_MAX_SEGMENTS}")
        sock = self._sock_for(sport)
        addr = self._dst_addr(dst_ip, dport)
        anc = [] if tos == 0 and ttl == DEFAULT_TTL else self._tos_ttl(tos, ttl)
        anc.append((SOL_UDP, UDP_SEGMENT, _U16.pack(seg_size)))
        st = self.stats
        try:
            sock.sendmsg(parts, anc, 0, addr)
        except OSError as e:
            if self._closed:
                raise ClosedError("UdpLink is closed") from e
            code = e.errno or 0
            if code in _GSO_REFUSED_LINK:
                self.gso = False
            elif code in _GSO_REFUSED_DST:
                if len(self._gso_refused) >= 4096:
                    self._gso_refused.clear()
                self._gso_refused.add(bytes(dst_ip))
            elif code in _LOSSY_SEND:
                st.send_dropped += nseg
                st.last_send_errno = code
                return True
            else:
                raise DeviceError(f"UDP send to {addr[0]} port {dport} failed: {e.strerror}",
                                  errno=e.errno) from e
            st.gso_refused += 1
            st.gso_last_errno = code
            st.gso_fallback_segments += nseg
            return False
        st.gso_sends += 1
        st.gso_segments += nseg
        st.sent += nseg
        return True

    def note_rx_ids(self, hint_misses: int, failures: int) -> None:
        """Count what the runtime's ICRC checks found about the ID hints (GsoLink)."""
        self.stats.gro_id_hint_misses += hint_misses
        self.stats.gro_id_failures += failures

    def recv_batch(self, max_n: int = 64) -> list[Datagram]:
        """Up to ``min(max_n, ring)`` datagrams, without blocking.

        Each ``data`` is a view into the receive ring, valid until the next call. With
        UDP GRO a coalesced receive yields one datagram per segment (``ident`` = the
        segment's index), so one call may return a few more than ``max_n``.
        """
        rx = self._rx
        if rx is None:
            if self._closed:
                raise ClosedError("UdpLink is closed")
            raise StateError("a send-only UdpLink (bind_port=False) cannot receive")
        if max_n < 0:
            raise InvalidArgument("max_n", "must be >= 0")
        # Busy polling (an application spinning on its CQ) calls this far more often than
        # datagrams come: after an empty call, ask the epoll first (0.3 us) rather than
        # let recvmsg raise BlockingIOError (about 3 us).
        ep = self._ep
        if self._was_empty and ep is not None and not ep.poll(0):
            return []
        n = min(max_n, self._ring_n)
        slots = self._slots
        socks = self._rx_socks
        recv = rx.recvmsg_into
        si = 0
        out: list[Datagram] = []
        st = self.stats
        v4 = self._v4
        local = self.ip
        port = self.port if self.port is not None else 0
        ip_cache = self._ip_cache
        fast_rc = self.fast_rc_meta
        gro = self.gro
        i = 0  # ring slots used
        ovfl = self._ovfl
        errors_left = 64  # transient errors are consumed by reading them; stay bounded
        while i < n and len(out) < n:
            slot = slots[i]
            try:
                nbytes, anc, flags, addr = recv([slot], _ANC_SIZE)
            except BlockingIOError:
                si += 1  # this socket is drained: the next group socket, if any
                if si >= len(socks):
                    break
                recv = socks[si].recvmsg_into
                continue
            except OSError as e:
                if self._closed:
                    raise ClosedError("UdpLink is closed") from e
                if e.errno in _TRANSIENT_RECV:
                    st.recv_errors += 1
                    errors_left -= 1
                    if errors_left == 0:
                        break
                    continue
                raise DeviceError(f"UDP receive failed: {e.strerror}", errno=e.errno) from e
            if flags & _MSG_TRUNC:
                st.truncated += 1
                continue
            if anc and anc[0][0] == _SOL_SOCKET:  # SO_RXQ_OVFL comes first, once drops began
                _level, typ, d = anc[0]
                if typ == SO_RXQ_OVFL and len(d) >= 4:
                    total = _U32.unpack_from(d)[0]
                    last = ovfl.get(si, 0)
                    if total != last:
                        ovfl[si] = total
                        st.rx_overflow += (total - last) & 0xFFFFFFFF
            seg = 0
            if gro:
                for level, typ, d in anc:
                    if typ == UDP_GRO and level == SOL_UDP:
                        seg = _INT.unpack_from(d)[0]
                if (seg or nbytes) > self._max_datagram:  # the slot is larger: same rule
                    st.truncated += 1
                    continue
            dst = local
            tos = 0
            ttl = DEFAULT_TTL
            # The receive socket is bound to one unicast address, so the destination is
            # ours unless the datagram is multicast, and TOS/TTL only matter for the GRH
            # area of a UD receive: RC/UC packets (CONNECTED_OPCODES) skip the ancillary
            # data (a per-packet saving on the bulk path) when the owner says it only needs
            # them for UD (the engine runtime does; devd forwards everything).
            if fast_rc and nbytes and slot[0] in CONNECTED_OPCODES and not seg:
                anc = []
            for _level, typ, d in anc:
                if v4:
                    if typ == IP_PKTINFO:
                        dst = d[8:12]
                    elif typ == IP_TOS:
                        tos = d[0]
                    elif typ == IP_TTL:
                        ttl = _INT.unpack_from(d)[0]
                else:
                    if typ == IPV6_PKTINFO:
                        dst = d[:16]
                    elif typ == IPV6_TCLASS:
                        tos = _INT.unpack_from(d)[0]
                    elif typ == IPV6_HOPLIMIT:
                        ttl = _INT.unpack_from(d)[0]
            host = addr[0]
            src = ip_cache.get(host)
            if src is None:
                src = socket.inet_pton(self.family, host.split("%", 1)[0])
                if len(ip_cache) >= 4096:
                    ip_cache.clear()
                ip_cache[host] = src
            i += 1
            if 0 < seg < nbytes:  # coalesced (UDP GRO): one datagram per segment
                view = slot[:nbytes]  # slices of it end at nbytes: the last may be shorter
                sport = addr[1]
                k = 0
                for k, off in enumerate(range(0, nbytes, seg)):
                    out.append(Datagram(view[off:off + seg], src, dst, sport, port, tos, ttl,
                                        b"", k))
                st.gro_receives += 1
                st.gro_segments += k + 1
                continue
            out.append(Datagram(slot[:nbytes], src, dst, addr[1], port, tos, ttl))
        st.received += len(out)
        self._was_empty = not out
        return out

    def close(self) -> None:
        """Close every socket (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
        for gsock, _ in self._groups.values():
            gsock.close()
        self._groups.clear()
        self._rx_socks = ()
        if self._ep is not None:
            self._ep.close()
            self._ep = None
        self._lru.clear()
        self._rx = None

    def __enter__(self) -> UdpLink:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<UdpLink {self._text} port {self.port} sport-fallback {self.fallback_sport}{state}>"
