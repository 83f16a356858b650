"""STag allocation and checking (RFC 5040 §8.1, RFC 5041 §5.2; siw ``siw_mem.c``).

An STag is 32 bits: a 24-bit index naming the memory object and an 8-bit key
(``stag = index << 8 | key``), as in siw (``mem->stag = id << 8 | key``).

* RFC 5040 §8.1.1 item 8 ("An RNIC MUST choose the value of STags in a way difficult to
  predict. It is RECOMMENDED to sparsely populate them over the full available range"):
  the index is drawn at random from the whole 24-bit space (never sequential, never
  derived from earlier STags) and the key is random too, so knowing one STag tells
  nothing about the next.
* Item 1 ("a specific Stream in a specific Protection Domain cannot access an STag in a
  different Protection Domain"): :func:`check_access` reports a PD mismatch.
* Item 6 (no access after revocation): an invalidated or deregistered STag fails as
  ``INVALID``.

:func:`check_access` returns the access-check outcome the way siw classifies it
(``enum siw_access_state``); :mod:`.terminate` maps it to the DDP or RDMAP error code.
"""

from __future__ import annotations

from enum import IntEnum

from ..errors import ResourceError
from ..seam.tables import os_randbits
from ..seam.types import MemoryRegion

__all__ = ["Access", "StagAllocator", "check_access", "stag_index", "MAX_STAG_INDEX"]

MAX_STAG_INDEX = 0xFFFFFF
_U64 = 1 << 64


class Access(IntEnum):
    """Outcome of an STag check (siw ``siw_access_state``, plus TO wrap)."""

    OK = 0
    INVALID = 1       # unknown STag, wrong key, invalidated or deregistered
    BASE_BOUNDS = 2   # [TO, TO+len) not inside the region
    PD_MISMATCH = 3   # the region belongs to another protection domain
    ACCESS_PERM = 4   # the region does not grant the requested access
    TO_WRAP = 5       # TO + len wraps the 64-bit tagged-offset space


def stag_index(stag: int) -> int:
    """The 24-bit index part of an STag."""
    return (stag >> 8) & MAX_STAG_INDEX


class StagAllocator:
    """Random, sparse, unique STags (RFC 5040 §8.1.1 item 8).

    ``alloc()`` returns a fresh STag whose index is not in use; ``free(stag)`` returns its
    index. Index 0 is never used, so STag values 0x00-0xFF (and the RTR STag 1 of
    RFC 6581 peers) never name a region.
    """

    def __init__(self) -> None:
        self._used: set[int] = set()

    def __len__(self) -> int:
        return len(self._used)

    def alloc(self) -> int:
        used = self._used
        if len(used) >= MAX_STAG_INDEX:
            raise ResourceError("no free STag index")
        while True:
            index = os_randbits(24)
            if index and index not in used:
                used.add(index)
                return (index << 8) | os_randbits(8)

    def free(self, stag: int) -> None:
        self._used.discard(stag_index(stag))


def check_access(mr: MemoryRegion | None, stag: int, pd: object, to: int, length: int,
                 need: int) -> tuple[Access, int]:
    """Check a remote access of ``length`` bytes at tagged offset ``to`` through ``stag``.

    Returns ``(Access.OK, offset in mr.buf)`` or ``(reason, -1)``. The order of the
    checks is siw's ``siw_check_mem``: STag valid (and same key), PD, access rights, then
    base/bounds; a TO wrap is reported before bounds (RFC 5040 §7.2 item e).
    """
    if mr is None or not mr.valid or mr.rkey != stag:
        return Access.INVALID, -1
    if mr.pd is not pd:
        return Access.PD_MISMATCH, -1
    if need and not mr.access & need:
        return Access.ACCESS_PERM, -1
    if to + length > _U64:
        return Access.TO_WRAP, -1
    off = mr.offset_of(to, length)
    if off < 0:
        return Access.BASE_BOUNDS, -1
    return Access.OK, off
