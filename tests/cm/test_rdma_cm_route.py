"""rdma_cm address resolution follows the kernel's route (Linux ``rdma_resolve_addr``).

Regression: with the built-in ``softrdma_lo`` listed first, a client resolving a
destination on another interface got ``softrdma_lo`` and source 127.0.0.1, and its first
CM MAD failed with "UDP send ... Invalid argument" (found against the lab's rxe guest:
``softrdma udaddy -s 10.50.0.13`` without ``-b``). Run in a network namespace this test
creates, with a veth interface holding 10.77.0.1/24 and a RoCE device on it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

PROBE = """
import ipaddress, sys
from pathlib import Path
from softrdma.cm.rdma_devices import find_device
from softrdma.drivers.host.registry import Registry
Registry(Path(sys.argv[1])).add("rt0", "v0", "roce", 40123)
for dst in sys.argv[2:]:
    entry, src = find_device(None, ipaddress.ip_address(dst), "roce")
    print(dst, entry.name, src)
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 for a network namespace")


def test_resolution_picks_the_device_of_the_routes_source(tmp_path: Path) -> None:
    ns = f"cmrt-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        setup = ("ip link set lo up && ip link add v0 type veth peer name v1 && "
                 "ip addr add 10.77.0.1/24 dev v0 && ip link set v0 up && ip link set v1 up")
        subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", setup], check=True)
        env = dict(os.environ, SOFTRDMA_STATE_DIR=str(tmp_path), PYTHONPATH=SRC)
        r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", PROBE,
                            str(tmp_path), "10.77.0.9", "127.0.0.1", "10.77.0.1"],
                           env=env, capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["10.77.0.9 rt0 10.77.0.1",       # via v0's route
                                     "127.0.0.1 softrdma_lo 127.0.0.1",  # loopback
                                     "10.77.0.1 rt0 10.77.0.1"]       # our own address


ADDR_PROBE = """
import sys
from pathlib import Path
from softrdma.cm import rdma_cm as rc
from softrdma.drivers.host.registry import Registry
reg = Registry(Path(sys.argv[1]))
reg.delete("softrdma_lo")
reg.add("rtlo", "lo", "roce", 40124)
ch = rc.EventChannel()
for dst in sys.argv[2:]:
    cid = rc.CmId(ch)
    cid.resolve_addr(None, (dst, 7471), 2000)
    ev = ch.get_cm_event(10.0)
    ch.ack(ev)
    print(dst, rc.event_str(ev.event), ev.status)
    cid.destroy()
"""


def test_unroutable_or_deviceless_destination_gives_addr_error(tmp_path: Path) -> None:
    """Issue 25: without a softrdma device on the route, ``resolve_addr`` reports
    RDMA_CM_EVENT_ADDR_ERROR with Linux's status (cma.c ``addr_handler``): -ENODEV (-19)
    when the route leaves through a netdev without a softrdma device
    (``cma_acquire_dev_by_src_ip``), -ENETUNREACH (-101) when there is no route; it used
    to pick any device of the family (ADDR_RESOLVED, then a traceback from connect or
    30 s of silence). ``softrdma rping`` says so as librdmacm's rping does. Nothing is
    sent: the namespace has no route off the box."""
    ns = f"cmae-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        setup = ("ip link set lo up && ip link add v0 type veth peer name v1 && "
                 "ip addr add 10.78.0.1/24 dev v0 && ip link set v0 up && ip link set v1 up")
        subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", setup], check=True)
        env = dict(os.environ, SOFTRDMA_STATE_DIR=str(tmp_path), PYTHONPATH=SRC)
        env.pop("SOFTRDMA_SHARED", None)
        r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", ADDR_PROBE,
                            str(tmp_path), "10.78.0.9", "192.0.2.1", "127.0.0.1"],
                           env=env, capture_output=True, text=True, timeout=60)
        ping = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "softrdma",
                               "rping", "-c", "-a", "10.78.0.9", "-C", "1", "--timeout", "10"],
                              env=env, capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "10.78.0.9 RDMA_CM_EVENT_ADDR_ERROR -19",    # routed via v0: no softrdma device
        "192.0.2.1 RDMA_CM_EVENT_ADDR_ERROR -101",   # no route at all
        "127.0.0.1 RDMA_CM_EVENT_ADDR_RESOLVED 0"]   # the device on lo
    assert ping.returncode == 1, ping.stderr
    assert "cma event RDMA_CM_EVENT_ADDR_ERROR, error -19" in ping.stderr, ping.stderr
    assert "Traceback" not in ping.stderr


CACHE_PROBE = """
import ipaddress, subprocess, sys
from pathlib import Path
from softrdma.cm import rdma_devices as rd
from softrdma.drivers.host.registry import Registry
from softrdma.errors import DeviceError
reads = []
real = rd.get_device_list
rd.get_device_list = lambda: reads.append(1) or real()
reg = Registry(Path(sys.argv[1]))
reg.add("rt0", "v0", "roce", 40125)

def find(dst):
    before = len(reads)
    try:
        entry, src = rd.find_device(None, ipaddress.ip_address(dst), "roce")
        got = f"{entry.name} {src}"
    except DeviceError as exc:
        got = f"errno {exc.errno}"
    print(dst, got, "read" if len(reads) > before else "kept")

find("10.79.0.9")                      # no route yet
find("10.79.0.9")
subprocess.run(["ip", "addr", "add", "10.79.0.1/24", "dev", "v0"], check=True)
find("10.79.0.9")                      # the new address: v0's device
find("10.79.0.9")
subprocess.run(["ip", "addr", "add", "10.80.0.1/24", "dev", "v1"], check=True)
find("10.80.0.9")                      # routed via v1: no device there
reg.add("rt1", "v1", "roce", 40126)
find("10.80.0.9")                      # the registry changed: rt1
subprocess.run(["ip", "addr", "del", "10.79.0.1/24", "dev", "v0"], check=True)
find("10.79.0.9")                      # the address is gone again
"""


def test_device_list_is_kept_until_an_address_or_the_registry_changes(tmp_path: Path) -> None:
    """Issue 26: every ``resolve_addr`` read the registry file and a dozen ``/sys``
    files per device (0.6 ms of a connection's 2-6 ms on the loopback). The list is
    now kept and read again only when rtnetlink reports an interface or address change
    or the registry file is replaced; each change is seen by the very next
    resolution."""
    ns = f"cmca-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        setup = ("ip link set lo up && ip link add v0 type veth peer name v1 && "
                 "ip link set v0 up && ip link set v1 up")
        subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", setup], check=True)
        env = dict(os.environ, SOFTRDMA_STATE_DIR=str(tmp_path), PYTHONPATH=SRC)
        r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CACHE_PROBE,
                            str(tmp_path)], env=env, capture_output=True, text=True,
                           timeout=60)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "10.79.0.9 errno 101 read",
        "10.79.0.9 errno 101 kept",
        "10.79.0.9 rt0 10.79.0.1 read",
        "10.79.0.9 rt0 10.79.0.1 kept",
        "10.80.0.9 errno 19 read",
        "10.80.0.9 rt1 10.80.0.1 read",
        "10.79.0.9 errno 101 read"]
