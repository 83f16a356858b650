"""XRC domains and XRC SRQs (IBA Annex A14; ``ibv_open_xrcd``,
``ibv_create_srq_ex`` with ``IBV_SRQT_XRC``, ``ibv_get_srq_num``).

``XRCD(ctx)`` opens a new private XRC domain (``fd=-1``). ``XRCD(ctx, fd, oflags)``
opens the domain tied to the file open on ``fd``, as the kernel does (``ib_uverbs_open_xrcd``):
the file's inode names the domain, so every ``XRCD`` of a context opened on the same
file is the same domain; ``O_CREAT`` creates it when the file has none yet
(otherwise EINVAL), ``O_EXCL`` refuses an existing one (EINVAL).

On a device shared through its daemon (``devd``), the domain of a file is also the
domain of every other process (or context) that opens the same file on the device, as
with the kernel: the XRCD joins the daemon's domain of that file (it passes the file's
descriptor), each XRC SRQ is registered there, and a TGT QP hands the SENDs that name
another process's SRQ over to that process, which places and completes them
(``softrdma.ib.xrc``, ``softrdma.drivers.devd.xrc``; RDMA operations do not cross
processes). On a private device (one engine) the domain of a file is the context's.

``XrcSRQ(pd, xrcd, cq, init_attr)`` is an XRC SRQ: an SRQ whose completions go to its
own CQ ``cq`` and whose number (:attr:`XrcSRQ.srq_num`) senders put in the XRCETH
(``SendWR.set_qp_type_xrc``). XRC QPs: ``QP(pd, QPInitAttr(qp_type=IBV_QPT_XRC_SEND,
scq=cq))`` and ``QP(xrcd, QPInitAttr(qp_type=IBV_QPT_XRC_RECV))`` (``softrdma.verbs.qp``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Any

from ..errors import InvalidArgument, ResourceError, SoftRdmaError
from ..ib.port import Port
from ..ib.xrc import XF_CREDIT, XrcDomain, srq_table
from ..ib.xrc import XrcSRQ as EngineXrcSRQ
from ._args import uint
from ._object import VerbsObject, release_on
from .cq import CQ
from .device import MAX_SRQ_SGE, MAX_SRQ_WR, Context
from .pd import PD
from .srq import SRQ, SrqInitAttr

__all__ = ["XRCD", "XrcSRQ", "XRCD_FD_NONE"]

XRCD_FD_NONE = -1  # ibv_xrcd_init_attr.fd for a domain tied to no file
_FILE_DOMAINS_LOCK = threading.Lock()
# (engine port, st_dev, st_ino) -> the domain of that file, while an XRCD has it open
_FILE_DOMAINS: weakref.WeakValueDictionary[tuple[object, int, int], XrcDomain] = \
    weakref.WeakValueDictionary()


class _SharedDomain:
    """The daemon's side of a domain opened on a file on a shared device: the
    :class:`~softrdma.ib.xrc.XrcRelay` of the engine's domain, over the devd link."""

    __slots__ = ("link", "ident")

    def __init__(self, link: Any, ident: int) -> None:
        self.link = link
        self.ident = ident

    def lookup(self, srqn: int) -> bool:
        try:
            return bool(self.link.xrc_lookup(self.ident, srqn))
        except SoftRdmaError:
            return False  # the daemon is stalled or gone: an invalid XRCETH for now

    def relay(self, flags: int, srqn: int, tgt_qpn: int, src_qp: int, word: int,
              payload: memoryview) -> bool:
        return bool(self.link.xrc_send(flags, self.ident, srqn, tgt_qpn, src_qp, word,
                                       payload))

    def credit(self, srqn: int, tgt_qpn: int, count: int) -> bool:
        return bool(self.link.xrc_send(XF_CREDIT, self.ident, srqn, tgt_qpn, 0, count,
                                       b""))

    def register(self, srqn: int) -> None:
        self.link.xrc_srq(self.ident, srqn)


class XRCD(VerbsObject):
    """An XRC domain of ``ctx`` (``ibv_open_xrcd``); see the module docstring."""

    _close_rank = 6

    def __init__(self, ctx: Context, fd: int = XRCD_FD_NONE, oflags: int = 0) -> None:
        super().__init__()
        if not isinstance(ctx, Context):
            raise InvalidArgument("ctx", f"XRCD needs a Context, got {type(ctx).__name__}")
        ctx._check()
        port = ctx.port
        if not isinstance(port, Port):
            raise InvalidArgument("ctx", "XRC is an InfiniBand transport service; iWARP "
                                  "devices have none")
        if not isinstance(fd, int) or fd < XRCD_FD_NONE:
            raise InvalidArgument("fd", f"must be an open file descriptor or -1, got {fd!r}")
        if not isinstance(oflags, int) or oflags < 0:
            raise InvalidArgument("oflags", f"must be open(2) flags, got {oflags!r}")
        self.ctx = ctx
        self.fd = fd
        self.shared: _SharedDomain | None = None
        if fd == XRCD_FD_NONE:
            self.domain = XrcDomain(port)
        else:
            try:
                st = os.fstat(fd)
            except OSError as exc:
                raise InvalidArgument("fd", f"not an open file descriptor: {exc.strerror}") \
                    from exc
            key = (port, st.st_dev, st.st_ino)
            with _FILE_DOMAINS_LOCK:
                dom = _FILE_DOMAINS.get(key)
                if dom is None:
                    if not oflags & os.O_CREAT:
                        raise InvalidArgument("oflags", "the file has no XRC domain and "
                                              "O_CREAT is not given")
                    dom = XrcDomain(port)
                    _FILE_DOMAINS[key] = dom
                elif oflags & os.O_EXCL:
                    raise InvalidArgument("oflags", "O_EXCL: the file already has an XRC "
                                          "domain")
            self.domain = dom
            link = ctx.runtime.link
            if link is not None and link.xrc:
                self._join(link, port, fd)
        self._depend_on(ctx)

    def _join(self, link: Any, port: Port, fd: int) -> None:
        """Join the daemon's domain of the file (module docstring); the first XRCD of
        the domain in this context makes it hand SENDs over and take them."""
        ident = link.xrcd_open(fd)
        shared = self.shared = _SharedDomain(link, ident)
        dom = self.domain
        if dom.relay is None:
            dom.relay = shared
            link.xrc_sink = srq_table(port).hand_over

    def _release(self) -> None:
        shared, self.shared = self.shared, None
        if shared is not None:
            with contextlib.suppress(SoftRdmaError, OSError):
                shared.link.xrcd_close(shared.ident)
        super()._release()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<XRCD of {self.ctx.name} fd={self.fd}{state}>"


class XrcSRQ(SRQ):
    """An XRC SRQ of ``pd`` in ``xrcd``, completing into ``cq`` (``IBV_SRQT_XRC``)."""

    def __init__(self, pd: PD, xrcd: XRCD, cq: CQ, init_attr: SrqInitAttr) -> None:
        VerbsObject.__init__(self)
        if not isinstance(pd, PD):
            raise InvalidArgument("pd", f"expected a PD, got {type(pd).__name__}")
        if not isinstance(xrcd, XRCD):
            raise InvalidArgument("xrcd", f"expected an XRCD, got {type(xrcd).__name__}")
        if not isinstance(cq, CQ):
            raise InvalidArgument("cq", f"an XRC SRQ needs a CQ, got {type(cq).__name__}")
        for name, obj in (("pd", pd), ("xrcd", xrcd), ("cq", cq)):
            obj._check()
            if obj.ctx is not pd.ctx:
                raise InvalidArgument(name, "belongs to another context")
        if not isinstance(init_attr, SrqInitAttr):
            raise InvalidArgument("init_attr",
                                  f"expected SrqInitAttr, got {type(init_attr).__name__}")
        a = init_attr.attr
        max_wr = uint(a.max_wr, MAX_SRQ_WR, "attr.max_wr", 1)
        max_sge = uint(a.max_sge, MAX_SRQ_SGE, "attr.max_sge", 1)
        limit = uint(a.srq_limit, max_wr, "attr.srq_limit", 0)
        ctx = pd.ctx
        if xrcd.domain.closed:
            raise ResourceError("the XRC domain is closed")
        self._runtime = ctx.runtime
        with self._counting(ctx.objects, "max_srq"):  # rxe: XRC SRQs are in the SRQ pool
            self.engine: EngineXrcSRQ = ctx.runtime.call(
                EngineXrcSRQ, ctx.port, pd.protection_domain, xrcd.domain, cq.sink, max_wr,
                max_sge, limit)
        self._depend_on(pd, xrcd, cq)
        self.pd = pd
        self.ctx = ctx
        self.xrcd = xrcd
        self.cq = cq
        self.srq_context = init_attr.srq_context
        ctx._register_owner(self.engine, self)
        if xrcd.shared is not None:  # other processes of the domain may deliver into it
            try:
                xrcd.shared.register(self.engine.srqn)
            except BaseException:
                self.close()
                raise

    @property
    def srq_num(self) -> int:
        """The SRQ number a sender names in the XRCETH (``ibv_get_srq_num``)."""
        return self.engine.srqn

    def get_srq_num(self) -> int:
        self._check()
        return self.engine.srqn

    def _release(self) -> None:
        release_on(self._runtime, self.engine.destroy)
        super()._release()
