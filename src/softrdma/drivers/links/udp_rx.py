"""The receive side of the UDP link (:class:`~softrdma.drivers.links.udp.UdpLink`, Annex A17).

Datagrams are read with ``recvmsg_into`` into a preallocated ring; ``IP_PKTINFO`` /
``IPV6_RECVPKTINFO`` give the destination address, ``IP_RECVTOS``/``IP_RECVTTL``
(``IPV6_RECVTCLASS``/``IPV6_RECVHOPLIMIT``) the TOS and TTL; a coalesced (UDP GRO)
receive is split into one :class:`~softrdma.drivers.links.link.Datagram` per segment (views, no
copy); ``SO_RXQ_OVFL`` counts the kernel's receive-queue drops.
"""

from __future__ import annotations

import select
import socket

from ...errors import ClosedError, DeviceError, InvalidArgument, StateError
from ...wire.opcodes import CONNECTED_OPCODES
from .link import Datagram
from .udp_opts import (
    _ANC_SIZE,
    _INT,
    _MSG_TRUNC,
    _SOL_SOCKET,
    _TRANSIENT_RECV,
    _U32,
    DEFAULT_TTL,
    IP_PKTINFO,
    IP_TOS,
    IP_TTL,
    IPV6_HOPLIMIT,
    IPV6_PKTINFO,
    IPV6_TCLASS,
    SO_RXQ_OVFL,
    SOL_UDP,
    UDP_GRO,
    UdpLinkStats,
)

__all__ = ["UdpRx"]


class UdpRx:
    """The link's receive methods (a part of :class:`~softrdma.drivers.links.udp.UdpLink`,
    which sets these attributes)."""

    stats: UdpLinkStats
    ip: bytes
    family: socket.AddressFamily
    port: int | None
    fast_rc_meta: bool
    gro: bool
    _closed: bool
    _rx: socket.socket | None
    _ep: select.epoll | None
    _was_empty: bool
    _ring_n: int
    _slots: list[memoryview]
    _rx_socks: tuple[socket.socket, ...]
    _v4: bool
    _ip_cache: dict[str, bytes]
    _ovfl: dict[int, int]
    _max_datagram: int

    def note_rx_ids(self, hint_misses: int, failures: int) -> None:
        """Count what the runtime's ICRC checks found about the ID hints (GsoLink)."""
        self.stats.gro_id_hint_misses += hint_misses
        self.stats.gro_id_failures += failures

    def recv_batch(self, max_n: int = 64, readable: bool = False) -> list[Datagram]:
        """Up to ``min(max_n, ring)`` datagrams, without blocking.

        Each ``data`` is a view into the receive ring, valid until the next call. With
        UDP GRO a coalesced receive yields one datagram per segment (``ident`` = the
        segment's index), so one call may return a few more than ``max_n``.
        ``readable``: the caller's own epoll just said the socket has input (a shared
        device's client, :mod:`softrdma.drivers.devd.client`), so this call does not ask
        again before its first read.
        """
        rx = self._rx
        if rx is None:
            if self._closed:
                raise ClosedError("UdpLink is closed")
            raise StateError("a send-only UdpLink (bind_port=False) cannot receive")
        if max_n < 0:
            raise InvalidArgument("max_n", "must be >= 0")
        # Busy polling (an application spinning on its CQ) calls this far more often than
        # datagrams come: after a call that found the socket empty (nothing read, or a
        # read that ended on EAGAIN) or read one datagram (a ping-pong's answer), ask the
        # epoll first (0.3 us) rather than let recvmsg raise BlockingIOError (1-3 us).
        ep = self._ep
        if self._was_empty and not readable and ep is not None and not ep.poll(0):
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
        drained = False  # every socket said EAGAIN: the next call asks the epoll first
        while i < n and len(out) < n:
            if i == 1 and ep is not None and not ep.poll(0):
                # A second read after one datagram (the busy poll's probe whether more
                # came, most often not): ask the epoll, as above, rather than recvmsg
                drained = True
                break
            slot = slots[i]
            try:
                nbytes, anc, flags, addr = recv([slot], _ANC_SIZE)
            except BlockingIOError:
                si += 1  # this socket is drained: the next group socket, if any
                if si >= len(socks):
                    drained = True
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
        # A busy poll's one-datagram read (a ping-pong's answer) did not see whether more
        # is queued: its next call asks the epoll too (it is most often empty).
        self._was_empty = drained or not out or n == 1
        return out
