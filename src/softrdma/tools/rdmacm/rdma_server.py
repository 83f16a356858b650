"""``softrdma rdma-server`` / ``softrdma rdma-client``: librdmacm's ``rdma_server.c`` and
``rdma_client.c`` examples (the ``rdma_verbs.h`` "endpoint" API) on the rdma_cm API.

Both resolve ``-s ADDR -p PORT`` with ``rdma_getaddrinfo`` (the server with
``RAI_PASSIVE``, port space ``RDMA_PS_TCP``) and make a synchronous endpoint with
``rdma_create_ep``: an rdma_cm id on a private event channel whose calls wait for their
own event. The server binds and listens, takes one connection request
(``rdma_get_request``: the new id gets an RC QP with the listener's init attributes),
posts a 16-byte receive, accepts, waits for the client's message and answers with one
16-byte SEND; the client resolves the address and route, posts its receive, connects,
sends and waits for the answer. Both send inline when the QP allows 16 bytes of inline
data (``max_inline_data``; IBV_SEND_INLINE, IBA 10.8.3 does not restrict it, rdma-core
``ibv_post_send``), and both disconnect at the end.

Output as the C examples: ``rdma_server: start`` / ``rdma_server: end N`` on stdout, a
failing call as ``perror`` would print it on stderr (``rdma_connect: Connection
refused``: a client with no server is refused at once, the CM answers REJ "invalid
Service ID" on RoCE and TCP RST on iWARP). The server also says once, on stderr, that it
waits for a client (``rdma_server: waiting for a client on 7471``) and waits until
stopped; once a client is there, every wait is bounded by ``--timeout``. Completions are
checked (the C examples only count them): an error completion fails the run.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ... import enums as e
from ... import verbs as v
from ...cm import rdma_cm as rc
from ...errors import InvalidArgument, SoftRdmaError
from .cmtest import IDLE_SLEEP_S, WAIT_STEP_S, AddrError, get_addr

__all__ = ["run", "run_example", "check_timeout", "Endpoint", "getaddrinfo", "failing_as", "RdmaError",
           "MSG_SIZE"]

MSG_SIZE = 16  # send_msg / recv_msg in the C examples
RESOLVE_TIMEOUT_MS = 2000
ANY_V4 = "0.0.0.0"


class RdmaError(Exception):
    """A failing rdma_* call: ``call`` is its name, ``code`` the errno (perror's line is
    ``call: strerror(code)``), ``detail`` softrdma's reason."""

    def __init__(self, call: str, code: int, detail: str = "") -> None:
        super().__init__(f"{call}: {os.strerror(code)}")
        self.call = call
        self.code = code
        self.detail = detail


@contextmanager
def failing_as(call: str) -> Iterator[None]:
    """A softrdma error in the block is ``call``'s failure, with its errno (EINVAL when
    it has none), as the C example reports it."""
    try:
        yield
    except SoftRdmaError as exc:
        raise RdmaError(call, exc.errno or errno.EINVAL, str(exc)) from exc


def getaddrinfo(node: str, service: str, *, passive: bool) -> tuple[str, int]:
    """``rdma_getaddrinfo(node, service, hints)`` with ``RDMA_PS_TCP``: the address and
    port (``RAI_PASSIVE`` keeps a wildcard node as the wildcard). :class:`AddrError`
    when it cannot be resolved."""
    try:
        port = int(service, 10)
    except ValueError:
        raise AddrError(-8, "Servname not supported for ai_socktype") from None  # EAI_SERVICE
    if not 0 <= port <= 0xFFFF:
        raise AddrError(-8, "Servname not supported for ai_socktype")
    if passive and node in ("", ANY_V4, "::"):
        return node or ANY_V4, port
    addr = get_addr(node)
    assert addr is not None
    return addr, port


_FAIL_EVENT_ERRNO = {
    rc.RdmaCmEventType.REJECTED: errno.ECONNREFUSED,
    rc.RdmaCmEventType.UNREACHABLE: errno.ETIMEDOUT,
    rc.RdmaCmEventType.ADDR_ERROR: errno.EADDRNOTAVAIL,
    rc.RdmaCmEventType.ROUTE_ERROR: errno.ENETUNREACH,
}


class Endpoint:
    """``rdma_create_ep``'s synchronous id: an rdma_cm id on its own event channel, its
    PD, send and receive CQs and QP; each call waits for its event (librdmacm's
    ``ucma_complete``)."""

    def __init__(self, cid: rc.CmId, init_attr: v.QPInitAttr | None, timeout: float, *,
                 own_channel: bool = False) -> None:
        self.id = cid
        self.own_channel = own_channel
        self.init_attr = init_attr
        self.timeout = timeout
        self.pd: Any = None
        self.scq: Any = None
        self.rcq: Any = None
        self.mrs: list[Any] = []

    # ---- creation ---------------------------------------------------------------------
    @classmethod
    def create(cls, addr: tuple[str, int], *, passive: bool, init_attr: v.QPInitAttr,
               device: str | None, timeout: float, ps: int = rc.RDMA_PS_TCP,
               qp_type: int | None = None) -> Endpoint:
        """``rdma_create_ep``: passive -> bound id (the QP comes with each request);
        active -> address and route resolved, QP created. ``ps`` and ``qp_type`` are
        the hints' ``ai_port_space`` and ``ai_qp_type`` (the id's, ``rdma_create_id2``)."""
        ep = cls(rc.CmId(rc.EventChannel(), ps, qp_type=qp_type), init_attr, timeout,
                 own_channel=True)
        try:
            if passive:
                ep.id.bind_addr(addr, device=device)
                return ep
            ep.id.resolve_addr(None, addr, RESOLVE_TIMEOUT_MS, device=device)
            ep.wait(rc.RdmaCmEventType.ADDR_RESOLVED, "rdma_create_ep")
            ep.id.resolve_route(RESOLVE_TIMEOUT_MS)
            ep.wait(rc.RdmaCmEventType.ROUTE_RESOLVED, "rdma_create_ep")
            ep.create_qp()
        except SoftRdmaError as exc:
            ep.destroy()
            raise RdmaError("rdma_create_ep", exc.errno or errno.EINVAL, str(exc)) from exc
        except RdmaError:
            ep.destroy()
            raise
        return ep

    def create_qp(self) -> None:
        """``rdma_create_qp`` with no CQs given: librdmacm makes a send and a receive
        CQ of the QP's depths, on the id's PD."""
        assert self.init_attr is not None
        ctx = self.id.verbs
        a = self.init_attr
        self.pd = v.PD(ctx)
        self.scq = v.CQ(ctx, max(1, a.cap.max_send_wr))
        self.rcq = v.CQ(ctx, max(1, a.cap.max_recv_wr))
        attr = v.QPInitAttr(qp_type=a.qp_type, scq=self.scq, rcq=self.rcq, cap=a.cap,
                            sq_sig_all=a.sq_sig_all)
        self.id.create_qp(self.pd, attr)

    # ---- events -----------------------------------------------------------------------
    def wait(self, want: rc.RdmaCmEventType, call: str, *, forever: bool = False) -> Any:
        """The id's next event, which must be ``want`` (other outcomes are the errno
        librdmacm gives them: REJECTED -> ECONNREFUSED ...)."""
        deadline = None if forever else time.monotonic() + self.timeout
        while True:
            step = WAIT_STEP_S if deadline is None else max(
                0.0, min(WAIT_STEP_S, deadline - time.monotonic()))
            try:
                ev = self.id.channel.get_cm_event(step)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise RdmaError(call, errno.ETIMEDOUT,
                                    f"no rdma_cm event for {self.timeout:g} s") from None
                continue
            self.id.channel.ack(ev)
            if ev.event == want:
                return ev
            if ev.event == rc.RdmaCmEventType.TIMEWAIT_EXIT:
                continue
            code = _FAIL_EVENT_ERRNO.get(ev.event, errno.ECONNABORTED)
            raise RdmaError(call, code, ev.text)

    # ---- the passive side -------------------------------------------------------------
    def listen(self, backlog: int = 0) -> None:
        with failing_as("rdma_listen"):
            self.id.listen(backlog)

    def get_request(self) -> Endpoint:
        """``rdma_get_request``: the next connection request's id, with a QP made from
        the listener's init attributes; waits until one comes."""
        ev = self.wait(rc.RdmaCmEventType.CONNECT_REQUEST, "rdma_get_request", forever=True)
        ep = Endpoint(ev.id, self.init_attr, self.timeout)
        try:
            ep.create_qp()
        except SoftRdmaError as exc:
            ep.destroy()
            raise RdmaError("rdma_get_request", exc.errno or errno.EINVAL, str(exc)) from exc
        return ep

    def accept(self) -> None:
        self._establish("rdma_accept", self.id.accept)

    # ---- the active side --------------------------------------------------------------
    def connect(self) -> None:
        self._establish("rdma_connect", self.id.connect)

    def _establish(self, call: str, start: Callable[[rc.ConnParam], object]) -> None:
        """``call`` (``rdma_accept``, ``rdma_connect``): ``start`` it, then wait for
        ESTABLISHED."""
        with failing_as(call):
            start(rc.ConnParam())
        self.wait(rc.RdmaCmEventType.ESTABLISHED, call)

    # ---- data ---------------------------------------------------------------------------
    def max_inline_data(self) -> int:
        """``ibv_query_qp(IBV_QP_CAP)``'s ``max_inline_data``."""
        _attr, init = self.id.qp.query(e.IBV_QP_CAP)
        return int(init.cap.max_inline_data)

    def reg_msgs(self, size: int) -> Any:
        """``rdma_reg_msgs``: local write access."""
        mr = v.MR(self.pd, size, int(e.IBV_ACCESS_LOCAL_WRITE))
        self.mrs.append(mr)
        return mr

    def post_recv(self, mr: Any, length: int) -> None:
        self.id.qp.post_recv(v.RecvWR(0, 1, [v.SGE(mr.addr, length, mr.lkey)]))

    def post_send(self, data: bytes, mr: Any | None) -> None:
        """``rdma_post_send``: inline (no MR) or from ``mr``."""
        if mr is None:
            wr = v.SendWR(0, None, 0, [], e.IBV_WR_SEND, int(e.IBV_SEND_SIGNALED))
            wr.set_inline_data(data)
        else:
            mr.write(data, len(data), 0)
            wr = v.SendWR(0, None, 1, [v.SGE(mr.addr, len(data), mr.lkey)], e.IBV_WR_SEND,
                          int(e.IBV_SEND_SIGNALED))
        self.id.qp.post_send(wr)

    def get_comp(self, cq: Any, call: str) -> Any:
        """``rdma_get_send_comp`` / ``rdma_get_recv_comp``: the next completion, within
        ``--timeout``; an error completion fails (EIO)."""
        deadline = time.monotonic() + self.timeout
        while True:
            _n, wcs = cq.poll(1)
            if wcs:
                wc = wcs[0]
                if wc.status != e.IBV_WC_SUCCESS:
                    raise RdmaError(call, errno.EIO, f"work completion error: "
                                    f"{v.wc_status_str(wc.status)} (status {int(wc.status)})")
                return wc
            if time.monotonic() > deadline:
                raise RdmaError(call, errno.ETIMEDOUT, f"no completion for {self.timeout:g} s")
            time.sleep(IDLE_SLEEP_S)

    # ---- release ------------------------------------------------------------------------
    def disconnect(self) -> None:
        try:
            self.id.disconnect()
        except SoftRdmaError:
            pass  # the peer's DREQ may have come first

    def destroy(self) -> None:
        """``rdma_destroy_ep``: QP, CQs, MRs, PD, the id and its channel."""
        self.id.destroy_qp()
        for obj in (self.scq, self.rcq, *self.mrs, self.pd):
            if obj is not None:
                try:
                    obj.close()
                except SoftRdmaError:
                    pass
        self.mrs = []
        self.id.destroy()
        if self.own_channel:
            self.id.channel.close()


def _init_attr() -> v.QPInitAttr:
    """The C examples' ``init_attr``: one send and one receive, one SGE each, 16 bytes
    of inline data, every send signaled."""
    return v.QPInitAttr(qp_type=e.IBV_QPT_RC, cap=v.QPCap(1, 1, 1, 1, MSG_SIZE),
                        sq_sig_all=1)


def _exchange(ep: Endpoint, name: str, *, server: bool) -> None:
    """Post the receive, then (client) send and wait, or (server) wait and answer."""
    inline = ep.max_inline_data() >= MSG_SIZE
    if not inline:
        print(f"{name}: device doesn't support IBV_SEND_INLINE, using sge sends",
              flush=True)
    recv_mr = ep.reg_msgs(MSG_SIZE)
    send_mr = None if inline else ep.reg_msgs(MSG_SIZE)
    ep.post_recv(recv_mr, MSG_SIZE)
    send_msg = bytes(MSG_SIZE)
    if server:
        ep.accept()
        ep.get_comp(ep.rcq, "rdma_get_recv_comp")
        ep.post_send(send_msg, send_mr)
        ep.get_comp(ep.scq, "rdma_get_send_comp")
    else:
        ep.connect()
        ep.post_send(send_msg, send_mr)
        ep.get_comp(ep.scq, "rdma_get_send_comp")
        ep.get_comp(ep.rcq, "rdma_get_recv_comp")


def _run_server(args: argparse.Namespace) -> None:
    addr = getaddrinfo(args.server, args.port, passive=True)
    listen = Endpoint.create(addr, passive=True, init_attr=_init_attr(),
                             device=args.device, timeout=args.timeout)
    try:
        listen.listen(0)
        port = listen.id.local_addr[1] if listen.id.local_addr else addr[1]
        print(f"rdma_server: waiting for a client on {port}", file=sys.stderr, flush=True)
        ep = listen.get_request()
        try:
            _exchange(ep, "rdma_server", server=True)
            ep.disconnect()
        finally:
            ep.destroy()
    finally:
        listen.destroy()


def _run_client(args: argparse.Namespace) -> None:
    addr = getaddrinfo(args.server, args.port, passive=False)
    ep = Endpoint.create(addr, passive=False, init_attr=_init_attr(), device=args.device,
                         timeout=args.timeout)
    try:
        _exchange(ep, "rdma_client", server=False)
        ep.disconnect()
    finally:
        ep.destroy()


def run(tool: str, args: argparse.Namespace) -> int:
    """``softrdma rdma-server`` / ``rdma-client``: exit status 0 when the message went
    each way, 1 otherwise (``end N`` prints the C examples' return value)."""
    check_timeout(args)
    return run_example(tool, lambda: (_run_server if tool == "rdma-server"
                                      else _run_client)(args))


def check_timeout(args: argparse.Namespace) -> None:
    if not args.timeout > 0:
        raise InvalidArgument("--timeout", f"must be a positive number of seconds, got "
                                           f"{args.timeout:g}")


def run_example(tool: str, body: Callable[[], None]) -> int:
    """Run one of librdmacm's examples (``body``) as the C programs report it: ``NAME:
    start``, a failing call as ``perror`` prints it (stderr) or rdma_getaddrinfo's error,
    ``NAME: end N`` (the C examples' return value); exit status 0 when it ran through."""
    name = tool.replace("-", "_")
    print(f"{name}: start", flush=True)
    ret = 0
    try:
        body()
    except AddrError as exc:
        print(f"rdma_getaddrinfo: {exc.text}", flush=True)
        ret = exc.code
    except RdmaError as exc:
        detail = f" ({exc.detail})" if exc.detail else ""
        print(f"{exc}{detail}", file=sys.stderr, flush=True)
        ret = -1
    finally:
        rc.release_devices()
    print(f"{name}: end {ret}", flush=True)
    return 0 if ret == 0 else 1
