"""Multicast on a shared device in ``devd`` (Annex A17,
:mod:`softrdma.drivers.links.mcast`): the daemon joins an MGID's IP group on the first
ATTACH_MCAST and leaves it on the last DETACH_MCAST; datagrams to DestQP 0xFFFFFF (IBA
10.5) reach every attached client through the data channel."""

from __future__ import annotations

import contextlib
import errno

from softrdma.drivers.devd.proto import Client
from softrdma.drivers.links.mcast import is_mgid, mgid_to_group
from softrdma.drivers.links.rawether import RawEtherLink
from softrdma.drivers.links.udp import UdpLink
from softrdma.errors import SoftRdmaError
from softrdma.wire.rocev1 import is_multicast_gid


class McastRouting:
    """The device's multicast groups (MGID -> attached clients), mixed into ``Devd``."""

    _groups: dict[bytes, list[Client]]
    _links: list[UdpLink]
    _raw: RawEtherLink | None

    def _attach(self, c: Client, mgid: bytes) -> int:
        """A client attaches ``mgid``; the first one makes the daemon join the group on
        its socket of that address family (Annex A17, :mod:`softrdma.drivers.links.mcast`)."""
        if mgid not in self._groups:
            link = self._group_link(mgid)
            v1 = self._raw if self._raw is not None and is_multicast_gid(mgid) else None
            if link is None and v1 is None:
                return errno.EAFNOSUPPORT if is_mgid(mgid) else errno.EINVAL
            try:
                if link is not None:
                    link.attach_mcast(mgid)
                if v1 is not None:  # RoCEv1: the MGID's Ethernet multicast MAC
                    v1.attach_mcast(mgid)
            except (OSError, SoftRdmaError):
                return errno.EADDRNOTAVAIL
            self._groups[mgid] = []
        c.mcast[mgid] = c.mcast.get(mgid, 0) + 1
        members = self._groups[mgid]
        if c not in members:
            members.append(c)
        return 0

    def _group_link(self, mgid: bytes) -> UdpLink | None:
        """The receive link that joins ``mgid``'s IP group (its family's first address)."""
        if not is_mgid(mgid):
            return None
        size = len(mgid_to_group(mgid))
        return next((link for link in self._links if len(link.ip) == size), None)

    def _leave_group(self, mgid: bytes) -> None:
        link = self._group_link(mgid)
        if link is not None and mgid in link.mcast_groups:
            link.detach_mcast(mgid)
        if self._raw is not None and is_multicast_gid(mgid):
            with contextlib.suppress(OSError, SoftRdmaError):
                self._raw.detach_mcast(mgid)

    def _detach(self, c: Client, mgid: bytes) -> int:
        refs = c.mcast.get(mgid, 0)
        if refs == 0:
            return errno.ENOENT
        if refs > 1:
            c.mcast[mgid] = refs - 1
            return 0
        del c.mcast[mgid]
        members = self._groups[mgid]
        members.remove(c)
        if not members:
            del self._groups[mgid]
            self._leave_group(mgid)
        return 0

    # -- data --------------------------------------------------------------------------

