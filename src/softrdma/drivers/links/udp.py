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

import logging
import os
import select
import socket
import time
from collections import OrderedDict
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ...errors import ClosedError, DeviceError, InvalidArgument, StateError
from . import mcast
from .link import (
    ROCE_V2_UDP_PORT,
    LinkState,
    check_port,
    check_u8,
    ip_bytes,
    ip_text,
)
from .udp_opts import (
    _GSO_REFUSED_DST,
    _GSO_REFUSED_LINK,
    _INT,
    _LOSSY_SEND,
    _SPORT_UNAVAILABLE,
    _U16,
    DEFAULT_TTL,
    GRO_SLOT,
    IP_MTU_DISCOVER,
    IP_PKTINFO,
    IP_PMTUDISC_DO,
    IP_RECVTOS,
    IP_RECVTTL,
    IP_TOS,
    IP_TTL,
    IPV6_HOPLIMIT,
    IPV6_MTU_DISCOVER,
    IPV6_PMTUDISC_DO,
    IPV6_RECVHOPLIMIT,
    IPV6_RECVPKTINFO,
    IPV6_RECVTCLASS,
    IPV6_TCLASS,
    IPV6_UNICAST_HOPS,
    IPV6_V6ONLY,
    SO_RCVBUFFORCE,
    SO_RXQ_OVFL,
    SO_SNDBUFFORCE,
    SOL_UDP,
    UDP_GRO,
    UDP_MAX_SEGMENTS,
    UDP_SEGMENT,
    UdpLinkStats,
    _set_buf,
)
from .udp_rx import UdpRx

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

#: the link, its counters, and the UDP GSO/GRO option values its users ask for
__all__ = ["UdpLink", "UdpLinkStats", "UDP_MAX_SEGMENTS", "SOL_UDP", "UDP_SEGMENT", "UDP_GRO"]

_LOG = logging.getLogger("softrdma.link")
_UNAVAILABLE_RETRY = 1.0  # seconds before binding a refused source port is tried again


class UdpLink(UdpRx, LinkState):
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
        self._anc_cache: dict[tuple[int, int], tuple[tuple[int, int, bytes], ...]] = {}
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
        anc = () if tos == 0 and ttl == DEFAULT_TTL else self._tos_ttl(tos, ttl)
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

    def _tos_ttl(self, tos: int, ttl: int) -> tuple[tuple[int, int, bytes], ...]:
        """The ancillary data of a send with this TOS and TTL, built once per pair (every
        packet of an AH with ``hop_limit`` 1, as rdma-core's pingpongs set it, carries
        it) and shared by every send with them, so immutable: a caller that adds to it
        (:meth:`send_gso`) builds its own list."""
        key = (tos, ttl)
        anc = self._anc_cache.get(key)
        if anc is not None:
            return anc
        check_u8(tos, "tos")
        check_u8(ttl, "ttl")
        if self._v4:
            anc = ((socket.IPPROTO_IP, IP_TOS, _INT.pack(tos)),
                   (socket.IPPROTO_IP, IP_TTL, _INT.pack(ttl)))
        else:
            anc = ((socket.IPPROTO_IPV6, IPV6_TCLASS, _INT.pack(tos)),
                   (socket.IPPROTO_IPV6, IPV6_HOPLIMIT, _INT.pack(ttl)))
        if len(self._anc_cache) >= 64:
            self._anc_cache.clear()
        self._anc_cache[key] = anc
        return anc

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
        anc = [] if tos == 0 and ttl == DEFAULT_TTL else list(self._tos_ttl(tos, ttl))
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
