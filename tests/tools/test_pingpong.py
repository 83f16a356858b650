"""rc/uc/ud-pingpong: the out-of-band exchange against fake C peers, output format, and
real runs (loopback in one process; server and client as two processes)."""

from __future__ import annotations

import io
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable

import pytest
from harness.device import reap
from harness.pingpong import (
    _env,
    _spawn,
    device,  # noqa: F401  (fixtures)
)
from harness.ports import free_port

from softrdma.errors import DecodeError, InvalidArgument
from softrdma.tools.cli import main
from softrdma.tools.ibverbs import pingpong as pp

# The TCP payloads of /work/shared/captures/roce_rc_pingpong.pcap (frames 4, 6, 8):
# ibv_rc_pingpong -g 1 between 10.50.0.12 (client) and 10.50.0.11 (server).
CAPTURE_CLIENT_MSG = bytes.fromhex(
    "303030303a3030303031313a6235666237383a3030303030303030303030303030303030303030"
    "66666666306133323030306300")
CAPTURE_SERVER_MSG = bytes.fromhex(
    "303030303a3030303031313a6634373437653a3030303030303030303030303030303030303030"
    "66666666306133323030306200")
CAPTURE_DONE = bytes.fromhex("646f6e6500")
GID_11 = bytes(10) + b"\xff\xff" + bytes([10, 50, 0, 11])
GID_12 = bytes(10) + b"\xff\xff" + bytes([10, 50, 0, 12])


# -- message codec --------------------------------------------------------------------

def test_encode_matches_capture() -> None:
    assert pp.encode_dest(pp.Dest(0, 0x11, 0xB5FB78, GID_12)) == CAPTURE_CLIENT_MSG
    assert pp.encode_dest(pp.Dest(0, 0x11, 0xF4747E, GID_11)) == CAPTURE_SERVER_MSG
    assert len(CAPTURE_CLIENT_MSG) == pp.MSG_LEN and CAPTURE_DONE == pp.DONE_MSG


def test_decode_capture_and_roundtrip() -> None:
    assert pp.decode_dest(CAPTURE_SERVER_MSG) == pp.Dest(0, 0x11, 0xF4747E, GID_11)
    d = pp.Dest(0xBEEF, 0xABCDEF, 0x123456, bytes(range(16)))
    assert pp.decode_dest(pp.encode_dest(d)) == d


@pytest.mark.parametrize("msg", [
    b"", b"garbage\x00", b"0000:000011:b5fb78\x00",
    b"0000:000011:b5fb78:00000000000000000000ffff0a32000\x00",   # 31 GID digits
    b"0000:00zz11:b5fb78:00000000000000000000ffff0a32000c\x00",
    b"10000:000011:b5fb78:00000000000000000000ffff0a32000c\x00",  # LID > 16 bits
    b"\xff\xfe:1:2:3\x00",
])
def test_decode_rejects_malformed(msg: bytes) -> None:
    with pytest.raises(DecodeError):
        pp.decode_dest(msg)


def test_encode_rejects_out_of_range() -> None:
    with pytest.raises(InvalidArgument):
        pp.encode_dest(pp.Dest(0, 1 << 24, 0, bytes(16)))
    with pytest.raises(InvalidArgument):
        pp.encode_dest(pp.Dest(0, 1, 0, bytes(15)))


# -- output format ----------------------------------------------------------------------

def test_address_lines_match_capture_logs() -> None:
    assert pp.address_line("local", pp.Dest(0, 0x11, 0xF4747E, GID_11), "rc") == \
        "  local address:  LID 0x0000, QPN 0x000011, PSN 0xf4747e, GID ::ffff:10.50.0.11"
    assert pp.address_line("remote", pp.Dest(0, 0x11, 0xB5FB78, GID_12), "rc") == \
        "  remote address: LID 0x0000, QPN 0x000011, PSN 0xb5fb78, GID ::ffff:10.50.0.12"
    # ud_pingpong's local line has "PSN ...: GID" (roce_ud_pingpong.server.log)
    assert pp.address_line("local", pp.Dest(0, 0x12, 0x997F26, GID_11), "ud") == \
        "  local address:  LID 0x0000, QPN 0x000012, PSN 0x997f26: GID ::ffff:10.50.0.11"
    assert pp.gid_text(bytes(16)) == "::"


def test_result_lines_match_capture_logs() -> None:
    # roce_rc_pingpong.server.log: 10 iters of 4096 bytes in 33142 usec
    assert pp.result_lines(4096, 10, 33142.0) == [
        "81920 bytes in 0.03 seconds = 19.77 Mbit/sec",
        "10 iters in 0.03 seconds = 3314.20 usec/iter"]


def test_check_pattern_is_rc_pingpong_chk_buffer() -> None:
    pat = pp.check_pattern(3 * pp.PAGE_SIZE + 5)
    assert len(pat) == 3 * pp.PAGE_SIZE + 5
    assert [i for i, b in enumerate(pat) if b != 0x7B] == [0, pp.PAGE_SIZE, 2 * pp.PAGE_SIZE,
                                                          3 * pp.PAGE_SIZE]


# -- the exchange against fake peers speaking ibv_rc_pingpong's protocol ----------------

def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def test_server_exchange_with_c_client() -> None:
    """Our server vs a client doing what pp_client_exch_dest does, byte for byte."""
    listener = pp.OOBListener(0, "127.0.0.1", timeout=5)
    my = pp.Dest(0, 0x11, 0xF4747E, GID_11)
    seen: dict[str, bytes] = {}
    events: list[str] = []

    def c_client() -> None:
        with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as s:
            s.sendall(CAPTURE_CLIENT_MSG)
            seen["reply"] = _recv_exact(s, pp.MSG_LEN)
            events.append("client got reply")
            s.sendall(CAPTURE_DONE)
            seen["eof"] = s.recv(1)

    t = threading.Thread(target=c_client)
    t.start()
    rem = listener.exchange(my, lambda d: events.append(f"connect qpn {d.qpn:#x}"))
    t.join(5)
    assert rem == pp.Dest(0, 0x11, 0xB5FB78, GID_12)
    assert seen["reply"] == CAPTURE_SERVER_MSG
    assert seen["eof"] == b""  # the server closed after "done"
    # the server moves its QP to RTR/RTS before it answers (pp_server_exch_dest)
    assert events == ["connect qpn 0x11", "client got reply"]


def test_client_exchange_with_c_server() -> None:
    """Our client vs a server doing what pp_server_exch_dest does."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    got: dict[str, bytes] = {}

    def c_server() -> None:
        conn, _ = srv.accept()
        with conn:
            got["msg"] = _recv_exact(conn, pp.MSG_LEN)
            conn.sendall(CAPTURE_SERVER_MSG)
            got["done"] = _recv_exact(conn, pp.MSG_LEN)  # reads sizeof msg, gets 5
        srv.close()

    t = threading.Thread(target=c_server)
    t.start()
    rem = pp.client_exchange("127.0.0.1", port, pp.Dest(0, 0x11, 0xB5FB78, GID_12), 5)
    t.join(5)
    assert got["msg"] == CAPTURE_CLIENT_MSG
    assert got["done"] == CAPTURE_DONE
    assert rem == pp.Dest(0, 0x11, 0xF4747E, GID_11)


def test_client_retries_until_server_listens() -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    my = pp.Dest(0, 0x22, 0x1, GID_11)
    result: list[pp.Dest] = []

    def late_server() -> None:
        time.sleep(0.3)
        lst = pp.OOBListener(port, "127.0.0.1", timeout=5)
        result.append(lst.exchange(pp.Dest(0, 0x33, 0x2, GID_12), lambda d: None))

    t = threading.Thread(target=late_server)
    t.start()
    rem = pp.client_exchange("127.0.0.1", port, my, timeout=5)
    t.join(5)
    assert rem.qpn == 0x33 and result == [my]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_default_listener_accepts_ipv4_and_ipv6(host: str) -> None:
    """Without --bind the server listens on every address, IPv4 and IPv6 alike."""
    if host == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6")
    listener = pp.OOBListener(0, None, timeout=5)
    got: list[pp.Dest] = []
    t = threading.Thread(target=lambda: got.append(
        listener.exchange(pp.Dest(0, 0x44, 0x5, GID_11), lambda d: None)))
    t.start()
    rem = pp.client_exchange(host, listener.port, pp.Dest(0, 0x55, 0x6, GID_12), 5)
    t.join(5)
    assert rem.qpn == 0x44 and got and got[0].qpn == 0x55


def test_client_gives_up_when_nobody_listens() -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    t0 = time.monotonic()
    with pytest.raises(pp.PingPongError, match=f"Couldn't connect to 127.0.0.1:{port}"):
        pp.client_exchange("127.0.0.1", port, pp.Dest(0, 1, 1, GID_11), timeout=0.5)
    assert time.monotonic() - t0 < 3


def test_server_waits_for_its_client_until_stopped() -> None:
    """No timeout on the wait for a client (the C tool waits too); closing the listener
    (what stops the server) ends it."""
    listener = pp.OOBListener(0, "127.0.0.1", timeout=0.3)
    threading.Timer(1.5, listener.close).start()
    t0 = time.monotonic()
    with pytest.raises(pp.PingPongError, match="accept"):
        listener.exchange(pp.Dest(0, 1, 1, GID_11), lambda d: None)
    assert time.monotonic() - t0 >= 1.2  # well past the 0.3 s timeout


def _server_against(client: Callable[[socket.socket], None], error: type[Exception],
                    match: str | None = None) -> None:
    """The server side of the exchange fails with ``error`` against ``client`` (which is
    given its connected socket)."""
    listener = pp.OOBListener(0, "127.0.0.1", timeout=5)

    def run() -> None:
        with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as s:
            client(s)

    t = threading.Thread(target=run)
    t.start()
    with pytest.raises(error, match=match):
        listener.exchange(pp.Dest(0, 1, 1, GID_11), lambda d: None)
    t.join(5)


def test_server_peer_gone_before_done() -> None:
    def rude_client(s: socket.socket) -> None:
        s.sendall(CAPTURE_CLIENT_MSG)
        _recv_exact(s, pp.MSG_LEN)  # then close without "done"

    _server_against(rude_client, pp.PingPongError, "closed the connection")


def test_server_rejects_wrong_handshake() -> None:
    def odd_client(s: socket.socket) -> None:
        s.sendall(CAPTURE_CLIENT_MSG)
        _recv_exact(s, pp.MSG_LEN)
        s.sendall(b"nope\x00")

    _server_against(odd_client, pp.PingPongError, "instead of")


def test_client_peer_silent_times_out() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    try:
        with pytest.raises(pp.PingPongError, match="timed out waiting for remote address"):
            pp.client_exchange("127.0.0.1", port, pp.Dest(0, 1, 1, GID_11), timeout=0.4)
    finally:
        srv.close()


def test_server_garbage_from_client() -> None:
    def junk_client(s: socket.socket) -> None:
        s.sendall(b"x" * pp.MSG_LEN)
        s.recv(1)

    _server_against(junk_client, DecodeError)


# -- real runs over the verbs layer --------------------------------------------------


LINE_RE = {
    "local": re.compile(r"^  local address:  LID 0x[0-9a-f]{4}, QPN 0x([0-9a-f]{6}), "
                        r"PSN 0x([0-9a-f]{6})[,:] GID (\S+)$"),
    "remote": re.compile(r"^  remote address: LID 0x[0-9a-f]{4}, QPN 0x([0-9a-f]{6}), "
                         r"PSN 0x([0-9a-f]{6}), GID (\S+)$"),
    "bytes": re.compile(r"^(\d+) bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$"),
    "iters": re.compile(r"^(\d+) iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$"),
}


def _check_report(lines: list[str], size: int, iters: int) -> tuple[re.Match[str], ...]:
    assert len(lines) == 4, lines
    m = tuple(LINE_RE[k].match(line) for k, line in zip(LINE_RE, lines, strict=True))
    assert all(m), lines
    assert int(m[2].group(1)) == size * iters * 2  # type: ignore[union-attr]
    assert int(m[3].group(1)) == iters  # type: ignore[union-attr]
    return m  # type: ignore[return-value]


def _loopback(kind: str, device: str, *extra: str,  # noqa: F811
              capsys: pytest.CaptureFixture[str]) -> list[str]:
    rc = main([f"{kind}-pingpong", "--loopback", "-d", device, "--timeout", "10", *extra])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return cap.out.splitlines()


@pytest.mark.parametrize("kind,extra,size", [
    ("rc", ("-n", "50"), 4096),
    ("rc", ("-n", "20", "-s", "10000", "-m", "2048", "-c", "-e"), 10000),
    ("uc", ("-n", "20", "-c"), 4096),
    ("ud", ("-n", "50", "-c"), 2048),
    ("ud", ("-n", "10", "-s", "100", "-e"), 100),
])
def test_loopback_runs(kind: str, extra: tuple[str, ...], size: int, device: str,  # noqa: F811
                       capsys: pytest.CaptureFixture[str]) -> None:
    out = _loopback(kind, device, *extra, capsys=capsys)
    iters = int(extra[1])
    assert out[0] == "server:" and out[5] == "client:", out
    srv = _check_report(out[1:5], size, iters)
    cli = _check_report(out[6:10], size, iters)
    # each side's remote line is the other's local address
    assert srv[1].groups() == cli[0].groups() and cli[1].groups() == srv[0].groups()
    assert srv[0].group(3) == "::ffff:127.0.0.1"


def test_ud_size_above_mtu_fails(device: str, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    rc = main(["ud-pingpong", "--loopback", "-d", device, "-s", "8192", "-n", "2"])
    err = capsys.readouterr().err
    assert rc == 1 and "Requested size larger than port MTU (4096)" in err


def _run_pair(server: list[str], client: list[str], env: dict[str, str]
              ) -> tuple[list[subprocess.Popen[str]], list[tuple[str, str]]]:
    """Run a server and a client process to their end (40 s at most; killed otherwise):
    the processes and their (stdout, stderr)."""
    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(_spawn(server, env))
        procs.append(_spawn(client, env))
        outs = [p.communicate(timeout=40) for p in procs]
    finally:
        reap(*procs)
    return procs, outs


@pytest.mark.parametrize("kind", ["rc", "ud"])
def test_two_processes(kind: str, device: str) -> None:  # noqa: F811
    """Server and client as separate processes on one shared device."""
    tcp = free_port()
    common = [f"{kind}-pingpong", "-d", device, "-p", str(tcp), "-n", "30", "--timeout", "15"]
    env = _env()
    procs, outs = _run_pair([*common, "--bind", "127.0.0.1"], [*common, "127.0.0.1"], env)
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    size = 2048 if kind == "ud" else 4096
    srv = _check_report(outs[0][0].splitlines(), size, 30)
    cli = _check_report(outs[1][0].splitlines(), size, 30)
    assert srv[1].groups() == cli[0].groups() and cli[1].groups() == srv[0].groups()
    assert srv[0].group(1) != cli[0].group(1)  # devd gives distinct QPNs


def test_chk_detects_wrong_data(device: str) -> None:  # noqa: F811
    """A -c server paired with a client sending the plain 0x7b buffer (no -c) must fail
    its check on the first message; the client then times out instead of hanging."""
    tcp = free_port()
    common = ["rc-pingpong", "-d", device, "-p", str(tcp), "-n", "5", "--timeout", "2"]
    procs, outs = _run_pair([*common, "--bind", "127.0.0.1", "-c"], [*common, "127.0.0.1"], _env())
    assert procs[0].returncode == 1
    assert "Invalid data in page 0 (byte 0: 0x7b, expected 0x00)" in outs[0][1]
    assert procs[1].returncode == 1 and outs[1][1].strip().count("\n") == 0


def test_client_without_server_fails_fast(device: str) -> None:  # noqa: F811
    tcp = free_port()
    t0 = time.monotonic()
    p = _spawn(["rc-pingpong", "-d", device, "-p", str(tcp), "--timeout", "1", "127.0.0.1"],
               _env())
    try:
        out, err = p.communicate(timeout=30)
    finally:
        reap(p)
    assert p.returncode == 1
    assert err.strip().count("\n") == 0 and "Couldn't connect to 127.0.0.1" in err
    assert time.monotonic() - t0 < 25


def test_server_peer_vanishes_mid_run(device: str) -> None:  # noqa: F811
    """A server whose client dies after the exchange reports it instead of hanging."""
    tcp = free_port()
    p = _spawn(["rc-pingpong", "-d", device, "-p", str(tcp), "--bind", "127.0.0.1",
                "--timeout", "1.5", "-n", "5"], _env())
    try:
        # a fake client: does the exchange, then never sends anything over RDMA
        rem = pp.client_exchange("127.0.0.1", tcp, pp.Dest(0, 0x77, 0x1234, GID_11), 120)
        assert rem.qpn > 0
        out, err = p.communicate(timeout=30)
    finally:
        reap(p)
    assert p.returncode == 1
    lines = err.strip().splitlines()  # the server's "waiting for a client", then one error
    assert lines[0] == f"softrdma rc-pingpong: waiting for a client on {tcp}"
    assert len(lines) == 2 and "no completion for 1.5 s" in lines[1]


def test_run_writes_to_given_stream(device: str) -> None:  # noqa: F811
    import argparse

    parser = argparse.ArgumentParser()
    pp.add_arguments(parser, "uc")
    args = parser.parse_args(["--loopback", "-d", device, "-n", "5", "-s", "64"])
    buf = io.StringIO()
    assert pp.run("uc", args, buf) == 0
    lines = buf.getvalue().splitlines()
    _check_report(lines[1:5], 64, 5)


def test_error_completion_fails_both_sides(device: str) -> None:  # noqa: F811
    """The client's 4096-byte messages do not fit the server's 1024-byte receives: the
    server's receive completes with a local length error, the client's SEND is NAKed
    (remote invalid request); both print the failed status and exit 1."""
    tcp = free_port()
    common = ["rc-pingpong", "-d", device, "-p", str(tcp), "-n", "5", "--timeout", "5"]
    procs, outs = _run_pair([*common, "--bind", "127.0.0.1", "-s", "1024"], [*common, "-s", "4096", "127.0.0.1"], _env())
    assert procs[0].returncode == 1 and procs[1].returncode == 1, outs
    assert "Failed status local length error (1) for wr_id 1" in outs[0][1]
    assert "Failed status remote invalid request error (9) for wr_id 2" in outs[1][1]
    assert "Traceback" not in outs[0][1] + outs[1][1]


def test_refill_posts_receives_in_one_call(device: str, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The ping-pong's refill (rx_depth - routs receives, inside the timed loop) is one
    post of a WR list, not one post per receive (issue 26: 499 posts one at a time cost
    about 3 us per iteration); the first fill posts one at a time, as pp_post_recv."""
    from softrdma import verbs as v

    calls: list[int] = []
    real = v.QP.post_recv

    def counting(self: v.QP, wr: v.RecvWR | list[v.RecvWR]) -> None:
        calls.append(len(wr) if isinstance(wr, list) else 1)
        real(self, wr)

    monkeypatch.setattr(v.QP, "post_recv", counting)
    depth, iters = 8, 60
    out = _loopback("rc", device, "-r", str(depth), "-n", str(iters), capsys=capsys)
    _check_report(out[6:10], 4096, iters)
    assert calls[:2 * depth] == [1] * (2 * depth), calls  # both first fills
    refills = calls[2 * depth:]
    # every refill (routs fell to 1: depth - 1 receives) is one call of depth - 1 WRs
    assert refills and all(c == depth - 1 for c in refills), calls
    assert sum(refills) >= 2 * (iters - depth), calls
