"""The librdmacm half of :mod:`softrdma.capi`: the ``sr_py_cm_*`` entry points of ``rdmacm.c``.

A C program's ``rdma_*`` calls land on :mod:`softrdma.cm.rdma_cm` (``EventChannel``,
``CmId``), through the same handle table as the verbs (:mod:`.bridge`): an id's device
Context is the program's ``id->verbs`` (its wrapper is made by C the first time it is
seen), so ``ibv_alloc_pd(id->verbs)``, the CQs and ``rdma_create_qp`` share one device.
Events are taken without blocking (``sr_py_cm_get_event``); C waits in ``poll(2)`` on the
channel's pipe. The id of a CONNECT_REQUEST is new to C: its handle comes without a
wrapper, C makes one and registers it (``sr_py_cm_set_wrapper``). As in :mod:`.bridge`,
no exception escapes into C: errors become errno values.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from collections.abc import Callable
from typing import Any

from .. import enums as e
from ..cm import rdma_mcast
from ..cm.rdma_cm import (
    RDMA_OPTION_ID,
    RDMA_OPTION_ID_ACK_TIMEOUT,
    RDMA_OPTION_ID_TOS,
    CmId,
    ConnParam,
    EventChannel,
)
from ..cm.rdma_devices import candidates, open_device
from ..errors import InvalidArgument, SoftRdmaError
from ..verbs import PD, XRCD, Context
from . import bridge as b
from . import handles as hd
from .envnames import DEVICE_ENV

__all__ = ["FUNCTIONS"]

#: the most private data an event or a connection carries here (RoCE REQ: 56 bytes,
#: an MPA frame up to 512; cdefs.TYPES has the same size)
PRIVATE_DATA_MAX = 256


def _addr(rec: Any) -> tuple[str, int] | None:
    """``(host, port)`` of a flat ``struct sr_cm_addr`` (None if its family is 0)."""
    fam = int(rec.family)
    raw = bytes(hd._ffi.buffer(rec.ip, 16))
    if fam == socket.AF_INET:
        return str(ipaddress.IPv4Address(raw[:4])), int(rec.port)
    if fam == socket.AF_INET6:
        return str(ipaddress.IPv6Address(raw)), int(rec.port)
    if fam == 0:
        return None
    raise SoftRdmaError(f"address family {fam} is not supported", errno=errno.EAFNOSUPPORT)


def _fill_addr(rec: Any, addr: tuple[str, int] | None) -> None:
    if addr is None:
        rec.family = 0
        return
    ip = ipaddress.ip_address(addr[0])
    rec.family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    hd._ffi.memmove(rec.ip, ip.packed + bytes(16 - len(ip.packed)), 16)
    rec.port = int(addr[1]) & 0xFFFF


def _param(p: Any) -> ConnParam | None:
    if p == hd._ffi.NULL or not p.has:
        return None
    n = min(int(p.private_data_len), PRIVATE_DATA_MAX)
    return ConnParam(bytes(hd._ffi.buffer(p.private_data, n)), int(p.responder_resources),
                     int(p.initiator_depth), int(p.flow_control), int(p.retry_count),
                     int(p.rnr_retry_count), int(p.srq), int(p.qp_num))


def _id(h: int) -> CmId:
    cid: CmId = hd._get(h, CmId)
    return cid


# ---- channels and ids -------------------------------------------------------------------
def _channel(fd: Any) -> int:
    ch = EventChannel()
    fd[0] = ch.fileno()
    return hd._add(ch)


def _create_id(channel: int, ps: int, qp_type: int, wrapper: Any) -> int:
    return hd._add(CmId(hd._get(channel, EventChannel), ps, qp_type=qp_type), wrapper)


def _set_wrapper(h: int, wrapper: Any) -> int:
    hd._set_wrapper(h, wrapper)
    return 0


def _destroy_id(h: int) -> int:
    cid = hd._get(h, CmId)
    hd._forget(h)
    with hd._lock:
        _send_only.difference_update({k for k in _send_only if k[0] == h})
    cid.destroy()
    return 0


def _info(h: int, out: Any) -> int:
    """The id's device (its Context's handle, wrapper, device index, async fd) and
    addresses."""
    cid = _id(h)
    _fill_ctx(cid.verbs, out)
    out.port_num = cid.port_num
    _fill_addr(out.src, cid.get_local_addr())
    _fill_addr(out.dst, cid.get_peer_addr())
    return 0


def _fill_ctx(ctx: Any, out: Any) -> None:
    """A device Context's handle, wrapper, device index and async fd in ``out``."""
    out.ctx = 0
    out.ctx_wrapper = hd._ffi.NULL
    if isinstance(ctx, Context):
        handle = hd._handle_of(ctx)
        if not handle:
            handle = hd._add(ctx)  # C makes its wrapper, then sr_py_cm_set_wrapper
        out.ctx = handle
        wrapper = hd._wrapper_of(handle)
        if wrapper is not None:
            out.ctx_wrapper = wrapper
        out.dev_index = next((i for i, d in enumerate(b._devices) if d.name == ctx.name), -1)
        out.async_fd = ctx.async_fileno()


def _device_ctx(index: int, out: Any) -> int:
    """``rdma_get_devices``: the rdma_cm layer's own Context of device ``index`` (the
    one its ids on that device use, so a PD allocated on it fits ``rdma_create_qp``),
    in ``out`` as :func:`_info` gives it; ENODEV for an index past the list."""
    if not 0 <= index < len(b._devices):
        return errno.ENODEV
    name = b._devices[index].name
    entry = next((d for d in candidates() if d.name == name), None)
    if entry is None:
        return errno.ENODEV
    _fill_ctx(open_device(entry).ctx, out)
    return 0


def _device() -> str | None:
    """``softrdma run -d DEVICE``: the device the program's ids resolve to (None: the
    rdma_cm layer's choice, the first that owns the address)."""
    return os.environ.get(DEVICE_ENV) or None


def _bind(h: int, addr: Any) -> int:
    where = _addr(addr)
    _id(h).bind_addr(where if where is not None else ("0.0.0.0", 0), device=_device())
    return 0


def _resolve_addr(h: int, src: Any, dst: Any, timeout_ms: int) -> int:
    to = _addr(dst)
    if to is None:
        raise SoftRdmaError("dst_addr is needed", errno=errno.EINVAL)
    _id(h).resolve_addr(_addr(src) if src != hd._ffi.NULL else None, to, timeout_ms,
                        device=_device())
    return 0


def _resolve_route(h: int, timeout_ms: int) -> int:
    _id(h).resolve_route(timeout_ms)
    return 0


def _listen(h: int, backlog: int) -> int:
    _id(h).listen(backlog)
    return 0


def _create_qp(h: int, owner: int, a: Any, wrapper: Any) -> int:
    """``rdma_create_qp``: the QP on ``owner``, a PD, or (an XRC TGT QP) an XRCD."""
    if a.qp_type == e.IBV_QPT_XRC_RECV:
        qp = _id(h).create_qp(None, b._qp_init(a), xrcd=hd._get(owner, XRCD))
    else:
        qp = _id(h).create_qp(hd._get(owner, PD), b._qp_init(a))
    a.qp_num = qp.qp_num
    return b._add_qp(qp, wrapper)


def _drop_qp(h: int) -> int:
    """``rdma_destroy_qp`` (C destroys the QP as any QP), or the program cleared
    ``id->qp``: the id and its connection manager let go of the QP (``release_qp``)."""
    _id(h).release_qp()
    return 0


def _connect(h: int, p: Any) -> int:
    _id(h).connect(_param(p))
    return 0


def _accept(h: int, p: Any) -> int:
    _id(h).accept(_param(p))
    return 0


def _init_qp_attr(h: int, state: int, out: Any, mask: Any) -> int:
    """``rdma_init_qp_attr``: the attributes moving the application's own QP of this
    connection to ``state``."""
    attr, m = _id(h).init_qp_attr(state)
    b.fill_qp_attr(out, attr)
    mask[0] = m
    return 0


def _establish(h: int) -> int:
    _id(h).establish()
    return 0


def _notify(h: int, event: int) -> int:
    _id(h).notify(event)
    return 0


def _reject(h: int, data: Any, n: int) -> int:
    raw = bytes(hd._ffi.buffer(data, n)) if n > 0 and data != hd._ffi.NULL else b""
    _id(h).reject(raw)
    return 0


def _disconnect(h: int) -> int:
    _id(h).disconnect()
    return 0


def _migrate(h: int, channel: int) -> int:
    _id(h).migrate(hd._get(channel, EventChannel))
    return 0


def _set_option(h: int, level: int, optname: int, value: int) -> int:
    """``rdma_set_option``: the options the rdma_cm layer has (TOS, ACK timeout); others
    are ENOSYS, as the kernel's ucma answers an option it does not know."""
    if level != RDMA_OPTION_ID or optname not in (RDMA_OPTION_ID_TOS,
                                                  RDMA_OPTION_ID_ACK_TIMEOUT):
        raise SoftRdmaError(f"rdma_set_option level {level} option {optname} is not "
                            "supported", errno=errno.ENOSYS)
    _id(h).set_option(level, optname, value)
    return 0


#: the groups each id joined send-only, (id handle, address): a leave must not detach them
_send_only: set[tuple[int, str]] = set()


def _mcast(h: int, addr: Any, send_only: int, join: int) -> int:
    """``rdma_join_multicast(_ex)`` (``join``; ``send_only``: a send-only full member)
    and ``rdma_leave_multicast`` (:mod:`softrdma.cm.rdma_mcast`: MULTICAST_JOIN follows a
    join)."""
    where = _addr(addr)
    if where is None:
        raise InvalidArgument("addr", "a multicast address is needed")
    cid, key = _id(h), (h, where[0])
    if join:
        rdma_mcast.join(cid, where, send_only=bool(send_only))
        with hd._lock:
            if send_only:
                _send_only.add(key)
            else:
                _send_only.discard(key)
        return 0
    with hd._lock:
        was_send_only = key in _send_only
    rdma_mcast.leave(cid, where, send_only=was_send_only)
    with hd._lock:
        _send_only.discard(key)
    return 0


def _get_event(channel: int, rec: Any) -> int:
    """1 and the next event of the channel in ``rec``, 0 if none is pending."""
    ch = hd._get(channel, EventChannel)
    try:
        ev = ch.get_cm_event(timeout=0)
    except TimeoutError:
        return 0
    ch.ack(ev)
    rec.event = int(ev.event)
    rec.status = int(ev.status)
    for field, cid in (("id", ev.id), ("listen_id", ev.listen_id)):
        h = hd._handle_of(cid) if cid is not None else 0
        if cid is not None and not h:
            h = hd._add(cid)  # a CONNECT_REQUEST's new id: C makes its wrapper
        setattr(rec, field, h)
        wrapper = hd._wrapper_of(h)
        setattr(rec, field + "_wrapper", wrapper if wrapper is not None else hd._ffi.NULL)
    data = bytes(ev.private_data or b"")[:PRIVATE_DATA_MAX]
    hd._ffi.memmove(rec.private_data, data, len(data))
    rec.private_data_len = len(data)
    p = ev.param
    if p is not None:
        rec.responder_resources = p.responder_resources
        rec.initiator_depth = p.initiator_depth
        rec.flow_control = p.flow_control
        rec.retry_count = p.retry_count
        rec.rnr_retry_count = p.rnr_retry_count
        rec.srq = p.srq
        rec.qp_num = p.qp_num
    rec.has_ud = 0
    ud = ev.ud
    if ud is not None:
        rec.has_ud = 1
        rec.ud_qp_num = ud.qp_num
        rec.ud_qkey = ud.qkey
        ah = ud.ah_attr
        rec.ah.is_global = ah.is_global
        rec.ah.port_num = ah.port_num
        rec.ah.sl = ah.sl
        rec.ah.dlid = ah.dlid
        if ah.gr is not None:
            gid = ah.gr.dgid
            raw = getattr(gid, "raw", gid)
            hd._ffi.memmove(rec.ah.dgid, bytes(raw), 16)
            rec.ah.sgid_index = ah.gr.sgid_index
            rec.ah.hop_limit = ah.gr.hop_limit
            rec.ah.traffic_class = ah.gr.traffic_class
            rec.ah.flow_label = ah.gr.flow_label
    return 1


#: name in cdefs.PY_EXPORTS -> its function (registered at start-up as a stub of
#: :mod:`.cmlazy`, which takes the names from the C declarations and calls these)
FUNCTIONS: dict[str, Callable[..., int]] = {
    "sr_py_cm_channel": _channel,
    "sr_py_cm_create_id": _create_id,
    "sr_py_cm_set_wrapper": _set_wrapper,
    "sr_py_cm_destroy_id": _destroy_id,
    "sr_py_cm_info": _info,
    "sr_py_cm_bind": _bind,
    "sr_py_cm_resolve_addr": _resolve_addr,
    "sr_py_cm_resolve_route": _resolve_route,
    "sr_py_cm_listen": _listen,
    "sr_py_cm_create_qp": _create_qp,
    "sr_py_cm_drop_qp": _drop_qp,
    "sr_py_cm_connect": _connect,
    "sr_py_cm_accept": _accept,
    "sr_py_cm_reject": _reject,
    "sr_py_cm_disconnect": _disconnect,
    "sr_py_cm_migrate": _migrate,
    "sr_py_cm_set_option": _set_option,
    "sr_py_cm_get_event": _get_event,
    "sr_py_cm_device": _device_ctx,
    "sr_py_cm_mcast": _mcast,
    "sr_py_cm_init_qp_attr": _init_qp_attr,
    "sr_py_cm_establish": _establish,
    "sr_py_cm_notify": _notify,
}
