"""``softrdma rdma-xserver`` / ``softrdma rdma-xclient``: librdmacm's ``rdma_xserver.c``
and ``rdma_xclient.c`` examples, RC or XRC through rdma_cm (``-c r`` / ``-c x``).

One 16-byte SEND from the client to the server, over synchronous ids
(:class:`~.rdma_server.Endpoint`):

* ``-c r`` (the default): ``RDMA_PS_TCP`` ids with RC QPs. The server posts a receive,
  accepts and waits for the message; the client connects and sends it inline.
* ``-c x``: ``RDMA_PS_IB`` ids of type ``IBV_QPT_XRC_RECV`` (server) and
  ``IBV_QPT_XRC_SEND`` (client). The server accepts with an XRC TGT QP and an XRC SRQ of
  one receive, both on an XRC domain of the device, and sends the SRQ's number (4 bytes,
  big-endian) in the accept's private data. The client's SEND names that SRQ in its
  XRCETH (IBA Annex A14); the message completes on the SRQ's CQ with the TGT QP's number.

Both then disconnect. Output as the C examples: ``rdma_xserver: start`` /
``rdma_xserver: end N`` on stdout, a failing call as ``perror`` prints it on stderr; the
server also says once, on stderr, that it waits for a client and waits until stopped.
The server listens on every address (the C example has no address flag). Completions
are checked (the C examples only count them).
"""

from __future__ import annotations

import argparse
import errno
import sys
from typing import Any

from ... import enums as e
from ... import verbs as v
from ...cm import rdma_cm as rc
from .rdma_server import (
    ANY_V4,
    MSG_SIZE,
    Endpoint,
    RdmaError,
    check_timeout,
    failing_as,
    getaddrinfo,
    run_example,
)

__all__ = ["run"]

XRC_SEND, XRC_RECV = int(e.IBV_QPT_XRC_SEND), int(e.IBV_QPT_XRC_RECV)
RC = int(e.IBV_QPT_RC)
T = rc.RdmaCmEventType


def _server(args: argparse.Namespace, xrc: bool) -> None:
    addr = getaddrinfo(ANY_V4, args.port, passive=True)
    ps, qpt = (rc.RDMA_PS_IB, XRC_RECV) if xrc else (rc.RDMA_PS_TCP, RC)
    listen = Endpoint.create(addr, passive=True, init_attr=v.QPInitAttr(qp_type=qpt),
                             device=args.device, timeout=args.timeout, ps=ps, qp_type=qpt)
    extra: list[Any] = []  # the XRC SRQ and domain, closed before the endpoint's objects
    try:
        listen.listen(0)
        port = listen.id.local_addr[1] if listen.id.local_addr else addr[1]
        print(f"rdma_xserver: waiting for a client on {port}", file=sys.stderr, flush=True)
        ev = listen.wait(T.CONNECT_REQUEST, "rdma_get_request", forever=True)
        ep = Endpoint(ev.id, None, args.timeout)
        try:
            ctx = ep.id.verbs
            ep.pd = v.PD(ctx)
            ep.rcq = v.CQ(ctx, 1)
            mr = ep.reg_msgs(MSG_SIZE)
            wr = v.RecvWR(0, 1, [v.SGE(mr.addr, MSG_SIZE, mr.lkey)])
            private = b""
            with failing_as("rdma_accept"):
                if xrc:  # create_srq: an XRC SRQ of one receive on the TGT QP's domain
                    xrcd = v.XRCD(ctx)
                    srq = v.XrcSRQ(ep.pd, xrcd, ep.rcq, v.SrqInitAttr(v.SrqAttr(1, 1)))
                    extra += [srq, xrcd]
                    ep.id.create_qp(None, v.QPInitAttr(qp_type=XRC_RECV), xrcd=xrcd)
                    srq.post_recv(wr)
                    private = srq.srq_num.to_bytes(4, "big")
                else:
                    ep.scq = v.CQ(ctx, 1)
                    ep.id.create_qp(ep.pd, v.QPInitAttr(qp_type=RC, scq=ep.scq, rcq=ep.rcq,
                                                        cap=v.QPCap(1, 1, 1, 1)))
                    ep.id.qp.post_recv(wr)
                ep.id.accept(rc.ConnParam(private_data=private))
            ep.wait(T.ESTABLISHED, "rdma_accept")
            ep.get_comp(ep.rcq, "rdma_get_recv_comp")
            ep.disconnect()
        finally:
            ep.id.destroy_qp()
            for obj in extra:
                obj.close()
            ep.destroy()
    finally:
        listen.destroy()


def _client(args: argparse.Namespace, xrc: bool) -> None:
    addr = getaddrinfo(args.server, args.port, passive=False)
    ps, qpt = (rc.RDMA_PS_IB, XRC_SEND) if xrc else (rc.RDMA_PS_TCP, RC)
    # an XRC INI QP has no receive queue (rdma_xclient asks for none)
    cap = v.QPCap(1, 0, 1, 0) if xrc else v.QPCap(1, 1, 1, 1)
    ep = Endpoint.create(addr, passive=False, init_attr=v.QPInitAttr(
        qp_type=qpt, cap=cap, sq_sig_all=1), device=args.device, timeout=args.timeout,
        ps=ps, qp_type=qpt)
    try:
        with failing_as("rdma_connect"):
            ep.id.connect(rc.ConnParam())
        est = ep.wait(T.ESTABLISHED, "rdma_connect")
        # post_send: 16 bytes inline (lkey 0), naming the server's SRQ over XRC
        wr = v.SendWR(0, None, 0, [], e.IBV_WR_SEND, int(e.IBV_SEND_INLINE))
        wr.set_inline_data(bytes(MSG_SIZE))
        if xrc:
            data = bytes(est.private_data or b"")
            if len(data) < 4:
                raise RdmaError("post_send", errno.EPROTO, "the server's accept named no "
                                                           "XRC SRQ")
            wr.set_qp_type_xrc(int.from_bytes(data[:4], "big"))
        with failing_as("rdma_post_send"):
            ep.id.qp.post_send(wr)
        ep.get_comp(ep.scq, "rdma_get_send_comp")
        ep.disconnect()
    finally:
        ep.destroy()


def run(tool: str, args: argparse.Namespace) -> int:
    """``softrdma rdma-xserver`` / ``rdma-xclient``: exit status 0 when the message went
    across, 1 otherwise (``end N`` prints the C examples' return value)."""
    check_timeout(args)
    mode = (args.comm_type or "r")[:1].lower()
    if mode not in ("r", "x"):  # the C examples' usage text, exit 1
        print(f"usage: {tool.replace('-', '_')}", flush=True)
        print("\t[-p port_number]" if tool == "rdma-xserver"
              else "\t[-s server_address]\n\t[-p port_number]", flush=True)
        print("\t[-c communication type]\n\t    r - RC: reliable-connected (default)\n"
              "\t    x - XRC: extended-reliable-connected", flush=True)
        return 1
    return run_example(tool, lambda: (_server if tool == "rdma-xserver" else _client)(
        args, mode == "x"))
