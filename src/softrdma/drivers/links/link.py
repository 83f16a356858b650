"""The datagram link interface every packet driver implements (Annex A17).

A link moves RoCEv2 *UDP payloads* (BTH .. ICRC) between IP addresses. It neither
builds nor checks the ICRC: the runtime does that, over exactly the IPv4/IPv6 and UDP
headers the link will put on the wire (IBA 7.8.1, Annex A17). Because the ICRC covers the UDP
source port, a sender first asks :meth:`Link.effective_sport` which source port will
really be used, computes the ICRC with it, then calls :meth:`Link.send` with that port.

Implementations: :class:`softrdma.drivers.links.fabric.FabricLink` (in memory, virtual time)
and :class:`softrdma.drivers.links.udp.UdpLink` (Linux UDP sockets).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ...errors import InvalidArgument, NotSupported
from ...wire.gid import ip_to_gid, unmap_ipv4
from ...wire.roce import ROCE_V2_UDP_PORT
from ...wire.rocev1 import link_local_gid

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["ROCE_V2_UDP_PORT", "Datagram", "Link", "V1Link", "GidEntry",
           "GsoLink", "LinkState", "VirtualClock", "OverflowStats",
           "ROCE_VERSIONS", "GID_TYPE_ROCE_V1", "GID_TYPE_ROCE_V2", "check_roce_ver",
           "v1_gids", "gid_entries", "ip_bytes", "ip_text", "check_port",
           "check_u8"]


@dataclass(slots=True)
class Datagram:
    """One received (or in-flight) UDP datagram and the IP header facts around it.

    ``data`` is the UDP payload (BTH .. ICRC). For :class:`UdpLink` it is a view into a
    receive ring that stays valid only until the next ``recv_batch`` call; copy what
    must outlive that. ``src_ip``/``dst_ip`` are 4 bytes (IPv4) or 16 bytes (IPv6).
    ``tos`` is the IPv4 TOS / IPv6 Traffic Class byte (DSCP + ECN, Annex A17), ``ttl``
    the IPv4 TTL / IPv6 hop limit.

    A RoCEv1 frame (Annex A16, EtherType 0x8915) arrives as a Datagram too: ``grh`` holds
    its 40-byte GRH, ``data`` what follows it (BTH .. ICRC), ``src_ip``/``dst_ip`` the
    SGID/DGID, ``tos``/``ttl`` the GRH TClass/HopLmt, and the ports are 0. ``grh`` is
    empty for RoCEv2.

    ``ident``: for segment ``i`` of a coalesced (UDP GRO) receive, ``i``: the IPv4
    Identification a softrdma GSO sender gave it (a hint: the socket does not show the
    real one, which the ICRC covers); -1 for a datagram received alone.
    """

    data: memoryview
    src_ip: bytes
    dst_ip: bytes
    sport: int
    dport: int
    tos: int = 0
    ttl: int = 64
    grh: bytes = b""
    ident: int = -1


GidEntry = tuple[bytes, int]  # (16-byte GID, IBV_GID_TYPE_ROCE_V1 or _V2)


@runtime_checkable
class VirtualClock(Protocol):
    """A simulated clock (:class:`~softrdma.drivers.runtime.clock.VirtualClock`): the time and
    a timer queue a simulation runs under."""

    def now(self) -> float: ...

    def call_at(self, when: float, fn: Callable[[float], None], arg: float) -> object: ...


class OverflowStats(Protocol):
    """Counters of a link that sees the kernel's receive-queue drops (``SO_RXQ_OVFL``)."""

    @property
    def rx_overflow(self) -> int: ...



@runtime_checkable
class Link(Protocol):
    """A datagram link: the only thing the runtime needs from a packet driver.

    Besides the datagram calls, a link states what it can do in *capability fields*, so
    that the runtime and the verbs read them instead of probing the object
    (:class:`LinkState` holds every default):

    * ``gso``: it batches sends (:class:`GsoLink`'s calls work);
    * ``roce_v1``: it carries RoCEv1 frames (:meth:`send_v1`, Annex A16);
    * ``multicast``: it joins multicast groups (:meth:`attach_mcast`);
    * ``shared``: its device is shared by processes through devd: QPNs come from
      :meth:`alloc_qpn`, counters and objects are reported (:meth:`report_counters`);
    * ``xrc``: its device's XRC domains are shared by processes (devd's ``xrcd_open``,
      ``xrc_send``: ``softrdma.drivers.devd.xrc``);
    * ``port`` (the UDP port it serves, None: 4791), ``mtu`` (None: the netdev's),
      ``gid_entries`` (its own typed GID table; empty: one RoCE v2 GID per address),
      ``clock`` (a virtual clock that drives it, None: real time), ``overflow_stats``
      (kernel receive drops, None: not seen);
    * ``on_readable`` (set by the runtime: called when datagrams arrive on a link that
      has no descriptor) and ``fast_rc_meta`` (set by the runtime: RC datagrams need no
      ancillary data).
    """

    on_readable: Callable[[], None] | None
    fast_rc_meta: bool

    @property
    def gso(self) -> bool: ...

    @property
    def roce_v1(self) -> bool: ...

    @property
    def multicast(self) -> bool: ...

    @property
    def shared(self) -> bool: ...

    @property
    def xrc(self) -> bool: ...

    @property
    def port(self) -> int | None: ...

    @property
    def mtu(self) -> int | None: ...

    @property
    def gid_entries(self) -> tuple[GidEntry, ...]: ...

    @property
    def clock(self) -> VirtualClock | None: ...

    @property
    def overflow_stats(self) -> OverflowStats | None: ...

    @property
    def local_ips(self) -> tuple[bytes, ...]:
        """The link's own addresses (4 or 16 bytes each); sends use the first."""
        ...

    def effective_sport(self, requested: int) -> int:
        """The UDP source port a send asking for ``requested`` will carry on the wire."""
        ...

    def send(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[ReadableBuffer],
             tos: int = 0, ttl: int = 64) -> None:
        """Send one datagram whose payload is the concatenation of ``parts``.

        ``sport`` must be a value returned by :meth:`effective_sport`. Network-level
        failures (unreachable, buffer full) lose the datagram like a network would;
        they are counted, not raised.
        """
        ...

    def recv_batch(self, max_n: int = 64) -> list[Datagram]:
        """Up to ``max_n`` received datagrams, without blocking (maybe none)."""
        ...

    def fileno(self) -> int | None:
        """A file descriptor that polls readable when ``recv_batch`` has work, or None."""
        ...

    def close(self) -> None:
        """Release the link; later sends raise :class:`~softrdma.errors.ClosedError`."""
        ...

    def send_v1(self, dgid: bytes, parts: Sequence[ReadableBuffer], sl: int = 0) -> None:
        """(``roce_v1``) Send one RoCEv1 packet (see :class:`V1Link`)."""
        ...

    def attach_mcast(self, mgid: bytes) -> None:
        """(``multicast``) Receive the group ``mgid``'s datagrams."""
        ...

    def detach_mcast(self, mgid: bytes) -> None:
        """(``multicast``) Stop receiving the group ``mgid``'s datagrams."""
        ...

    def alloc_qpn(self, want: int = 0) -> int:
        """(``shared``) A QPN unique on the device (``want``: that one, if free)."""
        ...

    def free_qpn(self, qpn: int) -> None:
        """(``shared``) Give back a QPN from :meth:`alloc_qpn`."""
        ...

    @property
    def last_report(self) -> dict[str, int]:
        """(``shared``) The counters last given to :meth:`report_counters`."""
        ...

    def report_counters(self, values: dict[str, int]) -> None:
        """(``shared``) Publish this process's cumulative port counters."""
        ...

    def device_counters(self) -> dict[str, int]:
        """(``shared``) The device's port counters, every process's included."""
        ...

    @property
    def last_resources(self) -> dict[str, Any]:
        """(``shared``) The objects last given to :meth:`report_resources`."""
        ...

    def report_resources(self, objects: dict[str, Any]) -> None:
        """(``shared``) Publish this process's objects (``softrdma res show``)."""
        ...


def _unsupported(link: object, what: str) -> NotSupported:
    return NotSupported(f"{type(link).__name__} has no {what}")


class LinkState:
    """What every link keeps the same way, and the defaults of :class:`Link`'s capability
    fields: a link class sets its own addresses (``_ips``, 4 or 16 bytes each) and
    whether it is closed (``_closed``), and overrides the capabilities it has."""

    __slots__ = ()
    _ips: tuple[bytes, ...]
    _closed: bool
    gso: bool = False
    roce_v1: bool = False
    multicast: bool = False
    shared: bool = False
    xrc: bool = False
    port: int | None = None
    mtu: int | None = None
    gid_entries: tuple[GidEntry, ...] = ()
    clock: VirtualClock | None = None
    overflow_stats: OverflowStats | None = None
    on_readable: Callable[[], None] | None = None
    fast_rc_meta: bool = False
    last_report: dict[str, int] = {}  # noqa: RUF012 - read-only default (shared links set their own)
    last_resources: dict[str, Any] = {}  # noqa: RUF012 - read-only default

    @property
    def local_ips(self) -> tuple[bytes, ...]:
        return self._ips

    @property
    def closed(self) -> bool:
        return self._closed

    def send_v1(self, dgid: bytes, parts: Sequence[ReadableBuffer], sl: int = 0) -> None:
        raise _unsupported(self, "RoCEv1 encapsulation")

    def attach_mcast(self, mgid: bytes) -> None:
        raise _unsupported(self, "multicast")

    def detach_mcast(self, mgid: bytes) -> None:
        raise _unsupported(self, "multicast")

    def alloc_qpn(self, want: int = 0) -> int:
        raise _unsupported(self, "shared QPN space")

    def free_qpn(self, qpn: int) -> None:
        raise _unsupported(self, "shared QPN space")

    def report_counters(self, values: dict[str, int]) -> None:
        raise _unsupported(self, "shared counters")

    def device_counters(self) -> dict[str, int]:
        raise _unsupported(self, "shared counters")

    def report_resources(self, objects: dict[str, Any]) -> None:
        raise _unsupported(self, "shared objects")


@runtime_checkable
class GsoLink(Link, Protocol):
    """What a link that batches sends (UDP GSO, ``UDP_SEGMENT``) adds to :class:`Link`.

    One :meth:`send_gso` carries ``nseg`` datagrams of ``seg_size`` bytes each (the last
    may be shorter) to one destination from one source port; on an unconnected IPv4
    socket with DF, Linux gives segment ``i`` the IPv4 Identification ``i``, so the
    caller computes segment ``i``'s ICRC with ID ``i`` (``wire.roce.udp_send_icrc``).
    """

    def gso_limit(self, dst_ip: bytes) -> int:
        """The most segments one :meth:`send_gso` to ``dst_ip`` may carry (< 2: none)."""
        ...

    def send_gso(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[ReadableBuffer],
                 seg_size: int, nseg: int, tos: int = 0, ttl: int = 64) -> bool:
        """Send ``parts`` (every segment's buffers, ICRC included, in order) as ``nseg``
        segments. False: the kernel refused the batch (nothing was sent; the link will
        not batch to that destination again) and the caller sends the segments one by
        one, with their ICRCs computed for ID 0. Network losses count as sent (True)."""
        ...

    def note_rx_ids(self, hint_misses: int, failures: int) -> None:
        """Count coalesced-receive segments whose ID hint was wrong (``hint_misses``:
        solved by recovery, or not) and those no ID explained (``failures``)."""
        ...


@runtime_checkable
class V1Link(Protocol):
    """What a link that also carries RoCEv1 (Annex A16) adds to :class:`Link`.

    ``recv_batch`` then also returns RoCEv1 frames (``Datagram.grh`` set). The runtime
    builds the GRH and the ICRC (``wire.rocev1``, ``wire.roce.icrc_v1``); the link adds
    the Ethernet header: the destination MAC from the DGID (A16.5.1: the kernel's
    neighbour tables) and, on a VLAN, an 802.1Q tag whose priority is the SL (A16.8.1).
    """

    @property
    def gid_entries(self) -> tuple[GidEntry, ...]:
        """The port's GID table: (GID, type) pairs in index order."""
        ...

    def send_v1(self, dgid: bytes, parts: Sequence[ReadableBuffer], sl: int = 0) -> None:
        """Send one RoCEv1 packet: ``parts`` = GRH, BTH .. pad, ICRC. Failures (no MAC
        for the DGID yet, a full queue) lose it like the network would, counted."""
        ...


ROCE_VERSIONS = ("1", "2", "both")  # ``softrdma link add ... roce_ver 1|2|both``
GID_TYPE_ROCE_V1 = 1  # ibv_gid_type IBV_GID_TYPE_ROCE_V1 ("IB/RoCE v1")
GID_TYPE_ROCE_V2 = 2  # IBV_GID_TYPE_ROCE_V2 ("RoCE v2")


def check_roce_ver(value: str | int, argument: str = "roce_ver") -> str:
    """``"1"``, ``"2"`` or ``"both"`` (ints 1/2 accepted), else :class:`InvalidArgument`."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if text not in ROCE_VERSIONS:
        raise InvalidArgument(argument, f"must be 1, 2 or both, got {value!r}")
    return str(text)


def v1_gids(mac: bytes, ips: Sequence[bytes]) -> list[bytes]:
    """The RoCEv1 GIDs of a port (Annex A16): the link-local GID from the MAC by modified
    EUI-64 first, then each IPv4 address as ``::ffff:a.b.c.d`` and each IPv6 address
    (Linux puts every netdev address in the GID table, once per GID type)."""
    out = [link_local_gid(mac)]
    for ip in [*[a for a in ips if len(a) == 4], *[a for a in ips if len(a) == 16]]:
        gid = ip_to_gid(ip)
        if gid not in out:
            out.append(gid)
    return out


def gid_entries(roce_ver: str, mac: bytes, v1_ips: Sequence[bytes],
                v2_gids: Sequence[bytes]) -> tuple[GidEntry, ...]:
    """The GID table of a device running RoCE ``roce_ver`` (``"1"``, ``"2"``, ``"both"``).

    ``v2_gids`` is the RoCEv2 table (the addresses the UDP link serves). With ``"both"``
    every GID appears once per type, the v1 entry first, as Linux lists them.
    """
    if roce_ver == "2":
        return tuple((g, GID_TYPE_ROCE_V2) for g in v2_gids)
    v1 = v1_gids(mac, v1_ips)
    if roce_ver == "1":
        return tuple((g, GID_TYPE_ROCE_V1) for g in v1)
    out: list[GidEntry] = []
    for g in v1:
        out.append((g, GID_TYPE_ROCE_V1))
        if g in v2_gids:
            out.append((g, GID_TYPE_ROCE_V2))
    out.extend((g, GID_TYPE_ROCE_V2) for g in v2_gids if g not in v1)
    return tuple(out)


def ip_bytes(ip: str | bytes, argument: str = "ip") -> bytes:
    """An IPv4/IPv6 address (text, 4 or 16 bytes) as 4 or 16 bytes.

    An IPv4-mapped IPv6 address (``::ffff:a.b.c.d``, the form of an IPv4 GID) becomes
    its 4 IPv4 bytes.
    """
    if isinstance(ip, str):
        text = ip.split("%", 1)[0]
        try:
            raw = ipaddress.ip_address(text).packed
        except ValueError:
            raise InvalidArgument(argument, f"not an IP address: {ip!r}") from None
    elif isinstance(ip, (bytes, bytearray, memoryview)):
        raw = bytes(ip)
        if len(raw) not in (4, 16):
            raise InvalidArgument(argument, f"an IP address has 4 or 16 bytes, not {len(raw)}")
    else:
        raise InvalidArgument(argument, f"expected str or bytes, got {type(ip).__name__}")
    return unmap_ipv4(raw)


def ip_text(ip: bytes) -> str:
    """Text form of a 4- or 16-byte address."""
    return str(ipaddress.ip_address(ip))


def check_port(value: int, argument: str) -> int:
    """A UDP port number (0..65535) or :class:`InvalidArgument`."""
    if not isinstance(value, int) or not 0 <= value <= 0xFFFF:
        raise InvalidArgument(argument, f"UDP port must be 0..65535, got {value!r}")
    return value


def check_u8(value: int, argument: str) -> int:
    """An 8-bit header field (TOS, TTL) or :class:`InvalidArgument`."""
    if not isinstance(value, int) or not 0 <= value <= 0xFF:
        raise InvalidArgument(argument, f"must be 0..255, got {value!r}")
    return value
