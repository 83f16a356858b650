"""The in-process RoCEv2 link of a device with several addresses: one
:class:`~softrdma.drivers.links.udp.UdpLink` per address of its netdev, as one
:class:`~softrdma.drivers.links.link.GsoLink`.

A device's GIDs are its netdev's IP addresses (Annex A17),
whether a process opens it through devd (which receives on every address,
:mod:`softrdma.drivers.devd.daemon`) or in-process; :class:`MultiUdpLink` gives the in-process
device the same table (``127.0.0.1`` and ``::1`` on ``lo``). Each address has its own
socket bound to the device's port; sends leave from the first address of the destination's
family, as a shared device's do (:class:`~softrdma.drivers.devd.client.DevdLink`).
:meth:`fileno` is an ``epoll`` descriptor over every socket.
"""

from __future__ import annotations

import select
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...errors import ClosedError, InvalidArgument
from . import mcast
from .link import Datagram, LinkState
from .udp import UdpLink

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["MultiUdpLink"]


class MultiUdpLink(LinkState):
    """``links`` (one per address, the first one first in :attr:`local_ips`) as one link;
    it owns and closes them."""

    gso = True  # every address's UdpLink batches (GsoLink)
    multicast = True

    def __init__(self, links: Sequence[UdpLink]) -> None:
        if not links:
            raise InvalidArgument("links", "at least one UdpLink")
        self.links = tuple(links)
        self._first = self.links[0]
        self._by_family: dict[int, UdpLink] = {}
        for link in self.links:
            self._by_family.setdefault(len(link.ip), link)
        self._ips = tuple(link.ip for link in self.links)
        self.port = self._first.port
        self._ep = select.epoll()
        self._by_fd: dict[int, UdpLink] = {}
        for link in self.links:
            fd = link.fileno()
            if fd is not None:
                self._ep.register(fd, select.EPOLLIN)
                self._by_fd[fd] = link
        self._was_empty = False
        self._closed = False

    @property
    def fast_rc_meta(self) -> bool:
        return all(link.fast_rc_meta for link in self.links)

    @fast_rc_meta.setter
    def fast_rc_meta(self, value: bool) -> None:
        for link in self.links:
            link.fast_rc_meta = value

    def _sender(self, dst_ip: bytes) -> UdpLink:
        try:
            return self._by_family[len(dst_ip)]
        except KeyError:
            if self._closed:
                raise ClosedError("link closed") from None
            raise InvalidArgument(
                "dst_ip", f"this device has no IPv{4 if len(dst_ip) == 4 else 6} address"
            ) from None

    def effective_sport(self, requested: int) -> int:
        """The first link's choice, if every family's sender can use it too; else the
        first link's fallback port (each sender's main socket is on the device's port)."""
        sport = self._first.effective_sport(requested)
        for link in self._by_family.values():
            if link is not self._first and link.effective_sport(sport) != sport:
                return self._first.fallback_sport
        return sport

    def send(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[ReadableBuffer],
             tos: int = 0, ttl: int = 64) -> None:
        self._sender(dst_ip).send(dst_ip, dport, sport, parts, tos, ttl)

    def gso_limit(self, dst_ip: bytes) -> int:
        link = self._by_family.get(len(dst_ip))
        return 0 if link is None else link.gso_limit(dst_ip)

    def send_gso(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[ReadableBuffer],
                 seg_size: int, nseg: int, tos: int = 0, ttl: int = 64) -> bool:
        return self._sender(dst_ip).send_gso(dst_ip, dport, sport, parts, seg_size, nseg,
                                             tos, ttl)

    def note_rx_ids(self, hint_misses: int, failures: int) -> None:
        """Counted on the IPv4 link (only IPv4 has an Identification to hint)."""
        self._by_family.get(4, self._first).note_rx_ids(hint_misses, failures)

    def recv_batch(self, max_n: int = 64) -> list[Datagram]:
        # As UdpLink.recv_batch: after an empty call, one epoll (0.3 us) says which
        # links have datagrams, so busy polling costs what it costs on one link.
        links: Sequence[UdpLink] = self.links
        if self._was_empty:
            ready = self._ep.poll(0)
            if not ready:
                return []
            links = [self._by_fd[fd] for fd, _ in ready if fd in self._by_fd]
        got: list[Datagram] = []
        for link in links:
            if len(got) >= max_n:
                break
            got += link.recv_batch(max_n - len(got))
        self._was_empty = not got
        return got

    def fileno(self) -> int | None:
        return None if self._closed else self._ep.fileno()

    def attach_mcast(self, mgid: bytes) -> None:
        """Join the group on the link of its family (:meth:`UdpLink.attach_mcast`)."""
        self._sender(mcast.mgid_to_group(mgid)).attach_mcast(mgid)

    def detach_mcast(self, mgid: bytes) -> None:
        self._sender(mcast.mgid_to_group(mgid)).detach_mcast(mgid)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for link in self.links:
            link.close()
        self._ep.close()
