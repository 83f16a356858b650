"""Memory windows (IBA 10.6.7, 11.2.9; ``ibv_alloc_mw``/``ibv_bind_mw``/BIND_MW).

A window gives a remote peer access to part of a registered MR under its own R_Key,
and can be moved or revoked without re-registering the MR:

* **type 1** (``MW(pd, MW_TYPE_1)``): bound with :meth:`QP.bind_mw
  <softrdma.verbs.QP.bind_mw>`, which posts the bind on the QP's send queue and gives the
  window its next key (``ibv_inc_rkey``: the low 8 bits, the variant key, advance);
* **type 2** (``MW(pd, MW_TYPE_2)``, rxe's 2B): bound with a BIND_MW work request
  (``SendWR(opcode=IBV_WR_BIND_MW)`` + :meth:`SendWR.set_bind_wr
  <softrdma.verbs.SendWR.set_bind_wr>`, ``wr.rkey`` the new key), to one QP; a peer's
  SEND_WITH_INVALIDATE or a LOCAL_INV revokes it.

The MR must have ``IBV_ACCESS_MW_BIND``; a bind that breaks a rule (other PD, range
outside the MR, REMOTE_WRITE without the MR's LOCAL_WRITE, a type-2 window still bound
...) completes with ``IBV_WC_MW_BIND_ERR`` (IBA C10-72 to C10-75, o10-37.2.30; rxe
``rxe_check_bind_mw``).
The engine side is :mod:`softrdma.ib.mw`; RoCE only (siw has no memory windows).
"""

from __future__ import annotations

from .. import enums as e
from ..errors import InvalidArgument, NotSupported
from ..ib.mw import MW_TYPE_1, MW_TYPE_2, BindRequest, EngineMW
from ..seam.types import SendWQE
from ._args import u32, u64
from ._object import VerbsObject, release_on
from .mr import MR
from .pd import PD

__all__ = ["MW", "MWBindInfo", "MW_TYPE_1", "MW_TYPE_2", "inc_rkey", "bind_wqe"]

_KEY_MASK = 0xFFFFFFFF
_VARIANT_MASK = 0xFF  # IBA 10.6.7.2.1: the consumer-owned low byte of an R_Key


def inc_rkey(rkey: int) -> int:
    """``ibv_inc_rkey``: the same index with the next variant key."""
    return (rkey & ~_VARIANT_MASK & _KEY_MASK) | ((rkey + 1) & _VARIANT_MASK)


class MWBindInfo:
    """``struct ibv_mw_bind_info``: the MR, the range of it and the remote access the
    window grants (``length`` 0 with no MR unbinds)."""

    __slots__ = ("mr", "addr", "length", "mw_access_flags")

    def __init__(self, mr: MR | None, addr: int, length: int, mw_access_flags: int) -> None:
        if mr is not None and not isinstance(mr, MR):
            raise InvalidArgument("bind_info.mr", f"expected an MR, got {type(mr).__name__}")
        addr = u64(addr, "bind_info.addr")
        length = u64(length, "bind_info.length")
        mw_access_flags = u32(mw_access_flags, "bind_info.mw_access_flags")
        if length and mr is None:
            raise InvalidArgument("bind_info.mr", "a bind of a non-empty range needs an MR")
        self.mr = mr
        self.addr = addr
        self.length = length
        self.mw_access_flags = mw_access_flags


class MW(VerbsObject):
    """A memory window of ``pd`` (``ibv_alloc_mw``); see the module docstring."""

    _close_rank = 1

    def __init__(self, pd: PD, mw_type: int = MW_TYPE_1) -> None:
        super().__init__()
        if not isinstance(pd, PD):
            raise InvalidArgument("pd", f"expected a PD, got {type(pd).__name__}")
        if mw_type not in (MW_TYPE_1, MW_TYPE_2):
            raise InvalidArgument("mw_type", f"must be 1 or 2, got {mw_type!r}")
        pd._check()
        ctx = pd.ctx
        if ctx.transport == "iwarp":
            raise NotSupported("memory windows need the IB transport (siw has none)")
        self._runtime = ctx.runtime
        self._port = ctx.port
        self._count_on(ctx.objects, "max_mw")
        with self._runtime.lock:
            key = self._port.new_key()
            self.engine = EngineMW(int(mw_type), pd.protection_domain, key)
        self._depend_on(pd)
        self.pd = pd
        self.type = int(mw_type)
        self._rkey = key

    @property
    def rkey(self) -> int:
        """The window's R_Key: type 1, the key of its last bind (set when the bind is
        posted, as ``ibv_bind_mw``); type 2, the key it is bound with."""
        return self._rkey if self.type == MW_TYPE_1 else int(self.engine.rkey)

    def _release(self) -> None:
        release_on(self._runtime, self.engine.free, self._port)

    def close(self) -> None:
        """Deallocate the window (``ibv_dealloc_mw``); its R_Key stops working."""
        VerbsObject.close(self)

    def __repr__(self) -> str:
        return f"<MW type {self.type} rkey {self.rkey:#x}{' closed' if self.closed else ''}>"


def bind_wqe(mw: object, bind_info: object, rkey: int, wr_id: int, send_flags: int) -> SendWQE:
    """The engine's BIND_MW work request binding ``mw`` as ``bind_info`` says, with key
    ``rkey``."""
    if not isinstance(mw, MW) or mw.closed:
        raise InvalidArgument("wr.mw", "an open MW is needed")
    if bind_info is not None and not isinstance(bind_info, MWBindInfo):
        raise InvalidArgument("wr.bind_info", "expected an MWBindInfo")
    rkey = u32(rkey, "wr.rkey")
    wr_id = u64(wr_id, "wr.wr_id")
    if not isinstance(send_flags, int):
        raise InvalidArgument("wr.send_flags", f"unknown send flags {send_flags!r}")
    mr = bind_info.mr if bind_info is not None else None
    emr = mr.engine_mr if mr is not None and not mr.closed else None
    req = BindRequest(mw.engine, emr, bind_info.addr if bind_info else 0,
                      bind_info.length if bind_info else 0,
                      bind_info.mw_access_flags if bind_info else 0, rkey)
    wqe = SendWQE(wr_id, int(e.IBV_WR_BIND_MW), int(send_flags))
    wqe.bind = req
    return wqe
