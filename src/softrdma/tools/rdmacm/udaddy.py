"""``softrdma udaddy``: rdma-core's ``udaddy`` (librdmacm/examples/udaddy.c) on the
rdma_cm API, UD QPs resolved through SIDR.

The client resolves the server's address, creates a UD QP (the rdma_cm moves it to RTS
with Q_Key 0x01234567, as librdmacm does for ``RDMA_PS_UDP``) and "connects": a SIDR_REQ
(IBA 12.11) to the A11 Service ID ``0x0000000001 11 <port>`` (IBA Annex A11 Table 2,
UDP) carrying the A11 IP CM header; the server's SIDR_REP gives the UD QPN and Q_Key,
and the ESTABLISHED event the address handle attributes. The client then sends
``message_count`` SEND-with-immediate messages of ``message_size`` bytes (the immediate
is its own QPN, big-endian, as udaddy's ``htobe32(qp_num)``); the server, which posted
its receives before answering, builds its reply address handle from the first
completion's GRH area (``ibv_create_ah_from_wc``; RoCEv2 IPv4: the IPv4 header in the
last 20 of its 40 bytes) and the immediate, and sends as many replies back.

Flags as udaddy: ``-s`` server address (client mode), ``-b`` bind address, ``-c``
connections, ``-C`` message count, ``-S`` message size, ``-t`` TOS, ``-f`` address
format, ``-P udp|ipoib`` / ``-p 0x111`` the port space. udaddy's service port is 7174
(fixed in the C tool; ``--port`` changes it here). Output lines as udaddy's, on stdout.
"""

from __future__ import annotations

import argparse
import errno
import sys
from typing import Any

from ... import enums as e
from ... import verbs as v
from ...cm import rdma_cm as rc
from ...errors import InvalidArgument
from ...wire.gid import ip_to_gid
from .cmargs import UDADDY_PORT
from .cmtest import GRH_LEN, CmTest, Node, check_common, run_test

__all__ = ["run", "UDADDY_PORT", "ah_attr_from_grh"]

IPV4_IN_GRH = 20  # RoCEv2 over IPv4: the IPv4 header fills the last 20 bytes of the GRH
IPV4_SRC = slice(IPV4_IN_GRH + 12, IPV4_IN_GRH + 16)
IPV4_DST = slice(IPV4_IN_GRH + 16, IPV4_IN_GRH + 20)
IPV6_SGID = slice(8, 24)
IPV6_DGID = slice(24, 40)
REPLY_HOP_LIMIT = 64


def ah_attr_from_grh(grh: bytes, gids: list[bytes]) -> v.AHAttr:
    """``ibv_init_ah_from_wc`` for a RoCEv2 UD receive: reply to the GRH area's source,
    from the local GID it was sent to (IBA 11.4.1.1; rxe's ``rxe_init_av_from_wc`` layout:
    IPv4 header in bytes 20-39, else the IPv6 header)."""
    if len(grh) < GRH_LEN:
        raise InvalidArgument("grh", f"need the {GRH_LEN}-byte GRH area, got {len(grh)}")
    if grh[IPV4_IN_GRH] >> 4 == 4:
        dgid, sgid = ip_to_gid(grh[IPV4_SRC]), ip_to_gid(grh[IPV4_DST])
    else:
        dgid, sgid = bytes(grh[IPV6_SGID]), bytes(grh[IPV6_DGID])
    idx = gids.index(sgid) if sgid in gids else 0
    return v.AHAttr(gr=v.GlobalRoute(dgid=dgid, sgid_index=idx, hop_limit=REPLY_HOP_LIMIT),
                    is_global=1, port_num=1)


class Udaddy(CmTest):
    """The udaddy test (``struct cmatest`` + udaddy.c's handlers)."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__("udaddy", args, rc.RDMA_PS_UDP)
        self.recv_extra = GRH_LEN
        self.bufs: dict[int, Any] = {}

    # ---- rdma_cm events ---------------------------------------------------------------
    def route_handler(self, node: Node) -> int:
        ret = self.verify_test_params(node) or self.init_ud_node(node)
        if ret:
            self.connect_error()
            return ret
        self.post_recvs(node)
        assert node.cma_id is not None
        node.cma_id.connect(rc.ConnParam())
        return 0

    def connect_handler(self, cid: rc.CmId) -> int:
        node = self.take_node(cid)
        if node is None:
            return -errno.ENOMEM
        ret = self.verify_test_params(node) or self.init_ud_node(node)
        if ret:
            node.cma_id = None
            self.connect_error()
            self.say("udaddy: failing connection request")
            cid.reject()
            return ret
        self.post_recvs(node)
        cid.accept(rc.ConnParam(qp_num=cid.qp.qp_num))
        node.connected = True
        self.connects_left -= 1
        return 0

    def established(self, ev: rc.RdmaCmEvent) -> int:
        return self.take_ud(ev.id.context, ev.ud)

    # ---- completions ------------------------------------------------------------------
    def create_reply_ah(self, node: Node, wc: Any) -> None:
        """``create_reply_ah``: the AH from the first receive's GRH area, the remote QPN
        from its immediate data, the Q_Key our own."""
        if node.ah is not None:
            return
        assert node.cma_id is not None
        grh = node.mr.read(GRH_LEN, 0)
        gids = [bytes(g) for g in node.cma_id.verbs.port.gids]
        node.ah = v.AH(node.pd, ah_attr_from_grh(grh, gids))
        node.remote_qpn = int(wc.imm_data)
        attr, _init = node.cma_id.qp.query(e.IBV_QP_QKEY)
        node.remote_qkey = int(attr.qkey)

    def poll_cqs(self) -> int:
        for node in self.nodes:
            if not node.connected:
                continue
            ret = self.poll_cq(node, node.cqs[0], self.message_count, self.create_reply_ah)
            if ret:
                return ret
        return 0

    # ---- the two roles ----------------------------------------------------------------
    def run_server(self) -> int:
        self.say("udaddy: starting server")
        listen_id = rc.CmId(self.channel, self.ps, context=self)
        try:
            ret = self.listen(listen_id, self.args.device or "roce", "udaddy")
            if ret:
                return ret
            ret = self.run_events(lambda: self.connects_left > 0, "a client")
            self.patient = False
            if ret:
                return ret
            if self.message_count:
                ret = self.receive_ud(self.poll_cqs)
                if ret:
                    return ret
                self.post_ud_sends_all("sending replies", int(e.IBV_SEND_SIGNALED))
                ret = self.poll_cqs()
                if ret:
                    return ret
                self.say("data transfers complete")
            return 0
        finally:
            listen_id.destroy()

    def run_client(self) -> int:
        self.say("udaddy: starting client")
        ret = self.resolve_all(self.args.device or "roce")
        if ret:
            return ret
        ret = self.run_events(lambda: self.connects_left > 0, "the server's SIDR_REP")
        if ret:
            return ret
        if self.message_count:
            self.post_ud_sends_all("initiating data transfers")
            ret = self.receive_ud(self.poll_cqs)
            if ret:
                return ret
            self.say("data transfers complete")
        return 0


def _check(args: argparse.Namespace) -> None:
    ps = rc.RDMA_PS_UDP
    if args.port_space is not None:
        try:
            ps = int(args.port_space, 0)
        except ValueError:
            raise InvalidArgument("-p", f"not a port space number: {args.port_space!r}") \
                from None
    if args.port_space_name is not None:
        name = args.port_space_name.lower()
        if name.startswith("ipoib"):
            ps = rc.RDMA_PS_IPOIB
        elif not name.startswith("udp"):
            print("Warning: unknown port space format", file=sys.stderr)
    if ps == rc.RDMA_PS_IPOIB:
        raise InvalidArgument("-P", "the IPoIB port space needs an InfiniBand port; "
                                    "softrdma's UD service is RDMA_PS_UDP")
    if ps != rc.RDMA_PS_UDP:
        raise InvalidArgument("-p", f"port space {ps:#x} is not a UD port space "
                                    f"({rc.RDMA_PS_UDP:#x} for UDP)")
    check_common(args, port_flag="--port")


def run(args: argparse.Namespace) -> int:
    """``softrdma udaddy``: exit status 0 when every message went both ways."""
    _check(args)
    return run_test(Udaddy(args))
