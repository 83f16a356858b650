"""The Python half of :mod:`softrdma.capi`: the ``extern "Python"`` entry points C calls.

Each verb of ``shim.c`` that needs the stack calls one function here with plain
arguments (handles, flat records of :mod:`.cdefs`). Objects live in the handle table of
:mod:`.handles`, whose ``_verb`` keeps every exception out of C (it becomes an errno).

Completions reach C through :class:`RingCQ`, whose store is the C ring of its CQ
(``sr_ring_push``): the progress thread produces, ``ibv_poll_cq`` consumes in C.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from typing import Any

from .. import enums as e
from ..errors import SoftRdmaError
from ..seam.types import WorkCompletion
from ..verbs import (
    AH,
    CQ,
    MR,
    PD,
    QP,
    SRQ,
    XRCD,
    AHAttr,
    CompChannel,
    Context,
    GlobalRoute,
    QPAttr,
    QPCap,
    QPInitAttr,
    SrqAttr,
    SrqInitAttr,
    XrcSRQ,
)
from ..verbs.device import MAX_CQE, DeviceInfo, all_devices
from ..verbs.mr import ACCESS_SUPPORTED
from ..verbs.procmem import SIZE_MAX, ImplicitMR
from . import handles as hd
from . import posting, windows
from .envnames import DEVICE_ENV, PYTHON_ENV
from .handles import _add, _forget, _get, _handle_of, _mem, _wrapper_of, register

__all__ = ["install", "RingCQ", "PYTHON_ENV", "fill_qp_attr"]

_devices: list[DeviceInfo] = []
#: shim.c's SR_ACCESS_DM: the access flags of an ``ibv_reg_dm_mr`` (a zero length is allowed)
SR_ACCESS_DM = 1 << 30
#: ``IBV_WC_WITH_INV`` as a plain int: IntFlag arithmetic costs three enum calls (0.7 us
#: against 0.04 on this machine) per completion stored
_WC_WITH_INV = int(e.IBV_WC_WITH_INV)
_WC_RECV = int(e.IBV_WC_RECV)  # the receive opcodes are this and above (ibv_wc_opcode)
#: how long a CQ's destruction waits for the engine lock (a finalizer may hold it) (s)
_RELEASE_WAIT = 1.0


STEP_POLLS = 32  # empty polls of a receive step while the busy poll spins (design.md)


class RingCQ(CQ):
    """A CQ whose completions go to the C ring at ``ring`` (``sr_ring_push``). A receive
    step (:func:`_progress`) makes up to :data:`STEP_POLLS` empty polls while the busy
    poll spins: the program's spin is made in Python, where each poll from C would
    cross into Python (and take the GIL) again."""

    _step_polls = STEP_POLLS

    def __init__(self, ctx: Context, cqe: int, channel: CompChannel | None, comp_vector: int,
                 ring: Any) -> None:
        super().__init__(ctx, cqe, channel=channel, comp_vector=comp_vector)
        self.ring = ring
        self.handle = 0
        # Not empty once a receive's completion was stored into the ring since
        # _progress cleared it: what that step stops on (a Python CQ's step stops on its
        # queue; a list's truth needs no Python call, where a __bool__ cost one per check,
        # about four per round trip). Only a receive: a message the program may answer at
        # once; a step that stopped at each send completion would cost a bulk sender
        # (ib_write_bw) one entry from C per ACK instead of one per read.
        self.stored: list[bool] = []
        self._stop_on = self.stored

    def _store(self, wc: WorkCompletion) -> bool:
        ring = self.ring
        if ring is None:  # destroyed: the C side frees the ring
            return True
        if wc.opcode >= _WC_RECV and not self.stored:
            self.stored.append(True)
        flags = int(wc.wc_flags)
        extra = wc.invalidated_rkey if flags & _WC_WITH_INV else wc.imm_data
        return bool(hd._lib.sr_ring_push(
            ring, wc.wr_id & 0xFFFFFFFFFFFFFFFF, int(wc.status), int(wc.opcode),
            wc.vendor_err, wc.byte_len, extra & 0xFFFFFFFF, wc.qp_num, wc.src_qp, flags,
            wc.pkey_index, wc.slid, wc.sl, wc.dlid_path_bits) == 0)

    def _release(self) -> None:
        # completions are stored under the engine lock: once the ring is dropped under it,
        # no producer holds it any more and ibv_destroy_cq may free it
        lock = self._runtime.lock
        got = lock.acquire(timeout=_RELEASE_WAIT)
        try:
            self.ring = None
        finally:
            if got:
                lock.release()
        super()._release()


# ---- devices and contexts ---------------------------------------------------------------
def _ndevices() -> int:
    global _devices
    devices = all_devices()
    first = os.environ.get(DEVICE_ENV)  # softrdma run -d
    if first:
        devices.sort(key=lambda d: d.name != first)
    _devices = devices
    return len(_devices)


def _device(index: int, name: Any, guid: Any, iwarp: Any) -> int:
    info = _devices[index]
    raw = info.name.encode()[:63]
    hd._ffi.memmove(name, raw + b"\0", len(raw) + 1)
    guid[0] = info.node_guid
    iwarp[0] = 1 if info.type == "iwarp" else 0
    return 0


def _open(index: int, async_fd: Any) -> int:
    if not 0 <= index < len(_devices):
        raise SoftRdmaError(f"no device {index}", errno=errno.ENODEV)
    ctx = Context(_devices[index].name)
    # port events (PORT_ERR/ACTIVE, GID_CHANGE) from the device's interface, as rxe posts
    # them to every context (a no-op for a device without one)
    ctx.watch_port()
    async_fd[0] = ctx.async_fileno()
    return _add(ctx)


def _get_async_event(h: int, event_type: Any, element: Any, port_num: Any) -> int:
    """1 and the next event (its element's wrapper, or its port), 0 if none is pending.

    An event of a QP, CQ or SRQ that the program destroyed meanwhile (its wrapper is gone:
    another thread destroyed it between the event's posting and this read) is dropped, as
    the kernel drops a destroyed object's events (``ib_uverbs_release_uevent``); before,
    it came out as a port event of port 1 with its QP type, and UCX's async thread read
    ``element.qp->qp_num`` at address 0x35."""
    ctx = _get(h, Context)
    while True:
        try:
            ev = ctx.get_async_event(timeout=0)
        except TimeoutError:
            return 0
        if ev.element is None or isinstance(ev.element, int):
            event_type[0] = int(ev.event_type)
            port_num[0] = ev.element if isinstance(ev.element, int) else 1
            return 1
        wrapper = _wrapper_of(_handle_of(ev.element))
        if wrapper is not None:
            event_type[0] = int(ev.event_type)
            element[0] = wrapper
            return 1


def _destroy(h: int) -> int:
    obj = _forget(h)
    posting.forget(h)
    close = getattr(obj, "close", None)
    if close is not None:
        close()
    return 0


def _be64(value: int) -> int:
    """A 64-bit value stored so that its bytes in memory are big-endian (``__be64``)."""
    return int.from_bytes(value.to_bytes(8, "big"), sys.byteorder)


def _query_device(h: int, out: Any) -> int:
    attr = _get(h, Context).query_device()
    for name in ("max_mr_size", "page_size_cap", "vendor_id", "vendor_part_id", "hw_ver",
                 "max_qp", "max_qp_wr", "device_cap_flags", "max_sge", "max_sge_rd", "max_cq",
                 "max_cqe", "max_mr", "max_pd", "max_qp_rd_atom", "max_ee_rd_atom",
                 "max_res_rd_atom", "max_qp_init_rd_atom", "max_ee_init_rd_atom", "max_ee",
                 "max_rdd", "max_mw", "max_raw_ethy_qp", "max_mcast_grp",
                 "max_mcast_qp_attach", "max_total_mcast_qp_attach", "max_ah", "max_fmr",
                 "max_map_per_fmr", "max_srq", "max_srq_wr", "max_srq_sge", "max_pkeys",
                 "local_ca_ack_delay", "phys_port_cnt"):
        setattr(out, name, int(getattr(attr, name)) & (0xFFFFFFFF if name != "max_mr_size" and
                                                        name != "page_size_cap" else ~0))
    out.max_raw_ipv6_qp = int(getattr(attr, "max_raw_ipv6_qp", 0))
    out.atomic_cap = int(attr.atomic_caps)
    fw = str(attr.fw_ver).encode()[:63]
    hd._ffi.memmove(out.fw_ver, fw + b"\0", len(fw) + 1)
    out.node_guid = _be64(int(attr.node_guid))
    out.sys_image_guid = _be64(int(attr.sys_image_guid))
    return 0


def _query_port(h: int, port: int, out: Any) -> int:
    attr = _get(h, Context).query_port(port)
    for name in ("state", "max_mtu", "active_mtu", "gid_tbl_len", "port_cap_flags",
                 "max_msg_sz", "bad_pkey_cntr", "qkey_viol_cntr", "pkey_tbl_len", "lid",
                 "sm_lid", "lmc", "max_vl_num", "sm_sl", "subnet_timeout", "init_type_reply",
                 "active_width", "active_speed", "phys_state", "link_layer", "flags"):
        setattr(out, name, int(getattr(attr, name)))
    return 0


def _query_gid(h: int, port: int, index: int, raw: Any) -> int:
    gid = _get(h, Context).query_gid(port, index)
    hd._ffi.memmove(raw, gid.raw, 16)
    return 0


def _query_gid_type(h: int, port: int, index: int, out: Any) -> int:
    out[0] = _get(h, Context).query_gid_type(port, index)  # enum ibv_gid_type
    return 0


def _query_pkey(h: int, port: int, index: int, out: Any) -> int:
    out[0] = _get(h, Context).query_pkey(port, index)
    return 0


def _alloc_pd(h: int) -> int:
    return _add(PD(_get(h, Context)))


def _reg_mr(h: int, addr: Any, length: int, iova: int, access: int, lkey: Any, rkey: Any) -> int:
    pd = _get(h, PD)
    address = int(hd._ffi.cast("uintptr_t", addr))
    if not address and length == SIZE_MAX and access & e.IBV_ACCESS_ON_DEMAND:
        # implicit ODP (ibv_reg_mr(3)): the whole address space
        imr = ImplicitMR(pd, access)
        lkey[0] = imr.lkey
        rkey[0] = imr.rkey
        return _add(imr)
    device_memory = bool(access & SR_ACCESS_DM)
    access &= ~SR_ACCESS_DM
    if not address or not (length or device_memory):
        raise SoftRdmaError("addr and length must be non-zero", errno=errno.EINVAL)
    mr = MR(pd, length, access, buffer=_mem(address, length), address=iova)
    lkey[0] = mr.lkey
    rkey[0] = mr.rkey
    return _add(mr)



def _rereg_mr(h: int, pd: int, addr: Any, length: int, iova: int, access: int,
              translation: int) -> int:
    """``ibv_rereg_mr`` in place: the region keeps its lkey and rkey (as rxe and the
    kernel's ``ib_uverbs_rereg_mr`` without a new MR) and takes the PD ``pd``, the access
    ``access`` and, with ``translation``, the program's memory ``addr``/``length`` at
    ``iova``. Work requests already posted keep their SGEs: ones that point at the old
    memory or PD fail with a protection error (rdma-core's test_mr_rereg_*)."""
    mr = _get(h, MR)
    new_pd = _get(pd, PD)
    if new_pd.ctx is not mr.pd.ctx:
        raise SoftRdmaError("pd is on another device", errno=errno.EINVAL)
    if access < 0 or access & ~ACCESS_SUPPORTED or access & e.IBV_ACCESS_ZERO_BASED:
        raise SoftRdmaError(f"access: bad flags {access:#x}", errno=errno.EINVAL)
    if access & (e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC) \
            and not access & e.IBV_ACCESS_LOCAL_WRITE:
        raise SoftRdmaError("access: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
                            errno=errno.EINVAL)
    if mr.on_demand or access & e.IBV_ACCESS_ON_DEMAND:
        raise SoftRdmaError("rereg of an on-demand MR", errno=errno.EOPNOTSUPP)
    buf = None
    if translation:
        address = int(hd._ffi.cast("uintptr_t", addr))
        if not address or not length:
            raise SoftRdmaError("addr and length must be non-zero", errno=errno.EINVAL)
        buf = memoryview(_mem(address, length)).cast("B")
    emr = mr.engine_mr
    with mr._runtime.lock:
        if buf is not None:
            mr._storage = buf
            mr._buf = buf
            mr.real_address = int(hd._ffi.cast("uintptr_t", addr))
            emr.buf = buf
            emr.addr = iova
            emr.length = length
        emr.access = access
        emr.pd = new_pd.protection_domain
    if new_pd is not mr.pd:
        old = mr.pd
        old._dependents.discard(mr)
        mr._parents.remove(old)
        mr._depend_on(new_pd)
        mr.pd = new_pd
    return 0

# ---- completions ------------------------------------------------------------------------
def _create_comp_channel(h: int, fd: Any) -> int:
    ch = CompChannel(_get(h, Context))
    fd[0] = ch.fileno()
    return _add(ch)


def _get_cq_event(h: int, out: Any) -> int:
    ch = _get(h, CompChannel)
    try:
        cq = ch.get_cq_event(timeout=0)
    except TimeoutError:
        # shim.c now waits on the channel's descriptor: a progress thread that stands
        # back while the program busy-polled (up to STAND_BACK_MAX) takes over at once
        ch.ctx.runtime.about_to_block()
        return 0
    if not isinstance(cq, RingCQ):
        return 0
    cq.ack_events(1)
    out[0] = _wrapper_of(cq.handle)
    return cq.handle


def _create_cq(h: int, cqe: int, channel: int, comp_vector: int, ring: Any,
               wrapper: Any) -> int:
    ch = _get(channel, CompChannel) if channel else None
    cq = RingCQ(_get(h, Context), cqe, ch, comp_vector, ring)
    cq.handle = _add(cq, wrapper)
    return cq.handle


def _req_notify_cq(h: int, solicited_only: int) -> int:
    _get(h, RingCQ).req_notify(bool(solicited_only))
    return 0


def _progress(h: int, taken: int) -> int:
    """One receive step for a program whose ``ibv_poll_cq`` found the CQ ``h`` empty for a
    while: ``CQ.poll`` (an empty one runs the device's busy poll, which spins, then sleeps
    on the socket until input, the next timer or 2 ms), so the answer is completed into
    the ring by the thread that waits for it. The step stops once it stored a receive's
    completion into this CQ's ring (``RingCQ.stored``, as a Python CQ's step stops on
    its queue).
    When it left datagrams behind that completion (typically the ACK a program that
    awaits its own SEND's completion needs next), or while the program's last request
    awaits its ACK and the program awaited each earlier one
    (:meth:`~softrdma.drivers.runtime.progress.DeviceRuntime.ack_awaited`: the ACK
    arrives about when the answer does, and the program polls for both), it returns 1,
    and the program's next empty poll runs the next step at once, without its spin;
    otherwise 0. -1 at once while the progress thread serves (``ProgressCore.took``:
    ``ib_write_lat`` awaits its peer's WRITE in memory): shim.c then sleeps until the
    thread completes into the ring, as with ``SOFTRDMA_CAPI_INLINE=0``.

    As in a Python busy poll, the ACKs of what it received stay pending (a prompt one,
    ``Port.ack_prompt``, is sent): they leave with the program's next post, at its next
    empty poll, from the progress thread, or at exit (:func:`_at_exit`).
    ``taken``: the program took completions from the ring since this thread's last step
    (ones the progress thread stored): the busy poll's idle streak begins anew
    (:meth:`CQ.taken`), or a streak that never saw its answer arrive would outlast its
    spin and every step after it would sleep."""
    cq = _get(h, RingCQ)
    if cq.ctx.runtime.serving():
        return -1
    if taken:
        cq.taken()
    stored = cq.stored
    stored.clear()  # the step stops once it stored a receive's completion
    cq.poll(1)  # a RingCQ's own queue stays empty: its store is the ring
    _stepped.add(cq.ctx)
    rt = cq.ctx.runtime
    return 1 if (stored and rt.rx_pending()) or rt.ack_awaited() else 0


#: the contexts a receive step ran on (their ACKs may be pending at the program's exit)
_stepped: set[Context] = set()
os.register_at_fork(after_in_child=_stepped.clear)  # a child's contexts are its own


def _at_exit() -> int:
    """The program exits (C ``atexit``, shim.c's ``sr_at_exit``): one progress step on
    each context a receive step ran on sends the ACKs it left pending, as a Python
    program's shutdown does (``Runtime.close``); a peer would otherwise wait for its
    SEND's completion until its retries are exhausted. A closed context is skipped."""
    for ctx in list(_stepped):
        try:
            ctx.progress()
        except (SoftRdmaError, OSError):
            continue
    return 0


# ---- queues -----------------------------------------------------------------------------
def _create_srq(h: int, attr: Any, wrapper: Any) -> int:
    srq = SRQ(_get(h, PD), SrqInitAttr(SrqAttr(attr.max_wr, attr.max_sge, attr.srq_limit)))
    hs = _add(srq, wrapper)
    posting.attach_srq(hs, srq, wrapper)
    return hs


def _modify_srq(h: int, attr: Any, mask: int) -> int:
    _get(h, SRQ).modify(SrqAttr(attr.max_wr, attr.max_sge, attr.srq_limit), mask)
    return 0


def _query_srq(h: int, attr: Any) -> int:
    a = _get(h, SRQ).query()
    attr.max_wr, attr.max_sge, attr.srq_limit = a.max_wr, a.max_sge, a.srq_limit
    return 0


def _mcast(h: int, gid: Any, lid: int, attach: int) -> int:
    qp = _get(h, QP)
    raw = bytes(hd._ffi.buffer(gid, 16))
    if attach:
        qp.attach_mcast(raw, lid)
    else:
        qp.detach_mcast(raw, lid)
    return 0


def _qp_init(a: Any) -> QPInitAttr:
    """The QP init attributes of a flat ``struct sr_qp_init``."""
    cap = QPCap(a.max_send_wr, a.max_recv_wr, a.max_send_sge, a.max_recv_sge,
                a.max_inline_data)
    return QPInitAttr(
        qp_type=a.qp_type, scq=_get(a.send_cq, CQ) if a.send_cq else None,
        rcq=_get(a.recv_cq, CQ) if a.recv_cq else None,
        srq=_get(a.srq, SRQ) if a.srq else None, cap=cap, sq_sig_all=a.sq_sig_all)


def _create_qp(h: int, a: Any, wrapper: Any) -> int:
    if a.qp_type == e.IBV_QPT_XRC_RECV:  # an XRC TGT QP belongs to its XRC domain
        qp = QP(_get(h, XRCD), QPInitAttr(qp_type=a.qp_type))
    else:
        qp = QP(_get(h, PD), _qp_init(a))
    a.qp_num = qp.qp_num
    return _add_qp(qp, wrapper)


def _add_qp(qp: QP, wrapper: Any) -> int:
    """A new QP's handle (``ibv_create_qp``, ``rdma_create_qp``), its C receive ring
    attached (:func:`posting.attach`)."""
    h = _add(qp, wrapper)
    posting.attach(h, qp, wrapper)
    return h


def _ah_attr(f: Any) -> AHAttr:
    """A C ``ibv_ah_attr`` as the kernel takes it: every softrdma port is Ethernet (RoCE
    or iWARP), where uverbs ignores ``dlid`` (``rdma_ah_set_dlid`` sets it only for IB
    and OPA address vectors; UCX puts its UDP source-port hint there), so it is dropped;
    the flow label is the GRH's 20 bits (IBA 8.3.1: the kernel passes the u32 on, the
    device keeps 20 bits; UCX passes all ones for "none")."""
    gr = GlobalRoute(bytes(hd._ffi.buffer(f.dgid, 16)), flow_label=f.flow_label & 0xFFFFF,
                     sgid_index=f.sgid_index, hop_limit=f.hop_limit,
                     traffic_class=f.traffic_class) if f.is_global else None
    return AHAttr(port_num=f.port_num, is_global=f.is_global, gr=gr, dlid=0, sl=f.sl,
                  src_path_bits=f.src_path_bits, static_rate=f.static_rate)


_QP_SCALARS = ("qkey", "rq_psn", "sq_psn", "dest_qp_num", "qp_access_flags", "pkey_index",
               "max_rd_atomic", "max_dest_rd_atomic", "min_rnr_timer", "port_num", "timeout",
               "retry_cnt", "rnr_retry")


def _modify_qp(h: int, a: Any, mask: int) -> int:
    qp = _get(h, QP)
    attr = QPAttr(qp_state=a.qp_state, cur_qp_state=a.cur_qp_state, port_num=a.port_num,
                  path_mtu=a.path_mtu)
    for name in _QP_SCALARS:
        setattr(attr, name, int(getattr(a, name)))
    attr.cap = QPCap(a.max_send_wr, a.max_recv_wr, a.max_send_sge, a.max_recv_sge,
                     a.max_inline_data)
    if mask & e.IBV_QP_AV:
        attr.ah_attr = _ah_attr(a.ah)
    qp.modify(attr, mask)
    return 0


def _query_qp(h: int, out: Any, mask: int) -> int:
    attr, _init = _get(h, QP).query(mask)
    fill_qp_attr(out, attr)
    return 0


def fill_qp_attr(out: Any, attr: QPAttr) -> None:
    """The flat record ``struct sr_qp_attr`` of ``attr`` (``ibv_query_qp``,
    ``rdma_init_qp_attr``)."""
    out.qp_state = attr.qp_state
    out.cur_qp_state = attr.cur_qp_state
    out.path_mtu = attr.path_mtu
    for name in _QP_SCALARS:
        setattr(out, name, int(getattr(attr, name) or 0))
    cap = attr.cap
    out.max_send_wr, out.max_recv_wr = cap.max_send_wr, cap.max_recv_wr
    out.max_send_sge, out.max_recv_sge = cap.max_send_sge, cap.max_recv_sge
    out.max_inline_data = cap.max_inline_data
    ah = attr.ah_attr
    if ah is not None:
        out.ah.is_global = ah.is_global
        out.ah.sl = ah.sl
        out.ah.port_num = ah.port_num
        if ah.gr is not None:
            gid = ah.gr.dgid
            if gid is not None:
                hd._ffi.memmove(out.ah.dgid, gid.raw, 16)
            out.ah.flow_label = ah.gr.flow_label
            out.ah.sgid_index = ah.gr.sgid_index
            out.ah.hop_limit = ah.gr.hop_limit
            out.ah.traffic_class = ah.gr.traffic_class


def _create_ah(h: int, f: Any) -> int:
    return _add(AH(_get(h, PD), _ah_attr(f)))


# ---- extended verbs: ibv_resize_cq, XRC ------------------------------------------------
def _resize_cq(h: int, cqe: int) -> int:
    """Move the CQ's completions to a ring of ``cqe`` entries (C holds the consumer lock;
    the engine lock keeps the producer out)."""
    cq = _get(h, RingCQ)
    if not 1 <= cqe <= MAX_CQE:
        raise SoftRdmaError(f"cqe must be 1..{MAX_CQE}, got {cqe}", errno=errno.EINVAL)
    with cq._runtime.lock:
        if cq.ring is None:
            raise SoftRdmaError("the CQ is destroyed", errno=errno.EINVAL)
        err = int(hd._lib.sr_ring_resize(cq.ring, cqe))
        if err:
            raise SoftRdmaError(f"cannot resize the CQ to {cqe}: {os.strerror(err)}",
                                errno=err)
        cq.cqe = cqe
    return 0



def _clean_cq(h: int, qp_num: int) -> int:
    """Drop the completions of QP ``qp_num`` from the CQ's ring (the QP went to RESET; C
    holds the consumer lock, the engine lock keeps the producer out)."""
    cq = _get(h, RingCQ)
    with cq._runtime.lock:
        if cq.ring is not None:
            hd._lib.sr_ring_clean(cq.ring, qp_num)
    return 0

def _open_xrcd(h: int, fd: int, oflags: int) -> int:
    return _add(XRCD(_get(h, Context), fd, oflags))


def _create_xrc_srq(h: int, xrcd: int, cq: int, attr: Any, wrapper: Any, srq_num: Any) -> int:
    srq = XrcSRQ(_get(h, PD), _get(xrcd, XRCD), _get(cq, CQ),
                 SrqInitAttr(SrqAttr(attr.max_wr, attr.max_sge, attr.srq_limit)))
    srq_num[0] = srq.srq_num
    return _add(srq, wrapper)


# name in cdefs.PY_EXPORTS -> (function, returns a handle: errors are negative)
_EXPORTS: dict[str, tuple[Callable[..., int], bool]] = {
    "sr_py_ndevices": (_ndevices, True),
    "sr_py_device": (_device, False),
    "sr_py_open": (_open, True),
    "sr_py_get_async_event": (_get_async_event, True),
    "sr_py_destroy": (_destroy, False),
    "sr_py_query_device": (_query_device, False),
    "sr_py_query_port": (_query_port, False),
    "sr_py_query_gid": (_query_gid, False),
    "sr_py_query_gid_type": (_query_gid_type, False),
    "sr_py_query_pkey": (_query_pkey, False),
    "sr_py_alloc_pd": (_alloc_pd, True),
    "sr_py_reg_mr": (_reg_mr, True),
    "sr_py_rereg_mr": (_rereg_mr, False),
    "sr_py_create_comp_channel": (_create_comp_channel, True),
    "sr_py_get_cq_event": (_get_cq_event, True),
    "sr_py_create_cq": (_create_cq, True),
    "sr_py_req_notify_cq": (_req_notify_cq, False),
    "sr_py_progress": (_progress, False),
    "sr_py_at_exit": (_at_exit, False),
    "sr_py_create_srq": (_create_srq, True),
    "sr_py_modify_srq": (_modify_srq, False),
    "sr_py_query_srq": (_query_srq, False),
    "sr_py_mcast": (_mcast, False),
    "sr_py_create_qp": (_create_qp, True),
    "sr_py_modify_qp": (_modify_qp, False),
    "sr_py_query_qp": (_query_qp, False),
    "sr_py_create_ah": (_create_ah, True),
    "sr_py_post_send": (posting.post_send, False),
    "sr_py_post_recv": (posting.post_recv, False),
    "sr_py_resize_cq": (_resize_cq, False),
    "sr_py_clean_cq": (_clean_cq, False),
    "sr_py_open_xrcd": (_open_xrcd, True),
    "sr_py_create_xrc_srq": (_create_xrc_srq, True),
}


def install(ffi: Any, lib: Any,
            more: dict[str, tuple[Callable[..., int], bool]] | None = None) -> None:
    """Register the entry points (run once by the library's embedding init code), with
    ``more`` (the librdmacm half's stubs, :mod:`.cmlazy`)."""
    python = os.environ.get(PYTHON_ENV)
    if python:
        # devd is spawned with sys.executable; an embedded interpreter's is the first
        # python3 on PATH, not necessarily the one softrdma is installed for
        sys.executable = python
    register(ffi, lib, {**_EXPORTS, **windows.EXPORTS, **(more or {})})
