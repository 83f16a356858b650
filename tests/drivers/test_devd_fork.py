"""A process that forks without exec while it holds a shared device (drivers/devd/client.py
``_after_fork_in_child``): the child gives up its copies of the link's sockets, so devd
sees the parent's close at once and the reuseport group keeps following devd's mirror
(drivers/devd/reuseport.py); the child that uses the inherited device gets ClosedError naming
fork. devd runs as its own process, as it does for users."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time
from pathlib import Path

import pytest
from harness.device import private_device

from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.devd.proto import OP_COUNTERS
from softrdma.drivers.host.registry import Registry
from softrdma.errors import ClosedError

LOCAL = "127.0.0.1"


def _packet(qpn: int) -> bytes:
    """A BTH (SEND ONLY) to ``qpn`` and a little payload: what the BPF program reads."""
    return bytes([0x04, 0, 0xFF, 0xFF, 0]) + qpn.to_bytes(3, "big") + bytes(4) + b"fork"


def _qpns_received(link: DevdLink, n: int, timeout: float = 3.0) -> set[int]:
    fd = link.fileno()
    assert fd is not None
    got: set[int] = set()
    count = 0
    deadline = time.monotonic() + timeout
    while count < n:
        batch = link.recv_batch(64)
        count += len(batch)
        got |= {int.from_bytes(d.data[5:8], "big") for d in batch}
        if batch:
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{count} of {n} datagrams arrived")
        select.select([fd], [], [], left)
    return got


def _clients(state: Path, name: str) -> int:
    """The processes connected to devd now (the COUNTERS answer's gauge), the probe's
    own connection left out."""
    rec = Registry(state).get(name)
    with DevdLink(rec, state_dir=state, spawn=False, direct=False) as probe:
        _, body = probe._request(OP_COUNTERS)
        return int(json.loads(body)["clients"]) - 1


def _read_report(r: int) -> dict[str, object]:
    got = b""
    while not got.endswith(b"}"):  # the child keeps its end open: read what it wrote
        chunk = os.read(r, 4096)
        if not chunk:
            break
        got += chunk
    report: dict[str, object] = json.loads(got or b"{}")
    return report


def test_child_after_fork_gives_up_the_inherited_link(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    name = private_device("fk0", tmp_path, monkeypatch)
    monkeypatch.delenv("SOFTRDMA_DEVD_DIRECT", raising=False)
    state = tmp_path / "state"
    rec = Registry(state).get(name)
    links = {n: DevdLink(rec, state_dir=state) for n in "abc"}
    pid = 0
    try:
        assert all(link.direct for link in links.values())
        qpns = {n: link.alloc_qpn() for n, link in links.items()}
        b = links["b"]
        ep = b.fileno()
        assert ep is not None
        fds = [ep, b._ctrl.fileno(), b._data.fileno(),
               *(s.fileno() for link in b._direct for s in link._socks.values())]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what it holds, then outlive the parent's close
            try:
                still_open = []
                for fd in fds:
                    try:
                        os.fstat(fd)
                        still_open.append(fd)
                    except OSError:
                        pass
                try:
                    b.alloc_qpn()
                    why = "no error"
                except ClosedError as exc:
                    why = str(exc)
                os.write(w, json.dumps({"open": still_open, "why": why}).encode())
                time.sleep(60)  # killed by the parent
            finally:
                os._exit(0)
        os.close(w)
        report = _read_report(r)
        os.close(r)
        assert report.get("open") == [], report
        why = str(report["why"])
        assert "fork()" in why and str(os.getpid()) in why, why
        assert _clients(state, name) == 3
        links.pop("b").close()  # the middle one: the kernel moves c into its index
        deadline = time.monotonic() + 5
        while _clients(state, name) != 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        # devd saw the close while the child lives (a copy of b's sockets there would
        # hide it until the child exits, and keep b's socket in the reuseport group)
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)
        assert _clients(state, name) == 2
        del qpns["b"]
        time.sleep(0.1)
        port = Registry(state).get(name).udp_port
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            tx.bind((LOCAL, 0))
            for _ in range(20):
                for q in qpns.values():
                    tx.sendto(_packet(q), (LOCAL, port))
        for n, link in links.items():
            assert _qpns_received(link, 20) == {qpns[n]}, n
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for link in links.values():
            link.close()
        pidfile = state / f"{name}.pid"
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
