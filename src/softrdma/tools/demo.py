"""``softrdma demo``: every RC operation between two endpoints on the loopback, checked.

What runs where: one in-process device (this process owns a RoCEv2 UDP socket on
127.0.0.1, port ``--port``, and runs the transport engine in its progress thread); two
endpoints A and B, each with its own PD, MR, CQ and RC QP, share that device, exactly as
two QPs of one rxe device would. Every packet between them is a real RoCEv2 datagram
(BTH, extension headers, ICRC; Annex A17) sent through the Linux loopback to the
device's own socket and demultiplexed by destination QP (IBA 9.2).

Operations (IBA 9.4 / 9.5; rdma-core ``ibv_post_send``): SEND/RECV, RDMA WRITE, RDMA READ,
ATOMIC CMP_AND_SWP and FETCH_AND_ADD (8-byte, host order at the responder, IBA 9.4.5),
each verified against memory, then a packet/counter summary. Exit 0 only if every
check passed.
"""

from __future__ import annotations

import argparse
import errno
import random
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from .. import enums as e
from ..errors import DeviceError, InvalidArgument, NotSupported, SoftRdmaError
from .argtypes import int_in, path_mtu

if TYPE_CHECKING:
    from .. import verbs as v

DEMO_IP = "127.0.0.1"
ROCE_V2_PORT = 4791  # the default; taken while softrdma_lo's devd (or a kernel rxe) runs
FREE_PORT_TRIES = 8
DEVICE_NAME = "softrdma_lo"
MTUS = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
        2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
          | e.IBV_ACCESS_REMOTE_ATOMIC)
U64 = (1 << 64) - 1


class DemoError(SoftRdmaError):
    """The demo could not run (setup failed, a completion never came)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's options."""
    p.add_argument("--size", type=int_in(8, 1 << 24, "size"), default=4096,
                   help="bytes moved by SEND, RDMA WRITE and RDMA READ (default 4096)")
    p.add_argument("--mtu", type=path_mtu, default=1024, help="path MTU (default 1024)")
    p.add_argument("--transport", choices=("roce", "iwarp"), default="roce",
                   help="roce (RoCEv2, default); iwarp is not available yet")
    p.add_argument("--port", type=int_in(1, 65535, "UDP port"), default=None,
                   help="UDP port of the in-process device (default 4791, the RoCEv2 port; "
                   "a free port when another program, such as softrdma_lo's devd, holds "
                   "4791)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SEC",
                   help="give up on a completion after SEC seconds (default 10)")


@dataclass
class Endpoint:
    """One side: PD, registered buffer, CQ and RC QP."""

    name: str
    pd: v.PD
    buf: bytearray
    mr: v.MR
    cq: v.CQ
    qp: v.QP
    off_data: int = 0      # SEND source / RECV target / RDMA WRITE target
    off_rdma: int = 0      # RDMA READ target (A) / RDMA source and target (B)
    off_atomic: int = 0    # 8-byte aligned: the atomic target (B) / old value (A)
    psn: int = 0
    closers: list[Any] = field(default_factory=list)

    def va(self, off: int) -> int:
        """The virtual address of ``off`` in this side's MR."""
        return int(self.mr.addr) + off

    def u64(self, off: int) -> int:
        """The 8-byte host-order word at ``off``."""
        return int.from_bytes(self.buf[off:off + 8], sys.byteorder)

    def set_u64(self, off: int, value: int) -> None:
        """Store an 8-byte host-order word at ``off``."""
        self.buf[off:off + 8] = (value & U64).to_bytes(8, sys.byteorder)

    def close(self) -> None:
        """Destroy QP, CQ, MR, PD."""
        _close_all(self.closers)


def _close_all(objs: list[Any]) -> None:
    """Close ``objs`` newest first (a failing close does not stop the others); empty it."""
    for obj in reversed(objs):
        try:
            obj.close()
        except SoftRdmaError:
            pass
    objs.clear()


def _make_endpoint(ctx: v.Context, name: str, size: int) -> Endpoint:
    from .. import verbs as v

    closers: list[Any] = []
    try:
        pd = v.PD(ctx)
        closers.append(pd)
        buf = bytearray(2 * size + 32)
        mr = v.MR(pd, len(buf), int(ACCESS), buffer=buf)
        closers.append(mr)
        cq = v.CQ(ctx, 32)
        closers.append(cq)
        cap = v.QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
        qp = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
        closers.append(qp)
    except SoftRdmaError:
        _close_all(closers)
        raise
    off_atomic = 2 * size + (-(int(mr.addr) + 2 * size)) % 8  # IBA 9.4.5: 8-byte aligned
    return Endpoint(name, pd, buf, mr, cq, qp, off_data=0, off_rdma=size,
                    off_atomic=off_atomic, psn=random.getrandbits(24), closers=closers)


def _connect(a: Endpoint, b: Endpoint, gid: v.GID, mtu: int) -> None:
    """INIT -> RTR -> RTS for ``a`` towards ``b`` (IBA 11.2.4.2, as rc_pingpong does, plus
    remote access and one outstanding RDMA READ/atomic)."""
    from .. import verbs as v

    a.qp.modify(v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0, port_num=1,
                         qp_access_flags=int(ACCESS & ~e.IBV_ACCESS_LOCAL_WRITE)),
                int(e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                    | e.IBV_QP_ACCESS_FLAGS))
    ah = v.AHAttr(port_num=1, is_global=1,
                  gr=v.GlobalRoute(dgid=gid, sgid_index=0, hop_limit=64))
    a.qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=MTUS[mtu], dest_qp_num=b.qp.qp_num,
                         rq_psn=b.psn, max_dest_rd_atomic=1, min_rnr_timer=12, ah_attr=ah),
                int(e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
                    | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER))
    a.qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTS, timeout=14, retry_cnt=7, rnr_retry=7,
                         sq_psn=a.psn, max_rd_atomic=1),
                int(e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT
                    | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC))


def _wait(cq: v.CQ, timeout: float, what: str) -> Any:
    """One completion from ``cq`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        n, wcs = cq.poll(1)
        if n:
            return wcs[0]
        if time.monotonic() > deadline:
            raise DemoError(f"{what}: no completion within {timeout:g} s")
        time.sleep(0.0002)


@dataclass
class Result:
    """One report line."""

    op: str
    direction: str
    nbytes: int
    status: str
    ok: bool
    detail: str
    ms: float

    def line(self) -> str:
        """``  RDMA WRITE        A -> B     4096 bytes  IBV_WC_SUCCESS  verify OK  0.42 ms``."""
        verdict = "verify OK" if self.ok else "verify FAILED"
        extra = f"  ({self.detail})" if self.detail else ""
        return (f"  {self.op:<20} {self.direction:<7} {self.nbytes:>8} bytes  "
                f"{self.status:<16} {verdict:<13} {self.ms:8.2f} ms{extra}")


class Demo:
    """Runs the operations between ``a`` (requester) and ``b`` (responder)."""

    def __init__(self, a: Endpoint, b: Endpoint, size: int, timeout: float) -> None:
        self.a, self.b, self.size, self.timeout = a, b, size, timeout
        self.rng = random.Random(0x50F7)

    def _send_wr(self, opcode: int, off: int, length: int) -> v.SendWR:
        from .. import verbs as v

        sge = v.SGE(self.a.va(off), length, self.a.mr.lkey)
        return v.SendWR(wr_id=opcode, num_sge=1, sg=[sge], opcode=opcode,
                        send_flags=e.IBV_SEND_SIGNALED)

    def _complete(self, wr: v.SendWR, what: str) -> tuple[Any, float]:
        t0 = time.perf_counter()
        self.a.qp.post_send(wr)
        wc = _wait(self.a.cq, self.timeout, what)
        return wc, (time.perf_counter() - t0) * 1e3

    @staticmethod
    def _status(wc: Any) -> str:
        from .. import verbs as v

        if wc.status == e.IBV_WC_SUCCESS:
            return "IBV_WC_SUCCESS"
        return f"{v.wc_status_str(wc.status)} ({int(wc.status)})"

    def send_recv(self) -> Result:
        """B posts a receive; A SENDs ``size`` bytes; B's buffer must hold them."""
        from .. import verbs as v

        a, b, n = self.a, self.b, self.size
        data = self.rng.randbytes(n)
        a.buf[a.off_data:a.off_data + n] = data
        b.buf[b.off_data:b.off_data + n] = bytes(n)
        b.qp.post_recv(v.RecvWR(wr_id=1, num_sge=1,
                                sg=[v.SGE(b.va(b.off_data), n, b.mr.lkey)]))
        wc, ms = self._complete(self._send_wr(e.IBV_WR_SEND, a.off_data, n), "SEND")
        rwc = _wait(b.cq, self.timeout, "RECV")
        ok = (wc.status == rwc.status == e.IBV_WC_SUCCESS and rwc.byte_len == n
              and int(rwc.opcode) == e.IBV_WC_RECV
              and bytes(b.buf[b.off_data:b.off_data + n]) == data)
        status = self._status(wc if wc.status != e.IBV_WC_SUCCESS else rwc)
        return Result("SEND/RECV", "A -> B", n, status, ok,
                      f"B's receive completion: {int(rwc.byte_len)} bytes", ms)

    def rdma_write(self) -> Result:
        """A writes ``size`` bytes into B's MR (B's CPU not involved)."""
        a, b = self.a, self.b
        return self._rdma(e.IBV_WR_RDMA_WRITE, "RDMA WRITE", "A -> B", a.off_data,
                          (a.buf, a.off_data), (b.buf, b.off_rdma))

    def rdma_read(self) -> Result:
        """A reads ``size`` bytes of B's MR into its own."""
        a, b = self.a, self.b
        return self._rdma(e.IBV_WR_RDMA_READ, "RDMA READ", "A <- B", a.off_rdma,
                          (b.buf, b.off_rdma), (a.buf, a.off_rdma))

    def _rdma(self, opcode: int, name: str, arrow: str, local_off: int,
              src: tuple[bytearray, int], dst: tuple[bytearray, int]) -> Result:
        """One RDMA operation of A on B's MR at ``off_rdma``: random bytes at ``src``,
        zeros at ``dst``, A's buffer at ``local_off``; ok when ``dst`` holds the bytes."""
        b, n = self.b, self.size
        data = self.rng.randbytes(n)
        (sbuf, soff), (dbuf, doff) = src, dst
        sbuf[soff:soff + n] = data
        dbuf[doff:doff + n] = bytes(n)
        wr = self._send_wr(opcode, local_off, n)
        wr.set_wr_rdma(b.mr.rkey, b.va(b.off_rdma))
        wc, ms = self._complete(wr, name)
        ok = wc.status == e.IBV_WC_SUCCESS and bytes(dbuf[doff:doff + n]) == data
        return Result(name, arrow, n, self._status(wc), ok,
                      f"rkey 0x{b.mr.rkey:x}, va 0x{b.va(b.off_rdma):x}", ms)

    def cmp_and_swp(self) -> Result:
        """CAS on B's word: compare (equal) then swap; A gets the old value."""
        old, new = self.rng.getrandbits(64), self.rng.getrandbits(64)
        return self._atomic("ATOMIC CMP_AND_SWP", e.IBV_WR_ATOMIC_CMP_AND_SWP, old,
                            (old, new), new,
                            f"0x{old:016x} == compare -> swapped in 0x{new:016x}")

    def fetch_and_add(self) -> Result:
        """FAA on B's word; A gets the value before the add."""
        before, add = self.rng.getrandbits(64), self.rng.getrandbits(32)
        after = (before + add) & U64
        return self._atomic("ATOMIC FETCH_AND_ADD", e.IBV_WR_ATOMIC_FETCH_AND_ADD, before,
                            (add,), after, f"0x{before:016x} + 0x{add:x} = 0x{after:016x}")

    def _atomic(self, name: str, opcode: int, before: int, operands: tuple[int, ...],
                after: int, detail: str) -> Result:
        """One atomic from A on B's word, which holds ``before``: it passes when A gets
        ``before`` back and B's word is then ``after``."""
        a, b = self.a, self.b
        b.set_u64(b.off_atomic, before)
        a.set_u64(a.off_atomic, 0)
        wr = self._send_wr(opcode, a.off_atomic, 8)
        wr.set_wr_atomic(b.mr.rkey, b.va(b.off_atomic), *operands)
        wc, ms = self._complete(wr, name)
        ok = (wc.status == e.IBV_WC_SUCCESS and a.u64(a.off_atomic) == before
              and b.u64(b.off_atomic) == after)
        return Result(name, "A -> B", 8, self._status(wc), ok, detail, ms)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((DEMO_IP, 0))
        return int(s.getsockname()[1])


def _open_device(port: int | None) -> tuple[v.Context, int]:
    """The demo's in-process device and its UDP port: ``port``, else 4791, else (4791
    in use: softrdma_lo's devd serves another program, a kernel rxe device...) a free
    port, so the demo runs beside them."""
    if port is not None:
        return _open_on(port), port
    try:
        return _open_on(ROCE_V2_PORT), ROCE_V2_PORT
    except DeviceError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
    for _ in range(FREE_PORT_TRIES):  # another program may take the probed port first
        free = _free_udp_port()
        try:
            return _open_on(free), free
        except DeviceError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise DeviceError(f"UDP port {ROCE_V2_PORT} on {DEMO_IP} is in use and no free port "
                      f"was found in {FREE_PORT_TRIES} tries", errno=errno.EADDRINUSE)


def _open_on(port: int) -> v.Context:
    from .. import verbs as v
    from ..drivers.links.udp import UdpLink

    try:
        link = UdpLink(DEMO_IP, port=port)
    except DeviceError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise DeviceError(
                f"UDP port {port} on {DEMO_IP} is already in use (a softrdma devd, a kernel "
                f"rxe device or another demo?): pick a free one with --port N, "
                f"e.g. --port {port + 10000 if port < 55535 else 14791}",
                errno=errno.EADDRINUSE) from exc
        raise
    try:
        return v.Context(DEVICE_NAME, link=link)
    except BaseException:
        link.close()
        raise


def _counter_lines(counters: dict[str, int]) -> list[str]:
    nonzero = {k: c for k, c in counters.items() if c}
    sent, rcvd = counters.get("sent_pkts", 0), counters.get("rcvd_pkts", 0)
    out = [f"  packets: {sent} sent, {rcvd} received (both endpoints share the device, so "
           "each packet is counted once sent and once received)"]
    others = {k: c for k, c in nonzero.items() if k not in ("sent_pkts", "rcvd_pkts")}
    if others:
        out.append("  other counters: " + ", ".join(f"{k}={c}" for k, c in sorted(others.items())))
    else:
        out.append("  no errors, drops, retries or NAKs counted")
    return out


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Entry point of ``softrdma demo``; returns the exit status."""
    out = out if out is not None else sys.stdout
    if args.transport == "iwarp":
        raise NotSupported("the iWARP demo is not available yet; use --transport roce")
    if not args.timeout > 0:
        raise InvalidArgument("--timeout", "must be > 0")

    def say(line: str = "") -> None:
        out.write(line + "\n")
        out.flush()

    ctx, port = _open_device(args.port)
    eps: list[Endpoint] = []
    try:
        pa = ctx.query_port(1)
        active = 128 << int(pa.active_mtu)
        if args.mtu > active:
            raise InvalidArgument("--mtu", f"{args.mtu} exceeds the port's active MTU {active}")
        gid = ctx.query_gid(1, 0)
        a = _make_endpoint(ctx, "A", args.size)
        eps.append(a)
        b = _make_endpoint(ctx, "B", args.size)
        eps.append(b)
        _connect(a, b, gid, args.mtu)
        _connect(b, a, gid, args.mtu)
        say("softrdma demo: RC over RoCEv2 on the loopback")
        say(f"  device {DEVICE_NAME}, in-process: this process (its progress thread) runs the "
            "transport engine")
        say(f"  network: real RoCEv2 datagrams, UDP {DEMO_IP}:{port} -> itself through "
            f"the Linux loopback, GID {socket.inet_ntop(socket.AF_INET6, bytes(gid.raw))}")
        if port != ROCE_V2_PORT and args.port is None:
            say(f"  (UDP {ROCE_V2_PORT} is in use, by softrdma_lo's devd for another program "
                f"or a kernel rxe device: this demo took the free port {port})")
        for ep in (a, b):
            say(f"  endpoint {ep.name}: PD, MR of {len(ep.buf)} bytes (lkey 0x{ep.mr.lkey:x}, "
                f"rkey 0x{ep.mr.rkey:x}), CQ, RC QP 0x{ep.qp.qp_num:06x} (SQ PSN "
                f"0x{ep.psn:06x})")
        say(f"  connection: QP 0x{a.qp.qp_num:06x} <-> QP 0x{b.qp.qp_num:06x}, path MTU "
            f"{args.mtu}, {args.size} bytes per transfer "
            f"({-(-args.size // args.mtu)} packets)")
        say()
        demo = Demo(a, b, args.size, args.timeout)
        results: list[Result] = []
        for step in (demo.send_recv, demo.rdma_write, demo.rdma_read, demo.cmp_and_swp,
                     demo.fetch_and_add):
            res = step()
            results.append(res)
            say(res.line())
        say()
        for line in _counter_lines(ctx.counters()):
            say(line)
        failed = [r.op for r in results if not r.ok]
        say()
        if failed:
            say(f"FAILED: {len(failed)} of {len(results)} checks ({', '.join(failed)})")
            return 1
        say(f"OK: all {len(results)} checks passed")
        return 0
    finally:
        for ep in reversed(eps):
            ep.close()
        ctx.close()
