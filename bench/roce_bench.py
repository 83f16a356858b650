"""RoCEv2 benchmarks on the loopback, each with its baseline measured in the same run.

1. RC RDMA WRITE throughput, 1 MiB messages, path MTU 4096, between two processes,
   vs a plain Python UDP sender/receiver pair moving the same bytes in 4096 B datagrams.
2. 64 B RC SEND ping-pong half round trip between two processes, vs a plain Python UDP
   ping-pong of 64 B datagrams.

Each side is its own process with its own in-process softrdma device (127.0.0.1 and
127.0.0.2, the same UDP port), like two hosts. Run: ``python bench/roce_bench.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from softrdma import enums as e  # noqa: E402
from softrdma import verbs as v  # noqa: E402
from softrdma.drivers.links.udp import UdpLink  # noqa: E402

ACCESS = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
MASK_INIT = int(e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
MASK_RTR = int(e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
               | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
MASK_RTS = int(e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
               | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)


RX_DEPTH = 256  # receives kept posted in the ping-pong (ibv_rc_pingpong: -r 500)
RECV = int(e.IBV_WC_RECV)


class Side:
    """One device on ``link`` (a UdpLink, or a shared device's DevdLink), with a PD, an MR
    of ``size`` bytes, a CQ and an RC QP of ``depth`` (also shared_bench's and
    profile_roce's sides). Its progress mode is ``progress``, else ``$SR_PROGRESS``, else
    ``thread``; in ``manual`` mode :meth:`poll` and :meth:`await_message` run the engine."""

    def __init__(self, link: Any, size: int, depth: int, *, name: str = "bench",
                 progress: str | None = None) -> None:
        self.link = link
        mode = progress or os.environ.get("SR_PROGRESS", "thread")
        self.ctx = v.Context(name, link=link, progress=mode)
        # manual progress: polls run the engine themselves (a CQ poll does not)
        self._progress = self.ctx.progress if mode == "manual" else None
        self.pd = v.PD(self.ctx)
        self.buf = bytearray(size)
        self.mr = v.MR(self.pd, size, ACCESS, buffer=self.buf)
        self.cq = v.CQ(self.ctx, 4 * depth)
        cap = v.QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
        self.qp = v.QP(self.pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                             cap=cap))
        self.gid = self.ctx.query_gid(1, 0)
        self._recv_wr: Any = None  # refill's receive WR, built at the first refill
        self.routs = 0  # receives posted and not yet used (the ping-pong's)
        self.ping_wr: Any = None  # the ping-pong's SEND (arm_pingpong)

    def info(self) -> dict[str, Any]:
        return {"qpn": self.qp.qp_num, "gid": self.gid.raw, "addr": int(self.mr.addr),
                "rkey": self.mr.rkey}

    def connect(self, peer: dict[str, Any], mtu: int = 5) -> None:
        qp = self.qp
        qp.modify(v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0, port_num=1,
                           qp_access_flags=ACCESS & ~int(e.IBV_ACCESS_LOCAL_WRITE)), MASK_INIT)
        ah = v.AHAttr(port_num=1, is_global=1,
                      gr=v.GlobalRoute(dgid=v.GID(peer["gid"]), sgid_index=0, hop_limit=64))
        qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=mtu, dest_qp_num=peer["qpn"],
                           rq_psn=0, max_dest_rd_atomic=1, min_rnr_timer=1, ah_attr=ah),
                  MASK_RTR)
        qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTS, timeout=14, retry_cnt=7, rnr_retry=7,
                           sq_psn=0, max_rd_atomic=1), MASK_RTS)

    def poll(self, n: int = 16) -> list[Any]:
        progress = self._progress
        while True:
            if progress is not None:
                progress()
            got, wcs = self.cq.poll(n)
            if got:
                for wc in wcs:
                    if wc.status:
                        raise RuntimeError(f"completion error {wc}")
                return list(wcs)

    def refill(self, n: int) -> int:
        """Post ``n`` 64-byte receives in one call; returns ``n``. One receive WR is built
        once and posted ``n`` times, as ibv_rc_pingpong's ``pp_post_recv`` posts its one
        ``struct ibv_recv_wr`` (the post copies it into a WQE)."""
        wr = self._recv_wr
        if wr is None:
            wr = self._recv_wr = v.RecvWR(wr_id=1, num_sge=1,
                                          sg=[v.SGE(self.mr.addr, 64, self.mr.lkey)])
        self.qp.post_recv([wr] * n)
        return n

    def arm_pingpong(self) -> None:
        """Post :data:`RX_DEPTH` 64-byte receives and build the ping-pong's 64 B SEND (from
        offset 64 of the MR), before the ping-pong starts."""
        self.routs = self.refill(RX_DEPTH)
        self.ping_wr = v.SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1,
                                sg=[v.SGE(self.mr.addr + 64, 64, self.mr.lkey)],
                                send_flags=e.IBV_SEND_SIGNALED)

    def _used_recv(self) -> None:
        self.routs -= 1
        if self.routs < 16:  # refill in batches, as ibv_rc_pingpong does
            self.routs += self.refill(RX_DEPTH - self.routs)

    def ping(self, iters: int, samples: list[float] | None = None,
             wait_send: bool = False) -> None:
        """``iters`` SENDs, each posted once the peer's answer to the one before arrived
        (the timed side of the ping-pong; :meth:`arm_pingpong` first). ``samples``, if
        given, gets each round trip's start time (``time.perf_counter``) and then the end.
        ``wait_send``: each SEND's own completion (the peer's ACK) is awaited too, as
        ``ibv_rc_pingpong`` and perftest's latency tests await it."""
        wr = self.ping_wr
        clock = time.perf_counter
        for _ in range(iters):
            if samples is not None:
                samples.append(clock())
            self.qp.post_send(wr)
            got_recv = False
            got_send = not wait_send
            while not (got_recv and got_send):
                for wc in self.poll():
                    if wc.opcode == RECV:
                        self._used_recv()
                        got_recv = True
                    else:
                        got_send = True
        if samples is not None:
            samples.append(clock())

    def pong(self, iters: int, wait_send: bool = False) -> None:
        """Answer ``iters`` SENDs with one each (the other side of :meth:`ping`); with
        ``wait_send`` an answer waits for the previous answer's completion (its ACK)."""
        wr = self.ping_wr
        done = 0
        if not wait_send:
            while done < iters:
                for wc in self.poll():
                    if wc.opcode == RECV:
                        self._used_recv()
                        self.qp.post_send(wr)
                        done += 1
            return
        asked = 0  # SENDs received and not answered yet
        sent = True  # the previous answer completed
        while done < iters:
            for wc in self.poll():
                if wc.opcode == RECV:
                    self._used_recv()
                    asked += 1
                else:
                    sent = True
            while asked and sent:
                asked -= 1
                sent = False
                self.qp.post_send(wr)
                done += 1

    def report(self, cpu: float, wakeups: int = 0) -> dict[str, float]:
        """The link's batching counters, CPU seconds (every thread) per packet and the
        process's ``wakeups`` (voluntary context switches) during the transfer."""
        st = self.link.stats.as_dict()
        keys = ("sent", "received", "gso_sends", "gso_segments", "gso_refused",
                "gro_receives", "gro_segments", "gro_id_hint_misses", "gro_id_failures")
        out: dict[str, float] = {k: st[k] for k in keys}
        out["wakeups"] = wakeups
        out["cpu_s"] = cpu
        out["cpu_us_per_pkt"] = cpu / max(st["sent"] + st["received"], 1) * 1e6
        return out

    def calm_episodes(self) -> int:
        """How often this process's busy poll found the machine contended (a spin lost
        the CPU: its empty polls then sleep at once for 0.5 s and its coalesced ACKs may be
        held back; ``drivers.runtime.pacer.PollPacer``): a diagnostic of slow runs."""
        pacer = getattr(self.ctx.runtime, "_pacer", None)
        return int(getattr(pacer, "contended", 0))

    def await_message(self, conn: Connection, at_least: float = 0.0) -> Any:
        """The next message on ``conn``, after at least ``at_least`` s; in manual progress
        the engine runs meanwhile (the peer's packets are answered only so)."""
        deadline = time.monotonic() + at_least
        progress = self._progress
        while progress is not None and (time.monotonic() < deadline or not conn.poll(0)):
            progress(0.001)
        left = deadline - time.monotonic()
        if left > 0:
            time.sleep(left)
        return conn.recv()

    def close(self) -> None:
        self.ctx.close()


# Batching counters and CPU time of each side of the last rdma_write_bw (main prints them).
LAST_WRITE_STATS: dict[str, dict[str, float]] = {}


def _peer(conn: Connection, ip: str, port: int, size: int, mode: str, iters: int) -> None:
    side = Side(UdpLink(ip, port), size, RX_DEPTH)
    conn.send(side.info())
    side.connect(conn.recv())
    if mode in ("lat", "lat_ack"):
        side.arm_pingpong()
        conn.send("ready")
        side.pong(iters, wait_send=mode == "lat_ack")
        side.await_message(conn, 0.05)  # "bye", after the last send completions drained
    else:
        cpu0, wake0 = time.process_time(), _wakeups()
        conn.send("ready")
        side.await_message(conn)  # "bye"
    if mode not in ("lat", "lat_ack"):
        conn.send(side.report(time.process_time() - cpu0, _wakeups() - wake0))
    side.close()


def rdma_write_bw(total: int, msg: int, port: int) -> float:
    a_conn, b_conn = mp.Pipe()
    p = mp.Process(target=_peer, args=(b_conn, "127.0.0.2", port, msg, "bw", 0))
    p.start()
    side = Side(UdpLink("127.0.0.1", port), msg, 64)
    try:
        peer = a_conn.recv()
        a_conn.send(side.info())
        side.connect(peer)
        a_conn.recv()
        n = total // msg
        depth = 4
        wr = v.SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                      sg=[v.SGE(side.mr.addr, msg, side.mr.lkey)],
                      send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(peer["rkey"], peer["addr"])
        t0 = time.perf_counter()
        cpu0, wake0 = time.process_time(), _wakeups()
        posted = done = 0
        while done < n:
            while posted < n and posted - done < depth:
                side.qp.post_send(wr)
                posted += 1
            done += len(side.poll())
        dt = time.perf_counter() - t0
        LAST_WRITE_STATS["sender"] = side.report(time.process_time() - cpu0,
                                                 _wakeups() - wake0)
        a_conn.send("bye")
        if a_conn.poll(10):
            LAST_WRITE_STATS["receiver"] = a_conn.recv()
        p.join(10)
        return n * msg / dt
    finally:
        side.close()
        if p.is_alive():
            p.kill()


def _wakeups() -> int:
    """Voluntary context switches of this process so far (each a sleep and a wake-up)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


def _udp_sink(conn: Connection, port: int, total: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(("127.0.0.2", port))
    s.settimeout(0.5)
    buf = bytearray(65536)
    conn.send("ready")
    got = 0
    t0 = None
    t1 = time.perf_counter()
    cpu0, wake0 = time.process_time(), _wakeups()
    try:
        while got < total:
            n = s.recv_into(buf)
            if t0 is None:
                t0 = time.perf_counter()
            got += n
            t1 = time.perf_counter()
    except TimeoutError:
        pass
    conn.send((got, (t1 - (t0 or t1)), time.process_time() - cpu0, _wakeups() - wake0))


# CPU seconds and wake-ups of each side of the last udp_bw (main prints them): the floor
# is a CPU-per-datagram figure on a busy host, where its receiver seldom sleeps.
LAST_UDP_STATS: dict[str, dict[str, float]] = {}


def udp_bw(total: int, dgram: int, port: int) -> tuple[float, float]:
    a_conn, b_conn = mp.Pipe()
    p = mp.Process(target=_udp_sink, args=(b_conn, port, total))
    p.start()
    a_conn.recv()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    s.bind(("127.0.0.1", 0))
    data = memoryview(bytearray(dgram))
    dst = ("127.0.0.2", port)
    cpu0, wake0 = time.process_time(), _wakeups()
    count = total // dgram
    for _ in range(count):
        s.sendto(data, dst)
    cpu, wake = time.process_time() - cpu0, _wakeups() - wake0
    got, dt, rcpu, rwake = a_conn.recv()
    p.join(5)
    s.close()
    LAST_UDP_STATS["sender"] = {"sent": count, "cpu_s": cpu, "wakeups": wake}
    LAST_UDP_STATS["receiver"] = {"received": got // dgram, "cpu_s": rcpu, "wakeups": rwake}
    return got / dt if dt > 0 else 0.0, got / total


def rc_send_lat(iters: int, port: int, samples: list[float] | None = None,
                wait_send: bool = False) -> float:
    """The mean half round trip (s) of ``iters`` 64 B SEND ping-pongs between two
    processes; ``samples``, if given, gets each one's half round trip (s). ``wait_send``:
    both sides await each SEND's completion (the peer's ACK) before the next, as
    ``ibv_rc_pingpong`` and perftest do (the tools' figures, issue 26)."""
    a_conn, b_conn = mp.Pipe()
    p = mp.Process(target=_peer, args=(b_conn, "127.0.0.2", port, 4096,
                                        "lat_ack" if wait_send else "lat", iters))
    p.start()
    side = Side(UdpLink("127.0.0.1", port), 4096, RX_DEPTH)
    try:
        peer = a_conn.recv()
        a_conn.send(side.info())
        side.connect(peer)
        side.arm_pingpong()
        a_conn.recv()
        marks: list[float] | None = [] if samples is not None else None
        t0 = time.perf_counter()
        side.ping(iters, marks, wait_send)
        dt = time.perf_counter() - t0
        if samples is not None and marks:
            samples.extend((b - a) / 2 for a, b in zip(marks, marks[1:], strict=False))
        a_conn.send("bye")
        p.join(10)
        return dt / iters / 2
    finally:
        side.close()
        if p.is_alive():
            p.kill()


def _busy_loop() -> None:
    """A CPU-bound process (the competitor of ``rc_send_lat_contended``)."""
    while True:
        pass


def rc_send_lat_contended(iters: int, port_idle: int, port_busy: int) -> tuple[float, float]:
    """(contended, idle): the median half round trip (s) of the 64 B SEND ping-pong with
    one busy-loop process running beside it, and alone, measured one after the other."""
    alone: list[float] = []
    rc_send_lat(iters, port_idle, alone)
    busy = mp.Process(target=_busy_loop, daemon=True)
    busy.start()
    try:
        beside: list[float] = []
        rc_send_lat(iters, port_busy, beside)
    finally:
        busy.kill()
        busy.join(5)
    return statistics.median(beside), statistics.median(alone)


def _udp_echo(conn: Connection, port: int, iters: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.2", port))
    conn.send("ready")
    buf = bytearray(2048)
    for _ in range(iters):
        n, addr = s.recvfrom_into(buf)
        s.sendto(memoryview(buf)[:n], addr)
    s.close()


def udp_lat(iters: int, port: int) -> float:
    a_conn, b_conn = mp.Pipe()
    p = mp.Process(target=_udp_echo, args=(b_conn, port, iters))
    p.start()
    a_conn.recv()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    data = bytes(64)
    buf = bytearray(2048)
    dst = ("127.0.0.2", port)
    t0 = time.perf_counter()
    for _ in range(iters):
        s.sendto(data, dst)
        s.recv_into(buf)
    dt = time.perf_counter() - t0
    p.join(5)
    s.close()
    return dt / iters / 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total", type=int, default=256 << 20, help="bytes to move (default 256 MiB)")
    ap.add_argument("--iters", type=int, default=5000, help="ping-pong iterations")
    ap.add_argument("--port", type=int, default=47911, help="UDP port for both devices")
    ap.add_argument("--only", choices=("bw", "lat"))
    args = ap.parse_args(argv)
    mp.set_start_method("fork")
    if args.only in (None, "bw"):
        base, frac = udp_bw(args.total, 4096, args.port + 1)
        ours = rdma_write_bw(args.total, 1 << 20, args.port)
        print(f"RC RDMA WRITE 1 MiB x {args.total >> 20}: {ours * 8 / 1e9:.3f} Gb/s "
              f"({ours / 2**20:.1f} MiB/s)")
        print(f"plain UDP 4096 B datagrams:      {base * 8 / 1e9:.3f} Gb/s "
              f"({base / 2**20:.1f} MiB/s, {frac * 100:.1f}% of bytes arrived)")
        print(f"ratio RDMA WRITE / UDP: {ours / base:.2f}  (goal >= 1.0)")
        gb = args.total / 1e9
        for kind, stats in (("RDMA WRITE", LAST_WRITE_STATS), ("plain UDP", LAST_UDP_STATS)):
            for who, st in stats.items():
                print(f"  {kind} {who}: cpu_s_per_GB={st['cpu_s'] / gb:.2f} " + " ".join(
                    f"{k}={st[k]:.1f}" if k.startswith("cpu_us") else
                    f"{k}={st[k]:.3f}" if k == "cpu_s" else f"{k}={int(st[k])}" for k in st))
    if args.only in (None, "lat"):
        base_l = udp_lat(args.iters, args.port + 2)
        ours_l = rc_send_lat(args.iters, args.port + 3)
        print(f"RC SEND 64 B ping-pong half round trip: {ours_l * 1e6:.1f} us")
        print(f"plain UDP 64 B ping-pong half round trip: {base_l * 1e6:.1f} us")
        print(f"ratio RC SEND / UDP: {ours_l / base_l:.2f}  (goal <= 1.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
