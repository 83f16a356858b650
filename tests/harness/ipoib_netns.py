"""Two hosts joined directly by one veth pair (no bridge), for the IPoIB tests and
``bench/ipoib_iperf.py``; the hosts are :class:`harness.netns.Host` objects (own
namespace, ``eth0``, ``10.77.0.N/24``, ``fd77::N/64``, own softrdma state directory and
device ``rxe0``). Teardown kills what the hosts started and deletes the namespaces
(which removes the veth pair), even when the test failed. Root only."""

from __future__ import annotations

import ipaddress
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from harness.netns import DEVICE, IFNAME, PREFIX, Host, sweep_stale

__all__ = ["veth_pair", "ipoib_up", "IFACE"]

IFACE = "sr-ib0"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextmanager
def veth_pair(workdir: Path, mtu: int = 9000) -> Iterator[list[Host]]:
    sweep_stale()
    tag = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
    hosts: list[Host] = []
    try:
        for i in (1, 2):
            ns = f"{tag}v{i}"
            _ip("netns", "add", ns)
            h = Host(i, ns, f"02:78:00:00:00:{i:02x}", f"10.77.0.{i}",
                     str(ipaddress.IPv6Address(f"fd77::{i}")), workdir / f"host{i}")
            h.state_dir.mkdir(parents=True, exist_ok=True)
            hosts.append(h)
            for key in ("all", "default"):
                subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                                f"net.ipv6.conf.{key}.accept_dad=0"], check=True,
                               capture_output=True, timeout=30)
            _ip("-n", ns, "link", "set", "lo", "up")
        a, b = hosts
        _ip("link", "add", IFNAME, "netns", a.ns, "address", a.mac, "mtu", str(mtu), "type",
            "veth", "peer", "name", IFNAME, "netns", b.ns, "address", b.mac, "mtu", str(mtu))
        for h in hosts:
            _ip("-n", h.ns, "addr", "add", f"{h.ipv4}/24", "dev", IFNAME)
            _ip("-n", h.ns, "addr", "add", f"{h.ipv6}/64", "dev", IFNAME, "nodad")
            _ip("-n", h.ns, "link", "set", IFNAME, "up")
        deadline = time.monotonic() + 60
        for h in hosts:
            while "fe80::" not in subprocess.run(
                    ["ip", "-n", h.ns, "-6", "addr", "show", "dev", IFNAME], capture_output=True,
                    text=True, timeout=30).stdout and time.monotonic() < deadline:
                time.sleep(0.05)
            h.softrdma("link", "add", DEVICE, "netdev", IFNAME)
        yield hosts
    finally:
        for h in hosts:
            h.kill_all()
        for h in hosts:
            subprocess.run(["ip", "netns", "del", h.ns], capture_output=True, timeout=30)


def ipoib_up(h: Host, *extra: str, addresses: Sequence[str] | None = None,
             timeout: float = 120.0) -> subprocess.Popen[str]:
    """Start ``softrdma ipoib up sr-ib0`` on ``h`` (10.88.0.N/24, fd88::N/64 by default)
    and wait until it answers ``show``."""
    addrs = list(addresses) if addresses is not None else [f"10.88.0.{h.index}/24",
                                                             f"fd88::{h.index}/64"]
    p = h.popen([sys.executable, "-m", "softrdma", "ipoib", "up", IFACE, "--device", DEVICE,
                 *addrs, *extra])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise AssertionError(f"ipoib up exited {p.returncode}: {p.communicate()[1]}")
        if h.softrdma("ipoib", "show", IFACE, "--json", check=False).returncode == 0:
            return p
        time.sleep(0.2)
    raise AssertionError("ipoib up did not come up")
