"""A network with a bottleneck link, for congestion-control tests and the lossy-goodput bench.

Like :class:`harness.engine.Net` (engine ports, a virtual clock, no ICRC), but every packet
from one port to another crosses that direction's link: a FIFO served at ``rate_bps``
(serialisation of BTH .. ICRC plus ``overhead`` bytes of Ethernet/IP/UDP) holding at most
``queue`` packets (more are tail-dropped, as a switch port or a full receive socket
drops them), then ``latency`` of propagation. Packets that find ``ecn_k`` or more packets
queued are marked ECN CE (RFC 3168; a DCQCN switch's marking threshold), which the
receiving port sees as ``RxMeta.tclass & 3 == 3``. ``loss`` drops packets at random after
the queue (a lossy wire), from a seeded generator: a run is reproducible.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from harness.engine import gid4
from softrdma.ib.packet import GID_TYPE_ROCE_V2, RxMeta
from softrdma.ib.port import Port

_ECN_CE = 3


@dataclass
class _Link:
    busy_until: float = 0.0  # when the last queued packet finishes serialisation
    departures: list[float] = field(default_factory=list)  # of queued packets (a heap)


@dataclass
class BottleneckNet:
    rate_bps: float = 1e9
    latency: float = 5e-6
    queue: int = 64
    ecn_k: int | None = None
    loss: float = 0.0
    seed: int = 0
    overhead: int = 42  # Ethernet (14) + IPv4 (20) + UDP (8) around BTH .. ICRC
    now: float = 0.0
    ports: dict[bytes, Port] = field(default_factory=dict)
    sent: int = 0
    tail_drops: int = 0
    lost: int = 0
    marked: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.links: dict[tuple[bytes, bytes], _Link] = {}
        self.q: list[tuple[float, int, bytes, bytes, bytes, bool]] = []
        self.seq = 0

    def add_port(self, last: int) -> Port:
        g = gid4(last)
        p = Port([g], gid_types=[GID_TYPE_ROCE_V2])
        self.ports[g] = p
        return p

    def _collect(self) -> None:
        for port in self.ports.values():
            for tx in port.take_tx():
                self.sent += 1
                data = b"".join(bytes(x) for x in tx.parts)
                link = self.links.setdefault((tx.sgid, tx.dgid), _Link())
                deps = link.departures
                while deps and deps[0] <= self.now:
                    heapq.heappop(deps)
                if len(deps) >= self.queue:
                    self.tail_drops += 1
                    continue
                ce = self.ecn_k is not None and len(deps) >= self.ecn_k
                self.marked += ce
                start = link.busy_until if link.busy_until > self.now else self.now
                done = start + (len(data) + 4 + self.overhead) * 8 / self.rate_bps
                link.busy_until = done
                heapq.heappush(deps, done)
                if self.loss and self.rng.random() < self.loss:
                    self.lost += 1
                    continue
                self.seq += 1
                heapq.heappush(self.q, (done + self.latency, self.seq, tx.sgid, tx.dgid, data, ce))

    def step(self) -> bool:
        self._collect()
        deadlines = [d for d in (p.next_deadline() for p in self.ports.values()) if d is not None]
        nt = self.q[0][0] if self.q else None
        nd = min(deadlines) if deadlines else None
        if nt is None and nd is None:
            return False
        if nt is not None and (nd is None or nt <= nd):
            t, _, sgid, dgid, data, ce = heapq.heappop(self.q)
            self.now = max(self.now, t)
            port = self.ports.get(dgid)
            if port is not None:
                port.receive(memoryview(data), RxMeta(sgid, dgid, tclass=_ECN_CE if ce else 0),
                             self.now)
        else:
            assert nd is not None
            self.now = max(self.now, nd)
            for p in self.ports.values():
                p.on_timer(self.now)
        return True

    def run(self, until: float, max_steps: int = 5_000_000) -> None:
        """Run until the network is idle or virtual time ``until``."""
        for _ in range(max_steps):
            if self.now >= until or not self.step():
                return
        raise AssertionError("network did not go idle")
