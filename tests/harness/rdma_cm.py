"""Shared setup of the rdma_cm tests: a private state directory whose registry holds one
RoCE device on ``lo`` with an unused UDP port (instead of the built-in one on 4791), so
the tests neither collide with a real devd nor with each other."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import ports
from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm import rdma_cm as rc
from softrdma.cm.rdma_cm import EventChannel, RdmaCmEvent
from softrdma.drivers.host.registry import Registry
from softrdma.ibcm.params import CmConfig

ROCE_DEV = "cmtest_lo"
FAST_CM = CmConfig(subnet_timeout=12, remote_cm_response_timeout=14, max_cm_retries=3,
                   timewait_s=0.05)


def make_state_dir(path: Path) -> tuple[Path, int]:
    """A registry with only ``cmtest_lo`` (roce on lo, a free UDP port)."""
    reg = Registry(path)
    reg.delete("softrdma_lo")
    port = ports.free_port()
    reg.add(ROCE_DEV, "lo", "roce", port)
    return path, port


def setup_env(tmp_path: Path, monkeypatch: Any) -> Iterator[Path]:
    d, _ = make_state_dir(tmp_path)
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(d))
    monkeypatch.setenv("SOFTRDMA_SHARED", "1")
    rc.configure(cm_config=FAST_CM, iwarp_timeout=2.0)
    try:
        yield d
    finally:
        rc.release_devices()


ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)


class Ep:
    """A PD, CQ, MR and QP attached to an rdma_cm id (the application's resources)."""

    def __init__(self, cid: rc.CmId, *, ud: bool = False, size: int = 4096) -> None:
        ctx = cid.verbs
        self.pd = v.PD(ctx)
        self.cq = v.CQ(ctx, 64)
        qpt = e.IBV_QPT_UD if ud else e.IBV_QPT_RC
        self.qp = cid.create_qp(self.pd, v.QPInitAttr(qp_type=qpt, scq=self.cq, rcq=self.cq,
                                                      cap=v.QPCap(16, 16, 1, 1)))
        self.mr = v.MR(self.pd, size, ACC)

    def recv(self, length: int, offset: int = 0, wr_id: int = 1) -> None:
        self.qp.post_recv(v.RecvWR(wr_id, 1, [v.SGE(self.mr.addr + offset, length,
                                                    self.mr.lkey)]))

    def wait(self, n: int = 1, timeout: float = 10.0) -> list[Any]:
        return poll_wcs(self.cq, n, timeout)


def poll_wcs(cq: Any, n: int, timeout: float) -> list[Any]:
    """Up to ``n`` work completions of ``cq``, polling until ``timeout`` seconds pass."""
    out: list[Any] = []
    end = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < end:
        _k, wcs = cq.poll(n - len(out))
        out += wcs
        if not wcs:
            time.sleep(0.0005)
    return out


def expect(ch: EventChannel, kind: int, timeout: float = 10.0) -> RdmaCmEvent:
    ev = ch.get_cm_event(timeout)
    ch.ack(ev)
    assert ev.event == kind, f"expected {rc.event_str(kind)}, got {ev.text}"
    return ev


def next_non_timewait(ch: EventChannel, timeout: float = 10.0) -> RdmaCmEvent:
    while True:
        ev = ch.get_cm_event(timeout)
        if ev.event != rc.RdmaCmEventType.TIMEWAIT_EXIT:
            return ev


def child_env(state_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SOFTRDMA_STATE_DIR"] = str(state_dir)
    env["SOFTRDMA_SHARED"] = "1"
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def fake_server(ps: int, port: int, ready: threading.Event, stop: threading.Event, *,
                recv_len: int = 256) -> None:
    """A peer that listens on 127.0.0.1 ``port`` (RoCE), accepts one client (UD: SIDR_REP;
    RC: REP, with eight receives of ``recv_len`` bytes posted), then says nothing until
    ``stop``; its CM still answers (DREQ -> DREP)."""
    ch = EventChannel()
    lst = rc.CmId(ch, ps)
    lst.bind_addr(("127.0.0.1", port), device="roce")
    lst.listen(2)
    ready.set()
    eps: list[Ep] = []
    try:
        req = expect(ch, rc.RdmaCmEventType.CONNECT_REQUEST, timeout=30)
        ep = Ep(req.id, ud=ps == rc.RDMA_PS_UDP)
        eps.append(ep)
        for i in range(8):
            ep.recv(recv_len, 256 * i, i)
        req.id.accept(rc.ConnParam(qp_num=ep.qp.qp_num))
        stop.wait(60)
    finally:
        for ep in eps:
            ep.qp.close()
        lst.destroy()
        ch.close()
