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

Prints both throughputs and their ratio (goal: >= 0.6). ``--profile`` profiles the
iWARP sender and receiver (cProfile, top functions printed).

Usage: ``PYTHONPATH=src python3 bench/iwarp_write_bw.py [--size N] [--count N] [--runs N]``
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
    t = os.times()
    return t.user + t.system


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


def _prof_start(on: bool) -> Any:
    if not on:
        return None
    import cProfile

    p = cProfile.Profile()
    p.enable()
    return p


def _prof_stop(p: Any, title: str) -> None:
    if p is None:
        return
    import io
    import pstats

    p.disable()
    out = io.StringIO()
    pstats.Stats(p, stream=out).sort_stats("tottime").print_stats(12)
    print(f"--- profile: {title}\n" + out.getvalue(), file=sys.stderr)


def iwarp_receiver(port: int, size: int, profile: bool, ready: Any, cpu_q: Any) -> None:
    from softrdma import enums as e
    from softrdma import verbs as v
    from softrdma.cm import iwconnect

    prof = _prof_start(profile)
    ctx = v.Context(transport="iwarp")
    pd = v.PD(ctx)
    ch = v.CompChannel(ctx)
    cq = v.CQ(ctx, 16, None, ch)
    qp = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4, 1, 1)))
    mr = v.MR(pd, max(size, MB), e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    ctl = v.MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    qp.to_init(v.QPAttr())
    qp.post_recv(v.RecvWR(1, 1, [v.SGE(ctl.addr, 64, ctl.lkey)]))
    lst = iwconnect.listen(ctx, port, cfg=iwconnect.MpaConfig(crc=True))
    ready.set()
    conn = lst.accept(qp, struct.pack("!IQ", mr.rkey, mr.addr), timeout=30)
    assert conn.negotiated.crc
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
    _prof_stop(prof, "iWARP receiver (progress thread excluded)")
    ctx.close()


def iwarp_sender(port: int, size: int, count: int, window: int,
                 profile: bool) -> tuple[float, float]:
    from softrdma import enums as e
    from softrdma import verbs as v
    from softrdma.cm import iwconnect

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
    cfg = iwconnect.MpaConfig(crc=True)
    conn = iwconnect.connect(qp, "127.0.0.1", port, cfg=cfg, timeout=30)
    rkey, raddr = struct.unpack("!IQ", conn.private_data)
    # connection setup is not timed (nor is TCP's): that includes the initiator's hold of
    # its first FPDU after the MPA Reply (MpaConfig.first_fpdu_hold, for Linux siw), which
    # the progress thread's housekeeping (every 50 ms at most) releases
    time.sleep(cfg.first_fpdu_hold + 0.06)
    wr = v.SendWR(1, None, 1, [v.SGE(src.addr, size, src.lkey)], e.IBV_WR_RDMA_WRITE)
    wr.set_wr_rdma(rkey, raddr)
    prof = _prof_start(profile)
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
    _prof_stop(prof, "iWARP sender")
    conn.disconnect()
    ctx.close()
    return dt, cpu


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=MB, help="bytes per RDMA WRITE (default 1 MiB)")
    ap.add_argument("--count", type=int, default=512, help="writes per run (default 512)")
    ap.add_argument("--window", type=int, default=8, help="outstanding writes (default 8)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each, best taken (default 5)")
    ap.add_argument("--profile", action="store_true", help="cProfile the iWARP sides")
    a = ap.parse_args(argv)
    total = a.size * a.count
    tcp: list[tuple[float, float, float]] = []
    iw: list[tuple[float, float, float]] = []
    for _ in range(a.runs):
        port = _free_port()
        tcp.append(_run(tcp_receiver, (port, total), tcp_sender, (port, a.size, a.count)))
        port = _free_port()
        iw.append(_run(iwarp_receiver, (port, a.size, a.profile), iwarp_sender,
                       (port, a.size, a.count, a.window, a.profile)))
    gb = total / 1e9
    for name, runs in (("plain TCP (Python sendall/recv_into)", tcp),
                       ("iWARP RDMA WRITE, CRC32c on", iw)):
        best = min(runs)
        print(f"{name:38s} {total / best[0] / 1e6:8.1f} MB/s  CPU s/GB: sender "
              f"{best[1] / gb:.2f}, receiver {best[2] / gb:.2f}  (walls: "
              f"{', '.join(f'{r[0]:.3f}' for r in runs)} s)")
    ratio = min(tcp)[0] / min(iw)[0]
    paired = sorted(t[0] / i[0] for t, i in zip(tcp, iw, strict=True))
    print(f"{a.count} x {a.size} B per run, window {a.window}, best of {a.runs}")
    print(f"ratio iWARP / TCP: {ratio:.2f} best/best, {paired[len(paired) // 2]:.2f} median of "
          f"paired runs (goal >= 0.6)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
