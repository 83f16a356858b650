"""The tests' ports (harness.ports): below the kernel's ephemeral range, in this worker's
block, free for UDP and TCP when handed out, never a port another socket holds."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from harness import ports


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def test_ports_come_from_the_block_below_the_ephemeral_range() -> None:
    got = [ports.free_port() for _ in range(20)]
    block = ports._block()
    first = ports.BASE + block * ports.BLOCK
    assert all(first <= p < first + ports.BLOCK for p in got), got
    assert max(got) < _ephemeral_low()
    assert len(set(got)) == len(got)  # handed out in turn
    for p in got[:3]:  # each one free for UDP and TCP
        for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
            with socket.socket(socket.AF_INET, kind) as s:
                s.bind(("127.0.0.1", p))


def test_a_held_port_and_the_tools_defaults_are_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = ports.BASE + ports._block() * ports.BLOCK
    held = None
    for off in range(ports.BLOCK):  # a port of the block that is free now: hold it (TCP)
        if ports.port_free(first + off):
            held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.bind(("127.0.0.1", first + off))
            held.listen(1)
            break
    assert held is not None
    try:
        port = held.getsockname()[1]
        monkeypatch.setattr(ports, "_next", port - first)
        assert ports.free_port() != port  # the listener's port is passed over
        monkeypatch.setattr(ports, "_DEFAULTS", frozenset({port + 1, port + 2}))
        monkeypatch.setattr(ports, "_next", port - first)
        got = ports.free_port()
        assert got not in (port, port + 1, port + 2)
    finally:
        held.close()
