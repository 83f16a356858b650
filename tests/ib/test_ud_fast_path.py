"""The UD SEND ONLY receive fast path (``Port.receive`` -> ``Responder.ud_only``, IPoIB's
datagram mode) does exactly what the general path does with each packet: the same
placement (the 40-byte GRH area, then the payload, IBA 11.4.1.1), completions and
counters, for good packets and for each header fault the general path drops or counts
(TVer, P_Key, Q_Key, pad, length, QP state, no or a small receive WQE; IBA 9.6, 10.2.5)."""

from __future__ import annotations

from typing import Any

import pytest
from harness.engine import Endpoint, Net, connect
from harness.fast_paths import fast_paths_counted
from harness.recording_link import RecordingLink

from softrdma import enums as e
from softrdma.drivers.links.link import Datagram
from softrdma.drivers.runtime.roce import Runtime
from softrdma.drivers.runtime.roce_rx import build_grh
from softrdma.ib.port import RxMeta
from softrdma.ib.qp import AddressVector
from softrdma.ib.responder import Responder
from softrdma.seam.types import SGE, RecvWQE, SendWQE
from softrdma.wire import roce

SIG = int(e.IBV_SEND_SIGNALED)
GRH = bytes(range(40))
FAULTS = ("none", "se", "nopad", "pad_only", "tver", "pkey", "limited_pkey", "qkey", "short", "headers_only",
          "too_long", "no_wqe", "small_wqe", "err_state", "imm", "gsi")


def _packet(length: int, opcode: Any = e.IBV_WR_SEND) -> tuple[bytearray, int]:
    """A UD SEND ONLY that A's engine sends to B's QP, and B's QPN."""
    net = Net()
    a = Endpoint(net.add_port(1), e.IBV_QPT_UD)
    b = Endpoint(net.add_port(2), e.IBV_QPT_UD)
    connect(a, b)
    a.buf[:length] = bytes((i * 7 + 1) & 0xFF for i in range(length))
    a.qp.post_send(SendWQE(1, int(opcode), SIG, [SGE(a.mr.addr, length, a.mr.lkey)],
                           ah=AddressVector(b.port.gids[0]), remote_qpn=b.qp.qpn,
                           remote_qkey=0x11111111, imm_data=0x77), 0.0)
    (tx,) = a.port.take_tx()
    return bytearray(b"".join(bytes(x) for x in tx.parts)), b.qp.qpn


def _deliver(fast: bool, fault: str) -> tuple[dict[str, Any], int]:
    """B's observable state after receiving the (faulted) packet; how often ud_only took one."""
    with fast_paths_counted(fast, Responder, "ud_only") as taken:
        pkt, _ = _packet(333, e.IBV_WR_SEND_WITH_IMM if fault == "imm" else e.IBV_WR_SEND)
        net = Net()
        b = Endpoint(net.add_port(2), e.IBV_QPT_UD)
        connect(b, Endpoint(net.add_port(3), e.IBV_QPT_UD))
        qpn = b.qp.qpn
        if fault == "gsi":
            qpn = 1
        pkt[5:8] = qpn.to_bytes(3, "big")
        if fault == "se":
            pkt[1] |= 0x80
        elif fault == "nopad":  # the sender's 3 pad octets (IBA 9.2) read as payload
            pkt[1] &= 0xCF
        elif fault == "tver":
            pkt[1] |= 0x01
        elif fault == "pkey":
            pkt[2:4] = b"\x80\x05"
        elif fault == "limited_pkey":  # a limited member of the QP's partition: accepted
            pkt[2] &= 0x7F
        elif fault == "qkey":
            pkt[12] ^= 0x01
        elif fault == "short":
            del pkt[17:]
        elif fault == "headers_only":  # no payload, no pad
            pkt[1] &= 0xCF
            del pkt[20:]
        elif fault == "pad_only":  # PadCnt 3, and 3 octets after the DETH
            del pkt[23:]
        elif fault == "too_long":
            pkt += bytes(4096)
        elif fault == "err_state":
            b.qp.modify({"qp_state": int(e.IBV_QPS_ERR)}, 0.0)
        if fault != "no_wqe":
            size = 100 if fault == "small_wqe" else 4096 + 40
            b.qp.post_recv(RecvWQE(9, [SGE(b.mr.addr + 8, size, b.mr.lkey)]))
        b.port.receive(memoryview(bytes(pkt)), RxMeta(bytes(16), b.port.gids[0], grh=GRH), 0.0)
        wcs = [(w.wr_id, w.status, int(w.opcode), w.byte_len, w.imm_data, w.wc_flags, w.src_qp,
                w.solicited, w.qp_num) for w in b.rcq]
        return {"wcs": wcs, "buf": bytes(b.buf[:8 + 4096 + 40 + 8]),
                "counters": b.port.counters.as_dict(), "qp": b.qp.counters.as_dict()
                if hasattr(b.qp.counters, "as_dict") else vars(b.qp.counters)}, taken[0]


@pytest.mark.iba("9.6", "10.2.5", "11.4.1.1")
@pytest.mark.parametrize("fault", FAULTS)
def test_same_as_the_general_path(fault: str) -> None:
    slow, none = _deliver(False, fault)
    quick, taken = _deliver(True, fault)
    assert none == 0
    assert quick == slow
    if fault in ("none", "se", "nopad", "pad_only", "limited_pkey", "qkey", "headers_only",
                 "too_long", "no_wqe", "small_wqe"):
        assert taken == 1, fault
    if fault in ("none", "se", "nopad", "limited_pkey"):  # the sender pads 333 to 336
        ((wr_id, status, _, byte_len, _, flags, _, solicited, _),) = slow["wcs"]
        assert (wr_id, status, byte_len) == (9, 0, 40 + (336 if fault == "nopad" else 333))
        assert flags & int(e.IBV_WC_GRH) and solicited == (fault == "se")
        assert slow["buf"][8:48] == GRH
        assert slow["buf"][48:48 + 333] == bytes((i * 7 + 1) & 0xFF for i in range(333))


class _V6Link(RecordingLink):
    @property
    def local_ips(self) -> tuple[bytes, ...]:
        return (B6,)


A6 = bytes.fromhex("fd880000000000000000000000000001")
B6 = bytes.fromhex("fd880000000000000000000000000002")


@pytest.mark.iba("11.4.1.1")
def test_ipv6_ud_grh_per_packet() -> None:
    """Through the RoCE runtime over IPv6, each UD receive's 40-byte GRH area is that
    packet's IPv6 header (payload length, traffic class, hop limit, addresses), whatever
    the packets before it of the same flow carried (the runtime reuses one RxMeta per
    flow, class, hop limit and length)."""
    pkt, _ = _packet(333)
    net = Net()
    b = Endpoint(net.add_port(2), e.IBV_QPT_UD)
    connect(b, Endpoint(net.add_port(3), e.IBV_QPT_UD))
    pkt[5:8] = b.qp.qpn.to_bytes(3, "big")
    short = bytearray(pkt[:20] + pkt[20:120])
    short[1] &= 0xCF  # 100 octets of payload, no pad
    rt = Runtime(b.port, _V6Link(), mode="manual")
    sent = []
    for i, (body, tos, ttl) in enumerate([(pkt, 0, 64), (short, 0, 64), (pkt, 0, 64),
                                          (pkt, 0x28, 64), (pkt, 0, 3), (short, 0, 64)]):
        data = bytes(body) + roce.udp_send_icrc(A6, B6, 50000, 4791, [bytes(body)])
        d = Datagram(memoryview(data), A6, B6, 50000, 4791, tos, ttl, b"", -1)
        sent.append(d)
        b.qp.post_recv(RecvWQE(i, [SGE(b.mr.addr + i * 8192, 8192, b.mr.lkey)]))
        rt.link.rx = [d]  # type: ignore[attr-defined]
        rt.progress()
    rt.close(close_link=False)
    assert [(w.wr_id, w.status) for w in b.rcq] == [(i, 0) for i in range(6)]
    for i, d in enumerate(sent):
        grh = bytes(b.buf[i * 8192:i * 8192 + 40])
        assert grh == build_grh(d), i
        assert grh[4:6] == (8 + len(d.data)).to_bytes(2, "big")
