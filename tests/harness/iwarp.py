"""In-memory harness for the sans-I/O iWARP engine: two devices joined by a byte pipe.

Each :class:`Side` has an :class:`~softrdma.iwarp.qp.IwarpDevice`, a PD (any object), CQ
lists and one :class:`~softrdma.iwarp.qp.IwarpQP`; :func:`connect_pair` runs the MPA
exchange through :func:`pump`, which moves the bytes each engine pulls to the other
side's ``receive`` (optionally in small, uneven chunks, or through the zero-copy
``rx_target`` path) until nothing moves. ``wire`` records each direction's bytes.
"""

from __future__ import annotations

import random
from typing import Any

from softrdma import enums as e
from softrdma.iwarp.engine import ConnState, IwarpConn
from softrdma.iwarp.mpa_setup import MpaConfig
from softrdma.iwarp.qp import IwarpDevice, IwarpQP
from softrdma.seam.events import EngineEvent
from softrdma.seam.queues import QPInit
from softrdma.seam.types import SGE, MemoryRegion, RecvWQE, SendWQE, WorkCompletion

ACC_ALL = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)


class Side:
    def __init__(self, name: str, *, max_send_wr: int = 64, max_recv_wr: int = 64) -> None:
        self.name = name
        self.dev = IwarpDevice([bytes(10) + b"\xff\xff\x7f\x00\x00\x01"])
        self.pd = object()
        self.scq: list[WorkCompletion] = []
        self.rcq: list[WorkCompletion] = []
        self.events: list[EngineEvent] = []
        self.dev.events.subscribe(self.events.append)
        self.qp = IwarpQP(self.dev, QPInit(int(e.IBV_QPT_RC), self.pd, self.scq.append,
                                           self.rcq.append, None, max_send_wr, max_recv_wr, 4,
                                           4, 64, False))
        self.qp.modify({"qp_state": int(e.IBV_QPS_INIT)}, 0.0)
        self._conn: IwarpConn | None = None
        self.wire = bytearray()  # everything this side sent

    @property
    def conn(self) -> IwarpConn:
        assert self._conn is not None, "not connected"
        return self._conn

    @conn.setter
    def conn(self, c: IwarpConn) -> None:
        self._conn = c

    def mr(self, size: int, access: int = ACC_ALL, fill: int | None = None,
           pd: object = None) -> MemoryRegion:
        buf = bytearray(size) if fill is None else bytearray([fill]) * size
        return self.dev.register_mr(memoryview(buf), 0x10000, access,
                                    self.pd if pd is None else pd)

    def post_recv(self, mr: MemoryRegion, length: int, offset: int = 0, wr_id: int = 0) -> None:
        self.qp.post_recv(RecvWQE(wr_id, [SGE(mr.addr + offset, length, mr.lkey)]))

    def post(self, opcode: int, mr: Any = None, length: int = 0, offset: int = 0, *,
             wr_id: int = 0, rkey: int = 0, raddr: int = 0, flags: int = int(e.IBV_SEND_SIGNALED),
             inv: int = 0, sges: list[SGE] | None = None) -> SendWQE:
        if sges is None:
            sges = [SGE(mr.addr + offset, length, mr.lkey)] if mr is not None else []
        w = SendWQE(wr_id, int(opcode), flags, sges, invalidate_rkey=inv, remote_addr=raddr,
                    rkey=rkey)
        self.qp.post_send(w, 0.0)
        return w


def pump(a: Side, b: Side, *, chunk: int | None = None, rng: random.Random | None = None,
         direct: bool = False, rounds: int = 1_000_000,
         log: list[tuple[int, bytes]] | None = None) -> int:
    """Move bytes both ways until quiet; returns the bytes moved. With ``log``, each
    pull is one MPA frame or one FPDU, appended as ``(0 for a / 1 for b, bytes)``."""
    moved = 0
    for _ in range(rounds):
        step = 0
        for who, (x, y) in enumerate(((a, b), (b, a))):
            cx, cy = x._conn, y._conn
            if cx is None or cy is None:
                continue
            bufs = cx.pull_tx(1) if log is not None else cx.pull_tx()
            if not bufs:
                continue
            data = b"".join(bytes(p) for p in bufs)
            cx.tx_sent(len(data))
            x.wire += data
            if log is not None:
                log.append((who, data))
            step += len(data)
            _deliver(cy, data, chunk, rng, direct)
        moved += step
        if not step:
            return moved
    raise AssertionError("pump did not settle")


def _deliver(conn: IwarpConn, data: bytes, chunk: int | None, rng: random.Random | None,
             direct: bool) -> None:
    mv = memoryview(data)
    i = 0
    while i < len(mv):
        if direct:
            t = conn.rx_target()
            if t is not None:
                n = min(len(t), len(mv) - i)
                t[:n] = mv[i:i + n]
                conn.rx_placed(n)
                i += n
                continue
        if rng is not None:
            n = rng.randint(1, chunk or 64)
        else:
            n = chunk or len(mv)
        conn.receive(mv[i:i + n])
        i += n


def connect_pair(a: Side, b: Side, cfg_a: MpaConfig | None = None,
                 cfg_b: MpaConfig | None = None, *, pd_a: bytes = b"", pd_b: bytes = b"",
                 mss: int = 1460, **pump_kw: Any) -> None:
    """``a`` initiates, ``b`` accepts; both QPs end in RTS."""
    a.conn = IwarpConn(a.dev, initiator=True, cfg=cfg_a, mss=mss, qp=a.qp, private_data=pd_a)
    b.conn = IwarpConn(b.dev, initiator=False, cfg=cfg_b, mss=mss)
    pump(a, b, **pump_kw)
    assert b.conn.state == ConnState.ACCEPT_WAIT, b.conn.state
    b.conn.accept(b.qp, pd_b, cfg_b)
    pump(a, b, **pump_kw)
    assert a.conn.state == ConnState.RTS, (a.conn.state, a.conn.reason)
    assert b.conn.state == ConnState.RTS, (b.conn.state, b.conn.reason)
