"""The perftest out-of-band exchange, byte for byte against perftest 4.5 in the captures:
the codecs on the capture's payloads, our server answering the capture's client
(roce_read_bw.pcap replayed), our client against a server that answers with the
capture's messages, and the rdma_cm form (struct pingpong_dest in iwarp_send_bw.pcap)."""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.perftest import (
    CAPTURES,
    device_state,
    env_for,
    recv_exact,
    spawn,
    tcp_payloads,
)
from harness.ports import free_port
from harness.wait import wait_until

from softrdma.errors import DecodeError
from softrdma.tools.perftest import oob
from softrdma.tools.perftest.options import PerftestError

READ_BW = CAPTURES / "roce_read_bw.pcap"
SEND_BW = CAPTURES / "roce_send_bw.pcap"
IWARP_SEND_BW = CAPTURES / "iwarp_send_bw.pcap"
GID_11 = bytes(10) + b"\xff\xff" + bytes([10, 50, 0, 11])
GID_12 = bytes(10) + b"\xff\xff" + bytes([10, 50, 0, 12])
KEY_RE = re.compile(rb"^[0-9a-f]{4}:[0-9a-f]{4}:[0-9a-f]{6}:[0-9a-f]{6}:[0-9a-f]{8}:"
                    rb"[0-9a-f]{16}:(?:[0-9a-f]{2}:){16}[0-9a-f]{8}:\x00$")
DDP_UNTAGGED_HDR = 18  # DDP/RDMAP untagged header (RFC 5041 §5.2 + RFC 5040 §4.3)
MPA_LEN = 2


def _msgs(path: Path, side: str) -> list[bytes]:
    return [p for _f, s, p in tcp_payloads(path) if s == side]


# -- codecs against the capture ------------------------------------------------------------

def test_fixed_messages_match_capture() -> None:
    c = _msgs(READ_BW, "c")
    assert oob.encode_version() == c[0] == _msgs(READ_BW, "s")[0]
    assert oob.decode_version(c[0]) == "6.06"
    assert oob.SYS_INT.pack(4096) == c[1] and oob.SYS_INT.pack(64) == c[2]
    assert oob.encode_mtu(3) == c[3] and oob.decode_mtu(c[3]) == 3
    assert oob.DONE_MSG == c[-1]


def test_key_messages_match_capture() -> None:
    c, s = _msgs(READ_BW, "c"), _msgs(READ_BW, "s")
    client = oob.Dest(0, 0x80, 0x14, 0xBE0D36, 0x50A, 0x5585EAE09000, GID_12)
    server = oob.Dest(0, 0x80, 0x14, 0x236D00, 0x53F, 0x5564F2A76000, GID_11)
    assert oob.encode_key(client, True) == c[4]
    assert oob.encode_key(server, True) == s[4]
    assert oob.decode_key(c[4], True) == client
    # send_bw's keys: out reads 1, RKey 0
    send = oob.Dest(0, 1, 0x15, 0x860E4E, 0, 0x5586F1512000, GID_12)
    assert oob.encode_key(send, True) == _msgs(SEND_BW, "c")[4]
    assert len(oob.encode_key(send, False)) == oob.KEY_MSG_SIZE
    assert oob.decode_key(oob.encode_key(send, False), False) == \
        oob.Dest(0, 1, 0x15, 0x860E4E, 0, 0x5586F1512000)


def test_bw_report_messages_match_capture() -> None:
    c = _msgs(READ_BW, "c")
    rep = [m for m in c if len(m) == 8]
    assert [struct.unpack(">Q", m)[0] for m in rep[:2]] == [4096, 50]
    peak, avg, rate = (struct.unpack(">d", m)[0] for m in rep[2:5])
    assert (round(peak, 2), round(avg, 2), round(rate, 6)) == (0.14, 0.12, 0.003569)


def test_rdma_cm_dest_struct_matches_capture() -> None:
    """iwarp_send_bw.pcap: the control connection's SENDs carry struct pingpong_dest."""
    ctrl = [(s, p) for _f, s, p in tcp_payloads(IWARP_SEND_BW)]
    first_port_msgs = [p for s, p in ctrl if len(p) == 80 and s == "c"]
    ulpdu = first_port_msgs[2][MPA_LEN:MPA_LEN + struct.unpack(">H", first_port_msgs[2][:2])[0]]
    payload = ulpdu[DDP_UNTAGGED_HDR:]
    assert len(payload) == oob.DEST_STRUCT.size == 56
    d = oob.decode_dest_struct(payload)
    assert (d.lid, d.out_reads, d.qpn, d.psn) == (0, 1, 2, 0x7C0238)
    assert d.gid[:6] == bytes([0x52, 0x54, 0, 0, 0, 2])  # "82:84:00:00:00:02" in the log
    again = oob.encode_dest_struct(d)
    # equal but for the 4 padding bytes after RKey, which perftest leaves uninitialised
    assert again[:20] == payload[:20] and again[24:] == payload[24:]
    # the version, sys data and MTU messages travel as SENDs of 16, 4, 4 and 2 bytes
    sizes = [struct.unpack(">H", p[:2])[0] - DDP_UNTAGGED_HDR for s, p in ctrl[2:10:2]]
    assert sizes == [oob.MAX_VERSION, 4, 4, oob.MTU_MSG_LEN]


def test_malformed_messages_are_errors() -> None:
    with pytest.raises(DecodeError):
        oob.decode_key(b"0000:0080:000014\x00", True)
    with pytest.raises(DecodeError):
        oob.decode_key(b"zzzz:0080:000014:be0d36:0000050a:00005585eae09000:" + b"00:" * 16
                       + b"00000000:\x00", True)
    with pytest.raises(DecodeError):
        oob.decode_dest_struct(bytes(20))
    with pytest.raises(PerftestError, match="older than 5.70"):
        oob.decode_version(b"5.60".ljust(16, b"\x00"))
    with pytest.raises(PerftestError):
        oob.encode_key(oob.Dest(0, 0, 1 << 24, 0, 0, 0, GID_11), True)


# -- replaying the capture against our tools ----------------------------------------------

@pytest.fixture()
def state(tmp_path: Path) -> Iterator[Path]:
    yield from device_state(tmp_path)


def _same_shape(ours: bytes, theirs: bytes) -> bool:
    if len(ours) != len(theirs):
        return False
    if len(theirs) == oob.KEY_MSG_SIZE_GID:
        return bool(KEY_RE.match(ours))
    return True


def test_our_server_answers_captured_client(state: Path) -> None:
    """Play ib_read_bw's client side of roce_read_bw.pcap to ``softrdma read-bw``: every
    answer has the form of the captured server's, the fixed ones are equal, and the
    server prints the client's report as the captured server did."""
    c, s = _msgs(READ_BW, "c"), _msgs(READ_BW, "s")
    port = free_port()
    srv = spawn(["read-bw", "-d", "pttest", "-p", str(port), "-n", "50", "-s", "4096",
                 "--report_gbits", "--timeout", "20"], env_for(state))
    answers: list[bytes] = []
    try:
        def connect() -> socket.socket | None:
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=20)
            except ConnectionRefusedError:
                assert srv.poll() is None, "the server exited before it listened"
                return None
        # the server listens once it has started: on a busy machine that can take long
        sock = wait_until(connect, what="read-bw's server listening")
        with sock:
            for mine, theirs in zip(c, s, strict=True):
                sock.sendall(mine)
                answers.append(recv_exact(sock, len(theirs)))
        out, err = srv.communicate(timeout=30)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    assert srv.returncode == 0, err
    for ours, theirs in zip(answers, s, strict=True):
        assert _same_shape(ours, theirs), (ours, theirs)
    assert answers[:3] == s[:3]           # version, page size, cache line
    assert answers[3] == b"5\x00"         # our port's MTU (4096 on lo) ...
    assert " Mtu             : 1024[B]" in out  # ... and we use min(ours, the client's)
    assert answers[-1] == b"done\x00"
    key = oob.decode_key(answers[4], True)
    assert key.out_reads == 128 and key.gid == bytes(10) + b"\xff\xff\x7f\x00\x00\x01"
    log = (CAPTURES / "roce_read_bw.server.log").read_text().splitlines()
    assert log[-2] in out.splitlines()    # " 4096  50  0.14  0.12  0.003569"
    assert " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   " \
        "MsgRate[Mpps]" in out


def test_our_client_against_captured_server(state: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """``softrdma read-bw`` as the client of a server that answers with the captured
    ib_read_bw server's messages, except that its QP address is a real QP here (the
    client really RDMA READs from it): every client message has the captured client's
    form and order."""
    import argparse

    from softrdma import verbs as v
    from softrdma.tools.perftest import engine, options

    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(state))
    c, s = _msgs(READ_BW, "c"), _msgs(READ_BW, "s")
    ap = argparse.ArgumentParser()
    options.add_arguments(ap, "read-bw")
    o = options.from_args("read-bw", ap.parse_args(["-s", "4096", "-n", "50"]))
    ctx = v.Context("pttest")
    res = engine.Resources(ctx, o, 4096)
    res.add_qp()
    gids = [bytes(ctx.query_gid(1, i).raw) for i in range(ctx.query_port(1).gid_tbl_len)]
    gidx = next(i for i, g in enumerate(gids) if g[:12] == bytes(10) + b"\xff\xff")
    me = res.my_dest(0, 0, 0x236D00, 128, gids[gidx], gidx)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]
    got: list[bytes] = []
    errors: list[BaseException] = []

    def fake_server() -> None:
        try:
            conn, _ = lsock.accept()
            with conn:
                conn.settimeout(30)
                for n, (theirs, answer) in enumerate(zip(c, s, strict=True)):
                    msg = recv_exact(conn, len(theirs))
                    got.append(msg)
                    if len(answer) == oob.KEY_MSG_SIZE_GID:
                        if n == 4:
                            res.connect(0, me, oob.decode_key(msg, True), 3, gidx)
                        answer = oob.encode_key(me, True)
                    conn.sendall(answer)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    t = threading.Thread(target=fake_server, daemon=True)
    t.start()
    try:
        cli = subprocess.run(
            [sys.executable, "-m", "softrdma", "read-bw",
             "-d", "pttest", "-p", str(port), "-n", "50", "-s", "4096", "--report_gbits",
             "--timeout", "20", "127.0.0.1"],
            env=env_for(state), capture_output=True, text=True, timeout=60)
        t.join(30)
    finally:
        lsock.close()
        res.close()
        ctx.close()
    assert not errors, errors
    assert cli.returncode == 0, cli.stderr
    assert len(got) == len(c)
    for ours, theirs in zip(got, c, strict=True):
        assert _same_shape(ours, theirs), (ours, theirs)
    assert got[:3] == c[:3] and got[-1] == c[-1]
    reports = [m for m in got if len(m) == 8]
    assert [struct.unpack(">Q", m)[0] for m in reports[:2]] == [4096, 50]
    assert " 4096       50 " in cli.stdout


class _WC:
    def __init__(self, opcode: int, wr_id: int, byte_len: int = 0) -> None:
        self.status = 0
        self.opcode = opcode
        self.wr_id = wr_id
        self.byte_len = byte_len


class _FakeCQ:
    def __init__(self, batches: list[list[_WC]]) -> None:
        self.batches = batches

    def poll(self, n: int) -> tuple[int, list[_WC]]:
        batch = self.batches.pop(0) if self.batches else []
        return len(batch), batch


class _FakeQP:
    def __init__(self) -> None:
        self.recvs: list[object] = []
        self.sends: list[object] = []

    def post_recv(self, wr: object) -> None:
        self.recvs.append(wr)

    def post_send(self, wr: object) -> None:
        self.sends.append(wr)


class _FakeMR:
    addr = 0x10000
    lkey = 1


def test_control_channel_keeps_a_message_that_shares_a_batch_with_a_send() -> None:
    """A SEND completion and the peer's next message in one poll batch: the message is
    kept (found against ib_read_bw -R / ib_atomic_bw -R on rxe: it was dropped with the
    SEND completion, and both sides then waited for each other)."""
    from softrdma import enums as e
    from softrdma.tools.perftest import cmconn

    ch = cmconn.CmChannel.__new__(cmconn.CmChannel)
    ch.timeout = 2.0
    ch.buf = bytearray((cmconn.CTRL_RECVS + 1) * cmconn.CTRL_BUF)
    ch.mr = _FakeMR()  # type: ignore[assignment]
    ch.qp = _FakeQP()
    ch._rx = []
    ch._sent = 0
    msg = oob.encode_dest_struct(oob.Dest(0, 1, 0x12, 0x345, 6, 7, GID_11))
    ch.buf[2 * cmconn.CTRL_BUF:2 * cmconn.CTRL_BUF + len(msg)] = msg
    ch.cq = _FakeCQ([[_WC(int(e.IBV_WC_SEND), 5), _WC(int(e.IBV_WC_RECV), 2, len(msg))]])  # type: ignore[assignment]
    ch.write(b"x" * 56)
    assert ch.read(56) == msg
    # ... and a SEND completion that comes with a message is not lost either
    ch.cq = _FakeCQ([[_WC(int(e.IBV_WC_RECV), 0, 4), _WC(int(e.IBV_WC_SEND), 5)]])  # type: ignore[assignment]
    ch.buf[0:4] = b"\x00\x00\x10\x00"
    assert ch.read(4) == b"\x00\x00\x10\x00"
    ch.write(b"y" * 4)  # its completion was already taken: no wait
    assert len(ch.qp.recvs) == 2 and len(ch.qp.sends) == 2
