"""RoCEv1 over raw Ethernet: an ``AF_PACKET`` link for EtherType 0x8915 (Annex A16).

:class:`RawEtherLink` implements :class:`~softrdma.drivers.links.link.V1Link` on one network
interface. A RoCEv1 frame is ``Ethernet [802.1Q] | GRH | BTH .. pad | ICRC`` (Annex
A16.3.1): the runtime builds the GRH and the ICRC, the link adds the
Ethernet header.

* **Receive**: one ``AF_PACKET``/``SOCK_RAW`` socket for ``ETH_P_ALL`` on the interface
  with a classic BPF filter that passes EtherType 0x8915 frames, tagged or not, and
  ``PACKET_AUXDATA``, which reports an 802.1Q tag the kernel took off the frame (it does
  so before any protocol handler, so a socket bound to 0x8915 alone would never see it).
  Frames the host sent itself (``PACKET_OUTGOING``) are skipped; a frame whose DGID is not
  one of the port's RoCEv1 GIDs (nor a multicast GID) is counted and dropped.
* **Send**: ``sendmsg`` of ``[Ethernet header, GRH, BTH.., payload (not copied), ICRC]``
  on a socket bound to the interface with protocol 0 (it receives nothing).
* **Addresses** (A16.5.1): the destination MAC of a DGID comes from the kernel's
  neighbour tables (:class:`~softrdma.drivers.host.neigh.NeighbourResolver`, which makes the
  kernel ARP / ND on a miss). A send to a GID that does not resolve is lost, counted in
  ``stats.unresolved``; the transport's retries (or the CM's) try again.
* **Self-addressed packets** (CA16-22, SGID == DGID or any own GID as DGID) never reach
  the wire: they are queued locally and an ``eventfd`` makes :meth:`fileno` readable.
* **VLANs** (A16.8.1): on a VLAN netdev (``ip link add link eth0 name eth0.7 type vlan id
  7``; ``/proc/net/vlan/config``) the link receives on the VLAN netdev and sends on its
  lower device with its own 802.1Q tag, whose priority (PCP) is the packet's SL: the VLAN
  netdev itself would take the priority from its egress QoS map instead. With ``vlan=N``
  on a plain netdev the link does the same tagging itself (receiving only VID ``N``).
  Without a VLAN it sends untagged frames and accepts untagged and priority-tagged (VID 0)
  ones; frames of other VLANs are counted (``vlan_other``) and dropped.

:meth:`fileno` is an ``epoll`` descriptor over the receive socket and the loopback
``eventfd``, so a runtime waits on one descriptor. Opening the link needs ``CAP_NET_RAW``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import socket
import struct
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from ...errors import ClosedError, DecodeError, DeviceError, InvalidArgument, StateError
from ...seam.counters import SlotCounters
from ...wire.rocev1 import (
    ETH_HLEN,
    ETH_P_8021Q,
    ETH_P_ROCE_V1,
    GRH_SIZE,
    MAX_SL,
    ethernet_header,
    is_multicast_gid,
    multicast_mac,
    parse_ethernet,
)
from ..host import netdev as _netdev
from ..host.neigh import NeighbourResolver
from .link import GID_TYPE_ROCE_V1, Datagram, GidEntry, LinkState, gid_entries

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["RawEtherLink", "RawEtherStats", "vlan_of"]

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_AUXDATA = 8
PACKET_OUTGOING = 4
PACKET_ADD_MEMBERSHIP = 1
PACKET_DROP_MEMBERSHIP = 2
PACKET_MR_MULTICAST = 0
_PACKET_MREQ = struct.Struct("=iHH8s")  # struct packet_mreq
SO_ATTACH_FILTER = 26
TP_STATUS_VLAN_VALID = 1 << 4
_AUXDATA = struct.Struct("=IIIHHHH")  # struct tpacket_auxdata
_ANC_SIZE = socket.CMSG_SPACE(_AUXDATA.size)
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
_ROCE_V1_TYPE = ETH_P_ROCE_V1.to_bytes(2, "big")
PROC_VLAN_CONFIG = Path("/proc/net/vlan/config")
_VID_MASK = 0x0FFF
_LOSSY_SEND = frozenset({errno.EAGAIN, errno.ENOBUFS, errno.ENETDOWN, errno.ENXIO,
                         errno.EMSGSIZE, errno.ENOMEM})

# Classic BPF (linux/filter.h): accept EtherType 0x8915, directly or behind one 802.1Q tag.
_BPF_LDH_ABS = 0x28
_BPF_JEQ_K = 0x15
_BPF_RET_K = 0x06
_BPF_LDW_ABS = 0x20
_SKF_AD_PKTTYPE = (-0x1000 + 4) & 0xFFFFFFFF  # SKF_AD_OFF + SKF_AD_PKTTYPE
_BPF_PROG = (
    (_BPF_LDW_ABS, 0, 0, _SKF_AD_PKTTYPE),  # frames this host sends: not ours to read
    (_BPF_JEQ_K, 6, 0, PACKET_OUTGOING),
    (_BPF_LDH_ABS, 0, 0, 12),
    (_BPF_JEQ_K, 3, 0, ETH_P_ROCE_V1),
    (_BPF_JEQ_K, 0, 3, ETH_P_8021Q),
    (_BPF_LDH_ABS, 0, 0, 16),
    (_BPF_JEQ_K, 0, 1, ETH_P_ROCE_V1),
    (_BPF_RET_K, 0, 0, 0x40000),
    (_BPF_RET_K, 0, 0, 0),
)


class RawEtherStats(SlotCounters):
    """Counters of a :class:`RawEtherLink`.

    ``sent``/``received``: frames; ``looped``: self-addressed packets delivered locally;
    ``send_dropped``: sends lost to an interface error; ``unresolved``: sends lost because
    the DGID had no MAC (A16.5.1); ``not_ours``: received frames for another DGID;
    ``vlan_other``: frames of another VLAN; ``malformed``: frames too short or with a bad
    GRH; ``truncated``: frames larger than a receive slot.
    """

    __slots__ = ("sent", "received", "looped", "send_dropped", "unresolved", "not_ours",
                 "vlan_other", "malformed", "truncated")

    sent: int
    received: int
    looped: int
    send_dropped: int
    unresolved: int
    not_ours: int
    vlan_other: int
    malformed: int
    truncated: int


def vlan_of(ifname: str) -> tuple[str, int] | None:
    """(lower device, VLAN ID) if ``ifname`` is an 802.1Q VLAN netdev, else None."""
    try:
        text = PROC_VLAN_CONFIG.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) == 3 and fields[0] == ifname and fields[1].isdigit():
            return fields[2], int(fields[1])
    return None


def _attach_filter(sock: socket.socket) -> None:
    prog = (ctypes.c_ubyte * (8 * len(_BPF_PROG)))()
    for i, (code, jt, jf, k) in enumerate(_BPF_PROG):
        struct.pack_into("=HBBI", prog, 8 * i, code, jt, jf, k)
    fprog = struct.pack("@HL", len(_BPF_PROG), ctypes.addressof(prog))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


class RawEtherLink(LinkState):
    """A RoCEv1 link on interface ``netdev`` (see the module docstring).

    ``vlan``: an 802.1Q VLAN ID to use on a plain netdev (None: none, or the VLAN of a
    VLAN netdev). ``resolve_wait``: how long a send may wait for the kernel's ARP/ND on a
    neighbour-table miss. ``ring`` receive slots back :meth:`recv_batch`.
    ``receive=False`` opens no receive socket (a process behind devd, which receives for
    the device): only sends and self-addressed packets.
    """

    roce_v1 = True  # Annex A16 frames (V1Link)
    multicast = True  # Ethernet multicast MACs

    def __init__(self, netdev: str, *, vlan: int | None = None, ring: int = 64,
                 rcvbuf: int = 8 << 20, resolve_wait: float = 0.5,
                 receive: bool = True) -> None:
        nd = _netdev.get(netdev)  # DeviceError if unknown
        if len(nd.mac) != 6 or nd.mac == bytes(6):
            raise DeviceError(f"netdev {netdev!r} has no Ethernet MAC address: RoCEv1 needs one")
        if vlan is not None and (not isinstance(vlan, int) or not 0 < vlan < _VID_MASK):
            raise InvalidArgument("vlan", f"VLAN ID must be 1..4094, got {vlan!r}")
        if ring < 1:
            raise InvalidArgument("ring", "must be >= 1")
        upper = vlan_of(netdev)
        if upper is not None and vlan is not None:
            raise InvalidArgument("vlan", f"{netdev} is already the VLAN {upper[1]} netdev")
        self.netdev = netdev
        self.ifindex = nd.index
        self.mac = nd.mac
        self.mtu = nd.mtu
        self.vlan = upper[1] if upper is not None else vlan
        self.tx_netdev = upper[0] if upper is not None else netdev
        # the VLAN netdev hands us frames already untagged; on a plain netdev we tag
        self._rx_vlan = None if upper is not None else vlan
        self.stats = RawEtherStats()
        self._ips = nd.ips
        self.gid_entries: tuple[GidEntry, ...] = gid_entries("1", nd.mac, nd.ips, ())
        self._own = frozenset(g for g, t in self.gid_entries if t == GID_TYPE_ROCE_V1)
        self.resolver = NeighbourResolver(netdev, nd.index, wait=resolve_wait)
        self._closed = False
        self._hdr_cache: dict[tuple[bytes, int], bytes] = {}
        self._loop: deque[Datagram] = deque()
        self._rx: socket.socket | None = None
        self._tx: socket.socket | None = None
        self._epoll: select.epoll | None = None
        self._event = -1
        try:
            if receive:
                rx = self._rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW,
                                              socket.htons(ETH_P_ALL))
                _attach_filter(rx)
                rx.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
                try:
                    rx.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, rcvbuf)
                except OSError:
                    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
                rx.bind((netdev, ETH_P_ALL))
                rx.setblocking(False)
            self._tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            self._tx.bind((self.tx_netdev, 0))
            self._tx.setblocking(False)
            self._event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._epoll = select.epoll()
            if self._rx is not None:
                self._epoll.register(self._rx.fileno(), select.EPOLLIN)
            self._epoll.register(self._event, select.EPOLLIN)
        except OSError as exc:
            self._close_fds()
            if exc.errno in (errno.EPERM, errno.EACCES):
                raise DeviceError(f"RoCEv1 on {netdev}: raw Ethernet sockets need CAP_NET_RAW "
                                  "(run as root)", errno=exc.errno) from exc
            raise DeviceError(f"RoCEv1 on {netdev}: cannot open a raw socket: {exc.strerror}",
                              errno=exc.errno) from exc
        slot = max(self.mtu, 1500) + 64
        self._ring = bytearray(ring * slot)
        view = memoryview(self._ring)
        self._slots = [view[i * slot:(i + 1) * slot] for i in range(ring)]

    # ---- link interface ------------------------------------------------------------------
    def fileno(self) -> int | None:
        """An epoll descriptor: readable when frames or looped-back packets wait."""
        return self._epoll.fileno() if self._epoll is not None and not self._closed else None

    def effective_sport(self, requested: int) -> int:
        """RoCEv1 has no UDP header: the port is returned as asked (Link protocol)."""
        return requested

    def send(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[ReadableBuffer],
             tos: int = 0, ttl: int = 64) -> None:
        """A RoCEv1-only link carries no RoCEv2 datagram: :class:`StateError`."""
        raise StateError(f"{self.netdev}: this device runs RoCE v1 only (roce_ver 1); "
                         "use a GID of type RoCE v1")

    def _header(self, dgid: bytes, sl: int) -> bytes | None:
        key = (dgid, sl)
        hdr = self._hdr_cache.get(key)
        if hdr is not None:
            return hdr
        mac = self.resolver.resolve(dgid)
        if mac is None:
            return None
        # A16.8.1: SL 0-7 are the Ethernet priorities 0-7 (8-15 are reserved: the verbs
        # layer refuses them in an address vector, CA16-18; 0 if one reaches here).
        pcp = sl if 0 <= sl <= MAX_SL else 0
        hdr = ethernet_header(mac, self.mac, ETH_P_ROCE_V1, vlan=self.vlan, pcp=pcp)
        if len(self._hdr_cache) >= 4096:
            self._hdr_cache.clear()
        self._hdr_cache[key] = hdr
        return hdr

    def send_v1(self, dgid: bytes, parts: Sequence[ReadableBuffer], sl: int = 0) -> None:
        """Send one RoCEv1 packet (``parts`` = GRH, BTH .. pad, ICRC) to ``dgid``."""
        if self._closed:
            raise ClosedError("RawEtherLink is closed")
        dgid = bytes(dgid)
        if dgid in self._own:  # CA16-22: a self-addressed packet stays on the host
            self._loopback(dgid, parts)
            return
        hdr = self._header(dgid, sl)
        if hdr is None:
            self.stats.unresolved += 1
            return
        assert self._tx is not None
        try:
            self._tx.sendmsg([hdr, *parts])
        except OSError as exc:
            if self._closed:
                raise ClosedError("RawEtherLink is closed") from exc
            if exc.errno in _LOSSY_SEND:
                self.stats.send_dropped += 1
                return
            raise DeviceError(f"RoCEv1 send on {self.tx_netdev} failed: {exc.strerror}",
                              errno=exc.errno) from exc
        self.stats.sent += 1

    def attach_mcast(self, mgid: bytes) -> None:
        """Receive the MGID's Ethernet multicast MAC (``33:33`` + its last 4 bytes,
        Annex A17): ``PACKET_ADD_MEMBERSHIP`` puts it in the interface's filter."""
        self._membership(mgid, PACKET_ADD_MEMBERSHIP)

    def detach_mcast(self, mgid: bytes) -> None:
        """Undo :meth:`attach_mcast`."""
        self._membership(mgid, PACKET_DROP_MEMBERSHIP)

    def _membership(self, mgid: bytes, op: int) -> None:
        if not is_multicast_gid(bytes(mgid)):
            raise InvalidArgument("mgid", "not a multicast GID (must start with 0xff)")
        if self._closed:
            raise ClosedError("RawEtherLink is closed")
        if self._rx is None:
            return  # send-only: devd receives (and joins) for the device
        mreq = _PACKET_MREQ.pack(self.ifindex, PACKET_MR_MULTICAST, 6,
                                 multicast_mac(bytes(mgid)) + b"\0\0")
        try:
            self._rx.setsockopt(SOL_PACKET, op, mreq)
        except OSError as exc:
            raise DeviceError(f"RoCEv1 multicast on {self.netdev}: {exc.strerror}",
                              errno=exc.errno) from exc

    def is_own(self, gid: bytes) -> bool:
        """True if ``gid`` is one of this port's RoCEv1 GIDs."""
        return gid in self._own

    def _loopback(self, dgid: bytes, parts: Sequence[ReadableBuffer]) -> None:
        data = b"".join(bytes(p) for p in parts)
        if len(data) < GRH_SIZE:
            self.stats.malformed += 1
            return
        grh = data[:GRH_SIZE]
        tclass = ((grh[0] & 0x0F) << 4) | (grh[1] >> 4)
        self._loop.append(Datagram(memoryview(data)[GRH_SIZE:], grh[8:24], dgid, 0, 0, tclass,
                                   grh[7], grh))
        self.stats.looped += 1
        os.eventfd_write(self._event, 1)

    def recv_batch(self, max_n: int = 64) -> list[Datagram]:
        """Up to ``max_n`` RoCEv1 packets, without blocking. ``data`` views the receive
        ring and stays valid until the next call."""
        if self._closed:
            raise ClosedError("RawEtherLink is closed")
        if max_n < 0:
            raise InvalidArgument("max_n", "must be >= 0")
        out: list[Datagram] = []
        loop = self._loop
        if loop:
            try:
                os.eventfd_read(self._event)
            except BlockingIOError:
                pass
            while loop and len(out) < max_n:
                out.append(loop.popleft())
            if loop:
                os.eventfd_write(self._event, 1)
        if self._rx is None:  # send-only (behind devd)
            return out
        n = min(max_n, len(self._slots))
        recv = self._rx.recvmsg_into
        st = self.stats
        i = 0
        while len(out) < max_n and i < n:
            slot = self._slots[i]
            try:
                nbytes, anc, flags, addr = recv([slot], _ANC_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                if self._closed:
                    raise ClosedError("RawEtherLink is closed") from exc
                if exc.errno in (errno.ENETDOWN, errno.ENOBUFS, errno.ENOMEM):
                    break
                raise DeviceError(f"RoCEv1 receive on {self.netdev} failed: {exc.strerror}",
                                  errno=exc.errno) from exc
            if addr[2] == PACKET_OUTGOING:
                continue
            if flags & socket.MSG_TRUNC:
                st.truncated += 1
                continue
            dg = self._frame(slot[:nbytes], anc)
            if dg is not None:
                out.append(dg)
                i += 1
        st.received += i
        return out

    def _frame(self, frame: memoryview, anc: list[tuple[int, int, bytes]]) -> Datagram | None:
        """A received frame as a Datagram, or None (counted) if it is not for this port."""
        st = self.stats
        vid: int | None = None
        for level, typ, data in anc:
            if level == SOL_PACKET and typ == PACKET_AUXDATA and len(data) >= _AUXDATA.size:
                status, _l, _s, _m, _n, tci, _tpid = _AUXDATA.unpack_from(data)
                if status & TP_STATUS_VLAN_VALID:
                    vid = tci & _VID_MASK
        if frame[12:14] == _ROCE_V1_TYPE:  # the usual case: no tag left in the frame
            off = ETH_HLEN
        else:
            try:
                eth = parse_ethernet(frame)
            except DecodeError:  # a runt frame
                st.malformed += 1
                return None
            if eth.ethertype != ETH_P_ROCE_V1:
                return None
            if eth.vlan is not None:
                vid = eth.vlan
            off = eth.length
        if (vid or None) != self._rx_vlan:  # VID 0 is a priority tag: untagged
            st.vlan_other += 1
            return None
        if len(frame) < off + GRH_SIZE + 16:
            st.malformed += 1
            return None
        grh = bytes(frame[off:off + GRH_SIZE])
        paylen = (grh[4] << 8) | grh[5]
        if grh[0] >> 4 != 6 or grh[6] != 0x1B or off + GRH_SIZE + paylen > len(frame):
            st.malformed += 1
            return None
        dgid = grh[24:40]
        if dgid not in self._own and not is_multicast_gid(dgid):
            st.not_ours += 1
            return None
        tclass = ((grh[0] & 0x0F) << 4) | (grh[1] >> 4)
        body = frame[off + GRH_SIZE:off + GRH_SIZE + paylen]
        return Datagram(body, grh[8:24], dgid, 0, 0, tclass, grh[7], grh)

    def _close_fds(self) -> None:
        for s in (self._rx, self._tx):
            if s is not None:
                s.close()
        if self._epoll is not None:
            self._epoll.close()
        if self._event >= 0:
            os.close(self._event)
        self._rx = self._tx = None
        self._epoll = None
        self._event = -1

    def close(self) -> None:
        """Close the sockets (idempotent)."""
        if not self._closed:
            self._closed = True
            self._close_fds()

    def __enter__(self) -> RawEtherLink:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        tag = f" vlan {self.vlan}" if self.vlan is not None else ""
        return f"<RawEtherLink {self.netdev}{tag}{' closed' if self._closed else ''}>"
