"""The MPA initiator holds its first FPDU after the Reply (``FIRST_FPDU_HOLD_S``).

Linux siw's ``siw_accept`` sends the MPA Reply before it hands the socket to the QP; an
FPDU arriving in between stays unread and a siw server hangs (seen live in the lab with
``rping``). A raw TCP responder here times the gap between its Reply and the first FPDU
that softrdma, as the initiator, sends for a SEND posted at once.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm import iwconnect
from softrdma.errors import InvalidArgument
from softrdma.iwarp.mpa_setup import FIRST_FPDU_HOLD_S, MpaConfig

ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
REQ_KEY = b"MPA ID Req Frame"
REP_KEY = b"MPA ID Rep Frame"
MPA_HDR = 20  # key, flags, revision, PD length (RFC 5044 §7.1)


@pytest.fixture
def ctx() -> Iterator[v.Context]:
    c = v.Context(transport="iwarp")
    yield c
    c.close()


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        b = s.recv(n - len(out))
        if not b:
            raise ConnectionError("peer closed")
        out += b
    return bytes(out)


class RawResponder:
    """Accepts one connection, answers the MPA Request with a Reply made of the same
    parameters, and records when the Reply left and when the first FPDU arrived."""

    def __init__(self) -> None:
        self.lst = socket.socket()
        self.lst.bind(("127.0.0.1", 0))
        self.lst.listen(1)
        self.port = self.lst.getsockname()[1]
        self.got: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            s, _ = self.lst.accept()
            with s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hdr = _recv_exact(s, MPA_HDR)
                assert hdr[:16] == REQ_KEY
                pd = _recv_exact(s, int.from_bytes(hdr[18:20], "big"))
                # taken before the send: softrdma cannot see the Reply earlier than this,
                # so the measured gap is never shorter than the hold it applied
                self.got["reply_at"] = time.monotonic()
                s.sendall(REP_KEY + hdr[16:] + pd)
                first = s.recv(4096)
                self.got["fpdu_at"] = time.monotonic()
                self.got["fpdu"] = first
                time.sleep(0.2)
        except BaseException as exc:  # reported by the test
            self.got["err"] = exc
        finally:
            self.lst.close()


@pytest.mark.parametrize("hold", [FIRST_FPDU_HOLD_S, 0.3])
def test_initiator_holds_first_fpdu(ctx: v.Context, hold: float) -> None:
    pd = v.PD(ctx)
    cq = v.CQ(ctx, 8)
    qp = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4, 1, 1)))
    qp.to_init(v.QPAttr(qp_access_flags=ACC))
    mr = v.MR(pd, 64, ACC)
    peer = RawResponder()
    conn = iwconnect.connect(qp, "127.0.0.1", peer.port, b"", cfg=MpaConfig(first_fpdu_hold=hold))
    try:
        qp.post_send(v.SendWR(1, None, 1, [v.SGE(mr.addr, 16, mr.lkey)], e.IBV_WR_SEND,
                              int(e.IBV_SEND_SIGNALED)))
        peer.thread.join(10)
        assert "err" not in peer.got, peer.got.get("err")
        gap = peer.got["fpdu_at"] - peer.got["reply_at"]
        assert gap >= hold, f"first FPDU {gap * 1000:.1f} ms after the Reply, hold {hold} s"
        assert len(peer.got["fpdu"]) >= 2 + 18 + 16  # MPA length, DDP/RDMAP header, payload
    finally:
        conn.disconnect()


def test_hold_is_validated() -> None:
    with pytest.raises(InvalidArgument, match="first_fpdu_hold"):
        MpaConfig(first_fpdu_hold=-1)
    with pytest.raises(InvalidArgument, match="first_fpdu_hold"):
        MpaConfig(first_fpdu_hold=60)
    with pytest.raises(InvalidArgument, match="responder_hold"):
        MpaConfig(responder_hold=-0.1)
    with pytest.raises(InvalidArgument, match="responder_hold"):
        MpaConfig(responder_hold=True)
