"""devd answers an unlistened CM REQ with REJ only after checking it (issue 13 item 9): a
REQ with a bad ICRC or naming another sender gets nothing, and a flood from one source
gets at most REJ_BURST answers (plus the refill), never one REJ per REQ."""

from __future__ import annotations

import select
import socket
import struct
import time

import pytest
from harness.devd import LOCAL, Running, running, state, wait_for  # noqa: F401  (fixtures)
from harness.devd_cm import PEER, V4_MAPPED, cm_client, peer  # noqa: F401  (fixtures)

from softrdma.drivers.devd.cm_reject import REJ_BURST, REJ_PER_SECOND, RejLimiter
from softrdma.wire import cm as wcm
from softrdma.wire.roce import udp_send_icrc

_BTH_DETH = struct.Struct("!BBHIIII")


def _req(sock: socket.socket, dport: int, comm_id: int, *, bad_icrc: bool = False,
         local_gid: bytes | None = None, qkey: int = 0x80010000) -> None:
    src, dst = socket.inet_aton(PEER), socket.inet_aton(LOCAL)
    gid = local_gid if local_gid is not None else V4_MAPPED + src
    mad = wcm.encode(wcm.Req(local_comm_id=comm_id, service_id=0x0106000000004E20,
                             local_qpn=0x123, primary_local_gid=gid,
                             primary_remote_gid=V4_MAPPED + dst), tid=comm_id)
    hdr = _BTH_DETH.pack(0x64, 0, 0xFFFF, 1, 0, qkey, 1)
    icrc = udp_send_icrc(src, dst, sock.getsockname()[1], dport, [hdr, mad])
    if bad_icrc:
        icrc = bytes(b ^ 0x5A for b in icrc)
    sock.sendto(hdr + mad + icrc, (LOCAL, dport))


def _rejs(sock: socket.socket, quiet: float = 0.5) -> list[wcm.Rej]:
    out: list[wcm.Rej] = []
    while select.select([sock], [], [], quiet)[0]:
        data = sock.recv(4096)
        msg = wcm.decode(data[20:276]).msg
        assert isinstance(msg, wcm.Rej)
        out.append(msg)
    return out


@pytest.mark.iba("12.6.7")
def test_good_req_gets_rej_bad_icrc_and_forged_gid_get_nothing(
        running: Running, cm_client, peer: socket.socket) -> None:  # noqa: F811
    port = running.devd.udp_port
    _req(peer, port, 0x1001)
    rejs = _rejs(peer)
    assert [(r.remote_comm_id, r.reason) for r in rejs] == [
        (0x1001, wcm.RejReason.INVALID_SERVICE_ID)]
    _req(peer, port, 0x1002, bad_icrc=True)
    _req(peer, port, 0x1003, local_gid=V4_MAPPED + socket.inet_aton("10.9.9.9"))
    assert _rejs(peer) == []
    wait_for(lambda: running.devd.counters["cm_bad_req"] == 2)
    assert running.devd.counters["cm_rejected"] == 1


@pytest.mark.iba("10.2.4.1")
def test_req_with_another_q_key_gets_no_rej(
        running: Running, cm_client, peer: socket.socket) -> None:  # noqa: F811
    """Issue 21 item 9: QP1 takes only Q_Key 0x80010000 (IBA 13.5.1); devd's own REJ
    applies the same check as a listening process's QP1 (which drops such a REQ)."""
    port = running.devd.udp_port
    _req(peer, port, 0x1101, qkey=0x12345678)
    wait_for(lambda: running.devd.counters["cm_bad_req"] == 1)
    _req(peer, port, 0x1102)  # the same REQ with QP1's Q_Key is answered
    assert [r.remote_comm_id for r in _rejs(peer)] == [0x1102]
    assert running.devd.counters["cm_rejected"] == 1


def test_req_flood_gets_bounded_rejs(running: Running, cm_client, peer: socket.socket) -> None:  # noqa: F811
    port = running.devd.udp_port
    n = 200
    t0 = time.monotonic()
    for i in range(n):
        _req(peer, port, 0x2000 + i)
    rejs = _rejs(peer)
    took = time.monotonic() - t0
    assert REJ_BURST <= len(rejs) <= REJ_BURST + int(took * REJ_PER_SECOND) + 1
    wait_for(lambda: running.devd.counters["cm_rej_limited"] + running.devd.counters[
        "cm_rejected"] == n)


def test_limiter_refills_per_source() -> None:
    lim = RejLimiter(burst=8, rate=8.0)
    a, b = b"\x7f\0\0\1", b"\x7f\0\0\2"
    assert [lim.allow(a, 0.0) for _ in range(10)] == [True] * 8 + [False] * 2
    assert lim.allow(b, 0.0)  # another source has its own budget
    assert not lim.allow(a, 0.1) and lim.allow(a, 0.25)  # 8/s: one more after 1/8 s
