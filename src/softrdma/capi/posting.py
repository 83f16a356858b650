"""Posting from C: ``ibv_post_send``, ``ibv_post_recv`` and ``ibv_post_srq_recv`` (the
flat records ``struct sr_swr`` / ``struct sr_rwr`` of :mod:`.cdefs`, one call per chain).

A program posts the same request again and again (``ib_write_bw``, ``ibv_rc_pingpong``,
perftest's latency tests: the same buffer, length, opcode and flags, only ``wr_id`` and the
inline bytes may change). ``shim.c`` numbers the contents of each QP's last request
(``sr_same_gen``: the record but its ``wr_id``, and the SGEs; ``gen``, 0 for none), so
the bytes are compared in C: each QP keeps here the :class:`~softrdma.verbs.SendWR` made
for its last number, and a request with that number posts it again, with its ``wr_id``
and a fresh copy of its inline data. ``QP.post_send`` validates it as any other. A thread
takes the entry out of the table while it posts, so two threads that post on one QP
never share one.

Most receives never come here: ``ibv_post_recv`` on a QP with a receive queue of its own,
and ``ibv_post_srq_recv`` on a (non-XRC) SRQ, store one-SGE receives in the QP's or SRQ's
ring in C memory (shim.c ``struct sr_rqring``), and the queue takes them through
:class:`RecvRing`, its :class:`~softrdma.seam.queues.RecvFeed` (``ibv_rc_pingpong``
refills 500 receives one call at a time: 5.2-7.5 us each through Python stalled its
ping-pong for 3 ms; an SRQ receive through Python costs about 5 us, in the ring about
0.05 us). The others (XRC SRQs, several SGEs, a full or closed ring: an SRQ's is closed
while its limit is armed) come here, and repeat too: a QP or SRQ keeps the
:class:`RecvWR` of its last one-SGE receive with that SGE's address, length and L_Key,
and a receive with the same three posts it again with its own
``wr_id`` (the post copies a request into a WQE, so one request object may be posted any
number of times) instead of building and checking an SGE and a request anew.
"""

from __future__ import annotations

import sys
from typing import Any

from .. import enums as e
from ..errors import SoftRdmaError
from ..verbs import AH, MW, QP, SRQ, RecvWR, SendWR
from ..verbs.xrcd import XrcSRQ
from . import handles as hd
from .handles import _get, _sges
from .windows import bind_info

__all__ = ["post_send", "post_recv", "forget", "attach", "attach_srq", "RecvRing"]

_INLINE = int(e.IBV_SEND_INLINE)  # plain ints: IntFlag arithmetic is slow per request
_INV = (int(e.IBV_WR_SEND_WITH_INV), int(e.IBV_WR_LOCAL_INV))
_BIND_MW = int(e.IBV_WR_BIND_MW)
_ATOMIC_WRITE = int(e.IBV_WR_ATOMIC_WRITE)
_ATOMICS = (int(e.IBV_WR_ATOMIC_CMP_AND_SWP), int(e.IBV_WR_ATOMIC_FETCH_AND_ADD))

#: QP handle -> (the content number of its last request, the SendWR made of it)
_last: dict[int, tuple[int, SendWR]] = {}
#: QP or SRQ handle -> (address, length, L_Key of its last one-SGE receive, its RecvWR)
_last_recv: dict[int, tuple[tuple[int, int, int], RecvWR]] = {}
#: QP or SRQ handle -> the QP or SRQ, for those fed by a receive ring
_fed: dict[int, QP | SRQ] = {}
#: receives moved out of a ring per call into C (the length of RecvRing's arrays)
RING_BATCH = 64
_OWN_RQ = (int(e.IBV_QPT_RC), int(e.IBV_QPT_UC), int(e.IBV_QPT_UD))


class RecvRing:
    """A QP's receive ring in C memory (``struct sr_rqring``) as its
    :class:`~softrdma.seam.queues.RecvFeed`: ``sr_rq_drain`` moves entries into four
    arrays, unpacked whole (no per-entry cffi access)."""

    __slots__ = ("ring", "cap", "wr_id", "addr", "length", "lkey")

    def __init__(self, ring: Any, cap: int) -> None:
        new = hd._ffi.new
        self.ring = ring
        self.cap = cap
        self.wr_id = new("uint64_t[]", RING_BATCH)
        self.addr = new("uint64_t[]", RING_BATCH)
        self.length = new("uint32_t[]", RING_BATCH)
        self.lkey = new("uint32_t[]", RING_BATCH)

    def drain(self, qlen: int, most: int, close: bool) -> list[tuple[int, int, int, int]]:
        unpack = hd._ffi.unpack
        drain = hd._lib.sr_rq_drain
        out: list[tuple[int, int, int, int]] = []
        left = most or self.cap
        while left > 0:
            k = min(left, RING_BATCH)
            n = drain(self.ring, self.wr_id, self.addr, self.length, self.lkey, k, qlen,
                      close)
            if n:
                out += zip(unpack(self.wr_id, n), unpack(self.addr, n),
                           unpack(self.length, n), unpack(self.lkey, n), strict=True)
            if n < k:
                break
            qlen += n
            left -= n
        return out

    def reopen(self, qlen: int) -> None:
        hd._lib.sr_rq_reopen(self.ring, qlen)


def attach(h: int, qp: QP, wrapper: Any) -> None:
    """A new QP ``h`` with a receive queue of its own gets a ring in its C wrapper."""
    if wrapper is None or qp.srq is not None or qp.qp_type not in _OWN_RQ:
        return
    cap = qp.cap.max_recv_wr
    _feed(h, qp, hd._lib.sr_rq_ring(wrapper, cap), cap)


def attach_srq(h: int, srq: SRQ, wrapper: Any) -> None:
    """A new SRQ ``h`` (not an XRC SRQ) gets a ring in its C wrapper, of ``max_wr``
    entries."""
    if wrapper is None or isinstance(srq, XrcSRQ):
        return
    cap = srq.query().max_wr
    _feed(h, srq, hd._lib.sr_srq_ring(wrapper, cap), cap)


def _feed(h: int, target: QP | SRQ, ring: Any, cap: int) -> None:
    """Feed ``target`` (handle ``h``) from the ``cap``-entry ring C made for it (NULL: none
    was made, its receives keep going through Python)."""
    if ring == hd._ffi.NULL:
        return
    target.set_recv_feed(RecvRing(ring, cap))
    _fed[h] = target


def _inline(sg: list[Any]) -> bytes:
    """Inline data need not be registered: copied from the program's memory now (one
    ``ffi.unpack`` a gather element: 0.5 us for one, where a buffer made bytes took 0.8)."""
    ffi = hd._ffi
    return b"".join([ffi.unpack(ffi.cast("char *", s.addr), s.length) for s in sg if s.length])


def _send_wr(w: Any) -> SendWR:
    sg = _sges(w.sg, w.num_sge)
    flags = w.send_flags
    wr = SendWR(wr_id=w.wr_id, sg=sg, num_sge=len(sg), opcode=w.opcode, send_flags=flags)
    opcode = w.opcode
    if opcode in _INV:
        wr.invalidate_rkey = w.imm_data
    else:
        wr.imm_data = w.imm_data
    if opcode == _ATOMIC_WRITE:  # ibv_wr_atomic_write: the 8 bytes as they lay in memory
        wr.set_wr_atomic_write(w.rkey, w.remote_addr, w.compare_add.to_bytes(8, sys.byteorder))
        return wr
    if opcode == _BIND_MW:  # a type 2 window (IBA 10.6.7.2.2)
        wr.set_bind_wr(_get(w.mw, MW), bind_info(w.mr, w.remote_addr, w.bind_length,
                                                 w.mw_access))
        wr.rkey = w.rkey
        return wr
    if w.xrc_srqn:
        wr.set_qp_type_xrc(w.xrc_srqn)
    if w.ah:
        wr.set_wr_ud(_get(w.ah, AH), w.remote_qpn, w.remote_qkey)
    elif opcode in _ATOMICS:
        wr.set_wr_atomic(w.rkey, w.remote_addr, w.compare_add, w.swap)
    elif w.rkey or w.remote_addr:
        wr.set_wr_rdma(w.rkey, w.remote_addr)
    if flags & _INLINE:
        wr.set_inline_data(_inline(sg))
    return wr


def post_send(h: int, wrs: Any, n: int, bad: Any) -> int:
    """``sr_py_post_send``: post the ``n`` requests at ``wrs`` on QP ``h``; ``bad[0]`` is
    the index of the one that failed."""
    qp = _get(h, QP)
    for i in range(n):
        bad[0] = i
        w = wrs[i]
        gen = w.gen
        last = _last.pop(h, None) if gen else None
        if last is not None and last[0] == gen:
            wr = last[1]
            wr.wr_id = w.wr_id
            if w.ah:
                _get(w.ah, AH)  # still there (EINVAL once destroyed, as when built)
            if wr.send_flags & _INLINE:
                wr.inline_data = _inline(wr.sg)
        else:
            wr = _send_wr(w)
        qp.post_send(wr)
        if gen:
            _last[h] = (gen, wr)
    return 0


def post_recv(h: int, is_srq: int, wrs: Any, n: int, bad: Any) -> int:
    """``sr_py_post_recv``: post the ``n`` receives at ``wrs`` on QP or SRQ ``h``."""
    target = _get(h, SRQ) if is_srq else _get(h, QP)
    for i in range(n):
        bad[0] = i
        w = wrs[i]
        if w.num_sge == 1 and w.sg:
            s = hd._ffi.cast("struct ibv_sge *", w.sg)[0]
            key = (s.addr, s.length, s.lkey)
            last = _last_recv.pop(h, None)
            if last is not None and last[0] == key:
                wr = last[1]
                wr.wr_id = w.wr_id
            else:
                sg = _sges(w.sg, 1)
                wr = RecvWR(wr_id=w.wr_id, num_sge=1, sg=sg)
            target.post_recv(wr)
            _last_recv[h] = (key, wr)
            continue
        sg = _sges(w.sg, w.num_sge)
        target.post_recv(RecvWR(wr_id=w.wr_id, num_sge=len(sg), sg=sg))
    return 0


def forget(h: int) -> None:
    """Handle ``h`` is destroyed: drop its last request and receive, and detach its ring
    (C frees it once this returns)."""
    _last.pop(h, None)
    _last_recv.pop(h, None)
    fed = _fed.pop(h, None)
    if fed is not None:
        try:
            fed.set_recv_feed(None)
        except SoftRdmaError:
            pass  # destroyed already, or its device closed: its engine runs no more
