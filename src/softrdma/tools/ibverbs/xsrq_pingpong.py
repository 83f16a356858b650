"""``softrdma xsrq-pingpong``: ``ibv_xsrq_pingpong`` (rdma-core
``libibverbs/examples/xsrq_pingpong.c``): SENDs over XRC (IBA 9.8.5, Annex A14).

Each side opens the XRC domain of ``/tmp/xrc_domain`` (``O_CREAT``), one XRC SRQ with
its own receive CQ, and per client an XRC TGT QP (``IBV_QPT_XRC_RECV``) and an XRC INI
QP (``IBV_QPT_XRC_SEND``). Every SEND names the peer's SRQ in its XRCETH. Same flags
(``-p -d -i -s -m -c -n -l -e -o -g``), output and TCP exchange as the C tool, so a real
``ibv_xsrq_pingpong`` can be the other side: on port 18515 each side sends one 66-byte
``LID:RECV_QPN:SEND_QPN:PSN:SRQN:GID`` message (the client first), then the server
sends first; at the end each client sends ``END`` and the server answers it. On RoCE a
GID is needed (``-g``): without one the QPs cannot leave INIT and the tool says so as the
C tool does on rxe.

The server with ``-c N > 1`` sends to client *i* through the QPs of the other clients
too, which works only when all clients' processes share one XRC domain (the file's): on
a device shared through its devd they do (docs/design.md, "XRC domains across
processes"); on an in-process device (``SOFTRDMA_SHARED=0``) the server refuses ``-c``
above 1 and says why.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import stat
import sys
import time
from typing import TextIO

from ... import enums as e
from ... import verbs as v
from ...errors import SoftRdmaError
from .. import oobtcp
from .pingpong import (
    MTU_BYTES_TO_ENUM,
    PingPongError,
    local_gid,
    open_device,
)
from .srq_pingpong import add_server_client_arguments
from .xsrq_msg import MSG_SIZE, XDest, address_line, decode_xdest, encode_xdest

__all__ = ["MSG_SIZE", "XDest", "encode_xdest", "decode_xdest", "address_line",
           "add_arguments", "run"]  # the message codec lives in xsrq_msg

TERMINATION_MSG = b"END\x00"
ACK = "termination ack"
XRC_DOMAIN_FILE = "/tmp/xrc_domain"
_PSN_MASK = 0xFFFFFF
_RNR_TIMER = 12
_TIMEOUT = 14
_RETRY = 7
_HOP_LIMIT = 5
M = e.ibv_qp_attr_mask


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_server_client_arguments(p)
    p.add_argument("-c", "--clients", type=int, default=1,
                   help="number of clients (on server only, default 1)")
    p.add_argument("-n", "--num_tests", "--num-tests", dest="num_tests", type=int, default=5,
                   help="number of tests per client (default 5)")
    p.add_argument("-l", "--sl", type=int, default=0, help="service level value")
    p.add_argument("-e", "--events", action="store_true",
                   help="sleep on CQ events (default poll)")
    p.add_argument("-o", "--odp", action="store_true", help="use on demand paging")
    p.add_argument("-g", "--gid-idx", dest="gid_idx", type=int, default=None,
                   help="local port gid index (default: 0 on RoCE ports, which need a "
                   "GID; -1 sends none)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="give up after this many seconds without progress (softrdma "
                   "addition)")


class _XsrqPingpong:
    """``pp_init_ctx``, ``create_qps`` and ``connect_qps`` of xsrq_pingpong.c."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        n = args.clients
        self.ctx = open_device(args.ib_dev)
        self.fd = -1
        try:
            self.lid = self.ctx.query_port(args.ib_port).lid
            self.gid_idx, self.gid = local_gid(self.ctx, args.ib_port, args.gid_idx)
            self.buf = bytearray(args.size)
            self.channel = v.CompChannel(self.ctx) if args.events else None
            self.pd = v.PD(self.ctx)
            self.mr = v.MR(self.pd, 0, int(e.IBV_ACCESS_LOCAL_WRITE), buffer=self.buf)
            try:
                self.fd = os.open(XRC_DOMAIN_FILE, os.O_RDONLY | os.O_CREAT,
                                  stat.S_IRUSR | stat.S_IRGRP)
            except OSError as exc:
                print("Couldn't create the file for the XRC Domain but not stopping "
                      f"{exc.errno}", file=sys.stderr)
            try:
                self.xrcd = v.XRCD(self.ctx, self.fd, os.O_CREAT)
            except SoftRdmaError as exc:
                raise PingPongError(f"Couldn't Open the XRC Domain ({exc})") from exc
            if n > 1 and self.xrcd.shared is None:
                raise PingPongError(
                    f"-c {n}: the server sends to each client through every client's QP, "
                    "which needs all clients' processes to share one XRC domain "
                    f"({XRC_DOMAIN_FILE}); XRC domains are shared across processes only "
                    "on a device shared through its devd, not on this in-process one "
                    "(use -c 1, or unset SOFTRDMA_SHARED)")
            self.recv_cq = v.CQ(self.ctx, n, channel=self.channel)
            if self.channel is not None:
                self.recv_cq.req_notify()
            self.send_cq = v.CQ(self.ctx, n)
            self.srq = v.XrcSRQ(self.pd, self.xrcd, self.recv_cq,
                                v.SrqInitAttr(v.SrqAttr(max_wr=n, max_sge=1)))
            self.recv_qps: list[v.QP] = []
            self.send_qps: list[v.QP] = []
            init = v.QPAttr(port_num=args.ib_port)
            for i in range(n):
                try:
                    rq = v.QP(self.xrcd, v.QPInitAttr(int(e.IBV_QPT_XRC_RECV)))
                    rq.modify(v.QPAttr(qp_state=int(e.IBV_QPS_INIT), port_num=args.ib_port,
                                       qp_access_flags=int(e.IBV_ACCESS_REMOTE_WRITE
                                                           | e.IBV_ACCESS_REMOTE_READ)),
                              int(M.IBV_QP_STATE | M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT
                                  | M.IBV_QP_ACCESS_FLAGS))
                except SoftRdmaError as exc:
                    raise PingPongError(f"Couldn't create recv QP[{i}] ({exc})") from exc
                try:
                    sq = v.QP(self.pd, v.QPInitAttr(int(e.IBV_QPT_XRC_SEND), scq=self.send_cq,
                                                    cap=v.QPCap(n * args.num_tests, 0, 1, 0)))
                    sq.modify(init, int(M.IBV_QP_STATE | M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT
                                        | M.IBV_QP_ACCESS_FLAGS))
                except SoftRdmaError as exc:
                    raise PingPongError(f"Couldn't create send QP[{i}] ({exc})") from exc
                self.recv_qps.append(rq)
                self.send_qps.append(sq)
            self.by_qpn = {qp.qp_num: i for i, qp in enumerate(self.recv_qps)}
            self.rem: list[XDest | None] = [None] * n
            self.my_psn = [0] * n
            self.pp_cnt = [0] * n
            self.socks: list[socket.socket | None] = [None] * n
        except BaseException:
            self.close()
            raise

    def local_dest(self, i: int) -> XDest:
        gid = self.gid
        self.my_psn[i] = random.getrandbits(24) & _PSN_MASK
        return XDest(self.lid, self.recv_qps[i].qp_num, self.send_qps[i].qp_num,
                     self.my_psn[i], self.srq.srq_num, gid)

    def _ah(self, rem: XDest) -> v.AHAttr:
        a = self.args
        if any(rem.gid[8:]):  # the C tool looks at the GID's interface id
            return v.AHAttr(port_num=a.ib_port, is_global=1, dlid=rem.lid, sl=a.sl,
                            gr=v.GlobalRoute(dgid=rem.gid, sgid_index=max(self.gid_idx, 0),
                                             hop_limit=_HOP_LIMIT))
        return v.AHAttr(port_num=a.ib_port, is_global=0, dlid=rem.lid, sl=a.sl)

    def connect(self, i: int) -> None:
        rem = self.rem[i]
        assert rem is not None
        mtu = int(MTU_BYTES_TO_ENUM[self.args.mtu])
        rq, sq = self.recv_qps[i], self.send_qps[i]
        steps = (
            (rq, "recv", "RTR", v.QPAttr(qp_state=int(e.IBV_QPS_RTR), path_mtu=mtu,
                                         dest_qp_num=rem.send_qpn, rq_psn=rem.psn,
                                         min_rnr_timer=_RNR_TIMER, ah_attr=self._ah(rem)),
             M.IBV_QP_STATE | M.IBV_QP_AV | M.IBV_QP_PATH_MTU | M.IBV_QP_DEST_QPN
             | M.IBV_QP_RQ_PSN | M.IBV_QP_MAX_DEST_RD_ATOMIC | M.IBV_QP_MIN_RNR_TIMER),
            (rq, "recv", "RTS", v.QPAttr(qp_state=int(e.IBV_QPS_RTS), timeout=_TIMEOUT,
                                         sq_psn=self.my_psn[i]),
             M.IBV_QP_STATE | M.IBV_QP_TIMEOUT | M.IBV_QP_SQ_PSN),
            (sq, "send", "RTR", v.QPAttr(qp_state=int(e.IBV_QPS_RTR), path_mtu=mtu,
                                         dest_qp_num=rem.recv_qpn, rq_psn=rem.psn,
                                         ah_attr=self._ah(rem)),
             M.IBV_QP_STATE | M.IBV_QP_AV | M.IBV_QP_PATH_MTU | M.IBV_QP_DEST_QPN
             | M.IBV_QP_RQ_PSN),
            (sq, "send", "RTS", v.QPAttr(qp_state=int(e.IBV_QPS_RTS), timeout=_TIMEOUT,
                                         retry_cnt=_RETRY, rnr_retry=_RETRY,
                                         sq_psn=self.my_psn[i]),
             M.IBV_QP_STATE | M.IBV_QP_TIMEOUT | M.IBV_QP_SQ_PSN | M.IBV_QP_RETRY_CNT
             | M.IBV_QP_RNR_RETRY | M.IBV_QP_MAX_QP_RD_ATOMIC),
        )
        for qp, which, state, attr, mask in steps:
            try:
                qp.modify(attr, int(mask))
            except SoftRdmaError as exc:
                raise PingPongError(f"Failed to modify {which} QP[{i}] to {state} "
                                    f"({exc})") from exc

    def post_recv(self, cnt: int) -> None:
        wr = v.RecvWR(0, sg=[v.SGE(self.mr.addr, self.args.size, self.mr.lkey)])
        try:
            self.srq.post_recv([wr] * cnt)
        except SoftRdmaError as exc:
            raise PingPongError(f"Failed to post receive to SRQ ({exc})") from exc

    def post_send(self, index: int) -> None:
        """``pp_post_send``: to client ``index``'s SRQ, round robin over the send QPs;
        only the last send of a client is signaled."""
        n = self.args.clients
        rem = self.rem[index]
        assert rem is not None
        qpi = (index + self.pp_cnt[index]) % n
        self.pp_cnt[index] += 1
        flags = int(e.IBV_SEND_SIGNALED) if self.pp_cnt[index] >= self.args.num_tests else 0
        wr = v.SendWR(index, sg=[v.SGE(self.mr.addr, self.args.size, self.mr.lkey)],
                      send_flags=flags)
        wr.set_qp_type_xrc(rem.srqn)
        try:
            self.send_qps[qpi].post_send(wr)
        except SoftRdmaError as exc:
            raise PingPongError(f"Couldn't post send ({exc})") from exc

    def loop(self) -> None:
        a = self.args
        total = a.clients * a.num_tests
        cnt = 0
        deadline = time.monotonic() + a.timeout
        while cnt < total:
            if self.channel is not None:
                try:
                    self.channel.get_cq_event(timeout=max(0.0, deadline - time.monotonic()))
                except TimeoutError as exc:
                    raise PingPongError(f"no completion in {a.timeout:g} s") from exc
                self.recv_cq.ack_events(1)
                self.recv_cq.req_notify()
            while True:
                ne, wcs = self.recv_cq.poll(1)
                if not ne:
                    break
                wc = wcs[0]
                if wc.status != e.IBV_WC_SUCCESS:
                    raise PingPongError(f"Work completion error {int(wc.status)}")
                self.post_recv(ne)
                qpi = 0 if a.clients == 1 else self.by_qpn.get(wc.qp_num, 0)
                if self.pp_cnt[qpi] < a.num_tests:
                    self.post_send(qpi)
                cnt += ne
                deadline = time.monotonic() + a.timeout
            if time.monotonic() > deadline:
                raise PingPongError(f"no completion in {a.timeout:g} s")
        done = 0
        deadline = time.monotonic() + a.timeout
        while done < a.clients:
            ne, wcs = self.send_cq.poll(1)
            if ne and wcs[0].status != e.IBV_WC_SUCCESS:
                raise PingPongError(f"Work completion error {int(wcs[0].status)}")
            done += ne
            if not ne and time.monotonic() > deadline:
                raise PingPongError(f"no send completion in {a.timeout:g} s")

    def close(self) -> None:
        for s in getattr(self, "socks", []):
            if s is not None:
                s.close()
        self.ctx.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _recv_dest(pp: _XsrqPingpong, sock: socket.socket, i: int, deadline: float,
               out: TextIO) -> None:
    rem = decode_xdest(oobtcp.recv_exact(sock, MSG_SIZE, deadline, f"remote address [{i}]",
                                         PingPongError))
    print(address_line("remote", rem), file=out, flush=True)
    pp.rem[i] = rem
    pp.socks[i] = sock


def _send_dest(pp: _XsrqPingpong, sock: socket.socket, i: int, deadline: float,
               out: TextIO) -> None:
    mine = pp.local_dest(i)
    print(address_line("local", mine), file=out, flush=True)
    oobtcp.send_all(sock, encode_xdest(mine), deadline, "local address", PingPongError)


def _check(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 0xFFFF:
        raise PingPongError(f"bad port {args.port}")
    if args.size < 1 or args.ib_port < 1 or args.mtu not in MTU_BYTES_TO_ENUM:
        raise PingPongError("bad -s, -i or -m value (see --help)")
    if args.num_tests < 1:
        raise PingPongError(f"-n must be >= 1, got {args.num_tests}")
    if args.servername:
        args.clients = 1  # the C tool: a client always has one
    elif args.clients < 1:
        raise PingPongError(f"-c must be >= 1, got {args.clients}")
    if args.odp:
        raise PingPongError("The device isn't ODP capable or does not support XRC send, "
                            "receive and srq with ODP")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """The tool (``main`` of xsrq_pingpong.c); errors raise :class:`PingPongError`."""
    out = out if out is not None else sys.stdout
    _check(args)
    pp = _XsrqPingpong(args)
    try:
        pp.post_recv(args.clients)
        deadline = time.monotonic() + args.timeout
        if args.servername:
            sock = oobtcp.connect(args.servername, args.port, deadline, PingPongError)
            pp.socks[0] = sock
            _send_dest(pp, sock, 0, deadline, out)
            _recv_dest(pp, sock, 0, deadline, out)
            pp.connect(0)
        else:
            with oobtcp.listen(args.port, PingPongError, backlog=args.clients) as lst:
                for i in range(args.clients):
                    conn = oobtcp.accept(lst, PingPongError, deadline=deadline)
                    _recv_dest(pp, conn, i, deadline, out)
                    _send_dest(pp, conn, i, deadline, out)
                    pp.connect(i)
            for i in range(args.clients):
                pp.post_send(i)
        pp.loop()
        deadline = time.monotonic() + args.timeout
        socks = [s for s in pp.socks if s is not None]
        if args.servername:
            oobtcp.send_all(socks[0], TERMINATION_MSG, deadline, ACK, PingPongError)
            ack = [oobtcp.recv_exact(socks[0], len(TERMINATION_MSG), deadline, ACK,
                                     PingPongError)]
        else:
            ack = [oobtcp.recv_exact(s, len(TERMINATION_MSG), deadline, ACK, PingPongError)
                   for s in socks]
            for s in socks:
                oobtcp.send_all(s, TERMINATION_MSG, deadline, ACK, PingPongError)
        if any(m.split(b"\x00", 1)[0] != TERMINATION_MSG[:3] for m in ack):
            raise PingPongError("Invalid termination ack was accepted")
    finally:
        pp.close()
    print("success", file=out, flush=True)
    return 0
