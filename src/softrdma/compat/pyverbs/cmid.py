"""``pyverbs.cmid``: the RDMA connection manager API (librdmacm; rdma-core
``pyverbs/cmid.pyx`` API), mapped onto :mod:`softrdma.cm.rdma_cm`.

The same pyverbs program connects over RoCE (the IB CM with the A11 IP CM header) and
iWARP (TCP + MPA): the device that owns the address decides, as with librdmacm.

* **Asynchronous ids**: ``CMID(creator=CMEventChannel(), port_space=...)``; each call
  is answered by an event read with ``CMEvent(channel)``. A CONNECT_REQUEST's new id is
  ``CMID(creator=event, listen_id=listener)``.
* **Synchronous ids** (``rdma_create_ep``): ``CMID(creator=AddrInfo(...),
  qp_init_attr=...)`` resolves the address and route at once (active side) or binds
  (``RAI_PASSIVE``); ``connect``/``accept`` return once the connection is established
  and ``get_request`` waits for the next connection request.
* ``create_qp`` makes the CQs itself when the init attributes have none (librdmacm
  ``rdma_create_qp``); ``post_send``/``post_recv``/``post_ud_send``/``post_read``/
  ``post_write`` and ``get_send_comp``/``get_recv_comp`` (blocking) are the
  ``rdma_verbs.h`` helpers.
* ``join_multicast``/``leave_multicast`` (UD ids, RoCE): the MGID of an IPv4 group is
  its IPv4-mapped address (Linux ``cma_iboe_set_mgid``); MULTICAST_JOIN carries the
  group's address handle, QPN 0xFFFFFF and the rdma_cm Q_Key.

Errors raise :class:`PyverbsRDMAError` with the errno of the cause.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from softrdma.cm import rdma_cm as rc
from softrdma.cm import rdma_devices, rdma_mcast
from softrdma.cm.rdma_events import RdmaCmEventType as T
from softrdma.compat import DEVICE_ENV
from softrdma.errors import SoftRdmaError
from softrdma.ibcm.qpctl import DEFAULT_ACCESS
from softrdma.wire.ipcm import RDMA_UDP_QKEY

from . import cm_enums as ce
from . import libibverbs_enums as e
from ._qp_attrs import ah_attr_from_verbs, qp_attr_from_verbs
from .addr import AHAttr
from .base import PyverbsCM, PyverbsObject, rdma_error, translate
from .cq import CQ, WC
from .device import Context
from .mr import MR
from .pd import PD
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError
from .qp import QP, QPAttr, QPInitAttr
from .wr import SGE, RecvWR, SendWR

__all__ = ["AddrInfo", "ConnParam", "UDParam", "JoinMCAttrEx", "CMEventChannel", "CMEvent",
           "CMID"]

_POLL_PAUSE_S = 0.0002  # between polls of a blocking get_*_comp (rdma_get_*_comp)
#: a synchronous id's longest wait for the event of an operation it started (address,
#: route, connect, accept); get_request waits for its client without a limit
_SYNC_WAIT_S = 30.0
PS = ce.rdma_port_space
_PS = {int(PS.RDMA_PS_TCP): rc.RDMA_PS_TCP, int(PS.RDMA_PS_UDP): rc.RDMA_PS_UDP,
       int(PS.RDMA_PS_IB): rc.RDMA_PS_IB}


def _prefer(addr: Any) -> str | None:
    """The device ``$SOFTRDMA_PYVERBS_DEVICE`` names when it owns ``addr`` (so the
    program runs on the device ``softrdma pyverbs --dev`` chose, RoCE or iWARP), else
    None: the rdma_cm layer's own choice."""
    want = os.environ.get(DEVICE_ENV)
    if not want or addr is None:
        return None
    try:
        packed = ipaddress.ip_address(str(addr[0]).split("%", 1)[0]).packed
    except ValueError:
        return None
    for d in rdma_devices.candidates():
        if d.name == want and (packed in d.ips or not any(d.ips)):
            return want
    return None


def _context(name: str, transport: str) -> Context:
    """The devices the rdma_cm layer opens in a pyverbs program are pyverbs Contexts."""
    return Context(name=name)


rdma_devices.options.context_factory = _context


class AddrInfo(PyverbsObject):
    """``rdma_getaddrinfo``: source and destination socket addresses."""

    def __init__(self, src: str | None = None, dst: str | None = None,
                 src_service: str | None = None, dst_service: str | None = None,
                 port_space: int = int(PS.RDMA_PS_TCP), flags: int = 0) -> None:
        if port_space not in (int(PS.RDMA_PS_TCP), int(PS.RDMA_PS_UDP), int(PS.RDMA_PS_IB),
                              int(PS.RDMA_PS_IPOIB)):
            raise PyverbsUserError(f"Unknown port space {port_space}")
        self.port_space = port_space
        self.flags = flags
        self.src_addr = self._resolve(src, src_service) if src is not None else None
        self.dst_addr = self._resolve(dst, dst_service) if dst is not None else None

    @staticmethod
    def _resolve(host: str, service: str | None) -> tuple[Any, ...]:
        try:
            infos = socket.getaddrinfo(host.split("%", 1)[0], service, 0, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise PyverbsRDMAError(f"Failed to get address info ({exc})", errno.EADDRNOTAVAIL) from exc
        return tuple(infos[0][4])

    def close(self) -> None:
        """Nothing to release."""


class ConnParam(PyverbsObject):
    """``struct rdma_conn_param``."""

    def __init__(self, resources: int = 1, depth: int = 1, flow_control: int = 0,
                 retry: int = 5, rnr_retry: int = 5, srq: int = 0, qp_num: int = 0,
                 data_len: int = 0) -> None:
        self.responder_resources = resources
        self.initiator_depth = depth
        self.flow_control = flow_control
        self.retry_count = retry
        self.rnr_retry_count = rnr_retry
        self.srq = srq
        self.qpn = qp_num
        self.private_data = b"\0" * data_len

    def set_private_data(self, data: bytes) -> None:
        self.private_data = bytes(data)

    def to_cm(self) -> rc.ConnParam:
        return rc.ConnParam(bytes(self.private_data), self.responder_resources,
                            self.initiator_depth, self.flow_control, self.retry_count,
                            self.rnr_retry_count, self.srq, self.qpn)


class UDParam(PyverbsObject):
    """``struct rdma_ud_param``: the peer's QPN, Q_Key and address (of an ESTABLISHED
    or MULTICAST_JOIN event)."""

    def __init__(self, cm_event: Any = None) -> None:
        ud = cm_event._event.ud if isinstance(cm_event, CMEvent) else None
        self.qp_num = int(ud.qp_num) if ud is not None else 0
        self.qkey = int(ud.qkey) if ud is not None else 0
        self.ah_attr = ah_attr_from_verbs(ud.ah_attr) if ud is not None else AHAttr()


@dataclass(eq=False)
class JoinMCAttrEx(PyverbsObject):
    """``struct rdma_cm_join_mc_attr_ex``."""

    addr: Any = None
    comp_mask: int = 0
    join_flags: int = 0


class CMEventChannel(PyverbsObject):
    """``rdma_create_event_channel``."""

    def __init__(self) -> None:
        self.channel = rc.EventChannel()

    def close(self) -> None:
        self.channel.close()


class CMEvent(PyverbsObject):
    """``rdma_get_cm_event``: waits for the channel's next event."""

    def __init__(self, channel: CMEventChannel) -> None:
        if not isinstance(channel, CMEventChannel):
            raise PyverbsUserError("CMEvent needs a CMEventChannel")
        with translate("Failed to create CMEvent"):
            self._event = channel.channel.get_cm_event()
        self._acked = False

    @property
    def event_type(self) -> int:
        return int(self._event.event)

    @property
    def private_data(self) -> bytes:
        return bytes(self._event.private_data)

    @property
    def status(self) -> int:
        return self._event.status

    def event_str(self) -> str:
        return rc.event_str(self._event.event)

    def ack_cm_event(self) -> None:
        """``rdma_ack_cm_event``."""
        self._acked = True

    def close(self) -> None:
        self._acked = True


def _wait(ch: rc.EventChannel, want: int, what: str,
          timeout: float | None = _SYNC_WAIT_S) -> rc.RdmaCmEvent:
    """A synchronous id's next event, which must be ``want`` (``timeout`` None: wait
    for ever, as a blocking ``rdma_get_cm_event``)."""
    with translate(f"Failed to {what}"):
        ev = ch.get_cm_event(timeout=timeout)
    if int(ev.event) != want:
        code = errno.ECONNREFUSED if ev.event == T.REJECTED else errno.EIO
        raise PyverbsRDMAError(f"Failed to {what}: {ev.text}", code)
    return ev


class CMID(PyverbsCM):
    """``rdma_create_id`` / ``rdma_create_ep`` (see the module docstring)."""

    def __init__(self, creator: Any = None, qp_init_attr: QPInitAttr | None = None,
                 pd: PD | None = None, port_space: int = int(PS.RDMA_PS_TCP),
                 listen_id: CMID | None = None) -> None:
        self.event_channel: CMEventChannel | None = None
        self.ctx: Context | None = None
        self.pd: PD | None = pd
        self.qp: QP | None = None
        self._scq: CQ | None = None
        self._rcq: CQ | None = None
        self._sync_ch: rc.EventChannel | None = None
        self._qp_init_attr = qp_init_attr
        self._id: rc.CmId | None = None
        if creator is None:
            return
        if isinstance(creator, AddrInfo):
            self._create_ep(creator, qp_init_attr)
        elif isinstance(creator, CMEventChannel):
            self.event_channel = creator
            self._id = self._new_id(creator.channel, port_space)
        elif isinstance(creator, CMEvent):
            if listen_id is None:
                raise PyverbsUserError("listen ID not provided")
            self._id = creator._event.id
            self.event_channel = listen_id.event_channel
            self._adopt()
        else:
            raise PyverbsUserError(f"Cannot create CM ID from {type(creator).__name__}")

    @staticmethod
    def _new_id(ch: rc.EventChannel, port_space: int) -> rc.CmId:
        ps = _PS.get(int(port_space))
        if ps is None:
            raise PyverbsRDMAError(f"Failed to create CM ID: port space {port_space} is not "
                                   "supported (RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB)",
                                   errno.EPROTONOSUPPORT)
        return rc.CmId(ch, ps)

    def _create_ep(self, ai: AddrInfo, qp_init_attr: QPInitAttr | None) -> None:
        """``rdma_create_ep``: a synchronous id, bound (passive) or resolved (active)."""
        self._sync_ch = rc.EventChannel()
        self._id = self._new_id(self._sync_ch, ai.port_space)
        if ai.flags & ce.RAI_PASSIVE:
            self.bind_addr(ai)
            return
        self.resolve_addr(ai)
        _wait(self._sync_ch, T.ADDR_RESOLVED, "resolve the address")
        self.resolve_route()
        _wait(self._sync_ch, T.ROUTE_RESOLVED, "resolve the route")
        if qp_init_attr is not None:
            self.create_qp(qp_init_attr)

    def _cid(self) -> rc.CmId:
        if self._id is None:
            raise PyverbsRDMAError("the CM ID is closed", errno.EBADF)
        return self._id

    def _adopt(self) -> None:
        """The id's device (after bind/resolve, or a request's new id): its Context and
        a PD on it."""
        ctx = self._cid().verbs
        if ctx is not None and self.ctx is None:
            if not isinstance(ctx, Context):
                raise PyverbsRDMAError("the device was opened outside pyverbs", errno.EINVAL)
            self.ctx = ctx
        if self.pd is None and self.ctx is not None:
            self.pd = PD(self.ctx)

    @property
    def context(self) -> Context | None:
        return self.ctx

    @property
    def qpn(self) -> int:
        if self.qp is None:
            raise PyverbsUserError("the CM ID has no QP")
        return self.qp.qp_num

    # ---- addresses ----------------------------------------------------------------------------
    def bind_addr(self, lai: AddrInfo) -> None:
        """``rdma_bind_addr``."""
        if lai.src_addr is None:
            raise PyverbsUserError("bind_addr needs an AddrInfo with a source address")
        with translate("Failed to Bind ID"):
            self._cid().bind_addr(lai.src_addr, device=_prefer(lai.src_addr))
        self._adopt()

    def resolve_addr(self, rai: AddrInfo, timeout_ms: int = 2000) -> None:
        """``rdma_resolve_addr``: ADDR_RESOLVED (or ADDR_ERROR) follows."""
        if rai.dst_addr is None:
            raise PyverbsUserError("resolve_addr needs an AddrInfo with a destination")
        with translate("Failed to Resolve Address"):
            self._cid().resolve_addr(rai.src_addr, rai.dst_addr, timeout_ms,
                                     device=_prefer(rai.src_addr or rai.dst_addr))
        self._adopt()

    def resolve_route(self, timeout_ms: int = 2000) -> None:
        """``rdma_resolve_route``: ROUTE_RESOLVED follows."""
        with translate("Failed to Resolve Route"):
            self._cid().resolve_route(timeout_ms)
        self._adopt()

    # ---- connections --------------------------------------------------------------------------
    def listen(self, backlog: int = 0) -> None:
        """``rdma_listen``."""
        with translate("Listen Failed"):
            self._cid().listen(backlog)

    def get_request(self) -> CMID:
        """``rdma_get_request`` (synchronous listener): the next request's new id, with a
        QP when the listener was created with QP init attributes. Blocks until a client
        comes, however long that takes, as librdmacm's does (a server waits for its
        clients; Ctrl-C or closing the listener ends the wait)."""
        if self._sync_ch is None:
            raise PyverbsRDMAError("Failed to get request: not a synchronous id", errno.EINVAL)
        ev = _wait(self._sync_ch, T.CONNECT_REQUEST, "get request", timeout=None)
        child = CMID()
        child._id = ev.id
        child._sync_ch = rc.EventChannel()
        ev.id.migrate(child._sync_ch)
        child._adopt()
        if self.ctx is None:
            self.ctx, self.pd = child.ctx, child.pd
        if self._qp_init_attr is not None:
            child.create_qp(self._qp_init_attr)
        return child

    def connect(self, param: ConnParam | None = None) -> None:
        """``rdma_connect`` (a synchronous id returns once established)."""
        with translate("Failed to Connect"):
            self._cid().connect(param.to_cm() if param is not None else None)
        if self._sync_ch is not None:
            _wait(self._sync_ch, T.ESTABLISHED, "Connect")

    def accept(self, param: ConnParam | None = None) -> None:
        """``rdma_accept`` (a synchronous id returns once established)."""
        cid = self._cid()
        with translate("Failed to Accept Connection"):
            cid.accept(param.to_cm() if param is not None else None)
        if self._sync_ch is not None and cid.ps == rc.RDMA_PS_TCP:
            _wait(self._sync_ch, T.ESTABLISHED, "Accept Connection")

    def reject(self, private_data: bytes = b"") -> None:
        """``rdma_reject``."""
        with translate("Failed to Reject Connection"):
            self._cid().reject(bytes(private_data))

    def establish(self) -> None:
        """``rdma_establish`` (an application-moved QP, after CONNECT_RESPONSE)."""
        with translate("Failed to Complete an active connection request"):
            self._cid().establish()

    def disconnect(self) -> None:
        """``rdma_disconnect``; a connection the peer already closed is left as it is
        (Linux answers the DREQ itself)."""
        cid = self._cid()
        try:
            cid.disconnect()
        except SoftRdmaError as exc:
            if not cid._disconnected:
                raise rdma_error("Failed to Disconnect", exc) from exc

    def set_option(self, level: int, optname: int, optval: int, optlen: int = 0) -> None:
        """``rdma_set_option``: ``RDMA_OPTION_ID_ACK_TIMEOUT``."""
        if level != ce.RDMA_OPTION_ID or optname != ce.RDMA_OPTION_ID_ACK_TIMEOUT:
            raise PyverbsRDMAError(f"Failed to Set Option: level {level} option {optname} "
                                   "is not supported", errno.ENOSYS)
        with translate("Failed to Set Option"):
            self._cid().set_ack_timeout(int(optval))

    def get_remote_ece(self) -> Any:
        raise PyverbsRDMAError("Failed to get remote ECE: ECE is not supported",
                               errno.EOPNOTSUPP)

    def set_local_ece(self, ece: Any) -> None:
        raise PyverbsRDMAError("Failed to set local ECE: ECE is not supported",
                               errno.EOPNOTSUPP)

    # ---- QPs ------------------------------------------------------------------------------------
    def create_qp(self, qp_init: QPInitAttr) -> None:
        """``rdma_create_qp`` on the id's PD: CQs are made when ``qp_init`` has none; RC
        goes to INIT with the rdma_cm access rights, UD to RTS with the rdma_cm Q_Key."""
        cid = self._cid()
        self._adopt()
        if self.pd is None or self.ctx is None:
            raise PyverbsRDMAError("Failed to Create QP: the id has no device yet",
                                   errno.EINVAL)
        if self.qp is not None:
            raise PyverbsRDMAError("Failed to Create QP: the id has a QP", errno.EINVAL)
        if qp_init.send_cq is None:
            self._scq = CQ(self.ctx, max(1, qp_init.cap.max_send_wr))
            qp_init.send_cq = self._scq
        if qp_init.recv_cq is None:
            self._rcq = CQ(self.ctx, max(1, qp_init.cap.max_recv_wr))
            qp_init.recv_cq = self._rcq
        ud = cid.qp_type == e.IBV_QPT_UD  # the id's type: RDMA_PS_UDP ids are UD
        if (qp_init.qp_type == e.IBV_QPT_UD) != ud:
            raise PyverbsRDMAError("Failed to Create QP: RDMA_PS_UDP takes UD QPs, "
                                   "RDMA_PS_TCP and RDMA_PS_IB RC QPs", errno.EINVAL)
        qp = QP(self.pd, qp_init)
        attr: Any = QPAttr(port_num=cid.port_num)  # the int fields are set dynamically
        try:
            if ud:
                attr.qkey = RDMA_UDP_QKEY
                qp.to_rts(attr)
            else:
                attr.qp_access_flags = DEFAULT_ACCESS  # librdmacm ucma_init_conn_qp
                qp.to_init(attr)
        except BaseException:
            qp.close()
            raise
        self.qp = qp
        cid.qp = qp
        cid.pd = self.pd

    def query_qp(self, attr_mask: int) -> tuple[QPAttr, QPInitAttr]:
        """``ibv_query_qp`` on the id's QP."""
        if self.qp is None:
            raise PyverbsRDMAError("Failed to query QP: the id has no QP", errno.EINVAL)
        return self.qp.query(attr_mask)

    def init_qp_attr(self, qp_state: int) -> tuple[QPAttr, int]:
        """``rdma_init_qp_attr``: attributes moving the application's own QP to
        ``qp_state``."""
        with translate("Failed to get QP attributes"):
            va, mask = self._cid().init_qp_attr(int(qp_state))
        return qp_attr_from_verbs(va), mask

    # ---- rdma_verbs.h --------------------------------------------------------------------------
    def _mr(self, size: int, access: int) -> MR:
        if self.pd is None:
            raise PyverbsRDMAError("Failed to register memory: the id has no PD", errno.EINVAL)
        return MR(self.pd, size, access)

    def reg_msgs(self, size: int) -> MR:
        """``rdma_reg_msgs``."""
        return self._mr(size, int(e.IBV_ACCESS_LOCAL_WRITE))

    def reg_read(self, size: int) -> MR:
        """``rdma_reg_read``."""
        return self._mr(size, int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ))

    def reg_write(self, size: int) -> MR:
        """``rdma_reg_write``."""
        return self._mr(size, int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE))

    def _qp(self) -> QP:
        if self.qp is None:
            raise PyverbsRDMAError("the CM ID has no QP", errno.EINVAL)
        return self.qp

    def post_recv(self, mr: MR, length: int | None = None) -> None:
        """``rdma_post_recv``."""
        size = mr.length if length is None else int(length)
        self._qp().post_recv(RecvWR(0, 1, [SGE(mr.buf, size, mr.lkey)]))

    def _send(self, mr: MR, length: int | None, opcode: int, flags: int) -> SendWR:
        size = mr.length if length is None else int(length)
        return SendWR(0, opcode, 1, sg=[SGE(mr.buf, size, mr.lkey)], send_flags=flags)

    def post_send(self, mr: MR, flags: int = int(e.IBV_SEND_SIGNALED),
                  length: int | None = None) -> None:
        """``rdma_post_send``."""
        self._qp().post_send(self._send(mr, length, int(e.IBV_WR_SEND), flags))

    def post_ud_send(self, mr: MR, ah: Any, rqpn: int = 0,
                     flags: int = int(e.IBV_SEND_SIGNALED), length: int | None = None) -> None:
        """``rdma_post_ud_send`` (remote Q_Key: the rdma_cm one, 0x01234567)."""
        wr = self._send(mr, length, int(e.IBV_WR_SEND), flags)
        wr.set_wr_ud(ah, rqpn, RDMA_UDP_QKEY)
        self._qp().post_send(wr)

    def post_write(self, mr: MR, size: int, remote_addr: int, rkey: int,
                   flags: int = 0) -> None:
        """``rdma_post_write``."""
        wr = self._send(mr, size, int(e.IBV_WR_RDMA_WRITE), flags)
        wr.set_wr_rdma(rkey, remote_addr)
        self._qp().post_send(wr)

    def post_read(self, mr: MR, size: int, remote_addr: int, rkey: int,
                  flags: int = 0) -> None:
        """``rdma_post_read``."""
        wr = self._send(mr, size, int(e.IBV_WR_RDMA_READ), flags)
        wr.set_wr_rdma(rkey, remote_addr)
        self._qp().post_send(wr)

    @staticmethod
    def _comp(cq: Any) -> WC:
        while True:
            n, wcs = cq.poll()
            if n:
                wc: WC = wcs[0]
                return wc
            time.sleep(_POLL_PAUSE_S)

    def get_send_comp(self) -> WC:
        """``rdma_get_send_comp``: waits for the next send completion."""
        return self._comp(self._qp().scq)

    def get_recv_comp(self) -> WC:
        """``rdma_get_recv_comp``: waits for the next receive completion."""
        return self._comp(self._qp().rcq)

    # ---- multicast -------------------------------------------------------------------------------
    def join_multicast(self, addr: AddrInfo | None = None, mc_attr: JoinMCAttrEx | None = None,
                       context: Any = None) -> None:
        """``rdma_join_multicast`` / ``rdma_join_multicast_ex``: MULTICAST_JOIN follows."""
        info = mc_attr.addr if mc_attr is not None else addr
        if not isinstance(info, AddrInfo) or info.src_addr is None:
            raise PyverbsUserError("join_multicast needs an AddrInfo with the group address")
        with translate("Failed to Join multicast"):
            rdma_mcast.join(self._cid(), info.src_addr)

    def leave_multicast(self, addr: AddrInfo) -> None:
        """``rdma_leave_multicast``."""
        if addr.src_addr is None:
            raise PyverbsUserError("leave_multicast needs an AddrInfo with the group address")
        with translate("Failed to leave multicast"):
            rdma_mcast.leave(self._cid(), addr.src_addr)

    def close(self) -> None:
        """``rdma_destroy_id`` (and ``rdma_destroy_qp``, and the CQs it made)."""
        cid, self._id = self._id, None
        if cid is None:
            return
        cid.destroy()
        for obj in (self.qp, self._scq, self._rcq):
            if obj is not None:
                obj.close()
        self.qp = self._scq = self._rcq = None
        if self._sync_ch is not None:
            self._sync_ch.close()
