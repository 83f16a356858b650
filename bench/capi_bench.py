"""C programs on softrdma (issue 22): stock tools under ``softrdma run`` against softrdma's
Python tools with the same role, measured in the same run, and the C interface's costs.

Both pairs run as two processes on one RoCE device on ``lo`` (a private registry, a free
UDP port, shared through devd, as every multi-process softrdma run):

* :func:`write_bw`: perftest's ``ib_write_bw -s 65536`` (both sides under ``softrdma run``)
  and ``softrdma write-bw`` with the same flags: the client's BW average [MB/s];
* :func:`rc_lat`: ``ibv_rc_pingpong -s 64`` under ``softrdma run`` and ``softrdma
  rc-pingpong -s 64``: the client's usec/iter (a full round trip);
* both as two pairs a side in the order C, Python, Python, C, each side's mean
  (:func:`alternated`);
* :func:`rc_cpu`: the same two pairs' CPU time per round trip, both processes together,
  less what a pair of 10 iterations takes (start-up): on a busy machine the wall-clock
  latency is mostly the scheduler's, the CPU time is the work;
* :func:`inline_ab` (``--inline-ab``): ``ibv_rc_pingpong`` with the poller's own receive
  step (the default) and with the futex hand-off from the progress thread
  (``SOFTRDMA_CAPI_INLINE=0``), alternated: usec/iter and CPU us per round trip;
* :func:`bw_cpu` (``--bw-cpu``): the CPU time per GB written of each side of the two
  write-bw pairs (each process's own ``wait4`` rusage, less a pair of :data:`BW_SHORT`
  iterations: start-up), alternated: steadier than the throughput on a busy machine;
* :func:`poll_costs`: ``tests/capi/wc_check.c bench`` under ``softrdma run``: the cost of
  one empty ``ibv_poll_cq`` (ns; polls that find the CQ empty, without the sleep that a
  long run of empty polls ends in: ``SOFTRDMA_CAPI_WAIT_US=0``), of one ``ibv_post_recv``
  (ns; 4,000 one call each, into the QP's receive ring) and of one loopback RC SEND with
  its two completions (us), each in wall and CPU time.

``python bench/capi_bench.py [--runs 3] [--quick]`` prints them; ``bench/run.py`` has the
two ratios as its ``capi_write_bw`` and ``capi_rc_lat`` figures.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))

from harness.perftest import env_for, kill_devd, make_device  # noqa: E402
from harness.ports import free_port  # noqa: E402

from softrdma.capi import build  # noqa: E402

BW_SIZE = 65536
LAT_SIZE = 64
SHORT = 10  # iterations of the pair whose CPU time counts as start-up (rc_cpu)
BW_SHORT = 500  # write-bw iterations whose CPU time counts as start-up (bw_cpu)
TIMEOUT = 300.0  # one pair, on a busy machine (s)
LISTEN_WAIT = 120.0
BW_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
PP_LAT = re.compile(r"([\d.]+) usec/iter")
COST = re.compile(r"^(empty_poll_ns|empty_poll_cpu_ns|post_recv_ns|post_recv_cpu_ns|"
                  r"send_round_us|send_round_cpu_us) "
                  r"([\d.]+)$", re.M)


class BenchError(RuntimeError):
    """A pair failed or printed no result."""


def _listening(port: int) -> bool:
    """Something listens on TCP ``port`` (from /proc: a probe connection would be taken by
    the server as its client)."""
    want = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                if any(ln.split()[1].endswith(want) and ln.split()[3] == "0A" for ln in f):
                    return True
        except OSError:
            continue
    return False


def _softrdma(*args: str) -> list[str]:
    return [sys.executable, "-m", "softrdma", *args]


def _pair(server: list[str], client: list[str], port: int, env: dict[str, str]) -> str:
    """Run ``server``, wait until it listens on ``port``, run ``client``: its stdout."""
    srv = subprocess.Popen(server, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + LISTEN_WAIT
        while not _listening(port):
            if srv.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"{server[-1]} server did not listen: "
                                 f"{(srv.communicate()[0] or '').strip()[-300:]}")
            time.sleep(0.05)
        cli = subprocess.run(client, env=env, capture_output=True, text=True,
                             timeout=TIMEOUT, stdin=subprocess.DEVNULL, check=False)
        srv.communicate(timeout=TIMEOUT)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    if cli.returncode or srv.returncode:
        raise BenchError(f"{' '.join(client[:6])}... failed (rc {cli.returncode}/"
                         f"{srv.returncode}): {(cli.stdout + cli.stderr).strip()[-300:]}")
    return cli.stdout


def _c(dev: str, prog: str, *args: str) -> list[str]:
    return _softrdma("run", "-d", dev, "--", prog, *args)


class Device:
    """A private registry holding one RoCE device on lo; its devd is stopped at the end."""

    def __enter__(self) -> Device:
        if build.missing_packages():
            raise BenchError("cannot build the C interface: install "
                             + ", ".join(build.missing_packages()))
        build.build()
        self._tmp = tempfile.TemporaryDirectory(prefix="capi-bench-")
        self.state = Path(self._tmp.name)
        self.name = make_device(self.state, "capibench")
        self.env = env_for(self.state)
        return self

    def __exit__(self, *exc: object) -> None:
        kill_devd(self.state)
        self._tmp.cleanup()


def _bw_of(out: str) -> float:
    for line in out.splitlines():
        m = BW_ROW.match(line)
        if m and int(m.group(1)) == BW_SIZE:
            return float(m.group(4))
    raise BenchError(f"no BW row in:\n{out[-500:]}")


def _lat_of(out: str) -> float:
    m = PP_LAT.search(out)
    if not m:
        raise BenchError(f"no usec/iter in:\n{out[-500:]}")
    return float(m.group(1))


def _write_bw_cmd(dev: Device, c: bool, iters: int) -> tuple[list[str], int]:
    """``ib_write_bw`` under softrdma run (``c``) or ``softrdma write-bw`` with the same
    flags, ``iters`` iterations of :data:`BW_SIZE`: the server's command and its port."""
    port = free_port()
    flags = ["-d", dev.name, "-x", "0", "-F", "-n", str(iters), "-s", str(BW_SIZE),
             "-p", str(port)]
    return (_c(dev.name, "ib_write_bw", *flags) if c else _softrdma("write-bw", *flags)), port


def _pingpong_cmd(dev: Device, c: bool, iters: int) -> tuple[list[str], int]:
    """``ibv_rc_pingpong`` under softrdma run (``c``) or ``softrdma rc-pingpong`` with the
    same flags, ``iters`` round trips of :data:`LAT_SIZE`: the server's command, its port."""
    port = free_port()
    flags = ["-d", dev.name, "-g", "0", "-n", str(iters), "-s", str(LAT_SIZE),
             "-p", str(port)]
    return (_c(dev.name, "ibv_rc_pingpong", *flags) if c
            else _softrdma("rc-pingpong", *flags)), port


def alternated(one: Callable[[bool], float]) -> tuple[float, float]:
    """``one(c)`` of the C program (``c``) and of the Python tool, in both orders (C,
    Python, Python, C): (the mean of the C pair's two results, the mean of the Python
    pair's). On a machine of few vCPUs a pair's figure depends on where the scheduler
    placed its two processes, which changes from one pair to the next (``bench/
    wake_cost.py``: a UDP ping-pong's round trip 17 us on one core, 72 us across two),
    and even a pair pinned to one core per process moves with the machine (91-124 us per
    iteration, docs/design.md); two pairs a side halve that variance, and the two orders
    cancel a drift within the run (a run of one pair each, always C first, gave ratios of
    0.56-1.70 for the same code within minutes). Both sides get the same treatment, so
    the ratio's expectation does not move."""
    got: dict[bool, list[float]] = {True: [], False: []}
    for c in (True, False, False, True):
        got[c].append(one(c))
    return statistics.fmean(got[True]), statistics.fmean(got[False])


def _write_bw_once(dev: Device, c: bool, iters: int) -> float:
    cmd, port = _write_bw_cmd(dev, c, iters)
    return _bw_of(_pair(cmd, [*cmd, "127.0.0.1"], port, dev.env))


def write_bw(dev: Device, iters: int) -> tuple[float, float]:
    """(``ib_write_bw`` under softrdma run, ``softrdma write-bw``) BW average in MB/s, each
    the mean of two pairs (:func:`alternated`)."""
    return alternated(lambda c: _write_bw_once(dev, c, iters))


def _wait_cpu(proc: subprocess.Popen[str], timeout: float) -> tuple[int, float]:
    """Wait for ``proc`` (its output goes to a file): its status and CPU seconds (its
    rusage from ``wait4``, with the children it waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, ru.ru_utime + ru.ru_stime
        if time.monotonic() > deadline:
            proc.kill()
            raise BenchError(f"{proc.args!r} did not end within {timeout:g} s")
        time.sleep(0.05)


def _pair_cpu(server: list[str], client: list[str], port: int, env: dict[str, str]
              ) -> tuple[str, float, float]:
    """:func:`_pair` with each side's CPU seconds: (client stdout, server s, client s)."""
    with tempfile.TemporaryFile("w+") as sout, tempfile.TemporaryFile("w+") as cout:
        srv = subprocess.Popen(server, env=env, stdout=sout, stderr=subprocess.STDOUT,
                               text=True, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + LISTEN_WAIT
            while not _listening(port):
                if srv.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"{server[-1]} server did not listen")
                time.sleep(0.05)
            cli = subprocess.Popen(client, env=env, stdout=cout, stderr=subprocess.STDOUT,
                                   text=True, stdin=subprocess.DEVNULL)
            crc, ccpu = _wait_cpu(cli, TIMEOUT)
            src, scpu = _wait_cpu(srv, TIMEOUT)
        finally:
            if srv.returncode is None:
                srv.kill()
                srv.wait()
        cout.seek(0)
        out = cout.read()
    if crc or src:
        raise BenchError(f"{' '.join(client[:6])}... failed (rc {crc}/{src}): "
                         f"{out.strip()[-300:]}")
    return out, scpu, ccpu


def bw_cpu(dev: Device, iters: int) -> dict[str, float]:
    """CPU seconds per GB written of the server and the client of ``ib_write_bw`` under
    softrdma run (``c``) and of ``softrdma write-bw`` (``py``): a pair of ``iters``
    iterations less one of :data:`BW_SHORT`, over the difference in bytes."""
    out: dict[str, float] = {}
    gb = (iters - BW_SHORT) * BW_SIZE / 1e9
    for c in (True, False):
        cpu = []
        for n in (BW_SHORT, iters):
            cmd, port = _write_bw_cmd(dev, c, n)
            _, scpu, ccpu = _pair_cpu(cmd, [*cmd, "127.0.0.1"], port, dev.env)
            cpu.append((scpu, ccpu))
        tag = "c" if c else "py"
        out[f"{tag} server s/GB"] = (cpu[1][0] - cpu[0][0]) / gb
        out[f"{tag} client s/GB"] = (cpu[1][1] - cpu[0][1]) / gb
    return out


def _rc_lat_once(dev: Device, c: bool, iters: int, env: dict[str, str] | None = None
                 ) -> float:
    """usec/iter of one :func:`_pingpong_cmd` pair (with ``env``; default the device's)."""
    cmd, port = _pingpong_cmd(dev, c, iters)
    return _lat_of(_pair(cmd, [*cmd, "127.0.0.1"], port, dev.env if env is None else env))


def rc_lat(dev: Device, iters: int) -> tuple[float, float]:
    """(``ibv_rc_pingpong`` under softrdma run, ``softrdma rc-pingpong``) usec/iter, each
    the mean of two pairs (:func:`alternated`)."""
    return alternated(lambda c: _rc_lat_once(dev, c, iters))


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _pingpong_cpu(dev: Device, c: bool, iters: int, env: dict[str, str]
                  ) -> tuple[float, float]:
    """The pair of :func:`_pingpong_cmd` with ``env``: (usec/iter of ``iters`` round
    trips, CPU us per round trip of both processes: a pair of ``iters`` iterations less
    one of ``SHORT``, over ``iters - SHORT``; the processes are children of this one,
    ``RUSAGE_CHILDREN``)."""
    cpu, lat = [], 0.0
    for n in (SHORT, iters):
        before = _children_cpu()
        lat = _rc_lat_once(dev, c, n, env)
        cpu.append(_children_cpu() - before)
    return lat, (cpu[1] - cpu[0]) / (iters - SHORT) * 1e6


def rc_cpu(dev: Device, iters: int) -> tuple[float, float]:
    """(``ibv_rc_pingpong`` under softrdma run, ``softrdma rc-pingpong``) CPU us per round
    trip of both processes (:func:`_pingpong_cpu`)."""
    return (_pingpong_cpu(dev, True, iters, dev.env)[1],
            _pingpong_cpu(dev, False, iters, dev.env)[1])


def inline_ab(dev: Device, iters: int, runs: int) -> dict[str, list[float]]:
    """``ibv_rc_pingpong`` with the poller's receive step (``inline``) and with the futex
    hand-off (``handoff``, ``SOFTRDMA_CAPI_INLINE=0``), alternated ``runs`` times."""
    rows: dict[str, list[float]] = {}
    for _ in range(runs):
        for mode, flag in (("handoff", "0"), ("inline", "1")):
            lat, cpu = _pingpong_cpu(dev, True, iters,
                                     {**dev.env, "SOFTRDMA_CAPI_INLINE": flag})
            rows.setdefault(f"{mode} us", []).append(lat)
            rows.setdefault(f"{mode} cpu us", []).append(cpu)
    return rows


def poll_costs(dev: Device) -> dict[str, float]:
    """``wc_check bench``: empty_poll_ns, post_recv_ns, send_round_us and their CPU time
    (empty_poll_cpu_ns, post_recv_cpu_ns: the calling thread's; send_round_cpu_us: the
    process's, its
    progress thread included), without the sleep that ends a
    long run of empty polls (``SOFTRDMA_CAPI_WAIT_US=0``: its million empty polls in a row
    would measure the sleep)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BenchError("gcc is needed for tests/capi/wc_check.c")
    exe = dev.state / "wc_check"
    src = HERE.parent / "tests" / "capi"
    subprocess.run([gcc, "-O2", "-I", str(src), "-o", str(exe), str(src / "wc_check.c"),
                    "-libverbs"], check=True, capture_output=True, timeout=TIMEOUT)
    env = {**dev.env, "SOFTRDMA_CAPI_WAIT_US": "0"}
    cp = subprocess.run(_c(dev.name, str(exe), dev.name, "bench"), env=env,
                        capture_output=True, text=True, timeout=TIMEOUT, check=False)
    got = {k: float(v) for k, v in COST.findall(cp.stdout)}
    if cp.returncode or len(got) != 6:
        raise BenchError(f"wc_check bench failed (rc {cp.returncode}): "
                         f"{(cp.stdout + cp.stderr).strip()[-300:]}")
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--inline-ab", action="store_true",
                    help="only the poller's receive step against the futex hand-off")
    ap.add_argument("--bw-cpu", action="store_true",
                    help="only the CPU time per GB of each side of the write-bw pairs")
    a = ap.parse_args(argv)
    if a.bw_cpu:
        per_gb: dict[str, list[float]] = {}
        with Device() as dev:
            for _ in range(a.runs):
                for k, x in bw_cpu(dev, 2000 if a.quick else 8000).items():
                    per_gb.setdefault(k, []).append(x)
        print(f"{a.runs} runs, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
        for k, v in per_gb.items():
            print(f"{k:16s} min {min(v):6.2f} median {statistics.median(v):6.2f}  "
                  + " ".join(f"{x:.2f}" for x in v))
        return 0
    if a.inline_ab:
        with Device() as dev:
            ab = inline_ab(dev, 500 if a.quick else 2000, a.runs)
        print(f"{a.runs} runs, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
        for k, v in ab.items():
            print(f"{k:16s} min {min(v):9.1f} median {statistics.median(v):9.1f}  "
                  + " ".join(f"{x:.1f}" for x in v))
        return 0
    bw_iters, lat_iters = (300, 200) if a.quick else (3000, 1000)
    cpu_iters = 2000 if a.quick else 5000  # long enough that start-up's spread is small
    rows: dict[str, list[float]] = {k: [] for k in (
        "ib_write_bw MB/s", "write-bw MB/s", "ibv_rc_pingpong us", "rc-pingpong us",
        "ibv_rc_pingpong cpu us", "rc-pingpong cpu us", "empty poll ns", "empty poll cpu ns",
        "post recv ns", "post recv cpu ns", "send round us", "send round cpu us")}
    with Device() as dev:
        for _ in range(a.runs):
            c, py = write_bw(dev, bw_iters)
            rows["ib_write_bw MB/s"].append(c)
            rows["write-bw MB/s"].append(py)
            c, py = rc_lat(dev, lat_iters)
            rows["ibv_rc_pingpong us"].append(c)
            rows["rc-pingpong us"].append(py)
            c, py = rc_cpu(dev, cpu_iters)
            rows["ibv_rc_pingpong cpu us"].append(c)
            rows["rc-pingpong cpu us"].append(py)
            cost = poll_costs(dev)
            rows["empty poll ns"].append(cost["empty_poll_ns"])
            rows["empty poll cpu ns"].append(cost["empty_poll_cpu_ns"])
            rows["post recv ns"].append(cost["post_recv_ns"])
            rows["post recv cpu ns"].append(cost["post_recv_cpu_ns"])
            rows["send round us"].append(cost["send_round_us"])
            rows["send round cpu us"].append(cost["send_round_cpu_us"])
    print(f"{a.runs} runs, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    for k, v in rows.items():
        best = max(v) if k.endswith("MB/s") else min(v)
        print(f"{k:26s} best {best:10.1f} median {statistics.median(v):10.1f}  "
              + " ".join(f"{x:.1f}" for x in v))
    for ours, base in (("ib_write_bw MB/s", "write-bw MB/s"),
                       ("ibv_rc_pingpong us", "rc-pingpong us"),
                       ("ibv_rc_pingpong cpu us", "rc-pingpong cpu us")):
        r = [x / y for x, y in zip(rows[ours], rows[base], strict=True)]
        print(f"ratio {ours.rsplit(' ', 1)[0]}: best {(max if 'MB' in ours else min)(r):.2f} "
              f"median {statistics.median(r):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
