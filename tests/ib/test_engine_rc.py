"""RC engine behaviour on a deterministic virtual network (IBA ch. 9 requester/responder)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from harness.engine import Endpoint, Net, connect

from softrdma import enums as e
from softrdma.seam.types import SGE, RecvWQE, SendWQE
from softrdma.wire import ib as wib

SIG = int(e.IBV_SEND_SIGNALED)


def pair(net: Net, **kw: object) -> tuple[Endpoint, Endpoint]:
    a = Endpoint(net.add_port(1))
    b = Endpoint(net.add_port(2))
    connect(a, b, **kw)  # type: ignore[arg-type]
    return a, b


def post_recv(ep: Endpoint, wr_id: int, off: int, length: int) -> None:
    ep.qp.post_recv(RecvWQE(wr_id, [SGE(ep.mr.addr + off, length, ep.mr.lkey)]))


def send(ep: Endpoint, wr_id: int, off: int, length: int, opcode: int = e.IBV_WR_SEND,
         now: float = 0.0, **kw: Any) -> SendWQE:
    w = SendWQE(wr_id, int(opcode), SIG, [SGE(ep.mr.addr + off, length, ep.mr.lkey)], **kw)
    ep.qp.post_send(w, now)
    return w


@pytest.mark.parametrize("size", [0, 1, 3, 1024, 1025, 4096, 100_000])
@pytest.mark.iba("9.2.1", "9.7.4.1.5")
def test_send_recv_sizes(size: int) -> None:
    net = Net()
    a, b = pair(net)
    a.buf[:size] = bytes((i * 7) & 0xFF for i in range(size))
    post_recv(b, 7, 0, 200_000)
    send(a, 1, 0, size)
    net.run()
    assert [w.status for w in a.scq] == [0]
    assert a.scq[0].opcode == e.IBV_WC_SEND
    assert len(b.rcq) == 1 and b.rcq[0].status == 0 and b.rcq[0].byte_len == size
    assert b.rcq[0].wr_id == 7 and b.rcq[0].opcode == e.IBV_WC_RECV
    assert b.buf[:size] == a.buf[:size]


@pytest.mark.iba("9.4.4", "9.7.4.1.4", "9.7.5.1.4")
def test_write_read_atomics() -> None:
    net = Net()
    a, b = pair(net)
    a.buf[0:5000] = b"x" * 5000
    send(a, 1, 0, 5000, e.IBV_WR_RDMA_WRITE, remote_addr=b.mr.addr + 100, rkey=b.mr.rkey)
    net.run()
    assert a.scq[-1].status == 0 and a.scq[-1].opcode == e.IBV_WC_RDMA_WRITE
    assert b.buf[100:5100] == b"x" * 5000 and not b.rcq
    b.buf[8000:9000] = bytes(range(250)) * 4
    send(a, 2, 20000, 1000, e.IBV_WR_RDMA_READ, remote_addr=b.mr.addr + 8000, rkey=b.mr.rkey)
    net.run()
    assert a.scq[-1].status == 0 and a.scq[-1].opcode == e.IBV_WC_RDMA_READ
    assert a.buf[20000:21000] == b.buf[8000:9000]
    struct.pack_into("=Q", b.buf, 64, 10)
    send(a, 3, 30000, 8, e.IBV_WR_ATOMIC_FETCH_AND_ADD, remote_addr=b.mr.addr + 64,
         rkey=b.mr.rkey, compare_add=5)
    net.run()
    assert a.scq[-1].opcode == e.IBV_WC_FETCH_ADD and a.scq[-1].status == 0
    assert struct.unpack_from("=Q", a.buf, 30000)[0] == 10
    assert struct.unpack_from("=Q", b.buf, 64)[0] == 15
    send(a, 4, 30008, 8, e.IBV_WR_ATOMIC_CMP_AND_SWP, remote_addr=b.mr.addr + 64,
         rkey=b.mr.rkey, compare_add=15, swap=99)
    net.run()
    assert a.scq[-1].opcode == e.IBV_WC_COMP_SWAP and a.scq[-1].status == 0
    assert struct.unpack_from("=Q", a.buf, 30008)[0] == 15
    assert struct.unpack_from("=Q", b.buf, 64)[0] == 99


@pytest.mark.iba("9.3.7", "9.4.1.2")
def test_write_with_imm_and_send_with_imm() -> None:
    net = Net()
    a, b = pair(net)
    post_recv(b, 1, 0, 64)
    post_recv(b, 2, 0, 64)
    a.buf[0:10] = b"0123456789"
    send(a, 1, 0, 10, e.IBV_WR_RDMA_WRITE_WITH_IMM, remote_addr=b.mr.addr + 500,
         rkey=b.mr.rkey, imm_data=0xDEADBEEF)
    send(a, 2, 0, 4, e.IBV_WR_SEND_WITH_IMM, imm_data=0x01020304)
    net.run()
    w1, w2 = b.rcq
    assert w1.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM and w1.imm_data == 0xDEADBEEF
    assert w1.byte_len == 10 and w1.wc_flags & e.IBV_WC_WITH_IMM
    assert w2.opcode == e.IBV_WC_RECV and w2.imm_data == 0x01020304 and w2.byte_len == 4
    assert b.buf[500:510] == b"0123456789"


@pytest.mark.iba("10.6.3.1", "9.7.5.2.3", "10.3.1.7")
def test_remote_access_error_and_flush() -> None:
    net = Net()
    a, b = pair(net)
    send(a, 1, 0, 10, e.IBV_WR_RDMA_WRITE, remote_addr=b.mr.addr, rkey=b.mr.rkey ^ 1)
    send(a, 2, 0, 10, e.IBV_WR_SEND)
    net.run()
    assert [(w.wr_id, w.status) for w in a.scq] == [
        (1, e.IBV_WC_REM_ACCESS_ERR), (2, e.IBV_WC_WR_FLUSH_ERR)]
    assert a.qp.state == e.IBV_QPS_ERR and b.qp.state == e.IBV_QPS_ERR


@pytest.mark.iba("10.6.3.1", "9.4.4")
def test_bounds_and_misaligned_atomic() -> None:
    net = Net()
    a, b = pair(net)
    send(a, 1, 0, 8, e.IBV_WR_ATOMIC_FETCH_AND_ADD, remote_addr=b.mr.addr + 4, rkey=b.mr.rkey)
    net.run()
    assert a.scq[0].status == e.IBV_WC_REM_INV_REQ_ERR
    net2 = Net()
    a, b = pair(net2)
    send(a, 1, 0, 100, e.IBV_WR_RDMA_READ, remote_addr=b.mr.addr + len(b.buf) - 50,
         rkey=b.mr.rkey)
    net2.run()
    assert a.scq[0].status == e.IBV_WC_REM_ACCESS_ERR


@pytest.mark.iba("9.7.5.2.8")
def test_rnr_then_success_and_rnr_retry_exceeded() -> None:
    net = Net()
    a, b = pair(net, rnr_retry=7)
    send(a, 1, 0, 100)
    net.run(until=0.01)
    assert not a.scq and net.ports[b.port.gids[0]].counters.send_rnr_nak > 0
    post_recv(b, 9, 0, 100)
    net.run()
    assert a.scq[0].status == 0 and b.rcq[0].wr_id == 9
    net2 = Net()
    a, b = pair(net2, rnr_retry=2)
    send(a, 1, 0, 100)
    net2.run()
    assert a.scq[0].status == e.IBV_WC_RNR_RETRY_EXC_ERR


@pytest.mark.iba("9.7.6.1.3")
def test_peer_disappears_retry_exceeded() -> None:
    net = Net()
    a, b = pair(net, retry_cnt=3, timeout=8)
    net.drop_rule = lambda data: True
    send(a, 1, 0, 100, e.IBV_WR_RDMA_WRITE, remote_addr=b.mr.addr, rkey=b.mr.rkey)
    send(a, 2, 0, 100, e.IBV_WR_RDMA_WRITE, remote_addr=b.mr.addr, rkey=b.mr.rkey)
    net.run()
    assert [(w.wr_id, w.status) for w in a.scq] == [
        (1, e.IBV_WC_RETRY_EXC_ERR), (2, e.IBV_WC_WR_FLUSH_ERR)]
    # 1 original + 3 retries (retry_cnt 3, not the default 7) of both WQEs' packets; each
    # timer period is between the Local ACK Timeout T (timeout 8: ~1 ms) and 4T (IBA
    # 9.7.6.1.3), adaptive: the first in [T, 2T), doubling up to 4T
    t = wib.ack_timeout_s(8)
    assert net.sent == 8
    assert 4 * t <= net.now <= 16 * t


@pytest.mark.iba("10.7.3.1")
def test_unsignaled_success_is_silent_but_error_is_reported() -> None:
    net = Net()
    a, b = pair(net)
    a.qp.post_send(SendWQE(1, int(e.IBV_WR_RDMA_WRITE), 0, [SGE(a.mr.addr, 10, a.mr.lkey)],
                           remote_addr=b.mr.addr, rkey=b.mr.rkey), 0.0)
    net.run()
    assert not a.scq
    a.qp.post_send(SendWQE(2, int(e.IBV_WR_RDMA_WRITE), 0, [SGE(a.mr.addr, 10, a.mr.lkey)],
                           remote_addr=b.mr.addr, rkey=0), 0.0)
    net.run()
    assert [(w.wr_id, w.status) for w in a.scq] == [(2, e.IBV_WC_REM_ACCESS_ERR)]


@pytest.mark.iba("10.6.3.1")
def test_local_protection_error() -> None:
    net = Net()
    a, b = pair(net)
    a.qp.post_send(SendWQE(1, int(e.IBV_WR_SEND), SIG, [SGE(a.mr.addr, 10, 0x1234)]), 0.0)
    net.run()
    assert a.scq[0].status == e.IBV_WC_LOC_PROT_ERR


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.iba("9.7.6.1", "9.7.5.1.3", "10.8.3.1")
def test_lossy_network_delivers_everything_in_order(seed: int) -> None:
    net = Net(seed=seed, drop=0.1, dup=0.05, reorder=0.1)
    a, b = pair(net, timeout=6)
    n = 40
    for i in range(n):
        post_recv(b, i, (i % 8) * 20000, 20000)
    for i in range(n):
        size = (i * 1237) % 9000
        a.buf[i * 10000:i * 10000 + size] = bytes([i]) * size
    for i in range(n):
        size = (i * 1237) % 9000
        if i % 3 == 0:
            send(a, i, i * 10000, size, e.IBV_WR_RDMA_WRITE,
                 remote_addr=b.mr.addr + 400_000 + i * 10000, rkey=b.mr.rkey)
        elif i % 3 == 1:
            send(a, i, i * 10000, size, e.IBV_WR_RDMA_READ,
                 remote_addr=b.mr.addr + 400_000 + (i - 1) * 10000, rkey=b.mr.rkey)
        else:
            send(a, i, i * 10000, size)
    net.run()
    assert [w.wr_id for w in a.scq] == list(range(n))
    assert all(w.status == 0 for w in a.scq), [w for w in a.scq if w.status]
    assert len(b.rcq) == n // 3
    for i in range(n):
        size = (i * 1237) % 9000
        if i % 3 == 0:
            assert b.buf[400_000 + i * 10000:][:size] == bytes([i]) * size
        if i % 3 == 1:
            prev = ((i - 1) * 1237) % 9000
            assert a.buf[i * 10000:i * 10000 + min(size, prev)] == bytes([i - 1]) * min(size, prev)


@pytest.mark.iba("9.7.5.1.4")
def test_duplicate_atomic_not_reexecuted() -> None:
    net = Net(seed=3)
    a, b = pair(net)
    struct.pack_into("=Q", b.buf, 0, 1)
    # drop the first ATOMIC_ACKNOWLEDGE so the requester retries the atomic
    dropped: list[int] = []

    def rule(data: bytes) -> bool:
        if data[0] == 0x12 and not dropped:
            dropped.append(1)
            return True
        return False

    net.drop_rule = rule
    send(a, 1, 0, 8, e.IBV_WR_ATOMIC_FETCH_AND_ADD, remote_addr=b.mr.addr, rkey=b.mr.rkey,
         compare_add=1)
    net.run()
    assert dropped and a.scq[0].status == 0
    assert struct.unpack_from("=Q", b.buf, 0)[0] == 2  # executed once
    assert struct.unpack_from("=Q", a.buf, 0)[0] == 1


@pytest.mark.iba("9.7.5.1.3", "9.7.5.2.2")
def test_psn_seq_nak_sent_once_and_counters() -> None:
    net = Net()
    a, b = pair(net)
    first: list[int] = []

    def rule(data: bytes) -> bool:
        pkt = wib.decode(memoryview(data))
        if pkt.opcode == 0x00 and not first:
            first.append(1)
            return True
        return False

    net.drop_rule = rule
    post_recv(b, 1, 0, 10000)
    send(a, 1, 0, 8000)
    net.run()
    assert a.scq[0].status == 0 and b.rcq[0].byte_len == 8000
    assert b.port.counters.sent_nak == 1


@pytest.mark.parametrize("room", [5000, 5120, 5119, 1000])
@pytest.mark.iba("9.7.4.1.5", "9.7.5.2.2")
def test_send_into_one_receive_buffer_fits_or_fails_at_its_edge(room: int) -> None:
    """A SEND of 5120 B (5 packets at MTU 1024) into a receive of one buffer of ``room``
    bytes (placed as a WRITE's region is): it fits exactly or with room to spare, the
    bytes beside the buffer untouched; one byte short, at the FIRST or at the LAST, it
    is an Invalid Request NAK (REM_INV_REQ at the requester) and the receive completes
    with a local length error (IBA 9.7.4.1.5, C9-95)."""
    net = Net()
    a, b = pair(net)
    a.buf[:5120] = bytes((i * 13) & 0xFF for i in range(5120))
    b.buf[:8192] = b"\xee" * 8192
    post_recv(b, 7, 100, room)
    send(a, 1, 0, 5120)
    net.run()
    if room >= 5120:
        assert [w.status for w in a.scq] == [0]
        assert [(w.wr_id, w.status, w.byte_len) for w in b.rcq] == [(7, 0, 5120)]
        assert b.buf[100:5220] == a.buf[:5120]
        assert b.buf[:100] == b"\xee" * 100 and b.buf[5220:8192] == b"\xee" * (8192 - 5220)
    else:
        assert [w.status for w in a.scq] == [e.IBV_WC_REM_INV_REQ_ERR]
        assert [(w.wr_id, w.status) for w in b.rcq][:1] == [(7, e.IBV_WC_LOC_LEN_ERR)]
        assert b.buf[100 + room:8192] == b"\xee" * (8192 - 100 - room)


@pytest.mark.iba("9.7.4.1.5")
def test_send_into_a_scatter_list_of_three() -> None:
    """The same SEND into a receive of three buffers (the scatter path): each holds its
    part, in order."""
    net = Net()
    a, b = pair(net)
    a.buf[:5120] = bytes((i * 13) & 0xFF for i in range(5120))
    sges = [SGE(b.mr.addr + 0, 1000, b.mr.lkey), SGE(b.mr.addr + 2000, 3000, b.mr.lkey),
            SGE(b.mr.addr + 6000, 2000, b.mr.lkey)]
    b.qp.post_recv(RecvWQE(7, sges))
    send(a, 1, 0, 5120)
    net.run()
    assert [w.status for w in a.scq] == [0] and b.rcq[0].byte_len == 5120
    assert b.buf[0:1000] + b.buf[2000:5000] + b.buf[6000:7120] == a.buf[:5120]
