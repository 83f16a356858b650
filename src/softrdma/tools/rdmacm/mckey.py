"""``softrdma mckey``: rdma-core's ``mckey`` (librdmacm/examples/mckey.c): rdma_cm
multicast over UD QPs: join, send, leave.

Each of ``-c`` rdma_cm ids (``RDMA_PS_UDP``) resolves the group address (the device is
the one ``-b`` names, else the kernel's route to the group), creates a UD QP (which the
rdma_cm moves to RTS with Q_Key 0x01234567) and joins the group: on RoCE there is no SA,
the MGID is the group's IP address as a GID (``::ffff:a.b.c.d`` for IPv4, Linux
``cma_iboe_set_mgid``) and the QP is attached to it (``ibv_attach_mcast``, which makes the
device join the IP group with IGMP/MLD; Annex A17).
``RDMA_CM_EVENT_MULTICAST_JOIN`` carries the address handle of the group, QPN 0xFFFFFF
(IBA 10.5.2.1: the multicast QPN) and the Q_Key. After a pause (mckey's ``sleep(3)``,
``--settle``), a receiver (no ``-s``) waits for ``-C`` messages of ``-S`` bytes on each
id; a sender (``-s``) sends as many SEND-with-immediate messages (the immediate is its
QPN) to the group. Then every id leaves the group (``rdma_leave_multicast``).

Flags as mckey: ``-m`` group, ``-M`` (AF_IB: refused), ``-s``, ``-b``, ``-c``, ``-C``,
``-S``, ``-p`` (0x111 UDP; 0x2 IPoIB needs InfiniBand), ``-o`` (send-only full member:
the QP is not attached, as librdmacm's ``ucma_process_join``), ``-l`` (no multicast
loopback, ``IBV_QP_CREATE_BLOCK_SELF_MCAST_LB``: rxe refuses QP create flags, and so
does softrdma, with the C tool's message). Output lines as mckey's, on stdout.

On the loopback device (``lo`` has no multicast flag) IPv4 groups are delivered between
processes; IPv6 groups need an interface with multicast (as between the namespaces of
tests/drivers/test_multihost_mcast.py).

Unlike the C tool, a receiver that got its first message gives up after ``--timeout``
seconds without the next one (UD multicast is unreliable: mckey would wait for ever),
and work completions are checked. The first message is awaited until stopped, as a
server waits for its client.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import time

from ...cm import rdma_cm as rc
from ...cm import rdma_mcast
from ...errors import InvalidArgument, SoftRdmaError
from .cmtest import GRH_LEN, AddrError, CmTest, Node, finish, get_addr

__all__ = ["run", "Mckey", "GRH_LEN"]

RESOLVE_TIMEOUT_MS = 2000


class Mckey(CmTest):
    """The mckey test (``struct cmatest`` + mckey.c's handlers)."""

    def __init__(self, args: argparse.Namespace, ps: int) -> None:
        super().__init__("mckey", args, ps)
        self.recv_extra = GRH_LEN
        self.sender: bool = bool(args.sender)
        self.send_only: bool = bool(args.send_only)
        self.loopback = not args.no_loopback
        self.dst: str | None = None
        self.joined: set[int] = set()

    # ---- node setup (verify_test_params, init_node, post_recvs) -----------------------
    def init_node(self, node: Node) -> int:
        if not self.loopback:
            # rdma_create_qp_ex with IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: rxe (and softrdma)
            # supports no QP create flags (rxe_create_qp: -EOPNOTSUPP)
            self.say(f"mckey: unable to create QP: {os.strerror(errno.EOPNOTSUPP)}")
            return -errno.EOPNOTSUPP
        try:
            self.init_ud_node(node)
        except SoftRdmaError as exc:
            self.say(f"mckey: unable to create QP: {exc}")
            return -errno.EINVAL
        return 0

    # ---- rdma_cm events ---------------------------------------------------------------
    def addr_handler(self, node: Node) -> int:
        ret = self.verify_test_params(node) or self.init_node(node)
        if not ret and not self.sender:
            self.post_recvs(node)
        if not ret:
            assert node.cma_id is not None and self.dst is not None
            try:
                rdma_mcast.join(node.cma_id, self.dst, send_only=self.send_only)
            except SoftRdmaError as exc:
                self.say(f"mckey: failure joining: {exc}")
                ret = -(exc.errno or errno.EINVAL)
            else:
                self.joined.add(node.id)
        if ret:
            self.connect_error()
        return ret

    def addr_resolved(self, cid: rc.CmId) -> int:
        return self.addr_handler(cid.context)

    def join_handler(self, node: Node, ud: rc.UdParam | None) -> int:
        if ud is not None:
            ah = ud.ah_attr
            dgid = socket.inet_ntop(socket.AF_INET6, bytes(ah.gr.dgid.raw))
            self.say(f"mckey: joined dgid: {dgid} mlid 0x{int(ah.dlid):x} sl {int(ah.sl)}")
        return self.take_ud(node, ud)

    # ---- completions ------------------------------------------------------------------
    def poll_cqs(self) -> int:
        """``poll_cqs``: ``-C`` successful receives on each joined id; the first one is
        awaited until stopped, each later one within ``--timeout``."""
        first = True
        for node in self.nodes:
            if not node.connected:
                continue
            ret = self.poll_cq(node, node.cqs[0], self.message_count, patient=first)
            if ret:
                return ret
            first = False
        return 0

    # ---- the run ----------------------------------------------------------------------
    def leave_all(self) -> int:
        """``rdma_leave_multicast`` for each id; an id that never joined fails as
        librdmacm's does (``EADDRNOTAVAIL``)."""
        ret = 0
        for node in self.nodes:
            if node.cma_id is None:
                continue
            if node.id not in self.joined:
                self.say(f"mckey: failure leaving: {os.strerror(errno.EADDRNOTAVAIL)}")
                ret = -1
                continue
            assert self.dst is not None
            try:
                rdma_mcast.leave(node.cma_id, self.dst, send_only=self.send_only)
            except SoftRdmaError as exc:
                self.say(f"mckey: failure leaving: {exc}")
                ret = -1
            self.joined.discard(node.id)
        return ret

    def run(self) -> int:
        self.say(f"mckey: starting {'client' if self.sender else 'server'}")
        try:
            src = get_addr(self.args.src_addr)
            self.dst = get_addr(self.args.mcast_addr)
        except AddrError as exc:
            self.say(f"getaddrinfo failed ({exc.text}) - invalid hostname or IP address")
            return exc.code
        self.say("mckey: joining")
        device = self.args.device or "roce"
        for node in self.nodes:
            node.cma_id = rc.CmId(self.channel, self.ps, context=node)
            try:
                if src is not None:
                    node.cma_id.bind_addr((src, 0), device=device)
                node.cma_id.resolve_addr((src, 0) if src else None, (self.dst, 0),
                                         RESOLVE_TIMEOUT_MS, device=device)
            except SoftRdmaError as exc:
                what = "addr bind" if src is not None and node.cma_id.verbs is None \
                    else "resolve addr"
                self.say(f"mckey: {what} failure: {exc}")
                self.connect_error()
                return -(exc.errno or errno.EINVAL)
        ret = self.run_events(lambda: self.connects_left > 0, "the group's join")
        if not ret:
            ret = self.transfers()
        leave = self.leave_all()
        return ret or leave

    def transfers(self) -> int:
        time.sleep(max(0.0, float(self.args.settle)))
        if not self.message_count:
            return 0
        if self.sender:
            self.post_ud_sends_all("initiating data transfers")
        else:
            ret = self.receive_ud(self.poll_cqs)
            if ret:
                return ret
        self.say("data transfers complete")
        return 0


def _port_space(args: argparse.Namespace) -> int:
    if args.port_space is None:
        return rc.RDMA_PS_UDP
    try:
        ps = int(args.port_space, 0)
    except ValueError:
        raise InvalidArgument("-p", f"not a port space number: {args.port_space!r}") \
            from None
    if ps == rc.RDMA_PS_IPOIB:
        raise InvalidArgument("-p", "the IPoIB port space needs an InfiniBand port; on "
                                    f"RoCE mckey uses RDMA_PS_UDP ({rc.RDMA_PS_UDP:#x})")
    if ps != rc.RDMA_PS_UDP:
        raise InvalidArgument("-p", f"port space {ps:#x} is not a UD port space "
                                    f"({rc.RDMA_PS_UDP:#x} for UDP)")
    return ps


def _check(args: argparse.Namespace) -> int:
    if args.unmapped_addr is not None:
        if args.src_addr is None:
            raise InvalidArgument("-M", "unmapped multicast address requires binding to "
                                        "source address")
        raise InvalidArgument("-M", "an unmapped multicast address is an AF_IB address, "
                                    "which softrdma (RoCE) has not; use -m with an IP "
                                    "multicast address")
    for flag, val, lo in (("-c", args.connections, 1), ("-C", args.message_count, 0),
                          ("-S", args.message_size, 0)):
        if val < lo:
            raise InvalidArgument(flag, f"must be at least {lo}, got {val}")
    if not args.timeout > 0:
        raise InvalidArgument("--timeout", f"must be a positive number of seconds, got "
                                           f"{args.timeout:g}")
    if args.settle < 0:
        raise InvalidArgument("--settle", f"must be >= 0, got {args.settle:g}")
    try:
        rdma_mcast.mgid_of(args.mcast_addr)
    except InvalidArgument as exc:
        raise InvalidArgument("-m", str(exc).split(": ", 1)[-1]) from None
    return _port_space(args)


def run(args: argparse.Namespace) -> int:
    """``softrdma mckey``: exit status 0 when every id joined, sent or received its
    messages and left."""
    ps = _check(args)
    test = Mckey(args, ps)
    ret = -1
    try:
        ret = test.run()
    finally:
        status = finish(test, ret)
    return status
