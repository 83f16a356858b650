"""Property over the in-memory fabric, through the verbs API and the runtime (ICRC and
all): random mixes of every RC opcode and sizes from 0 B to 1 MiB under 0-20% loss,
duplication, reordering and corruption deliver every byte exactly once, in order, with
the right completions; a peer that disappears gives RETRY_EXC_ERR, not a hang."""

from __future__ import annotations

import struct

import pytest
from harness.fabric_mix import roce_ver_of
from harness.mw import type2_window
from harness.property_budget import examples
from harness.verbs_pair import RC, Side, connect
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.links.link import Datagram
from softrdma.drivers.runtime.clock import VirtualClock

W = e.ibv_wr_opcode
MiB = 1 << 20
_BTH_RESV8A = 4  # the BTH byte the ICRC does not cover


def _record_flips(fab: Fabric) -> list[int]:
    """Offsets of the bytes the fabric's ``corrupt`` fault flips, in order."""
    flips: list[int] = []
    flip = fab._flip_bit

    def recording(dg: Datagram) -> None:
        before = bytes(dg.data)
        flip(dg)
        flips.extend(i for i, (x, y) in enumerate(zip(before, bytes(dg.data), strict=True)) if x != y)

    fab._flip_bit = recording  # type: ignore[method-assign]
    return flips


OPS = ["send", "send_imm", "send_inv", "write", "write_imm", "read", "cas", "faa"]


@settings(max_examples=examples(12), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    ops=st.lists(st.tuples(st.sampled_from(OPS),
                           st.one_of(st.integers(0, 5000), st.sampled_from([0, 4096, MiB])),
                           st.booleans()), min_size=1, max_size=8),
    seed=st.integers(0, 10_000),
    drop=st.floats(0, 0.1), dup=st.floats(0, 0.2), reorder=st.floats(0, 0.2),
    corrupt=st.floats(0, 0.1),  # with drop: 0-20% of packets lost
)
# a random-seed run found it: the one corrupted bit was in BTH resv8a, which the ICRC masks
@example(ops=[("send", 0, False)], seed=78, drop=0.0625, dup=0.125, reorder=0.125, corrupt=0.0625)
def test_random_ops_over_faulty_fabric(ops: list[tuple[str, int, bool]], seed: int, drop: float,
                                       dup: float, reorder: float, corrupt: float) -> None:
    roce_ver = roce_ver_of(seed)
    clock = VirtualClock()
    fab = Fabric(clock, seed=seed, drop=drop, duplicate=dup, reorder=reorder, corrupt=corrupt)
    flips = _record_flips(fab)
    abuf, bbuf = bytearray((3 + len(ops)) * MiB), bytearray(4 * MiB)
    a = Side(v.Context(fabric=fab.link("10.8.0.1", roce_ver=roce_ver)), RC, abuf)
    b = Side(v.Context(fabric=fab.link("10.8.0.2", roce_ver=roce_ver)), RC, bbuf)
    try:
        # MTU 4096 and the most retries the spec allows (3-bit counters = 7), so that 20%
        # loss on a 256-packet message does not exhaust them
        connect(a, b, mtu=int(e.IBV_MTU_4096), retry_cnt=7, rnr_retry=7)
        src = bytes((i * 13 + seed) & 0xFF for i in range(251)) * (MiB // 251 + 1)
        a.buf[:MiB] = src[:MiB]
        target = bytearray(MiB)  # model of b's [MiB, 2 MiB)
        struct.pack_into("=Q", bbuf, 3 * MiB, 5)
        counter = 5
        expect_recv: list[tuple[int, int]] = []
        reads: list[tuple[int, bytes]] = []
        atomics: list[tuple[int, int]] = []
        signaled_ids = []
        spares: list[v.MR] = []
        for i, (kind, size, signaled) in enumerate(ops):
            flags = int(e.IBV_SEND_SIGNALED) if signaled else 0
            if kind in ("send", "send_imm", "send_inv", "write_imm"):
                b.qp.post_recv(v.RecvWR(100 + i, 1, [b.sge(2 * MiB, MiB)]))
                expect_recv.append((100 + i, size))
            if kind.startswith("send"):
                op = {"send": W.IBV_WR_SEND, "send_imm": W.IBV_WR_SEND_WITH_IMM,
                      "send_inv": W.IBV_WR_SEND_WITH_INV}[kind]
                w = v.SendWR(i, opcode=int(op), sg=[a.sge(0, size)] if size else [],
                             send_flags=flags)
                w.imm_data = i
                if kind == "send_inv":  # RoCE: only a type-2 window may be invalidated
                    spare = v.MR(b.pd, 64, int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_MW_BIND))
                    spares.append(spare)  # keep it registered until it is invalidated
                    w.invalidate_rkey = type2_window(b.ctx, b.pd, b.qp, spare)
            elif kind in ("write", "write_imm"):
                op = W.IBV_WR_RDMA_WRITE if kind == "write" else W.IBV_WR_RDMA_WRITE_WITH_IMM
                w = v.SendWR(i, opcode=int(op), sg=[a.sge(0, size)] if size else [],
                             send_flags=flags | int(e.IBV_SEND_FENCE))
                w.set_wr_rdma(b.mr.rkey, b.mr.addr + MiB)
                w.imm_data = i
                target[:size] = src[:size]
            elif kind == "read":
                dst = (3 + i) * MiB
                w = v.SendWR(i, opcode=int(W.IBV_WR_RDMA_READ),
                             sg=[a.sge(dst, size)] if size else [], send_flags=flags)
                w.set_wr_rdma(b.mr.rkey, b.mr.addr + MiB)
                reads.append((dst, bytes(target[:size])))
            else:
                off = 2 * MiB + 8 * i
                op = W.IBV_WR_ATOMIC_CMP_AND_SWP if kind == "cas" else W.IBV_WR_ATOMIC_FETCH_AND_ADD
                w = v.SendWR(i, opcode=int(op), sg=[a.sge(off, 8)], send_flags=flags)
                if kind == "cas":
                    w.set_wr_atomic(b.mr.rkey, b.mr.addr + 3 * MiB, counter, counter * 3)
                    atomics.append((off, counter))
                    counter *= 3
                else:
                    w.set_wr_atomic(b.mr.rkey, b.mr.addr + 3 * MiB, 7)
                    atomics.append((off, counter))
                    counter += 7
            if signaled:
                signaled_ids.append(i)
            a.qp.post_send(w)
        clock.run(max_events=5_000_000)
        n, wcs = a.cq.poll(64)
        assert [(wc.wr_id, wc.status) for wc in wcs] == [(i, 0) for i in signaled_ids]
        n, rwcs = b.cq.poll(64)
        assert [(wc.wr_id, wc.byte_len, wc.status) for wc in rwcs] == \
            [(wr_id, size, 0) for wr_id, size in expect_recv]
        assert bytes(b.buf[MiB:2 * MiB]) == bytes(target)
        for dst, data in reads:
            assert bytes(a.buf[dst:dst + len(data)]) == data
        for off, value in atomics:
            assert struct.unpack_from("=Q", abuf, off)[0] == value
        assert struct.unpack_from("=Q", bbuf, 3 * MiB)[0] == counter
        if corrupt:
            # a flipped bit is caught by the ICRC unless it hit BTH byte 4 (resv8a: FECN,
            # BECN and reserved bits, which the ICRC masks, IBA A17.8 / ../shared/specs/roce.md)
            assert all(off == _BTH_RESV8A for off in flips) or a.ctx.counters()["rcvd_icrc_err"] + \
                b.ctx.counters()["rcvd_icrc_err"] > 0
    finally:
        a.ctx.close()
        b.ctx.close()


@pytest.mark.iba("9.7.6.1.3")
def test_peer_disappears_gives_retry_exceeded() -> None:
    clock = VirtualClock()
    fab = Fabric(clock, seed=1)
    a = Side(v.Context(fabric=fab.link("10.8.1.1")), RC, bytearray(1 << 16))
    b = Side(v.Context(fabric=fab.link("10.8.1.2")), RC, bytearray(1 << 16))
    try:
        connect(a, b)
        fab.partition(bytes([10, 8, 1, 2]))
        w = v.SendWR(1, opcode=int(W.IBV_WR_RDMA_WRITE), sg=[a.sge(0, 100)])
        w.set_wr_rdma(b.mr.rkey, b.mr.addr)
        a.qp.post_send(w)
        a.qp.post_send(v.SendWR(2, opcode=int(W.IBV_WR_SEND), sg=[a.sge(0, 10)]))
        clock.run(max_events=100_000)
        n, wcs = a.cq.poll(8)
        assert [(wc.wr_id, wc.status) for wc in wcs] == [
            (1, e.IBV_WC_RETRY_EXC_ERR), (2, e.IBV_WC_WR_FLUSH_ERR)]
        assert a.qp.qp_state == e.IBV_QPS_ERR
        assert clock.now() < 60  # bounded: retry_cnt x local ACK timeout, not a hang
    finally:
        a.ctx.close()
        b.ctx.close()
