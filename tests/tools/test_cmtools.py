"""``softrdma udaddy`` and ``softrdma ucmatose``: server and client as two processes over
the RoCE device on lo (shared through devd) and over iWARP; rdma-core's output lines and
exit status; peers that fail, go silent or never answer give a non-zero exit within the
timeout; argument checks."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ports
from harness.rdma_cm import child_env, fake_server, make_state_dir, setup_env
from harness.wait import StreamLines, load_factor

from softrdma.cm import rdma_cm as rc
from softrdma.tools.rdmacm.udaddy import ah_attr_from_grh
from softrdma.wire.gid import ip_to_gid

T = rc.RdmaCmEventType

UDADDY_SERVER = ["udaddy: starting server", "receiving data transfers", "sending replies",
                 "data transfers complete", "test complete", "return status 0"]
UDADDY_CLIENT = ["udaddy: starting client", "udaddy: connecting",
                 "initiating data transfers", "receiving data transfers",
                 "data transfers complete", "test complete", "return status 0"]
# ../shared/captures/roce_ucmatose.{server,client}.log (rdma-core 44 against rxe)
CAPTURES = Path("/work/shared/captures")


def _log_lines(name: str) -> list[str]:
    return [x for x in (CAPTURES / name).read_text().splitlines() if x.startswith(
        ("cmatose", "initiating", "completing", "receiving", "sending", "data", "test",
         "return", "disconnected"))]


def _tool(*args: str) -> list[str]:
    return [sys.executable, "-m", "softrdma", *args]


def _port() -> int:
    return ports.free_port()


def _pair(tmp_path: Path, server: list[str], client: list[str], *,
          timeout: float = 180) -> tuple[subprocess.CompletedProcess[str], str, str, int]:
    """The server, then (once it says it waits for a client) the client."""
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    srv = subprocess.Popen(_tool(*server), env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert srv.stdout is not None and srv.stderr is not None
    sout, serr = StreamLines(srv.stdout), StreamLines(srv.stderr)
    try:
        serr.wait_for("waiting for a client")
        cli = subprocess.run(_tool(*client), env=env, capture_output=True, text=True,
                             timeout=timeout)
        srv.wait(timeout=timeout)
        return cli, sout.join(), serr.join(), srv.returncode
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


@pytest.mark.parametrize(("addr", "extra"), [("127.0.0.1", []), ("::1", []),
                                             ("127.0.0.1", ["-c", "2", "-C", "4", "-S", "700"])])
def test_udaddy_two_processes(tmp_path: Path, addr: str, extra: list[str]) -> None:
    port = str(_port())
    cli, sout, serr, src = _pair(
        tmp_path, ["udaddy", "-b", addr, "--port", port, "--timeout", "60", *extra],
        ["udaddy", "-s", addr, "--port", port, "--timeout", "60", "-t", "8", *extra])
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert cli.stdout.splitlines() == UDADDY_CLIENT
    assert src == 0, sout + serr
    assert sout.splitlines() == UDADDY_SERVER


@pytest.mark.parametrize(("transport", "extra"), [("roce", ["-C", "5"]),
                                                  ("roce", ["-c", "3", "-C", "3", "-m"]),
                                                  ("roce", ["-C", "4", "-t", "32", "-a", "16"]),
                                                  ("roce", ["-C", "3", "-P", "ib"]),
                                                  ("iwarp", ["-C", "5", "-S", "3000"])])
def test_ucmatose_two_processes(tmp_path: Path, transport: str, extra: list[str]) -> None:
    port = str(_port())
    common = ["-p", port, "--transport", transport, "--timeout", "60", *extra]
    cli, sout, serr, src = _pair(tmp_path, ["ucmatose", "-b", "127.0.0.1", *common],
                                 ["ucmatose", "-s", "127.0.0.1", *common])
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert src == 0, sout + serr
    want_srv = _log_lines("roce_ucmatose.server.log")
    want_cli = _log_lines("roce_ucmatose.client.log")
    if "-m" in extra:  # "migrating to new event channel" after the transfers
        want_srv.insert(want_srv.index("data transfers complete") + 1,
                        "migrating to new event channel")
        want_cli.insert(want_cli.index("data transfers complete") + 1,
                        "migrating to new event channel")
    assert sout.splitlines() == want_srv
    assert cli.stdout.splitlines() == want_cli


def test_ucmatose_error_completion_fails_both_sides(tmp_path: Path) -> None:
    """The server's 100-byte messages do not fit the client's 50-byte receives: the
    client gets a local length error, the server a remote invalid request; both exit 1
    (rdma-core's cmatose counts the completions without looking at them)."""
    port = str(_port())
    common = ["-p", port, "--timeout", "60", "-C", "3"]
    cli, sout, serr, src = _pair(tmp_path, ["ucmatose", "-b", "127.0.0.1", *common],
                                 ["ucmatose", "-s", "127.0.0.1", "-S", "50", *common])
    assert cli.returncode == 1 and src == 1
    assert "cmatose: completion error on connection 0: local length error" in cli.stdout
    assert "cmatose: completion error on connection 0: remote invalid request error" in sout
    assert cli.stdout.splitlines()[-1] != "return status 0"
    assert "Traceback" not in cli.stderr + serr


def test_udaddy_without_server_fails(tmp_path: Path) -> None:
    state, _ = make_state_dir(tmp_path)
    r = subprocess.run(_tool("udaddy", "-s", "127.0.0.1", "--port", "9", "--timeout", "20"),
                       env=child_env(state), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "udaddy: event: RDMA_CM_EVENT_REJECTED, error: 1" in r.stdout  # SIDR status 1
    assert r.stdout.splitlines()[-1] != "return status 0"


def test_ucmatose_without_server_fails(tmp_path: Path) -> None:
    state, _ = make_state_dir(tmp_path)
    r = subprocess.run(_tool("ucmatose", "-s", "127.0.0.1", "-p", "9", "--timeout", "20"),
                       env=child_env(state), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "cmatose: event: RDMA_CM_EVENT_REJECTED, error: 8" in r.stdout  # devd: REJ 8
    assert r.stdout.splitlines()[-2:] == ["test complete", "return status 8"]


# ---- peers that accept and then go silent (in this process, the tool in a subprocess) --
@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from setup_env(tmp_path, monkeypatch)


@pytest.mark.parametrize(("tool", "ps", "flag"), [("udaddy", rc.RDMA_PS_UDP, "--port"),
                                                  ("ucmatose", rc.RDMA_PS_TCP, "-p")])
def test_silent_server_fails_client_within_timeout(env: Path, tool: str, ps: int,
                                                   flag: str) -> None:
    port = _port()
    ready, stop = threading.Event(), threading.Event()
    th = threading.Thread(target=fake_server, args=(ps, port, ready, stop), daemon=True)
    th.start()
    try:
        assert ready.wait(20)
        t0 = time.monotonic()
        r = subprocess.run(_tool(tool, "-s", "127.0.0.1", flag, str(port), "--timeout", "3",
                                 "-C", "2"),
                           env=child_env(env), capture_output=True, text=True, timeout=120)
        took = time.monotonic() - t0
    finally:
        stop.set()
        th.join(30)
    assert r.returncode == 1, r.stdout + r.stderr
    name = "udaddy" if tool == "udaddy" else "cmatose"
    assert f"{name}: no completion for 3 s (0 of 2 on connection 0)" in r.stdout
    assert r.stdout.splitlines()[-1] == "return status -110"
    assert took < 30


def test_udaddy_server_reply_address_from_grh() -> None:
    """ibv_create_ah_from_wc on RoCEv2: the reply goes to the IPv4 source in the GRH
    area's last 20 bytes (or the IPv6 header's source), from the GID it was sent to."""
    v4 = bytes(20) + bytes([0x45, 0, 0, 0]) + bytes(8) + bytes([10, 50, 0, 13]) \
        + bytes([10, 50, 0, 1])
    gids = [ip_to_gid(bytes([127, 0, 0, 1])), ip_to_gid(bytes([10, 50, 0, 1]))]
    ah = ah_attr_from_grh(v4, gids)
    assert ah.gr is not None and bytes(ah.gr.dgid.raw) == ip_to_gid(bytes([10, 50, 0, 13]))
    assert ah.gr.sgid_index == 1 and ah.is_global == 1
    six = bytes([0x60]) + bytes(7) + bytes(range(16)) + bytes(range(16, 32))
    ah6 = ah_attr_from_grh(six, [bytes(range(16, 32))])
    assert ah6.gr is not None and bytes(ah6.gr.dgid.raw) == bytes(range(16))


@pytest.mark.parametrize(("argv", "msg"), [
    (["udaddy", "-P", "ipoib"], "IPoIB port space needs an InfiniBand port"),
    (["udaddy", "-p", "0x106"], "port space 0x106 is not a UD port space"),
    (["udaddy", "-f", "gid"], "gid addresses need AF_IB"),
    (["udaddy", "-C", "-1"], "-C: must be at least 0"),
    (["udaddy", "--timeout", "-1"], "--timeout: must be a positive number"),
    (["ucmatose", "-P", "ib", "--transport", "iwarp"], "the ib port space (RDMA_PS_IB) needs RoCE"),
    (["ucmatose", "-c", "0"], "-c: must be at least 1"),
    (["ucmatose", "-p", "70000"], "-p: port 70000 not in 0..65535"),
])
def test_bad_arguments(tmp_path: Path, argv: list[str], msg: str) -> None:
    state, _ = make_state_dir(tmp_path)
    r = subprocess.run(_tool(*argv), env=child_env(state), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1
    prog = argv[0]
    assert r.stderr.startswith(f"softrdma {prog}: error: ") and msg in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1


@pytest.mark.parametrize(("argv", "line"), [
    (["rping", "-c", "-a", "127.0.0.2"], "no answer from the peer for 3 s"),
    (["udaddy", "-s", "127.0.0.2"],
     "udaddy: no rdma_cm event for 3 s while waiting for the server's SIDR_REP"),
    (["ucmatose", "-s", "127.0.0.2"],
     "cmatose: no rdma_cm event for 3 s while waiting for the connections"),
])
def test_peer_that_never_answers_fails_within_timeout(tmp_path: Path, argv: list[str],
                                                      line: str) -> None:
    """Nothing listens on 127.0.0.2 (the device's daemon is bound to 127.0.0.1): the CM
    request goes unanswered and the tool gives up after --timeout, exit 1."""
    state, _ = make_state_dir(tmp_path)
    t0 = time.monotonic()
    r = subprocess.run(_tool(*argv, "--timeout", "3"), env=child_env(state),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert line in r.stdout + r.stderr
    # a bounded give-up: the 3 s, plus process start-up that grows with the machine's load
    assert time.monotonic() - t0 < 30 * load_factor()


@pytest.mark.parametrize("tool", ["udaddy", "ucmatose"])
def test_unresolvable_server_name(tmp_path: Path, tool: str) -> None:
    """A name getaddrinfo cannot resolve: the C tools' line and its (negative) EAI code
    as the return status; exit 1."""
    state, _ = make_state_dir(tmp_path)
    r = subprocess.run(_tool(tool, "-s", "no-such-host.invalid", "--timeout", "5"),
                       env=child_env(state), capture_output=True, text=True, timeout=120)
    name = "udaddy" if tool == "udaddy" else "cmatose"
    lines = r.stdout.splitlines()
    assert r.returncode == 1 and lines[:1] == [f"{name}: starting client"]
    assert lines[1].startswith(f"{name}: getaddrinfo error: ")
    assert lines[2] == "test complete" and re.fullmatch(r"return status -\d+", lines[3])
