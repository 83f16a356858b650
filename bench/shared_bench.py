"""Shared-device benchmarks on the loopback, each beside its baseline measured in the same run.

1. 64 B RC SEND ping-pong (half round trip) between two processes on ONE shared device
   (both open it through devd; ``SOFTRDMA_DEVD_DIRECT`` picks the direct reuseport path,
   the default, or the forwarded one) vs the same two processes each on its own
   in-process device (127.0.0.1 and 127.0.0.2), as ``bench/roce_bench.py`` runs them.
2. RC RDMA WRITE throughput, 1 MiB messages, path MTU 4096, the same two set-ups.
3. Aggregate RC WRITE throughput of 1, 2 and 4 writer/target process pairs on one shared
   device, with each process's CPU time (and devd's) over the run.

Functions for ``bench/run.py``: :func:`shared_pingpong_lat`, :func:`shared_write_bw`,
:func:`scaling`. Run: ``python bench/shared_bench.py [--iters N] [--total MiB] [--reps R]``
(``SOFTRDMA_DEVD_DIRECT=0`` for the forwarded path).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import roce_bench  # noqa: E402
from roce_bench import RX_DEPTH  # noqa: E402

from softrdma import enums as e  # noqa: E402
from softrdma import verbs as v  # noqa: E402
from softrdma.drivers.devd.client import DevdLink  # noqa: E402
from softrdma.drivers.host.registry import DeviceRecord  # noqa: E402
from softrdma.drivers.links.udp import UdpLink  # noqa: E402

MSG = 1 << 20  # RDMA WRITE message size
WRITE_DEPTH = 4  # WRITEs outstanding per writer
SHARED_IP = "127.0.0.1"
INPROC_IPS = ("127.0.0.1", "127.0.0.2")

# (kind, where): kind "shared" -> (state_dir, device name, UDP port); "inproc" -> (ip, port)
Where = tuple[str, str, int]


def free_udp_port() -> int:
    """A UDP port free on both loopback addresses the in-process baseline binds."""
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((SHARED_IP, 0))
        port = int(s.getsockname()[1])
        s.close()
        try:
            t = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            t.bind((INPROC_IPS[1], port))
            t.close()
            return port
        except OSError:
            continue


class Side(roce_bench.Side):
    """roce_bench's side on a shared device (``kind`` "shared") or an in-process one."""

    def __init__(self, kind: str, where: Where, size: int, depth: int) -> None:
        if kind == "shared":
            state, name, port = where
            link: Any = DevdLink(DeviceRecord(name, "lo", "roce", port), state_dir=state)
        else:
            ip, _, port = where
            link = UdpLink(ip, port)
        super().__init__(link, size, depth)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "pid": os.getpid(),
                "devd": getattr(self.link, "daemon_pid", 0)}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of another process, from /proc (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wakeups(pid: int) -> int:
    """Context switches of another process so far (how often it was woken), from /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return sum(int(line.split()[1]) for line in f
                       if line.startswith(("voluntary_ctxt_switches",
                                           "nonvoluntary_ctxt_switches")))
    except OSError:
        return 0


def _pingpong_peer(conn: Connection, kind: str, where: Where, iters: int) -> None:
    side = Side(kind, where, 4096, RX_DEPTH)
    conn.send(side.info())
    side.connect(conn.recv())
    side.arm_pingpong()
    conn.send("ready")
    cpu0 = _cpu()
    calm0 = side.calm_episodes()
    side.pong(iters)
    conn.send((_cpu() - cpu0, side.calm_episodes() - calm0))
    conn.recv()  # "bye"
    side.close()


def _wheres(kind: str, state: str, name: str, port: int) -> tuple[Where, Where]:
    if kind == "shared":
        return (state, name, port), (state, name, port)
    return (INPROC_IPS[0], "", port), (INPROC_IPS[1], "", port)


def pingpong(kind: str, iters: int, state: str, name: str, port: int) -> dict[str, float]:
    """A 64 B RC SEND ping-pong between two processes: ``lat``, seconds per half round
    trip; ``cpu``, CPU seconds per round trip of both processes and devd together."""
    mine, theirs = _wheres(kind, state, name, port)
    a_conn, b_conn = mp.Pipe()
    p = mp.Process(target=_pingpong_peer, args=(b_conn, kind, theirs, iters))
    p.start()
    side = Side(kind, mine, 4096, RX_DEPTH)
    try:
        peer = a_conn.recv()
        a_conn.send(side.info())
        side.connect(peer)
        side.arm_pingpong()
        a_conn.recv()
        devd = int(peer["devd"])
        devd0 = _proc_cpu(devd) if devd else 0.0
        wake0 = _wakeups(devd) if devd else 0
        cpu0 = _cpu()
        calm0 = side.calm_episodes()
        t0 = time.perf_counter()
        side.ping(iters)
        dt = time.perf_counter() - t0
        calm = side.calm_episodes() - calm0
        devd_cpu = _proc_cpu(devd) - devd0 if devd else 0.0
        wakes = _wakeups(devd) - wake0 if devd else 0
        peer_cpu, peer_calm = a_conn.recv()
        cpu = _cpu() - cpu0 + devd_cpu + float(peer_cpu)
        a_conn.send("bye")
        p.join(10)
        return {"lat": dt / iters / 2, "cpu": cpu / iters, "devd_cpu": devd_cpu / iters,
                "devd_wakeups": wakes / iters, "calm": calm + int(peer_calm)}
    finally:
        side.close()
        if p.is_alive():
            p.kill()


def _target(conn: Connection, kind: str, where: Where) -> None:
    """A WRITE target: registers its buffer, then waits; reports its CPU seconds."""
    side = Side(kind, where, MSG, 64)
    conn.send(side.info())
    side.connect(conn.recv())
    cpu0 = _cpu()
    conn.send("ready")
    conn.recv()  # "bye"
    conn.send(_cpu() - cpu0)
    side.close()


def _writer(conn: Connection, kind: str, where: Where, total: int, start: Any) -> None:
    """A WRITE initiator: connects to its target (through ``conn``), waits for ``start``,
    writes ``total`` bytes; reports (t0, t1, CPU seconds)."""
    side = Side(kind, where, MSG, 64)
    peer = conn.recv()
    conn.send(side.info())
    side.connect(peer)
    conn.send("connected")
    start.wait()
    t0, cpu0 = time.perf_counter(), _cpu()
    _write(side, peer, total)
    conn.send((t0, time.perf_counter(), _cpu() - cpu0))
    conn.recv()
    side.close()


def _write(side: Side, peer: dict[str, Any], total: int) -> None:
    n = max(total // MSG, 1)
    wr = v.SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                  sg=[v.SGE(side.mr.addr, MSG, side.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(peer["rkey"], peer["addr"])
    posted = done = 0
    while done < n:
        while posted < n and posted - done < WRITE_DEPTH:
            side.qp.post_send(wr)
            posted += 1
        done += len(side.poll())


def write_pairs(kind: str, pairs: int, total: int, state: str, name: str,
                port: int) -> dict[str, Any]:
    """``pairs`` writer/target process pairs, each writing ``total`` bytes at once:
    aggregate bytes/s over the span from the first start to the last finish, and CPU
    seconds per process role (and devd's, on a shared device)."""
    ctx = mp.get_context("fork")
    start = ctx.Event()
    procs: list[Any] = []
    wconns: list[Connection] = []
    tconns: list[Connection] = []
    try:
        for _ in range(pairs):
            w_mine, w_theirs = ctx.Pipe()
            t_mine, t_theirs = ctx.Pipe()
            w_where, t_where = _wheres(kind, state, name, port)
            tp = ctx.Process(target=_target, args=(t_theirs, kind, t_where))
            wp = ctx.Process(target=_writer, args=(w_theirs, kind, w_where, total, start))
            tp.start()
            wp.start()
            procs += [tp, wp]
            t_info = t_mine.recv()
            w_mine.send(t_info)
            t_mine.send(w_mine.recv())
            w_mine.recv()  # connected
            t_mine.recv()  # ready
            wconns.append(w_mine)
            tconns.append(t_mine)
            devd = int(t_info["devd"])
        devd_cpu0 = _proc_cpu(devd) if kind == "shared" else 0.0
        start.set()
        spans = [c.recv() for c in wconns]
        devd_cpu = _proc_cpu(devd) - devd_cpu0 if kind == "shared" else 0.0
        for c in wconns + tconns:
            c.send("bye")
        tcpu = [float(c.recv()) for c in tconns]
        t0 = min(s[0] for s in spans)
        t1 = max(s[1] for s in spans)
        for p in procs:
            p.join(10)
        return {"Bps": pairs * max(total // MSG, 1) * MSG / (t1 - t0), "wall": t1 - t0,
                "writer_cpu": [s[2] for s in spans], "target_cpu": tcpu, "devd_cpu": devd_cpu}
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def _device(fn: Any, tries: int = 3) -> Any:
    """Run ``fn(state, name, port)`` with a private state dir and a free UDP port; a run
    whose QP failed (retry count exceeded under a heavily loaded host) is run again."""
    for attempt in range(tries):
        # devd may still write its last files (port totals) into the state dir while it
        # exits after its last client: a cleanup that raced it must not fail the figure
        with tempfile.TemporaryDirectory(prefix="srbench-", ignore_cleanup_errors=True) as state:
            try:
                return fn(state, "sbench", free_udp_port())
            except (RuntimeError, EOFError) as exc:
                if attempt == tries - 1:
                    raise
                print(f"  (run failed: {exc}; again)", file=sys.stderr)
    raise AssertionError("unreachable")


def shared_pingpong_lat(iters: int = 2000,
                        cpu: list[float] | None = None) -> tuple[float, float]:
    """(shared device, two in-process devices): seconds per half round trip, 64 B SEND;
    ``cpu`` gets the two CPU seconds per round trip (both processes, and devd), then devd's
    own CPU seconds and wake-ups per round trip, then the calm episodes of the shared and
    the in-process run (``roce_bench.Side.calm_episodes``, both processes: a run slowed by
    a spin that lost the CPU once has one or more)."""
    shared = _device(lambda s, n, p: pingpong("shared", iters, s, n, p))
    inproc = _device(lambda s, n, p: pingpong("inproc", iters, s, n, p))
    if cpu is not None:
        cpu += [shared["cpu"], inproc["cpu"], shared["devd_cpu"], shared["devd_wakeups"],
                shared["calm"], inproc["calm"]]
    return float(shared["lat"]), float(inproc["lat"])


def _cpu_per_mib(got: dict[str, Any], total: int) -> float:
    cpu = sum(got["writer_cpu"]) + sum(got["target_cpu"]) + got["devd_cpu"]
    return float(cpu) / (len(got["writer_cpu"]) * total / 2**20)


def shared_write_bw(total: int = 64 << 20,
                    cpu: list[float] | None = None) -> tuple[float, float]:
    """(shared device, two in-process devices): RC WRITE bytes/s, one writer/target pair;
    ``cpu`` gets the two CPU seconds per MiB (writer, target, and devd)."""
    shared = _device(lambda s, n, p: write_pairs("shared", 1, total, s, n, p))
    inproc = _device(lambda s, n, p: write_pairs("inproc", 1, total, s, n, p))
    if cpu is not None:
        cpu += [_cpu_per_mib(shared, total), _cpu_per_mib(inproc, total)]
    return float(shared["Bps"]), float(inproc["Bps"])


def scaling(pairs_list: Sequence[int] = (1, 2, 4), total: int = 64 << 20,
            detail: dict[int, dict[str, Any]] | None = None) -> dict[int, float]:
    """Aggregate RC WRITE bytes/s of N writer/target pairs on one shared device, per N
    (each pair writes ``total`` bytes); ``detail`` gets the CPU use per N."""
    out: dict[int, float] = {}
    for n in pairs_list:
        got = _device(lambda s, name, p, n=n: write_pairs("shared", n, total, s, name, p))
        out[n] = float(got["Bps"])
        if detail is not None:
            detail[n] = got
    return out


def _best_median(xs: list[float], low: bool) -> str:
    best = min(xs) if low else max(xs)
    return f"best {best:.3f} median {statistics.median(xs):.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--iters", type=int, default=2000, help="ping-pong iterations")
    p.add_argument("--total", type=int, default=64, help="MiB written per writer")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pairs", default="1,2,4")
    p.add_argument("--skip", default="", help="comma list of lat,bw,scale to skip")
    a = p.parse_args(argv)
    skip = set(a.skip.split(","))
    total = a.total << 20
    path = "direct" if os.environ.get("SOFTRDMA_DEVD_DIRECT", "1") != "0" else "forwarded"
    print(f"shared device path: {path}; cores: {os.cpu_count()}; load: {os.getloadavg()}")
    if "lat" not in skip:
        ratios, sh, ip, cr = [], [], [], []
        for _ in range(a.reps):
            cpu: list[float] = []
            s, i = shared_pingpong_lat(a.iters, cpu)
            sh.append(s * 1e6)
            ip.append(i * 1e6)
            ratios.append(s / i)
            cr.append(cpu[0] / cpu[1])
            print(f"  half RTT shared {s * 1e6:.1f} us in-process {i * 1e6:.1f} us; "
                  f"cpu us per round trip: shared {cpu[0] * 1e6:.1f} in-process "
                  f"{cpu[1] * 1e6:.1f}; devd: {cpu[2] * 1e6:.1f} us and {cpu[3]:.2f} wake-ups "
                  f"per round trip; calm episodes shared {cpu[4]:.0f} in-process {cpu[5]:.0f}")
        print(f"ping-pong 64 B half RTT  shared {_best_median(sh, True)} us  in-process "
              f"{_best_median(ip, True)} us  ratio {_best_median(ratios, True)} (goal <= 1.2)"
              f"; CPU ratio {_best_median(cr, True)}")
    if "bw" not in skip:
        ratios, sh, ip, cr = [], [], [], []
        for _ in range(a.reps):
            cpu = []
            s, i = shared_write_bw(total, cpu)
            sh.append(s / 2**20)
            ip.append(i / 2**20)
            ratios.append(s / i)
            cr.append(cpu[1] / cpu[0])  # in-process CPU / shared CPU: >= 0.8 is the goal
            print(f"  cpu ms per MiB: shared {cpu[0] * 1e3:.2f} in-process {cpu[1] * 1e3:.2f}")
        print(f"RC WRITE 1 MiB           shared {_best_median(sh, False)} MiB/s  in-process "
              f"{_best_median(ip, False)} MiB/s  ratio {_best_median(ratios, False)} "
              f"(goal >= 0.8); per-CPU ratio {_best_median(cr, False)}")
    if "scale" not in skip:
        pairs = [int(x) for x in a.pairs.split(",")]
        runs: list[dict[int, float]] = []
        details: list[dict[int, dict[str, Any]]] = []
        for _ in range(a.reps):
            d: dict[int, dict[str, Any]] = {}
            runs.append(scaling(pairs, total, d))
            details.append(d)
        for n in pairs:
            agg = [r[n] / 2**20 for r in runs]
            rel = [r[n] / r[pairs[0]] for r in runs]
            last = details[-1][n]
            use = (f"cpu/s: writers {sum(last['writer_cpu']) / last['wall']:.2f} targets "
                   f"{sum(last['target_cpu']) / last['wall']:.2f} devd "
                   f"{last['devd_cpu'] / last['wall']:.2f}")
            print(f"{n} pair(s) aggregate WRITE {_best_median(agg, False)} MiB/s  x{pairs[0]} "
                  f"{_best_median(rel, False)}  ({use})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
