"""Two verbs endpoints (one side each: PD, CQ, QP, MR) connected RC/UC/UD, on the fabric or over UDP.

(Moved from tests/verbs/test_verbs_data.py, which other test files imported.)"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from harness import ports
from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.links.udp import UdpLink
from softrdma.drivers.runtime.clock import VirtualClock

RC, UC, UD = int(e.IBV_QPT_RC), int(e.IBV_QPT_UC), int(e.IBV_QPT_UD)


ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
          | e.IBV_ACCESS_REMOTE_ATOMIC)


class Side:
    def __init__(self, ctx: v.Context, qpt: int, buf: bytearray | np.ndarray,
                 channel: bool = False) -> None:
        self.ctx = ctx
        self.pd = v.PD(ctx)
        self.ch = v.CompChannel(ctx) if channel else None
        self.cq = v.CQ(ctx, 128, channel=self.ch)
        self.qp = v.QP(self.pd, v.QPInitAttr(qpt, scq=self.cq, rcq=self.cq,
                                             cap=v.QPCap(16, 16, 2, 2, 128)))
        self.buf = buf
        self.mr = v.MR(self.pd, 0, ACC, buffer=buf)

    def sge(self, off: int, n: int) -> v.SGE:
        return v.SGE(self.mr.addr + off, n, self.mr.lkey)


def connect(x: Side, y: Side, mtu: int = int(e.IBV_MTU_1024), retry_cnt: int = 5,
            rnr_retry: int = 5, timeout: int = 8) -> None:
    for me, peer in ((x, y), (y, x)):
        a = v.QPAttr(qkey=0x11223344, path_mtu=mtu, dest_qp_num=peer.qp.qp_num, rq_psn=7,
                     sq_psn=7, max_dest_rd_atomic=4, max_rd_atomic=4, min_rnr_timer=1,
                     timeout=timeout, retry_cnt=retry_cnt, rnr_retry=rnr_retry)
        a.qp_access_flags = ACC
        a.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=peer.ctx.query_gid(1, 0), hop_limit=64))
        me.qp.to_rts(a)


ROCE_VER = {"v": "2"}  # the fabric links' RoCE version (the fixture below sets it)


@contextlib.contextmanager
def udp_rc_pair(progress: str) -> Iterator[tuple[Side, Side, UdpLink, UdpLink]]:
    """Two RC sides connected over UDP loopback (127.0.0.1 and 127.0.0.2, one port) with
    ``progress`` ("manual": no thread sends their ACKs; "thread"). Yields the sides and
    their links."""
    la = UdpLink("127.0.0.1", 0)
    assert la.port is not None
    lb = UdpLink("127.0.0.2", la.port)
    ca = v.Context(link=la, progress=progress)
    cb = v.Context(link=lb, progress=progress)
    try:
        a = Side(ca, RC, bytearray(1 << 12))
        b = Side(cb, RC, bytearray(1 << 12))
        connect(a, b, int(e.IBV_MTU_1024), timeout=14)
        yield a, b, la, lb
    finally:
        ca.close()
        cb.close()


class FabricPair:
    def __init__(self, qpt: int = RC, size: int = 1 << 16, **fabric_args: Any) -> None:
        self.clock = VirtualClock()
        self.fab = Fabric(self.clock, seed=3, **fabric_args)
        ver = ROCE_VER["v"]
        self.a = Side(v.Context(fabric=self.fab.link("10.4.0.1", roce_ver=ver)), qpt,
                      bytearray(size), True)
        self.b = Side(v.Context(fabric=self.fab.link("10.4.0.2", roce_ver=ver)), qpt,
                      bytearray(size), True)
        connect(self.a, self.b)

    def run(self) -> None:
        self.clock.run(max_events=200000)

    def close(self) -> None:
        self.a.ctx.close()
        self.b.ctx.close()


# ---- UDP on loopback, progress thread ---------------------------------------------------------
@pytest.fixture()
def udp_pair():
    port = None
    for _ in range(10):
        port = ports.free_port()
        try:
            la = UdpLink("127.0.0.1", port)
        except Exception:  # noqa: BLE001
            continue
        try:
            lb = UdpLink("127.0.0.2", port)
        except Exception:  # noqa: BLE001
            la.close()
            continue
        break
    else:
        pytest.skip("no free UDP port on loopback")
    ca = v.Context(link=la)
    cb = v.Context(link=lb)
    a = Side(ca, RC, bytearray(1 << 20), True)
    b = Side(cb, RC, bytearray(1 << 20), True)
    # Real sockets and threads on a possibly loaded host: timeout 14 (~67 ms per try), not
    # the fabric tests' 8 (~1 ms, 6 ms for all retries: a descheduled process exceeds it).
    connect(a, b, int(e.IBV_MTU_4096), timeout=14)
    yield a, b
    ca.close()
    cb.close()


def _wait(cq: v.CQ, n: int = 1, timeout: float = 5.0) -> list[v.WC]:
    out: list[v.WC] = []
    end = time.monotonic() + timeout
    while len(out) < n:
        if time.monotonic() > end:
            raise AssertionError(f"timeout: got {out}")
        out += cq.poll(n - len(out))[1]
    return out
