"""``softrdma.capi.posting`` in-process: ``ibv_post_recv``'s records as shim.c passes them
(``struct sr_rwr`` pointing at ``struct ibv_sge`` arrays), posted on a verbs QP of a
fabric pair (issue 22). A QP keeps the request of its last one-SGE receive and posts it
again for a receive with the same SGE; these tests check that every receive still lands
where its own SGE says, with its own ``wr_id``, whether or not it repeats the last one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import cffi
import pytest
from harness.verbs_pair import RC, FabricPair

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.capi import handles as hd
from softrdma.capi import posting

_CDEF = """
struct ibv_sge { uint64_t addr; uint32_t length; uint32_t lkey; };
struct sr_rwr { uint64_t wr_id; uint64_t sg; uint32_t num_sge; };
"""


@pytest.fixture()
def ffi(monkeypatch: pytest.MonkeyPatch) -> Any:
    f = cffi.FFI()
    f.cdef(_CDEF)
    monkeypatch.setattr(hd, "_ffi", f)
    return f


@pytest.fixture()
def fp() -> Iterator[FabricPair]:
    p = FabricPair(RC)
    yield p
    p.close()


def _post_recvs(ffi: Any, h: int, recvs: list[tuple[int, list[tuple[int, int]]]],
                fp: FabricPair) -> None:
    """Post ``(wr_id, [(offset in b's buffer, length), ...])`` receives, one call each
    (as ibv_rc_pingpong refills), through posting.post_recv."""
    keep = []
    for wr_id, sges in recvs:
        arr = ffi.new("struct ibv_sge[]", [(fp.b.mr.addr + off, n, fp.b.mr.lkey)
                                           for off, n in sges])
        rec = ffi.new("struct sr_rwr[1]", [(wr_id, int(ffi.cast("uintptr_t", arr)), len(sges))])
        bad = ffi.new("int *")
        keep += [arr, rec]
        assert posting.post_recv(h, 0, rec, 1, bad) == 0


def test_repeated_receives_land_with_their_own_sge_and_wr_id(ffi: Any, fp: FabricPair) -> None:
    h = hd._add(fp.b.qp)
    try:
        # the same SGE twice, another SGE twice, back to the first, then two SGEs
        _post_recvs(ffi, h, [(101, [(0, 64)]), (102, [(0, 64)]), (103, [(256, 64)]),
                             (104, [(256, 64)]), (105, [(0, 32)]), (106, [(512, 16), (640, 16)])],
                    fp)
        payloads = [bytes([i]) * 32 for i in range(1, 7)]
        for i, p in enumerate(payloads):
            fp.a.buf[1024 * i:1024 * i + 32] = p
            fp.a.qp.post_send(v.SendWR(i, opcode=int(e.IBV_WR_SEND),
                                       sg=[fp.a.sge(1024 * i, 32)]))
        fp.run()
        got = []
        while True:
            n, wcs = fp.b.cq.poll(16)
            if not n:
                break
            got += [(w.wr_id, w.status, w.byte_len) for w in wcs if w.opcode == e.IBV_WC_RECV]
        assert got == [(101 + i, 0, 32) for i in range(6)]
        b = fp.b.buf
        assert bytes(b[0:32]) == payloads[4]      # 101, 102, then 105 wrote offset 0
        assert bytes(b[256:288]) == payloads[3]   # 103, then 104 wrote offset 256
        assert bytes(b[512:528]) + bytes(b[640:656]) == payloads[5]
    finally:
        posting.forget(h)
        hd._forget(h)
    assert h not in posting._last_recv


def test_only_the_same_sge_reuses_the_last_request(ffi: Any, fp: FabricPair) -> None:
    """A receive whose SGE differs from the last one's in any field is built anew; one
    with the same SGE posts the kept request with its own ``wr_id``."""
    h = hd._add(fp.b.qp)
    try:
        _post_recvs(ffi, h, [(1, [(0, 64)])], fp)
        key, wr = posting._last_recv[h]
        assert key == (fp.b.mr.addr, 64, fp.b.mr.lkey) and wr.wr_id == 1
        _post_recvs(ffi, h, [(2, [(0, 65)])], fp)  # one byte longer: a new request
        key2, wr2 = posting._last_recv[h]
        assert key2 == (fp.b.mr.addr, 65, fp.b.mr.lkey) and wr2 is not wr
        assert wr2.wr_id == 2 and wr2.sg[0].length == 65
        _post_recvs(ffi, h, [(3, [(0, 65)])], fp)  # the same again: that request, reused
        assert posting._last_recv[h][1] is wr2 and wr2.wr_id == 3
    finally:
        posting.forget(h)
        hd._forget(h)
