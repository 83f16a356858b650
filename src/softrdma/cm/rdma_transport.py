"""The connection manager of each transport under an rdma_cm id, chosen once per id (Linux
cma.c calls ``ib_cm`` or ``iw_cm`` after ``rdma_cap_ib_cm`` / ``rdma_cap_iw_cm``): the
adapters :class:`_IbCm` and :class:`_IwCm` behind :class:`Transport`, and the port spaces
they serve. :class:`~.rdma_cm.CmId` keeps the id's state; an adapter acts on it through
:class:`ConnId`.

Transports (the device found by :mod:`.rdma_devices` decides):

* **RoCE**: the IB CM on QP1 (:mod:`softrdma.drivers.cm.gsi`, IBA ch. 12) with the RDMA IP CM Service
  (Annex A11): the REQ private data is the Table 1 IP CM header followed by the
  consumer's data, the Service ID ``0x0000000001 <protocol> <port>`` (Table 2, TCP 6 /
  UDP 17). The CM moves the QP RESET -> INIT -> RTR -> RTS (the active side on the REP,
  the passive side before its REP, as Linux ``rdma_accept``). ``RDMA_PS_UDP`` ids
  resolve UD services through SIDR (IBA 12.11): the ESTABLISHED event carries the
  remote QPN, Q_Key and address handle attributes (``event.ud``). A rejection is
  REJECTED with ``status`` the REJ reason (28 for ``reject``, 8 when nobody listens)
  and ``reject`` its readable text (A11 ARI included); no answer after the CM's
  retries is UNREACHABLE (``-ETIMEDOUT``). TIMEWAIT_EXIT follows DISCONNECTED. A REJ 8
  is sent again for a while only when ``SOFTRDMA_CM_RETRY_NO_LISTENER`` asks
  (:mod:`.rdma_retry`).
* **iWARP**: TCP and the MPA Request/Reply (RFC 5044 §7.1, RFC 6581), the private
  data in the MPA frame without an IP CM header (as Linux iw_cm/siw).
  ``responder_resources``/``initiator_depth`` become the MPA v2 IRD/ORD. A refusal
  (MPA Reply with R set, or nobody listening: TCP RST) is REJECTED with status
  ``-ECONNREFUSED``; no reply within the connect timeout is UNREACHABLE; the peer
  closing the stream is DISCONNECTED. A TCP RST is made again for a while only when
  ``SOFTRDMA_CM_RETRY_NO_LISTENER`` asks (:mod:`.rdma_retry`).
"""

from __future__ import annotations

import errno
import logging
import os
import random
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from ..drivers.cm import iwconnect as iw
from ..drivers.runtime.workers import Workers
from ..enums import ibv_qp_type
from ..errors import InvalidArgument, SoftRdmaError, StateError
from ..ibcm.cmid import IbCmId
from ..ibcm.events import CmEvent, CmEventType, RejectInfo, lock_free
from ..ibcm.ipcm import IpCmClient, ip_listen
from ..ibcm.params import AcceptParams
from ..ibcm.userqp import UserQp, req_qp_type
from ..iwarp.events import Closed, ConnEvent, Failed, Terminated
from ..iwarp.mpa_setup import MpaConfig, build_request
from ..verbs.ah import AHAttr, GlobalRoute
from ..wire.gid import ip_to_gid
from ..wire.ipcm import IPPROTO_TCP, IPPROTO_UDP, RDMA_UDP_QKEY, IpAddress
from . import rdma_retry
from .rdma_devices import OpenDevice, options
from .rdma_events import ConnParam, RdmaCmEventType, UdParam
from .rdma_iwwatch import CONNECTING as _CONNECTING
from .rdma_iwwatch import watch as _watch

__all__ = ["RDMA_PS_TCP", "RDMA_PS_UDP", "RDMA_PS_IB", "PROTO", "Address", "ConnId",
           "Transport", "transport_of", "ephemeral_port"]

RDMA_PS_TCP = 0x0106
RDMA_PS_UDP = 0x0111
RDMA_PS_IB = 0x013F  # Linux's port space for ids of any QP type (RC, UC, UD, XRC)
#: the protocol byte of each port space's A11 Service ID (Annex A11 Table 2: TCP, UDP;
#: RDMA_PS_IB's 0x3F is Linux's, ``cma_get_service_id``: the port space's low byte)
PROTO = {RDMA_PS_TCP: IPPROTO_TCP, RDMA_PS_UDP: IPPROTO_UDP, RDMA_PS_IB: RDMA_PS_IB & 0xFF}
#: an id of this type resolves a UD service (SIDR) instead of connecting
QPT_UD = int(ibv_qp_type.IBV_QPT_UD)
QPT_XRC_SEND = int(ibv_qp_type.IBV_QPT_XRC_SEND)

Address = tuple[str, int]
T = RdmaCmEventType
END_EVENTS = (Closed, Terminated, Failed)  # an iWARP stream's end (as rdma_iwwatch)


def ephemeral_port() -> int:
    return random.randrange(32768, 61000)


def _retries(n: int) -> int:
    """A ``struct rdma_conn_param`` retry count as the REQ/REP field (3 bits, IBA
    12.7.38/12.7.43): the kernel's rdma_cm takes ``min(7, n)`` (``cma_connect_ib``,
    ``cma_accept_ib``), so a count above 7 is no error (libfabric's verbs provider
    asks for more)."""
    return min(7, n)


class ConnId(Protocol):
    """What an adapter reads and sets on the id it acts for (:class:`~.rdma_cm.CmId`,
    like Linux's ``rdma_id_private`` that cma.c hands to ``ib_cm`` / ``iw_cm``)."""

    ps: int
    qp_type: int
    device: OpenDevice | None
    verbs: Any
    qp: Any
    local_addr: Address | None
    peer_addr: Address | None
    event_info: dict[str, Any]
    _src: IpAddress | None
    _src_port: int
    _bind_port: int
    _dst: IpAddress | None
    _dst_port: int
    _ib: IbCmId | None
    _iw_req: Any
    _iw_conn: Any
    _established_by_app: bool
    _tos: int
    _ack_timeout: int | None

    @property
    def _destroyed(self) -> bool: ...

    def _post(self, kind: RdmaCmEventType, **kw: Any) -> None: ...

    def _child(self, dev: OpenDevice) -> ConnId: ...

    def _post_request(self, child: Any, private_data: bytes, param: ConnParam,
                      **kw: Any) -> None: ...

    def disconnected_event(self) -> None: ...


#: the daemon threads that run iWARP connects (each blocks in its TCP connect and MPA
#: exchange), kept for reuse
_connect_workers = Workers("rdma_cm-iw-connect", logging.getLogger("softrdma.cm"),
                           "rdma_cm: an iWARP connect failed")
os.register_at_fork(after_in_child=_connect_workers.after_fork)


# ---- the connection manager of each transport, chosen once per id ---------------------
class Transport:
    """What :class:`~.rdma_cm.CmId` asks of a transport's connection manager (Linux cma.c calls
    ``ib_cm`` or ``iw_cm`` after ``rdma_cap_ib_cm`` / ``rdma_cap_iw_cm``). The id keeps
    the state; these only act on it."""

    #: listening on a wildcard address: lower ranks pick port 0 first
    listen_rank = 1

    def check_ps(self, ps: int) -> None:
        """Refuse a port space this transport has no service for."""

    def source_port(self, port: int) -> int:
        """The source port of a resolved address given ``port`` (0: not chosen)."""
        return port

    def check_user_qp(self) -> None:
        """Refuse an application-moved QP (``ConnParam.qp_num``) if unsupported."""

    def listen_on(self, cid: ConnId, dev: OpenDevice, ip: IpAddress, port: int,
                  backlog: int) -> tuple[Any, int]:
        """Listen on ``dev``: ``(handle for stop_listening, the port)``."""
        raise NotImplementedError

    def stop_listening(self, handle: Any) -> None:
        raise NotImplementedError

    def busy(self, cid: ConnId) -> bool:
        """``cid`` is connecting or connected (a second connect is refused)."""
        raise NotImplementedError

    def has_request(self, cid: ConnId) -> bool:
        """``cid`` holds a connection request to accept or reject."""
        raise NotImplementedError

    def connected(self, cid: ConnId) -> bool:
        """``cid`` has a connection to disconnect."""
        raise NotImplementedError

    def connect(self, cid: ConnId, p: ConnParam, qp: Any) -> None:
        raise NotImplementedError

    def accept(self, cid: ConnId, p: ConnParam, qp: Any) -> None:
        raise NotImplementedError

    def reject(self, cid: ConnId, private_data: bytes) -> None:
        raise NotImplementedError

    def disconnect(self, cid: ConnId) -> None:
        raise NotImplementedError

    def release(self, cid: ConnId) -> None:
        """On destroy: let go of the connection or request the id holds."""
        raise NotImplementedError


class _IbCm(Transport):
    """RoCE: the IB CM (:mod:`softrdma.ibcm`) with the A11 IP CM Service; SIDR for UD."""

    def handler(self, cid: ConnId) -> Callable[[CmEvent], None]:
        """``cid``'s IB CM event handler. It only queues (lock_free): the CM runs it as
        soon as a MAD made the event, without a hand-off to its event thread."""
        return lock_free(partial(self.on_event, cid))

    def source_port(self, port: int) -> int:
        return port or ephemeral_port()

    def listen_on(self, cid: ConnId, dev: OpenDevice, ip: IpAddress, port: int,
                  backlog: int) -> tuple[Any, int]:
        binding = dev.binding
        assert binding is not None
        bind = None if ip.is_unspecified else ip
        tries = 1 if port else 32
        for i in range(tries):
            p = port or (cid._bind_port if i == 0 and cid._bind_port else ephemeral_port())
            lst = binding.agent.create_id(lock_free(partial(self.on_listen_event, cid, dev)))
            try:
                ip_listen(lst, p, proto=PROTO[cid.ps], bind=bind, backlog=backlog)
            except StateError:
                if port:
                    raise StateError(f"port {port} is in use on {dev.entry.name}",
                                     errno=errno.EADDRINUSE) from None
                continue
            return lst, p
        raise StateError(f"no free port on {dev.entry.name}", errno=errno.EADDRINUSE)

    def stop_listening(self, handle: Any) -> None:
        handle.destroy()

    def busy(self, cid: ConnId) -> bool:
        return cid._ib is not None

    def has_request(self, cid: ConnId) -> bool:
        return cid._ib is not None

    def connected(self, cid: ConnId) -> bool:
        return cid._ib is not None

    def connect(self, cid: ConnId, p: ConnParam, qp: Any) -> None:
        assert cid.device is not None and cid._src is not None and cid._dst is not None
        binding = cid.device.binding
        assert binding is not None
        sidr = cid.qp_type == QPT_UD
        window = rdma_retry.window_s() if not sidr else 0.0
        handler = self.handler(cid)
        ib = binding.agent.create_id(handler)
        ib.local_ack_timeout = cid._ack_timeout
        cid._ib = ib
        retry = None
        if window > 0:  # SOFTRDMA_CM_RETRY_NO_LISTENER: a REJ 8 sends the REQ again
            retry = rdma_retry.NoListenerRetry(
                handler, lambda c: not cid._destroyed and cid._ib is c.cm_id,
                time.monotonic() + window)
            handler = retry.handler
        client = IpCmClient(ib, handler=handler)
        if retry is not None:
            retry.client = client
        if sidr:
            client.resolve(cid._src, cid._dst, cid._dst_port, src_port=cid._src_port,
                           proto=PROTO[cid.ps], private_data=bytes(p.private_data))
            return
        # an XRC INI QP is connected as the id's type: XRC for an RDMA_PS_IB XRC id, RC
        # for an RC id (Linux's cma_connect_ib names the id's type in the REQ)
        ctype = cid.qp_type if getattr(qp, "qp_type", None) == QPT_XRC_SEND else None
        client.connect(qp, cid._src, cid._dst, cid._dst_port, src_port=cid._src_port,
                       proto=PROTO[cid.ps], private_data=bytes(p.private_data), qp_type=ctype,
                       responder_resources=p.responder_resources,
                       initiator_depth=p.initiator_depth, retry_count=_retries(p.retry_count),
                       rnr_retry_count=_retries(p.rnr_retry_count),
                       flow_control=bool(p.flow_control),
                       auto_rtu=not isinstance(qp, UserQp), traffic_class=cid._tos)

    def accept(self, cid: ConnId, p: ConnParam, qp: Any) -> None:
        assert cid._ib is not None
        sidr = cid.qp_type == QPT_UD
        qkey = p.qkey if p.qkey is not None else (RDMA_UDP_QKEY if sidr else None)
        if cid._ack_timeout is not None:
            cid._ib.local_ack_timeout = cid._ack_timeout
        cid._ib.accept(qp, AcceptParams(
            private_data=bytes(p.private_data), responder_resources=p.responder_resources,
            initiator_depth=p.initiator_depth, rnr_retry_count=_retries(p.rnr_retry_count),
            flow_control=bool(p.flow_control), qkey=qkey))

    def reject(self, cid: ConnId, private_data: bytes) -> None:
        assert cid._ib is not None
        cid._ib.reject(private_data)

    def disconnect(self, cid: ConnId) -> None:
        assert cid._ib is not None
        cid._ib.disconnect()

    def release(self, cid: ConnId) -> None:
        ib, cid._ib = cid._ib, None
        if ib is not None:
            try:
                ib.destroy()
            except SoftRdmaError:
                pass

    # ---- IB CM events, mapped to rdma_cm events on the id's channel --------------------
    # Both handlers only queue (lock_free): the CM runs them as soon as a MAD made the
    # event, without a hand-off to its event thread.
    def on_listen_event(self, cid: ConnId, dev: OpenDevice, ev: CmEvent) -> None:
        """A listening id's IB CM event: a CONNECT_REQUEST makes its child id."""
        if ev.type != CmEventType.CONNECT_REQUEST:
            self.on_event(cid, ev)
            return
        child = cid._child(dev)
        req = ev.req
        if req is not None:  # the REQ's QP type (linux cma_ib_new_conn_id): XRC TGT for XRC
            child.qp_type = req_qp_type(req) or child.qp_type
        child._ib = ev.cm_id
        ev.cm_id.handler = self.handler(child)
        if ev.local_ip is not None:
            child.local_addr = (str(ev.local_ip), int(ev.local_port or 0))
        if ev.remote_ip is not None:
            child.peer_addr = (str(ev.remote_ip), int(ev.remote_port or 0))
        param = ConnParam(ev.private_data)
        if req is not None:
            param = ConnParam(ev.private_data, req.responder_resources, req.initiator_depth,
                              req.end_to_end_flow_control, req.retry_count,
                              req.rnr_retry_count, req.srq, req.local_qpn)
        child.event_info = dict(ev.info)
        cid._post_request(child, ev.private_data, param, info=dict(ev.info))

    def on_event(self, cid: ConnId, ev: CmEvent) -> None:
        """The id's IB CM event as its rdma_cm event."""
        k = ev.type
        if k == CmEventType.ESTABLISHED:
            if cid._established_by_app:
                return  # rdma_establish reports nothing (librdmacm)
            ud = None
            if cid.qp_type == QPT_UD and ev.ud_qpn is not None:
                ud = UdParam(ev.ud_qpn, ev.ud_qkey or RDMA_UDP_QKEY, self.ah_attr(cid),
                             ev.private_data)
            # the active side's ESTABLISHED carries the REP's private data; the passive
            # side's none (linux cma_ib_handler: IB_CM_RTU_RECEIVED / USER_ESTABLISHED set
            # no private data, librdmacm leaves it NULL; libfabric's XRC endpoints tell
            # the two sides apart by it)
            passive = ev.cm_id.listen_id is not None
            cid._post(T.ESTABLISHED, private_data=b"" if passive else ev.private_data, ud=ud,
                      param=self.rep_param(ev), info=dict(ev.info))
        elif k == CmEventType.CONNECT_RESPONSE:
            cid._post(T.CONNECT_RESPONSE, private_data=ev.private_data,
                      param=self.rep_param(ev), info=dict(ev.info))
        elif k == CmEventType.REJECTED:
            rej = ev.reject
            status = 0
            if rej is not None:
                status = rej.reason if rej.reason is not None else int(rej.sidr_status or 0)
            cid._post(T.REJECTED, status=status, private_data=ev.private_data, reject=rej,
                       info=dict(ev.info))
        elif k == CmEventType.UNREACHABLE:
            cid._post(T.UNREACHABLE, status=-errno.ETIMEDOUT, reject=ev.reject)
        elif k == CmEventType.CONNECT_ERROR:
            cid._post(T.CONNECT_ERROR, status=-errno.ECONNABORTED, reject=ev.reject)
        elif k == CmEventType.DISCONNECTED:
            cid.disconnected_event()
        elif k == CmEventType.TIMEWAIT_EXIT:
            cid._post(T.TIMEWAIT_EXIT)

    @staticmethod
    def rep_param(ev: CmEvent) -> ConnParam | None:
        """The active side's event parameters from the REP (linux
        ``cma_set_rep_event_data``): its resources, flow control, RNR retry count, SRQ
        and the peer's QPN (an XRC TGT QP's from the Local EE Context Number); None for
        an event without a REP (the passive side's)."""
        rep = ev.info.get("rep")
        if rep is None:
            return None
        return ConnParam(ev.private_data, rep.responder_resources, rep.initiator_depth,
                         rep.end_to_end_flow_control, 0, rep.rnr_retry_count, rep.srq,
                         ev.cm_id.remote_qpn)  # the REP's QPN or EECN (rep_received)

    @staticmethod
    def ah_attr(cid: ConnId) -> Any:
        """The UD address handle attributes of a resolved SIDR service (to ``cid``'s peer)."""
        assert cid._dst is not None and cid._src is not None
        sgid = ip_to_gid(cid._src.packed)
        idx = 0
        if cid.verbs is not None:  # a RoCE v2 entry first on a dual device (Linux default)
            port = cid.verbs.port
            idx = max(port.gid_index_of(sgid, False), port.gid_index_of(sgid), 0)
        return AHAttr(gr=GlobalRoute(dgid=ip_to_gid(cid._dst.packed), sgid_index=idx,
                                     hop_limit=64, traffic_class=cid._tos),
                      is_global=1, port_num=1)



class _IwCm(Transport):
    """iWARP: TCP and the MPA Request/Reply (:mod:`softrdma.drivers.cm.iwconnect`)."""

    listen_rank = 0

    def check_ps(self, ps: int) -> None:
        if ps == RDMA_PS_UDP:
            raise InvalidArgument("ps", "iWARP has no UD service: RDMA_PS_UDP needs RoCE")
        if ps == RDMA_PS_IB:  # Linux: iw_cm serves RDMA_PS_TCP ids only (cma.c)
            raise InvalidArgument("ps", "iWARP connects RDMA_PS_TCP ids only: RDMA_PS_IB "
                                        "needs RoCE", errno=errno.EPROTONOSUPPORT)

    def check_user_qp(self) -> None:
        raise InvalidArgument("qp_num", "an application-moved QP needs the IB CM "
                                        "(RoCE); on iWARP use create_qp")

    def listen_on(self, cid: ConnId, dev: OpenDevice, ip: IpAddress, port: int,
                  backlog: int) -> tuple[Any, int]:
        host = str(ip) if not ip.is_unspecified else ("::" if ip.version == 6 else "0.0.0.0")
        on_request = partial(self._on_request, cid, dev)
        tcp = None
        if not port and cid._bind_port:
            try:
                tcp = iw.Listener(dev.ctx, cid._bind_port, host, backlog=min(backlog, 4096),
                                  on_request=on_request)
            except (OSError, SoftRdmaError):
                tcp = None  # taken meanwhile: TCP picks another
        if tcp is None:
            tcp = iw.Listener(dev.ctx, port, host, backlog=min(backlog, 4096),
                              on_request=on_request)
        return tcp, tcp.port

    @staticmethod
    def _on_request(cid: ConnId, dev: OpenDevice, req: Any) -> None:
        """A parsed MPA Request on the listener (the runtime's thread, as soon as it is
        parsed: no thread of ours waits for it) becomes a CONNECT_REQUEST."""
        if cid._destroyed:
            req.reject(b"")
            return
        child = cid._child(dev)
        child._iw_req = req
        peer, local = req.peer_addr, req.local_addr
        child.peer_addr = (str(peer[0]), int(peer[1]))
        child.local_addr = (str(local[0]), int(local[1]))
        v2 = getattr(req.request, "v2", None)
        ird = int(getattr(v2, "ird", 1)) if v2 is not None else 1
        ord_ = int(getattr(v2, "ord", 1)) if v2 is not None else 1
        cid._post_request(child, req.private_data, ConnParam(req.private_data, ird, ord_))

    def stop_listening(self, handle: Any) -> None:
        handle.close()

    def busy(self, cid: ConnId) -> bool:
        return cid._iw_conn is not None

    def has_request(self, cid: ConnId) -> bool:
        return cid._iw_req is not None

    def connected(self, cid: ConnId) -> bool:
        conn = cid._iw_conn
        return conn is not None and conn is not _CONNECTING

    def connect(self, cid: ConnId, p: ConnParam, qp: Any) -> None:
        """The MPA Request goes out at once when the TCP connection is up at once (a
        local peer): the runtime's thread reports the outcome from the connection's
        events, and :data:`iwconnect.timers` the give-up; else a worker thread runs
        the blocking :func:`iwconnect.connect` (issue 26: two thread hand-offs fewer).
        A TCP refusal is made again for a while when ``SOFTRDMA_CM_RETRY_NO_LISTENER``
        asks (:mod:`.rdma_retry`)."""
        window = rdma_retry.window_s()  # a bad value: InvalidArgument, nothing started
        try:  # the Request's private data fits (MPA's limit), else EINVAL now, no event,
            # as Linux's siw_connect returns it to rdma_connect
            build_request(MpaConfig(ird=p.responder_resources, ord=p.initiator_depth),
                          bytes(p.private_data))
        except InvalidArgument as exc:
            raise InvalidArgument("param.private_data", f"{len(p.private_data)} bytes do not "
                                  f"fit an MPA Request ({exc})") from None
        cid._iw_conn = _CONNECTING
        fail: Callable[[SoftRdmaError], None] = partial(self._failed, cid)
        if window > 0:
            retry = rdma_retry.RefusedRetry(
                fail, lambda: self._start(cid, p, qp, retry.failed),
                lambda: not cid._destroyed and cid._iw_conn is _CONNECTING,
                time.monotonic() + window)
            fail = retry.failed
        self._start(cid, p, qp, fail)

    def _start(self, cid: ConnId, p: ConnParam, qp: Any,
               fail: Callable[[SoftRdmaError], None]) -> None:
        """One try of :meth:`connect`; its TCP or MPA failure goes to ``fail``."""
        cfg = MpaConfig(ird=p.responder_resources, ord=p.initiator_depth)
        host, port, pd = str(cid._dst), cid._dst_port, bytes(p.private_data)
        timeout = options.iwarp_timeout
        try:
            started = iw.start_connect(qp, host, port, pd, cfg=cfg)
        except SoftRdmaError as exc:
            fail(exc)
            return
        if started is not None:
            self._follow(cid, started, timeout)
            return

        def run() -> Callable[[], None]:
            """The blocking connect; its outcome is reported once the worker is idle
            again (Workers: the application's next connect reuses this worker)."""
            try:
                conn = iw.connect(qp, host, port, pd, cfg=cfg, timeout=timeout)
            except SoftRdmaError as exc:
                return partial(fail, exc)
            return partial(self._established, cid, conn)

        _connect_workers.submit(run)

    def _follow(self, cid: ConnId, c: iw.Connecting, timeout: float) -> None:
        """Report ``c``'s outcome on ``cid`` from its events (or its timer), then its
        end as DISCONNECTED (:mod:`.rdma_iwwatch` takes over)."""

        def done(got: Any) -> None:
            if isinstance(got, SoftRdmaError):
                self._failed(cid, got)
            else:
                self._established(cid, got)

        def later(ev: ConnEvent) -> None:  # came with the Reply: the watch's rule
            if isinstance(ev, END_EVENTS) and cid._iw_conn is not None:
                cid.disconnected_event()

        c.follow(timeout, done, later)

    @staticmethod
    def _failed(cid: ConnId, exc: SoftRdmaError) -> None:
        """A connect that failed: REJECTED, UNREACHABLE or CONNECT_ERROR."""
        cid._iw_conn = None
        if isinstance(exc, iw.ConnectionRejected):
            cid._post(T.REJECTED, status=-errno.ECONNREFUSED, private_data=exc.private_data,
                      reject=RejectInfo(None, "rejected by the remote consumer "
                                              "(MPA Reply with R set, ECONNREFUSED)"))
            return
        code = exc.errno or errno.ECONNABORTED
        info = RejectInfo(None, str(exc))
        if code == errno.ECONNREFUSED:
            cid._post(T.REJECTED, status=-code, reject=info)
        elif code == errno.ETIMEDOUT:
            cid._post(T.UNREACHABLE, status=-code, reject=info)
        else:
            cid._post(T.CONNECT_ERROR, status=-code, reject=info)

    @staticmethod
    def _established(cid: ConnId, conn: Any) -> None:
        """A connect that succeeded: ESTABLISHED, then the stream's end is watched (an
        id destroyed meanwhile: the connection is closed)."""
        if cid._destroyed:
            try:
                conn.disconnect()
            except SoftRdmaError:
                pass
            return
        cid._iw_conn = conn
        if conn.local_addr:
            cid.local_addr = (str(conn.local_addr[0]), int(conn.local_addr[1]))
        cid._post(T.ESTABLISHED, private_data=conn.private_data,
                  param=ConnParam(conn.private_data, conn.negotiated.ird,
                                  conn.negotiated.ord))
        _watch(cid)

    def accept(self, cid: ConnId, p: ConnParam, qp: Any) -> None:
        req, cid._iw_req = cid._iw_req, None
        cfg = MpaConfig(ird=p.responder_resources, ord=p.initiator_depth)
        try:
            conn = req.accept(cid.qp, bytes(p.private_data), cfg=cfg)
        except InvalidArgument as exc:
            if exc.argument != "user_data":
                raise
            cid._iw_req = req  # nothing was sent: the request may be accepted or rejected
            raise InvalidArgument("param.private_data", f"{len(p.private_data)} bytes do "
                                  f"not fit an MPA Reply ({exc})") from None
        cid._iw_conn = conn
        cid._post(T.ESTABLISHED, param=ConnParam(b"", conn.negotiated.ird,
                                                 conn.negotiated.ord))
        _watch(cid)

    def reject(self, cid: ConnId, private_data: bytes) -> None:
        req, cid._iw_req = cid._iw_req, None
        req.reject(private_data)

    def disconnect(self, cid: ConnId) -> None:
        cid._iw_conn.disconnect()
        cid.disconnected_event()

    def release(self, cid: ConnId) -> None:
        req, cid._iw_req = cid._iw_req, None
        if req is not None:
            try:
                req.reject(b"")
            except SoftRdmaError:
                pass
        conn = cid._iw_conn
        if conn is not None and conn is not _CONNECTING:
            try:
                conn.disconnect()
            except SoftRdmaError:
                pass


_IB_CM = _IbCm()
_IW_CM = _IwCm()


def transport_of(dev: OpenDevice) -> Transport:
    """The connection manager of ``dev``'s transport."""
    return _IW_CM if dev.entry.transport == "iwarp" else _IB_CM
