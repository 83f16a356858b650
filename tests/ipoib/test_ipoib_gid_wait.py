"""``softrdma ipoib up`` started right after its interface came up: the IPv6 addresses
are still tentative (duplicate address detection, RFC 4862 §5.4), so the device has no
IPv6 GID yet. It waits a few seconds for one, saying so, and fails with the clear
message only if none comes. Root (a network namespace with a veth pair)."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.ipoib_netns import start, started, wait_up
from harness.netns import Host, Network, skip_reason

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

IF, PEER, DEV, TUN = "sr9a", "sr9b", "rxe9", "sr-ib9"


@pytest.fixture()
def host(tmp_path: Path) -> Iterator[Host]:
    with Network(1, tmp_path, device=False) as net:
        h = net.hosts[0]
        h.run(["ip", "link", "add", IF, "type", "veth", "peer", "name", PEER])
        # DAD on this interface (the namespace turns it off by default), set before its
        # addresses are added: 4 probes, about 4 s
        for key, value in (("accept_dad", "1"), ("dad_transmits", "4")):
            h.run(["sysctl", "-qw", f"net.ipv6.conf.{IF}.{key}={value}"])
        for addr in ("10.99.0.1/24", "fd99::1/64"):
            h.run(["ip", "addr", "add", addr, "dev", IF])
        h.softrdma("link", "add", DEV, "netdev", IF)
        yield h


def _tentative(h: Host) -> bool:
    out = h.run(["ip", "-6", "addr", "show", "dev", IF]).stdout
    return "inet6" in out and all("tentative" in x for x in out.splitlines() if "inet6" in x)


def _up(h: Host, wait_s: float | None = None) -> subprocess.Popen[str]:
    code = ("import runpy, sys\n"
            "import softrdma.drivers.host.ipoib_control as c\n"
            + (f"c.IPV6_WAIT_S = {wait_s}\n" if wait_s is not None else "")
            + f"sys.argv = ['softrdma', 'ipoib', 'up', '{TUN}', '--device', '{DEV}', "
              "'10.88.9.1/24']\n"
            "runpy.run_module('softrdma', run_name='__main__')\n")
    return start(h, [sys.executable, "-c", code])


def test_ipoib_up_waits_for_dad(host: Host) -> None:
    host.run(["ip", "link", "set", PEER, "up"])
    host.run(["ip", "link", "set", IF, "up"])
    assert _tentative(host)  # what `ipoib up` meets right after the interface came up
    p = _up(host)
    try:
        wait_up(host, p, TUN, 60)
        shown = json.loads(host.softrdma("ipoib", "show", TUN, "--json").stdout)
        host.softrdma("ipoib", "down", TUN)
        p.wait(timeout=30)
        err = started(p).output()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert f"softrdma ipoib: waiting up to 10 s for an IPv6 address on {IF}" in err, err
    assert "duplicate address detection" in err
    # it waited for the global address too, whose DAD may end after the link-local one's
    gid = ipaddress.IPv6Address("fd99::1").packed
    assert shown["lladdr"].endswith(":".join(f"{x:02x}" for x in gid)), shown["lladdr"]


def test_ipoib_up_fails_clearly_when_no_ipv6_comes(host: Host) -> None:
    host.run(["ip", "link", "set", IF, "up"])  # its peer stays down: no carrier, DAD waits
    assert _tentative(host)
    p = _up(host, wait_s=0.5)
    try:
        p.wait(timeout=60)
        err = started(p).output()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, err
    assert f"waiting up to 0.5 s for an IPv6 address on {IF}" in err, err
    assert f"device {DEV!r} has no IPv6 GID" in err and "Traceback" not in err, err


def test_ipoib_up_explains_a_gid_table_older_than_the_address(host: Host) -> None:
    """Another program opened the (shared) device while DAD ran: its devd's GID table has
    no IPv6 GID even once the address is usable. The error says so and what to do."""
    host.run(["ip", "link", "set", PEER, "up"])
    host.run(["ip", "link", "set", IF, "up"])
    assert _tentative(host)
    holder = host.spawn([sys.executable, "-c",
                         "import sys\nfrom softrdma import verbs as v\n"
                         f"ctx = v.Context('{DEV}')\nprint(len(ctx.gids), flush=True)\n"
                         "sys.stdin.read()\n"])
    assert holder.line(timeout=60).strip() == "1"  # the IPv4 GID only: IPv6 was still tentative
    deadline = time.monotonic() + 60
    while _tentative(host):
        assert time.monotonic() < deadline, "DAD did not finish"
        time.sleep(0.1)
    p = _up(host)
    try:
        p.wait(timeout=60)
        err = started(p).output()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, err
    assert f"device {DEV!r} has no IPv6 GID" in err, err
    assert re.search(rf"{IF} has (fd99::1|fe80::[0-9a-f:]+) now, but the device's GID table "
                     "was made before it was usable", err), err
    assert "stop the programs using the device so that its devd restarts" in err, err
