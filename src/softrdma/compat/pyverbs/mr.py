"""``pyverbs.mr``: memory regions and memory windows (IBA 10.6; rdma-core
``pyverbs/mr.pyx`` API).

:class:`MR` is a :class:`softrdma.verbs.MR`. As in pyverbs, ``MR(pd, length, access)``
allocates a page-aligned buffer and ``MR(pd, length, access, address=ptr)`` registers the
caller's memory at ``ptr``; ``mr.buf`` is the buffer's address (an ``int``).

On-demand paging (``IBV_ACCESS_ON_DEMAND``): softrdma never pins memory, the engine
reaches registered bytes in place when a packet needs them, which is what ODP promises;
such MRs are accepted and marked on-demand (``PD.advise_mr`` accepts them). An implicit
ODP MR (``implicit=True``) covers the whole address space (``length`` SIZE_MAX, see
:mod:`._procmem`); its ``buf`` is a ``length``-byte buffer allocated as for other MRs.
"""

from __future__ import annotations

import ctypes
import errno
import weakref
from dataclasses import dataclass
from typing import Any

from softrdma import verbs as _v
from softrdma.errors import SoftRdmaError
from softrdma.ib.mw import BindRequest
from softrdma.seam.types import MemoryRegion, SendWQE
from softrdma.verbs import mr as _vmr
from softrdma.verbs._object import VerbsObject

from . import libibverbs_enums as e
from ._imports import file_handle, resolve, unimport
from ._procmem import ProcessMemoryRegion
from .base import PyverbsCM, PyverbsObject, rdma_error, translate
from .device import DM
from .pd import PD
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError

__all__ = ["MR", "MW", "MWBindInfo", "MWBind", "DMMR", "DmaBufMR", "mwtype2str", "bind_wqe"]

_ODP = int(e.IBV_ACCESS_ON_DEMAND)
_REREG_FLAGS = int(e.IBV_REREG_MR_CHANGE_TRANSLATION | e.IBV_REREG_MR_CHANGE_PD
                   | e.IBV_REREG_MR_CHANGE_ACCESS)
_NEEDS_LOCAL_WRITE = int(e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC)


class _MrInfo:
    """What the engine's MemoryRegion records about its compat MR (``owner``)."""

    __slots__ = ("on_demand",)

    def __init__(self, on_demand: bool) -> None:
        self.on_demand = on_demand


def _user_buffer(address: int, length: int) -> Any:
    if not isinstance(address, int) or address <= 0:
        raise PyverbsUserError(f"MR: bad address {address!r}")
    return (ctypes.c_char * length).from_address(address)


class MR(_v.MR, PyverbsCM):
    """A registered memory region (``ibv_reg_mr``); ``MR(pd, handle=h, address=a)``
    imports the MR with handle ``h`` (``ibv_import_mr``, see :mod:`._imports`)."""

    _handle: int | None = None
    _origin: MR | None = None

    def __init__(self, creator: Any, length: int = 0, access: int = 0,
                 address: int | None = None, implicit: bool = False, **kwargs: Any) -> None:
        PyverbsObject.__init__(self)
        if not isinstance(creator, PD):
            raise PyverbsUserError(f"MR: expected a PD, got {type(creator).__name__}")
        if kwargs.get("handle") is not None:
            self._import(creator, kwargs["handle"], address)
            return
        length = int(length)
        access = int(access)
        self.on_demand = bool(access & _ODP)
        if implicit and (not self.on_demand or address is not None):
            raise PyverbsRDMAError("Failed to register a MR: an implicit MR must be "
                                   "on-demand and not given an address", errno.EINVAL)
        try:
            if address is not None:
                buf = _user_buffer(address, length)
                super().__init__(creator, length, access, buffer=buf)
            else:
                super().__init__(creator, length, access)
        except SoftRdmaError as exc:
            raise rdma_error("Failed to register a MR", exc) from exc
        except (OverflowError, MemoryError, ValueError) as exc:
            raise PyverbsRDMAError(f"Failed to register a MR ({exc})", errno.ENOMEM) from exc
        self._access = access
        if implicit:
            self._register_implicit(access & ~_ODP)
        emr = self.engine_mr
        with self.pd.ctx.runtime.lock:
            emr.owner = _MrInfo(self.on_demand)

    def _import(self, pd: PD, handle: object, address: int | None) -> None:
        """``ibv_import_mr``: alias the MR with ``handle`` on ``pd``'s device (same keys,
        memory and engine region). ``buf`` is ``address`` (libibverbs gives an imported
        MR a NULL address; pyverbs callers pass the original's ``buf``)."""
        VerbsObject.__init__(self)
        orig = resolve(pd.ctx, "mr", handle, MR)
        assert isinstance(orig, MR)
        self._origin = orig
        self._handle = orig.handle
        self._emr = orig._emr
        self._runtime, self._port = orig._runtime, orig._port
        self._storage, self._buf = orig._storage, orig._buf
        self.real_address = 0
        if address is not None and int(address) != orig.real_address:
            self._storage = _user_buffer(int(address), orig.length)
            self._buf = memoryview(self._storage).cast("B")
        if address is not None:
            self.real_address = int(address)
        self._access, self.on_demand = orig._access, orig.on_demand
        self._depend_on(pd)
        self.pd = pd
        # the original deregisters (or close() here does), not the collector
        self._finalizer = weakref.finalize(self, _vmr._defer_dereg, self._runtime, self._port,
                                           self._emr)
        self._finalizer.detach()

    def _register_implicit(self, access: int) -> None:
        """Replace the buffer's registration with one spanning the address space."""
        port = self._port
        with self._runtime.lock:
            port.deregister_mr(self._emr)
            key = port.new_key()
            emr = ProcessMemoryRegion(key, access, self.pd.protection_domain)
            port.mrs[key] = emr
        self._finalizer.detach()
        self._emr = emr
        self._finalizer = weakref.finalize(self, _vmr._defer_dereg, self._runtime, port, emr)

    @property
    def buf(self) -> int:  # type: ignore[override]
        """The address of the registered buffer (pyverbs ``MR.buf``)."""
        self._check()
        return int(self.real_address)

    @property
    def access(self) -> int:
        return self._access

    @property
    def handle(self) -> int:
        return file_handle(self, self.pd.ctx, "mr")

    def read(self, length: int, offset: int = 0) -> bytes:
        """``length`` bytes at ``offset`` of the region."""
        try:
            return super().read(int(length), int(offset))
        except SoftRdmaError as exc:
            raise PyverbsUserError(f"MR read: {exc}") from exc

    def write(self, data: Any, length: int | None = None, offset: int = 0) -> None:
        """Copy ``length`` bytes of ``data`` (str or bytes) to ``offset``."""
        try:
            super().write(data, length, int(offset))
        except SoftRdmaError as exc:
            raise PyverbsUserError(f"MR write: {exc}") from exc

    def rereg(self, flags: int, pd: Any = None, addr: int = 0, length: int = 0,
              access: int = 0) -> None:
        """``ibv_rereg_mr``: change the region's translation (``addr``/``length``, the
        caller's memory), PD and/or access in place; the keys stay the same. EINVAL for
        no or unknown flags, a bad PD, a zero length or an invalid access combination.
        Work requests already posted keep their SGEs, so ones that point at the old
        memory fail with a protection error, as on hardware."""
        self._check()
        flags = int(flags)
        if not flags or flags & ~_REREG_FLAGS:
            raise PyverbsRDMAError("Failed to rereg MR: IBV_REREG_MR_ERR_INPUT", errno.EINVAL)
        new_pd = self.pd
        if flags & e.IBV_REREG_MR_CHANGE_PD:
            if not isinstance(pd, PD) or pd.closed or pd.ctx is not self.pd.ctx:
                raise PyverbsRDMAError("Failed to rereg MR: IBV_REREG_MR_ERR_INPUT",
                                       errno.EINVAL)
            new_pd = pd
        new_access = self._access
        if flags & e.IBV_REREG_MR_CHANGE_ACCESS:
            new_access = int(access)
            bad = new_access & ~_vmr.ACCESS_SUPPORTED or (
                new_access & _NEEDS_LOCAL_WRITE and not new_access & e.IBV_ACCESS_LOCAL_WRITE)
            if bad or new_access & e.IBV_ACCESS_ZERO_BASED:
                raise PyverbsRDMAError("Failed to rereg MR: IBV_REREG_MR_ERR_INPUT",
                                       errno.EINVAL)
        storage: Any = None
        if flags & e.IBV_REREG_MR_CHANGE_TRANSLATION:
            if int(length) <= 0 or not addr:
                raise PyverbsRDMAError("Failed to rereg MR: IBV_REREG_MR_ERR_INPUT",
                                       errno.EINVAL)
            storage = _user_buffer(int(addr), int(length))
        emr = self.engine_mr
        with self._runtime.lock:
            if storage is not None:
                mv = memoryview(storage).cast("B")
                self._storage = storage
                self._buf = mv
                self.real_address = int(addr)
                emr.buf = mv
                emr.addr = int(addr)
                emr.length = int(length)
            emr.access = new_access & ~_ODP
            emr.pd = new_pd.protection_domain
        self._move(self.pd, new_pd)
        self.pd = new_pd
        self._access = new_access
        self.on_demand = bool(new_access & _ODP)
        emr.owner = _MrInfo(self.on_demand)

    def unimport(self) -> None:
        """``ibv_unimport_mr`` (see :mod:`._imports`)."""
        unimport(self, "MR")

    def _release(self) -> None:
        if self._origin is None:
            super()._release()

    def close(self) -> None:
        """Deregister (``ibv_dereg_mr``); idempotent. Deregistering an imported MR
        deregisters the shared region: the original is closed too."""
        if self.closed:
            return
        _v.MR.close(self)
        if self._origin is not None:
            self._origin.close()


def mwtype2str(mw_type: int) -> str:
    return {1: "IBV_MW_TYPE_1", 2: "IBV_MW_TYPE_2"}.get(mw_type, f"Unknown MW type ({mw_type})")


@dataclass(eq=False)
class MWBindInfo(PyverbsCM):
    """``struct ibv_mw_bind_info``: the MR, range and access a bind grants."""

    mr: MR
    addr: int
    length: int
    mw_access_flags: int


class MWBind(PyverbsCM):
    """``struct ibv_mw_bind``: a type-1 bind request (``ibv_bind_mw``)."""

    def __init__(self, mw_bind_info: MWBindInfo, send_flags: int, wr_id: int = 0) -> None:
        super().__init__()
        self.bind_info = mw_bind_info
        self.send_flags = send_flags
        self.wr_id = wr_id


class MW(_v.MW, PyverbsCM):
    """A memory window (``ibv_alloc_mw``, IBA 10.6.7): type 1 (bound with
    :meth:`QP.bind_mw <softrdma.compat.pyverbs.qp.QP.bind_mw>`) or type 2 (bound with a
    BIND_MW work request). The window lives in the engine (:mod:`softrdma.ib.mw`); closing
    it (or its PD) deallocates it and its R_Key stops working. Verbs' :class:`MW
    <softrdma.verbs.mw.MW>` with pyverbs' errors and ``handle``."""

    def __init__(self, pd: PD, mw_type: int) -> None:
        if not isinstance(pd, PD):
            raise PyverbsUserError(f"MW: expected a PD, got {type(pd).__name__}")
        with translate("Failed to allocate MW"):
            super().__init__(pd, mw_type)

    @property
    def handle(self) -> int:
        return self._rkey >> 8


def bind_wqe(mw: MW, bind_info: MWBindInfo | None, rkey: int, wr_id: int,
             send_flags: int) -> SendWQE:
    """The BIND_MW work request binding ``mw`` as ``bind_info`` says, with key ``rkey``."""
    if not isinstance(mw, MW) or mw.closed:
        raise PyverbsUserError("bind: expected an open MW")
    mr = bind_info.mr if bind_info is not None else None
    emr = mr.engine_mr if isinstance(mr, MR) and not mr.closed else None
    req = BindRequest(mw.engine, emr, int(bind_info.addr) if bind_info else 0,
                      int(bind_info.length) if bind_info else 0,
                      int(bind_info.mw_access_flags) if bind_info else 0, int(rkey) & 0xFFFFFFFF)
    wqe = SendWQE(wr_id, int(e.IBV_WR_BIND_MW), send_flags)
    wqe.bind = req
    return wqe


_DM_ACCESS = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
                 | e.IBV_ACCESS_REMOTE_ATOMIC | e.IBV_ACCESS_ZERO_BASED)


class DMMR(MR):
    """An MR on device memory (``ibv_reg_dm_mr``): ``length`` bytes of ``dm`` from
    ``offset``, zero-based (``IBV_ACCESS_ZERO_BASED`` is required, so ``buf`` is 0 and
    SGE/remote addresses are offsets). EINVAL for other access flags or a range outside
    the DM. ``read``/``write`` copy through the DM (``copy_from_dm``/``copy_to_dm``)."""

    def __init__(self, pd: PD, length: int, access: int, dm: Any, offset: int) -> None:
        VerbsObject.__init__(self)
        length, access, offset = int(length), int(access), int(offset)
        msg = f"Failed to register a device MR. length: {length}, access flags: {access}"
        if not isinstance(pd, PD) or not isinstance(dm, DM):
            raise PyverbsUserError("DMMR needs a PD and a DM")
        if (not access & e.IBV_ACCESS_ZERO_BASED or access & ~_DM_ACCESS
                or (access & _NEEDS_LOCAL_WRITE and not access & e.IBV_ACCESS_LOCAL_WRITE)
                or length < 0 or offset < 0 or offset + length > dm.length or dm.closed
                or pd.closed or pd.ctx is not dm.context):
            raise PyverbsRDMAError(msg, errno.EINVAL)
        ctx = pd.ctx
        self._runtime = ctx.runtime
        self._port = ctx.port
        mv = memoryview(dm.memory)[offset:offset + length]
        with self._runtime.lock:
            key = self._port.new_key()
            emr = MemoryRegion(key, key, 0, mv, access & ~int(e.IBV_ACCESS_ZERO_BASED),
                               pd.protection_domain, True)
            emr.owner = _MrInfo(False)
            self._port.mrs[key] = emr
        self._emr = emr
        self._buf = mv
        self._storage = dm.memory
        self.real_address = 0
        self._depend_on(pd, dm)
        self.pd = pd
        self.dm = dm
        self._dm_offset = offset
        self._access = access
        self.on_demand = False
        self._finalizer = weakref.finalize(self, _vmr._defer_dereg, self._runtime, self._port,
                                           emr)

    @property
    def buf(self) -> int:  # type: ignore[override]
        """0: a DMMR is zero-based."""
        self._check()
        return 0

    def write(self, data: Any, length: int | None = None, offset: int = 0) -> None:
        """Copy to the device memory at ``offset`` of this region."""
        n = len(data) if length is None else int(length)
        self.dm.copy_to_dm(self._dm_offset + int(offset), data, n)

    def read(self, length: int, offset: int = 0) -> bytes:
        """Copy from the device memory at ``offset`` of this region."""
        return bytes(self.dm.copy_from_dm(self._dm_offset + int(offset), int(length)))

    def rereg(self, flags: int, pd: Any = None, addr: int = 0, length: int = 0,
              access: int = 0) -> None:
        raise PyverbsRDMAError("Failed to rereg MR: device-memory MRs cannot be "
                               "re-registered", errno.EINVAL)


class DmaBufMR(MR):
    """An MR on a dma-buf (``ibv_reg_dmabuf_mr``): not supported (EOPNOTSUPP)."""

    def __init__(self, pd: PD, length: int, access: int, dmabuf: Any = None,
                 offset: int = 0, gpu: int = 0, gtt: int = 0) -> None:
        PyverbsObject.__init__(self)
        raise PyverbsRDMAError("Failed to register a dma-buf MR", errno.EOPNOTSUPP)
