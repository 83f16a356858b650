"""Servers wait for their client until stopped and say ``waiting for a client on PORT``
once (stdout stays the C tool's); a client with no server is refused at once, not after
``--timeout`` seconds of silence (``SOFTRDMA_CONNECT_RETRY`` unset, as for a user).

The servers are watched from their ``waiting for a client`` line on (the process start on a
loaded machine takes any time): from then on, ``PAST_TIMEOUT`` seconds without a client
must not end them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harness import ports
from harness.rdma_cm import child_env, make_state_dir
from harness.wait import StreamLines, waits_until_stopped


def _waits_until_stopped(cmd: list[str], env: dict[str, str], tool: str,
                         port: int) -> tuple[int, str, str]:
    return waits_until_stopped(cmd, env, f"softrdma {tool}: waiting for a client on {port}")


def _free_tcp_port() -> int:
    return ports.free_port()


def _env(tmp_path: Path) -> dict[str, str]:
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    env.pop("SOFTRDMA_CONNECT_RETRY", None)  # a user's environment
    return env


def _tool(*args: str) -> list[str]:
    return [sys.executable, "-m", "softrdma", *args]


@pytest.mark.parametrize("args", [["rc-pingpong", "-d", "cmtest_lo"],
                                  ["ud-pingpong", "-d", "cmtest_lo"],
                                  ["rc-pingpong", "--transport", "iwarp"],
                                  ["srq-pingpong", "-d", "cmtest_lo"]])
def test_server_waits_until_stopped_and_says_so_once(tmp_path: Path, args: list[str]) -> None:
    port = _free_tcp_port()
    tool = args[0]
    rc, _out, err = _waits_until_stopped(_tool(*args, "-p", str(port), "--timeout", "1"),
                                         _env(tmp_path), tool, port)  # well past --timeout 1
    assert err.splitlines()[0] == f"softrdma {tool}: waiting for a client on {port}"
    assert err.count("waiting for a client") == 1
    assert rc == 130 and "Traceback" not in err


@pytest.mark.parametrize("args", [["rc-pingpong", "-d", "cmtest_lo"],
                                  ["rc-pingpong", "--transport", "iwarp"],
                                  ["srq-pingpong", "-d", "cmtest_lo"],
                                  ["write-bw", "-d", "cmtest_lo"]])
def test_client_without_server_is_refused_at_once(tmp_path: Path, args: list[str]) -> None:
    port = _free_tcp_port()
    # with --timeout 600, a client that retried in silence would run into the 300 s limit
    # here (TimeoutExpired); a refused one ends after its process start, however slow
    r = subprocess.run(_tool(*args, "-p", str(port), "--timeout", "600", "127.0.0.1"),
                       env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "Couldn't connect to 127.0.0.1:" in r.stderr and "refused" in r.stderr.lower()
    assert "Traceback" not in r.stderr


def test_connect_retry_lets_a_late_server_come(tmp_path: Path) -> None:
    """SOFTRDMA_CONNECT_RETRY (scripts starting both sides together): the client waits
    for a server that starts after it."""
    env = _env(tmp_path)
    env["SOFTRDMA_CONNECT_RETRY"] = "120"  # the server's process start, at any load
    port = str(_free_tcp_port())
    common = ["rc-pingpong", "-d", "cmtest_lo", "-p", port, "-n", "5"]
    cli = subprocess.Popen(_tool(*common, "127.0.0.1"), env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert cli.stdout is not None and cli.stderr is not None
    cli_out, cli_err = StreamLines(cli.stdout), StreamLines(cli.stderr)
    try:
        # the client first: it prints its local address just before it connects (and is
        # refused, as no server listens yet); only then is the server started
        cli_out.wait_for(r"local address")
        assert cli.poll() is None, (cli.returncode, cli_out.text(), cli_err.text())
        srv = subprocess.run(_tool(*common), env=env, capture_output=True, text=True,
                             timeout=90)
        cli.wait(timeout=90)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    out, err = cli_out.join(), cli_err.join()
    assert cli.returncode == 0, err
    assert srv.returncode == 0, srv.stderr
    assert "5 iters in" in out and "5 iters in" in srv.stdout


@pytest.mark.parametrize(("tool", "port_flag"), [("ucmatose", "-p"), ("udaddy", "--port")])
def test_rdma_cm_servers_say_they_wait(tmp_path: Path, tool: str, port_flag: str) -> None:
    port = _free_tcp_port()
    # waits past --timeout for its first client
    _rc, _out, err = _waits_until_stopped(
        _tool(tool, "-b", "127.0.0.1", port_flag, str(port), "--timeout", "1"),
        _env(tmp_path), tool, port)
    assert err.splitlines()[0] == f"softrdma {tool}: waiting for a client on {port}"
    assert err.count("waiting for a client") == 1


@pytest.mark.parametrize("extra", [[], ["-P"], ["--transport", "iwarp"]],
                         ids=["rping-s", "rping-s-P", "rping-s-iwarp"])
def test_rping_server_says_it_waits_once(tmp_path: Path, extra: list[str]) -> None:
    """``rping -s`` (and the persistent ``-P`` server) waits for clients until stopped and
    says so once on stderr; its stdout stays rping's (nothing before a client)."""
    port = _free_tcp_port()
    _rc, out, err = _waits_until_stopped(
        _tool("rping", "-s", "-a", "127.0.0.1", "-p", str(port), *extra), _env(tmp_path),
        "rping", port)
    assert err.splitlines()[0] == f"softrdma rping: waiting for a client on {port}"
    assert err.count("waiting for a client") == 1 and out == ""
    assert "Traceback" not in err
