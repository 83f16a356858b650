"""RDMA WRITE throughput over iWARP (TCP loopback), as a ratio to plain Python TCP.

Two processes each way, same machine, same run:

* iWARP: a receiver process opens ``Context(transport="iwarp")``, registers a 1 MiB MR
  with REMOTE_WRITE, listens and accepts (MPA v2, CRC32c on), passing the MR's STag and
  address in the MPA private data; the sender process connects and posts
  ``--count`` RDMA WRITEs of ``--size`` bytes (a window of ``--window`` outstanding),
  then a Send; the receiver answers that Send with a Send, and the sender's clock stops
  when the answer arrives (so every byte has been placed at the receiver, RFC 5040 §5.5
  rule 10).
* Baseline: the same shape with plain Python sockets: the receiver ``recv_into``-s a
  preallocated 1 MiB buffer until it has ``count * size`` bytes and answers one byte;
  the sender ``sendall``-s its 1 MiB buffer ``count`` times and waits for the byte.

Runs alternate (TCP, iWARP, TCP, iWARP ...) and each figure is reported best and median
of ``--runs``, with the ratio (goal, issue 26: >= 0.75 with MPA CRC32c on, >= 0.85 with
``--crc off``), and the CPU seconds per GB of each side (median of the runs: steadier than
the throughput on a busy machine). ``--profile`` profiles the iWARP sender and receiver,
progress threads included (cProfile, the top ``IWPERF_TOP`` functions printed, 18 by default).
``--engine`` measures the engines alone instead (:func:`engine_cpu`: framing, CRC and
placement without sockets or threads, CPU s/GB per side; steady on a busy machine).

:func:`iwarp_write_bw` and :func:`tcp_bw` are what ``bench/run.py`` imports (one run each,
bytes per second).

Usage: ``PYTHONPATH=src python3 bench/iwarp_write_bw.py [--size N] [--count N] [--runs N]
[--crc on|off]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import struct
import sys
import time
from typing import Any

MB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- plain TCP ---------------------------------------------------------------------------


def _cpu() -> float:
    """CPU seconds of this process, every thread, user and system (``os.times`` counts
    in 10 ms ticks: 0.02 s/GB steps over a 512 MiB run)."""
    return time.process_time()


def tcp_receiver(port: int, total: int, ready: Any, cpu_q: Any) -> None:
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", port))
    lst.listen(1)
    ready.set()
    conn, _ = lst.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c0 = _cpu()
    buf = bytearray(MB)
    mv = memoryview(buf)
    got = 0
    while got < total:
        n = conn.recv_into(mv, min(MB, total - got))
        if not n:
            break
        got += n
    cpu_q.put(_cpu() - c0)
    conn.sendall(b"k")
    conn.close()
    lst.close()


def tcp_sender(port: int, size: int, count: int) -> tuple[float, float]:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytes(size)
    c0 = _cpu()
    t0 = time.perf_counter()
    for _ in range(count):
        s.sendall(buf)
    assert s.recv(1) == b"k"
    dt = time.perf_counter() - t0
    cpu = _cpu() - c0
    s.close()
    return dt, cpu


# --- iWARP ------------------------------------------------------------------------------


class _Prof:
    """cProfile of every thread of this process that runs Python code here: the caller's
    thread and the device's progress thread (``threading.setprofile`` starts one profiler
    per thread; their statistics are merged at the end). Times are CPU times of the
    thread (``time.thread_time``), not wall: waits do not count."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.profs: list[Any] = []

    def start(self) -> None:
        if not self.on:
            return
        import cProfile
        import threading

        def hook(*_a: Any) -> None:  # first Python call in a new thread: profile it
            threading.setprofile(None)
            sys.setprofile(None)
            p = cProfile.Profile(time.thread_time)
            self.profs.append(p)
            p.enable()

        threading.setprofile(hook)
        p = cProfile.Profile(time.thread_time)
        self.profs.append(p)
        p.enable()

    def stop(self, title: str, nbytes: int) -> None:
        if not self.on:
            return
        import io
        import pstats
        import threading

        threading.setprofile(None)
        for p in self.profs:
            p.disable()
        out = io.StringIO()
        st = pstats.Stats(self.profs[0], stream=out)
        for p in self.profs[1:]:
            st.add(p)
        st.sort_stats("tottime").print_stats(int(os.environ.get("IWPERF_TOP", "18")))
        if os.environ.get("IWPERF_CALLERS"):
            st.print_callers(os.environ["IWPERF_CALLERS"])
        print(f"--- profile: {title} ({len(self.profs)} threads, {nbytes / MB:.0f} MiB)\n"
              + out.getvalue(), file=sys.stderr)


def iwarp_receiver(port: int, size: int, crc: bool, profile: bool, ready: Any,
                   cpu_q: Any) -> None:
    from softrdma import enums as e
    from softrdma import verbs as v
    from softrdma.drivers.cm import iwconnect

    prof = _Prof(profile)
    prof.start()
    ctx = v.Context(transport="iwarp")
    pd = v.PD(ctx)
    ch = v.CompChannel(ctx)
    cq = v.CQ(ctx, 16, None, ch)
    qp = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4, 1, 1)))
    mr = v.MR(pd, max(size, MB), e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    ctl = v.MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    qp.to_init(v.QPAttr())
    qp.post_recv(v.RecvWR(1, 1, [v.SGE(ctl.addr, 64, ctl.lkey)]))
    lst = iwconnect.listen(ctx, port, cfg=iwconnect.MpaConfig(crc=crc))
    ready.set()
    conn = lst.accept(qp, struct.pack("!IQ", mr.rkey, mr.addr), timeout=30)
    assert conn.negotiated.crc == crc
    c0 = _cpu()
    cq.req_notify()  # the progress thread places the data; the application sleeps
    while True:
        n, wcs = cq.poll(1)
        if n:
            assert wcs[0].status == 0, wcs[0]
            break
        ch.get_cq_event(30)
        cq.ack_events(1)
        cq.req_notify()
    cpu_q.put(_cpu() - c0)
    qp.post_send(v.SendWR(2, None, 1, [v.SGE(ctl.addr, 1, ctl.lkey)], e.IBV_WR_SEND))
    while cq.poll(1)[0] == 0:
        pass
    time.sleep(0.05)
    prof.stop("iWARP receiver (connection setup included)", 0)
    ctx.close()


def iwarp_sender(port: int, size: int, count: int, window: int, crc: bool,
                 profile: bool) -> tuple[float, float]:
    from softrdma import enums as e
    from softrdma import verbs as v
    from softrdma.drivers.cm import iwconnect

    prof = _Prof(profile)
    prof.start()
    ctx = v.Context(transport="iwarp")
    pd = v.PD(ctx)
    ch = v.CompChannel(ctx)
    cq = v.CQ(ctx, 4 * window, None, ch)
    qp = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                               cap=v.QPCap(window + 2, 4, 1, 1)))
    src = v.MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE)
    ctl = v.MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    qp.to_init(v.QPAttr())
    qp.post_recv(v.RecvWR(9, 1, [v.SGE(ctl.addr, 64, ctl.lkey)]))
    cfg = iwconnect.MpaConfig(crc=crc)
    conn = iwconnect.connect(qp, "127.0.0.1", port, cfg=cfg, timeout=30)
    rkey, raddr = struct.unpack("!IQ", conn.private_data)
    # connection setup is not timed (nor is TCP's): that includes the initiator's hold of
    # its first FPDU after the MPA Reply (MpaConfig.first_fpdu_hold, for Linux siw), which
    # the progress thread's housekeeping (every 50 ms at most) releases
    time.sleep(cfg.first_fpdu_hold + 0.06)
    wr = v.SendWR(1, None, 1, [v.SGE(src.addr, size, src.lkey)], e.IBV_WR_RDMA_WRITE)
    wr.set_wr_rdma(rkey, raddr)
    c0 = _cpu()
    t0 = time.perf_counter()
    posted = done = 0
    while done < count:
        while posted < count and posted - done < window:
            qp.post_send(wr)
            posted += 1
        n, wcs = cq.poll(window)
        if not n:  # block (like the TCP sender in sendall) instead of spinning
            cq.req_notify()
            n, wcs = cq.poll(window)
            if not n:
                ch.get_cq_event(10)
                cq.ack_events(1)
                continue
        for w in wcs:
            assert w.status == 0, w
        done += n
    qp.post_send(v.SendWR(2, None, 1, [v.SGE(ctl.addr, 1, ctl.lkey)], e.IBV_WR_SEND))
    got = 0
    while got < 2:
        n, wcs = cq.poll(2)
        for w in wcs:
            assert w.status == 0, w
        got += n
    dt = time.perf_counter() - t0
    cpu = _cpu() - c0
    prof.stop("iWARP sender (connection setup included)", size * count)
    conn.disconnect()
    ctx.close()
    return dt, cpu


# --- the engines alone --------------------------------------------------------------------


def engine_cpu(crc: bool, mib: int = 64, chunk: int = 512 * 1024, reps: int = 5,
               mss: int = 65483) -> tuple[float, float]:
    """The CPU seconds per GB of the iWARP engines alone, in this process (no sockets, no
    threads, no verbs layer): the sender's side is ``take_output`` + ``tx_sent`` of
    ``mib`` 1 MiB RDMA WRITEs (FPDU framing, the CRC), the receiver's ``receive`` of that
    stream in ``chunk``-octet reads (the fast path, the CRC, placement). Medians of
    ``reps``; the copy standing in for the kernel's into the receive buffer is not
    counted. Steadier than the socket runs on a busy machine: what the engines' own
    work costs, beside the kernel's and the threads'. ``(sender, receiver)``."""
    from softrdma import enums as e
    from softrdma.iwarp.engine import IwarpConn
    from softrdma.iwarp.mpa_setup import MpaConfig
    from softrdma.iwarp.qp import IwarpDevice, IwarpQP
    from softrdma.seam.queues import QPInit
    from softrdma.seam.types import SGE, SendWQE

    def side() -> tuple[IwarpDevice, IwarpQP, object]:
        dev = IwarpDevice([bytes(10) + b"\xff\xff\x7f\x00\x00\x01"])
        pd = object()
        qp = IwarpQP(dev, QPInit(int(e.IBV_QPT_RC), pd, lambda w: None, lambda w: None, None,
                                 mib + 8, 8, 1, 1, 64, False))
        qp.modify({"qp_state": int(e.IBV_QPS_INIT)}, 0.0)
        return dev, qp, pd

    def flat(bufs: list[Any]) -> bytes:
        return b"".join(bytes(b) for b in bufs)

    acc = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    (da, qa, pa), (db, qb, pb) = side(), side()
    a = IwarpConn(da, initiator=True, cfg=MpaConfig(crc=crc, first_fpdu_hold=0.0), qp=qa,
                  mss=mss)
    b = IwarpConn(db, initiator=False, cfg=MpaConfig(crc=crc), mss=mss)
    b.receive(flat(a.take_output()))
    b.accept(qb)
    a.receive(flat(b.take_output()))
    src = da.register_mr(memoryview(bytearray(os.urandom(MB))), 0x10000, acc, pa)
    dst = db.register_mr(memoryview(bytearray(MB)), 0x10000, acc, pb)

    def send(keep: list[Any] | None) -> float:
        for i in range(mib):
            qa.post_send(SendWQE(i, int(e.IBV_WR_RDMA_WRITE), 0, [SGE(src.addr, MB, src.lkey)],
                                 remote_addr=dst.addr, rkey=dst.rkey), 0.0)
        t = time.process_time()
        while bufs := a.take_output(1 << 21, 512):
            if keep is not None:
                keep.extend(bytes(b) for b in bufs)
            a.tx_sent(sum(map(len, bufs)))
        return time.process_time() - t

    stream: list[Any] = []
    send(stream)
    wire = memoryview(b"".join(stream))
    rx = memoryview(bytearray(chunk))

    def receive() -> float:
        spent = 0.0
        for i in range(0, len(wire), chunk):
            k = min(chunk, len(wire) - i)
            rx[:k] = wire[i:i + k]
            t = time.process_time()
            b.receive(rx[:k])
            spent += time.process_time() - t
        if b.state != a.state:
            raise RuntimeError(f"the receiving engine failed: {b.reason}")
        return spent

    gb = mib * MB / 1e9
    tx = [send(None) for _ in range(reps)]
    rxs = [receive() for _ in range(reps)]
    return _median(tx) / gb, _median(rxs) / gb


# --- driver -----------------------------------------------------------------------------------


def _run(target: Any, rargs: tuple[Any, ...], sender: Any,
         sargs: tuple[Any, ...]) -> tuple[float, float, float]:
    """(wall seconds, sender CPU seconds, receiver CPU seconds) of one run."""
    ready = mp.Event()
    cpu_q: Any = mp.Queue()
    p = mp.Process(target=target, args=(*rargs, ready, cpu_q))
    p.start()
    if not ready.wait(30):
        p.kill()
        raise RuntimeError("receiver did not start")
    try:
        dt, scpu = sender(*sargs)
        return float(dt), float(scpu), float(cpu_q.get(timeout=30))
    finally:
        p.join(30)


def tcp_run(total: int, msg: int = MB) -> tuple[float, float, float]:
    """One plain-TCP run moving ``total`` bytes in ``msg``-byte ``sendall``-s:
    (wall s, sender CPU s, receiver CPU s)."""
    port = _free_port()
    count = max(total // msg, 1)
    return _run(tcp_receiver, (port, count * msg), tcp_sender, (port, msg, count))


def iwarp_run(total: int, msg: int = MB, crc: bool = True, window: int = 8,
              profile: bool = False) -> tuple[float, float, float]:
    """One iWARP run of ``total // msg`` RDMA WRITEs of ``msg`` bytes (MPA CRC32c on or
    off): (wall s, sender CPU s, receiver CPU s)."""
    port = _free_port()
    count = max(total // msg, 1)
    return _run(iwarp_receiver, (port, msg, crc, profile), iwarp_sender,
                (port, msg, count, window, crc, profile))


def tcp_bw(total: int, msg: int = MB) -> float:
    """Plain Python TCP throughput (bytes/s) moving ``total`` bytes (one run)."""
    count = max(total // msg, 1)
    return count * msg / tcp_run(total, msg)[0]


def iwarp_write_bw(total: int, msg: int = MB, crc: bool = True) -> float:
    """iWARP RDMA WRITE throughput (bytes/s) moving ``total`` bytes in ``msg``-byte
    WRITEs, MPA CRC32c on or off (one run)."""
    count = max(total // msg, 1)
    return count * msg / iwarp_run(total, msg, crc)[0]


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    k = len(ys)
    return ys[k // 2] if k % 2 else (ys[k // 2 - 1] + ys[k // 2]) / 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=MB, help="bytes per RDMA WRITE (default 1 MiB)")
    ap.add_argument("--count", type=int, default=512, help="writes per run (default 512)")
    ap.add_argument("--window", type=int, default=8, help="outstanding writes (default 8)")
    ap.add_argument("--runs", type=int, default=5,
                    help="runs of each, alternating (default 5)")
    ap.add_argument("--crc", choices=("on", "off", "both"), default="on",
                    help="MPA CRC32c (default on; both: one iWARP run of each per round)")
    ap.add_argument("--profile", action="store_true", help="cProfile the iWARP sides")
    ap.add_argument("--engine", action="store_true",
                    help="the engines' own CPU s/GB per side, in one process (engine_cpu)")
    a = ap.parse_args(argv)
    if a.engine:
        for c in {"on": [True], "off": [False], "both": [True, False]}[a.crc]:
            tx, rx = engine_cpu(c, reps=a.runs)
            print(f"iWARP engines alone, CRC32c {'on' if c else 'off'}: CPU s/GB median of "
                  f"{a.runs}: sender {tx:.4f}, receiver {rx:.4f}")
        return 0
    total = a.size * a.count
    crcs = {"on": [True], "off": [False], "both": [True, False]}[a.crc]
    tcp: list[tuple[float, float, float]] = []
    iw: dict[bool, list[tuple[float, float, float]]] = {c: [] for c in crcs}
    for _ in range(a.runs):
        tcp.append(tcp_run(total, a.size))
        for c in crcs:
            iw[c].append(iwarp_run(total, a.size, c, a.window, a.profile))
    gb = total / 1e9
    rows = [("plain TCP (Python sendall/recv_into)", tcp)]
    rows += [(f"iWARP RDMA WRITE, CRC32c {'on' if c else 'off'}", iw[c]) for c in crcs]
    for name, runs in rows:
        bws = [total / r[0] / 1e6 for r in runs]
        best = min(runs)
        print(f"{name:38s} best {max(bws):8.1f} MB/s, median {_median(bws):8.1f} MB/s  "
              f"CPU s/GB median: sender {_median([r[1] for r in runs]) / gb:.3f}, receiver "
              f"{_median([r[2] for r in runs]) / gb:.3f} (best run: {best[1] / gb:.2f}, "
              f"{best[2] / gb:.2f})")
    print(f"{a.count} x {a.size} B per run, window {a.window}, {a.runs} runs alternating, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    for c in crcs:
        goal = 0.75 if c else 0.85
        ratio = min(tcp)[0] / min(iw[c])[0]
        paired = [t[0] / i[0] for t, i in zip(tcp, iw[c], strict=True)]
        print(f"ratio iWARP (CRC {'on' if c else 'off'}) / TCP: {ratio:.2f} best/best, "
              f"{_median(paired):.2f} median of paired runs (goal >= {goal})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
