"""Forwarding in ``devd``: the datagrams that reach the daemon's own sockets (QP1 MADs,
multicast, unknown QPNs, every datagram of a client on the forwarded path) go to their
owners over the data channels (the delivery rules of :mod:`softrdma.drivers.devd.proto`;
BTH DestQP: IBA 9.2; multicast: IBA 10.5, Annex A17)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

from softrdma.drivers.devd.cm import CmRouting
from softrdma.drivers.devd.proto import (
    BTH_SIZE,
    DHDR,
    MAX_DATAGRAM,
    MAX_SEGMENT_HINT,
    QPN_GSI,
    QPN_MULTICAST,
    XRC_RECORD,
    Client,
    client_recv,
)
from softrdma.drivers.devd.v1 import V1_VERSION, v1_datagram
from softrdma.drivers.links.link import Datagram
from softrdma.drivers.links.rawether import RawEtherLink
from softrdma.drivers.links.udp import UdpLink
from softrdma.wire.gid import ip_to_gid

RECV_BATCH = 64


class Forwarding(CmRouting):
    """The daemon's data path, mixed into ``Devd``."""

    _owners: dict[int, Client]
    _groups: dict[bytes, list[Client]]
    _raw: RawEtherLink | None
    _closed_qpns: dict[int, None]  # QPNs of QPs destroyed lately (QpnRouting)

    _xrc_forward: Callable[[Client, bytes], None]  # XrcRouting
    _xrc_flush: Callable[[Client], None]  # XrcRouting

    def _on_data_hup(self, c: Client) -> None:
        """The data channel is readable: the client left, or it sends a self-addressed
        RoCEv1 packet (CA16-22), which is routed as if it had arrived from the wire, or
        an XRC hand-over record (:mod:`.xrc`); or it is writable again for the XRC
        records waiting for it."""
        self._xrc_flush(c)
        while (msg := client_recv(c, c.data, DHDR.size + MAX_DATAGRAM)) is not None:
            if msg[0] == XRC_RECORD:
                self._xrc_forward(c, msg)
                continue
            dg = v1_datagram(msg, DHDR.size)
            if dg is None or self._raw is None:
                self.counters["malformed"] += 1
                continue
            self._route(self._raw, [dg])

    def _on_udp(self, link: UdpLink | RawEtherLink) -> None:
        self._route(link, link.recv_batch(RECV_BATCH))

    def _route(self, link: UdpLink | RawEtherLink, dgrams: Sequence[Datagram]) -> None:
        """Forward datagrams (RoCEv2) and RoCEv1 frames (``dg.grh``) to their owners."""
        counters = self.counters
        owners = self._owners
        for dg in dgrams:
            counters["rx"] += 1
            d = dg.data
            if len(d) < BTH_SIZE:
                counters["malformed"] += 1
                continue
            qpn = int.from_bytes(d[5:8], "big")
            if qpn == QPN_GSI:
                targets: Sequence[Client] = self._route_qp1(link, dg)
            elif qpn == QPN_MULTICAST:
                targets = self._groups.get(ip_to_gid(dg.dst_ip), ())
            else:
                owner = owners.get(qpn)
                targets = (owner,) if owner is not None else ()
            if not targets:
                counters["closed_qpn" if qpn in self._closed_qpns else "unknown_qpn"] += 1
                continue
            hdr = DHDR.pack(
                V1_VERSION if dg.grh else 4 if len(dg.src_ip) == 4 else 6,
                dg.tos,
                dg.ttl,
                dg.ident + 1 if 0 <= dg.ident <= MAX_SEGMENT_HINT else 0,
                dg.sport,
                dg.dport,
                ip_to_gid(dg.src_ip),
                ip_to_gid(dg.dst_ip),
            )
            for c in targets:
                self._forward(c, hdr, d, dg.grh)

    def _forward(self, c: Client, hdr: bytes, payload: memoryview, grh: bytes = b"") -> None:
        if c.dead:
            return
        try:
            c.data.sendmsg([hdr, grh, payload] if grh else [hdr, payload], [],
                           socket.MSG_DONTWAIT)
        except BlockingIOError:
            self.counters["client_full"] += 1
        except OSError:
            c.dead = True
        else:
            self.counters["forwarded"] += 1
