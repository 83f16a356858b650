"""Shared pieces of the perftest tests: a private RoCE device on lo (free UDP port, its own
SOFTRDMA_STATE_DIR), spawning ``softrdma <tool>`` processes, and the TCP payloads of the
captures (``../shared/captures/roce_*_bw.pcap``)."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from harness.ports import free_port
from softrdma.wire.pcap import read_pcap

SRC = str(Path(__file__).resolve().parents[2] / "src")
CAPTURES = Path("/work/shared/captures")
OOB_PORT = 18515
ETH_IPV4 = b"\x08\x00"
IPPROTO_TCP = 6


def make_device(state: Path, name: str = "pttest") -> str:
    """A registry with only ``name`` (RoCE on lo, a free UDP port)."""
    from softrdma.drivers.host.registry import Registry

    reg = Registry(state)
    reg.delete("softrdma_lo")
    reg.add(name, "lo", "roce", free_port())  # free on 127.0.0.1 and ::1
    return name


def env_for(state: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    env["SOFTRDMA_STATE_DIR"] = str(state)
    env["SOFTRDMA_SHARED"] = "1"
    return env


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "softrdma", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run_pair(tool: str, state: Path, extra: list[str], *, timeout: float = 120.0,
             server_extra: list[str] | None = None) -> tuple[
                 subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """Server and client of ``tool`` as two processes; (server, client) results."""
    env = env_for(state)
    port = free_port()
    common = [tool, "-p", str(port), "--timeout", "40", *extra]
    procs = [spawn([*common, *(server_extra or [])], env)]
    try:
        procs.append(spawn([*common, "127.0.0.1"], env))  # it retries until the server listens
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return (subprocess.CompletedProcess(procs[0].args, procs[0].returncode, *outs[0]),
            subprocess.CompletedProcess(procs[1].args, procs[1].returncode, *outs[1]))


def device_state(state: Path) -> Iterator[Path]:
    """A fixture's body: ``state`` holding the test device (:func:`make_device`), whose
    devd daemons are stopped at the end."""
    make_device(state)
    try:
        yield state
    finally:
        kill_devd(state)


def kill_devd(state: Path) -> None:
    """Stop the devd daemons the test's processes started (by their pid files)."""
    for pidfile in state.glob("*.pid"):
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, 15)
        except (OSError, ValueError):
            continue
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                break
            time.sleep(0.05)


def tcp_payloads(path: Path, port: int = OOB_PORT) -> list[tuple[int, str, bytes]]:
    """(frame, "c" for client->server or "s", payload) of every TCP segment to/from
    ``port`` with data (Ethernet + IPv4 captures)."""
    out: list[tuple[int, str, bytes]] = []
    for rec in read_pcap(path):
        d = rec.data
        if d[12:14] != ETH_IPV4:
            continue
        ip = d[14:]
        ihl = (ip[0] & 0xF) * 4
        if ip[9] != IPPROTO_TCP:
            continue
        total = struct.unpack(">H", ip[2:4])[0]
        tcp = ip[ihl:total]
        sport, dport = struct.unpack(">HH", tcp[:4])
        payload = bytes(tcp[(tcp[12] >> 4) * 4:])
        if payload and port in (sport, dport):
            out.append((rec.index, "c" if dport == port else "s", payload))
    return out


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"peer closed after {len(buf)}/{n} bytes")
        buf += chunk
    return buf
