"""``softrdma ucmatose``: rdma-core's ``ucmatose`` (librdmacm/examples/cmatose.c) on the
rdma_cm API, RC connections over RoCE (IB CM + Annex A11) or iWARP (TCP + MPA).

Each connection has an RC QP with ``sq_sig_all`` and separate send and receive CQs of
``message_count`` entries; both sides post their ``message_count`` receives before
connecting/accepting (``responder_resources`` and ``initiator_depth`` 1, ``retry_count``
5). Once every connection is ESTABLISHED the server sends ``message_count`` messages of
``message_size`` bytes on each, waits for their completions, then for as many messages
from the client, and disconnects; the client receives, sends its replies and waits for
the server's DREQ (``disconnect_events``). ``-m`` moves the ids to a new event channel
after the transfers (``rdma_migrate_id``).

Flags as ucmatose: ``-s`` server address (client mode), ``-b`` bind address, ``-p``
port (7471), ``-c`` connections, ``-C`` message count (10), ``-S`` message size (100),
``-t`` TOS, ``-a`` ACK timeout, ``-m`` migrate, ``-P tcp`` port space, ``-f`` address
format. Output lines as ucmatose's (``cmatose: starting server`` ... ``return status
0``), on stdout. Checked against a capture of ucmatose
between rxe hosts.
"""

from __future__ import annotations

import argparse
import errno
import sys

from ... import enums as e
from ... import verbs as v
from ...cm import rdma_cm as rc
from ...errors import InvalidArgument, SoftRdmaError
from .cmargs import CMATOSE_PORT
from .cmtest import CmTest, Node, check_common, run_test

__all__ = ["run", "CMATOSE_PORT"]

SEND_CQ, RECV_CQ = 0, 1
CMATOSE_RETRY_COUNT = 5


class Cmatose(CmTest):
    """The cmatose test (``struct cmatest`` + cmatose.c's handlers)."""

    def __init__(self, args: argparse.Namespace) -> None:
        ib = (args.port_space_name or "").lower().startswith("ib")  # -P ib: RDMA_PS_IB
        super().__init__("cmatose", args, rc.RDMA_PS_IB if ib else rc.RDMA_PS_TCP)
        self.prefer = args.device or args.transport

    # ---- node setup -------------------------------------------------------------------
    def init_node(self, node: Node) -> None:
        cid = node.cma_id
        assert cid is not None
        node.pd = v.PD(cid.verbs)
        cqe = self.message_count or 1
        node.cqs = [v.CQ(cid.verbs, cqe), v.CQ(cid.verbs, cqe)]
        attr = v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=node.cqs[SEND_CQ],
                            rcq=node.cqs[RECV_CQ], cap=v.QPCap(cqe, cqe, 1, 1), sq_sig_all=1)
        cid.create_qp(node.pd, attr)
        if self.message_count:
            node.mr = v.MR(node.pd, self.message_size, int(e.IBV_ACCESS_LOCAL_WRITE))

    def post_sends(self, node: Node) -> None:
        if not node.connected or not self.message_count:
            return
        assert node.cma_id is not None
        mr = node.mr
        for _ in range(self.message_count):
            node.cma_id.qp.post_send(v.SendWR(node.id, None, 1, [
                v.SGE(mr.addr, self.message_size, mr.lkey)], e.IBV_WR_SEND, 0))

    # ---- rdma_cm events ---------------------------------------------------------------
    def route_handler(self, node: Node) -> int:
        assert node.cma_id is not None
        try:
            self.init_node(node)
            self.post_recvs(node)
            node.cma_id.connect(rc.ConnParam(responder_resources=1, initiator_depth=1,
                                             retry_count=CMATOSE_RETRY_COUNT))
        except SoftRdmaError as exc:
            self.say(f"cmatose: failure connecting: {exc}")
            self.connect_error()
            return -(exc.errno or errno.EINVAL)
        return 0

    def connect_handler(self, cid: rc.CmId) -> int:
        node = self.take_node(cid)
        if node is None:
            return -errno.ENOMEM
        try:
            self.init_node(node)
            self.post_recvs(node)
            cid.accept(None)
        except SoftRdmaError as exc:
            self.say(f"cmatose: failure accepting: {exc}")
            node.cma_id = None
            self.connect_error()
            self.say("cmatose: failing connection request")
            cid.reject()
            return -(exc.errno or errno.EINVAL)
        return 0

    def established(self, ev: rc.RdmaCmEvent) -> int:
        ev.id.context.connected = True
        self.connects_left -= 1
        self.disconnects_left += 1
        return 0

    def disconnected(self, cid: rc.CmId) -> int:
        try:
            cid.disconnect()
        except SoftRdmaError:
            pass  # the peer's DREQ already closed it (our DREP went out)
        self.disconnects_left -= 1
        return 0

    def poll_cqs(self, index: int) -> int:
        for node in self.nodes:
            if not node.connected:
                continue
            ret = self.poll_cq(node, node.cqs[index], self.message_count)
            if ret:
                return ret
        return 0

    def migrate_channel(self, listen_id: rc.CmId | None) -> int:
        """``migrate_channel``: every id to a new event channel."""
        self.say("migrating to new event channel")
        channel = rc.EventChannel()
        ids = [listen_id] if listen_id is not None else []
        ids += [n.cma_id for n in self.nodes if n.cma_id is not None]
        for cid in ids:
            cid.migrate(channel)
        self.channel.close()
        self.channel = channel
        return 0

    # ---- the two roles ----------------------------------------------------------------
    def run_server(self) -> int:
        self.say("cmatose: starting server")
        listen_id = rc.CmId(self.channel, self.ps, context=self)
        try:
            ret = self.listen(listen_id, self.prefer, "ucmatose")
            if ret:
                return ret
            ret = self.run_events(self._first_then_all, "the clients")
            self.patient = False
            if ret:
                return ret
            if self.message_count:
                self.say("initiating data transfers")
                for node in self.nodes:
                    self.post_sends(node)
                self.say("completing sends")
                ret = self.poll_cqs(SEND_CQ)
                if ret:
                    return ret
                self.say("receiving data transfers")
                ret = self.poll_cqs(RECV_CQ)
                if ret:
                    return ret
                self.say("data transfers complete")
            if self.args.migrate:
                self.migrate_channel(listen_id)
            self.say("cmatose: disconnecting")
            for node in self.nodes:
                if not node.connected or node.cma_id is None:
                    continue
                node.connected = False
                try:
                    node.cma_id.disconnect()
                except SoftRdmaError:
                    pass
            ret = self.run_events(lambda: self.disconnects_left > 0, "DISCONNECTED")
            self.say("disconnected")
            return ret
        finally:
            listen_id.destroy()

    def _first_then_all(self) -> bool:
        # Wait for ever for the first CONNECT_REQUEST, then under --timeout.
        if self.conn_index:
            self.patient = False
        return self.connects_left > 0

    def run_client(self) -> int:
        self.say("cmatose: starting client")
        ret = self.resolve_all(self.prefer)
        if ret:
            return ret
        ret = self.run_events(lambda: self.connects_left > 0, "the connections")
        if not ret and self.message_count:
            self.say("receiving data transfers")
            ret = self.poll_cqs(RECV_CQ)
            if not ret:
                self.say("sending replies")
                for node in self.nodes:
                    self.post_sends(node)
                self.say("data transfers complete")
        if not ret and self.args.migrate:
            ret = self.migrate_channel(None)
        ret2 = self.run_events(lambda: self.disconnects_left > 0, "the server's DREQ")
        return ret or ret2


def _check(args: argparse.Namespace) -> None:
    if args.port_space_name is not None:
        name = args.port_space_name.lower()
        if name.startswith("ib") and args.transport == "iwarp":
            raise InvalidArgument("-P", "the ib port space (RDMA_PS_IB) needs RoCE: iWARP "
                                        "connects RDMA_PS_TCP ids only")
        if not name.startswith(("tcp", "ib")):
            print("Warning: unknown port space format", file=sys.stderr)
    check_common(args, port_flag="-p")


def run(args: argparse.Namespace) -> int:
    """``softrdma ucmatose``: exit status 0 when every message went both ways."""
    _check(args)
    return run_test(Cmatose(args))
