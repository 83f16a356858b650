"""``-R``: perftest's rdma_cm mode (perftest_communication.c ``rdma_client_connect``,
``rdma_server_connect``, ``create_rdma_cm_connection``) on :mod:`softrdma.cm.rdma_cm`.

Two kinds of rdma_cm RC connections go to the same port (18515 by default):

* the control connection (:class:`CmChannel`), made first: one QP whose SENDs carry the
  exchange of :mod:`.oob` (one message per SEND; ``struct pingpong_dest`` for the
  handshakes). perftest keeps one receive posted and re-posts it after each message;
  we keep a few (more receives never hurt the alternating protocol);
* after a handshake, the data connections (:class:`DataConnections`): the server listens
  again on the port and accepts ``-q`` CONNECT_REQUESTs, the client resolves and
  connects ``-q`` ids, retrying a refused one every 100 ms as perftest does (the server
  may not be listening yet), until ``--timeout``.

For READ and atomic tests ``responder_resources``/``initiator_depth`` are the out reads
(RoCE: the REQ/REP Responder Resources and Initiator Depth fields, IBA 12.6.5 and
12.6.8; iWARP: the MPA v2 IRD/ORD, RFC 6581 §5).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ... import enums as e
from ... import verbs as v
from ...cm import rdma_cm as rc
from ...errors import SoftRdmaError
from ..waiting import connect_retry_s
from .options import Options, PerftestError

CTRL_BUF = 4096
CTRL_RECVS = 4
CTRL_SEND_WRID = 5  # SYNC_SPEC_ID
RETRY_DELAY_S = 0.1
LINGER_CLIENT_S = 1.5
LINGER_SERVER_S = 3.0
T = rc.RdmaCmEventType


def for_id(cid: Any, kind: Any = None) -> Callable[[Any], bool]:
    """An event predicate: events of ``cid`` (of type ``kind`` when given)."""
    def match(ev: Any) -> bool:
        return bool(ev.id is cid and (kind is None or ev.event == kind))
    return match


class CmSession:
    """The event channel shared by every id of one side, with a backlog of events that
    arrived for another waiter."""

    def __init__(self, o: Options) -> None:
        self.o = o
        self.prefer = o.ib_dev or o.transport
        # the MPA Request/Reply wait (iWARP) follows --timeout: an emulated peer can be
        # slow to accept, and an attempt given up on may still be accepted by it
        rc.configure(iwarp_timeout=o.timeout)
        self.ch = rc.EventChannel()
        self.backlog: list[Any] = []
        self.ids: list[Any] = []

    def new_id(self) -> Any:
        cid = rc.CmId(self.ch, rc.RDMA_PS_TCP)
        self.ids.append(cid)
        if self.o.tos is not None:  # -T: the connection's ToS / Traffic Class (as perftest)
            try:
                cid.set_option(rc.RDMA_OPTION_ID, rc.RDMA_OPTION_ID_TOS, self.o.tos)
            except SoftRdmaError as exc:
                raise PerftestError(f"Failed to set TOS {self.o.tos}: {exc}") from exc
        return cid

    def wait(self, match: Callable[[Any], bool], deadline: float | None, what: str) -> Any:
        """The first event ``match`` accepts (kept in order with the others); a deadline
        of None waits until stopped."""
        while True:
            for ev in self.backlog:
                if match(ev):
                    self.backlog.remove(ev)
                    return ev
            left = 0.5 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise PerftestError(f"timed out after {self.o.timeout:g} s {what}")
            try:
                ev = self.ch.get_cm_event(min(left, 0.5))
            except TimeoutError:
                continue
            except SoftRdmaError as exc:
                raise PerftestError(f"rdma_cm failed {what}: {exc}") from exc
            self.ch.ack(ev)
            self.backlog.append(ev)

    def resolve(self, cid: Any, host: str, port: int, deadline: float) -> None:
        """``rdma_resolve_addr`` + ``rdma_resolve_route``."""
        try:
            cid.resolve_addr(None, (host, port), 2000, device=self.prefer)
        except SoftRdmaError as exc:
            raise PerftestError(f"rdma_resolve_addr failed: {exc}") from exc
        for ok in (T.ADDR_RESOLVED, T.ROUTE_RESOLVED):
            ev = self.wait(for_id(cid), deadline, f"resolving {host}")
            if ev.event != ok:
                raise PerftestError(f"unexpected CM event {rc.event_str(ev.event)} resolving "
                                    f"{host}:{port} (status {ev.status})")
            if ok == T.ADDR_RESOLVED:
                cid.resolve_route(2000)

    def close(self) -> None:
        for cid in self.ids:
            try:
                if cid.qp is not None:
                    cid.destroy_qp()
            except SoftRdmaError:
                pass
            cid.destroy()
        self.ch.close()


class CmChannel:
    """The control connection: :mod:`.oob`'s messages as SENDs (``ctx_xchg_data_rdma``)."""

    key_binary = True

    def __init__(self, sess: CmSession, cid: Any, is_client: bool) -> None:
        self.sess = sess
        self.cid = cid
        self.is_client = is_client
        self.timeout: float | None = sess.o.timeout
        ctx = cid.verbs
        self._closers: list[Any] = []
        try:
            self.pd = v.PD(ctx)
            self._closers.append(self.pd)
            self.buf = bytearray((CTRL_RECVS + 1) * CTRL_BUF)
            self.mr = v.MR(self.pd, len(self.buf), int(e.IBV_ACCESS_LOCAL_WRITE),
                           buffer=self.buf)
            self._closers.append(self.mr)
            self.cq = v.CQ(ctx, 2 * CTRL_RECVS + 4)
            self._closers.append(self.cq)
            self.qp = cid.create_qp(self.pd, v.QPInitAttr(
                qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                cap=v.QPCap(max_send_wr=2, max_recv_wr=CTRL_RECVS, max_send_sge=1,
                            max_recv_sge=1)))
            for slot in range(CTRL_RECVS):
                self._post_recv(slot)
        except SoftRdmaError as exc:
            self.close()
            raise PerftestError(f"Unable to create the resources of the rdma_cm control "
                                f"connection: {exc}") from exc
        self._rx: list[bytes] = []
        self._sent = 0

    @classmethod
    def connect(cls, sess: CmSession, host: str, port: int) -> CmChannel:
        """The client's control connection (``rdma_client_connect``), retried while the
        server is not there yet."""
        deadline = time.monotonic() + sess.o.timeout
        retry_until = min(deadline, time.monotonic() + connect_retry_s())  # tools.waiting
        while True:
            cid = sess.new_id()
            sess.resolve(cid, host, port, deadline)
            chan = cls(sess, cid, True)
            try:
                cid.connect(rc.ConnParam())
            except SoftRdmaError as exc:
                raise PerftestError(f"rdma_connect failed: {exc}") from exc
            ev = sess.wait(for_id(cid), deadline,
                           f"connecting to {host}:{port}")
            if ev.event == T.ESTABLISHED:
                return chan
            chan.close()
            if ev.event != T.REJECTED or \
                    time.monotonic() + RETRY_DELAY_S >= retry_until:
                raise PerftestError(f"Couldn't connect to {host}:{port}: "
                                    f"{rc.event_str(ev.event)} (status {ev.status})")
            time.sleep(RETRY_DELAY_S)

    @classmethod
    def accept(cls, sess: CmSession, port: int,
               on_listen: Callable[[], None] | None = None) -> CmChannel:
        """The server's control connection (``rdma_server_connect``); ``on_listen()``
        runs once the port listens (the banner: a client started on it is not refused)."""
        lst = listen(sess, port)
        try:
            if on_listen is not None:
                on_listen()  # the first client is awaited until stopped (tools.waiting)
            ev = sess.wait(lambda x: x.event == T.CONNECT_REQUEST, None,
                           f"waiting for a client on port {port}")
            chan = cls(sess, ev.id, False)
            sess.ids.append(ev.id)
            try:
                ev.id.accept(rc.ConnParam())
            except SoftRdmaError as exc:
                raise PerftestError(f"rdma_accept failed: {exc}") from exc
            return chan
        finally:
            lst.destroy()

    def _post_recv(self, slot: int) -> None:
        """A receive into its own slot (wr_id = slot), so no message overwrites another
        that is not read yet."""
        self.qp.post_recv(v.RecvWR(slot, 1, [v.SGE(int(self.mr.addr) + slot * CTRL_BUF,
                                                    CTRL_BUF, self.mr.lkey)]))

    def _pump(self, done: Callable[[], bool]) -> None:
        """Take every completion (SEND completions counted, messages queued in order)
        until ``done()``; a batch may hold both kinds, none is dropped."""
        timeout = self.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            n, wcs = self.cq.poll(2 * CTRL_RECVS)
            for wc in wcs[:n]:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise PerftestError(f"Bad wc status {int(wc.status)} on the rdma_cm "
                                        "control connection (the peer went away?)")
                if wc.opcode == e.IBV_WC_SEND:
                    self._sent += 1
                    continue
                slot = int(wc.wr_id)
                off = slot * CTRL_BUF
                self._rx.append(bytes(self.buf[off:off + int(wc.byte_len)]))
                self._post_recv(slot)
            if n:
                continue
            if deadline is not None and time.monotonic() >= deadline:
                raise PerftestError(f"the peer did not answer for {timeout:g} s")
            time.sleep(0)

    def write(self, data: bytes) -> None:
        off = CTRL_RECVS * CTRL_BUF
        self.buf[off:off + len(data)] = data
        sge = v.SGE(int(self.mr.addr) + off, len(data), self.mr.lkey)
        try:
            self.qp.post_send(v.SendWR(CTRL_SEND_WRID, None, 1, [sge], e.IBV_WR_SEND,
                                       e.IBV_SEND_SIGNALED))
        except SoftRdmaError as exc:
            raise PerftestError(f"Function ibv_post_send failed: {exc}") from exc
        self._pump(lambda: self._sent > 0)
        self._sent -= 1

    def read(self, size: int) -> bytes:
        self._pump(lambda: bool(self._rx))
        msg = self._rx.pop(0)
        return msg[:size].ljust(size, b"\x00")

    def close(self) -> None:
        try:
            if self.cid.qp is not None:
                self.cid.destroy_qp()
        except SoftRdmaError:
            pass
        while self._closers:
            try:
                self._closers.pop().close()
            except SoftRdmaError:
                pass


def listen(sess: CmSession, port: int) -> Any:
    """A listening id on every address of the chosen device(s) at ``port``."""
    lst = rc.CmId(sess.ch, rc.RDMA_PS_TCP)
    try:
        lst.bind_addr(("0.0.0.0", port), device=sess.prefer)
        lst.listen(sess.o.num_qps)
    except SoftRdmaError as exc:
        lst.destroy()
        raise PerftestError(f"Failed to listen on RDMA CM port {port}: {exc}") from exc
    return lst


def conn_param(o: Options, out_reads: int) -> rc.ConnParam:
    if o.spec.verb in ("read", "atomic"):
        return rc.ConnParam(responder_resources=out_reads, initiator_depth=out_reads)
    return rc.ConnParam()


def server_data(sess: CmSession, lst: Any, on_request: Callable[[Any], Any],
                out_reads: int) -> list[Any]:
    """Accept ``-q`` data connections on the listening id ``lst`` (destroyed here);
    ``on_request(id)`` makes each id's QP."""
    o = sess.o
    deadline = time.monotonic() + o.timeout
    ids: list[Any] = []
    try:
        while len(ids) < o.num_qps:
            ev = sess.wait(lambda x: x.event == T.CONNECT_REQUEST, deadline,
                           "waiting for the client's rdma_cm QPs")
            sess.ids.append(ev.id)
            on_request(ev.id)
            try:
                ev.id.accept(conn_param(o, out_reads))
            except SoftRdmaError as exc:
                raise PerftestError(f"Failed to accept RDMA CM connection: {exc}") from exc
            ids.append(ev.id)
    finally:
        lst.destroy()
    return ids


def client_data(sess: CmSession, host: str, port: int, on_route: Callable[[Any], Any],
                out_reads: int) -> list[Any]:
    """Connect ``-q`` data connections (each retried while refused)."""
    o = sess.o
    deadline = time.monotonic() + o.timeout
    ids: list[Any] = []
    for _ in range(o.num_qps):
        while True:
            cid = sess.new_id()
            sess.resolve(cid, host, port, deadline)
            on_route(cid)
            try:
                cid.connect(conn_param(o, out_reads))
            except SoftRdmaError as exc:
                raise PerftestError(f"Failed to connect through RDMA CM: {exc}") from exc
            ev = sess.wait(for_id(cid), deadline,
                           f"connecting the rdma_cm QPs to {host}:{port}")
            if ev.event == T.ESTABLISHED:
                ids.append(cid)
                break
            if ev.event != T.REJECTED or \
                    time.monotonic() + RETRY_DELAY_S >= deadline:
                raise PerftestError(f"Failed to connect RDMA CM client: "
                                    f"{rc.event_str(ev.event)} (status {ev.status})")
            cid.destroy_qp()
            on_route(None)  # the failed id's QP is gone: forget it
            time.sleep(RETRY_DELAY_S)
    return ids


def linger(sess: CmSession, cid: Any, seconds: float) -> None:
    """The last step of both sides: let the peer close the control connection first (up
    to ``seconds``; the client waits less, so two softrdma sides do not both wait it
    out). The peer's last SEND may not have completed on its side yet although we have
    its message: siw completes it with an error if the connection goes down now (``Bad
    wc status 2``, seen from ib_write_bw -R as the server and ib_read_bw -R as the
    client against siw)."""
    try:
        sess.wait(for_id(cid, T.DISCONNECTED), time.monotonic() + seconds,
                  "waiting for the server to close")
    except PerftestError:
        pass


def disconnect(sess: CmSession, ids: list[Any]) -> None:
    """``rdma_cm_disconnect_nodes``: disconnect, briefly wait for DISCONNECTED."""
    for cid in ids:
        try:
            cid.disconnect()
        except SoftRdmaError:
            pass
    deadline = time.monotonic() + 2.0
    for cid in ids:
        try:
            sess.wait(for_id(cid, T.DISCONNECTED), deadline,
                      "disconnecting")
        except PerftestError:
            break
