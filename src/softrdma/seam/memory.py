"""Scatter/gather between work requests and registered memory (IBA 10.6, 10.7.2.x).

Local keys are checked when a WQE is first executed, as rxe does; a bad lkey, a
protection-domain mismatch, missing LOCAL_WRITE or an out-of-bounds SGE makes the
WQE complete with IBV_WC_LOC_PROT_ERR.
"""

from __future__ import annotations

from collections.abc import Sequence

from .types import SGE, MemoryRegion


def resolve_sges(mrs: dict[int, MemoryRegion], pd: object, sg_list: Sequence[SGE],
                 need: int) -> list[memoryview] | None:
    """Memoryviews for each non-empty SGE, or None on a local protection error.

    ``need`` is the access flag the MR must grant (IBV_ACCESS_LOCAL_WRITE for receive
    buffers and RDMA READ / atomic results; 0 for data that is only read).
    """
    segs: list[memoryview] = []
    for sge in sg_list:
        n = sge.length
        if n == 0:
            continue
        mr = mrs.get(sge.lkey)
        if mr is None or not mr.valid or mr.pd is not pd:
            return None
        if need and not (mr.access & need):
            return None
        off = mr.offset_of(sge.addr, n)
        if off < 0:
            return None
        segs.append(mr.buf[off:off + n])
    return segs


def gather(segs: list[memoryview], off: int, n: int) -> list[memoryview]:
    """The memoryview slices that make up bytes [off, off+n) of a scatter list (no copy)."""
    if len(segs) == 1:
        return [segs[0][off:off + n]]
    out: list[memoryview] = []
    for s in segs:
        ln = len(s)
        if off >= ln:
            off -= ln
            continue
        take = ln - off if ln - off < n else n
        out.append(s[off:off + take])
        n -= take
        off = 0
        if n == 0:
            break
    return out


def scatter(segs: list[memoryview], off: int, data: memoryview) -> bool:
    """Copy ``data`` into the scatter list at byte ``off``; False if it does not fit."""
    n = len(data)
    if n == 0:
        return True
    if len(segs) == 1:
        s = segs[0]
        if off + n > len(s):
            return False
        s[off:off + n] = data
        return True
    total = 0
    for s in segs:
        total += len(s)
    if off + n > total:
        return False
    pos = 0
    for s in segs:
        ln = len(s)
        if off >= ln:
            off -= ln
            continue
        take = ln - off if ln - off < n - pos else n - pos
        s[off:off + take] = data[pos:pos + take]
        pos += take
        off = 0
        if pos == n:
            break
    return True


def total_len(segs: list[memoryview]) -> int:
    t = 0
    for s in segs:
        t += len(s)
    return t
