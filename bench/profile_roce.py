"""CPU time per packet of the RoCEv2 data path, each side on its own, in one process.

Two in-process softrdma devices on two UdpLinks (127.0.0.1 and 127.0.0.2, manual
progress) run, one call at a time from one thread:

1. ``--writes`` RC RDMA WRITEs of ``--size`` bytes (path MTU 4096, 4 in flight): the
   requester's CPU time (post, segmentation, headers, ICRC, ``sendmsg``, ACK receipt,
   completions) per data packet sent, and the responder's (``recvmsg``, ICRC check,
   placement, ACKs) per data packet received.
2. ``--pings`` RC SEND 64 B ping-pongs: each side's CPU time per round trip (one SEND
   posted and sent, one SEND received and completed, its ACKs).
3. ``--acks`` ping-pong ACKs, one step at a time (``--only ack``; not in the default run):
   what one RC ACK costs each side, the floor of a tool that awaits each SEND's
   completion (``bench/run.py``'s ``rc_send_lat_ackwait``). ``A`` receives a 64 B SEND
   from ``B`` (its coalesced ACK then pending), then sends the ACK on its own (the
   runtime's flush: header, ICRC, ``sendmsg``), and ``B`` receives it (one datagram
   read, ICRC check, the engine's ACK, the send completion polled): each against one
   plain 16-byte datagram sent and received.
4. ``--ud`` UD SENDs of 4092 B (IPoIB's datagram mode: a TUN batch of 64 posted in one
   call, one send in :data:`UD_SIGNAL` signaled, the receives re-posted as one list per
   poll): the sender's CPU time per packet (post, headers, ICRC, ``sendmsg``, its
   completions) and the receiver's (``recvmsg``, ICRC check, placement, completion,
   re-post).

Every figure is ``time.thread_time`` spent inside that side's calls, so the two sides
are apart although one thread drives both, and other processes' load does not count.
Beside each, the baseline measured in the same run the same way: plain Python UDP
sockets moving the same bytes (4096 B datagrams, ``sendto`` / ``recv_into``; a 64 B
datagram each way per round trip), and the ratio. With ``--profile`` cProfile runs
over each phase and prints the top functions.
Run: ``python bench/profile_roce.py [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import roce_bench  # noqa: E402
from roce_bench import RECV  # noqa: E402

from softrdma import enums as e  # noqa: E402
from softrdma import verbs as v  # noqa: E402
from softrdma.apps.ipoib_runtime import TUN_BATCH, UD_SIGNAL_EVERY  # noqa: E402
from softrdma.drivers.links.udp import UdpLink  # noqa: E402

PKT = 4096  # payload bytes per WRITE packet at path MTU 4096
DEPTH = 64  # send and receive queue depth
IN_FLIGHT = 4  # WRITEs posted ahead of their completions (as roce_bench)
PING = 64  # bytes of a ping-pong message
STALL_S = 5.0  # no progress for this long: the run failed (lost packets, a bug)


class _Timed:
    """``cpu``: the thread time of the calls made through :meth:`timed`."""

    cpu = 0.0

    def timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*args)
        finally:
            self.cpu += time.thread_time() - t0


class Side(_Timed, roce_bench.Side):
    """roce_bench's side, progressed by hand; ``cpu`` sums the thread time of its calls."""

    def __init__(self, ip: str, port: int, size: int) -> None:
        super().__init__(UdpLink(ip, port), size, DEPTH, name="prof" + ip[-1],
                         progress="manual")
        self.rt = self.ctx.runtime
        self.cpu = 0.0

    def connect(self, peer: Any, mtu: int = 5) -> None:  # 5: IBV_MTU_4096
        """Connect to ``peer``: another Side, or its :meth:`info`."""
        super().connect(peer.info() if isinstance(peer, Side) else peer, mtu)

    def progress(self) -> int:
        return int(self.timed(self.rt.progress))

    def poll(self, n: int = 16) -> list[Any]:
        _, wcs = self.timed(self.cq.poll, n)
        for wc in wcs:
            if wc.status:
                raise RuntimeError(f"completion error: {wc}")
        return list(wcs)

    def counters(self) -> dict[str, int]:
        return self.rt.device_counters()

    def close(self) -> None:
        self.ctx.close()


def _stalled(since: float) -> bool:
    return time.monotonic() - since > STALL_S


def run_writes(a: Side, b: Side, n: int, size: int) -> tuple[float, float, int]:
    """``n`` WRITEs of ``size`` bytes from ``a`` to ``b``; (a's, b's CPU s, data packets)."""
    wr = v.SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                  sg=[v.SGE(a.mr.addr, size, a.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(b.mr.rkey, b.mr.addr)
    a.cpu = b.cpu = 0.0
    posted = done = 0
    last = time.monotonic()
    while done < n:
        while posted < n and posted - done < IN_FLIGHT:
            a.timed(a.qp.post_send, wr)
            posted += 1
        moved = b.progress() + a.progress()
        got = len(a.poll())
        done += got
        if moved or got:
            last = time.monotonic()
        elif _stalled(last):
            raise RuntimeError(f"WRITE stalled after {done} of {n} completions")
    pkts = n * ((size + PKT - 1) // PKT)
    return a.cpu, b.cpu, pkts


def run_pings(a: Side, b: Side, n: int) -> tuple[float, float]:
    """``n`` 64 B SEND ping-pongs; (a's, b's CPU s). Each receive is re-posted."""
    wrs = {s: v.SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1,
                       sg=[v.SGE(s.mr.addr + PING, PING, s.mr.lkey)],
                       send_flags=e.IBV_SEND_SIGNALED) for s in (a, b)}
    a.cpu = b.cpu = 0.0
    for _ in range(n):
        for src, dst in ((a, b), (b, a)):
            src.timed(src.qp.post_send, wrs[src])
            last = time.monotonic()
            while True:
                dst.progress()
                if any(wc.opcode == RECV for wc in dst.poll()):
                    break
                src.progress()
                src.poll()
                if _stalled(last):
                    raise RuntimeError("ping-pong stalled")
            dst.timed(dst.qp.post_recv,
                      v.RecvWR(wr_id=1, num_sge=1, sg=[v.SGE(dst.mr.addr, PING, dst.mr.lkey)]))
    # the last ACKs and send completions
    for _ in range(3):
        a.progress(), b.progress(), a.poll(), b.poll()
    return a.cpu, b.cpu


UD_PAYLOAD = 4092  # IPoIB-UD's MTU at IB MTU 4096 (4-byte encapsulation header)
UD_POST = TUN_BATCH  # UD WRs per post, as the IPoIB interface posts a TUN batch
UD_SIGNAL = UD_SIGNAL_EVERY  # one UD send in this many is signaled, as there
UD_DEPTH = 256
UD_QKEY = 0x0B


class UdSide(_Timed):
    """One device on a UdpLink with a UD QP, its buffers and CQ (manual progress);
    ``cpu`` sums the thread time of its calls."""

    def __init__(self, ip: str, port: int) -> None:
        self.ctx = v.Context("prof-ud" + ip[-1], link=UdpLink(ip, port), progress="manual")
        self.rt = self.ctx.runtime
        self.pd = v.PD(self.ctx)
        self.slot = UD_PAYLOAD + 40  # the GRH area, then the payload
        self.buf = bytearray(UD_DEPTH * self.slot)
        self.mr = v.MR(self.pd, len(self.buf), int(e.IBV_ACCESS_LOCAL_WRITE), buffer=self.buf)
        self.cq = v.CQ(self.ctx, 4 * UD_DEPTH)
        cap = v.QPCap(max_send_wr=UD_DEPTH, max_recv_wr=UD_DEPTH, max_send_sge=1,
                      max_recv_sge=1)
        self.qp = v.QP(self.pd, v.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=self.cq, rcq=self.cq,
                                             cap=cap))
        self.qp.modify(v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0, port_num=1,
                                qkey=UD_QKEY),
                       int(e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_QKEY))
        self.qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTR), int(e.IBV_QP_STATE))
        self.qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTS, sq_psn=0),
                       int(e.IBV_QP_STATE | e.IBV_QP_SQ_PSN))
        self.rwrs = [v.RecvWR(wr_id=i, sg=[v.SGE(self.mr.addr + i * self.slot, self.slot,
                                                 self.mr.lkey)], num_sge=1)
                     for i in range(UD_DEPTH)]
        self.qp.post_recv(self.rwrs)  # each run re-posts what it used
        self.cpu = 0.0

    def close(self) -> None:
        self.ctx.close()


def run_ud(a: UdSide, b: UdSide, n: int) -> tuple[float, float, int]:
    """``n`` (rounded up to whole posts) UD SENDs of :data:`UD_PAYLOAD` bytes from ``a``
    to ``b``, :data:`UD_POST` per post while ``b`` has receives for them; (a's, b's CPU
    s, packets received)."""
    ah = v.AH(a.pd, v.AHAttr(port_num=1, is_global=1, gr=v.GlobalRoute(
        dgid=b.ctx.query_gid(1, 0), sgid_index=0, hop_limit=64)))
    swrs = []
    for i in range(UD_POST):
        w = v.SendWR(wr_id=i, sg=[v.SGE(a.mr.addr + i * a.slot, UD_PAYLOAD, a.mr.lkey)],
                     num_sge=1,
                     send_flags=int(e.IBV_SEND_SIGNALED) if i % UD_SIGNAL == UD_SIGNAL - 1
                     else 0)
        w.set_wr_ud(ah, b.qp.qp_num, UD_QKEY)
        swrs.append(w)
    rwrs = b.rwrs
    a.cpu = b.cpu = 0.0
    sent = got = 0
    last = time.monotonic()
    while got < n:
        if sent < n and sent - got <= UD_DEPTH - UD_POST:
            a.timed(a.qp.post_send, swrs)
            a.timed(a.rt.progress)
            while a.timed(a.cq.poll, 64)[0]:
                pass
            sent += UD_POST
        b.timed(b.rt.progress)
        idx: list[int] = []
        while True:
            k, wcs = b.timed(b.cq.poll, 64)
            if not k:
                break
            for wc in wcs:
                if wc.status or wc.byte_len != UD_PAYLOAD + 40:
                    raise RuntimeError(f"UD receive failed: {wc}")
                idx.append(int(wc.wr_id))
        if idx:
            b.timed(b.qp.post_recv, [rwrs[i] for i in idx])
            got += len(idx)
            last = time.monotonic()
        elif _stalled(last):
            raise RuntimeError(f"UD stalled after {got} of {sent} packets (lost?)")
    ah.close()
    return a.cpu, b.cpu, got


class UdpSide:
    """The baseline: one plain UDP socket; ``cpu`` sums the thread time of its calls."""

    def __init__(self, ip: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((ip, 0))
        self.sock.setblocking(False)
        self.addr = self.sock.getsockname()
        self.buf = bytearray(65536)
        self.cpu = 0.0

    def send(self, data: memoryview, dst: tuple[str, int]) -> None:
        t0 = time.thread_time()
        self.sock.sendto(data, dst)
        self.cpu += time.thread_time() - t0

    def recv(self) -> int:
        t0 = time.thread_time()
        try:
            return self.sock.recv_into(self.buf)
        except BlockingIOError:
            return 0
        finally:
            self.cpu += time.thread_time() - t0

    def close(self) -> None:
        self.sock.close()


def udp_bulk(a: UdpSide, b: UdpSide, pkts: int) -> tuple[float, float]:
    """``pkts`` 4096 B datagrams from ``a`` to ``b``, in bursts of 64; CPU s of each."""
    data = memoryview(bytearray(PKT))
    a.cpu = b.cpu = 0.0
    got = 0
    last = time.monotonic()
    while got < pkts:
        for _ in range(min(IN_FLIGHT * 16, pkts - got)):
            a.send(data, b.addr)
        while b.recv():
            got += 1
            last = time.monotonic()
        if _stalled(last):
            raise RuntimeError(f"UDP baseline stalled after {got} of {pkts} datagrams")
    return a.cpu, b.cpu


def _udp_hop(src: UdpSide, dst: UdpSide, data: memoryview, what: str) -> None:
    """``data`` from ``src`` to ``dst``, read there before this returns (RuntimeError
    naming ``what`` if it never arrives)."""
    src.send(data, dst.addr)
    last = time.monotonic()
    while not dst.recv():
        if _stalled(last):
            raise RuntimeError(what)


def udp_pings(a: UdpSide, b: UdpSide, n: int) -> tuple[float, float]:
    """``n`` 64 B round trips between ``a`` and ``b``; CPU s of each."""
    data = memoryview(bytes(PING))
    a.cpu = b.cpu = 0.0
    for _ in range(n):
        _udp_hop(a, b, data, "UDP ping-pong stalled")
        _udp_hop(b, a, data, "UDP ping-pong stalled")
    return a.cpu, b.cpu


def _line(what: str, ours: float, base: float, unit: float) -> str:
    return (f"  {what}: {ours / unit * 1e6:6.2f} us   plain UDP: {base / unit * 1e6:6.2f} us"
            f"   ratio {ours / base if base else float('inf'):.2f}")


def _profiled(enabled: bool, fn: Callable[[], Any]) -> tuple[Any, str]:
    if not enabled:
        return fn(), ""
    prof = cProfile.Profile()
    out = prof.runcall(fn)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    return out, s.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writes", type=int, default=64, help="RDMA WRITEs (default 64)")
    ap.add_argument("--size", type=int, default=1 << 20, help="WRITE size (default 1 MiB)")
    ap.add_argument("--pings", type=int, default=2000, help="ping-pong round trips")
    ap.add_argument("--port", type=int, default=47931, help="UDP port of both devices")
    ap.add_argument("--profile", action="store_true", help="cProfile: top functions")
    ap.add_argument("--ud", type=int, default=30000, help="UD SENDs (default 30000)")
    ap.add_argument("--acks", type=int, default=4000, help="ACKs of --only ack")
    ap.add_argument("--only", choices=("bw", "lat", "ud", "ack"))
    args = ap.parse_args(argv)
    if args.only == "ud":
        return _ud_main(args.ud, args.port, args.profile)
    if args.only == "ack":
        return _ack_main(args.acks, args.port)
    a = Side("127.0.0.1", args.port, max(args.size, 2 * PING))
    b = Side("127.0.0.2", args.port, max(args.size, 2 * PING))
    ua, ub = UdpSide("127.0.0.1"), UdpSide("127.0.0.2")
    try:
        a.connect(b)
        b.connect(a)
        if args.only in (None, "bw"):
            run_writes(a, b, 2, args.size)  # warm-up
            (ca, cb, pkts), prof = _profiled(args.profile,
                                             lambda: run_writes(a, b, args.writes, args.size))
            ba, bb = udp_bulk(ua, ub, pkts)
            print(f"RC WRITE {args.size} B x {args.writes}: {pkts} data packets, CPU per packet")
            print(_line("requester", ca, ba, pkts))
            print(_line("responder", cb, bb, pkts))
            print(prof, end="")
        if args.only in (None, "lat"):
            for s in (a, b):
                s.qp.post_recv([v.RecvWR(wr_id=1, num_sge=1,
                                         sg=[v.SGE(s.mr.addr, PING, s.mr.lkey)])
                                for _ in range(DEPTH)])
            run_pings(a, b, 20)  # warm-up
            (ca, cb), prof = _profiled(args.profile, lambda: run_pings(a, b, args.pings))
            ba, bb = udp_pings(ua, ub, args.pings)
            print(f"RC SEND {PING} B ping-pong x {args.pings}, CPU per round trip")
            print(_line("side A", ca, ba, args.pings))
            print(_line("side B", cb, bb, args.pings))
            print(prof, end="")
        ka, kb = a.counters(), b.counters()
        print(f"retransmitted {ka.get('retransmitted_pkts', 0)} packets, "
              f"ICRC errors {kb.get('rcvd_icrc_err', 0) + ka.get('rcvd_icrc_err', 0)}, "
              f"sent {ka.get('sent_pkts', 0)}/{kb.get('sent_pkts', 0)} packets (A/B)")
    finally:
        a.close()
        b.close()
        ua.close()
        ub.close()
    if args.only is None:
        return _ud_main(args.ud, args.port, args.profile)
    return 0


def run_acks(a: Side, b: Side, n: int) -> tuple[float, float]:
    """``n`` times: ``b`` SENDs 64 B to ``a``, which takes it with its ACK left pending,
    then flushes that ACK alone; ``b`` reads it (one datagram) and polls the send
    completion. (a's CPU s in the flushes, b's CPU s in the reads and polls.) Uses the
    runtime's step methods under its lock: a diagnostic of one step, not an API."""
    wr = v.SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1,
                  sg=[v.SGE(b.mr.addr + PING, PING, b.mr.lkey)],
                  send_flags=e.IBV_SEND_SIGNALED)
    recv = v.RecvWR(wr_id=1, num_sge=1, sg=[v.SGE(a.mr.addr, PING, a.mr.lkey)])
    ra: Any = a.rt  # the RoCE Runtime (drivers.runtime.roce), its step methods
    rb: Any = b.rt
    tx = rx = 0.0
    clock = time.thread_time
    for _ in range(n):
        a.qp.post_recv(recv)
        b.qp.post_send(wr)
        last = time.monotonic()
        with ra.lock:
            while not ra._poll_rx_locked():  # the SEND; its ACK stays pending
                if _stalled(last):
                    raise RuntimeError("the SEND never arrived")
            if not ra.port.ack_pending:
                raise RuntimeError("no ACK pending after the SEND")
            t0 = clock()
            ra._flush_tx_locked(True)
            tx += clock() - t0
        if not any(wc.opcode == RECV for wc in a.poll()):
            raise RuntimeError("the SEND's receive did not complete")
        got = False
        last = time.monotonic()
        while not got:
            t0 = clock()
            with rb.lock:
                rb._poll_rx_locked(None, 1)
            got = bool(b.cq.poll(1)[0])
            rx += clock() - t0
            if not got and _stalled(last):
                raise RuntimeError("the ACK never completed the SEND")
    return tx, rx


def udp_acks(a: UdpSide, b: UdpSide, n: int) -> tuple[float, float]:
    """``n`` 16-byte datagrams from ``a`` to ``b``, each read before the next; CPU s of
    each."""
    data = memoryview(bytes(16))
    a.cpu = b.cpu = 0.0
    for _ in range(n):
        _udp_hop(a, b, data, "a plain datagram was lost")
    return a.cpu, b.cpu


def _ack_main(n: int, port: int) -> int:
    a = Side("127.0.0.1", port, 2 * PING)
    b = Side("127.0.0.2", port, 2 * PING)
    ua, ub = UdpSide("127.0.0.1"), UdpSide("127.0.0.2")
    try:
        a.connect(b)
        b.connect(a)
        run_acks(a, b, 50)  # warm-up
        tx, rx = run_acks(a, b, n)
        ba, bb = udp_acks(ua, ub, n)
        print(f"RC ACK of a 64 B SEND x {n}, CPU per ACK")
        print(_line("ACK sent", tx, ba, n))
        print(_line("ACK received and completed", rx, bb, n))
    finally:
        a.close()
        b.close()
        ua.close()
        ub.close()
    return 0


def _ud_main(n: int, port: int, profile: bool) -> int:
    a, b = UdSide("127.0.0.1", port), UdSide("127.0.0.2", port)
    ua, ub = UdpSide("127.0.0.1"), UdpSide("127.0.0.2")
    try:
        run_ud(a, b, 4 * UD_POST)  # warm-up
        (ca, cb, pkts), prof = _profiled(profile, lambda: run_ud(a, b, n))
        ba, bb = udp_bulk(ua, ub, pkts)
        print(f"UD SEND {UD_PAYLOAD} B x {pkts}, {UD_POST} per post, 1 in {UD_SIGNAL} "
              "signaled: CPU per packet")
        print(_line("sender", ca, ba, pkts))
        print(_line("receiver", cb, bb, pkts))
        print(prof, end="")
    finally:
        a.close()
        b.close()
        ua.close()
        ub.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
