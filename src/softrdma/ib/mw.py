"""Memory windows (IBA 10.6.7; rxe ``rxe_mw.c``).

A window is allocated on a PD with an R_Key and no access; a bind (a BIND_MW work
request executed in send-queue order, IBA 10.6.7.2) gives it a range of an MR, remote
access rights and a new R_Key whose low byte (the consumer key) differs from the old one.
A bound window is an entry of the port's key table: a :class:`MemoryRegion` over the
bound bytes, so the responder checks R_Key, PD, access and bounds exactly as for MRs
(IBA 10.6.3.1), and invalidation (LOCAL_INV, SEND_WITH_INV, IBA 10.6.7; o10-37.2.26) clears its
``valid`` flag. Deallocation removes the entry.

Bind checks, each a ``IBV_WC_MW_BIND_ERR`` completion (rxe ``rxe_check_bind_mw``): the
window is allocated and of the QP's PD; a type-2 window is not already bound and the new
key byte differs from the current one; with a non-zero length the MR is valid, of the
same PD, registered with ``IBV_ACCESS_MW_BIND``, covers the range, and grants
LOCAL_WRITE when the window grants REMOTE_WRITE or REMOTE_ATOMIC (IBA C10-72 to C10-75 as rxe
cites them: PD, MW_BIND, LOCAL_WRITE, range).
A zero-length bind of a type-1 window leaves it bound to nothing (any access fails).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..enums import ibv_access_flags as ACC
from ..enums import ibv_wc_status as WCS
from ..seam.protocols import DeviceEngine
from ..seam.types import MemoryRegion

__all__ = ["EngineMW", "BindRequest", "MW_TYPE_1", "MW_TYPE_2", "remotely_invalidatable"]

MW_TYPE_1 = 1
MW_TYPE_2 = 2
_MW_ACCESS = int(ACC.IBV_ACCESS_REMOTE_READ | ACC.IBV_ACCESS_REMOTE_WRITE
                 | ACC.IBV_ACCESS_REMOTE_ATOMIC | ACC.IBV_ACCESS_ZERO_BASED)
_NEEDS_LOCAL_WRITE = int(ACC.IBV_ACCESS_REMOTE_WRITE | ACC.IBV_ACCESS_REMOTE_ATOMIC)
_EMPTY = memoryview(bytearray(0))


class EngineMW:
    """A memory window: type, PD, current R_Key and (when bound) its key-table entry."""

    __slots__ = ("mw_type", "pd", "rkey", "region", "qp", "freed")

    def __init__(self, mw_type: int, pd: object, rkey: int) -> None:
        self.mw_type = mw_type
        self.pd = pd
        self.rkey = rkey
        self.region: MemoryRegion | None = None
        self.qp: object = None
        self.freed = False

    def unbind(self, port: DeviceEngine) -> None:
        """Drop the key-table entry (dealloc, or before a rebind)."""
        r = self.region
        if r is not None:
            r.valid = False
            if port.mrs.get(r.rkey) is r:
                del port.mrs[r.rkey]
        self.region = None
        self.qp = None

    def free(self, port: DeviceEngine) -> None:
        """``ibv_dealloc_mw``: the window and its R_Key stop existing."""
        self.unbind(port)
        self.freed = True


@dataclass(eq=False, slots=True)
class BindRequest:
    """The bind a BIND_MW work request carries (``struct ibv_mw_bind_info`` + new key)."""

    mw: EngineMW
    mr: MemoryRegion | None
    addr: int
    length: int
    access: int
    rkey: int

    def execute(self, port: DeviceEngine, qp: object, qp_pd: object) -> int:
        """Bind; 0 on success, else the WC status (IBV_WC_MW_BIND_ERR)."""
        err = int(WCS.IBV_WC_MW_BIND_ERR)
        mw = self.mw
        if mw.freed or mw.pd is not qp_pd:
            return err
        access = self.access & _MW_ACCESS
        if mw.mw_type == MW_TYPE_2:
            if (mw.region is not None and mw.region.valid) or (self.rkey & 0xFF) == (mw.rkey & 0xFF):
                return err
        elif access & ACC.IBV_ACCESS_ZERO_BASED:
            return err
        if (self.rkey >> 8) != (mw.rkey >> 8):
            return err
        other = port.mrs.get(self.rkey)
        if other is not None and other is not mw.region:
            return err
        mr = self.mr
        if self.length:
            if mr is None or not mr.valid or mr.pd is not mw.pd:
                return err
            if not mr.access & ACC.IBV_ACCESS_MW_BIND:
                return err
            if access & _NEEDS_LOCAL_WRITE and not mr.access & ACC.IBV_ACCESS_LOCAL_WRITE:
                return err
            off = mr.offset_of(self.addr, self.length)
            if off < 0:
                return err
            buf = mr.buf[off:off + self.length]
        else:
            buf = _EMPTY
        mw.unbind(port)
        zero = bool(access & ACC.IBV_ACCESS_ZERO_BASED)
        region = MemoryRegion(self.rkey, self.rkey, 0 if zero else self.addr, buf,
                              access & ~int(ACC.IBV_ACCESS_ZERO_BASED), mw.pd, zero)
        region.owner = mw
        port.mrs[self.rkey] = region
        mw.region = region
        mw.rkey = self.rkey
        if mw.mw_type == MW_TYPE_2:
            mw.qp = qp
        return 0


def remotely_invalidatable(region: MemoryRegion) -> bool:
    """Whether a RoCE SEND_WITH_INVALIDATE may invalidate the key of ``region``.

    We follow rxe (``rxe_invalidate_mr``/``rxe_invalidate_mw``): only a type-2 memory
    window may be invalidated by the peer (a type-1 window cannot, IBA o10-37.2.26, and an
    MR only when it is a fast-registration MR, ``IB_MR_TYPE_MEM_REG``, which softrdma does
    not have), so an ordinary registered MR cannot be revoked by a remote peer. iWARP keeps
    siw's rule instead (RFC 5040 §6.9 lets a peer invalidate any STag it was given; see
    ``softrdma.iwarp.engine``)."""
    owner = region.owner
    return isinstance(owner, EngineMW) and owner.mw_type == MW_TYPE_2
