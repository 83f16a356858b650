"""Running the suite: lab setup, each case in each direction, checks, teardown.

One run: build (or reuse) the lab image, boot guest ``gN`` unless it is running (a
guest someone else booted is used but never stopped), create the suite's namespace and
softrdma devices (:class:`~softrdma.interop.lab.HostSide`), start softrdma's RoCE devd
for the whole run (so its counters span the cases), then for each guest link (rxe, siw,
siw-crc) set the guest up and run its cases. Teardown, in a ``finally``: the devd, the
namespace and state directory, and (unless ``keep``) the guest if this run booted it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ..tools import cli
from . import checks, parse
from .cases import DIRECTIONS, MCKEY_GROUP, RPING_COUNT, Case, Commands, Endpoint, commands
from .lab import Capture, GuestProcess, HostProcess, HostSide, Lab, LabError, guest_ip, load_factor
from .report import Result

__all__ = ["Options", "Suite", "softrdma_tools", "client_retry", "CLIENT_RETRIES"]

SERVER_READY_TIMEOUT = 60.0
HOST_SERVER_SETTLE = 4.0  # a softrdma rdma_cm server on RoCE shows no TCP listener
# a C server under `softrdma run` first starts its embedded interpreter (x the load)
CAPI_SERVER_SETTLE = 10.0
CAPI_SERVER_SETTLE_MAX = 60.0
CLIENT_TIMEOUT = 120
SERVER_EXIT_TIMEOUT = 45.0
SERVER_EXIT_AFTER_FAILURE = 10.0
POLL_INTERVAL = 1.0
DEVD_IDLE = 36000.0
QP_SETTLE = 3.0
PCAP_CHECK_TIMEOUT = 300.0
TIMEOUT_EXIT = 124  # coreutils timeout(1): the command timed out
CLIENT_RETRIES = 3  # a C perftest -R client refused by the guest: started again (client_retry)
CLIENT, PAIR = "client", "pair"
RETRY_WHY = {CLIENT: f"{parse.FIRST_CONNECTION_FAILED} (its first rdma_cm connection was "
                     "refused)",
             PAIR: "its second rdma_cm connection was rejected (the server did not listen "
                   "again yet)"}


def client_retry(case: Case, server_on_guest: bool, rc: int | None, output: str) -> str:
    """Whether a finished client is started again: only a C perftest ``-R`` client
    (:attr:`Case.retries_client`) that failed (not killed) on a refused rdma_cm
    connection, as ``tests/harness/capi`` retries stock perftest pairs. ``CLIENT``
    (softrdma's client against the guest's server): its first connection
    (:data:`parse.FIRST_CONNECTION_FAILED`): the slow guest's server did not listen yet,
    saw nothing and still waits for its first client, which comes again once the server
    listens. ``PAIR`` (either direction): its second, the test's own
    (:func:`parse.second_connection_refused`): perftest 4.5-0.17 cannot retry it itself
    and its server waits for ever, so both are started again. softrdma's client sends a
    refused REQ again itself (``SOFTRDMA_CM_RETRY_NO_LISTENER``, cases.CM_RETRY_ENV_WORDS);
    the guest's Linux client cannot, and loses the race when softrdma's server, on a
    loaded host, listens again later than it connects. ``''``: any other end is the
    case's result."""
    if not (case.retries_client and rc not in (0, None)):
        return ""
    if server_on_guest and parse.first_connection_failed(output):
        return CLIENT
    return PAIR if parse.second_connection_refused(output) else ""


def softrdma_tools() -> set[str]:
    """The ``softrdma`` subcommands this checkout has (the CLI imports tools lazily)."""
    parser = cli.build_parser()
    for action in parser._actions:  # argparse keeps subcommands on the subparsers action
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict):
            return set(choices)
    return set()


@dataclass
class Options:
    guest: int = 1
    keep: bool = False
    python: str = sys.executable
    out_dir: Path | None = None


class Suite:
    """One run of the suite over ``cases`` (see the module docstring)."""

    def __init__(self, lab: Lab, opts: Options,
                 progress: Callable[[str], None] = lambda _m: None) -> None:
        self.lab = lab
        self.opts = opts
        self.progress = progress
        self.n = opts.guest
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.out_dir = opts.out_dir or lab.cache / "interop" / f"{stamp}-g{self.n}"
        self.host = HostSide(lab, self.n, Path(f"/tmp/softrdma-interop-g{self.n}-state"))
        self.tools = softrdma_tools()
        self.devd_started = False
        self.devd_last: dict[str, int] = {}
        self.gid = 1

    # -- setup and teardown ---------------------------------------------------------------
    def setup(self) -> None:
        self.lab.lock_guest(self.n)  # one suite per guest: a second run stops here
        self.progress("building or reusing the lab image (build.sh)")
        self.lab.build()
        self.progress(f"booting g{self.n} (reused if it runs)")
        if not self.lab.boot(self.n):
            self.progress(f"g{self.n} was running: it is used and left running")
        self.lab.open_ssh(self.n)
        self.host.up(self.opts.python)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        cp = self.host.run([self.opts.python, "-m", "softrdma.drivers.devd.daemon", "ilab",
                            "--state-dir", str(self.host.state_dir), "--idle-timeout",
                            str(DEVD_IDLE), "--daemonize"], timeout=60.0)
        if cp.returncode != 0:
            raise LabError(f"cannot start softrdma's devd: {cp.stdout.strip()}")
        self.devd_started = True

    def teardown(self) -> None:
        if self.devd_started:
            pidfile = self.host.state_dir / "ilab.pid"
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                pid = 0
            if pid > 0:
                subprocess.run(["kill", str(pid)], check=False, capture_output=True)
            self.devd_started = False
        if self.lab.locked(self.n):
            self.lab.close_ssh(self.n)
            if not self.opts.keep:
                self.host.down()
                self.lab.stop_booted()
            self.lab.unlock_guest(self.n)

    # -- the run --------------------------------------------------------------------------
    def run(self, cases: list[Case], on_result: Callable[[Result], None]) -> list[Result]:
        results: list[Result] = []
        try:
            self.setup()
            fabric = ""
            for case in cases:
                if case.fabric != fabric:
                    fabric = case.fabric
                    self.progress(f"g{self.n}: RDMA link {fabric}")
                    self.lab.rdma_setup(self.n, fabric)
                    if fabric == "rxe":
                        self.gid = self.lab.gid_index(self.n)
                for direction in DIRECTIONS:
                    self.progress(f"{case.name} {direction}")
                    r = self.run_one(case, direction)
                    results.append(r)
                    on_result(r)
        finally:
            self.teardown()
        return results

    def endpoint(self) -> Endpoint:
        return Endpoint(guest_ip(self.n), self.host.ip, guest_gid=self.gid,
                        softrdma=f"{shlex.quote(self.opts.python)} -m softrdma")

    def run_one(self, case: Case, direction: str) -> Result:
        r = Result(case.name, direction)
        if case.softrdma_tool not in self.tools:
            r.result = f"skipped: softrdma lacks {case.softrdma_tool}"
            return r
        cmds = commands(case, direction, self.endpoint())
        r.commands = {"server": cmds.server, "client": cmds.client}
        tag = f"{case.name.replace('/', '-')}-{direction}"
        cap = Capture(self.out_dir / f"{tag}.pcap")
        r.pcap = str(cap.pcap)
        t0 = time.monotonic()
        try:
            # mckey's datagrams go to the group, not to our address (IBA 10.5.2.1)
            bpf = f"host {self.host.ip}" + (f" or host {MCKEY_GROUP}" if case.kind == "mckey"
                                            else "")
            cap.start(self.n, bpf)
            before = self._guest_counters(case)
            devd_before = self.devd_last if self.devd_last else self._devd_stats()
            srv_out, cli_out = self._exchange(case, cmds, tag, r)
        finally:
            cap.stop()
        r.seconds = round(time.monotonic() - t0, 1)
        (self.out_dir / f"{tag}.server.log").write_text(srv_out)
        (self.out_dir / f"{tag}.client.log").write_text(cli_out)
        soft_out, linux_out = (cli_out, srv_out) if cmds.server_on_guest else (srv_out, cli_out)
        self._figures(case, r, soft_out, linux_out)
        self._check_outputs(case, r, soft_out, linux_out)
        after, qps = self._guest_after(case)
        delta = parse.counter_delta(before, after)
        self.devd_last = self._devd_stats()  # the devd lives for the whole run
        devd_delta = parse.counter_delta(devd_before, self.devd_last)
        r.counters = {"guest": delta, "softrdma_devd": devd_delta}
        for finding in checks.guest_findings(delta, qps) + checks.softrdma_findings(devd_delta):
            r.fail(finding)
        self._pcap_check(r)
        if case.mpa_crc:
            self._mpa_crc_check(r)
        return r

    # -- pieces of a case -------------------------------------------------------------------
    def _exchange(self, case: Case, cmds: Commands, tag: str, r: Result) -> tuple[str, str]:
        server: GuestProcess | HostProcess
        client: GuestProcess | HostProcess | None = None
        attempt = 0
        server = self._start_server(cmds, tag)
        try:
            while True:  # a new server only after a refused second connection (client_retry)
                why = self._wait_ready(case, cmds.server_on_guest, server)
                if why:
                    r.fail(why)
                    server.kill()
                    server.wait(10.0)
                    return server.output, ""
                while True:
                    if cmds.server_on_guest:
                        client = self.host.spawn(shlex.split(cmds.client))
                    else:
                        client = self.lab.spawn_guest(
                            self.n, f"{tag}-cli", f"timeout {CLIENT_TIMEOUT} {cmds.client}")
                    crc = client.wait(CLIENT_TIMEOUT + 30)
                    again = client_retry(case, cmds.server_on_guest, crc, client.output)
                    if attempt >= CLIENT_RETRIES or not again or server.proc.poll() is not None:
                        again = ""
                        break
                    attempt += 1
                    (self.out_dir / f"{tag}.client.{attempt}.log").write_text(client.output)
                    r.notes.append(f"client started again ({attempt} of {CLIENT_RETRIES}"
                                   f"{', with a new server' if again == PAIR else ''}): "
                                   f"{RETRY_WHY[again]}")
                    if again == PAIR:
                        break
                    # the same server: its listener must show before the client comes again
                    why = self._wait_ready(case, cmds.server_on_guest, server)
                    if why:
                        r.fail(why)
                        break
                if again != PAIR:
                    break
                server.kill()  # it waits for a connection that will not come
                server.wait(SERVER_EXIT_AFTER_FAILURE)
                server = self._start_server(cmds, tag)
            # a server whose client failed is not waited for long: the case failed already
            src = server.wait(SERVER_EXIT_TIMEOUT if crc == 0 else SERVER_EXIT_AFTER_FAILURE)
        finally:
            server.kill()
            if client is not None:
                client.kill()
        soft = ("client", crc) if cmds.server_on_guest else ("server", src)
        linux = ("server", src) if cmds.server_on_guest else ("client", crc)
        for who, (role, rc) in (("softrdma", soft), ("linux", linux)):
            if rc is None:
                r.fail(f"{who} {role} did not finish (killed)")
            elif rc == TIMEOUT_EXIT and who == "linux":
                r.fail(f"linux {role} timed out in the guest")
            elif rc == 255 and who == "linux" and case.kind == "rping" and \
                    parse.rping_teardown_race(server.output if role == "server" else
                                              client.output):
                r.notes.append(f"linux {role} exited 255 in rping's own teardown race "
                               f"({parse.RPING_TEARDOWN_RACE!r} after the DISCONNECT; "
                               "fixed in rdma-core v59, the guest has v44)")
            elif rc:
                r.fail(f"{who} {role} exited {rc}")
        return server.output, client.output

    def _start_server(self, cmds: Commands, tag: str) -> GuestProcess | HostProcess:
        if cmds.server_on_guest:
            return self.lab.spawn_guest(self.n, f"{tag}-srv",
                                        f"timeout {CLIENT_TIMEOUT + 60} {cmds.server}")
        return self.host.spawn(shlex.split(cmds.server))

    def _wait_ready(self, case: Case, on_guest: bool,
                    server: GuestProcess | HostProcess) -> str:
        """'' once the server listens, else why not."""
        tcp = case.kind in ("pingpong",) or (case.kind in ("bw", "lat") and not case.rdma_cm)
        iwarp = case.fabric != "rxe"
        deadline = time.monotonic() + SERVER_READY_TIMEOUT
        if not on_guest and not (tcp or iwarp):
            time.sleep(min(CAPI_SERVER_SETTLE * load_factor(), CAPI_SERVER_SETTLE_MAX)
                       if case.capi else HOST_SERVER_SETTLE)
            return "" if server.proc.poll() is None else "softrdma server exited early"
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                return f"{'linux' if on_guest else 'softrdma'} server exited before listening"
            if on_guest:
                if tcp:
                    probe = f"ss -Hltn 'sport = :{case.port}'"
                elif case.kind == "mckey":  # the receiver has joined: an id of its own
                    probe = "rdma res show cm_id | grep -w mckey"
                else:
                    probe = f"rdma res show cm_id | grep LISTEN | grep ':{case.port} '"
                if self.lab.ssh(self.n, probe, timeout=30.0).stdout.strip():
                    return ""
            elif self.host.tcp_listening(case.port):
                return ""
            time.sleep(POLL_INTERVAL)
        return f"server not listening on port {case.port} after {SERVER_READY_TIMEOUT:.0f}s"

    def _guest_counters(self, case: Case) -> dict[str, int]:
        if case.fabric != "rxe":
            return {}
        cp = self.lab.ssh(self.n, "rdma statistic show link rxe0/1", timeout=30.0)
        return parse.parse_rdma_statistic(cp.stdout)

    def _guest_after(self, case: Case) -> tuple[dict[str, int], list[str]]:
        time.sleep(0.2)
        deadline = time.monotonic() + QP_SETTLE
        while True:
            cp = self.lab.ssh(self.n, ("rdma statistic show link rxe0/1; " if case.fabric
                                       == "rxe" else "") + "echo @@; rdma res show qp",
                              timeout=30.0)
            stats, _, qps = cp.stdout.partition("@@")
            left = parse.user_qps(qps)
            if not left or time.monotonic() > deadline:
                return parse.parse_rdma_statistic(stats), left
            time.sleep(POLL_INTERVAL)

    def _devd_stats(self) -> dict[str, int]:
        cp = self.host.run([self.opts.python, "-m", "softrdma.interop.devstats", "ilab"],
                           timeout=30.0)
        try:
            data = json.loads(cp.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {}
        return {str(k): int(v) for k, v in data.items()}

    def _figures(self, case: Case, r: Result, soft: str, linux: str) -> None:
        if case.kind in ("bw", "lat"):
            r.softrdma, r.linux = parse.parse_perftest(soft), parse.parse_perftest(linux)
        elif case.kind == "pingpong":
            r.softrdma, r.linux = parse.parse_pingpong(soft), parse.parse_pingpong(linux)

    def _check_outputs(self, case: Case, r: Result, soft: str, linux: str) -> None:
        for who, text in (("softrdma", soft), ("linux", linux)):
            errs = parse.error_lines(text)
            if errs:
                r.fail(f"{who} reported: {errs[0]}")
        if case.kind == "rping":
            for who, text in (("softrdma", soft), ("linux", linux)):
                n = sum("ping data" in line for line in text.splitlines())
                if n < RPING_COUNT:
                    r.fail(f"{who} rping showed {n} of {RPING_COUNT} verified pings")
        if case.kind == "mckey":  # each side saw its -C messages through (mckey.c)
            for who, text in (("softrdma", soft), ("linux", linux)):
                if "data transfers complete" not in text:
                    r.fail(f"{who} mckey did not complete its transfers")
        if case.kind == "example":  # rdma_server.c / rdma_client.c: "NAME: end 0"
            for who, text in (("softrdma", soft), ("linux", linux)):
                if not any(ln.endswith(": end 0") for ln in text.splitlines()):
                    r.fail(f"{who} did not end with 0")
        if case.kind == "rsocket":  # rstream.c -T v: a result row once every byte matched
            for who, text in (("softrdma", soft), ("linux", linux)):
                if not parse.rstream_done(text):
                    r.fail(f"{who} rstream printed no result")
        if case.kind == "pingpong" and r.result == "pass":
            for who, f in (("softrdma", r.softrdma), ("linux", r.linux)):
                if "usec_iter" not in f:
                    r.fail(f"{who} pingpong printed no result")
        if case.kind in ("bw", "lat") and r.result == "pass":
            if not r.softrdma and not r.linux:
                r.fail("neither side printed a perftest result table")

    def _mpa_crc_check(self, r: Result) -> None:
        """A case where softrdma asked for the MPA CRC: tshark's MPA dissector (which checks
        each FPDU's CRC32c once it has seen C in the MPA Reply, RFC 5044 §7.1) must show C in the
        Reply and a good CRC on every FPDU, in both directions."""
        base = ["tshark", "-r", r.pcap, "--disable-protocol", "rpcordma"]
        sel = ["-Y", "iwarp_mpa.req || iwarp_mpa.rep || iwarp_mpa.fpdu", "-T", "fields",
               "-E", "occurrence=f"]
        try:
            fields = subprocess.run(
                [*base, *sel, *(w for f in checks.TSHARK_MPA_FIELDS for w in ("-e", f))],
                capture_output=True, text=True, timeout=PCAP_CHECK_TIMEOUT, check=True,
                stdin=subprocess.DEVNULL, errors="replace").stdout
            text = subprocess.run([*base, "-V"], capture_output=True, text=True,
                                  timeout=PCAP_CHECK_TIMEOUT, check=True,
                                  stdin=subprocess.DEVNULL, errors="replace").stdout
        except (OSError, subprocess.SubprocessError) as exc:
            r.fail(f"MPA CRC: tshark failed on the capture: {exc}")
            return
        rows = [ln.split("\t") for ln in fields.splitlines() if ln.strip()]
        for finding in checks.mpa_crc_findings(rows, text.count("Bad CRC32")):
            r.fail(finding)

    def _pcap_check(self, r: Result) -> None:
        """``softrdma pcap-check`` on the case's capture, as a user runs it (whatever checks
        it has: packets, and conversations where it follows them)."""
        try:
            cp = subprocess.run([self.opts.python, "-m", "softrdma", "pcap-check", r.pcap],
                                capture_output=True, text=True, timeout=PCAP_CHECK_TIMEOUT,
                                check=False, stdin=subprocess.DEVNULL, errors="replace")
        except subprocess.TimeoutExpired:
            r.fail(f"pcap-check did not finish within {PCAP_CHECK_TIMEOUT:.0f}s")
            return
        summary, first = parse.pcap_check_lines(cp.stderr + cp.stdout)
        r.pcap_check = summary if cp.returncode == 0 else (first or summary or "no output")
        if cp.returncode != 0:
            r.fail(f"pcap-check failed (exit {cp.returncode})")
        elif parse.pcap_check_packets(summary) == 0:
            r.fail("the capture holds no RDMA packet")
