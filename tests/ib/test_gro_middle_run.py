"""The MIDDLE run path of a coalesced (UDP GRO) receive (drivers/runtime/roce.py ``_middle_run``,
ib/port.py ``receive_run``, ib/responder.py ``place_middles``) does exactly what the
general path does one packet at a time: the same placement, PSNs, counters, ACKs and NAKs
and completions, with corrupt, duplicated, dropped, reordered, foreign and ECN-marked
segments among them (IBA 9.7.1, 9.7.5; the ICRC of IBA 7.8.1 under the segment IDs a GSO
sender gives, Annex A17)."""

from __future__ import annotations

import hashlib
import itertools
import random
from typing import Any

import pytest
from harness.engine import Endpoint, Net, connect
from harness.fast_paths import fast_paths_counted
from harness.property_budget import examples
from harness.recording_link import RecordingLink
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softrdma import enums as e
from softrdma.drivers.links.link import Datagram
from softrdma.drivers.runtime.roce import Runtime
from softrdma.ib.port import Port
from softrdma.seam.types import SGE, RecvWQE, SendWQE
from softrdma.wire import roce

SIG = int(e.IBV_SEND_SIGNALED)
A_IP = bytes([10, 0, 0, 1])
B_IP = bytes([10, 0, 0, 2])
SPORT = 50123
DPORT = 4791
FAULTS = ("corrupt", "fecn", "dup", "drop", "swap", "pkey", "otherqp", "none")


def _sent_by_a(kind: str, size: int, mtu: int) -> tuple[Any, Any, list[bytes]]:
    net = Net()
    a = Endpoint(net.add_port(1, max_mtu=4096, key_alloc=itertools.count(0x100).__next__),
                 size=1 << 20)
    b = Endpoint(net.add_port(2, max_mtu=4096, key_alloc=itertools.count(0x200).__next__),
                 size=1 << 20)
    connect(a, b, mtu=mtu)
    a.buf[:] = bytes((i * 13 + 5) & 0xFF for i in range(256)) * (len(a.buf) // 256)
    sge = [SGE(a.mr.addr + 3, size, a.mr.lkey)]
    if kind == "send":
        b.qp.post_recv(RecvWQE(7, [SGE(b.mr.addr + 100, size, b.mr.lkey)]))
        w = SendWQE(1, int(e.IBV_WR_SEND), SIG, sge)
    else:
        op = e.IBV_WR_RDMA_WRITE_WITH_IMM if kind == "write_imm" else e.IBV_WR_RDMA_WRITE
        if kind == "write_imm":
            b.qp.post_recv(RecvWQE(8, []))
        w = SendWQE(1, int(op), SIG, sge, remote_addr=b.mr.addr + 64, rkey=b.mr.rkey,
                    imm_data=0x1234)
    a.qp.post_send(w, 0.0)
    bodies = [b"".join(bytes(x) for x in tx.parts) for tx in a.port.take_tx()]
    return a, b, bodies


def _datagram(body: bytes, ident: int, hint: int) -> Datagram:
    data = body + roce.udp_send_icrc(A_IP, B_IP, SPORT, DPORT, [body], ident=ident)
    return Datagram(memoryview(data), A_IP, B_IP, SPORT, DPORT, 0, 64, b"", hint)


def _apply(bodies: list[bytes], faults: list[tuple[int, str]], other_qpn: int) -> list[bytes]:
    out = list(bodies)
    for at, fault in faults:
        if not out:
            break
        i = at % len(out)
        x = bytearray(out[i])
        if fault == "fecn":  # BTH byte 4 is masked in the ICRC: still a good packet
            x[4] |= 0x80
        elif fault == "pkey":
            x[2] ^= 0x40
        elif fault == "otherqp":
            x[5:8] = other_qpn.to_bytes(3, "big")
        elif fault == "dup":
            out.insert(i, bytes(x))
        elif fault == "drop":
            del out[i]
            continue
        elif fault == "swap" and i + 1 < len(out):
            out[i], out[i + 1] = out[i + 1], out[i]
            continue
        out[i] = bytes(x)
    return out


def _run(enabled: bool, kind: str, size: int, mtu: int, faults: list[tuple[int, str]],
         batch: int, corrupt_at: set[int], id_base: int) -> tuple[dict[str, Any], int]:
    """Deliver A's packets to B's runtime in coalesced reads of ``batch`` segments;
    segment i of a read carries IPv4 ID ``id_base + i`` (``id_base`` != 0: the sequence
    of another sender, found by recovery) and hint i."""
    with fast_paths_counted(enabled, Port, "receive_run") as taken:
        a, b, bodies = _sent_by_a(kind, size, mtu)
        bodies = _apply(bodies, faults, a.qp.qpn)
        link = RecordingLink(local_ip=B_IP)  # B's side: sends recorded, receives given
        rt = Runtime(b.port, link, mode="manual")
        n = 0
        for start in range(0, len(bodies), batch):
            dgs = []
            for i, body in enumerate(bodies[start:start + batch]):
                d = _datagram(body, (id_base + i) & 0xFFFF, i)
                if n in corrupt_at:  # a bit of the payload flips after the ICRC
                    raw = bytearray(d.data)
                    raw[len(raw) // 2] ^= 0x10
                    d = Datagram(memoryview(bytes(raw)), A_IP, B_IP, SPORT, DPORT, 0, 64, b"", i)
                dgs.append(d)
                n += 1
            link.rx = dgs
            rt.progress()
        rt.progress()
        result = {
            "b": hashlib.sha256(b.buf).digest(),
            "counters": b.port.counters.as_dict(),
            "sent": link.singles + [(x[0], x[1], x[2]) for x in link.batches],
            "notes": link.notes,
            "epsn": b.qp.resp.epsn,
            "first_psn": int.from_bytes(bodies[0][9:12], "big") if bodies else -1,
            "state": b.qp.state,
            "wcs": [(w.wr_id, w.status, int(w.opcode), w.byte_len, w.imm_data) for w in b.rcq],
        }
        rt.close(close_link=False)
        return result, taken[0]


@pytest.mark.parametrize("kind", ["write", "write_imm", "send"])
@pytest.mark.parametrize("mtu", [1, 3, 5])
def test_clean_runs_take_every_middle(kind: str, mtu: int) -> None:
    size = 40 * (128 << mtu) + 77  # 41 packets: FIRST, 39 MIDDLE, a short LAST
    slow, none = _run(False, kind, size, mtu, [], 16, set(), 0)
    quick, taken = _run(True, kind, size, mtu, [], 16, set(), 0)
    assert none == 0
    assert quick == slow
    assert taken >= 36  # the MIDDLEs after the first of each read
    assert slow["counters"]["rcvd_icrc_err"] == 0
    assert slow["epsn"] == (slow["first_psn"] + 41) & 0xFFFFFF  # all in sequence
    assert slow["counters"]["rcvd_pkts"] == 41
    if kind != "write":  # a receive completion, with the whole message
        assert [(w[1], w[3]) for w in slow["wcs"]] == [(0, size)]


@pytest.mark.parametrize("mtu", [1, 5])
@pytest.mark.parametrize("pad", [0, 3])
def test_a_whole_send_is_one_run(mtu: int, pad: int) -> None:
    """A SEND's FIRST and LAST (with or without a pad) go with its MIDDLEs: every packet
    of a clean coalesced read is taken by the run path, and the result is the general
    path's."""
    size = 20 * (128 << mtu) + 4 * 9 + (4 - pad) % 4  # FIRST, 19 MIDDLEs, a short LAST
    for batch, id_base in ((64, 0), (8, 0), (64, 4000)):
        slow, _ = _run(False, "send", size, mtu, [], batch, set(), id_base)
        quick, taken = _run(True, "send", size, mtu, [], batch, set(), id_base)
        assert quick == slow
        assert slow["wcs"] == [(7, 0, int(e.IBV_WC_RECV), size, 0)]
        assert taken == 21, (batch, id_base)


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_inside_a_run(fault: str) -> None:
    faults = [(9, fault)]
    corrupt = {9} if fault == "corrupt" else set()
    for id_base in (0, 4000):
        slow, _ = _run(False, "write", 30 * 1024, 3, faults if fault != "corrupt" else [],
                       16, corrupt, id_base)
        quick, taken = _run(True, "write", 30 * 1024, 3, faults if fault != "corrupt" else [],
                            16, corrupt, id_base)
        assert quick == slow, (fault, id_base)
        assert taken > 0


@settings(max_examples=examples(25), deadline=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(["write", "write_imm", "send"]), mtu=st.integers(1, 5),
       npkts=st.integers(1, 70), batch=st.integers(1, 64),
       faults=st.lists(st.tuples(st.integers(0, 200), st.sampled_from(FAULTS)), max_size=4),
       corrupt=st.sets(st.integers(0, 80), max_size=3), id_base=st.sampled_from([0, 0, 77]),
       seed=st.integers(0, 1000))
def test_same_as_the_general_path(kind: str, mtu: int, npkts: int, batch: int,
                                  faults: list[tuple[int, str]], corrupt: set[int],
                                  id_base: int, seed: int) -> None:
    size = max(0, (npkts - 1) * (128 << mtu) + random.Random(seed).randint(1, 128 << mtu))
    slow, _ = _run(False, kind, size, mtu, faults, batch, corrupt, id_base)
    quick, _ = _run(True, kind, size, mtu, faults, batch, corrupt, id_base)
    assert quick == slow
