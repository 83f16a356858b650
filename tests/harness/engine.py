"""A minimal deterministic network for engine-level tests (no ICRC, no verbs layer).

Packets leave a Port through ``take_tx()`` and are delivered to the Port that owns the
destination GID after a latency, in virtual time, with optional seeded loss, duplication
and reordering. (Corruption is modelled as loss: the driver's ICRC check drops it.)
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from softrdma import enums as e
from softrdma.ib.packet import GID_TYPE_ROCE_V1, GID_TYPE_ROCE_V2
from softrdma.ib.port import Port, RxMeta
from softrdma.ib.qp import AddressVector, EngineQP
from softrdma.seam.queues import QPInit
from softrdma.seam.types import MemoryRegion, WorkCompletion
from softrdma.wire import rocev1


def gid4(last: int) -> bytes:
    return bytes(10) + b"\xff\xff" + bytes([10, 0, 0, last])


@dataclass
class Net:
    seed: int = 0
    latency: float = 2e-6
    drop: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    now: float = 0.0
    ports: dict[bytes, Port] = field(default_factory=dict)
    q: list[tuple[float, int, bytes, bytes, bytes]] = field(default_factory=list)
    seq: int = 0
    delivered: int = 0
    dropped: int = 0
    drop_rule: Any = None  # callable(bytes) -> bool: drop this packet
    v1: bool = False  # ports with RoCEv1 GIDs; packets carry a real GRH (Annex A16)
    sent: int = 0  # packets the ports emitted (before loss and duplication)
    max_sent: int | None = None  # fail fast (a packet storm) once ``sent`` exceeds this
    # A live peer: the random loss drops one packet (the same header) at most this many
    # times in a row (None: no bound). The same PSN lost retry_cnt + 1 times in a row may
    # rightly end an RC QP (IBA 9.7.6.1.3), which no exactly-once property can allow.
    max_drops_in_a_row: int | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._drops_of: dict[bytes, int] = {}

    def add_port(self, last: int, **kw: Any) -> Port:
        g = gid4(last)
        p = Port([g], gid_types=[GID_TYPE_ROCE_V1 if self.v1 else GID_TYPE_ROCE_V2], **kw)
        self.ports[g] = p
        return p

    def _collect(self) -> None:
        for port in list(self.ports.values()):
            for tx in port.take_tx():
                self.sent += 1
                if self.max_sent is not None and self.sent > self.max_sent:
                    raise AssertionError(f"packet storm: more than {self.max_sent} packets sent")
                data = b"".join(bytes(x) for x in tx.parts)
                assert len(data) == tx.length, (len(data), tx.length)
                assert tx.v1 == self.v1  # the source GID's type picks the encapsulation
                if self.drop_rule is not None and self.drop_rule(data):
                    self.dropped += 1
                    continue
                r = self.rng.random()
                if r < self.drop:
                    cap = self.max_drops_in_a_row
                    key = data[:12]  # BTH: opcode, QPN, PSN
                    n = self._drops_of.get(key, 0) if cap is not None else 0
                    if cap is None or n < cap:
                        if cap is not None:
                            self._drops_of[key] = n + 1
                        self.dropped += 1
                        continue
                if self.max_drops_in_a_row is not None:
                    self._drops_of.pop(data[:12], None)
                t = self.now + self.latency
                if self.rng.random() < self.reorder:
                    t += self.latency * self.rng.randint(1, 20)
                copies = 2 if self.rng.random() < self.dup else 1
                for _ in range(copies):
                    self.seq += 1
                    heapq.heappush(self.q, (t, self.seq, tx.sgid, tx.dgid, data))

    def step(self) -> bool:
        self._collect()
        deadlines = [d for d in (p.next_deadline() for p in self.ports.values()) if d is not None]
        nt = self.q[0][0] if self.q else None
        nd = min(deadlines) if deadlines else None
        if nt is None and nd is None:
            return False
        if nt is not None and (nd is None or nt <= nd):
            t, _, sgid, dgid, data = heapq.heappop(self.q)
            self.now = max(self.now, t)
            port = self.ports.get(dgid)
            if port is not None:
                self.delivered += 1
                meta = RxMeta(sgid, dgid)
                if self.v1:
                    grh = rocev1.build_grh(sgid, dgid, len(data) + 4)
                    meta = RxMeta(sgid, dgid, 0, 0, 0xFF, 0, grh, False, True)
                port.receive(memoryview(data), meta, self.now)
        else:
            assert nd is not None
            self.now = max(self.now, nd)
            for p in self.ports.values():
                p.on_timer(self.now)
        return True

    def run(self, max_steps: int = 10_000_000, until: float | None = None) -> None:
        for _ in range(max_steps):
            if until is not None and self.now >= until:
                return
            if not self.step():
                return
        raise AssertionError("network did not go idle")


def deliver(src: Endpoint, dst: Endpoint, *, acks: bool = True) -> list[bytes]:
    """Hand what ``src``'s port sends now (its coalesced ACKs too with ``acks``) straight
    to ``dst``'s port, in order, at time 0: the packets, for the test to look at."""
    out = []
    for tx in src.port.take_tx(acks=acks):
        data = b"".join(bytes(x) for x in tx.parts)
        out.append(data)
        dst.port.receive(memoryview(data), RxMeta(tx.sgid, tx.dgid), 0.0)
    return out


class Sink(list[WorkCompletion]):
    def __call__(self, wc: WorkCompletion) -> None:
        self.append(wc)


class Endpoint:
    """A port-side bundle: PD marker, CQ sinks, one QP and a registered buffer."""

    def __init__(self, port: Port, qp_type: int = e.IBV_QPT_RC, size: int = 1 << 20,
                 max_wr: int = 256, srq: Any = None) -> None:
        self.port = port
        self.pd = object()
        self.scq = Sink()
        self.rcq = Sink()
        self.buf = bytearray(size)
        self.mr: MemoryRegion = port.register_mr(
            memoryview(self.buf), 0x10000, int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                                               | e.IBV_ACCESS_REMOTE_READ
                                               | e.IBV_ACCESS_REMOTE_ATOMIC), self.pd)
        self.qp = EngineQP(port, QPInit(int(qp_type), self.pd, self.scq, self.rcq, srq, max_wr,
                                        max_wr, 4, 4, 64, False))


def connect(a: Endpoint, b: Endpoint, *, mtu: int = 3, timeout: int = 10, retry_cnt: int = 7,
            rnr_retry: int = 7, min_rnr_timer: int = 1, rd_atomic: int = 4) -> None:
    """Drive both QPs RESET -> INIT -> RTR -> RTS towards each other."""
    acc = int(e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)
    for x, y in ((a, b), (b, a)):
        qp = x.qp
        qp.modify({"qp_state": 1, "pkey_index": 0, "port_num": 1, "access_flags": acc,
                   "qkey": 0x11111111}, 0.0)
        if qp.qp_type == e.IBV_QPT_UD:
            qp.modify({"qp_state": 2}, 0.0)
            qp.modify({"qp_state": 3, "sq_psn": 100}, 0.0)
            continue
        qp.modify({"qp_state": 2, "path_mtu": mtu, "dest_qp_num": y.qp.qpn, "rq_psn": 0xFFFFF0,
                   "ah": AddressVector(y.port.gids[0]), "max_dest_rd_atomic": rd_atomic,
                   "min_rnr_timer": min_rnr_timer}, 0.0)
        qp.modify({"qp_state": 3, "sq_psn": 0xFFFFF0, "timeout": timeout, "retry_cnt": retry_cnt,
                   "rnr_retry": rnr_retry, "max_rd_atomic": rd_atomic}, 0.0)
