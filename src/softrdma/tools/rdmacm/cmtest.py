"""What ``softrdma udaddy`` and ``softrdma ucmatose`` share: rdma-core's
``librdmacm/examples/{udaddy,cmatose}.c`` keep a table of "nodes" (one rdma_cm id, PD,
CQs, MR and QP per connection), run the connection events to completion on one event
channel, then count work completions. This module has that skeleton.

Unlike the C tools nothing waits for ever once a peer is involved: every wait after the
first connection request runs under ``--timeout`` (a peer that stops answering is a
one-line error and a non-zero exit), and work completions are checked (an error
completion fails the run, where the C tools only count completions). A server still
waits for its first client until it is stopped, as the C tools do.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from ... import enums as e
from ... import verbs as v
from ...cm import rdma_cm as rc
from ...errors import InvalidArgument, SoftRdmaError
from ..waiting import announce_wait

__all__ = ["Node", "CmTest", "AddrError", "get_addr", "finish", "check_common", "run_test",
           "GRH_LEN", "ERROR_EVENTS"]

POLL_BATCH = 8  # the C tools poll 8 completions at a time
GRH_LEN = 40  # sizeof(struct ibv_grh), in front of every UD receive (IBA 11.4.1.1)
T = rc.RdmaCmEventType
# the events whose handling is the C tools' error line (event_error)
ERROR_EVENTS = frozenset({T.ADDR_ERROR, T.ROUTE_ERROR, T.CONNECT_ERROR, T.UNREACHABLE,
                          T.REJECTED, T.MULTICAST_ERROR})
IDLE_SLEEP_S = 0.0005
WAIT_STEP_S = 0.5  # a wait for ever still wakes up now and then (Ctrl-C)
RESOLVE_TIMEOUT_MS = 2000  # rdma_resolve_addr's timeout in the C tools


class AddrError(Exception):
    """``getaddrinfo`` failed: ``code`` is its (negative) EAI error, as the C tools
    return it."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


def get_addr(host: str | None) -> str | None:
    """``getaddrinfo`` of ``host`` (an address or a name); None stays None.
    :class:`AddrError` when it cannot be resolved."""
    if host is None:
        return None
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise AddrError(int(exc.errno or socket.EAI_NONAME), exc.strerror or str(exc)) \
            from None
    for fam, _t, _p, _c, sa in infos:
        if fam in (socket.AF_INET, socket.AF_INET6):
            return str(sa[0])
    raise AddrError(int(socket.EAI_FAMILY), "Address family for hostname not supported")


class Node:
    """``struct cmatest_node``: one connection's id and verbs objects."""

    def __init__(self, index: int, cid: rc.CmId | None = None) -> None:
        self.id = index
        self.cma_id = cid
        self.connected = False
        self.pd: Any = None
        self.cqs: list[Any] = []
        self.mr: Any = None
        self.ah: Any = None
        self.remote_qpn = 0
        self.remote_qkey = 0

    def close(self) -> None:
        """``destroy_node``: AH, QP, CQs, MR, PD, then the id."""
        cid = self.cma_id
        if cid is None:
            return
        objs: list[Any] = [self.ah]
        for obj in objs:
            if obj is not None:
                obj.close()
        cid.destroy_qp()
        for obj in [*self.cqs, self.mr, self.pd]:
            if obj is not None:
                obj.close()
        cid.destroy()
        self.cma_id = None


class CmTest:
    """``struct cmatest`` and the loops of the C tools (see the module docstring).

    ``name`` prefixes the messages (``udaddy``, ``cmatose``, ``mckey``); ``handler`` is
    the tool's ``cma_handler`` (returns 0 or an error status, as in C): by default
    :meth:`cma_handler`, which calls one method per event type, each tool overriding those
    it handles.
    """

    def __init__(self, name: str, args: argparse.Namespace, ps: int) -> None:
        self.name = name
        self.args = args
        self.ps = ps
        self.timeout: float = args.timeout
        self.channel = rc.EventChannel()
        self.nodes: list[Node] = [Node(i) for i in range(args.connections)]
        self.conn_index = 0
        self.connects_left: int = int(args.connections)
        self.disconnects_left = 0
        self.message_count: int = args.message_count
        self.message_size: int = args.message_size
        if not self.message_size:
            self.message_count = 0
        self.handler: Callable[[rc.RdmaCmEvent], int] = self.cma_handler
        self.patient = False  # a server waiting for its first client waits for ever
        self.recv_extra = 0  # bytes a receive buffer holds beyond the message (UD: the GRH)

    def say(self, text: str) -> None:
        print(text, flush=True)

    def verify_test_params(self, node: Node) -> int:
        """udaddy.c / mckey.c ``verify_test_params``: a UD message must fit the active MTU
        (-EINVAL, with their message, when it does not)."""
        assert node.cma_id is not None
        mtu = 1 << (int(node.cma_id.verbs.active_mtu) + 7)
        if self.message_count and self.message_size > mtu:
            self.say(f"{self.name}: message_size {self.message_size} is larger than active "
                     f"mtu {mtu}")
            return -errno.EINVAL
        return 0

    def post_recvs(self, node: Node) -> None:
        """One receive of ``message_size + recv_extra`` bytes per message to come."""
        if not self.message_count:
            return
        assert node.cma_id is not None
        mr = node.mr
        for _ in range(self.message_count):
            node.cma_id.qp.post_recv(v.RecvWR(node.id, 1, [
                v.SGE(mr.addr, self.message_size + self.recv_extra, mr.lkey)]))

    def init_ud_node(self, node: Node) -> int:
        """udaddy.c / mckey.c ``init_node``: a PD, one CQ for both queues (two entries a
        message), a UD QP of ``message_count`` WRs and an MR for a message and its GRH.
        0 (a failure raises)."""
        cid = node.cma_id
        assert cid is not None
        node.pd = v.PD(cid.verbs)
        cqe = self.message_count * 2 if self.message_count else 2
        node.cqs = [v.CQ(cid.verbs, cqe)]
        depth = self.message_count or 1
        attr = v.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=node.cqs[0], rcq=node.cqs[0],
                            cap=v.QPCap(depth, depth, 1, 1))
        cid.create_qp(node.pd, attr)
        if self.message_count:
            node.mr = v.MR(node.pd, self.message_size + GRH_LEN, int(e.IBV_ACCESS_LOCAL_WRITE))
        return 0

    def post_ud_sends(self, node: Node, signal: int) -> None:
        """udaddy.c / mckey.c ``post_sends``: ``message_count`` SEND-with-immediate messages
        (the immediate is our QPN) to the node's address handle, QPN and Q_Key."""
        if not node.connected or not self.message_count:
            return
        assert node.cma_id is not None
        qp = node.cma_id.qp
        mr = node.mr
        for _ in range(self.message_count):
            wr = v.SendWR(node.id, None, 1, [v.SGE(mr.addr, self.message_size, mr.lkey)],
                          e.IBV_WR_SEND_WITH_IMM, signal)
            wr.imm_data = qp.qp_num
            wr.set_wr_ud(node.ah, node.remote_qpn, node.remote_qkey)
            qp.post_send(wr)

    def post_ud_sends_all(self, what: str, signal: int = 0) -> None:
        """Say ``what`` (``initiating data transfers``, ``sending replies``), then
        :meth:`post_ud_sends` on every node."""
        self.say(what)
        for node in self.nodes:
            self.post_ud_sends(node, signal)

    def receive_ud(self, poll_cqs: Callable[[], int]) -> int:
        """``receiving data transfers``: ``poll_cqs()`` (the tool's); its error or 0."""
        self.say("receiving data transfers")
        return poll_cqs()

    def take_ud(self, node: Node, ud: rc.UdParam | None) -> int:
        """The UD peer of an ESTABLISHED (SIDR) or MULTICAST_JOIN event: its address
        handle, QPN and Q_Key; the node is connected. -1 when the event has none."""
        if ud is None:
            self.say(f"{self.name}: failure creating address handle")
            self.connect_error()
            return -1
        node.remote_qpn = ud.qp_num
        node.remote_qkey = ud.qkey
        node.ah = v.AH(node.pd, ud.ah_attr)
        node.connected = True
        self.connects_left -= 1
        return 0

    def take_node(self, cid: rc.CmId) -> Node | None:
        """The next free node for a CONNECT_REQUEST on ``cid``; None, the request rejected,
        when every node is taken (the C tools then return ENOMEM)."""
        if self.conn_index == len(self.nodes):
            self.say(f"{self.name}: failing connection request")
            cid.reject()
            return None
        node = self.nodes[self.conn_index]
        self.conn_index += 1
        node.cma_id = cid
        cid.context = node
        return node

    def resolve_all(self, device: str | None) -> int:
        """Resolve one id per node to ``-s`` (from ``-b`` when given), as the C clients do:
        0, or the errno of a name that does not resolve (``getaddrinfo``)."""
        try:
            dst = get_addr(self.args.dst_addr)
            src = get_addr(self.args.src_addr)
        except AddrError as exc:
            self.say(f"{self.name}: getaddrinfo error: {exc.text}")
            return exc.code
        self.say(f"{self.name}: connecting")
        for node in self.nodes:
            node.cma_id = rc.CmId(self.channel, self.ps, context=node)
            node.cma_id.resolve_addr((src, 0) if src else None, (dst, self.args.port),
                                     RESOLVE_TIMEOUT_MS, device=device)
        return 0

    def listen(self, listen_id: rc.CmId, device: str | None, tool: str) -> int:
        """Bind ``listen_id`` to ``-b`` (default 0.0.0.0) and the port and listen, as the C
        servers do, then announce the wait (``softrdma TOOL: waiting ...``): 0, or the
        errno of a name that does not resolve (``getrdmaaddr``)."""
        try:
            src = get_addr(self.args.src_addr or "0.0.0.0")
        except AddrError as exc:
            self.say(f"{self.name}: getrdmaaddr error: {exc.text}")
            return exc.code
        assert src is not None
        listen_id.bind_addr((src, self.args.port), device=device)
        listen_id.listen(0)
        announce_wait(tool, self.args.port)
        self.patient = True
        return 0

    # ---- events -----------------------------------------------------------------------
    def cma_handler(self, ev: rc.RdmaCmEvent) -> int:
        """The C tools' ``cma_handler``: the error events print the error line
        (:meth:`event_error`); the others go to the method of their type, which a tool
        overrides (0, nothing to do, by default)."""
        k = ev.event
        if k in ERROR_EVENTS:
            return self.event_error(ev)
        if k == T.ADDR_RESOLVED:
            return self.addr_resolved(ev.id)
        if k == T.ROUTE_RESOLVED:
            return self.route_handler(ev.id.context)
        if k == T.CONNECT_REQUEST:
            return self.connect_handler(ev.id)
        if k == T.ESTABLISHED:
            return self.established(ev)
        if k == T.MULTICAST_JOIN:
            return self.join_handler(ev.id.context, ev.ud)
        if k == T.DISCONNECTED:
            return self.disconnected(ev.id)
        return 0

    def addr_resolved(self, cid: rc.CmId) -> int:
        """``addr_handler`` of udaddy.c / cmatose.c: the ``-t``/``-a`` options, then
        ``rdma_resolve_route``."""
        self.set_options(cid)
        cid.resolve_route(2000)
        return 0

    def route_handler(self, node: Node) -> int:
        return 0

    def connect_handler(self, cid: rc.CmId) -> int:
        return 0

    def established(self, ev: rc.RdmaCmEvent) -> int:
        return 0

    def join_handler(self, node: Node, ud: rc.UdParam | None) -> int:
        return 0

    def disconnected(self, cid: rc.CmId) -> int:
        return 0

    def _get_event(self) -> rc.RdmaCmEvent | None:
        deadline = None if self.patient else time.monotonic() + self.timeout
        while True:
            step = WAIT_STEP_S if deadline is None else min(
                WAIT_STEP_S, max(0.0, deadline - time.monotonic()))
            try:
                return self.channel.get_cm_event(step)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    return None

    def run_events(self, more: Callable[[], bool], what: str) -> int:
        """``connect_events`` / ``disconnect_events``: handle events while ``more()``;
        the first non-zero handler status ends the loop. No event for ``--timeout``
        seconds is ``-ETIMEDOUT``."""
        ret = 0
        while more() and not ret:
            ev = self._get_event()
            if ev is None:
                self.say(f"{self.name}: no rdma_cm event for {self.timeout:g} s while "
                         f"waiting for {what}")
                return -errno.ETIMEDOUT
            self.channel.ack(ev)
            ret = self.handler(ev)
        return ret

    # ---- completions ------------------------------------------------------------------
    def poll_cq(self, node: Node, cq: Any, count: int,
                on_first: Callable[[Node, Any], None] | None = None,
                patient: bool = False) -> int:
        """``poll_cqs`` for one node's ``cq``: ``count`` successful completions within
        ``--timeout`` of the last one; an error completion or silence is an error.
        ``patient``: the first completion is awaited until stopped."""
        done = 0
        deadline = time.monotonic() + self.timeout
        while done < count:
            _n, wcs = cq.poll(POLL_BATCH)
            if not wcs:
                if not (patient and done == 0) and time.monotonic() > deadline:
                    self.say(f"{self.name}: no completion for {self.timeout:g} s "
                             f"({done} of {count} on connection {node.id})")
                    return -errno.ETIMEDOUT
                time.sleep(IDLE_SLEEP_S)
                continue
            deadline = time.monotonic() + self.timeout
            for wc in wcs:
                if wc.status != e.IBV_WC_SUCCESS:
                    self.say(f"{self.name}: completion error on connection {node.id}: "
                             f"{v.wc_status_str(wc.status)} (status {int(wc.status)})")
                    return -errno.EIO
            if on_first is not None:
                on_first(node, wcs[0])
            done += len(wcs)
        return 0

    def set_options(self, cid: rc.CmId) -> None:
        """``addr_handler``: ``-t`` (TOS) and ``-a`` (ACK timeout) through
        ``rdma_set_option``; a failure is a warning (the C tools' ``perror``)."""
        opts = [(rc.RDMA_OPTION_ID_TOS, getattr(self.args, "tos", None), "TOS option"),
                (rc.RDMA_OPTION_ID_ACK_TIMEOUT, getattr(self.args, "ack_timeout", None),
                 "ack timeout option")]
        for optname, text, what in opts:
            if text is None:
                continue
            try:
                cid.set_option(rc.RDMA_OPTION_ID, optname, int(text, 0))
            except (ValueError, SoftRdmaError) as exc:
                self.say(f"{self.name}: set {what} failed: {exc}")

    def connect_error(self) -> None:
        self.connects_left -= 1

    def event_error(self, ev: rc.RdmaCmEvent) -> int:
        """The C tools' line for ADDR/ROUTE/CONNECT_ERROR, UNREACHABLE and REJECTED."""
        self.say(f"{self.name}: event: {rc.event_str(ev.event)}, error: {ev.status}")
        self.connect_error()
        return ev.status or -errno.ECONNABORTED

    def close(self) -> None:
        for node in self.nodes:
            try:
                node.close()
            except SoftRdmaError:
                pass
        self.channel.close()
        rc.release_devices()

    def run_server(self) -> int:
        """The server side; each tool defines it (ucmatose, udaddy)."""
        raise NotImplementedError

    def run_client(self) -> int:
        """The client side; each tool defines it (ucmatose, udaddy)."""
        raise NotImplementedError


def finish(test: CmTest, ret: int) -> int:
    """``main``'s tail: ``test complete``, clean up, ``return status N``; the exit
    status is 0 or 1."""
    test.say("test complete")
    test.close()
    test.say(f"return status {ret}")
    return 0 if ret == 0 else 1


def check_common(args: argparse.Namespace, port_flag: str) -> None:
    """The argument checks ucmatose and udaddy share (address format, counts, port,
    timeout, addresses); ``port_flag`` names the port option in errors."""
    fmt = (args.addr_format or "name").lower()
    if fmt.startswith("gid"):
        raise InvalidArgument("-f", "gid addresses need AF_IB, which softrdma has not")
    if not fmt.startswith(("ip", "name")):
        print("Warning: unknown address format", file=sys.stderr)
    for flag, val, lo in (("-c", args.connections, 1), ("-C", args.message_count, 0),
                          ("-S", args.message_size, 0)):
        if val < lo:
            raise InvalidArgument(flag, f"must be at least {lo}, got {val}")
    if not 0 <= args.port <= 0xFFFF:
        raise InvalidArgument(port_flag, f"port {args.port} not in 0..65535")
    if not args.timeout > 0:
        raise InvalidArgument("--timeout", f"must be a positive number of seconds, got "
                                           f"{args.timeout:g}")
    for flag, val in (("-s", args.dst_addr), ("-b", args.src_addr)):
        if val is not None:
            try:
                ipaddress.ip_address(val)
            except ValueError:
                if not val or "/" in val:
                    raise InvalidArgument(flag, f"not an address: {val!r}") from None


def run_test(test: CmTest) -> int:
    """Run ``test`` as client (with ``-s``) or server and finish it: the exit status."""
    ret = -1
    try:
        ret = test.run_client() if test.args.dst_addr is not None else test.run_server()
    finally:
        status = finish(test, ret)
    return status
