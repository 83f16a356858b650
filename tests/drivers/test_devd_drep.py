"""devd answers a DREQ for a connection whose process has gone with DREP (Linux
``cm_issue_drep``): the peer's rdma_disconnect ends at once instead of after its DREQ
retries (perftest's ib_atomic_lat -R client waited 70 s for its server that had exited)."""

from __future__ import annotations

import select
import socket
import struct

import pytest
from harness.devd import LOCAL, Running, running, state, wait_for  # noqa: F401  (fixtures)
from harness.devd_cm import PEER, V4_MAPPED, cm_client, peer  # noqa: F401  (fixtures)

from softrdma.wire import cm as wcm
from softrdma.wire.roce import udp_send_icrc

_BTH_DETH = struct.Struct("!BBHIIII")
GONE_SLOT = 0x7E  # the top byte of a comm ID no client of the daemon holds


def _dreq(sock: socket.socket, dport: int, local: int, remote: int, *,
          bad_icrc: bool = False) -> None:
    src, dst = socket.inet_aton(PEER), socket.inet_aton(LOCAL)
    mad = wcm.encode(wcm.Dreq(local_comm_id=local, remote_comm_id=remote,
                              remote_qpn_eecn=0x123), tid=local)
    hdr = _BTH_DETH.pack(0x64, 0, 0xFFFF, 1, 0, 0x80010000, 1)
    icrc = udp_send_icrc(src, dst, sock.getsockname()[1], dport, [hdr, mad])
    if bad_icrc:
        icrc = bytes(b ^ 0x5A for b in icrc)
    sock.sendto(hdr + mad + icrc, (LOCAL, dport))


def _answers(sock: socket.socket, quiet: float = 0.5) -> list[wcm.CmMessage]:
    out: list[wcm.CmMessage] = []
    while select.select([sock], [], [], quiet)[0]:
        out.append(wcm.decode(sock.recv(4096)[20:276]).msg)
    return out


@pytest.mark.iba("12.6.11")
def test_dreq_of_a_gone_process_gets_drep(running: Running, cm_client,  # noqa: F811
                                          peer: socket.socket) -> None:  # noqa: F811
    port = running.devd.udp_port
    gone = (GONE_SLOT << 24) | 0x4242
    _dreq(peer, port, 0x1001, gone)
    answers = _answers(peer)
    assert len(answers) == 1 and isinstance(answers[0], wcm.Drep), answers
    assert (answers[0].local_comm_id, answers[0].remote_comm_id) == (gone, 0x1001)
    _dreq(peer, port, 0x1002, gone, bad_icrc=True)  # not from a real CM: no answer
    assert _answers(peer) == []
    wait_for(lambda: running.devd.counters["cm_bad_req"] == 1)
