"""GID -> MAC through the kernel's neighbour tables (Annex A16.5.1: ARP / Neighbor Discovery).

A16.5.1 leaves address resolution to "standard Ethernet mechanisms, such as ARP or
Neighbor Discovery". softrdma does not reimplement them: it reads the kernel's
neighbour table over rtnetlink (``RTM_GETNEIGH`` dump, ``NDA_DST`` / ``NDA_LLADDR``,
``ndm_state``; rtnetlink(7)) and, when an address is missing, makes the kernel resolve
it by sending an empty UDP datagram to the discard port (9) from a socket bound to the
interface (``SO_BINDTODEVICE``): the kernel queues the datagram, sends its own ARP
request or ND Neighbor Solicitation, and the answer lands in the table, where the next
lookup finds it. No privilege is needed for either step.

Which GIDs go through the table (as Linux ``rdma_addr_find_l2_eth_by_grh`` does):

* ``::ffff:a.b.c.d`` -> ARP for a.b.c.d; any other unicast GID -> ND for that IPv6 address;
* a link-local GID built from a MAC by modified EUI-64 is read back directly
  (``rdma_get_ll_mac``), with no network traffic;
* a multicast GID maps to ``33:33`` + its last 4 bytes (``rdma_get_mcast_mac``).
"""

from __future__ import annotations

import errno
import socket
import struct
import time
from dataclasses import dataclass

from ...errors import DeviceError
from ...wire.gid import gid_to_ip
from ...wire.rocev1 import is_multicast_gid, mac_of_link_local_gid, multicast_mac
from . import netlink

__all__ = ["NeighbourEntry", "NeighbourResolver", "dump_neighbours", "trigger_resolution"]

NETLINK_ROUTE = 0
RTM_NEWNEIGH = 28
RTM_GETNEIGH = 30
NDA_DST = 1
NDA_LLADDR = 2
# include/uapi/linux/neighbour.h NUD_* states
NUD_INCOMPLETE = 0x01
NUD_REACHABLE = 0x02
NUD_STALE = 0x04
NUD_DELAY = 0x08
NUD_PROBE = 0x10
NUD_FAILED = 0x20
NUD_NOARP = 0x40
NUD_PERMANENT = 0x80
NUD_VALID = NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT | NUD_NOARP
DISCARD_PORT = 9  # RFC 863
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)

_NDMSG = struct.Struct("=BBHiHBB")
_RTATTR = struct.Struct("=HH")


@dataclass(frozen=True, slots=True)
class NeighbourEntry:
    """One neighbour table entry (``ip neigh``)."""

    ip: bytes  # 4 or 16 bytes
    mac: bytes  # empty while incomplete
    ifindex: int
    state: int  # NUD_*

    @property
    def valid(self) -> bool:
        return bool(self.state & NUD_VALID) and len(self.mac) == 6


def dump_neighbours(family: int = socket.AF_UNSPEC) -> list[NeighbourEntry]:
    """Every neighbour entry of ``family`` (``AF_INET``, ``AF_INET6`` or both) over
    rtnetlink; :class:`DeviceError` if the dump fails."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    except OSError as exc:
        raise DeviceError(f"cannot open rtnetlink: {exc.strerror}", errno=exc.errno) from exc
    out: list[NeighbourEntry] = []
    with sock:
        sock.bind((0, 0))
        body = _NDMSG.pack(family, 0, 0, 0, 0, 0, 0)
        try:
            for typ, msg in netlink.dump(sock, RTM_GETNEIGH, body):
                if typ == RTM_NEWNEIGH:
                    entry = _parse_ndmsg(msg)
                    if entry is not None:
                        out.append(entry)
        except netlink.DumpTruncated:
            pass  # what was parsed stands
        except netlink.DumpError as exc:
            code = exc.errno or errno.EIO  # always set by netlink.dump
            raise DeviceError(f"neighbour dump failed: {errno.errorcode.get(code, code)}",
                              errno=code) from None
    return out


def _parse_ndmsg(msg: bytes) -> NeighbourEntry | None:
    if len(msg) < _NDMSG.size:
        return None
    _fam, _p1, _p2, ifindex, state, _flags, _typ = _NDMSG.unpack_from(msg, 0)
    off = _NDMSG.size
    dst = b""
    lladdr = b""
    while off + _RTATTR.size <= len(msg):
        ln, typ = _RTATTR.unpack_from(msg, off)
        if ln < _RTATTR.size:
            break
        val = msg[off + _RTATTR.size:off + ln]
        if typ == NDA_DST:
            dst = val
        elif typ == NDA_LLADDR:
            lladdr = val
        off += netlink.align(ln)
    if len(dst) not in (4, 16):
        return None
    return NeighbourEntry(dst, lladdr, ifindex, state)


def trigger_resolution(ifname: str, ifindex: int, ip: bytes) -> None:
    """Make the kernel ARP / ND for ``ip`` on ``ifname``: an empty UDP datagram to the
    discard port from a socket bound to the interface (the kernel resolves the next hop
    before it can transmit). Errors (no route yet, unreachable) are ignored."""
    fam = socket.AF_INET if len(ip) == 4 else socket.AF_INET6
    try:
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            try:
                s.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, ifname.encode())
            except OSError:
                pass  # unprivileged on an old kernel: the route still picks the interface
            text = socket.inet_ntop(fam, ip)
            if fam == socket.AF_INET:
                s.sendto(b"", (text, DISCARD_PORT))
            else:
                s.sendto(b"", (text, DISCARD_PORT, 0, ifindex))
    except OSError:
        pass


class NeighbourResolver:
    """GID -> MAC for one interface, with a small cache (see the module docstring).

    :meth:`resolve` answers from the cache, else from the kernel table, else triggers
    the kernel's ARP/ND and polls the table for up to ``wait`` seconds. A GID that does
    not resolve is not retried (no new trigger, no wait) for ``negative_ttl`` seconds.
    """

    def __init__(self, ifname: str, ifindex: int, *, wait: float = 0.5, ttl: float = 30.0,
                 negative_ttl: float = 1.0, poll: float = 0.002) -> None:
        self.ifname = ifname
        self.ifindex = ifindex
        self.wait = wait
        self.ttl = ttl
        self.negative_ttl = negative_ttl
        self.poll = poll
        self.triggers = 0  # how many times the kernel was asked to resolve
        self._cache: dict[bytes, tuple[bytes, float]] = {}
        self._negative: dict[bytes, float] = {}

    def _lookup(self, ip: bytes) -> bytes | None:
        fam = socket.AF_INET if len(ip) == 4 else socket.AF_INET6
        for e in dump_neighbours(fam):
            if e.ip == ip and e.ifindex == self.ifindex and e.valid:
                return e.mac
        return None

    def resolve(self, gid: bytes) -> bytes | None:
        """The MAC for ``gid`` or None (not resolvable now)."""
        if is_multicast_gid(gid):
            return multicast_mac(gid)
        ll = mac_of_link_local_gid(gid)
        if ll is not None:
            return ll  # Linux rdma_get_ll_mac: no neighbour lookup for such GIDs
        now = time.monotonic()
        hit = self._cache.get(gid)
        if hit is not None and hit[1] > now:
            return hit[0]
        neg = self._negative.get(gid)
        if neg is not None and neg > now:
            return None
        ip = gid_to_ip(gid)
        mac = self._lookup(ip)
        if mac is None:
            self.triggers += 1
            trigger_resolution(self.ifname, self.ifindex, ip)
            deadline = now + self.wait
            while mac is None and time.monotonic() < deadline:
                time.sleep(self.poll)
                mac = self._lookup(ip)
        now = time.monotonic()
        if len(self._cache) >= 4096:
            self._cache.clear()
            self._negative.clear()
        if mac is None:
            self._negative[gid] = now + self.negative_ttl
            return None
        self._cache[gid] = (mac, now + self.ttl)
        self._negative.pop(gid, None)
        return mac

