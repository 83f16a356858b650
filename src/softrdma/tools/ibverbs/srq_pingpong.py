"""``softrdma srq-pingpong``: ``ibv_srq_pingpong`` (rdma-core
``libibverbs/examples/srq_pingpong.c``): ``-q`` RC QPs (default 16) that share one
SRQ of ``-r`` receives (default 500) and one CQ, ping-ponging ``-s``-byte SENDs.

Same flags (``-p -d -i -s -m -q -r -n -l -e -g``), output and out-of-band exchange as
the C tool, so a real ``ibv_srq_pingpong`` can be the other side: on TCP port 18515 the
client sends 256 (``MAX_QP``) ``LID:QPN:PSN:GID`` messages of 52 bytes (unused QPs as
zeros), the server connects its QPs, answers with its 256 and reads ``done``. Counting
follows the C tool: ``-n`` sends and receives in all (any QP), each QP sending again once
both its send and its receive completed. On RoCE a GID is needed (``-g``); without one
the QPs cannot leave INIT, and the tool says so as ibv_srq_pingpong does on rxe.
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import time
from typing import TextIO

from ... import enums as e
from ... import verbs as v
from ...errors import SoftRdmaError
from .. import oobtcp
from ..waiting import announce_wait
from .pingpong import (
    DEFAULT_TCP_PORT,
    DONE_MSG,
    MSG_LEN,
    MTU_BYTES_TO_ENUM,
    Dest,
    PingPongError,
    address_line,
    decode_dest,
    encode_dest,
    local_gid,
    open_device,
    result_lines,
)

__all__ = ["MAX_QP", "add_arguments", "run", "exchange_client", "exchange_server"]

MAX_QP = 256  # srq_pingpong.c: the exchange always carries this many addresses
RECV_WRID = 1
SEND_WRID = 2
_ZERO = Dest(0, 0, 0, bytes(16))
_RNR_TIMER = 12
_TIMEOUT = 14
_RETRY = 7
_PSN_MASK = 0xFFFFFF


def add_server_client_arguments(p: argparse.ArgumentParser) -> None:
    """The options ibv_srq_pingpong and ibv_xsrq_pingpong share: the server name, the TCP
    port, the device and its port, the message size and the path MTU."""
    p.add_argument("servername", nargs="?", default=None,
                   help="connect to the server at this host (none: be the server)")
    p.add_argument("-p", "--port", type=int, default=DEFAULT_TCP_PORT,
                   help=f"listen on/connect to port (default {DEFAULT_TCP_PORT})")
    p.add_argument("-d", "--ib-dev", dest="ib_dev", default=None,
                   help="use IB device (default first device found)")
    p.add_argument("-i", "--ib-port", dest="ib_port", type=int, default=1,
                   help="use port of IB device (default 1)")
    p.add_argument("-s", "--size", type=int, default=4096,
                   help="size of message to exchange (default 4096)")
    p.add_argument("-m", "--mtu", type=int, default=1024, help="path MTU (default 1024)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_server_client_arguments(p)
    p.add_argument("-q", "--num-qp", dest="num_qp", type=int, default=16,
                   help="number of QPs to use (default 16)")
    p.add_argument("-r", "--rx-depth", dest="rx_depth", type=int, default=500,
                   help="number of receives to post at a time (default 500)")
    p.add_argument("-n", "--iters", type=int, default=1000,
                   help="number of exchanges (default 1000)")
    p.add_argument("-l", "--sl", type=int, default=0, help="service level value")
    p.add_argument("-e", "--events", action="store_true",
                   help="sleep on CQ events (default poll)")
    p.add_argument("-g", "--gid-idx", dest="gid_idx", type=int, default=None,
                   help="local port gid index (default: 0 on RoCE ports, which need a "
                   "GID; -1 sends none)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="give up on the exchange after this many seconds (softrdma addition)")


def _messages(dests: list[Dest]) -> bytes:
    return b"".join(encode_dest(d) for d in dests + [_ZERO] * (MAX_QP - len(dests)))


def _read_dests(sock: socket.socket, deadline: float) -> list[Dest]:
    return [decode_dest(oobtcp.recv_exact(sock, MSG_LEN, deadline, f"remote address [{i}]",
                                          PingPongError))
            for i in range(MAX_QP)]


def exchange_client(host: str, port: int, mine: list[Dest], timeout: float) -> list[Dest]:
    """``pp_client_exch_dest``: send our 256 addresses, read the server's, send done."""
    deadline = time.monotonic() + timeout
    with oobtcp.connect(host, port, deadline, PingPongError) as sock:
        oobtcp.send_all(sock, _messages(mine), deadline, "local address", PingPongError)
        rem = _read_dests(sock, deadline)
        oobtcp.send_all(sock, DONE_MSG, deadline, "\"done\"", PingPongError)
    return rem


def exchange_server(port: int, mine: list[Dest], connect: object, timeout: float) -> list[Dest]:
    """``pp_server_exch_dest``: accept one client, read its 256 addresses, connect the
    QPs (``connect(rem)``), answer with ours, read done."""
    with oobtcp.listen(port, PingPongError) as lst:
        announce_wait("srq-pingpong", port)
        conn = oobtcp.accept(lst, PingPongError)  # awaited until stopped (tools.waiting)
    deadline = time.monotonic() + timeout
    with conn:
        rem = _read_dests(conn, deadline)
        connect(rem)  # type: ignore[operator]
        oobtcp.send_all(conn, _messages(mine), deadline, "local address", PingPongError)
        done = oobtcp.recv_exact(conn, len(DONE_MSG), deadline, "\"done\"", PingPongError)
        if done != DONE_MSG:
            raise PingPongError("peer did not answer \"done\"")
    return rem


class _Pingpong:
    """The resources of ``pp_init_ctx`` and the QP connection of ``pp_connect_ctx``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ctx = open_device(args.ib_dev)
        try:
            self.gid_idx, self.gid = local_gid(self.ctx, args.ib_port, args.gid_idx)
        except PingPongError:
            self.ctx.close()
            raise
        self.channel = v.CompChannel(self.ctx) if args.events else None
        self.pd = v.PD(self.ctx)
        self.buf = bytearray(args.size)
        self.mr = v.MR(self.pd, 0, int(e.IBV_ACCESS_LOCAL_WRITE), buffer=self.buf)
        self.cq = v.CQ(self.ctx, args.rx_depth + args.num_qp, channel=self.channel)
        self.srq = v.SRQ(self.pd, v.SrqInitAttr(v.SrqAttr(max_wr=args.rx_depth, max_sge=1)))
        self.qps: list[v.QP] = []
        for _ in range(args.num_qp):
            qp = v.QP(self.pd, v.QPInitAttr(int(e.IBV_QPT_RC), scq=self.cq, rcq=self.cq,
                                            srq=self.srq, cap=v.QPCap(1, 0, 1, 0, 0)))
            qp.to_init(v.QPAttr(port_num=args.ib_port))
            self.qps.append(qp)
        self.by_qpn = {qp.qp_num: i for i, qp in enumerate(self.qps)}
        self.routs = 0

    def post_failed(self) -> PingPongError:
        """``Couldn't post receive (N)``, or why the device failed when it did (its
        devd died)."""
        fatal = getattr(self.ctx.runtime, "fatal", None)
        if fatal is not None:
            return PingPongError(str(fatal))
        return PingPongError(f"Couldn't post receive ({self.routs})")

    def post_recv(self, n: int) -> int:
        wr = v.RecvWR(RECV_WRID, sg=[v.SGE(self.mr.addr, self.args.size, self.mr.lkey)])
        for i in range(n):
            try:
                self.srq.post_recv(wr)
            except SoftRdmaError:
                return i
        return n

    def post_send(self, i: int) -> None:
        self.qps[i].post_send(v.SendWR(SEND_WRID, sg=[v.SGE(self.mr.addr, self.args.size,
                                                            self.mr.lkey)]))

    def my_dests(self) -> list[Dest]:
        a = self.args
        lid = self.ctx.query_port(a.ib_port).lid
        return [Dest(lid, qp.qp_num, random.getrandbits(24) & _PSN_MASK, self.gid)
                for qp in self.qps]

    def connect(self, mine: list[Dest], rem: list[Dest]) -> None:
        a = self.args
        mtu = int(MTU_BYTES_TO_ENUM[a.mtu])
        glob = any(rem[0].gid[8:])  # srq_pingpong.c looks at dest->gid's interface id
        for i, qp in enumerate(self.qps):
            attr = v.QPAttr(qp_state=int(e.IBV_QPS_RTR), path_mtu=mtu, port_num=a.ib_port)
            attr.dest_qp_num = rem[i].qpn
            attr.rq_psn = rem[i].psn
            attr.max_dest_rd_atomic = 1
            attr.min_rnr_timer = _RNR_TIMER
            gr = (v.GlobalRoute(dgid=rem[0].gid, sgid_index=max(self.gid_idx, 0), hop_limit=1)
                  if glob else None)
            attr.ah_attr = v.AHAttr(port_num=a.ib_port, is_global=int(glob), gr=gr,
                                    dlid=rem[i].lid, sl=a.sl)
            try:
                qp.to_rtr(attr)
            except SoftRdmaError as exc:
                raise PingPongError(f"Failed to modify QP[{i}] to RTR ({exc})") from exc
            attr.qp_state = int(e.IBV_QPS_RTS)
            attr.timeout = _TIMEOUT
            attr.retry_cnt = _RETRY
            attr.rnr_retry = _RETRY
            attr.sq_psn = mine[i].psn
            attr.max_rd_atomic = 1
            try:
                qp.to_rts(attr)
            except SoftRdmaError as exc:
                raise PingPongError(f"Failed to modify QP[{i}] to RTS ({exc})") from exc

    def loop(self, client: bool) -> float:
        a = self.args
        n = a.num_qp
        pending = [0] * n
        if client:
            for i in range(n):
                self.post_send(i)
                pending[i] = SEND_WRID | RECV_WRID
        else:
            pending = [RECV_WRID] * n
        start = time.monotonic()
        rcnt = scnt = 0
        num_wc = n + a.rx_depth
        while rcnt < a.iters or scnt < a.iters:
            if self.channel is not None:
                self.channel.get_cq_event(timeout=a.timeout)
                self.cq.ack_events(1)
                self.cq.req_notify()
            ne, wcs = self.cq.poll(num_wc)
            for wc in wcs[:ne]:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise PingPongError(f"Failed status {v.wc_status_str(wc.status)} "
                                        f"({int(wc.status)}) for wr_id {wc.wr_id}")
                qi = self.by_qpn.get(wc.qp_num)
                if qi is None:
                    raise PingPongError(f"Couldn't find QPN {wc.qp_num:06x}")
                if wc.wr_id == SEND_WRID:
                    scnt += 1
                elif wc.wr_id == RECV_WRID:
                    self.routs -= 1
                    if self.routs <= n:
                        self.routs += self.post_recv(a.rx_depth - self.routs)
                        if self.routs < a.rx_depth:
                            raise self.post_failed()
                    rcnt += 1
                else:
                    raise PingPongError(f"Completion for unknown wr_id {wc.wr_id}")
                pending[qi] &= ~wc.wr_id
                if scnt < a.iters and not pending[qi]:
                    self.post_send(qi)
                    pending[qi] = RECV_WRID | SEND_WRID
        return (time.monotonic() - start) * 1e6

    def close(self) -> None:
        self.ctx.close()


def _check(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 0xFFFF:
        raise PingPongError(f"bad port {args.port}")
    if args.size < 1 or args.ib_port < 1 or args.mtu not in MTU_BYTES_TO_ENUM:
        raise PingPongError("bad -s, -i or -m value (see --help)")
    if not 0 < args.num_qp <= MAX_QP:
        raise PingPongError(f"-q must be 1..{MAX_QP}, got {args.num_qp}")
    if args.num_qp > args.rx_depth:
        raise PingPongError(f"rx_depth {args.rx_depth} is too small for {args.num_qp} QPs -- "
                            "must have at least one receive per QP.")
    if args.iters < 1:
        raise PingPongError(f"-n must be >= 1, got {args.iters}")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """The tool (``main`` of srq_pingpong.c); errors raise :class:`PingPongError`."""
    out = out if out is not None else sys.stdout
    _check(args)
    pp = _Pingpong(args)
    try:
        pp.routs = pp.post_recv(args.rx_depth)
        if pp.routs < args.rx_depth:
            raise pp.post_failed()
        if pp.channel is not None:
            pp.cq.req_notify()
        mine = pp.my_dests()
        for d in mine:
            print(address_line("local", d, "rc"), file=out, flush=True)
        if args.servername:
            rem = exchange_client(args.servername, args.port, mine, args.timeout)
        else:
            rem = exchange_server(args.port, mine, lambda r: pp.connect(mine, r), args.timeout)
        for d in rem[:args.num_qp]:
            print(address_line("remote", d, "rc"), file=out, flush=True)
        if args.servername:
            pp.connect(mine, rem)
        usec = pp.loop(bool(args.servername))
        for line in result_lines(args.size, args.iters, usec):
            print(line, file=out, flush=True)
    finally:
        pp.close()
    return 0
