"""The UD run path of a coalesced (UDP GRO) receive over IPv6 (drivers/runtime/roce_rx.py
``_middle_run`` following a UD SEND ONLY, ib/port.py ``receive_ud_run``): a GSO sender's
UD SEND ONLYs (IPoIB's datagram mode) are checked and executed together, with exactly the
result of the general path one packet at a time: the same placement (GRH area, then the
payload, IBA 11.4.1.1), completions and counters, with corrupt, foreign, misaddressed and
malformed segments among them (the Q_Key of IBA 10.2.5, the P_Key of IBA 10.9.3, the ICRC of IBA 7.8.1)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from harness.engine import Endpoint, connect
from harness.fast_paths import fast_paths_counted
from harness.property_budget import examples
from harness.recording_link import RecordingLink
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softrdma import enums as e
from softrdma.drivers.links.link import Datagram
from softrdma.drivers.runtime.roce import Runtime
from softrdma.ib.av import AddressVector
from softrdma.ib.port import Port
from softrdma.seam.types import SGE, RecvWQE, SendWQE
from softrdma.wire import roce

A_IP = bytes.fromhex("fd000000000000000000000000000001")
B_IP = bytes.fromhex("fd000000000000000000000000000002")
SPORT = 50123
DPORT = 4791
QKEY = 0x11111111
GRH = 40
FAULTS = ("corrupt", "fecn", "pkey", "qkey", "otherqp", "short", "imm", "drop", "dup",
          "none")


def _sent_by_a(n: int, size: int) -> tuple[Endpoint, Endpoint, list[bytes]]:
    """``n`` UD SENDs of ``size`` bytes from A's UD QP to B's, which has ``n + 4``
    receives of GRH + ``size`` bytes posted; the packets A sent (BTH .. pad)."""
    a = Endpoint(Port([A_IP], max_mtu=4096), e.IBV_QPT_UD)
    b = Endpoint(Port([B_IP], max_mtu=4096), e.IBV_QPT_UD)
    connect(a, b)
    a.buf[:] = bytes((i * 13 + 5) & 0xFF for i in range(256)) * (len(a.buf) // 256)
    for i in range(n + 4):
        b.qp.post_recv(RecvWQE(100 + i, [SGE(b.mr.addr + i * (GRH + size), GRH + size,
                                             b.mr.lkey)]))
    for i in range(n):
        w = SendWQE(i, int(e.IBV_WR_SEND), 0, [SGE(a.mr.addr + 7 * i, size, a.mr.lkey)],
                    ah=AddressVector(B_IP), remote_qpn=b.qp.qpn, remote_qkey=QKEY)
        a.qp.post_send(w, 0.0)
    bodies = [b"".join(bytes(x) for x in tx.parts) for tx in a.port.take_tx()]
    assert len(bodies) == n
    return a, b, bodies


def _apply(bodies: list[bytes], faults: list[tuple[int, str]]) -> tuple[list[bytes], set[int]]:
    """The bodies with ``faults`` applied, and the indices whose ICRC is then broken."""
    out = list(bodies)
    corrupt: set[int] = set()
    for at, fault in faults:
        if not out:
            break
        i = at % len(out)
        x = bytearray(out[i])
        if len(x) < 24 and fault in ("short", "qkey", "imm"):
            continue  # BTH + DETH and 4 bytes needed (a packet shortened before)
        if fault == "corrupt":
            corrupt.add(i)
            continue
        if fault == "fecn":  # BTH byte 4 is masked in the ICRC: still a good packet
            x[4] |= 0x80
        elif fault == "pkey":
            x[2] ^= 0x40
        elif fault == "qkey":
            x[12] ^= 0x01  # DETH Q_Key (IBA 9.3.3)
        elif fault == "otherqp":
            x[5:8] = (0x123456).to_bytes(3, "big")
        elif fault == "short":  # a shorter SEND ONLY: it ends the run
            x = x[:len(x) - 4]
        elif fault == "imm":  # a UD SEND ONLY with immediate has another opcode
            n = len(x)
            x[0] = 0x65
            x[20:20] = b"\x01\x02\x03\x04"
            x = x[:n]
        elif fault == "dup":
            out.insert(i, bytes(x))
        elif fault == "drop":
            del out[i]
            continue
        out[i] = bytes(x)
    return out, corrupt


def _run(enabled: bool, n: int, size: int, faults: list[tuple[int, str]],
         batch: int) -> tuple[dict[str, Any], int]:
    """Deliver A's packets to B's runtime in coalesced reads of ``batch`` segments
    (hint i for segment i of a read), with the fast paths ``enabled`` or not."""
    with fast_paths_counted(enabled, Port, "receive_ud_run") as taken:
        _a, b, bodies = _sent_by_a(n, size)
        bodies, corrupt = _apply(bodies, faults)
        link = RecordingLink(local_ip=B_IP)
        rt = Runtime(b.port, link, mode="manual")
        for start in range(0, len(bodies), batch):
            dgs = []
            for i, body in enumerate(bodies[start:start + batch]):
                data = bytearray(body + roce.udp_send_icrc(A_IP, B_IP, SPORT, DPORT, [body]))
                if start + i in corrupt:  # a bit of the payload flips after the ICRC
                    data[len(data) // 2] ^= 0x10
                dgs.append(Datagram(memoryview(bytes(data)), A_IP, B_IP, SPORT, DPORT, 0, 64,
                                    b"", i))
            link.rx = dgs
            rt.progress()
        result = {
            "b": hashlib.sha256(b.buf).digest(),
            "counters": b.port.counters.as_dict(),
            "qp_counters": b.qp.counters.as_dict(),
            "wcs": [(w.wr_id, w.status, int(w.opcode), w.byte_len, w.src_qp, w.wc_flags)
                    for w in b.rcq],
        }
        rt.close(close_link=False)
        return result, taken[0]


@pytest.mark.parametrize("size", [64, 1000, 4096])
def test_a_clean_read_is_one_run(size: int) -> None:
    slow, none = _run(False, 15, size, [], 15)
    quick, taken = _run(True, 15, size, [], 15)
    assert none == 0 and quick == slow
    assert taken == 15  # the first of the read and the 14 behind it
    assert [w[0] for w in slow["wcs"]] == list(range(100, 115))
    assert all(w[1] == 0 and w[3] == GRH + size for w in slow["wcs"])
    assert slow["counters"]["rcvd_pkts"] == 15


#: the counter each fault raises by one (the general path's drop reasons)
COUNTED = {"corrupt": "rcvd_icrc_err", "fecn": "rcvd_fecn", "pkey": "rcvd_bad_pkey",
           "qkey": "rcvd_bad_qkey", "otherqp": "rcvd_unknown_qp"}


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_inside_a_run(fault: str) -> None:
    for at in (0, 6, 14):
        slow, _ = _run(False, 15, 512, [(at, fault)], 15)
        quick, taken = _run(True, 15, 512, [(at, fault)], 15)
        assert quick == slow, (fault, at)
        if fault in COUNTED:
            assert slow["counters"][COUNTED[fault]] == 1
        # every packet of the read but a faulty one (a wrong ICRC, P_Key, QP, length or
        # opcode), which the general path takes; the packets behind it make a new run
        # (a duplicate is a good UD packet; the 16th is a read of its own)
        assert taken == (15 if fault in ("none", "fecn", "qkey", "dup") else 14), (fault, at)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(1, 40), size=st.sampled_from([4, 100, 1024, 4092]),
       batch=st.integers(1, 20),
       faults=st.lists(st.tuples(st.integers(0, 60), st.sampled_from(FAULTS)), max_size=4))
def test_same_as_the_general_path(n: int, size: int, batch: int,
                                  faults: list[tuple[int, str]]) -> None:
    slow, _ = _run(False, n, size, faults, batch)
    quick, _ = _run(True, n, size, faults, batch)
    assert quick == slow
