"""One rdma_cm-style connection API over RoCE and iWARP (librdmacm ``rdma_cma.h``).

Applications connect by IP address and port; the same code runs over both transports::

    ch = EventChannel()
    cid = CmId(ch, RDMA_PS_TCP)
    cid.resolve_addr(None, ("127.0.0.1", 7471), 2000)     # -> ADDR_RESOLVED
    cid.resolve_route(2000)                               # -> ROUTE_RESOLVED
    qp = cid.create_qp(pd, init_attr)                     # pd on cid.verbs
    cid.connect(ConnParam(private_data=b"hi"))            # -> ESTABLISHED | REJECTED | ...
    ...
    cid.disconnect()                                      # -> DISCONNECTED

    lst = CmId(ch); lst.bind_addr(("127.0.0.1", 7471)); lst.listen(8)
    ev = ch.get_cm_event()                                # CONNECT_REQUEST, ev.id is new
    ev.id.create_qp(pd, init_attr); ev.id.accept(ConnParam())  # -> ESTABLISHED

Transports (the device found by :mod:`.rdma_devices` decides; :mod:`.rdma_transport`
holds the connection manager of each, chosen once per id):

* **RoCE**: the IB CM on QP1 with the RDMA IP CM Service (Annex A11); SIDR for
  ``RDMA_PS_UDP``.
* **iWARP**: TCP and the MPA Request/Reply (RFC 5044 §7.1, RFC 6581).

Every event goes to the id's :class:`~.rdma_events.EventChannel`; the connection
managers only queue them (the IB CM's typed events arrive outside the device lock, see
:mod:`softrdma.cm`), the application acts from its own thread or coroutine.
"""

from __future__ import annotations

import errno
import ipaddress
from typing import Any, TypeAlias

from .. import verbs as v
from ..drivers.cm.cm_channel import id_lock
from ..enums import ibv_event_type as _ibv_event
from ..errors import InvalidArgument, SoftRdmaError, StateError
from ..ibcm.cmid import IbCmId
from ..ibcm.events import RejectInfo
from ..ibcm.userqp import UserQp, cm_qp_attr
from ..wire.ipcm import IpAddress
from . import rdma_res  # noqa: F401 - lists our ids for softrdma res show cm_id
from .rdma_devices import (
    OpenDevice,
    bind_device,
    configure,
    devices_for_wildcard,
    find_device,
    open_device,
    release_devices,
)
from .rdma_events import (  # noqa: F401 - the RDMA_CM_EVENT_* names are re-exported
    RDMA_CM_EVENT_ADDR_CHANGE,
    RDMA_CM_EVENT_ADDR_ERROR,
    RDMA_CM_EVENT_ADDR_RESOLVED,
    RDMA_CM_EVENT_CONNECT_ERROR,
    RDMA_CM_EVENT_CONNECT_REQUEST,
    RDMA_CM_EVENT_CONNECT_RESPONSE,
    RDMA_CM_EVENT_DEVICE_REMOVAL,
    RDMA_CM_EVENT_DISCONNECTED,
    RDMA_CM_EVENT_ESTABLISHED,
    RDMA_CM_EVENT_MULTICAST_ERROR,
    RDMA_CM_EVENT_MULTICAST_JOIN,
    RDMA_CM_EVENT_REJECTED,
    RDMA_CM_EVENT_ROUTE_ERROR,
    RDMA_CM_EVENT_ROUTE_RESOLVED,
    RDMA_CM_EVENT_TIMEWAIT_EXIT,
    RDMA_CM_EVENT_UNREACHABLE,
    ConnParam,
    RdmaCmEventType,
    UdParam,
    checked_conn_param,
    checked_private_data,
    event_str,
)
from .rdma_events import EventChannel as _EventChannel
from .rdma_events import RdmaCmEvent as _RdmaCmEvent
from .rdma_iwwatch import unwatch as _unwatch
from .rdma_qpattr import qp_attr_of
from .rdma_qps import id_qp_type, make_qp
from .rdma_state import ADDRESS_KNOWN, BEFORE_CONNECT, CmState
from .rdma_transport import (
    PROTO,
    QPT_UD,
    RDMA_PS_IB,
    RDMA_PS_TCP,
    RDMA_PS_UDP,
    Address,
    Transport,
    ephemeral_port,
    transport_of,
)

__all__ = [
    "CmId", "EventChannel", "ConnParam", "UdParam", "RdmaCmEvent", "RdmaCmEventType",
    "RDMA_PS_TCP", "RDMA_PS_UDP", "RDMA_PS_IB", "RDMA_OPTION_ID", "RDMA_OPTION_ID_TOS",
    "RDMA_OPTION_ID_ACK_TIMEOUT", "event_str", "configure", "release_devices", "Address",
    "CmState",
    *(n for n in dir() if n.startswith("RDMA_CM_EVENT_")),
]

RDMA_PS_IPOIB = 0x0002
RDMA_OPTION_ID = 0  # rdma_set_option levels and names (librdmacm rdma_cma.h)
RDMA_OPTION_ID_TOS = 0
RDMA_OPTION_ID_ACK_TIMEOUT = 3
T = RdmaCmEventType


class EventChannel(_EventChannel["CmId"]):
    """``rdma_create_event_channel``: :class:`~.rdma_events.EventChannel`, generic in
    the id its events are about, bound to :class:`CmId` (``rdma_events`` names no id, so
    it does not import this module back)."""


#: ``struct rdma_cm_event`` of a :class:`CmId` (:class:`~.rdma_events.RdmaCmEvent`)
RdmaCmEvent: TypeAlias = _RdmaCmEvent["CmId"]


def _parse(addr: Any, what: str) -> tuple[IpAddress, int]:
    """``(host, port)``, ``(host, port, flow, scope)``, ``"host"`` or an ip_address."""
    port = 0
    host = addr
    if isinstance(addr, tuple):
        if len(addr) < 2:
            raise InvalidArgument(what, "expected (host, port)")
        host, port = addr[0], addr[1]
    if isinstance(host, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        ip: IpAddress = host
    else:
        try:
            ip = ipaddress.ip_address(str(host or "0.0.0.0").split("%", 1)[0])
        except ValueError:
            raise InvalidArgument(what, f"not an IP address: {host!r}") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not isinstance(port, int) or not 0 <= port <= 0xFFFF:
        raise InvalidArgument(what, f"port must be 0..65535, got {port!r}")
    return ip, port




class CmId:
    """``struct rdma_cm_id`` (see the module docstring). ``context`` is the caller's;
    ``verbs`` the device Context after address resolution or for a CONNECT_REQUEST's
    new id; ``qp`` the QP of :meth:`create_qp`; ``state`` its :class:`CmState`. The
    connection manager underneath (:mod:`.rdma_transport`'s ``_IbCm`` or ``_IwCm``) is chosen once, when
    the id is attached to a device (bind to an address, resolve, or a request's new id),
    as Linux's cma.c chooses it by ``rdma_cap_ib_cm`` / ``rdma_cap_iw_cm``."""

    def __init__(self, channel: _EventChannel[CmId], ps: int = RDMA_PS_TCP,
                 context: Any = None, qp_type: int | None = None) -> None:
        if not isinstance(channel, _EventChannel):
            raise InvalidArgument("channel", "expected an EventChannel")
        if ps == RDMA_PS_IPOIB:  # IPoIB's: valid, not served
            raise InvalidArgument("ps", f"{ps:#06x} is not served: RDMA_PS_TCP, RDMA_PS_UDP "
                                        "or RDMA_PS_IB", errno=errno.EPROTONOSUPPORT)
        if ps not in PROTO:
            raise InvalidArgument("ps", "RDMA_PS_TCP, RDMA_PS_UDP or RDMA_PS_IB")
        qpt = id_qp_type(ps, qp_type)
        self.channel = channel
        self.ps = ps
        #: the id's QP type (``rdma_cm_id.qp_type``): UD ids resolve a service (SIDR),
        #: the others connect (XRC_SEND: an XRC INI QP; XRC_RECV: an XRC TGT QP)
        self.qp_type = qpt
        self.context = context
        self.device: OpenDevice | None = None
        self.verbs: Any = None
        self.pd: Any = None
        self.qp: Any = None
        self.transport: str | None = None
        self.local_addr: Address | None = None
        self.peer_addr: Address | None = None
        self.event_info: dict[str, Any] = {}
        self.state = CmState.IDLE
        self._cm: Transport | None = None  # the connection manager, chosen by _attach
        self._prefer: str | None = None
        self._src: IpAddress | None = None
        self._src_port = 0
        self._bind_port = 0  # the port bind_addr picked for port 0 (listen tries it first)
        self._dst: IpAddress | None = None
        self._dst_port = 0
        self._ib: IbCmId | None = None
        self._listens: list[tuple[OpenDevice, Transport, Any]] = []
        self._iw_req: Any = None
        self._iw_conn: Any = None
        self._established_by_app = False
        self._tos = 0
        self._ack_timeout: int | None = None
        self._lock = id_lock()  # state moves from the app and the CMs' threads

    def __repr__(self) -> str:
        return (f"<rdma_cm CmId {self.transport or '-'} {self.state.value} {self.local_addr}"
                f" -> {self.peer_addr}>")

    @property
    def _destroyed(self) -> bool:
        return self.state is CmState.DESTROYING

    @property
    def _disconnected(self) -> bool:
        """DISCONNECTED was reported (read by softrdma.compat.pyverbs)."""
        return self.state is CmState.DISCONNECT

    def _move(self, to: CmState, frm: frozenset[CmState] = BEFORE_CONNECT) -> None:
        """Enter ``to`` if the id is in one of ``frm`` (a call made in another state
        leaves it; the calls check what they need themselves)."""
        if self.state in frm:
            self.state = to

    # ---- plumbing ----------------------------------------------------------------------
    def _post(self, kind: RdmaCmEventType, **kw: Any) -> None:
        if not self._destroyed:
            self.channel.post(_RdmaCmEvent(kind, self, **kw))

    def _check(self) -> None:
        if self._destroyed:
            raise StateError("the rdma_cm id is destroyed")

    def _attach(self, dev: OpenDevice) -> None:
        if self.device is not None and self.device is not dev:
            self.device.ids.discard(self)
        self.device = dev
        self.verbs = dev.ctx
        self.transport = dev.entry.transport
        self._cm = transport_of(dev)
        dev.ids.add(self)
        self._cm.check_ps(self.ps)

    def set_option(self, level: int, optname: int, value: int) -> None:
        """``rdma_set_option`` on ``RDMA_OPTION_ID``: ``RDMA_OPTION_ID_TOS`` (the traffic
        class of the connection's path: the REQ's GRH fields, the QPs' and a UD address
        handle's traffic class) and ``RDMA_OPTION_ID_ACK_TIMEOUT`` (the QP's local ACK
        timeout, 4.096 us * 2^value, as Linux ``rdma_set_ack_timeout``). RoCE only."""
        self._check()
        if level != RDMA_OPTION_ID:
            raise InvalidArgument("level", f"only RDMA_OPTION_ID ({RDMA_OPTION_ID}) options "
                                           f"are supported, got {level}")
        if optname == RDMA_OPTION_ID_TOS:
            if not 0 <= value <= 0xFF:
                raise InvalidArgument("value", f"a TOS is 0..255, got {value}")
            self._tos = value
        elif optname == RDMA_OPTION_ID_ACK_TIMEOUT:
            self.set_ack_timeout(value)
        else:
            raise InvalidArgument("optname", f"option {optname} is not supported (TOS "
                                             f"{RDMA_OPTION_ID_TOS}, ACK_TIMEOUT "
                                             f"{RDMA_OPTION_ID_ACK_TIMEOUT})")

    def migrate(self, channel: _EventChannel[CmId]) -> None:
        """``rdma_migrate_id``: later events (and those not yet taken) go to ``channel``."""
        self._check()
        if not isinstance(channel, _EventChannel):
            raise InvalidArgument("channel", "expected an EventChannel")
        old, self.channel = self.channel, channel
        if old is not channel:
            for ev in old.take_events_of(self):
                channel.post(ev)

    @property
    def iw_connection(self) -> Any:
        """The iWARP connection (:mod:`softrdma.drivers.cm.iwconnect`), the connecting marker, or None."""
        return self._iw_conn

    @property
    def port_num(self) -> int:
        return 1

    def get_local_addr(self) -> Address | None:
        """``rdma_get_local_addr``."""
        return self.local_addr

    def get_peer_addr(self) -> Address | None:
        """``rdma_get_peer_addr``."""
        return self.peer_addr

    def set_ack_timeout(self, timeout: int) -> None:
        """``rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)``: the Local ACK Timeout
        (4.096 us * 2^timeout, IBA 9.7.6.1.3) the CM gives this id's QP at RTS."""
        self._check()
        if not isinstance(timeout, int) or not 0 <= timeout <= 31:
            raise InvalidArgument("timeout", f"must be 0..31, got {timeout!r}")
        self._ack_timeout = timeout
        if self._ib is not None:
            self._ib.local_ack_timeout = timeout

    # ---- addresses ---------------------------------------------------------------------
    def bind_addr(self, addr: Any, *, device: str | None = None) -> None:
        """``rdma_bind_addr``: the local address and port. Port 0 picks one now, as the
        kernel's ``cma_alloc_any_port`` does, so ``rdma_get_src_port`` tells it before
        ``rdma_listen`` (qperf sends it to its client then); ``listen`` takes it, or
        another if it was taken meanwhile. The wildcard address listens on every device
        of the preferred transport (``device``: a device name, ``"roce"`` or ``"iwarp"``;
        default RoCE). A loopback address no device owns binds no device either
        (:func:`~.rdma_devices.bind_device`: the kernel's ``cma_any_addr``), so the id's
        ``verbs`` stays None and it listens on the devices the wildcard would, each
        listener still bound to that address (the A11 checks)."""
        self._check()
        ip, port = _parse(addr, "addr")
        self._prefer = device
        self._src, self._src_port = ip, port
        if not ip.is_unspecified:
            entry = bind_device(ip, device)
            if entry is not None:
                self._attach(open_device(entry))
        self._move(CmState.ADDR_BOUND, frozenset({CmState.IDLE, CmState.ADDR_BOUND}))
        self._bind_port = 0 if port else ephemeral_port()
        self.local_addr = (str(ip), port or self._bind_port)

    def resolve_addr(self, src: Any, dst: Any, timeout_ms: int = 2000, *,
                     device: str | None = None) -> None:
        """``rdma_resolve_addr``: find the local device for ``src`` (None: the one that
        routes to ``dst``) and queue ADDR_RESOLVED (or ADDR_ERROR for an unroutable
        address). ``dst`` carries the port to connect to."""
        self._check()
        dip, dport = _parse(dst, "dst")
        if dip.is_unspecified:
            raise InvalidArgument("dst", "the destination must be a unicast address")
        prefer = device if device is not None else self._prefer
        sip: IpAddress | None = None
        sport = self._src_port
        if src is not None:
            sip, sport = _parse(src, "src")
        elif (self.state is CmState.ADDR_BOUND and self._src is not None
              and not self._src.is_unspecified):
            sip = self._src
        before = self.state
        self._move(CmState.ADDR_QUERY)
        try:
            entry, sip = find_device(sip, dip, prefer)
            if sip.version != dip.version:
                raise InvalidArgument("src", f"IPv{sip.version} source, IPv{dip.version} "
                                             "destination")
            self._attach(open_device(entry))
        except SoftRdmaError as exc:
            self._move(before, frozenset({CmState.ADDR_QUERY}))
            self._post(T.ADDR_ERROR, status=-(exc.errno or errno.EADDRNOTAVAIL),
                       reject=RejectInfo(None, str(exc)))
            return
        assert self._cm is not None
        self._src, self._dst, self._dst_port = sip, dip, dport
        sport = self._cm.source_port(sport)
        self._src_port = sport
        self.local_addr = (str(sip), sport)
        self.peer_addr = (str(dip), dport)
        self._move(CmState.ADDR_RESOLVED)
        self._post(T.ADDR_RESOLVED)

    def resolve_route(self, timeout_ms: int = 2000) -> None:
        """``rdma_resolve_route``: RoCE v2 and TCP need no path query; ROUTE_RESOLVED."""
        self._check()
        if self.state not in ADDRESS_KNOWN:
            raise StateError("resolve_route before the address is resolved")
        self._move(CmState.ROUTE_RESOLVED)
        self._post(T.ROUTE_RESOLVED)

    # ---- QPs ---------------------------------------------------------------------------
    def create_qp(self, pd: Any = None, init_attr: Any = None, xrcd: Any = None) -> Any:
        """``rdma_create_qp``: a QP on ``pd`` (None: a PD of the id's device) left to the
        CM to connect; a UD QP (a UD id: ``RDMA_PS_UDP``) goes to RTS at once with the
        rdma_cm Q_Key 0x01234567, as librdmacm does. An XRC TGT QP
        (``IBV_QPT_XRC_RECV``, on an ``RDMA_PS_IB`` id) belongs to ``xrcd`` (None: the
        device's XRC domain of rdma_cm, as librdmacm's ``ucma_get_xrcd``)."""
        self._check()
        if self.verbs is None:
            raise StateError("create_qp needs a resolved address or a CONNECT_REQUEST id")
        if self.qp is not None:
            raise StateError("the id already has a QP")
        if init_attr is None:
            raise InvalidArgument("init_attr", "rdma_create_qp needs the QP init attributes")
        if pd is None and init_attr.qp_type != v.qp.XRC_RECV:  # XRC TGT: no PD
            pd = self.pd if self.pd is not None else v.PD(self.verbs)
        qp = make_qp(self.verbs, self.qp_type, pd, init_attr, xrcd)
        if pd is not None:
            self.pd = pd
        self.qp = qp
        return qp

    def destroy_qp(self) -> None:
        """``rdma_destroy_qp``."""
        qp = self.qp
        self.release_qp()
        if qp is not None:
            qp.close()

    def release_qp(self) -> None:
        """Hand the id's QP back to the application: the connection manager no longer
        moves it (a DREQ, DREP or REJ leaves it as it is). librdmacm's id moves only
        ``id->qp``, which a program may clear once connected (libfabric's XRC
        endpoints keep their INI and TGT QPs past the CM connections they tear down);
        the C interface calls this when it finds ``id->qp`` cleared, and at
        ``rdma_destroy_qp``."""
        self.qp = None
        ib = self._ib
        if ib is not None:
            ib.agent.api(lambda _now: setattr(ib, "qp", None), None)

    # ---- active side -------------------------------------------------------------------
    def connect(self, param: ConnParam | None = None) -> None:
        """``rdma_connect``: ESTABLISHED, REJECTED, UNREACHABLE or CONNECT_ERROR follow
        (UD: ESTABLISHED with ``event.ud``)."""
        self._check()
        p = checked_conn_param(param)
        if self.state not in ADDRESS_KNOWN or self.device is None or self._cm is None:
            raise StateError("connect before resolve_addr/resolve_route")
        qp = self._conn_qp(p, "connect")
        if self._cm.busy(self):
            raise StateError("the id is already connecting or connected")
        assert self._src is not None and self._dst is not None
        self._move(CmState.CONNECT)
        self._cm.connect(self, p, qp)

    def _conn_qp(self, p: ConnParam, what: str) -> Any:
        """The id's QP, or (no QP, ``p.qp_num`` set) the application's own QP of that
        number (librdmacm: ``conn_param.qp_num``; see :mod:`softrdma.ibcm.userqp`)."""
        if self.qp is not None or self.qp_type == QPT_UD:
            return self.qp
        if not p.qp_num:
            raise StateError(f"{what} needs the QP of create_qp or ConnParam.qp_num")
        if self._cm is not None:
            self._cm.check_user_qp()
        qpt = self.qp_type if self.qp_type in (v.qp.XRC_SEND, v.qp.XRC_RECV) else int(v.qp.RC)
        return UserQp(p.qp_num, qpt, srq=bool(p.srq))

    def establish(self) -> None:
        """``rdma_establish``: after CONNECT_RESPONSE on a connection whose QP the
        application moves itself, send the RTU (no ESTABLISHED event follows, as in
        librdmacm)."""
        self._check()
        if self._ib is None or self.qp is not None:
            raise StateError("establish is for an application-moved QP after "
                             "CONNECT_RESPONSE")
        self._established_by_app = True
        self._ib.establish()

    def notify(self, event: int) -> None:
        """``rdma_notify``: the application saw ``event`` (an ``ibv_event_type``) on the
        connection's QP. ``IBV_EVENT_COMM_EST`` before the RTU establishes a RoCE
        connection (IBA 12.9.7.3; ESTABLISHED follows; already established is
        ``EISCONN``); iWARP takes any event and does nothing, as Linux cma.c. Other events
        are ``EINVAL`` (``ib_cm_notify``; no alternate path is served for PATH_MIG)."""
        self._check()
        if self.transport == "iwarp":  # set with the connection manager (_attach)
            return
        if self._ib is None:
            raise StateError("notify needs a RoCE connection request or response")
        if event != _ibv_event.IBV_EVENT_COMM_EST:
            raise InvalidArgument("event", f"{event} is not IBV_EVENT_COMM_EST")
        self._ib.notify_comm_est()

    def init_qp_attr(self, qp_state: int) -> tuple[Any, int]:
        """``rdma_init_qp_attr``: ``(QPAttr, attr_mask)`` moving an application-created
        QP of this connection to ``qp_state`` (INIT, RTR, RTS; RoCE)."""
        self._check()
        ib = self._ib
        if ib is None:
            raise StateError("init_qp_attr needs a connection request or response")
        got = ib.agent.api(lambda t: cm_qp_attr(ib, qp_state), None)
        if "timeout" in got and self._ack_timeout is not None:
            got["timeout"] = self._ack_timeout
        return qp_attr_of(self.verbs, got)

    # ---- passive side ------------------------------------------------------------------
    def listen(self, backlog: int = 1024) -> None:
        """``rdma_listen`` on the bound address (CONNECT_REQUEST events follow)."""
        self._check()
        if self.state is CmState.LISTEN:
            raise StateError("the id already listens")
        if self.state is not CmState.ADDR_BOUND or self._src is None:
            raise StateError("listen before bind_addr")
        if not isinstance(backlog, int) or isinstance(backlog, bool):
            raise InvalidArgument("backlog", f"must be an int, got {backlog!r}")
        if backlog <= 0:
            backlog = 1024
        ip = self._src
        if self.device is None:  # the wildcard, or a loopback address no device owns
            devs = [open_device(e) for e in devices_for_wildcard(ip.version, self._prefer)]
            if not devs:
                raise StateError(f"no softrdma device to listen on for IPv{ip.version}")
        else:
            devs = [self.device]
        for dev in devs:
            transport_of(dev).check_ps(self.ps)
        port = self._src_port
        devs.sort(key=lambda d: transport_of(d).listen_rank)  # TCP picks port 0 first
        try:
            for dev in devs:
                cm = transport_of(dev)
                handle, port = cm.listen_on(self, dev, ip, port, backlog)
                self._listens.append((dev, cm, handle))
                dev.ids.add(self)
        except BaseException:
            self._stop_listening()
            raise
        self._src_port = port
        self.local_addr = (str(ip), port)
        self.state = CmState.LISTEN

    def _child(self, dev: OpenDevice) -> CmId:
        """A CONNECT_REQUEST's new id: on the listener's channel, in CONNECT."""
        child = CmId(self.channel, self.ps, self.context, self.qp_type)
        child._attach(dev)
        child._prefer = self._prefer
        child.state = CmState.CONNECT
        return child

    def _post_request(self, child: CmId, private_data: bytes, param: ConnParam,
                      **kw: Any) -> None:
        """Queue the CONNECT_REQUEST of ``child`` (a new id of :meth:`_child`) on this
        listener's channel."""
        self.channel.post(_RdmaCmEvent(T.CONNECT_REQUEST, child, self, 0, private_data, param,
                                       **kw))

    def accept(self, param: ConnParam | None = None) -> None:
        """``rdma_accept`` on a CONNECT_REQUEST's id: REP (RoCE; the QP goes to RTS
        first), SIDR_REP (UD), or the MPA Reply (iWARP). ESTABLISHED follows (not for
        UD, as librdmacm)."""
        self._check()
        p = checked_conn_param(param)
        qp = self._conn_qp(p, "accept")
        if self._cm is None or not self._cm.has_request(self):
            raise StateError("accept on an id without a connection request")
        self._cm.accept(self, p, qp)

    def reject(self, private_data: bytes = b"") -> None:
        """``rdma_reject``: REJ reason 28 (RoCE; SIDR_REP status 2 for UD) or an MPA Reply
        with R set (iWARP), carrying ``private_data``."""
        self._check()
        checked_private_data(private_data, "private_data")
        if self._cm is None or not self._cm.has_request(self):
            raise StateError("reject on an id without a connection request")
        self._cm.reject(self, bytes(private_data))

    # ---- release -----------------------------------------------------------------------
    def disconnect(self) -> None:
        """``rdma_disconnect``: DREQ (RoCE) or FIN (iWARP); the QP goes to ERR and both
        sides get DISCONNECTED."""
        self._check()
        if self._cm is None or not self._cm.connected(self):
            raise StateError("disconnect on an id that is not connected")
        self._cm.disconnect(self)

    def disconnected_event(self) -> None:
        """Queue DISCONNECTED once (our disconnect, the peer's, or the iWARP stream
        closing, seen by :mod:`.rdma_iwwatch`)."""
        with self._lock:
            if self.state in (CmState.DISCONNECT, CmState.DESTROYING):
                return
            self.state = CmState.DISCONNECT
        self._post(T.DISCONNECTED)

    def destroy(self) -> None:
        """``rdma_destroy_id``: stop listening, release what the id holds (a connection
        still up is disconnected), no more events. The QP is the caller's
        (:meth:`destroy_qp`)."""
        with self._lock:
            if self.state is CmState.DESTROYING:
                return
            self.state = CmState.DESTROYING
        self._stop_listening()
        if self._cm is not None:
            self._cm.release(self)
        _unwatch(self)
        if self.device is not None:
            self.device.ids.discard(self)
        for child in self.channel.drop_for(self):  # unread requests of a listener: refused
            child.destroy()

    def _stop_listening(self) -> None:
        listens, self._listens = self._listens, []
        for dev, cm, handle in listens:
            try:
                cm.stop_listening(handle)
            except SoftRdmaError:
                pass
            if dev is not self.device:
                dev.ids.discard(self)

    def device_removed(self) -> None:
        """Queue DEVICE_REMOVAL (:mod:`.rdma_devices`: the id's device went away)."""
        with self._lock:
            if self.state is not CmState.DESTROYING:
                self.state = CmState.DEVICE_REMOVAL
        self._post(T.DEVICE_REMOVAL)
