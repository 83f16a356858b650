"""Sockets in a deep state directory (``softrdma.drivers.host.unix_path``): a path past
``sun_path``'s 107 octets made devd and ``softrdma ipoib up`` fail with "AF_UNIX path too
long" (seen under pytest-xdist, whose temporary directories grow with its run number)."""

from __future__ import annotations

import os
import select
import socket
import threading
from pathlib import Path

import pytest
from harness.devd import LOCAL, packet, recv_one, start_devd

from softrdma.drivers.host.ipoib_control import ControlServer, control_path, control_request
from softrdma.drivers.host.unix_path import SUN_PATH_MAX, bind_unix, connect_unix


def deep(tmp_path: Path) -> Path:
    d = tmp_path / ("d" * 60) / ("e" * 60)
    d.mkdir(parents=True)
    return d


def test_bind_and_connect_past_sun_path(tmp_path: Path) -> None:
    path = deep(tmp_path) / "s.sock"
    assert len(os.fsencode(path)) > SUN_PATH_MAX
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as cli:
        bind_unix(srv, path)
        srv.listen(1)
        assert path.exists()  # the socket is in the directory named, not elsewhere
        connect_unix(cli, path)
        conn, _ = srv.accept()
        with conn:
            cli.sendall(b"x")
            assert conn.recv(1) == b"x"


def test_short_paths_are_used_as_they_are(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        bind_unix(s, tmp_path / "s.sock")
        assert s.getsockname() == str(tmp_path / "s.sock")


def test_missing_directory_is_an_oserror(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s, pytest.raises(OSError):
        connect_unix(s, tmp_path / ("m" * 120) / "s.sock")


def test_ipoib_control_in_a_deep_state_dir(tmp_path: Path) -> None:
    state = deep(tmp_path)
    path = control_path("sr-ib0", state)
    assert len(os.fsencode(path)) > SUN_PATH_MAX
    server = ControlServer(path)
    answers: list[dict[str, object]] = []
    t = threading.Thread(target=lambda: answers.append(
        control_request("sr-ib0", "show", directory=state)))
    try:
        t.start()
        select.select([server.fileno()], [], [], 60)
        server.serve(lambda cmd: {"cmd": cmd})
        t.join(60)
        assert answers == [{"cmd": "show"}]
    finally:
        server.close()


def test_devd_in_a_deep_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = deep(tmp_path)
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(state))
    monkeypatch.setenv("SOFTRDMA_DEVD_DIRECT", "0")
    r = start_devd(state, name="deep0")
    try:
        assert len(os.fsencode(r.devd.socket_path)) > SUN_PATH_MAX
        with r.client() as a, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            to_a = packet(a.alloc_qpn(), b"deep")
            sender.sendto(to_a, (LOCAL, r.devd.udp_port))
            assert bytes(recv_one(a, timeout=60).data) == to_a
    finally:
        r.devd.shutdown()
        r.thread.join(60)
