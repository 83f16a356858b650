"""Connections established per second through the rdma_cm API on the loopback.

One process, one event channel per side; each connection is: resolve address and route,
create a QP on each side, connect with private data, accept, ESTABLISHED on both sides,
disconnect, DISCONNECTED on both sides, QPs and ids destroyed. Transports:

* RoCE: the IB CM + Annex A11 over a RoCE device on ``lo`` (its UDP port free-chosen,
  shared through devd like ``softrdma_lo``): both ids are in this process, so the CM
  hands its MADs back to itself, DREQ and DREP included since no data is in flight
  (``CmAgent.takes``; ``SOFTRDMA_CM_LOOPBACK=0``: each takes the devd hop);
  the QPNs come from devd in leases;
* iWARP: TCP connect + the MPA Request/Reply on the built-in ``softrdma_iw_lo``; the
  peer is on this runtime, so connect, accept and disconnect serve its socket in the
  calling thread (``TcpRuntime.call_local``) and their events are queued when the call
  returns: 0.4-1 voluntary context switches per connection instead of ~12 (two thread
  hand-offs through the progress thread per step before).

Baseline (``tcp``): the same steps on plain Python TCP sockets on the loopback in the
same process: connect, accept, 4 bytes each way (the private data), close both sides.

Run: ``python bench/cm_rate.py [-n 200] [--transport roce|iwarp|tcp ...] [--json]``;
prints connections/s, the mean time per connection and this process's CPU time per
connection (all its threads; steadier than the rate on a busy machine) for each
transport (``--json``: one object, transport -> connections/s, and ``cpu_ms``:
transport -> CPU ms per connection; ``bench/run.py`` runs it so). The state directory
is private and its devd is stopped before the directory is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from harness.rdma_cm import make_state_dir  # noqa: E402

from softrdma import enums as e  # noqa: E402
from softrdma import verbs as v  # noqa: E402
from softrdma.cm import rdma_cm as rc  # noqa: E402
from softrdma.ibcm.params import CmConfig  # noqa: E402

T = rc.RdmaCmEventType


def wait(ch: rc.EventChannel, kind: int) -> rc.RdmaCmEvent:
    while True:
        ev = ch.get_cm_event(10)
        ch.ack(ev)
        if ev.event == kind:
            return ev
        if ev.event != T.TIMEWAIT_EXIT:
            raise RuntimeError(f"expected {rc.event_str(kind)}, got {ev.text}")


def rate(transport: str, n: int) -> tuple[float, float]:
    """Connections/s and CPU seconds per connection over ``transport``."""
    chs, chc = rc.EventChannel(), rc.EventChannel()
    lst = rc.CmId(chs)
    lst.bind_addr(("127.0.0.1", 0), device=transport)
    lst.listen(64)
    assert lst.local_addr is not None
    port = lst.local_addr[1]
    ctx = None
    cqs: list[v.CQ] = []

    def qp_attr(c: v.CQ) -> v.QPInitAttr:
        return v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=c, rcq=c, cap=v.QPCap(4, 4, 1, 1))

    t0 = c0 = 0.0
    for i in range(n + 5):
        if i == 5:  # 5 warm-up connections (device open, devd start)
            t0, c0 = time.perf_counter(), time.process_time()
        cli = rc.CmId(chc)
        cli.resolve_addr(None, ("127.0.0.1", port), 2000, device=transport)
        wait(chc, T.ADDR_RESOLVED)
        cli.resolve_route()
        wait(chc, T.ROUTE_RESOLVED)
        if ctx is None:
            ctx = cli.verbs
            cqs = [v.CQ(ctx, 16), v.CQ(ctx, 16)]
            pd = v.PD(ctx)
        cli.create_qp(pd, qp_attr(cqs[0]))
        cli.connect(rc.ConnParam(private_data=b"rate"))
        req = wait(chs, T.CONNECT_REQUEST)
        req.id.create_qp(pd, qp_attr(cqs[1]))
        req.id.accept()
        wait(chc, T.ESTABLISHED)
        wait(chs, T.ESTABLISHED)
        cli.disconnect()
        wait(chc, T.DISCONNECTED)
        wait(chs, T.DISCONNECTED)
        for cid in (cli, req.id):
            cid.destroy_qp()
            cid.destroy()
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    lst.destroy()
    for ch in (chs, chc):
        ch.close()
    return n / dt, cpu / n


def tcp_rate(n: int) -> float:
    """The baseline: connect, accept, 4 bytes each way, close both sides, on plain TCP."""
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", 0))
    lst.listen(64)
    addr = lst.getsockname()
    t0 = 0.0
    try:
        for i in range(n + 5):
            if i == 5:
                t0 = time.perf_counter()
            c = socket.create_connection(addr)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s, _ = lst.accept()
            c.sendall(b"rate")
            s.recv(4)
            s.sendall(b"ok!!")
            c.recv(4)
            c.close()
            s.recv(1)  # the FIN
            s.close()
        return n / (time.perf_counter() - t0)
    finally:
        lst.close()


def stop_devd(state_dir: Path, timeout: float = 10.0) -> None:
    """End the devd that this run's RoCE device started (SIGTERM: it saves its counters
    and removes its files) and wait until it is gone, so its directory can be removed."""
    for pid_file in state_dir.glob("*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (ValueError, OSError):
            continue
        if b"devd" not in cmdline or str(state_dir).encode() not in cmdline:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            continue
        deadline = time.monotonic() + timeout
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.01)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200, help="connections per transport")
    ap.add_argument("--transport", action="append", choices=("roce", "iwarp", "tcp"),
                    help="measure this transport (repeatable; default roce and iwarp)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    if a.n < 1:
        ap.error("-n must be >= 1")
    out: dict[str, object] = {}
    cpu_ms: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="cm_rate.") as d:
        make_state_dir(Path(d))
        os.environ["SOFTRDMA_STATE_DIR"] = d
        # default CM timers; TimeWait shortened so QPNs recycle quickly in the loop
        rc.configure(cm_config=CmConfig(timewait_s=0.01))
        try:
            for transport in a.transport or ("roce", "iwarp"):
                if transport == "tcp":
                    c0 = time.process_time()
                    r = tcp_rate(a.n)
                    cpu = (time.process_time() - c0) / (a.n + 5)
                else:
                    r, cpu = rate(transport, a.n)
                out[transport] = r
                cpu_ms[transport] = cpu * 1e3
                if not a.json:
                    print(f"[cm_rate] {transport:5s}: {r:7.1f} connections/s "
                          f"(connect + accept + disconnect, {1e3 / r:.2f} ms each, "
                          f"CPU {cpu * 1e3:.2f} ms each, n={a.n})")
        finally:
            rc.release_devices()
            stop_devd(Path(d))
    if a.json:
        out["cpu_ms"] = cpu_ms
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
