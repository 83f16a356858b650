"""``softrdma xsrq-pingpong`` (``ibv_xsrq_pingpong``, issue 14): server and client over
XRC (polling and ``-e`` events), the C tool's 66-byte exchange message and ``END``
termination checked against a hand-made peer, and its errors."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from harness.device import private_device
from harness.ports import free_port
from harness.wait import wait_until

from softrdma.drivers.host import registry
from softrdma.errors import DecodeError
from softrdma.tools.ibverbs import xsrq_pingpong as xp

SRC = str(Path(__file__).resolve().parents[2] / "src")
LINE = re.compile(r"^ +(local|remote): LID 0000, QPN RECV ([0-9a-f]{6}) SEND ([0-9a-f]{6}), "
                  r"PSN ([0-9a-f]{6}), SRQN ([0-9a-f]{6}), GID ::ffff:127\.0\.0\.1$")


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    private_device("xsrq0", tmp_path, monkeypatch, subprocesses=False)
    return dict(os.environ, PYTHONPATH=SRC)


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "softrdma", "xsrq-pingpong", "-d", "xsrq0", *args]


@pytest.mark.parametrize("extra", [[], ["-e"]])
def test_server_and_client(env: dict[str, str], extra: list[str]) -> None:
    port = str(free_port())
    flags = ["-g", "0", "-p", port, "-n", "40", "-s", "700", "-m", "512", "--timeout", "120",
             *extra]
    server = subprocess.Popen(_cmd(*flags), env=env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        client = subprocess.run(_cmd(*flags, "127.0.0.1"), env=env, text=True,
                                capture_output=True, timeout=300, check=False)
        sout, serr = server.communicate(timeout=300)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert client.returncode == 0, client.stderr
    assert server.returncode == 0, serr
    parsed = {}
    for name, out in (("client", client.stdout), ("server", sout)):
        lines = out.splitlines()
        assert len(lines) == 3 and lines[2] == "success", out
        got = {m.group(1): m.groups()[1:] for m in map(LINE.match, lines[:2]) if m}
        assert set(got) == {"local", "remote"}, out
        parsed[name] = got
    # the client prints local first (it sends first), the server remote first
    assert client.stdout.splitlines()[0].lstrip().startswith("local")
    assert sout.splitlines()[0].lstrip().startswith("remote")
    assert parsed["client"]["local"] == parsed["server"]["remote"]
    assert parsed["server"]["local"] == parsed["client"]["remote"]
    # SRQ numbers come from the device's QP number space: distinct across the processes
    assert parsed["client"]["local"][3] != parsed["server"]["local"][3]


def test_exchange_message_is_the_c_tools() -> None:
    d = xp.XDest(0, 0x12, 0x13, 0xABCDEF, 0x11, bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 9]))
    raw = xp.encode_xdest(d)
    # sprintf("%04x:%06x:%06x:%06x:%06x:%32s") of gid_to_wire_gid, and its NUL: 66 bytes
    assert raw == b"0000:000012:000013:abcdef:000011:00000000000000000000ffff0a000009\x00"
    assert len(raw) == xp.MSG_SIZE and xp.decode_xdest(raw) == d
    assert xp.address_line("local", d) == ("   local: LID 0000, QPN RECV 000012 SEND 000013, "
                                           "PSN abcdef, SRQN 000011, GID ::ffff:10.0.0.9")
    with pytest.raises(DecodeError):
        xp.decode_xdest(b"0000:12:13:zz:11:" + b"0" * 32 + b"\x00")


def test_client_against_a_hand_made_server(env: dict[str, str]) -> None:
    """A peer speaking the C tool's protocol: it reads the client's 66-byte address,
    answers with its own, and at the end reads and echoes ``END``. The client reaches
    no data exchange (the peer has no QPs) but must send a well-formed message first."""
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    got: dict[str, bytes] = {}

    def peer() -> None:
        conn, _ = lst.accept()
        with conn:
            data = b""
            while len(data) < xp.MSG_SIZE:
                data += conn.recv(xp.MSG_SIZE - len(data))
            got["msg"] = data
            conn.sendall(xp.encode_xdest(xp.XDest(0, 0x777, 0x778, 1, 0x779, bytes(16))))
            conn.recv(16)

    t = threading.Thread(target=peer, daemon=True)
    t.start()
    res = subprocess.run(_cmd("-g", "0", "-p", str(port), "--timeout", "5", "127.0.0.1"),
                         env=env, text=True, capture_output=True, timeout=60, check=False)
    t.join(10)
    lst.close()
    d = xp.decode_xdest(got["msg"])
    assert d.gid == bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1]) and d.srqn and d.recv_qpn
    # the peer's GID has no interface id: no GRH, which RoCE refuses, as the C tool does
    assert res.returncode != 0
    assert res.stderr.startswith("softrdma xsrq-pingpong: error: Failed to modify recv QP[0] "
                                 "to RTR"), res.stderr
    assert res.stderr.count("\n") == 1


@pytest.mark.iba("9.8.5", "10.2.9")
def test_two_clients_share_the_servers_xrc_domain(env: dict[str, str]) -> None:
    """``-c 2`` on a shared device: the server sends each client's messages through both
    clients' TGT QPs, half of them into the SRQ of the other client's process (devd hands
    them over: docs/design.md, "XRC domains across processes"); all three succeed."""
    port = str(free_port())
    flags = ["-g", "0", "-p", port, "-n", "8", "-s", "3000", "-m", "1024", "--timeout", "120"]
    server = subprocess.Popen(_cmd(*flags, "-c", "2"), env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    clients: list[subprocess.Popen[str]] = []
    try:
        clients = [subprocess.Popen(_cmd(*flags, "127.0.0.1"), env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                   for _ in range(2)]
        outs = [p.communicate(timeout=300) for p in (server, *clients)]
    finally:
        for p in (server, *clients):
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip((server, *clients), outs, strict=True):
        assert p.returncode == 0, (out, err)
        assert out.splitlines()[-1] == "success", out
    got = [[m.groups() for m in map(LINE.match, out.splitlines()) if m] for out, _ in outs]
    assert [len(x) for x in got] == [4, 2, 2]
    assert ({g[1:] for g in got[0] if g[0] == "remote"}
            == {g[1:] for x in got[1:] for g in x if g[0] == "local"})


@pytest.mark.parametrize("args,msg", [
    (["-c", "2"], "shared across processes only on a device shared through its devd"),
    (["-o"], "isn't ODP capable"),
    (["-n", "0"], "-n must be >= 1"),
    (["-m", "1000"], "bad -s, -i or -m"),
])
def test_refusals(env: dict[str, str], args: list[str], msg: str) -> None:
    # -c 2 on an in-process device: no other process can share its XRC domain
    res = subprocess.run(_cmd("-g", "0", *args), env=dict(env, SOFTRDMA_SHARED="0"),
                         text=True, capture_output=True, timeout=60, check=False)
    assert res.returncode != 0 and msg in res.stderr and "Traceback" not in res.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tcpdump") is None,
                    reason="needs root and tcpdump to capture on lo")
def test_capture_is_followed_by_pcap_check(env: dict[str, str], tmp_path: Path) -> None:
    """tcpdump on lo during a run: pcap-check finds the 66-byte exchange, follows both XRC
    connections (each side's INI QP to the other's TGT QP) PSN by PSN, and passes."""
    udp = registry.get("xsrq0").udp_port
    tcp = 18515  # pcap-check finds the exchange on the tools' default port
    try:
        socket.create_server(("", tcp), family=socket.AF_INET6, dualstack_ipv6=True).close()
    except OSError:
        pytest.skip("TCP port 18515 is in use")
    cap = tmp_path / "xsrq.pcap"

    def pcap_check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "softrdma", "pcap-check", "-v",
                               "--udp-port", str(udp), str(cap)], env=env, text=True,
                              capture_output=True, timeout=120, check=False)

    # --immediate-mode: without it libpcap hands packets over a block at a time (1 s
    # timeout), and a loaded host's tcpdump, stopped soon after the run, wrote none
    dump = subprocess.Popen(["tcpdump", "-i", "lo", "-U", "--immediate-mode", "-B", "16384",
                             "-w", str(cap), f"udp port {udp} or tcp port {tcp}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert dump.stderr is not None
        dump.stderr.readline()  # "listening on lo ..."
        flags = ["-g", "0", "-p", str(tcp), "-n", "10", "-s", "2000", "-m", "1024",
                 "--timeout", "120"]  # each step's bound: generous for a loaded machine
        server = subprocess.Popen(_cmd(*flags), env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        try:
            client = subprocess.run(_cmd(*flags, "127.0.0.1"), env=env, text=True,
                                    capture_output=True, timeout=300, check=False)
            assert server.wait(timeout=300) == 0 and client.returncode == 0, client.stderr
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        # until tcpdump has written the whole run (pcap-check passes), or at most 60 s
        with contextlib.suppress(AssertionError):
            wait_until(lambda: pcap_check().returncode == 0, timeout=60, interval=0.5,
                       what="the whole run in the capture")
    finally:
        dump.terminate()
        dump.wait(timeout=60)
    res = pcap_check()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 connections followed, 0 inconsistent" in res.stdout, res.stdout
    assert "XRC_SEND_FIRST" in res.stdout and "XRC_ACKNOWLEDGE" in res.stdout
