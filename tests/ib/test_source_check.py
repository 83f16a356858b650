"""Item 1: a connected RC/UC QP accepts packets only from its peer (IBA 9.6 header validation;
rxe ``check_addr``): a well-formed WRITE with a valid ICRC from another address is dropped
and counted under ``rcvd_bad_addr``, and the real peer's traffic is unaffected. Item 8: a
RoCE SEND_WITH_INVALIDATE may revoke only a type-2 memory window (rxe)."""

from __future__ import annotations

import socket
import time

import pytest
from harness.mw import type2_window
from harness.verbs_pair import _wait, udp_pair  # noqa: F401  (the fixture)

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.wire import ib as wib
from softrdma.wire import opcodes as op
from softrdma.wire import roce

FORGER = "127.0.0.3"


def _forged_write(b_qpn: int, psn: int, va: int, rkey: int, data: bytes, dport: int) -> None:
    """An RC RDMA WRITE ONLY with a correct ICRC, sent from ``FORGER``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((FORGER, 0))
        sport = s.getsockname()[1]
        hdr = wib.BTH.pack(op.RC_WRITE_ONLY, 0, 0xFFFF, b_qpn, 0x80000000 | psn) + \
            wib.RETH.pack(va, rkey, len(data))
        src = socket.inet_aton(FORGER)
        dst = socket.inet_aton("127.0.0.2")
        s.sendto(roce.udp_payload_with_icrc(src, dst, sport, dport, [hdr, data]),
                 ("127.0.0.2", dport))


@pytest.mark.iba("9.6", "9.6.1.5")
def test_write_from_a_stranger_is_dropped_and_the_peer_is_unaffected(udp_pair) -> None:  # noqa: F811
    a, b = udp_pair
    rcvd = b.ctx.counters()["rcvd_pkts"]
    _forged_write(b.qp.qp_num, 7, b.mr.addr + 4096, b.mr.rkey, b"FORGED!!", b.ctx.runtime.udp_port)
    end = time.monotonic() + 60
    while b.ctx.counters()["rcvd_pkts"] == rcvd and time.monotonic() < end:
        time.sleep(0.01)
    # the packet has been dealt with: counted as from a stranger
    end = time.monotonic() + 60
    while not b.ctx.counters().get("rcvd_bad_addr") and time.monotonic() < end:
        time.sleep(0.01)
    assert bytes(b.buf[4096:4104]) == bytes(8)  # not placed
    assert b.ctx.counters().get("rcvd_bad_addr") == 1
    # the forged packet consumed no PSN: the peer's SEND (PSN 7) is delivered
    a.buf[:5] = b"hello"
    b.qp.post_recv(v.RecvWR(1, 1, [b.sge(0, 64)]))
    a.qp.post_send(v.SendWR(2, sg=[a.sge(0, 5)]))
    assert _wait(a.cq)[0].status == 0
    r = _wait(b.cq)[0]
    assert r.status == 0 and r.byte_len == 5 and bytes(b.buf[:5]) == b"hello"


# ---- SEND_WITH_INVALIDATE on RoCE (issue 13 item 8) -------------------------------------------
def _send_inv(a, b, rkey: int) -> tuple[int, int]:
    b.qp.post_recv(v.RecvWR(7, 1, [b.sge(0, 64)]))
    w = v.SendWR(8, opcode=int(e.IBV_WR_SEND_WITH_INV), sg=[a.sge(0, 8)])
    w.invalidate_rkey = rkey
    a.qp.post_send(w)
    return _wait(a.cq)[0].status, _wait(b.cq)[0].status


@pytest.mark.iba("9.3.8", "10.6.7")
def test_send_with_invalidate_cannot_revoke_an_ordinary_mr(udp_pair) -> None:  # noqa: F811
    """rxe: a peer may invalidate only type-2 windows (and fast-registration MRs)."""
    a, b = udp_pair
    sa, sb = _send_inv(a, b, b.mr.rkey)
    assert sa == e.IBV_WC_REM_INV_REQ_ERR and sb == e.IBV_WC_REM_INV_REQ_ERR
    assert b.mr.engine_mr.valid  # the MR still works


@pytest.mark.iba("9.3.8", "10.6.7")
def test_send_with_invalidate_revokes_a_type2_window(udp_pair) -> None:  # noqa: F811
    a, b = udp_pair
    spare = v.MR(b.pd, 64, int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_MW_BIND))
    rkey = type2_window(b.ctx, b.pd, b.qp, spare)
    assert _send_inv(a, b, rkey) == (0, 0)
    assert not b.ctx.port.lookup_mr(rkey).valid
