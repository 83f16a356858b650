"""``softrdma rping``: server and client as two processes on one host, over the RoCE
device on lo (shared through devd) and over the built-in iWARP device; rping's output
lines and exit status; argument checks."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.ports import free_port
from harness.rdma_cm import (
    Ep,
    child_env,
    expect,
    fake_server,
    make_state_dir,
    next_non_timewait,
    setup_env,
)
from harness.rping import _rping, _run_pair
from harness.wait import StreamLines

from softrdma import enums as e
from softrdma.cm import rdma_cm as rc
from softrdma.tools.cli import build_parser
from softrdma.tools.rdmacm import rping_run
from softrdma.tools.rdmacm.rping import RPING_MIN_BUFSIZE, ping_pattern

CAPTURES = Path("/work/shared/captures")


@pytest.mark.parametrize(("transport", "addr", "sflags", "cflags"), [
    ("roce", "127.0.0.1", (), ()), ("iwarp", "127.0.0.1", (), ()), ("roce", "::1", (), ()),
    # -q: rping's self-created QPs moved with rdma_init_qp_attr, on one side or both (one
    # side only: in the slow job)
    ("roce", "127.0.0.1", ("-q",), ("-q",)),
    pytest.param("roce", "127.0.0.1", ("-q",), (), marks=pytest.mark.slow),
    pytest.param("roce", "127.0.0.1", (), ("-q",), marks=pytest.mark.slow)])
def test_two_process_rping(tmp_path: Path, transport: str, addr: str,
                           sflags: tuple[str, ...], cflags: tuple[str, ...]) -> None:
    count, size = 5, 64
    client, sout, serr, src = _run_pair(tmp_path, transport, addr, count, size, sflags, cflags)
    assert client.returncode == 0, client.stderr
    want = []
    start = 65
    for i in range(count):
        want.append(ping_pattern(i, start, size).rstrip(b"\0").decode())
        start = start + 1 if start < 122 else 65
    assert client.stdout.splitlines() == [f"ping data: {w}" for w in want]
    assert "client DISCONNECT EVENT..." in client.stderr
    assert src == 0, serr
    assert sout.splitlines() == [f"server ping data: {w}" for w in want]
    # softrdma's one waiting line (tools.waiting), then rping's stderr at the end of a
    # server run (../shared/captures/roce_rping.server.log)
    lines = serr.splitlines()
    assert lines[0].startswith("softrdma rping: waiting for a client on ")
    log = (CAPTURES / f"{transport}_rping.server.log").read_text().splitlines()
    assert lines[1:] == [x for x in log if not x.startswith("server ping data")]
    assert lines[1:] == ["server DISCONNECT EVENT...", "wait for RDMA_READ_ADV state 10"]


def test_ping_pattern_is_rpings() -> None:
    p = ping_pattern(0, 65, 64)
    assert p.startswith(b"rdma-ping-0: ABCDEFG") and p[-1] == 0 and len(p) == 64
    assert ping_pattern(3, 122, 20)[13:16] == b"zAB"  # wraps after 122 (z) to 65 (A)


@pytest.mark.parametrize(("args", "msg"), [
    (["-c", "-a", "127.0.0.1", "-S", str(RPING_MIN_BUFSIZE - 1)], "-S: Invalid size"),
    (["-c", "-a", "127.0.0.1", "-C", "-1"], "-C: Invalid count -1"),
    (["-c", "-a", "not-an-ip"], "-a: not an IP address"),
    (["-c"], "-a: the client needs -a ADDR"),
    (["-c", "-a", "127.0.0.1", "--timeout", "-1"], "--timeout: must be a positive number"),
    (["-s", "--timeout", "0"], "--timeout: must be a positive number"),
    (["-c", "-a", "127.0.0.1", "-P"], "-P: persistent mode is for the server"),
    (["-s", "-q", "--transport", "iwarp"], "-q: a self-modified QP needs the IB CM"),
])
def test_bad_arguments(tmp_path: Path, args: list[str], msg: str) -> None:
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    r = subprocess.run(_rping(*args), env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert r.stderr.startswith("softrdma rping: error: ") and msg in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1


def test_client_without_server_fails_cleanly(tmp_path: Path) -> None:
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    r = subprocess.run(_rping("-c", "-a", "127.0.0.1", "-p", "9", "--timeout", "10"),
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "cma event RDMA_CM_EVENT_REJECTED, error 8" in r.stderr  # devd: REJ 8


@pytest.mark.parametrize("transport", ["roce", "iwarp"])
def test_persistent_server_serves_clients_until_stopped(tmp_path: Path, transport: str) -> None:
    """-P: two clients one after the other, then two at once, all served by one server
    that keeps listening until it is interrupted."""
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    port = str(free_port())
    server = subprocess.Popen(_rping("-s", "-P", "-a", "127.0.0.1", "-p", port, "-v",
                                     "--timeout", "20", "--transport", transport),
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client = ["-c", "-a", "127.0.0.1", "-p", port, "-V", "--timeout", "20",
                  "--transport", transport]
        first = None
        for _ in range(40):  # until the server listens
            first = subprocess.run(_rping(*client, "-C", "2"), env=env, capture_output=True,
                                   text=True, timeout=60)
            if first.returncode == 0 or not ("REJECTED" in first.stderr
                                             or "UNREACHABLE" in first.stderr):
                break
            time.sleep(0.25)
        assert first is not None
        assert first.returncode == 0, first.stderr
        second = subprocess.run(_rping(*client, "-C", "3"), env=env, capture_output=True,
                                text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        both = [subprocess.Popen(_rping(*client, "-C", "6"), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for p in both:
            _out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
        time.sleep(0.5)
        assert server.poll() is None  # still serving
        server.send_signal(signal.SIGINT)
        sout, serr = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 130 and "softrdma rping: interrupted" in serr
    lines = sout.splitlines()
    odd = [x for x in lines if not x.startswith("server ping data: rdma-ping-")]
    assert len(lines) == 2 + 3 + 6 + 6 and not odd, (len(lines), odd)
    assert serr.count("server DISCONNECT EVENT...") == 4
    assert "failed" not in serr


# ---- peers that misbehave: the client's exit status ----------------------------------------
@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from setup_env(tmp_path, monkeypatch)


def _client_against(env: Path, recv_len: int, timeout: str) -> tuple[
        subprocess.CompletedProcess[str], float]:
    port = free_port()
    ready, stop = threading.Event(), threading.Event()
    th = threading.Thread(target=fake_server, args=(rc.RDMA_PS_TCP, port, ready, stop),
                          kwargs={"recv_len": recv_len}, daemon=True)
    th.start()
    try:
        assert ready.wait(20)
        t0 = time.monotonic()
        r = subprocess.run(_rping("-c", "-a", "127.0.0.1", "-p", str(port), "-C", "3",
                                  "--timeout", timeout),
                           env=child_env(env), capture_output=True, text=True, timeout=90)
        return r, time.monotonic() - t0
    finally:
        stop.set()
        th.join(30)


def test_error_completion_exits_nonzero(env: Path) -> None:
    """Regression (issue 9): after ``cq completion failed status N`` the client's own
    disconnect brought DISCONNECTED, and rping exited 0. The peer here posts 4-byte
    receives, so the client's 16-byte advertisement is NAKed (remote invalid request)."""
    r, _took = _client_against(env, 4, "20")
    assert f"cq completion failed status {int(e.IBV_WC_REM_INV_REQ_ERR)}" in r.stderr
    assert r.returncode == 1, r.stderr
    assert "rping client failed: -1" in r.stderr


def test_silent_server_fails_client_within_timeout(env: Path) -> None:
    r, took = _client_against(env, 256, "3")
    assert r.returncode == 1, r.stderr
    assert "no answer from the peer for 3 s" in r.stderr
    assert took < 30


def test_validate_detects_corrupted_data(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """-V: a server that writes back something else than it read makes the client print
    ``data mismatch!`` and exit 1 (the server here is softrdma's own, in this process,
    with its RDMA WRITE source altered)."""
    real_rdma = rping_run.Cb.rdma

    def corrupt(self: rping_run.Cb, opcode: int, length: int) -> None:
        if opcode == e.IBV_WR_RDMA_WRITE:
            mr = self.mrs["rdma"]
            data = bytearray(mr.read(length, 0))
            data[14] ^= 0x20  # a letter of the pattern changes case
            mr.write(bytes(data), length, 0)
        real_rdma(self, opcode, length)

    monkeypatch.setattr(rping_run.Cb, "rdma", corrupt)
    port = str(free_port())
    args = build_parser().parse_args(["rping", "-s", "-a", "127.0.0.1", "-p", port,
                                      "--timeout", "20"])
    result: dict[str, Any] = {}
    th = threading.Thread(target=lambda: result.setdefault("rc", rping_run.run(args)),
                          daemon=True)
    th.start()
    try:
        r = None
        for _ in range(40):  # until the server listens
            r = subprocess.run(_rping("-c", "-a", "127.0.0.1", "-p", port, "-C", "3", "-V",
                                      "--timeout", "20"),
                               env=child_env(env), capture_output=True, text=True, timeout=60)
            if "REJECTED" not in r.stderr:
                break
            time.sleep(0.25)
    finally:
        th.join(30)
    assert r is not None and r.returncode == 1, r
    assert "data mismatch!" in r.stderr and "ping data" not in r.stdout
    assert result.get("rc") == 0  # the server saw the client disconnect: its run ended well


def _silent_client(port: int, connected: threading.Event, stop: threading.Event) -> None:
    """Connects to the rping server (retrying until it listens), posts a receive, then
    never sends anything."""
    ch = rc.EventChannel()
    ids: list[rc.CmId] = []
    eps: list[Ep] = []
    try:
        for _ in range(80):
            cid = rc.CmId(ch, rc.RDMA_PS_TCP)
            ids.append(cid)
            cid.resolve_addr(None, ("127.0.0.1", port), 2000, device="roce")
            expect(ch, rc.RdmaCmEventType.ADDR_RESOLVED)
            cid.resolve_route(2000)
            expect(ch, rc.RdmaCmEventType.ROUTE_RESOLVED)
            ep = Ep(cid)
            eps.append(ep)
            ep.recv(64)
            cid.connect(rc.ConnParam())
            ev = next_non_timewait(ch, 30)
            if ev.event == rc.RdmaCmEventType.ESTABLISHED:
                connected.set()
                stop.wait(60)
                return
            time.sleep(0.25)  # not listening yet (REJ 8)
    finally:
        for ep in eps:
            ep.qp.close()
        for cid in ids:
            cid.destroy()
        ch.close()


def test_persistent_server_outlives_a_silent_client(env: Path) -> None:
    """-P: a client that connects and goes silent fails its own connection after
    --timeout; the clients beside and after it are served and the server keeps going."""
    port = free_port()
    server = subprocess.Popen(_rping("-s", "-P", "-a", "127.0.0.1", "-p", str(port),
                                     "--timeout", "3"),
                              env=child_env(env), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stderr is not None
    errs = StreamLines(server.stderr)
    StreamLines(server.stdout)  # read, so that the pipe never fills
    connected, stop = threading.Event(), threading.Event()
    th = threading.Thread(target=_silent_client, args=(port, connected, stop), daemon=True)
    try:
        errs.wait_for("waiting for a client")
        th.start()
        assert connected.wait(120)
        good = subprocess.run(_rping("-c", "-a", "127.0.0.1", "-p", str(port), "-C", "3",
                                     "-V", "--timeout", "20"),
                              env=child_env(env), capture_output=True, text=True, timeout=60)
        assert good.returncode == 0, good.stderr  # served while the other one is silent
        errs.wait_for("no answer from the peer for 3 s")  # the silent client's, on the server
        later = subprocess.run(_rping("-c", "-a", "127.0.0.1", "-p", str(port), "-C", "2",
                                      "-V", "--timeout", "20"),
                               env=child_env(env), capture_output=True, text=True, timeout=60)
        assert later.returncode == 0, later.stderr
        assert server.poll() is None
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)
        serr = errs.join()
    finally:
        stop.set()
        th.join(30)
        if server.poll() is None:
            server.kill()
            server.wait()
    assert "no answer from the peer for 3 s" in serr and "rping server failed: -1" in serr
    assert serr.count("server DISCONNECT EVENT...") == 2
