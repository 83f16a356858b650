"""The UD send fast path (``softrdma.ib.req_fast.emit_ud_run``, a run of UD SENDs posted
in one call, IPoIB's datagram mode) does exactly what ``Requester.pump`` does with each
WQE: the same packets byte for byte at the same times, PSNs, completions (unsignaled
ones none, errors always), counters and QP state, for SEND and SEND with immediate, SE,
pad, inline data, the QP's own Q_Key, and the WQEs it leaves to ``pump``: a local
protection or length error, a static rate, a QP not in RTS (IBA 9.8.2-9.8.3, 10.8.3,
9.11)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from harness.engine import Endpoint, Net, connect
from harness.property_budget import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softrdma import enums as e
from softrdma.ib import req_fast
from softrdma.ib.port import Port
from softrdma.ib.qp import AddressVector
from softrdma.seam.types import SGE, RecvWQE, SendWQE

SIG = int(e.IBV_SEND_SIGNALED)
SOLICITED = int(e.IBV_SEND_SOLICITED)
SEND, SEND_IMM = int(e.IBV_WR_SEND), int(e.IBV_WR_SEND_WITH_IMM)
SLOT = 8192
#: a WQE: (length: an int, or "mtu" / "mtu+1"; opcode; send flags; inline; the QP's own
#: Q_Key (the high bit); a bad L_Key; an address handle with a static rate)
Spec = tuple[Any, int, int, bool, bool, bool, bool]


@contextmanager
def fast(enabled: bool) -> Iterator[list[int]]:
    """``Port.fast_paths`` on or off; ``taken[0]`` counts the WQEs emit_ud_run sent."""
    taken = [0]
    real = req_fast.emit_ud_run

    def spy(qp: Any, sq: Any, idx: int, psn: int) -> tuple[int, int]:
        got = real(qp, sq, idx, psn)
        taken[0] += got[0] - idx
        return got

    saved = Port.fast_paths
    Port.fast_paths = enabled
    req_fast.emit_ud_run = spy
    try:
        yield taken
    finally:
        Port.fast_paths = saved
        req_fast.emit_ud_run = real


def run(specs: list[Spec], *, state: str = "rts", qp_rate: float = 0.0) -> dict[str, Any]:
    """Post ``specs`` from a to b in one call, run the network; everything observable."""
    trace: list[tuple[float, bytes]] = []
    net = Net()

    def record(data: bytes) -> bool:
        trace.append((net.now, data))
        return False

    net.drop_rule = record
    a = Endpoint(net.add_port(1), e.IBV_QPT_UD, size=len(specs) * SLOT + SLOT, max_wr=256)
    b = Endpoint(net.add_port(2), e.IBV_QPT_UD, size=len(specs) * SLOT + SLOT)
    connect(a, b)
    a.qp.rate_limit_bps = qp_rate
    if state == "sqd":
        a.qp.modify({"qp_state": int(e.IBV_QPS_SQD)}, 0.0)
    mtu = a.qp.mtu
    a.buf[:] = bytes((i * 13 + 5) & 0xFF for i in range(256)) * (len(a.buf) // 256)
    wqes = []
    for i, (size, opcode, flags, inline, own_qkey, bad_key, rated) in enumerate(specs):
        n = mtu if size == "mtu" else mtu + 1 if size == "mtu+1" else int(size)
        b.qp.post_recv(RecvWQE(100 + i, [SGE(b.mr.addr + i * SLOT, SLOT, b.mr.lkey)]))
        ah = AddressVector(b.port.gids[0], static_rate=int(e.IBV_RATE_10_GBPS) if rated else 0)
        qkey = 0x80000000 if own_qkey else 0x11111111
        if inline:
            wqes.append(SendWQE(i, opcode, flags, [], inline_data=bytes(a.buf[i * SLOT:i * SLOT + n]),
                                ah=ah, remote_qpn=b.qp.qpn, remote_qkey=qkey, imm_data=i * 7))
        else:
            key = a.mr.lkey ^ 0x5A5A if bad_key else a.mr.lkey
            wqes.append(SendWQE(i, opcode, flags, [SGE(a.mr.addr + i * SLOT, n, key)], ah=ah,
                                remote_qpn=b.qp.qpn, remote_qkey=qkey, imm_data=i * 7,
                                length=n))
    a.qp.post_sends(wqes, 0.0)
    net.run()
    wcs = [(w.wr_id, w.status, int(w.opcode), w.byte_len, w.imm_data, w.wc_flags, w.src_qp,
            w.solicited) for w in a.scq + b.rcq]
    return {"trace": trace, "b": hashlib.sha256(b.buf).digest(), "wcs": wcs,
            "counters": (a.port.counters.as_dict(), b.port.counters.as_dict(),
                         a.qp.counters.as_dict()),
            "states": (a.qp.state, b.qp.state), "psn": a.qp.req.next_psn,
            "sq": len(a.qp.req.sq), "now": net.now}


def both(specs: list[Spec], **kw: Any) -> int:
    """Run ``specs`` with the fast path off and on; assert the same; WQEs it took."""
    with fast(False) as off:
        slow = run(specs, **kw)
    assert off[0] == 0
    with fast(True) as taken:
        quick = run(specs, **kw)
    assert quick["trace"] == slow["trace"]  # the same packets, byte for byte, same times
    for key in ("b", "wcs", "counters", "states", "psn", "sq", "now"):
        assert quick[key] == slow[key], key
    return taken[0]


def plain(size: Any, opcode: int = SEND, flags: int = SIG) -> Spec:
    return (size, opcode, flags, False, False, False, False)


@pytest.mark.iba("9.8.2", "9.8.3", "10.8.3")
def test_a_run_of_sends_takes_the_fast_path() -> None:
    """SEND and SEND with immediate, signaled or not, SE, every pad, an empty message,
    the path MTU: all sent by the fast path, as pump sends them."""
    specs = [plain(100), plain(1, SEND_IMM, 0), plain(2, SEND, SIG | SOLICITED),
             plain(3, SEND_IMM, SIG | SOLICITED), plain(0), plain("mtu", SEND, 0),
             plain(64, SEND_IMM)]
    assert both(specs) == len(specs)


@pytest.mark.iba("9.3.2", "10.2.5")
def test_inline_data_and_the_qps_own_q_key() -> None:
    specs: list[Spec] = [(50, SEND, SIG, True, False, False, False),
                         (7, SEND_IMM, SIG, False, True, False, False),
                         (0, SEND, SIG, True, True, False, False)]
    assert both(specs) == 3


@pytest.mark.iba("10.8.3", "9.8.2")
@pytest.mark.parametrize("fault", ["bad_key", "too_long", "rated"])
def test_what_pump_must_decide_is_left_to_it(fault: str) -> None:
    """A bad L_Key (LOC_PROT_ERR), a message over the path MTU (LOC_LEN_ERR): pump fails
    it and the QP goes to SQE, flushing the rest; an address handle with a static rate:
    pump paces it. The WQEs before it took the fast path."""
    bad: Spec = (("mtu+1" if fault == "too_long" else 64), SEND, SIG, False, False,
                 fault == "bad_key", fault == "rated")
    specs = [plain(10), plain(20, SEND_IMM), bad, plain(30), plain(40)]
    assert both(specs) == 2


@pytest.mark.iba("9.11", "10.3.1")
@pytest.mark.parametrize("case", ["qp_rate", "sqd"])
def test_a_rate_limited_or_drained_qp_goes_the_general_way(case: str) -> None:
    specs = [plain(10), plain(20), plain(30)]
    kw: dict[str, Any] = {"qp_rate": 1e9} if case == "qp_rate" else {"state": "sqd"}
    assert both(specs, **kw) == 0


_spec = st.tuples(st.sampled_from([0, 1, 2, 3, 5, 64, 333, "mtu", "mtu+1"]),
                  st.sampled_from([SEND, SEND_IMM]),
                  st.sampled_from([0, SIG, SIG | SOLICITED, SOLICITED]),
                  st.booleans(), st.booleans(),
                  st.sampled_from([False] * 9 + [True]), st.sampled_from([False] * 9 + [True]))


@pytest.mark.iba("9.8.2", "9.8.3", "10.8.3")
@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_spec, min_size=1, max_size=24))
def test_any_run_is_the_general_path(specs: list[Spec]) -> None:
    both([(s[0] if not (s[3] and s[0] == "mtu+1") else "mtu", *s[1:]) for s in specs])
