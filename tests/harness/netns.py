"""Many hosts on one machine: network namespaces joined by a bridge (issue 11, "Many hosts").

:class:`Network` builds ``n`` hosts. Each host is a network namespace with its own
``eth0`` (a veth whose peer sits on a bridge in a separate "switch" namespace, so the
machine's own namespace is never touched), a locally administered MAC, an IPv4 address
(``10.77.0.N/24``), a unique-local IPv6 address (``fd77::N/64``) and its IPv6 link-local
address. IPv6 duplicate address detection is off, so the addresses are usable at once.
Each host has its own softrdma state directory (registry and devd sockets), so every host
runs its own device (``rxe0`` on ``eth0``, RoCEv2) and its own devd; with ``v1_device``
also ``rxe1`` on ``eth0`` speaking RoCEv1.

Programs run inside a host with ``ip netns exec``: :meth:`Host.run` (waits) and
:meth:`Host.popen` (a background process the network kills on teardown). Teardown kills
the processes the harness started (and the devd daemons of its hosts, by their pid files),
then deletes the namespaces, which removes every veth and the bridge; it runs even when
the test failed. Names are unique per run (``srmh<pid><random>``), and namespaces left by
a killed earlier run (whose pid is gone) are swept on the next start.

Root only: :func:`skip_reason` says why not otherwise.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

PREFIX = "srmh"
IFNAME = "eth0"
DEVICE = "rxe0"  # RoCEv2 (UDP 4791) on eth0
DEVICE_V1 = "rxe1"  # RoCEv1 (EtherType 0x8915) on eth0, with v1_device
GID_IDX_V1_LINK_LOCAL = 0  # a RoCEv1 device's first GID: fe80:: + modified EUI-64 of the MAC
SRC = str(Path(__file__).resolve().parents[2] / "src")
TESTS = str(Path(__file__).resolve().parents[1])
# GID table of a host's device (softrdma.verbs.device.gid_table, rxe's order):
GID_IDX_LINK_LOCAL = 0
GID_IDX_IPV4 = 1
GID_IDX_IPV6 = 2


def skip_reason() -> str | None:
    """Why the multi-host tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "multi-host tests need root (network namespaces, veth, bridge); CI runs as root"
    if shutil.which("ip") is None:
        return "multi-host tests need iproute2's `ip`"
    return None


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res


def _sysctl(ns: str, key: str, value: str) -> None:
    path = "/proc/sys/" + key.replace(".", "/")
    subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", f"echo {value} > {path}"],
                   capture_output=True, timeout=30, check=True)


def sweep_stale() -> None:
    """Delete namespaces of earlier runs whose process is gone."""
    res = _ip("netns", "list", check=False)
    for line in res.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX):
            continue
        digits = name[len(PREFIX):].split("x", 1)[0]
        if digits.isdigit() and not Path(f"/proc/{digits}").exists():
            _ip("netns", "del", name, check=False)


class Lines:
    """The stdout lines of a background process, read by a thread (no buffering traps)."""

    def __init__(self, p: subprocess.Popen[str]) -> None:
        self.proc = p
        self._q: queue.Queue[str | None] = queue.Queue()
        assert p.stdout is not None
        out = p.stdout

        def pump() -> None:
            for line in out:
                self._q.put(line)
            self._q.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def line(self, timeout: float = 15.0) -> str:
        """The next line; AssertionError (with stderr) if none comes in ``timeout`` s."""
        try:
            got = self._q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"process silent for {timeout} s") from None
        if got is None:
            self._q.put(None)
            err = self.proc.stderr.read() if self.proc.stderr is not None else ""
            raise AssertionError(f"process exited {self.proc.wait()}: {err}")
        return got

    def json(self, timeout: float = 15.0) -> dict[str, object]:
        got: dict[str, object] = json.loads(self.line(timeout))
        return got

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()


@dataclass
class Host:
    """One host: its namespace, interface and addresses, and softrdma state directory."""

    index: int
    ns: str
    mac: str
    ipv4: str
    ipv6: str
    state_dir: Path
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    #: the processes :meth:`kill_all` found still running (and killed): teardown's doing
    killed: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"host{self.index}"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, TESTS, env.get("PYTHONPATH")) if p)
        env["SOFTRDMA_STATE_DIR"] = str(self.state_dir)
        env.pop("SOFTRDMA_SHARED", None)
        if extra:
            env.update(extra)
        return env

    def _cmd(self, args: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *args]

    def run(self, args: Sequence[str], timeout: float = 60.0, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``args`` inside the host and wait; output captured as text."""
        res = subprocess.run(self._cmd(args), capture_output=True, text=True, timeout=timeout,
                             env=self.env(env), check=False, stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise AssertionError(f"{self.name}: {' '.join(args)} exited {res.returncode}\n"
                                 f"stdout: {res.stdout}\nstderr: {res.stderr}")
        return res

    def popen(self, args: Sequence[str], env: dict[str, str] | None = None,
              stdin: bool = False, log: Path | None = None) -> subprocess.Popen[str]:
        """Start ``args`` inside the host in the background (killed at teardown). Its stdout
        and stderr are pipes, or with ``log`` both go to that file (nothing to drain, never
        blocked on a full pipe, readable at any time; the process's ``stdout`` and ``stderr``
        are then None)."""
        with contextlib.ExitStack() as files:
            out: IO[str] | int = files.enter_context(log.open("w")) if log else subprocess.PIPE
            p = subprocess.Popen(self._cmd(args), stdout=out,
                                 stderr=subprocess.STDOUT if log else subprocess.PIPE,
                                 stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                 text=True, env=self.env(env), start_new_session=True)
        self.procs.append(p)
        return p

    def spawn(self, args: Sequence[str], env: dict[str, str] | None = None) -> Lines:
        """:meth:`popen` with stdin, and its stdout read line by line."""
        return Lines(self.popen(args, env, stdin=True))

    def listening_tcp(self) -> set[int]:
        """The TCP ports something listens on inside the host (/proc/net/tcp{,6})."""
        out = self.run(["cat", "/proc/net/tcp", "/proc/net/tcp6"], timeout=30).stdout
        ports = set()
        for line in out.splitlines()[1:]:
            f = line.split()
            if len(f) > 3 and f[3] == "0A" and ":" in f[1]:  # TCP_LISTEN
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
        return ports

    def wait_tcp_listen(self, port: int, proc: subprocess.Popen[str] | None = None,
                        timeout: float = 30.0) -> None:
        """Until a TCP listener on ``port`` exists (AssertionError if ``proc`` exits)."""
        deadline = time.monotonic() + timeout
        while port not in self.listening_tcp():
            if proc is not None and proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"{self.name}: server exited {proc.returncode}: {err}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: nothing listens on TCP {port}")
            time.sleep(0.05)

    def softrdma(self, *args: str, timeout: float = 60.0,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        """``python -m softrdma ARGS`` inside the host."""
        return self.run([sys.executable, "-m", "softrdma", *args], timeout=timeout, check=check)

    def gid(self, family: int) -> str:
        """This host's RoCEv2 GID for IPv4 (4) or IPv6 (6)."""
        return f"::ffff:{self.ipv4}" if family == 4 else self.ipv6

    def link_local_gid(self) -> str:
        """The RoCEv1 link-local GID: fe80:: + the modified EUI-64 of the MAC (Annex A16; ../shared/specs/roce.md §4)."""
        mac = bytes.fromhex(self.mac.replace(":", ""))
        eui = bytes([mac[0] ^ 0x02]) + mac[1:3] + b"\xff\xfe" + mac[3:]
        return str(ipaddress.IPv6Address(b"\xfe\x80" + bytes(6) + eui))

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                self.killed.append(p)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.communicate(timeout=5)
        self.procs.clear()
        self.stop_devd()

    def stop_devd(self, timeout: float = 5.0) -> None:
        """Kill the devd daemons this host's programs started (detached: their pids are in
        the host's state directory) and wait until they are gone."""
        for pid_file in self.state_dir.glob("*.pid"):
            try:
                pid = int(pid_file.read_text().strip())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (ValueError, OSError):
                continue
            if b"softrdma.drivers.devd.daemon" not in cmdline:
                continue
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.02)


class Network:
    """``n`` hosts on one bridge (see the module docstring). A context manager."""

    def __init__(self, n: int, workdir: Path, *, device: bool = True,
                 v1_device: bool = False) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        self.tag = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
        self.switch = f"{self.tag}sw"
        self.hosts: list[Host] = []
        self.workdir = workdir
        self._n = n
        self._device = device
        self._v1_device = v1_device

    def __enter__(self) -> Network:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        sweep_stale()
        _ip("netns", "add", self.switch)
        _ip("link", "set", "lo", "up", ns=self.switch)
        # a plain learning switch: no IGMP/MLD snooping, no STP delay
        _ip("link", "add", "br0", "type", "bridge", "stp_state", "0", "mcast_snooping", "0",
            "forward_delay", "0", ns=self.switch)
        _ip("link", "set", "br0", "up", ns=self.switch)
        for i in range(1, self._n + 1):
            ns = f"{self.tag}h{i}"
            host = Host(i, ns, f"02:77:00:00:00:{i:02x}", f"10.77.0.{i}",
                        str(ipaddress.IPv6Address(f"fd77::{i}")), self.workdir / f"host{i}")
            host.state_dir.mkdir(parents=True, exist_ok=True)
            _ip("netns", "add", ns)
            self.hosts.append(host)
            for key in ("net.ipv6.conf.all.accept_dad", "net.ipv6.conf.default.accept_dad"):
                _sysctl(ns, key, "0")
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("link", "add", IFNAME, "address", host.mac, "netns", ns, "type", "veth",
                "peer", "name", f"p{i}", "netns", self.switch)
            _ip("link", "set", f"p{i}", "master", "br0", "up", ns=self.switch)
            _ip("addr", "add", f"{host.ipv4}/24", "dev", IFNAME, ns=ns)
            _ip("addr", "add", f"{host.ipv6}/64", "dev", IFNAME, "nodad", ns=ns)
            _ip("link", "set", IFNAME, "up", ns=ns)
        self._wait_ready()
        if self._device:
            for h in self.hosts:
                h.softrdma("link", "add", DEVICE, "netdev", IFNAME)
        if self._v1_device:  # a second device on eth0 speaking RoCEv1 (Annex A16)
            for h in self.hosts:
                h.softrdma("link", "add", DEVICE_V1, "netdev", IFNAME, "roce_ver", "1")

    def _wait_ready(self, timeout: float = 10.0) -> None:
        """Until every host's IPv6 addresses (link-local included) are usable."""
        deadline = time.monotonic() + timeout
        for h in self.hosts:
            while True:
                out = _ip("-6", "addr", "show", "dev", IFNAME, ns=h.ns).stdout
                if "tentative" not in out and "fe80::" in out:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{h.name}: IPv6 addresses not ready: {out}")
                time.sleep(0.05)

    def pairs(self) -> Iterator[tuple[Host, Host]]:
        """Every ordered pair of distinct hosts... once per unordered pair."""
        for i, a in enumerate(self.hosts):
            for b in self.hosts[i + 1:]:
                yield a, b

    def close(self) -> None:
        for h in self.hosts:
            h.kill_all()
        for h in self.hosts:
            _ip("netns", "del", h.ns, check=False)
        _ip("netns", "del", self.switch, check=False)
        self.hosts.clear()
