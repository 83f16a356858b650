"""``softrdma rdma-server`` / ``rdma-client`` (librdmacm's rdma_server / rdma_client
examples): one 16-byte SEND each way over RoCE (IPv4, IPv6) and iWARP in two processes,
the C examples' output; a client with no server is refused at once; the server waits for
its client until stopped and says so once. ``rdma-xserver`` / ``rdma-xclient``
(rdma_xserver / rdma_xclient): one SEND over RC or XRC through rdma_cm."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harness.ports import free_port
from harness.rdma_cm import child_env, make_state_dir
from harness.wait import waits_until_stopped


def _tool(*args: str) -> list[str]:
    return [sys.executable, "-m", "softrdma", *args]


def _one_message(server: str, server_args: list[str], client: str, client_args: list[str],
                 env: dict[str, str], port: str) -> None:
    """Start ``server``, which says once that it waits on ``port``, run ``client`` against
    it, and check that both end well with the C examples' output and say nothing else."""
    sname, cname = server.replace("-", "_"), client.replace("-", "_")
    srv = subprocess.Popen(_tool(server, *server_args), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert srv.stderr is not None
        assert srv.stderr.readline() == f"{sname}: waiting for a client on {port}\n"
        cli = subprocess.run(_tool(client, *client_args), env=env,
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert cli.stdout.splitlines() == [f"{cname}: start", f"{cname}: end 0"]
        assert cli.stderr == ""
        out, err = srv.communicate(timeout=60)
        assert srv.returncode == 0, out + err
        assert out.splitlines() == [f"{sname}: start", f"{sname}: end 0"]
        assert err == ""
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()


@pytest.mark.parametrize(("addr", "device"), [("127.0.0.1", "roce"), ("::1", "roce"),
                                              ("127.0.0.1", "iwarp")])
def test_server_and_client(tmp_path: Path, addr: str, device: str) -> None:
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    port = str(free_port())
    common = ["-p", port, "--device", device, "--timeout", "20"]
    _one_message("rdma-server", ["-s", addr, *common], "rdma-client", ["-s", addr, *common],
                 env, port)


@pytest.mark.parametrize("device", ["roce", "iwarp"])
def test_client_without_server_is_refused_at_once(tmp_path: Path, device: str) -> None:
    state, _ = make_state_dir(tmp_path)
    # with --timeout 600, a client that waited in silence would run into the 300 s limit
    # here (TimeoutExpired); a refused one ends after its process start, however slow
    cli = subprocess.run(_tool("rdma-client", "-p", str(free_port()), "--device", device,
                               "--timeout", "600"),
                         env=child_env(state), capture_output=True, text=True, timeout=300)
    assert cli.returncode == 1
    assert cli.stdout.splitlines() == ["rdma_client: start", "rdma_client: end -1"]
    assert cli.stderr.startswith("rdma_connect: Connection refused"), cli.stderr
    assert "Traceback" not in cli.stderr


def test_server_waits_until_stopped(tmp_path: Path) -> None:
    state, _ = make_state_dir(tmp_path)
    port = str(free_port())
    # past --timeout: waiting for a client has no limit
    rc, out, err = waits_until_stopped(_tool("rdma-server", "-p", port, "--timeout", "1"),
                                       child_env(state), "waiting for a client")
    assert err.count("waiting for a client") == 1
    assert err.startswith(f"rdma_server: waiting for a client on {port}\n")
    assert rc == 130
    assert "Traceback" not in err


@pytest.mark.parametrize(("args", "stdout"), [
    (["-s", "no-such-host.invalid"], "rdma_getaddrinfo: "),
    (["-p", "http-alt-not-a-number"], "rdma_getaddrinfo: Servname not supported"),
])
def test_getaddrinfo_errors(tmp_path: Path, args: list[str], stdout: str) -> None:
    state, _ = make_state_dir(tmp_path)
    cli = subprocess.run(_tool("rdma-client", *args), env=child_env(state),
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1
    lines = cli.stdout.splitlines()
    assert lines[0] == "rdma_client: start" and lines[1].startswith(stdout)
    assert lines[2].startswith("rdma_client: end -")


@pytest.mark.parametrize("mode", ["r", "x"])
def test_xserver_and_xclient(tmp_path: Path, mode: str) -> None:
    """``softrdma rdma-xserver`` / ``rdma-xclient`` (librdmacm's rdma_xserver /
    rdma_xclient): one 16-byte SEND from the client, over RC (``-c r``) or XRC through
    rdma_cm (``-c x``: RDMA_PS_IB ids, the server's XRC TGT QP and SRQ, the SRQ's number
    in the accept), the C examples' output."""
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    port = str(free_port())
    common = ["-p", port, "-c", mode, "--device", "roce", "--timeout", "20"]
    _one_message("rdma-xserver", common, "rdma-xclient", ["-s", "127.0.0.1", *common], env,
                 port)


@pytest.mark.parametrize("tool", ["rdma-xserver", "rdma-xclient"])
def test_x_examples_bad_communication_type_prints_the_usage(tmp_path: Path,
                                                            tool: str) -> None:
    state, _ = make_state_dir(tmp_path)
    r = subprocess.run(_tool(tool, "-c", "q"), env=child_env(state), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0] == f"usage: {tool.replace('-', '_')}"
    assert "\t    x - XRC: extended-reliable-connected" in lines


def test_xclient_over_iwarp_names_why(tmp_path: Path) -> None:
    """XRC through rdma_cm needs RoCE: iWARP connects RDMA_PS_TCP ids only (as Linux's
    iw_cm), so rdma-xclient -c x fails at its address resolution (ADDR_ERROR), and says
    why, once."""
    state, _ = make_state_dir(tmp_path)
    r = subprocess.run(_tool("rdma-xclient", "-c", "x", "-p", str(free_port()), "--device",
                             "iwarp", "--timeout", "20"),
                       env=child_env(state), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stdout.splitlines() == ["rdma_xclient: start", "rdma_xclient: end -1"]
    assert r.stderr.startswith("rdma_create_ep: "), r.stderr
    assert "RDMA_PS_IB needs RoCE" in r.stderr and len(r.stderr.splitlines()) == 1
    assert "Traceback" not in r.stderr
