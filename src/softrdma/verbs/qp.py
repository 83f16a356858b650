"""Queue pairs (IBA 10.2.4, 11.2.4; ``ibv_create_qp``/``ibv_modify_qp``/``ibv_post_*``).

Creation checks (rxe ``rxe_qp_chk_init``/``rxe_qp_chk_cap``): RC, UC and UD only
(others EOPNOTSUPP); both CQs present and of the same context; capacities within the
device limits (EINVAL).

Modify checks, in rxe's order (``rxe_modify_qp``, ``rxe_qp_chk_attr``):

1. mask bits outside IB_QP_ATTR_STANDARD_BITS -> EOPNOTSUPP; on an XRC QP the bits the
   kernel ignores there are dropped (uverbs ``modify_qp_mask``, :data:`.qp_rules.IGNORED_MASK`);
2. ``IBV_QP_CUR_STATE`` must name the QP's real state (IBA 11.2.4.2);
3. the transition and mask must pass ``ib_modify_qp_is_ok`` (:mod:`.qp_rules`) -> EINVAL;
4. each given attribute must be in range: port 1; P_Key index inside the table; the
   address vector valid (see :func:`.ah.address_vector`); no alternate path on RoCE;
   ``path_mtu`` a valid enum not above the port's active MTU; ``max_rd_atomic`` and
   ``max_dest_rd_atomic`` <= 128 (rxe_param.h); ``timeout`` and ``min_rnr_timer`` <= 31;
   ``retry_cnt`` and ``rnr_retry`` <= 7; PSNs are masked to 24 bits (the kernel masks
   with a warning); Q_Keys with bit 31 set are allowed (softrdma is the privileged
   HCA driver, IBA 10.2.4 (Q_Keys)).

Then the validated attributes go to the engine (``QPEngine.modify``, the
:class:`~softrdma.seam.protocols.QPEngine` its device created: the IB transport or
iWARP).
"""

from __future__ import annotations

import weakref
from typing import Any

from .. import enums as e
from ..drivers.runtime.progress import DeviceRuntime
from ..errors import InvalidArgument, NotSupported
from ..ib.qp import AddressVector
from ..ib.xrc import XrcIniQP, XrcTgtQP
from ..seam.protocols import QPEngine
from ..seam.queues import QPInit, RecvFeed
from ..seam.states import INIT, QPT_RC, QPT_UC, QPT_UD, RESET, RTR, RTS
from ..wire.gid import is_v4_mapped
from . import qp_rules
from ._args import U24, U32, u32, uint
from ._object import VerbsObject
from .ah import AHAttr, GlobalRoute
from .cq import CQ
from .device import GID, MAX_INLINE_DATA, MAX_QP_WR, MAX_SGE, Context
from .mw import MW, MW_TYPE_1, MWBindInfo, bind_wqe, inc_rkey
from .pd import PD
from .qp_attr import M, QPAttr, QPCap, QPInitAttr, check_attrs, explain_refusal, state_text
from .srq import SRQ, check_recv_feed
from .wr import RecvWR, SendWR, build_recv_wqes, build_send_wqe, build_send_wqes, chain
from .xrcd import XRCD

__all__ = ["QPCap", "QPInitAttr", "QPAttr", "QP"]

RC, UC, UD = QPT_RC, QPT_UC, QPT_UD
XRC_SEND, XRC_RECV = int(e.IBV_QPT_XRC_SEND), int(e.IBV_QPT_XRC_RECV)
_QP_TYPES = frozenset({RC, UC, UD, XRC_SEND})
#: the bytes of one scatter/gather element in a send WQE (``struct ib_sge``: address,
#: length, key)
SGE_BYTES = 16
KBIT = 1000.0  # ibv_modify_qp_rate_limit's rate is in kbit/s


class QP(VerbsObject):
    """A queue pair on ``pd`` (pyverbs ``QP``).

    With ``qp_attr``, the QP is moved towards RTS as pyverbs does: UD to RTS, RC/UC to
    INIT (they need the remote QPN for RTR).
    """

    _close_rank = 0

    def __init__(self, pd: PD | XRCD, init_attr: QPInitAttr,
                 qp_attr: QPAttr | None = None) -> None:
        super().__init__()
        if isinstance(pd, XRCD):  # an XRC TGT QP belongs to an XRC domain, not a PD
            self._init_xrc_recv(pd, init_attr, qp_attr)
            return
        if not isinstance(pd, PD):
            raise InvalidArgument("pd", f"expected a PD, got {type(pd).__name__}")
        pd._check()
        if not isinstance(init_attr, QPInitAttr):
            raise InvalidArgument("init_attr", f"expected QPInitAttr, got {type(init_attr).__name__}")
        ctx: Context = pd.ctx
        qpt = init_attr.qp_type
        if qpt not in _QP_TYPES:
            if qpt == e.IBV_QPT_RAW_PACKET:
                # A16.6: RoCE has no Raw service (CA16-14); no Raw operations on a RoCE
                # port's QPs (CA16-19).
                raise NotSupported("QP type IBV_QPT_RAW_PACKET is not supported: a RoCE port "
                                   "has no Raw service (Annex A16 CA16-14, CA16-19)")
            if qpt in {int(t) for t in e.ibv_qp_type}:
                raise NotSupported(f"QP type {e.ibv_qp_type(qpt).name} is not supported")
            raise InvalidArgument("init_attr.qp_type", f"unknown QP type {qpt!r}")
        scq, rcq, srq = init_attr.scq, init_attr.rcq, init_attr.srq
        if qpt == XRC_SEND:  # send only: no receive queue, the send CQ is the only CQ
            if srq is not None:
                raise InvalidArgument("init_attr.srq", "an XRC INI QP has no receive queue")
            rcq = scq
        for name, cq in (("scq", scq), ("rcq", rcq)):
            if not isinstance(cq, CQ):
                raise InvalidArgument(f"init_attr.{name}", "a QP needs a send and a receive CQ")
            cq._check()
            if cq.ctx is not ctx:
                raise InvalidArgument(f"init_attr.{name}", "the CQ belongs to another context")
        assert isinstance(scq, CQ) and isinstance(rcq, CQ)
        if srq is not None:
            if not isinstance(srq, SRQ):
                raise InvalidArgument("init_attr.srq", f"expected an SRQ, got {type(srq).__name__}")
            srq._check()
            if srq.ctx is not ctx:
                raise InvalidArgument("init_attr.srq", "the SRQ belongs to another context")
        cap = init_attr.cap
        if not isinstance(cap, QPCap):
            raise InvalidArgument("init_attr.cap", f"expected QPCap, got {type(cap).__name__}")
        uint(cap.max_send_wr, MAX_QP_WR, "init_attr.cap.max_send_wr")
        uint(cap.max_send_sge, MAX_SGE, "init_attr.cap.max_send_sge")
        uint(cap.max_inline_data, MAX_INLINE_DATA, "init_attr.cap.max_inline_data")
        # the inline room is at least the bytes of the send WQE's SGEs (Linux rxe:
        # max(16 * max_send_sge, max_inline_data); ibv_create_qp(3): the actual sizes, at
        # least those asked for). rdma_xclient sends 16 inline bytes on a QP made with
        # max_inline_data 0 and one SGE.
        # An XRC send QP has no receive queue.
        inline = min(MAX_INLINE_DATA, max(cap.max_inline_data, SGE_BYTES * cap.max_send_sge))
        xrc = qpt == XRC_SEND
        cap = QPCap(cap.max_send_wr, 0 if xrc else cap.max_recv_wr, cap.max_send_sge,
                    0 if xrc else cap.max_recv_sge, inline)
        if srq is None:
            uint(cap.max_recv_wr, MAX_QP_WR, "init_attr.cap.max_recv_wr")
            uint(cap.max_recv_sge, MAX_SGE, "init_attr.cap.max_recv_sge")
            max_recv_wr, max_recv_sge = cap.max_recv_wr, cap.max_recv_sge
        else:
            max_recv_wr = max_recv_sge = 0
        runtime: DeviceRuntime = ctx.runtime
        if ctx.transport == "iwarp" and qpt != RC:  # iWARP: RC only (siw)
            raise NotSupported(f"QP type {e.ibv_qp_type(qpt).name}: iWARP devices "
                               "support RC QPs only")
        with self._counting(ctx.objects, "max_qp"):
            if qpt == XRC_SEND:  # the RC requester with the XRC wire (softrdma.ib.xrc)
                self.engine: QPEngine = runtime.call(XrcIniQP, ctx.port, QPInit(
                    RC, pd.protection_domain, scq.sink, rcq.sink, None, cap.max_send_wr, 0,
                    cap.max_send_sge, 0, cap.max_inline_data, bool(init_attr.sq_sig_all)))
            else:
                self.engine = runtime.call(ctx.port.create_qp, QPInit(
                    qpt, pd.protection_domain, scq.sink, rcq.sink,
                    srq.engine if srq is not None else None,
                    cap.max_send_wr, max_recv_wr, cap.max_send_sge, max_recv_sge,
                    cap.max_inline_data, bool(init_attr.sq_sig_all)))
        # the opcodes the transport carries (None: all of IB's, checked per QP type)
        self._send_opcodes = self.engine.send_opcodes
        self._max_read_sge = self.engine.max_read_sge
        parents: list[VerbsObject] = [pd, scq]
        if rcq is not scq:
            parents.append(rcq)
        if srq is not None:
            parents.append(srq)
        self._depend_on(*parents)
        self.pd = pd
        self.ctx = ctx
        self.scq = scq
        self.rcq = rcq
        self.srq = srq
        self.qp_type = qpt
        self.qp_context = init_attr.qp_context
        self.sq_sig_all = int(bool(init_attr.sq_sig_all))
        self.cap = QPCap(cap.max_send_wr, max_recv_wr, cap.max_send_sge, max_recv_sge,
                         cap.max_inline_data)
        self._runtime = runtime
        self._port = ctx.port
        self._max_send_sge = cap.max_send_sge
        self._max_recv_sge = max_recv_sge
        self._max_inline = cap.max_inline_data
        ctx._register_owner(self.engine, self)
        self._finalizer = weakref.finalize(self, _defer_destroy, runtime, self.engine)
        if qp_attr is not None:
            if qpt == UD:
                self.to_rts(qp_attr)
            else:
                self.to_init(qp_attr)

    def _init_xrc_recv(self, xrcd: XRCD, init_attr: QPInitAttr, qp_attr: QPAttr | None,
                       qpn: int | None = None) -> None:
        """An XRC TGT QP of ``xrcd`` (``ibv_create_qp_ex`` with ``IBV_QPT_XRC_RECV``; with
        ``qpn``, ``ibv_open_qp`` of an existing one): no PD, CQs, SRQ or queues; each
        request names the XRC SRQ that receives it (softrdma.ib.xrc)."""
        xrcd._check()
        if not isinstance(init_attr, QPInitAttr):
            raise InvalidArgument("init_attr", f"expected QPInitAttr, got {type(init_attr).__name__}")
        if init_attr.qp_type != XRC_RECV:
            raise InvalidArgument("init_attr.qp_type", "a QP of an XRCD is an "
                                  "IBV_QPT_XRC_RECV QP (others need a PD)")
        ctx: Context = xrcd.ctx
        runtime: DeviceRuntime = ctx.runtime
        if qpn is None:
            with self._counting(ctx.objects, "max_qp"):
                self.engine = runtime.call(XrcTgtQP, ctx.port, xrcd.domain)
        else:
            engine = xrcd.domain.tgt_qps.get(qpn)
            if engine is None:
                raise InvalidArgument("qp_num", f"no XRC TGT QP {qpn:#x} in this XRC domain")
            self.engine = engine
        self._depend_on(xrcd)
        self.pd = None  # type: ignore[assignment]
        self.xrcd = xrcd
        self.ctx = ctx
        self.scq = self.rcq = None  # type: ignore[assignment]
        self.srq = None
        self.qp_type = XRC_RECV
        self.qp_context = init_attr.qp_context
        self.sq_sig_all = 0
        self.cap = QPCap(0, 0, 0, 0, 0)
        self._runtime = runtime
        self._port = ctx.port
        self._max_send_sge = self._max_recv_sge = self._max_inline = 0
        self._send_opcodes = None  # no send queue: post_send refuses before looking
        self._max_read_sge = 0
        self._opened = qpn is not None
        self._finalizer = weakref.finalize(self, _defer_destroy, runtime, self.engine)
        if self._opened:
            self._finalizer.detach()  # an opened QP stays with its creator (ibv_open_qp)
        else:
            ctx._register_owner(self.engine, self)
        if qp_attr is not None:
            self.to_init(qp_attr)

    @classmethod
    def open(cls, xrcd: XRCD, qp_num: int, qp_context: Any = None) -> QP:
        """``ibv_open_qp``: another handle on the XRC TGT QP ``qp_num`` of ``xrcd``; closing
        it leaves the QP to its creator."""
        if not isinstance(xrcd, XRCD):
            raise InvalidArgument("xrcd", f"expected an XRCD, got {type(xrcd).__name__}")
        uint(qp_num, U24, "qp_num")
        qp = cls.__new__(cls)
        VerbsObject.__init__(qp)
        qp._init_xrc_recv(xrcd, QPInitAttr(qp_type=XRC_RECV, qp_context=qp_context), None,
                          qpn=qp_num)
        return qp

    # ---- attributes ---------------------------------------------------------------------------
    @property
    def qp_num(self) -> int:
        return int(self.engine.qpn)

    @property
    def qp_state(self) -> int:
        return int(self.engine.state)

    # ---- modify --------------------------------------------------------------------------------
    def modify(self, attr: QPAttr, attr_mask: int) -> None:
        """``ibv_modify_qp``: change the attributes named by ``attr_mask``."""
        self._check()
        if not isinstance(attr, QPAttr):
            raise InvalidArgument("qp_attr", f"expected QPAttr, got {type(attr).__name__}")
        if not isinstance(attr_mask, int) or attr_mask < 0:
            raise InvalidArgument("attr_mask", f"must be a non-negative int, got {attr_mask!r}")
        if attr_mask & ~qp_rules.STANDARD_MASK:
            raise NotSupported(f"attr_mask bits {attr_mask & ~qp_rules.STANDARD_MASK:#x} "
                               "are not supported")
        # an IntFlag's every ``&`` below is a Python-level call; XRC: the kernel's ignored bits
        attr_mask = qp_rules.user_mask(self.qp_type, int(attr_mask))
        engine = self.engine

        def _apply(now: float) -> None:
            # under the engine lock: the state cannot change between check and apply
            cur = int(engine.state)
            if attr_mask & M.IBV_QP_CUR_STATE and attr.cur_qp_state != cur:
                raise InvalidArgument("qp_attr.cur_qp_state",
                                      f"{state_text(attr.cur_qp_state)} but the QP is in "
                                      f"{state_text(cur)}")
            new = attr.qp_state if attr_mask & M.IBV_QP_STATE else cur
            if not isinstance(new, int) or not 0 <= new <= int(e.IBV_QPS_ERR):
                raise InvalidArgument("qp_attr.qp_state", f"not a QP state: {new!r}")
            if not qp_rules.modify_is_ok(cur, new, self.qp_type, attr_mask):
                raise InvalidArgument("attr_mask", explain_refusal(self.qp_type, cur, new, attr_mask))
            attrs = check_attrs(self.ctx, self._port.pkeys, attr, attr_mask)
            attrs["qp_state"] = new
            if attr_mask & M.IBV_QP_CUR_STATE:
                attrs["cur_qp_state"] = cur
            engine.modify(attrs, now)

        self._runtime.call_now(_apply)

    def _step(self, attr: QPAttr, cur: int, nxt: int) -> None:
        """``cur`` -> ``nxt`` with the attributes the QP type requires there."""
        attr.qp_state = nxt
        self.modify(attr, qp_rules.required_mask(cur, nxt, self.qp_type) | M.IBV_QP_STATE)

    def to_init(self, attr: QPAttr) -> None:
        """RESET -> INIT with the attributes the QP type requires (pyverbs)."""
        self._step(attr, RESET, INIT)

    def to_rtr(self, attr: QPAttr) -> None:
        """-> RTR (through INIT unless already there), required attributes only (pyverbs)."""
        if self.qp_state != INIT:
            self.to_init(attr)
        self._step(attr, INIT, RTR)

    def to_rts(self, attr: QPAttr) -> None:
        """-> RTS (through INIT and RTR unless already in RTR), required attributes only."""
        if self.qp_state != RTR:
            self.to_rtr(attr)
        self._step(attr, RTR, RTS)

    def query(self, attr_mask: int = 0) -> tuple[QPAttr, QPInitAttr]:
        """``ibv_query_qp``: the current attributes (all of them, as rxe) and init attrs."""
        self._check()
        with self._runtime.lock:
            q = self.engine.query()
            state = int(self.engine.state)
        attr = QPAttr(qp_state=state, cur_qp_state=state, port_num=int(q["port_num"] or 1),
                      path_mtu=int(q["path_mtu"] or 1))
        attr.qkey = q["qkey"]
        attr.rq_psn = q["rq_psn"]
        attr.sq_psn = q["sq_psn"]
        attr.dest_qp_num = q["dest_qp_num"]
        attr.qp_access_flags = int(q["access_flags"])
        attr.pkey_index = q["pkey_index"]
        attr.max_rd_atomic = q["max_rd_atomic"]
        attr.max_dest_rd_atomic = q["max_dest_rd_atomic"]
        attr.min_rnr_timer = q["min_rnr_timer"]
        attr.timeout = q["timeout"]
        attr.retry_cnt = q["retry_cnt"]
        attr.rnr_retry = q["rnr_retry"]
        attr.en_sqd_async_notify = int(q["en_sqd_async_notify"])
        av = q["ah"]
        if isinstance(av, AddressVector):
            attr.ah_attr = AHAttr(port_num=1, is_global=1, sl=av.sl,
                                  gr=GlobalRoute(GID(av.dgid), flow_label=av.flow_label,
                                                 sgid_index=av.sgid_index, hop_limit=av.hop_limit,
                                                 traffic_class=av.traffic_class))
        cap = QPCap(*q["cap"])
        attr.cap = QPCap(cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge,
                         cap.max_inline_data)
        init = QPInitAttr(self.qp_type, self.qp_context, self.scq, self.rcq, self.srq,
                          QPCap(cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge,
                                cap.max_recv_sge, cap.max_inline_data), self.sq_sig_all)
        return attr, init

    # ---- work requests ----------------------------------------------------------------------------
    def post_send(self, wr: SendWR | list[SendWR]) -> None:
        """``ibv_post_send``: validate and post; the WRs before a bad one stay posted."""
        if self._closed:
            self._check()
        if self.qp_type == XRC_RECV:
            raise InvalidArgument("qp", "an XRC TGT QP has no send queue")
        if self._send_opcodes is not None:
            _check_transport_wrs(wr, self._send_opcodes, self._max_read_sge)
        if type(wr) is SendWR and wr.wr_next is None:
            wqes = [build_send_wqe(wr, self.qp_type, self._max_send_sge, self._max_inline,
                                   self._port, self.pd)]
            self._runtime.post_send(self.engine, wqes)
            return
        wqes, err = build_send_wqes(wr, self.qp_type, self._max_send_sge, self._max_inline,
                                    self._port, self.pd)
        if wqes:
            self._runtime.post_send(self.engine, wqes)
        if err is not None:
            raise err

    def bind_mw(self, mw: MW, bind_info: MWBindInfo, *, wr_id: int = 0,
                send_flags: int = int(e.IBV_SEND_SIGNALED)) -> int:
        """``ibv_bind_mw``: bind type 1 window ``mw`` (a BIND_MW on the send queue; RC
        and UC) and return its new R_Key, the window's ``rkey`` from now on."""
        self._check()
        if not isinstance(mw, MW) or mw.type != MW_TYPE_1:
            raise InvalidArgument("mw", "QP.bind_mw binds a type 1 MW (type 2: a BIND_MW WR)")
        if self.qp_type not in (RC, UC):
            raise InvalidArgument("qp", "memory windows are bound on RC and UC QPs")
        key = inc_rkey(mw.rkey)
        self._runtime.post_send(self.engine, [bind_wqe(mw, bind_info, key, wr_id, send_flags)])
        mw._rkey = key
        return key

    def post_recv(self, wr: RecvWR | list[RecvWR]) -> None:
        """``ibv_post_recv``; EINVAL on a QP that uses an SRQ (rxe)."""
        self._check()
        if self.srq is not None:
            raise InvalidArgument("qp", "this QP takes receives from its SRQ (post to the SRQ)")
        if self.qp_type in (XRC_SEND, XRC_RECV):
            raise InvalidArgument("qp", "XRC QPs have no receive queue (XRC SRQs receive)")
        wqes, err = build_recv_wqes(wr, self._max_recv_sge)
        if wqes:
            self._runtime.call(self.engine.post_recvs, wqes)
        if err is not None:
            raise err

    def set_recv_feed(self, feed: RecvFeed | None) -> None:
        """Take receives posted into ``feed`` as well as through :meth:`post_recv`
        (a softrdma extension; None detaches it, its receives kept): a receive ring in
        another language's memory, filled without a call into softrdma, as a NIC reads
        its ring (softrdma.capi's ``ibv_post_recv``). The queue takes the stored
        receives when it runs empty, and all of them before a post, a flush (ERR) or a
        reset; see :class:`softrdma.seam.queues.RecvFeed` for the producer's rules.
        Only a QP with a receive queue of its own has a feed."""
        self._check()
        if feed is not None:
            if self.srq is not None or self.qp_type in (XRC_SEND, XRC_RECV):
                raise InvalidArgument("qp", "only a QP with its own receive queue has a feed")
            check_recv_feed(feed)
        self._runtime.call(self.engine.set_recv_feed, feed)

    # ---- rate limit (IBA 9.11) -------------------------------------------------------------------------
    def modify_rate_limit(self, rate_limit: int, max_burst_sz: int = 0,
                          typical_pkt_sz: int = 0) -> None:
        """``ibv_modify_qp_rate_limit``: pace this QP's packets to ``rate_limit`` kbit/s
        (0: no limit beyond the address vector's static rate), ib/pacing.py. The burst and
        packet size hints are accepted and unused (the inter-packet delay follows each
        packet's real length)."""
        self._check()
        for name, value in (("rate_limit", rate_limit), ("max_burst_sz", max_burst_sz),
                            ("typical_pkt_sz", typical_pkt_sz)):
            u32(value, name)
        engine = self.engine

        def _set() -> None:
            engine.rate_limit_bps = rate_limit * KBIT

        self._runtime.call(_set)

    # ---- multicast -----------------------------------------------------------------------------------
    def _mcast(self, gid: GID | str | bytes) -> tuple[bytes, Any]:
        """The checked multicast GID of ``ibv_attach_mcast``/``ibv_detach_mcast`` and the
        link whose devd group it joins or leaves (a shared device's; None on a private
        device, whose link has no ``multicast`` capability)."""
        self._check()
        link = self._runtime.link
        return self._mgid(gid), link if link is not None and link.multicast else None

    def _mgid(self, gid: GID | str | bytes) -> bytes:
        if self.qp_type != UD:
            raise InvalidArgument("qp", "only UD QPs attach to multicast groups (IBA 10.5.2)")
        raw = GID(gid).raw
        v4 = is_v4_mapped(raw)
        if not ((v4 and 224 <= raw[12] <= 239) or (not v4 and raw[0] == 0xFF)):
            raise InvalidArgument("gid", f"{GID(raw)} is not a multicast GID")
        return raw

    def attach_mcast(self, gid: GID | str | bytes, lid: int = 0) -> None:
        """``ibv_attach_mcast``; a shared device also asks its devd for the group."""
        mgid, link = self._mcast(gid)
        join = link.attach_mcast if link is not None else None
        port = self._port

        def _attach() -> None:
            first = mgid not in port.mcast
            if first and join is not None:
                join(mgid)
            self.engine.attach_mcast(mgid)

        self._runtime.call(_attach)

    def detach_mcast(self, gid: GID | str | bytes, lid: int = 0) -> None:
        """``ibv_detach_mcast``; the devd group is left with the process's last member."""
        mgid, link = self._mcast(gid)
        leave = link.detach_mcast if link is not None else None
        port = self._port

        def _detach() -> None:
            members = port.mcast.get(mgid)
            if members is None or self.engine not in members:
                raise InvalidArgument("gid", f"QP {self.qp_num:#x} is not attached to {GID(mgid)}")
            self.engine.detach_mcast(mgid)
            if mgid not in port.mcast and leave is not None:
                leave(mgid)

        self._runtime.call(_detach)

    # ---- lifetime --------------------------------------------------------------------------------------
    def _release(self) -> None:
        self._finalizer.detach()
        if getattr(self, "_opened", False):  # ibv_open_qp's handle: the QP stays
            return
        self.ctx._unregister_owner(self.engine)
        rt = self._runtime
        if rt.closed:
            self.engine.destroy()
            return
        port = self._port
        engine = self.engine
        leave = rt.link.detach_mcast if rt.link is not None and rt.link.multicast else None

        def _destroy() -> None:
            groups = [g for g, members in port.mcast.items() if engine in members]
            engine.destroy()  # the engine leaves its groups, and drops those left empty
            for g in groups:
                if g not in port.mcast and leave is not None:
                    leave(g)

        rt.call(_destroy)

    def __repr__(self) -> str:
        t = e.ibv_qp_type(self.qp_type).name.replace("IBV_QPT_", "")
        return f"<QP {t} qpn={self.engine.qpn:#x} state={state_text(self.engine.state)}>"


def _check_transport_wrs(wr: SendWR | list[SendWR], opcodes: frozenset[int],
                         max_read_sge: int) -> None:
    """The send opcodes the transport has a message for (iWARP: RDMAP's, siw
    ``siw_post_send``: EINVAL otherwise); an RDMA Read has at most ``max_read_sge``
    sink buffers (iWARP: one, as in siw)."""
    for w in chain(wr, SendWR):
        opcode = uint(w.opcode, U32, "wr.opcode")
        if opcode not in opcodes:
            raise InvalidArgument("wr.opcode", f"opcode {opcode!r} has no iWARP (RDMAP) message")
        if opcode == e.IBV_WR_RDMA_READ and len(w.sg) > max_read_sge:
            raise InvalidArgument("wr.num_sge", "an iWARP RDMA Read takes one SGE")


def _defer_destroy(runtime: DeviceRuntime, engine: QPEngine) -> None:
    if runtime.closed:
        engine.destroy()
    else:
        runtime.defer(engine.destroy)
