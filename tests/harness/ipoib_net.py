"""Two or more IPoIB interface engines (:class:`~softrdma.ipoib.iface.IpoibInterface`) on
an emulated link: their outputs delivered to each other (UD, multicast groups, the CM's
REQ/REP/REJ and connections), what they write to the host kept per interface.
(Moved from tests/ipoib/test_ipoib_core.py: the fuzz targets use it too.)"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from softrdma.ipoib.encap import encap_header
from softrdma.ipoib.events import (
    ConnAccept,
    ConnClose,
    ConnOpen,
    ConnReject,
    ConnSend,
    McastJoin,
    TunWrite,
    UdSend,
)
from softrdma.ipoib.hwaddr import MULTICAST_QPN, HwAddr, service_id
from softrdma.ipoib.iface import IfaceConfig, IpoibInterface
from softrdma.ipoib.ip import ipv4_header

__all__ = ["Net", "make_net", "connected_net", "v4", "v6", "gid"]


def gid(n: int) -> bytes:
    return bytes(10) + b"\xff\xff" + bytes((10, 0, 0, n))


# ---- two or more interfaces on an emulated link ---------------------------------------
@dataclass
class Net:
    ifs: list[IpoibInterface]
    joined: dict[int, set[bytes]] = field(default_factory=dict)
    tun: dict[int, list[bytes]] = field(default_factory=dict)
    reqs: list[tuple[int, ConnOpen]] = field(default_factory=list)
    conn_peer: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    pending_accepts: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    rejects: list[tuple[int, ConnReject]] = field(default_factory=list)
    ud: list[tuple[int, UdSend]] = field(default_factory=list)
    hold_reqs: bool = False
    now: float = 0.0
    drop_ud: Callable[[int, UdSend], bool] | None = None   # (sender, message): lost?

    def pump(self) -> None:
        for _ in range(100):
            busy = False
            for i, f in enumerate(self.ifs):
                for o in f.take_output():
                    busy = True
                    self._do(i, o)
            if not self.hold_reqs and self.reqs:
                busy = True
                self.deliver_reqs()
            if not busy:
                return

    def deliver_reqs(self) -> None:
        reqs, self.reqs = self.reqs, []
        for i, o in reqs:
            j = self.index(o.peer)
            token = len(self.pending_accepts) + 1000 * (i + 1) + o.conn_id
            self.pending_accepts[(j, token)] = (i, o.conn_id)
            self.ifs[j].conn_request(token, self.ifs[i].hwaddr.gid, o.private_data, "RC",
                                     self.now)

    def index(self, hw: HwAddr) -> int:
        return next(k for k, f in enumerate(self.ifs) if f.hwaddr.key == hw.key)

    def _do(self, i: int, o: object) -> None:
        f = self.ifs[i]
        if isinstance(o, McastJoin):
            self.joined.setdefault(i, set()).add(o.mgid)
        elif isinstance(o, TunWrite):
            self.tun.setdefault(i, []).append(bytes(o.packet))
        elif isinstance(o, UdSend):
            self.ud.append((i, o))
            if self.drop_ud is not None and self.drop_ud(i, o):
                return
            msg = encap_header(o.ethertype) + bytes(o.payload)
            if o.dest.qpn == MULTICAST_QPN:
                for j in range(len(self.ifs)):
                    if j != i and o.dest.gid in self.joined.get(j, ()):
                        self.ifs[j].receive_ud(msg, f.hwaddr.gid, f.hwaddr.qpn, self.now)
            else:
                self.ifs[self.index(o.dest)].receive_ud(msg, f.hwaddr.gid, f.hwaddr.qpn,
                                                        self.now)
        elif isinstance(o, ConnOpen):
            assert o.service_id == service_id(o.peer.qpn)
            self.reqs.append((i, o))
        elif isinstance(o, ConnAccept):
            a, aconn = self.pending_accepts.pop((i, o.token))
            self.conn_peer[(i, o.conn_id)] = (a, aconn)
            self.conn_peer[(a, aconn)] = (i, o.conn_id)
            self.ifs[a].conn_established(aconn, self.now, rep_private_data=o.private_data)
            f.conn_established(o.conn_id, self.now)
        elif isinstance(o, ConnReject):
            self.rejects.append((i, o))
            a, aconn = self.pending_accepts.pop((i, o.token))
            self.ifs[a].conn_closed(aconn, self.now, refused=True)
        elif isinstance(o, ConnSend):
            j, jc = self.conn_peer[(i, o.conn_id)]
            self.ifs[j].receive_conn(jc, encap_header(o.ethertype) + bytes(o.payload),
                                     self.now)
        elif isinstance(o, ConnClose):
            peer = self.conn_peer.pop((i, o.conn_id), None)
            if peer is not None:
                self.conn_peer.pop(peer, None)
                self.ifs[peer[0]].conn_closed(peer[1], self.now)


def make_net(n: int = 2, mode: str = "connected", crossing_rule: bool = True,
             qpns: list[int] | None = None) -> Net:
    ifs = []
    for k in range(n):
        cfg = IfaceConfig(gid=gid(k + 1), ud_qpn=(qpns or [0x40 + k for k in range(n)])[k],
                          ud_mtu=2044, mode=mode,  # type: ignore[arg-type]
                          addresses=(ipaddress.IPv4Interface(f"10.9.0.{k + 1}/24"),
                                     ipaddress.IPv6Interface(f"fd09::{k + 1}/64")),
                          crossing_rule=crossing_rule)
        ifs.append(IpoibInterface(cfg))
    net = Net(ifs)
    for f in ifs:
        f.start(0.0)
    net.pump()
    net.ud.clear()  # the announcements (gratuitous ARP, unsolicited NA)
    return net


def connected_net() -> Net:
    """Two interfaces, the first one's neighbour resolved (a small packet over UD) and its
    RC connection up (a packet over the UD MTU)."""
    net = make_net()
    a = net.ifs[0]
    a.send_ip(v4(1, 2, 100), 0.0)
    net.pump()
    a.send_ip(v4(1, 2, 9000), 0.0)
    net.pump()
    return net


def v4(src: int, dst: int, size: int, df: bool = True) -> bytes:
    payload = bytes(size - 20)
    return ipv4_header(bytes((10, 9, 0, src)), bytes((10, 9, 0, dst)), 17, len(payload),
                       frag=0x4000 if df else 0) + payload


def v6(src: int, dst: int, size: int) -> bytes:
    s = ipaddress.IPv6Address(f"fd09::{src}").packed
    d = ipaddress.IPv6Address(f"fd09::{dst}").packed
    return struct.pack(">IHBB16s16s", 6 << 28, size - 40, 17, 64, s, d) + bytes(size - 40)
