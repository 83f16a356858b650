"""Control of the Linux RDMA lab (not part of softrdma: docs/interop-lab.md) for the interop suite.

The suite drives the lab's own scripts: ``build.sh`` builds (or reuses) the guest image,
``run.sh boot/stop`` boots and stops guests; commands run in them as ``run.sh ssh`` does
(:meth:`Lab.ssh_argv`: the same key and options over one shared connection).
softrdma runs in a network namespace of its own (:class:`HostSide`), joined to the lab's
data bridge ``br0`` by a veth pair, at ``10.50.0.2N`` for guest ``gN`` (the lab numbers
guests ``10.50.0.1N``, ``N`` = 1..9; the lab's host address 10.50.0.1 may be in use by a
softrdma device of someone else, whose devd owns UDP 4791 there). So a suite run
coexists with a lab left running and with other users of the lab: it touches only its
guest, its namespace, its veth and its state directory.

Captures are taken with tcpdump on the guest's tap ``tap-gN`` inside the lab namespace
(as ``run.sh cap-start`` does), filtered on the suite's host address, so traffic of
other users of the lab is never mixed in.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SoftRdmaError

__all__ = [
    "LabError", "Lab", "HostSide", "GuestProcess", "Capture", "locate_shared",
    "guest_ip", "host_ip", "LAB_NETNS", "MAX_GUEST", "netns_exists",
]

LAB_NETNS = "rdmalab"
MAX_GUEST = 9  # run.sh: N = 1..9 (MAC 52:54:00:00:00:0N)
DEFAULT_CACHE = Path("/var/cache/softrdma-lab")
BUILD_TIMEOUT = 1800.0
BOOT_TIMEOUT = 1500.0  # at most, however busy the host (the test's budget is 1800 s)
BOOT_STALL = 300.0  # a boot fails once the console is silent this long (x the host's load)
RESCUE_INTERVAL = 30.0
SERIAL_BYTE_DELAY = 0.05
RESCUE_LINE = b"\nsystemctl is-failed -q lab-net.service && /usr/local/sbin/lab-net\n"
SSH_TIMEOUT = 60.0
SSH_CONNECT_TIMEOUT = 30
KILL_GRACE = 3.0


def netns_exists(name: str) -> bool:
    """True if network namespace ``name`` exists (``ip netns list``)."""
    cp = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return any(ln.split()[0] == name for ln in cp.stdout.splitlines() if ln.strip())


def load_factor() -> float:
    """The host's 1-minute load average per core, at least 1: how much slower than on
    an idle host an emulated guest runs now."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


class LabError(SoftRdmaError):
    """The lab cannot be built, booted or reached."""


def ctl_ip(n: int) -> str:
    """The control address of guest ``gN`` (run.sh ``ctl_ip``: ssh only)."""
    return f"192.168.77.1{n}"


def guest_ip(n: int) -> str:
    """The data address of guest ``gN`` (run.sh ``data_ip``)."""
    return f"10.50.0.1{n}"


def host_ip(n: int) -> str:
    """The suite's own host address when it talks to guest ``gN``."""
    return f"10.50.0.2{n}"


def locate_shared(repo: Path | None = None) -> Path:
    """``<repo>/../shared``, else ``$SOFTRDMA_SHARED``, else ``/work/shared``.

    ``repo`` defaults to the source tree this module lives in, or the current directory
    when that is a softrdma checkout (an installed package run from its checkout, as CI
    does). The first candidate holding ``lab/run.sh`` wins."""
    candidates: list[Path] = []
    repos = [repo] if repo is not None else [Path(__file__).resolve().parents[3], Path.cwd()]
    for r in repos:
        if r is not None and (r / "pyproject.toml").is_file():
            candidates.append(r.parent / "shared")
    env = os.environ.get("SOFTRDMA_SHARED")
    if env:
        candidates.append(Path(env))
    candidates.append(Path("/work/shared"))
    for c in candidates:
        if (c / "lab" / "run.sh").is_file():
            return c.resolve()
    raise LabError("cannot find the lab: no lab/run.sh in "
                   + ", ".join(str(c) for c in candidates) + " (set SOFTRDMA_SHARED)")


def _kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Signal the process group we started ``proc`` in (start_new_session)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(KILL_GRACE)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(KILL_GRACE)


@dataclass
class Lab:
    """The lab's scripts and cache, and the guests this run booted."""

    shared: Path
    cache: Path = DEFAULT_CACHE
    booted: list[int] = field(default_factory=list)
    locks: dict[int, int] = field(default_factory=dict)
    #: a boot of this run created the lab's namespace (:data:`LAB_NETNS`): removed again
    made_netns: bool = False

    @property
    def run_sh(self) -> Path:
        return self.shared / "lab" / "run.sh"

    @property
    def build_sh(self) -> Path:
        return self.shared / "lab" / "build.sh"

    def env(self) -> dict[str, str]:
        e = dict(os.environ)
        e["LAB_CACHE"] = str(self.cache)
        # run.sh's own wait for ssh: past ours (:meth:`boot` decides when a boot failed)
        e.setdefault("BOOT_TIMEOUT", str(int(BOOT_TIMEOUT) + 60))
        return e

    def _run(self, args: Sequence[str], timeout: float,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            cp = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                                env=self.env(), stdin=subprocess.DEVNULL, check=False,
                                errors="replace")
        except subprocess.TimeoutExpired as e:
            raise LabError(f"{' '.join(args[:3])}...: no answer within {timeout:.0f}s") from e
        if check and cp.returncode != 0:
            tail = (cp.stderr or cp.stdout).strip().splitlines()[-3:]
            raise LabError(f"{' '.join(str(a) for a in args[:4])} failed "
                           f"(exit {cp.returncode}): {' | '.join(tail)}")
        return cp

    # -- one suite per guest ------------------------------------------------------------
    def lock_guest(self, n: int) -> None:
        """Hold ``$LAB_CACHE/run/interop-gN.lock`` (flock) until :meth:`unlock_guest`:
        two suites on one guest would tear down each other's namespace."""
        path = self.cache / "run" / f"interop-g{n}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise LabError(f"guest g{n} is in use by another interop run (pid {holder or '?'});"
                           " use another --guest") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.locks[n] = fd

    def locked(self, n: int) -> bool:
        return n in self.locks

    def unlock_guest(self, n: int) -> None:
        fd = self.locks.pop(n, None)
        if fd is not None:
            os.close(fd)  # closing drops the flock

    # -- image and guests ---------------------------------------------------------------
    def build(self) -> None:
        """``build.sh`` (idempotent: instant when the image is cached)."""
        self._run(["bash", str(self.build_sh)], BUILD_TIMEOUT)

    def pid_of(self, n: int) -> int | None:
        try:
            pid = int((self.cache / "run" / f"g{n}.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid

    def running(self, n: int) -> bool:
        return self.pid_of(n) is not None

    def boot(self, n: int) -> bool:
        """Boot ``gN`` unless it runs; True when this call booted it (we then stop it).

        An emulated guest boots as fast as the host lets it: the wait goes on while the
        guest makes progress (its serial console log grows), and fails once the console
        has been silent for :data:`BOOT_STALL` seconds times the host's load per core
        (:func:`load_factor`), or after :data:`BOOT_TIMEOUT` seconds in all. The error
        says which, with the load."""
        if self.running(n):
            return False
        if not self.made_netns and not netns_exists(LAB_NETNS):
            self.made_netns = True  # run.sh boot makes it
        self.booted.append(n)  # from here on it is ours to stop, even if the boot fails
        log = self.cache / "run" / f"g{n}.console.log"
        proc = subprocess.Popen(["bash", str(self.run_sh), "boot", str(n)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=self.env(),
                                start_new_session=True)
        start = last_progress = time.monotonic()
        console = -1
        next_rescue = 0.0
        try:
            while proc.poll() is None:
                now = time.monotonic()
                size = _size(log)
                if size != console:
                    console, last_progress = size, now
                load = load_factor()
                if now - start > BOOT_TIMEOUT:
                    raise LabError(f"g{n} did not boot within {BOOT_TIMEOUT:.0f}s "
                                   f"(host load {load:.1f} per core)")
                if now - last_progress > BOOT_STALL * load:
                    raise LabError(f"g{n} did not boot: its console was silent for "
                                   f"{now - last_progress:.0f}s after {now - start:.0f}s "
                                   f"(host load {load:.1f} per core; see {log})")
                if now >= next_rescue and self._rescue_network(n, log):
                    next_rescue = now + RESCUE_INTERVAL  # again if ssh still does not answer
                time.sleep(1.0)
        finally:
            _kill_group(proc)
        out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        if proc.returncode != 0:
            raise LabError(f"run.sh boot {n} failed: {out.strip().splitlines()[-1:]}")
        return True

    @staticmethod
    def _shell_up(log: Path) -> bool:
        """The serial console's root shell (automatic login) has printed its prompt."""
        try:
            text = log.read_bytes()
        except OSError:
            return False
        after = text.split(b"(automatic login)", 1)
        return len(after) == 2 and b":~# " in after[1]

    def _rescue_network(self, n: int, log: Path) -> bool:
        """The guest's ``lab-net.service`` runs ``udevadm settle -t 10`` first, which
        times out when the loaded host starves the emulated guest: the service fails,
        the guest has no network and ssh never answers. systemd does not say so on the
        console, because the serial getty has taken it over by then. So once the
        console's root shell (automatic login) shows its prompt, type there
        ``systemctl is-failed -q lab-net.service && /usr/local/sbin/lab-net``: the guest
        runs the network script only if the service failed (the script is idempotent),
        and ``run.sh boot`` goes on waiting for ssh as usual. Called again every
        :data:`RESCUE_INTERVAL` while ssh does not answer; each try also shows on the
        console, so a wait for ssh is not taken for a silent boot. False while the
        shell is not up."""
        if not self._shell_up(log):
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(10.0)
            sock.connect(str(self.cache / "run" / f"g{n}.serial"))
            # one byte at a time: the emulated UART drops what overruns its FIFO
            for byte in RESCUE_LINE:
                sock.sendall(bytes((byte,)))
                time.sleep(SERIAL_BYTE_DELAY)
        except OSError:
            return False
        finally:
            sock.close()
        return True

    def stop_booted(self) -> None:
        """Power off the guests this run booted, and only those; then remove the lab's
        namespace if a boot of this run created it and no guest runs any more (one
        another run booted keeps it)."""
        while self.booted:
            n = self.booted.pop()
            self._run(["bash", str(self.run_sh), "stop", str(n)], 60.0, check=False)
        if self.made_netns and not self.guests_running():
            self._run(["bash", str(self.run_sh), "net-down"], 60.0, check=False)
            self.made_netns = False

    def guests_running(self) -> list[int]:
        """The lab's guests whose qemu runs (``$LAB_CACHE/run/gN.pid``), any run's."""
        names = (p.stem[1:] for p in (self.cache / "run").glob("g*.pid"))
        return sorted(int(n) for n in names if n.isdigit() and self.running(int(n)))

    def ssh(self, n: int, command: str, timeout: float = SSH_TIMEOUT,
            check: bool = False) -> subprocess.CompletedProcess[str]:
        return self._run(self.ssh_argv(n, command), timeout, check)

    def ssh_argv(self, n: int, command: str) -> list[str]:
        """``run.sh ssh N COMMAND``, done here with two changes for an emulated guest on a
        loaded machine: a generous connect timeout (run.sh's 3 s loses the banner
        exchange under load) and one shared ssh connection per guest (ControlMaster), so
        a case costs the guest no new key exchanges (:meth:`open_ssh`; without it each
        call connects by itself)."""
        return [*self._ssh_base(n), "-o", "ControlMaster=no", f"root@{ctl_ip(n)}",
                f"ulimit -l unlimited 2>/dev/null; {command}"]

    def _control_path(self, n: int) -> Path:
        return self.cache / "run" / f"interop-ssh-g{n}.sock"

    def _ssh_base(self, n: int) -> list[str]:
        return ["ip", "netns", "exec", LAB_NETNS, "ssh", "-i",
                str(self.cache / "ssh" / "id_ed25519"),
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT}",
                "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5",
                "-o", "ServerAliveCountMax=12", "-o", f"ControlPath={self._control_path(n)}"]

    def open_ssh(self, n: int) -> None:
        """Start the shared connection to ``gN`` (a backgrounded ssh master)."""
        self.close_ssh(n)
        self._run([*self._ssh_base(n), "-o", "ControlMaster=yes", "-o", "ControlPersist=1800",
                   "-f", "-N", f"root@{ctl_ip(n)}"], SSH_TIMEOUT)

    def close_ssh(self, n: int) -> None:
        """End the shared connection to ``gN`` if there is one."""
        if self._control_path(n).exists():
            self._run([*self._ssh_base(n), "-O", "exit", f"root@{ctl_ip(n)}"], SSH_TIMEOUT,
                      check=False)

    def spawn_guest(self, n: int, tag: str, command: str) -> GuestProcess:
        """Run ``command`` in ``gN`` in the background (its pid kept in the guest)."""
        pidfile = f"/tmp/interop-{tag}.pid"
        remote = f"echo $$ > {pidfile}; exec {command}"
        proc = subprocess.Popen(self.ssh_argv(n, remote),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=self.env(),
                                start_new_session=True)
        return GuestProcess(self, n, pidfile, proc)

    def rdma_setup(self, n: int, kind: str) -> None:
        """Give ``gN`` exactly one RDMA link: ``rxe``, ``siw`` or ``siw-crc``.

        ``siw-crc`` is the CRC-forcing build ``/opt/lab/siw-crc.ko`` (captures.sh
        ``siw_crc_up``): the module is swapped, so whichever siw is loaded is unloaded."""
        # the commands of run.sh rdma-down and rdma-up, over the shared connection
        self.ssh(n, 'for l in rxe0 siw0; do rdma link show | grep -q "link $l/" && '
                    'rdma link delete $l; done; true', check=True)
        if kind == "rxe":
            self.ssh(n, 'modprobe rdma_rxe && (rdma link show | grep -q "link rxe0/" || '
                        'rdma link add rxe0 type rxe netdev eth0) && rdma link show rxe0/1',
                     check=True)
            return
        if kind not in ("siw", "siw-crc"):
            raise LabError(f"unknown RDMA kind {kind!r} (rxe, siw, siw-crc)")
        # captures.sh siw_up / siw_crc_up: whichever siw is loaded goes first; for the
        # CRC build, modprobe loads siw's dependencies before the module is swapped
        load = ("modprobe siw && rmmod siw && insmod /opt/lab/siw-crc.ko" if kind == "siw-crc"
                else "modprobe siw")
        self.ssh(n, f"lsmod | grep -q '^siw ' && rmmod siw; {load} && "
                    "rdma link add siw0 type siw netdev eth0 && rdma link show siw0/1",
                 check=True)

    def gid_index(self, n: int) -> int:
        # run.sh gid: the index of the RoCE v2 GID ::ffff:<eth0 IPv4>
        cp = self.ssh(n, 'd=/sys/class/infiniband/rxe0/ports/1; for i in $(seq 0 15); do '
                         'g=$(cat $d/gids/$i 2>/dev/null) || continue; '
                         't=$(cat $d/gid_attrs/types/$i 2>/dev/null); case "$g" in '
                         '0000:0000:0000:0000:0000:ffff:*) [ "$t" = "RoCE v2" ] && '
                         '{ echo $i; exit 0; };; esac; done; exit 1')
        try:
            return int(cp.stdout.strip())
        except ValueError as e:
            raise LabError(f"g{n}: no RoCEv2 IPv4 GID on rxe0 ({cp.stdout.strip()!r})") from e

    def netns_run(self, command: Sequence[str], timeout: float = SSH_TIMEOUT,
                  check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run(["ip", "netns", "exec", LAB_NETNS, *command], timeout, check)


class _Waited:
    """What :class:`GuestProcess` and :class:`HostProcess` share: a local process
    (``proc``) whose output is kept in ``output`` once it has ended."""

    proc: subprocess.Popen[bytes]
    output: str

    def kill(self) -> None:
        _kill_group(self.proc)

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None (and the command is killed) after ``timeout``."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, _ = self.proc.communicate()
            self.output = out.decode(errors="replace")
            return None
        self.output = out.decode(errors="replace")
        return self.proc.returncode


@dataclass
class GuestProcess(_Waited):
    """A command running in a guest over ssh."""

    lab: Lab
    n: int
    pidfile: str
    proc: subprocess.Popen[bytes]
    output: str = ""

    def kill(self) -> None:
        """Kill the command in the guest (by its pid there), then the local ssh. Once ssh
        has exited the remote command has too: nothing to do then."""
        if self.proc.poll() is not None:
            return
        self.lab.ssh(self.n, f"p=$(cat {self.pidfile} 2>/dev/null) && kill $p 2>/dev/null; "
                             f"sleep 0.5; kill -9 $p 2>/dev/null; rm -f {self.pidfile}; true",
                     timeout=30.0)
        _kill_group(self.proc)


@dataclass
class HostProcess(_Waited):
    """A softrdma command running in the suite's namespace."""

    proc: subprocess.Popen[bytes]
    output: str = ""


@dataclass
class HostSide:
    """softrdma's side: netns ``srinterop-gN`` with ``eth0`` = ``10.50.0.2N/24`` (MAC
    :attr:`mac`), joined to the lab's ``br0`` by the veth ``sri-gNp``, and a state
    directory of its own."""

    lab: Lab
    n: int
    state_dir: Path
    devices: dict[str, str] = field(default_factory=dict)
    created: bool = False

    @property
    def netns(self) -> str:
        return f"srinterop-g{self.n}"

    @property
    def ip(self) -> str:
        return host_ip(self.n)

    @property
    def mac(self) -> str:
        """``52:54:00:02:00:0N`` (run.sh: data 52:54:00:00:00:0N, control ...:01:00:0N)."""
        return f"52:54:00:02:00:0{self.n}"

    @property
    def veth_lab(self) -> str:
        return f"sri-g{self.n}p"

    def _ip(self, *args: str, check: bool = True) -> None:
        cp = subprocess.run(["ip", *args], capture_output=True, text=True, check=False,
                            stdin=subprocess.DEVNULL, timeout=30)
        if check and cp.returncode != 0:
            raise LabError(f"ip {' '.join(args)}: {cp.stderr.strip()}")

    def up(self, python: str) -> None:
        """Create the namespace, veth, address and softrdma devices (roce ``ilab``,
        iwarp ``iwlab``); an old one of the same guest number is replaced."""
        self.down()
        # a run with --keep leaves its state directory (the device registry) behind: the
        # guest lock makes this run its only user, so it starts from an empty one
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.created = True
        ns, tmp = self.netns, f"sri-g{self.n}h"
        self.lab.netns_run(["ip", "link", "show", "br0"])  # the lab network must be up
        self._ip("netns", "add", ns)
        # a fixed MAC per guest number: a guest keeps its ARP entry for 10.50.0.2N across
        # runs, and a new random MAC would leave it sending to the old one until its
        # neighbour entry fails (seconds: long enough to lose a CM REQ's retries)
        self._ip("link", "add", tmp, "address", self.mac, "type", "veth", "peer", "name",
                 self.veth_lab)
        self._ip("link", "set", tmp, "netns", ns)
        self._ip("link", "set", self.veth_lab, "netns", LAB_NETNS)
        self.lab.netns_run(["ip", "link", "set", self.veth_lab, "master", "br0", "up"])
        for cmd in (["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                     "net.ipv6.conf.default.disable_ipv6=1"],
                    ["ip", "link", "set", "lo", "up"],
                    ["ip", "link", "set", tmp, "name", "eth0"],
                    ["ip", "addr", "add", f"{self.ip}/24", "dev", "eth0"],
                    ["ip", "link", "set", "eth0", "up"]):
            self._ip("netns", "exec", ns, *cmd)
        # one ping: the guest learns (or corrects) our MAC from our ARP request before any
        # case, and the data path is proven
        cp = subprocess.run(["ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "20",
                             guest_ip(self.n)], capture_output=True, text=True, check=False,
                            stdin=subprocess.DEVNULL, timeout=60)
        if cp.returncode != 0:
            raise LabError(f"g{self.n} ({guest_ip(self.n)}) does not answer a ping from "
                           f"{self.ip}: {(cp.stdout + cp.stderr).strip().splitlines()[-1:]}")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for name, typ in (("ilab", "roce"), ("iwlab", "iwarp")):
            cp = self.run([python, "-m", "softrdma", "link", "add", name, "netdev", "eth0",
                           "type", typ], timeout=60.0)
            if cp.returncode != 0:
                raise LabError(f"softrdma link add {name}: {cp.stdout.strip()}")
            self.devices[typ] = name

    def down(self) -> None:
        """Remove the namespace (its processes were ended by the caller) and veth."""
        self._ip("netns", "del", self.netns, check=False)
        subprocess.run(["ip", "netns", "exec", LAB_NETNS, "ip", "link", "del", self.veth_lab],
                       capture_output=True, check=False, stdin=subprocess.DEVNULL, timeout=30)
        if self.created:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            self.created = False

    def env(self) -> dict[str, str]:
        e = dict(os.environ)
        e["SOFTRDMA_STATE_DIR"] = str(self.state_dir)
        return e

    def run(self, command: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(["ip", "netns", "exec", self.netns, *command],
                                  capture_output=False, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=self.env(),
                                  timeout=timeout, stdin=subprocess.DEVNULL, check=False,
                                  errors="replace")
        except subprocess.TimeoutExpired as e:
            raise LabError(f"{' '.join(command[:4])}: no answer within {timeout:.0f}s") from e

    def spawn(self, command: Sequence[str]) -> HostProcess:
        proc = subprocess.Popen(["ip", "netns", "exec", self.netns, *command],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=self.env(),
                                start_new_session=True)
        return HostProcess(proc)

    def tcp_listening(self, port: int) -> bool:
        cp = self.run(["ss", "-Hltn", f"sport = :{port}"], timeout=20.0)
        return bool(cp.stdout.strip())


@dataclass
class Capture:
    """tcpdump on ``tap-gN`` in the lab namespace, as ``run.sh cap-start`` runs it."""

    pcap: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, n: int, bpf: str) -> None:
        self.pcap.parent.mkdir(parents=True, exist_ok=True)
        self.pcap.unlink(missing_ok=True)
        log = self.pcap.with_suffix(".tcpdump.log")
        with log.open("wb") as fh:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", LAB_NETNS, "tcpdump", "-i", f"tap-g{n}", "-s", "0",
                 "-B", "65536", "-U", "--immediate-mode", "-w", str(self.pcap), bpf],
                stdout=fh, stderr=fh, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            if b"listening on" in log.read_bytes():
                return
            if self.proc.poll() is not None:
                raise LabError(f"tcpdump on tap-g{n} exited: {log.read_text().strip()}")
            time.sleep(0.1)
        raise LabError(f"tcpdump on tap-g{n} did not start")

    def stop(self) -> None:
        if self.proc is None:
            return
        time.sleep(0.5)  # let the last frames in (run.sh cap-stop does the same)
        _kill_group(self.proc, signal.SIGINT)
        self.proc = None
