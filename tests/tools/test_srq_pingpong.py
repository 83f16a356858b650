"""``softrdma srq-pingpong`` (``ibv_srq_pingpong``, issue 14): server and client with
RC QPs sharing an SRQ (polling and ``-e`` events), the C tool's exchange of 256
52-byte addresses (checked byte for byte against a hand-made peer), and its errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from harness.device import private_device
from harness.ports import free_port

from softrdma.tools.ibverbs import srq_pingpong as sp
from softrdma.tools.ibverbs.pingpong import MSG_LEN, Dest, decode_dest, encode_dest

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    private_device("srq0", tmp_path, monkeypatch, subprocesses=False)
    return dict(os.environ, PYTHONPATH=SRC)


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "softrdma", "srq-pingpong", "-d", "srq0", *args]


@pytest.mark.parametrize("extra", [[], ["-e"]])
def test_server_and_client(env: dict[str, str], extra: list[str]) -> None:
    port = str(free_port())
    flags = ["-g", "0", "-p", port, "-q", "3", "-n", "60", "-s", "512", *extra]
    server = subprocess.Popen(_cmd(*flags), env=env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        client = subprocess.run(_cmd(*flags, "127.0.0.1"), env=env, text=True,
                                capture_output=True, timeout=120, check=False)
        sout, serr = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert client.returncode == 0, client.stderr
    assert server.returncode == 0, serr
    for out in (client.stdout, sout):
        lines = out.splitlines()
        assert len(lines) == 3 + 3 + 2
        assert all(ln.startswith("  local address:  LID 0x0000, QPN 0x") for ln in lines[:3])
        assert all(ln.startswith("  remote address: LID 0x0000, QPN 0x") for ln in lines[3:6])
        assert lines[6].startswith("61440 bytes in ")  # 512 * 60 * 2
        assert lines[7].startswith("60 iters in ")
    # each side's remote QPNs are the other side's local ones
    cl = [ln.split("QPN ")[1][:8] for ln in client.stdout.splitlines()[:6]]
    sv = [ln.split("QPN ")[1][:8] for ln in sout.splitlines()[:6]]
    assert cl[:3] == sv[3:6] and sv[:3] == cl[3:6]


def test_exchange_is_the_c_tools(env: dict[str, str]) -> None:
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    got: dict[str, bytes] = {}
    theirs = [Dest(0, 0x100 + i, 0x200 + i, bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 9]))
              for i in range(5)]

    def peer() -> None:
        conn, _ = lst.accept()
        with conn:
            data = b""
            while len(data) < sp.MAX_QP * MSG_LEN:
                data += conn.recv(65536)
            got["in"] = data
            conn.sendall(b"".join(encode_dest(d) for d in theirs)
                         + encode_dest(Dest(0, 0, 0, bytes(16))) * (sp.MAX_QP - len(theirs)))
            got["done"] = conn.recv(16)

    t = threading.Thread(target=peer)
    t.start()
    mine = [Dest(0, 0x11 + i, 0x33 + i, bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1]))
            for i in range(2)]
    rem = sp.exchange_client("127.0.0.1", port, mine, 30)
    t.join(30)
    lst.close()
    msgs = [got["in"][i:i + MSG_LEN] for i in range(0, len(got["in"]), MSG_LEN)]
    assert len(msgs) == 256 and [decode_dest(m) for m in msgs[:2]] == mine
    assert msgs[2] == b"0000:000000:000000:" + b"0" * 32 + b"\0"
    assert got["done"] == b"done\0"
    assert len(rem) == 256 and rem[:5] == theirs


def test_errors(env: dict[str, str]) -> None:
    bad = subprocess.run(_cmd("-q", "8", "-r", "4"), env=env, text=True, capture_output=True,
                         timeout=60, check=False)
    assert bad.returncode == 1
    assert bad.stderr.strip() == ("softrdma srq-pingpong: error: rx_depth 4 is too small for "
                                  "8 QPs -- must have at least one receive per QP.")
    # no -g on RoCE: GID index 0, as rc-pingpong (issue 24; the C tool would fail at RTR)
    port = str(free_port())
    server = subprocess.Popen(_cmd("-p", port, "-q", "2", "-n", "5"), env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        client = subprocess.run(_cmd("-p", port, "-q", "2", "-n", "5", "127.0.0.1"), env=env,
                                text=True, capture_output=True, timeout=60, check=False)
        _, serr = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, serr
    assert client.returncode == 0, client.stderr
