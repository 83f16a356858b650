"""A random mix of RC operations over a faulty virtual network, checked exactly once.

(Moved from tests/ib/test_engine_property.py, which other test files imported.)"""

from __future__ import annotations

import struct

from harness.engine import Endpoint, Net, connect
from softrdma import enums as e
from softrdma.seam.types import SGE, RecvWQE, SendWQE

SIG = int(e.IBV_SEND_SIGNALED)


REGION = 1 << 20  # each side's MR is 4 MiB: [0,1M) source, [1M,2M) target, [2M,..) recv


def v1_of(seed: int) -> bool:
    """Annex A16 CA16-15: examples with an odd seed run between ports whose GIDs are RoCEv1
    ones (real GRHs in, v1 packets out), the others over RoCEv2, same draws and budget."""
    return bool(seed & 1)


#: packets a message may cost per packet it needs, per packet of go-back-N exposure (see
#: :func:`packet_budget`); measured worst over random fault mixes, with a wide margin
STORM_FACTOR = 4


def packet_budget(ops: list[tuple[str, int, bool]], mtu: int, faults: float) -> int:
    """The most packets (requests, responses, ACKs: both sides) the pair may send for ``ops``.

    A message of ``n`` packets needs ``n`` (plus an ACK or a request); go-back-N resends up to
    a window (at most 256 PSNs) per fault, and a fault hits a packet with probability
    ``faults`` (loss + duplication + reordering): about ``n * (1 + faults * window)``. A
    packet storm (issue 21: 49,099 READ requests, 7.8 M READ responses for 8 messages) is
    unbounded: it blows through any such budget in seconds instead of running for minutes."""
    payload = 128 << mtu
    need = sum(-(-size // payload) + 2 if size else 3 for _, size, _ in ops)
    return int(STORM_FACTOR * need * (1 + faults * min(need, 256))) + 1000


def run_mix(ops: list[tuple[str, int, bool]], seed: int, loss: float, dup: float,
            reorder: float, mtu: int) -> Net:
    """Post ``ops`` at once on an RC pair over a faulty net, run it idle, check the results.

    Go-back-N under reordering costs O(packets^2): at path MTU 256/512 a 1 MiB message is
    2048-4096 packets, so there messages are capped at 128 KiB to bound the test's time."""
    if mtu < 3:
        ops = [(k, min(sz, 128 * 1024), sig) for k, sz, sig in ops]
    net = Net(seed=seed, drop=loss, dup=dup, reorder=reorder, v1=v1_of(seed))
    net.max_sent = packet_budget(ops, mtu, loss + dup + reorder)
    net.max_drops_in_a_row = 4  # a live peer: fewer losses of one packet than retry_cnt 7
    size_mr = (4 + len(ops)) * REGION
    a = Endpoint(net.add_port(1), size=size_mr, max_wr=64)
    b = Endpoint(net.add_port(2), size=4 * REGION, max_wr=64)
    connect(a, b, mtu=mtu, timeout=4, retry_cnt=7, rd_atomic=8)
    pat_a = bytes((i * 31 + seed) & 0xFF for i in range(256)) * (REGION // 256)
    pat_b = bytes((i * 17 + 5) & 0xFF for i in range(256)) * (REGION // 256)
    a.buf[0:REGION] = pat_a
    b.buf[REGION:2 * REGION] = pat_b
    target = bytearray(pat_b)  # model of b's target region
    counter = 7
    struct.pack_into("=Q", b.buf, 3 * REGION, counter)
    expect_recv: list[tuple[int, str, int]] = []
    expect_read: list[tuple[int, int, bytes]] = []
    expect_atomic: list[tuple[int, int]] = []
    for i, (kind, size, signaled) in enumerate(ops):
        flags = SIG if signaled else 0
        sge = [SGE(a.mr.addr, size, a.mr.lkey)]
        if kind in ("send", "send_imm", "write_imm"):
            b.qp.post_recv(RecvWQE(1000 + i, [SGE(b.mr.addr + 2 * REGION, REGION, b.mr.lkey)]))
            expect_recv.append((1000 + i, kind, size))
        if kind == "send":
            w = SendWQE(i, int(e.IBV_WR_SEND), flags, sge)
        elif kind == "send_imm":
            w = SendWQE(i, int(e.IBV_WR_SEND_WITH_IMM), flags, sge, imm_data=i)
        elif kind in ("write", "write_imm"):
            op = e.IBV_WR_RDMA_WRITE if kind == "write" else e.IBV_WR_RDMA_WRITE_WITH_IMM
            # A retried READ re-reads responder memory (IBA 9.7.5.1.4), so a WRITE that must
            # not be seen by an earlier READ is fenced behind it (IBA 10.8.3.3).
            w = SendWQE(i, int(op), flags | int(e.IBV_SEND_FENCE), sge,
                        remote_addr=b.mr.addr + REGION, rkey=b.mr.rkey, imm_data=i)
            target[:size] = pat_a[:size]
        elif kind == "read":
            dst = (4 + i) * REGION
            w = SendWQE(i, int(e.IBV_WR_RDMA_READ), flags, [SGE(a.mr.addr + dst, size, a.mr.lkey)],
                        remote_addr=b.mr.addr + REGION, rkey=b.mr.rkey)
            expect_read.append((dst, size, bytes(target[:size])))
        elif kind == "faa":
            w = SendWQE(i, int(e.IBV_WR_ATOMIC_FETCH_AND_ADD), flags,
                        [SGE(a.mr.addr + 3 * REGION + 8 * i, 8, a.mr.lkey)],
                        remote_addr=b.mr.addr + 3 * REGION, rkey=b.mr.rkey, compare_add=3)
            expect_atomic.append((3 * REGION + 8 * i, counter))
            counter += 3
        else:
            w = SendWQE(i, int(e.IBV_WR_ATOMIC_CMP_AND_SWP), flags,
                        [SGE(a.mr.addr + 3 * REGION + 8 * i, 8, a.mr.lkey)],
                        remote_addr=b.mr.addr + 3 * REGION, rkey=b.mr.rkey,
                        compare_add=counter, swap=counter + 100)
            expect_atomic.append((3 * REGION + 8 * i, counter))
            counter += 100
        a.qp.post_send(w, 0.0)
    net.run()
    # every signaled WQE completed successfully, in order; the QPs stayed in RTS
    assert all(w.status == 0 for w in a.scq), [w for w in a.scq if w.status]
    assert [w.wr_id for w in a.scq] == [i for i, (_, _, s) in enumerate(ops) if s]
    assert a.qp.state == e.IBV_QPS_RTS and b.qp.state == e.IBV_QPS_RTS
    # receives: exactly once, in order, with the right length
    assert [w.wr_id for w in b.rcq] == [r[0] for r in expect_recv]
    for wc, (_, kind, size) in zip(b.rcq, expect_recv, strict=True):
        assert wc.status == 0 and wc.byte_len == size
        if kind == "write_imm":
            assert wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM
    if expect_recv and expect_recv[-1][1] != "write_imm":
        size = expect_recv[-1][2]
        assert b.buf[2 * REGION:2 * REGION + size] == pat_a[:size]
    # writes landed, reads saw exactly the writes posted before them (RC ordering)
    assert b.buf[REGION:2 * REGION] == target
    for dst, size, data in expect_read:
        assert a.buf[dst:dst + size] == data
    # atomics executed exactly once each, in order
    for off, value in expect_atomic:
        assert struct.unpack_from("=Q", a.buf, off)[0] == value
    assert struct.unpack_from("=Q", b.buf, 3 * REGION)[0] == counter
    return net
