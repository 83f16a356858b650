"""One device, both encapsulations: RoCEv2 (UDP) and RoCEv1 (raw Ethernet) on one netdev.

:class:`DualLink` puts a RoCEv2 link (:class:`~softrdma.drivers.links.udp.UdpLink` or the devd
client) and a RoCEv1 link (:class:`~softrdma.drivers.links.rawether.RawEtherLink`) behind one
:class:`~softrdma.drivers.links.link.Link` + :class:`~softrdma.drivers.links.link.V1Link`. The GID
table lists every GID once per type, the RoCEv1 entry first, as Linux lists them
(``roce_ver both``); a packet goes out in the encapsulation of its source GID's type.
:meth:`fileno` is an ``epoll`` descriptor over both links' descriptors.
"""

from __future__ import annotations

import contextlib
import select
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...errors import InvalidArgument
from ...wire.gid import ip_to_gid
from .link import Datagram, GidEntry, Link, LinkState, gid_entries
from .rawether import RawEtherLink

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["DualLink"]


class DualLink(LinkState):
    """``v2`` and ``v1`` links as one (see the module docstring)."""

    roce_v1 = True
    multicast = True

    def __init__(self, v2: Link, v1: RawEtherLink) -> None:
        self.v2 = v2
        self.v1 = v1
        self.mtu = v1.mtu
        self.port = v2.port
        self.gid_entries: tuple[GidEntry, ...] = gid_entries(
            "both", v1.mac, v1.local_ips, tuple(ip_to_gid(ip) for ip in v2.local_ips))
        self._epoll = select.epoll()
        for fd in (v2.fileno(), v1.fileno()):
            if fd is not None:
                self._epoll.register(fd, select.EPOLLIN)
        self._closed = False

    @property
    def local_ips(self) -> tuple[bytes, ...]:
        return self.v2.local_ips

    @property
    def fast_rc_meta(self) -> bool:
        return self.v2.fast_rc_meta

    @fast_rc_meta.setter
    def fast_rc_meta(self, value: bool) -> None:
        self.v2.fast_rc_meta = value

    def effective_sport(self, requested: int) -> int:
        return self.v2.effective_sport(requested)

    def send(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[ReadableBuffer],
             tos: int = 0, ttl: int = 64) -> None:
        self.v2.send(dst_ip, dport, sport, parts, tos, ttl)

    def send_v1(self, dgid: bytes, parts: Sequence[ReadableBuffer], sl: int = 0) -> None:
        self.v1.send_v1(dgid, parts, sl)

    def attach_mcast(self, mgid: bytes) -> None:
        """Join the group on both encapsulations: its IP group (RoCEv2, when the MGID is
        one) and its Ethernet multicast MAC (RoCEv1)."""
        self.v1.attach_mcast(mgid)
        if self.v2.multicast:
            try:
                self.v2.attach_mcast(mgid)
            except InvalidArgument:
                pass  # an IPv6 MGID on an IPv4 RoCEv2 link: RoCEv1 only


    def detach_mcast(self, mgid: bytes) -> None:
        self.v1.detach_mcast(mgid)
        if self.v2.multicast:
            with contextlib.suppress(InvalidArgument):  # RoCEv1 only (see attach_mcast)
                self.v2.detach_mcast(mgid)

    def recv_batch(self, max_n: int = 64) -> list[Datagram]:
        """RoCEv1 frames first, then RoCEv2 datagrams, ``max_n`` in all."""
        out = self.v1.recv_batch(max_n)
        if len(out) < max_n:
            out += self.v2.recv_batch(max_n - len(out))
        return out

    def fileno(self) -> int | None:
        return None if self._closed else self._epoll.fileno()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._epoll.close()
            self.v1.close()
            self.v2.close()

    def __repr__(self) -> str:
        return f"<DualLink {self.v2!r} + {self.v1!r}>"
