"""Two hosts joined directly by one veth pair (no bridge), for the IPoIB tests and
``bench/ipoib_iperf.py``; the hosts are :class:`harness.netns.Host` objects (own
namespace, ``eth0``, ``10.77.0.N/24``, ``fd77::N/64``, own softrdma state directory and
device ``rxe0``). Teardown kills what the hosts started and deletes the namespaces
(which removes the veth pair), even when the test failed. Root only.

Every ``ipoib up`` (:func:`ipoib_up`, or :func:`start` for a wrapped one) writes its stdout
and stderr to a file under its host's state directory (nothing to drain: it never blocks on
a full pipe) and is remembered in :data:`STARTED` until the test phase that tore its host
down is reported: :func:`report` says, for each, whether it still runs or how it ended, and
the tail of its output (tests/conftest.py puts that in every failure's report, so an
interface process that died shows its traceback, not just a stalled transfer)."""

from __future__ import annotations

import ipaddress
import itertools
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.netns import DEVICE, IFNAME, PREFIX, Host, sweep_stale

__all__ = ["veth_pair", "ipoib_up", "wait_up", "IFACE", "start", "Started", "STARTED",
           "report", "forget_torn_down"]

IFACE = "sr-ib0"
TAIL = 40  # lines of an `ipoib up`'s output that :func:`report` shows


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


@dataclass
class Started:
    """An ``ipoib up`` that :func:`start` started: its host, process and output file."""

    host: Host
    proc: subprocess.Popen[str]
    log: Path

    def status(self) -> str:
        """``still running``, ``killed at teardown``, or how it ended by itself."""
        if self.proc in self.host.killed:
            return "still running at teardown (killed then)"
        rc = self.proc.poll()
        if rc is None:
            return "still running"
        if rc < 0:
            try:
                return f"exited {rc} (killed by {signal.Signals(-rc).name})"
            except ValueError:
                pass
        return f"exited {rc}"

    def output(self) -> str:
        """Everything it wrote so far (stdout and stderr, in order)."""
        return self.log.read_text(errors="replace")

    def describe(self, tail: int = TAIL) -> str:
        """Its host, pid and status, then the last ``tail`` lines of its output."""
        lines = self.output().splitlines()
        shown = "".join(f"\n  {x}" for x in lines[-tail:])
        return (f"{self.host.name}: ipoib up (pid {self.proc.pid}): {self.status()}; the last "
                f"{min(tail, len(lines))} of {len(lines)} lines of its stdout and stderr "
                f"({self.log}):{shown}")


#: the ``ipoib up`` processes of hosts not yet torn down (and of those torn down since the
#: last :func:`forget_torn_down`), in the order they started
STARTED: list[Started] = []
_serial = itertools.count(1)


def start(h: Host, args: Sequence[str]) -> subprocess.Popen[str]:
    """Start ``args`` (an ``ipoib up``, perhaps wrapped) on ``h`` in the background, its
    stdout and stderr going to ``ipoib-up-N.log`` in the host's state directory, and
    remember it in :data:`STARTED`."""
    log = h.state_dir / f"ipoib-up-{next(_serial)}.log"
    p = h.popen(args, log=log)
    STARTED.append(Started(h, p, log))
    return p


def started(p: subprocess.Popen[str]) -> Started:
    """The :data:`STARTED` entry of ``p`` (KeyError if :func:`start` did not start it)."""
    for s in STARTED:
        if s.proc is p:
            return s
    raise KeyError(p.pid)


def ipoib_up(h: Host, *extra: str, addresses: Sequence[str] | None = None,
             timeout: float = 120.0) -> subprocess.Popen[str]:
    """Start ``softrdma ipoib up sr-ib0`` on ``h`` (10.88.0.N/24, fd88::N/64 by default)
    and wait until it answers ``show``."""
    addrs = list(addresses) if addresses is not None else [f"10.88.0.{h.index}/24",
                                                             f"fd88::{h.index}/64"]
    p = start(h, [sys.executable, "-m", "softrdma", "ipoib", "up", IFACE, "--device", DEVICE,
                  *addrs, *extra])
    wait_up(h, p, IFACE, timeout)
    return p


def wait_up(h: Host, p: subprocess.Popen[str], iface: str, timeout: float) -> None:
    """Until the ``ipoib up`` :func:`start` started as ``p`` answers ``show`` for ``iface``
    (AssertionError with its :meth:`Started.describe` if it exits or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise AssertionError(started(p).describe())
        if h.softrdma("ipoib", "show", iface, "--json", check=False).returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"ipoib up did not answer show within {timeout:g} s: "
                         + started(p).describe())


def report() -> str:
    """Every remembered ``ipoib up`` (:meth:`Started.describe`), for a failure report; empty
    if none."""
    return "\n\n".join(s.describe() for s in STARTED)


def forget_torn_down() -> None:
    """Forget the processes whose host was torn down (:meth:`Host.kill_all` empties its
    ``procs``): call it once the report that may show them is made."""
    STARTED[:] = [s for s in STARTED if s.proc in s.host.procs]
