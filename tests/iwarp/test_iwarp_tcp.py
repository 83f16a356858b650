"""iWARP through the verbs API over TCP on the loopback (softrdma.drivers.runtime.tcp / softrdma.drivers.cm.iwconnect).

Same application code as for RoCE (PD, MR, CQ, QP, post_send, poll) on a Context opened
with transport="iwarp"; QPs connected with softrdma.iwconnect.connect / listen. Covers every
RDMAP operation up to 16 MiB with CRC, markers, MPA v1; a raw TCP peer that violates the
protocol gets its Terminate then a FIN, and the QP errors out with flushes; a peer that
closes mid-message or sends garbage leaves no hung QP and no open socket; reject;
rc-pingpong --transport iwarp.
"""

from __future__ import annotations

import io
import random
import socket
import struct
import threading
import time
from typing import Any

import pytest
from harness import ports
from harness.iwarp_tcp import (
    ACC,
    MB,
    Ep,
    connect,
    ctx,  # noqa: F401  (fixtures)
)

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm import iwconnect
from softrdma.errors import InvalidArgument, NotSupported
from softrdma.iwarp.mpa_setup import MpaConfig
from softrdma.wire import ddp, mpa

OK = int(e.IBV_WC_SUCCESS)
FLUSH = int(e.IBV_WC_WR_FLUSH_ERR)
TCP_CLOSE = 7  # tcp_info.tcpi_state (include/net/tcp_states.h)


@pytest.mark.parametrize("mode", ["plain", "crc", "markers", "v1"])
def test_every_operation_over_tcp(ctx: v.Context, mode: str) -> None:  # noqa: F811
    cfg = MpaConfig(crc=mode == "crc", markers=mode == "markers",
                    revision=1 if mode == "v1" else 2)
    a, b = Ep(ctx), Ep(ctx)
    conn_a, conn_b = connect(ctx, ctx, a, b, cfg, cfg)
    assert conn_a.private_data == b"server-pd" and conn_b.private_data == b"client-pd"
    assert a.qp.qp_state == b.qp.qp_state == e.IBV_QPS_RTS
    neg = conn_a.negotiated
    assert neg.crc == (mode == "crc") and neg.markers_tx == neg.markers_rx == (mode == "markers")
    rng = random.Random(7)
    sizes = [0, 1, 1500, 70000, MB // 2]
    inv_mr = v.MR(b.pd, 64, ACC)
    for size in sizes:
        data = rng.randbytes(size)
        a.mr.write(data, size)
        b.recv(MB, wr_id=10)
        b.recv(MB, wr_id=11)
        a.send(e.IBV_WR_SEND, size, 1)
        a.send(e.IBV_WR_SEND, size, 2, flags=int(e.IBV_SEND_SIGNALED | e.IBV_SEND_SOLICITED))
        a.send(e.IBV_WR_RDMA_WRITE, size, 3, remote=b, roff=MB // 2 - size // 2)
        a.send(e.IBV_WR_RDMA_READ, size, 4, remote=b, roff=MB // 2 - size // 2, loff=MB // 2)
        wa, wb = a.wait(4), b.wait(2)
        assert [(w.wr_id, w.status, w.byte_len) for w in wa] == \
            [(1, OK, size), (2, OK, size), (3, OK, size), (4, OK, size)]
        assert [(w.wr_id, w.status, w.byte_len) for w in wb] == [(10, OK, size), (11, OK, size)]
        assert a.mr.read(size, MB // 2) == data
    b.recv(64, wr_id=12)
    a.send(e.IBV_WR_SEND_WITH_INV, 4, 5, inv=inv_mr.rkey)
    assert [(w.wr_id, w.status) for w in a.wait(1)] == [(5, OK)]
    wc = b.wait(1)[0]
    assert wc.wc_flags & e.IBV_WC_WITH_INV and wc.invalidated_rkey == inv_mr.rkey
    # disconnect: the peer sees the FIN, both QPs end in ERR with their receives flushed
    b.recv(64, wr_id=13)
    conn_a.disconnect()
    assert [(w.wr_id, w.status) for w in b.wait(1)] == [(13, FLUSH)]
    assert a.qp.qp_state == b.qp.qp_state == e.IBV_QPS_ERR


@pytest.mark.parametrize("op", [e.IBV_WR_RDMA_WRITE, e.IBV_WR_RDMA_READ, e.IBV_WR_SEND])
def test_16mib_two_contexts(op: int) -> None:
    size = 16 * MB
    ca, cb = v.Context(transport="iwarp"), v.Context(transport="iwarp")
    try:
        a, b = Ep(ca, size), Ep(cb, size)
        connect(ca, cb, a, b, MpaConfig(crc=True))
        data = random.Random(3).randbytes(size)
        (b.mr if op == e.IBV_WR_RDMA_READ else a.mr).write(data, size)
        b.recv(size, 9)
        a.send(op, size, 1, remote=b)
        if op == e.IBV_WR_RDMA_WRITE:  # a later Send is delivered after the Write is placed
            a.send(e.IBV_WR_SEND, 0, 2)
        want = [(1, OK)] if op == e.IBV_WR_RDMA_READ else [(1, OK), (2, OK)]
        if op == e.IBV_WR_SEND:
            want = [(1, OK)]
        assert [(w.wr_id, w.status) for w in a.wait(len(want), 60)] == want
        if op != e.IBV_WR_RDMA_READ:
            assert [(w.wr_id, w.byte_len) for w in b.wait(1, 60)] == \
                [(9, size if op == e.IBV_WR_SEND else 0)]
        assert bytes(a.mr.buf) == bytes(b.mr.buf) == data
    finally:
        ca.close()
        cb.close()


def test_reject_and_refused(ctx: v.Context) -> None:  # noqa: F811
    a, b = Ep(ctx), Ep(ctx)
    lst = iwconnect.listen(ctx, 0)

    def serve() -> None:
        req = lst.get_request(10)
        assert req.private_data == b"let me in"
        req.reject(b"go away")

    t = threading.Thread(target=serve)
    t.start()
    with pytest.raises(iwconnect.ConnectionRejected) as ei:
        iwconnect.connect(a.qp, "127.0.0.1", lst.port, b"let me in")
    t.join(10)
    assert ei.value.private_data == b"go away"
    assert a.qp.qp_state == e.IBV_QPS_ERR
    port = lst.port
    lst.close()
    with pytest.raises(iwconnect.ConnectError):  # nobody listens any more: refused
        iwconnect.connect(b.qp, "127.0.0.1", port, timeout=2)


def test_iwarp_qp_rules(ctx: v.Context) -> None:  # noqa: F811
    pd = v.PD(ctx)
    cq = v.CQ(ctx, 4)
    with pytest.raises(NotSupported, match="RC"):
        v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq))
    qp = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq))
    qp.to_init(v.QPAttr())
    with pytest.raises(InvalidArgument):
        qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTR), e.IBV_QP_STATE)
    mr = v.MR(pd, 64, ACC)
    assert mr.lkey == mr.rkey
    wr = v.SendWR(1, None, 1, [v.SGE(mr.addr, 8, mr.lkey)], e.IBV_WR_SEND_WITH_IMM)
    with pytest.raises(InvalidArgument, match="iWARP"):
        qp.post_send(wr)
    assert ctx.query_device().atomic_caps == 0


# --- a raw TCP peer --------------------------------------------------------------------------


class RawClient:
    """A TCP client speaking MPA/DDP bytes by hand."""

    def __init__(self, port: int, crc: bool = False) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.crc = crc

    def handshake(self) -> mpa.MpaReply:
        self.sock.sendall(mpa.MpaRequest.build(v2=mpa.MpaV2Params(4, 4), crc=self.crc).encode())
        p = mpa.MpaFrameParser(mpa.MpaReply)
        while (frame := p.feed(self.sock.recv(1))) is None:
            pass
        assert isinstance(frame, mpa.MpaReply)
        self.enc = mpa.FpduEncoder(crc=self.crc or frame.crc, markers=frame.markers)
        return frame

    def fpdu(self, ulpdu: bytes) -> bytes:
        return b"".join(bytes(x) for x in self.enc.encode([ulpdu]))

    def read_all(self) -> bytes:
        out = bytearray()
        while chunk := self.sock.recv(65536):
            out += chunk
        return bytes(out)


def _accept_raw(ctx: v.Context, b: Ep, lst: iwconnect.Listener, got: dict[str, Any]) -> threading.Thread:  # noqa: F811
    def serve() -> None:
        try:
            got["conn"] = lst.accept(b.qp, timeout=10)
        except BaseException as exc:
            got["err"] = exc

    t = threading.Thread(target=serve)
    t.start()
    return t


def _raw_peer(ctx: v.Context, b: Ep, cfg: MpaConfig | None = None,  # noqa: F811
              crc: bool = False) -> tuple[iwconnect.Listener, RawClient, dict[str, Any]]:
    """A listener, a raw TCP peer that connected and did the MPA exchange, and what the
    accept of ``b``'s QP gave (``got["conn"]``)."""
    lst = iwconnect.listen(ctx, 0, cfg=cfg)
    got: dict[str, Any] = {}
    t = _accept_raw(ctx, b, lst, got)
    peer = RawClient(lst.port, crc)
    peer.handshake()
    t.join(10)
    return lst, peer, got


@pytest.mark.parametrize("crc", [False, True])
def test_raw_peer_gets_terminate_then_fin(ctx: v.Context, crc: bool) -> None:  # noqa: F811
    b = Ep(ctx)
    b.recv(100, 1)
    b.recv(100, 2)
    lst, peer, got = _raw_peer(ctx, b, None, crc)
    bad = ddp.encode_segment_bytes(ddp.Segment(ddp.DdpTagged(0, 0x00ABCD01, 0x1000), b"x" * 33))
    peer.sock.sendall(peer.fpdu(bad))
    rest = peer.read_all()  # ends with the FIN: the connection is closed by softrdma
    segs = [ddp.decode_segment(f.ulpdu) for f in
            mpa.FpduDeframer(crc=crc, markers=False).feed(rest)]
    assert len(segs) == 1 and segs[0].terminate is not None
    t_ = segs[0].terminate
    assert (t_.layer, t_.etype, t_.code, t_.m, t_.d, t_.r) == (1, 1, 0, True, True, False)
    assert t_.ddp_hdr == bad[:14] and t_.ddp_seg_len == 33
    assert [(w.wr_id, w.status) for w in b.wait(2)] == [(1, FLUSH), (2, FLUSH)]
    assert b.qp.qp_state == e.IBV_QPS_ERR
    peer.sock.close()
    _sockets_drain(ctx)
    lst.close()


@pytest.mark.parametrize("cut", [1, 10, 30])
def test_raw_peer_closes_mid_message(ctx: v.Context, cut: int) -> None:  # noqa: F811
    b = Ep(ctx)
    b.recv(4096, 1)
    b.recv(4096, 2)
    lst, peer, got = _raw_peer(ctx, b)
    seg = ddp.encode_segment_bytes(ddp.Segment(ddp.DdpUntagged(3, 0, 1, 0, False), b"y" * 100))
    peer.sock.sendall(peer.fpdu(seg)[:cut])
    peer.sock.close()
    assert sorted((w.wr_id, w.status) for w in b.wait(2)) == [(1, FLUSH), (2, FLUSH)]
    assert b.qp.qp_state == e.IBV_QPS_ERR
    _sockets_drain(ctx)
    lst.close()


def test_data_before_a_reset_is_delivered_though_a_send_failed(
        ctx: v.Context, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A peer sends two messages, then resets the connection (siw closes so when its
    socket holds bytes it did not read). Our next send fails on the dead socket before
    the runtime read those messages: they still complete, in order and whole, and only
    then is the QP flushed (rstream over siw hung when a send's failure dropped them)."""
    rt = ctx.runtime
    b = Ep(ctx)
    for i in (1, 2, 3):
        b.recv(4096, i)
    lst, peer, got = _raw_peer(ctx, b)
    assert got["conn"].connected
    idle = threading.Event()  # never set: the progress thread's waits time out
    rounds: list[float] = []

    def nothing_ready(wait: float) -> list[Any]:  # the runtime reads no socket from now on
        rounds.append(wait)
        idle.wait(min(wait, 0.05))
        return []

    monkeypatch.setattr(rt, "_ready", nothing_ready)
    deadline = time.monotonic() + 20
    while len(rounds) < 2:  # the progress thread left the wait it was in
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sock = next(iter(rt._socks.values())).sock  # type: ignore[attr-defined]
    data = [bytes([0x41 + m]) * (1000 + m) for m in (1, 2)]
    peer.sock.sendall(b"".join(peer.fpdu(ddp.encode_segment_bytes(ddp.Segment(
        ddp.DdpUntagged(3, 0, m, 0, True), data[m - 1]))) for m in (1, 2)))
    peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.sock.close()  # an RST
    deadline = time.monotonic() + 20
    while sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != TCP_CLOSE:
        assert time.monotonic() < deadline, "the reset did not arrive"
        time.sleep(0.01)
    b.send(e.IBV_WR_SEND, 8, 9)  # fails on the dead socket (ECONNRESET)
    wcs = b.wait(4)
    assert [(w.wr_id, w.status) for w in wcs[:2]] == [(1, OK), (2, OK)]
    assert [w.byte_len for w in wcs[:2]] == [len(d) for d in data]
    assert bytes(b.mr.read(len(data[1]), 0)) == data[1]  # the second landed over the first
    assert sorted((w.wr_id, w.status) for w in wcs[2:]) == [(3, FLUSH), (9, FLUSH)]
    assert b.qp.qp_state == e.IBV_QPS_ERR
    monkeypatch.undo()
    _sockets_drain(ctx)
    lst.close()


def _next_segment(peer: RawClient, timeout: float) -> ddp.Segment:
    """The next FPDU the raw peer receives, decoded."""
    peer.sock.settimeout(timeout)
    deframer = mpa.FpduDeframer(crc=False, markers=False)
    while True:
        chunk = peer.sock.recv(65536)
        assert chunk, "softrdma closed the connection"
        frames = deframer.feed(chunk)
        if frames:
            return ddp.decode_segment(frames[0].ulpdu)


def test_responder_holds_its_fpdus_until_the_initiators_first(ctx: v.Context) -> None:  # noqa: F811
    """RFC 5044 §7.1.2: a responder sends no FPDU before the initiator's first (without
    RFC 6581 RTR). Linux siw fails the connection otherwise when the FPDU is already in
    its socket as it reads the Reply (siw_recv_mpa_rr reads 4 octets past it: EPROTO);
    rstream's server, which sends at once, failed so against a siw client. A SEND posted
    right after accept waits for the initiator's SEND, not for the hold's end (10 s)."""
    b = Ep(ctx)
    b.recv(100, 1)
    lst, peer, got = _raw_peer(ctx, b, MpaConfig(responder_hold=10.0))
    assert got["conn"].connected
    b.send(e.IBV_WR_SEND, 8, 7)
    peer.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        peer.sock.recv(1)  # held: nothing before the initiator's first FPDU
    t0 = time.monotonic()
    peer.sock.sendall(peer.fpdu(ddp.encode_segment_bytes(ddp.Segment(
        ddp.DdpUntagged(3, 0, 1, 0, True), b"hello"))))
    seg = _next_segment(peer, 9)
    assert time.monotonic() - t0 < 9  # released by that FPDU, well before the 10 s hold
    assert isinstance(seg.ddp, ddp.DdpUntagged) and seg.ddp.msn == 1
    assert bytes(seg.payload) == bytes(b.mr.read(8, 0))
    wcs = {w.wr_id: w for w in b.wait(2)}
    assert (wcs[1].status, wcs[1].byte_len, wcs[7].status) == (OK, 5, OK)
    peer.sock.close()
    _sockets_drain(ctx)
    lst.close()


def test_responder_hold_ends_after_its_time(ctx: v.Context) -> None:  # noqa: F811
    """An initiator that never sends first (its application awaits ours) gets the
    responder's FPDU once the hold is over: a delay, not a hang."""
    b = Ep(ctx)
    t0 = time.monotonic()  # before the Request: the hold begins later, at accept
    lst, peer, _got = _raw_peer(ctx, b, MpaConfig(responder_hold=0.3))
    b.send(e.IBV_WR_SEND, 8, 7)
    seg = _next_segment(peer, 20)
    assert time.monotonic() - t0 >= 0.3
    assert isinstance(seg.ddp, ddp.DdpUntagged) and bytes(seg.payload) == bytes(8)
    assert [(w.wr_id, w.status) for w in b.wait(1)] == [(7, OK)]
    peer.sock.close()
    _sockets_drain(ctx)
    lst.close()


def test_raw_peer_stalled_inside_an_fpdu_is_terminated(ctx: v.Context) -> None:  # noqa: F811
    """Issue 21: an FPDU header announcing 64 KiB, then silence: after the stall limit
    (here 0.3 s) the peer gets a Terminate (LLP, "TCP connection lost") and a FIN and the
    receive WQEs are flushed, instead of the connection staying open forever."""
    ctx.runtime.fpdu_stall_s = 0.3  # type: ignore[attr-defined]
    b = Ep(ctx)
    b.recv(4096, 1)
    lst, peer, got = _raw_peer(ctx, b)
    peer.sock.sendall(b"\xff\xff\x41\x01\0")  # ULPDU_Length 65535 + 3 header octets
    rest = peer.read_all()  # the Terminate, then the FIN (a socket timeout: no answer)
    segs = [ddp.decode_segment(f.ulpdu) for f in
            mpa.FpduDeframer(crc=False, markers=False).feed(rest)]
    assert len(segs) == 1 and segs[0].terminate is not None
    assert (segs[0].terminate.layer, segs[0].terminate.code) == (2, 0x01)
    assert [(w.wr_id, w.status) for w in b.wait(1)] == [(1, FLUSH)]
    peer.sock.close()
    _sockets_drain(ctx)
    lst.close()


def test_listener_skips_garbage_peers(ctx: v.Context) -> None:  # noqa: F811
    a, b = Ep(ctx), Ep(ctx)
    lst = iwconnect.listen(ctx, 0)
    got: dict[str, Any] = {}
    t = _accept_raw(ctx, b, lst, got)
    junk = socket.create_connection(("127.0.0.1", lst.port))
    junk.sendall(b"GET / HTTP/1.0\r\n\r\n")
    reply = b""
    while chunk := junk.recv(4096):
        reply += chunk
    segs = [ddp.decode_segment(f.ulpdu) for f in mpa.FpduDeframer(crc=False, markers=False).feed(reply)]
    assert segs[0].terminate is not None and segs[0].terminate.code == 0x04  # LLP, bad frame
    junk.close()
    conn = iwconnect.connect(a.qp, "127.0.0.1", lst.port)
    t.join(10)
    assert conn.connected and got["conn"].connected
    lst.close()


def _sockets_drain(ctx: v.Context) -> None:  # noqa: F811
    rt = ctx.runtime
    end = time.monotonic() + 5
    while rt.sockets() and time.monotonic() < end:  # type: ignore[attr-defined]
        time.sleep(0.01)
    assert rt.sockets() == 0  # type: ignore[attr-defined]


# --- rc-pingpong ----------------------------------------------------------------------------------


def test_rc_pingpong_iwarp_loopback() -> None:
    from softrdma.tools.ibverbs import pingpong

    p = __import__("argparse").ArgumentParser()
    pingpong.add_arguments(p, "rc")
    args = p.parse_args(["--transport", "iwarp", "--loopback", "-n", "50", "-s", "3000", "-c"])
    out = io.StringIO()
    assert pingpong.run("rc", args, out) == 0
    text = out.getvalue()
    assert text.count("50 iters in") == 2 and text.count("remote address:") == 2


def test_rc_pingpong_iwarp_two_processes() -> None:
    import subprocess
    import sys

    port = ports.free_port()
    cmd = [sys.executable, "-m", "softrdma", "rc-pingpong", "--transport", "iwarp", "-p",
           str(port), "-n", "20", "-c", "--timeout", "20"]
    srv = subprocess.Popen(cmd + ["--bind", "127.0.0.1"], stdout=subprocess.PIPE, text=True)
    cli = subprocess.run(cmd + ["127.0.0.1"], capture_output=True, text=True, timeout=60)
    out, _ = srv.communicate(timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert srv.returncode == 0
    assert "20 iters in" in out and "20 iters in" in cli.stdout
    local = [ln for ln in out.splitlines() if "local address" in ln][0]
    remote = [ln for ln in cli.stdout.splitlines() if "remote address" in ln][0]
    assert local.split("QPN")[1] == remote.split("QPN")[1]  # the MPA private data carried it
