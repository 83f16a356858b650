"""Every data-path benchmark of issue 15, each beside its baseline measured in the same run.

``python bench/run.py`` prints a table; ``python bench/run.py --json`` prints one JSON
object: per figure, softrdma's value and its baseline in each run, the ratio of each pair
of runs (best and median), the goal, the machine's core count, and the interpreter that
ran it and how it was built (``python_executable``, ``python_build``: the same Python
version built two ways gives figures several per cent apart).

A figure and its baseline alternate run by run (baseline, softrdma, baseline, softrdma,
...), so a change in the machine's load hits both. ``--runs`` (default 3) sets how many
pairs; ``--quick`` shrinks every transfer (a smoke run, not a measurement).

The figures (see each module for how it measures):

* ``roce_write_bw``: RC RDMA WRITE 1 MiB over RoCEv2 between two processes on loopback,
  vs plain Python UDP 4096 B datagrams (``roce_bench``). Goal >= 1.0.
* ``iwarp_write_bw_crc`` / ``iwarp_write_bw_nocrc``: iWARP RDMA WRITE 1 MiB with MPA
  CRC32c on / off, vs plain Python TCP (``iwarp_write_bw``). Goals >= 0.75 / >= 0.85 (issue 26).
* ``rc_send_lat``: RC SEND 64 B ping-pong half round trip vs a plain Python UDP ping-pong
  (``roce_bench``; lower is better). Goal <= 1.1.
* ``rc_send_lat_contended``: the median half round trip of that ping-pong with one
  busy-loop process running beside it, vs the same ping-pong alone, measured in the
  same run (``roce_bench.rc_send_lat_contended``; issue 25). Goal <= 2.
* ``shared_lat`` / ``shared_write_bw``: the same ping-pong and WRITE with both processes
  on one shared (devd-managed) device, vs two in-process devices (``shared_bench``).
  Goals <= 1.2 (latency) and >= 0.8 (throughput).
* ``shared_lat_udp``: that shared-device ping-pong vs the plain Python UDP ping-pong,
  measured in the same runs (the ping-pong goal "through a shared device"). Goal <= 1.1.
* ``scaling_2`` / ``scaling_4``: aggregate RC WRITE throughput of 2 and 4 client/server
  process pairs on one shared device vs one pair (``shared_bench``). Goal >= 1.6 for two.
* ``tool_rc_pingpong`` / ``tool_send_lat`` / ``tool_write_lat``: the command-line tools'
  round trip (``softrdma rc-pingpong -s 64``: usec/iter; ``send-lat`` / ``write-lat -s 64``:
  two times t_typical), server and client as two processes on the default device, vs
  the bench's ping-pong round trip (two times ``rc_send_lat``) in the same run
  (``tool_lat``; issue 26). Goal <= 1.2. The tools also wait for each SEND's ACK.
* ``rc_send_lat_ackwait``: the bench's ping-pong with each side also awaiting its SEND's
  completion (the peer's ACK) before the next SEND, as the tools do, vs the plain
  ping-pong, round trips in the same run (``roce_bench.rc_send_lat(wait_send=True)``;
  issue 26). Goal <= 1.2: what the ACK costs a tool that awaits it, the floor of the
  ``tool_*`` figures.
* ``lossy_goodput_1`` / ``lossy_goodput_5``: goodput of an RC QP on a 1 Gbit/s link that
  loses 1 % / 5 % of the packets vs the same link without loss, on the engine's virtual
  clock (``lossy_goodput``; run ``i`` uses seed ``i``). Goals >= 0.6 / >= 0.3.
* ``cm_rate_roce`` / ``cm_rate_iwarp``: connections set up and torn down per second
  through the rdma_cm API on the loopback (resolve, QP on each side, connect, accept,
  ESTABLISHED, disconnect, destroy) over RoCE (IB CM + Annex A11, through devd) and
  iWARP (TCP + MPA), vs plain Python TCP connect/accept/close with 4 bytes each way in
  the same process and run (``cm_rate``; issue 26). Goal >= 0.1 (the issue asks for
  >= 1000 connections/s: the softrdma column).
* ``capi_write_bw``: perftest's ``ib_write_bw -s 65536`` under ``softrdma run`` (issue 22)
  vs ``softrdma write-bw`` with the same flags, two processes on one shared device
  (``capi_bench``). Goal >= 0.9.
* ``capi_rc_lat``: ``ibv_rc_pingpong -s 64`` under ``softrdma run`` vs ``softrdma
  rc-pingpong -s 64``, usec/iter (``capi_bench``; lower is better). Goal <= 1.1.
  A run of either is two pairs a side in the order C, Python, Python, C, and each side's
  figure the mean of its two (``capi_bench.alternated``).
* ``ipoib_connected`` / ``ipoib_datagram``: iperf3 TCP through ``softrdma ipoib`` between
  two network namespaces joined by a veth pair (MTU 9000), connected mode (RC, the
  default MTU, 65212) and datagram mode (UD, MTU 4092), vs iperf3 over the bare veth pair measured in the
  same round (``ipoib_iperf``; issue 26; root and iperf3, else reported as an error).
  Goals >= 0.3 / >= 0.1.

With the figures, ``--json`` records ``wake``: a plain UDP ping-pong's round trip with
both processes on one core and on two (``wake_cost``). Where they differ by several
times (a virtual machine whose idle vCPUs halt), every latency figure depends on where
the scheduler placed its processes in that run, and its runs spread accordingly.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import capi_bench as cb  # noqa: E402
import ipoib_iperf as ipi  # noqa: E402
import iwarp_write_bw as iwb  # noqa: E402
import lossy_goodput as lg  # noqa: E402
import roce_bench as rb  # noqa: E402
import shared_bench as sb  # noqa: E402
import tool_lat as tl  # noqa: E402
import wake_cost as wc  # noqa: E402
from harness.ports import port_free  # noqa: E402

MIB = 1 << 20


@dataclass
class Figure:
    """One figure: softrdma's value and its baseline, run by run."""

    name: str
    what: str
    unit: str
    baseline_what: str
    goal: float
    higher_is_better: bool
    ours: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    error: str | None = None
    #: per-run diagnostics beside the values (name -> one number per run), in the JSON
    notes: dict[str, list[float]] = field(default_factory=dict)

    def ratios(self) -> list[float]:
        return [o / b for o, b in zip(self.ours, self.base, strict=True) if b > 0]

    def best_ratio(self) -> float | None:
        r = self.ratios()
        if not r:
            return None
        return max(r) if self.higher_is_better else min(r)

    def median_ratio(self) -> float | None:
        r = self.ratios()
        return statistics.median(r) if r else None

    def met(self) -> bool | None:
        med = self.median_ratio()
        if med is None:
            return None
        return med >= self.goal if self.higher_is_better else med <= self.goal

    def as_dict(self) -> dict[str, Any]:
        best = (max if self.higher_is_better else min)
        return {
            "what": self.what, "unit": self.unit, "baseline": self.baseline_what,
            "softrdma": self.ours, "baseline_values": self.base,
            "softrdma_best": best(self.ours) if self.ours else None,
            "baseline_best": best(self.base) if self.base else None,
            "ratios": self.ratios(), "ratio_best": self.best_ratio(),
            "ratio_median": self.median_ratio(),
            "goal": f"{'>=' if self.higher_is_better else '<='} {self.goal}",
            "goal_met": self.met(), "error": self.error,
            **({"notes": self.notes} if self.notes else {}),
        }


class _Ports:
    """Fresh ports for each run (a port in TIME_WAIT-like reuse never collides): ``n``
    consecutive ones, each free now for UDP and TCP on the loopback. They start below the
    kernel's ephemeral range (``ip_local_port_range``, 32768-60999 by default), where any
    outgoing connection may have taken one (a tool's server then failed to listen)."""

    def __init__(self, first: int) -> None:
        self.next = first

    def take(self, n: int = 4) -> int:
        while True:
            p = self.next
            self.next += n
            if all(port_free(q) for q in range(p, p + n)):
                return p


def _pairs(fig: Figure, runs: int, base: Callable[[], float], ours: Callable[[], float]) -> None:
    for _ in range(runs):
        try:
            fig.base.append(base())
            fig.ours.append(ours())
        except Exception as exc:  # a benchmark that breaks is reported, not fatal
            fig.error = f"{type(exc).__name__}: {exc}"
            del fig.base[len(fig.ours):]
            return


def _pairs2(fig: Figure, runs: int, both: Callable[[], tuple[float, float]]) -> None:
    """``both`` returns (softrdma, baseline) from one run of a bench that measures both."""
    for _ in range(runs):
        try:
            o, b = both()
        except Exception as exc:
            fig.error = f"{type(exc).__name__}: {exc}"
            return
        fig.ours.append(o)
        fig.base.append(b)


def _seeded(run: Callable[[int], tuple[float, float]]) -> Callable[[], tuple[float, float]]:
    """``run(seed)`` as a callable of no argument: seed 0 the first time, then 1, 2, ..."""
    seeds = iter(range(1 << 30))
    return lambda: run(next(seeds))


#: every figure :func:`measure` can run, in its order
FIGURES = ("roce_write_bw", "iwarp_write_bw_crc", "iwarp_write_bw_nocrc", "rc_send_lat",
           "rc_send_lat_contended", "shared_lat", "shared_lat_udp", "shared_write_bw",
           "scaling_2", "scaling_4", "lossy_goodput_1", "lossy_goodput_5",
           "tool_rc_pingpong", "tool_send_lat", "tool_write_lat", "rc_send_lat_ackwait",
           "cm_rate_roce", "cm_rate_iwarp", "capi_write_bw", "capi_rc_lat",
           "ipoib_connected", "ipoib_datagram")


def measure(runs: int, quick: bool, only: set[str] | None) -> list[Figure]:
    total = (32 if quick else 256) * MIB
    sb_total = (16 if quick else 64) * MIB  # per pair on the shared device
    iters = 500 if quick else 5000
    iw_count = 32 if quick else 256
    ports = _Ports(20000 + (os.getpid() % 500) * 16)
    figs: list[Figure] = []

    def want(name: str) -> bool:
        return only is None or name in only

    if want("roce_write_bw"):
        f = Figure("roce_write_bw", "RC RDMA WRITE 1 MiB, RoCEv2, loopback", "MiB/s",
                   "plain Python UDP, 4096 B datagrams", 1.0, True)
        _pairs(f, runs, lambda: rb.udp_bw(total, 4096, ports.take())[0] / MIB,
               lambda: rb.rdma_write_bw(total, MIB, ports.take()) / MIB)
        figs.append(f)
    for crc in (True, False):
        name = "iwarp_write_bw_crc" if crc else "iwarp_write_bw_nocrc"
        if not want(name):
            continue
        f = Figure(name, f"iWARP RDMA WRITE 1 MiB, CRC32c {'on' if crc else 'off'}", "MB/s",
                   "plain Python TCP", 0.75 if crc else 0.85, True)
        _pairs(f, runs, lambda: iwb.tcp_bw(MIB * iw_count) / 1e6,
               lambda c=crc: iwb.iwarp_write_bw(MIB * iw_count, MIB, c) / 1e6)  # type: ignore[misc]
        figs.append(f)
    if want("rc_send_lat"):
        f = Figure("rc_send_lat", "RC SEND 64 B ping-pong, half round trip", "us",
                   "plain Python UDP ping-pong", 1.1, False)
        _pairs(f, runs, lambda: rb.udp_lat(iters, ports.take()) * 1e6,
               lambda: rb.rc_send_lat(iters, ports.take()) * 1e6)
        figs.append(f)
    if want("rc_send_lat_contended"):
        f = Figure("rc_send_lat_contended", "RC SEND 64 B ping-pong beside one busy-loop "
                   "process, median half round trip", "us", "the same ping-pong alone", 2.0,
                   False)
        def contended() -> tuple[float, float]:
            busy, alone = rb.rc_send_lat_contended(iters, ports.take(), ports.take())
            return busy * 1e6, alone * 1e6

        _pairs2(f, runs, contended)
        figs.append(f)
    if want("shared_lat") or want("shared_lat_udp"):
        f = Figure("shared_lat", "64 B ping-pong, both processes on one shared device", "us",
                   "two in-process devices", 1.2, False)
        fu = Figure("shared_lat_udp", "RC SEND 64 B ping-pong through one shared device, "
                    "half round trip", "us", "plain Python UDP ping-pong", 1.1, False)
        for _ in range(runs):
            try:
                diag: list[float] = []
                shared, inproc = sb.shared_pingpong_lat(iters, diag)
                udp = rb.udp_lat(iters, ports.take())
            except Exception as exc:
                f.error = fu.error = f"{type(exc).__name__}: {exc}"
                break
            f.ours.append(shared * 1e6)
            f.base.append(inproc * 1e6)
            # a slow run with calm episodes: a spin lost the CPU (shared_bench.pingpong)
            f.notes.setdefault("calm_episodes", []).append(diag[4])
            f.notes.setdefault("calm_episodes_baseline", []).append(diag[5])
            fu.ours.append(shared * 1e6)
            fu.base.append(udp * 1e6)
        figs += [x for x in (f, fu) if want(x.name)]
    if want("shared_write_bw"):
        f = Figure("shared_write_bw", "RC RDMA WRITE 1 MiB, both processes on one shared device",
                   "MiB/s", "two in-process devices", 0.8, True)
        _pairs2(f, runs, lambda: tuple(x / MIB for x in sb.shared_write_bw(sb_total)))  # type: ignore[arg-type,return-value]
        figs.append(f)
    if want("scaling_2") or want("scaling_4"):
        f2 = Figure("scaling_2", "aggregate RC WRITE, 2 process pairs on one shared device",
                    "MiB/s", "1 pair", 1.6, True)
        f4 = Figure("scaling_4", "aggregate RC WRITE, 4 process pairs on one shared device",
                    "MiB/s", "1 pair", 1.6, True)
        for _ in range(runs):
            try:
                s = sb.scaling((1, 2, 4), sb_total)
            except Exception as exc:
                f2.error = f4.error = f"{type(exc).__name__}: {exc}"
                break
            for fig, k in ((f2, 2), (f4, 4)):
                fig.base.append(s[1] / MIB)
                fig.ours.append(s[k] / MIB)
        figs += [f for f in (f2, f4) if want(f.name)]
    tool_iters = 300 if quick else 3000
    for name, what, tool in (
            ("tool_rc_pingpong", "softrdma rc-pingpong -s 64, usec/iter", None),
            ("tool_send_lat", "softrdma send-lat -s 64, 2 x t_typical", "send-lat"),
            ("tool_write_lat", "softrdma write-lat -s 64, 2 x t_typical", "write-lat")):
        if not want(name):
            continue
        f = Figure(name, what + " (round trip)", "us",
                   "the bench's RC SEND ping-pong round trip", 1.2, False)

        def ours(t: str | None = tool) -> float:
            port = ports.take()
            if t is None:
                return tl.rc_pingpong_us(tool_iters, port)
            return tl.perftest_lat_us(t, tool_iters, port)

        _pairs(f, runs, lambda: 2 * rb.rc_send_lat(iters, ports.take()) * 1e6, ours)
        figs.append(f)
    if want("rc_send_lat_ackwait"):
        f = Figure("rc_send_lat_ackwait", "RC SEND 64 B ping-pong, each SEND's ACK awaited "
                   "too (as ibv_rc_pingpong), round trip", "us",
                   "the bench's RC SEND ping-pong round trip", 1.2, False)
        _pairs(f, runs, lambda: 2 * rb.rc_send_lat(iters, ports.take()) * 1e6,
               lambda: 2 * rb.rc_send_lat(iters, ports.take(), wait_send=True) * 1e6)
        figs.append(f)
    for pct, goal in ((1, 0.6), (5, 0.3)):
        name = f"lossy_goodput_{pct}"
        if not want(name):
            continue
        f = Figure(name, f"RC WRITE goodput, 1 Gbit/s link losing {pct} % (virtual time)",
                   "Mbit/s", "the same link without loss", goal, True)
        _pairs2(f, runs, _seeded(lambda seed, p=pct: lg.pair(  # type: ignore[misc]
            p / 100, seed, 0.02 if quick else lg.DURATION_S)))
        figs.append(f)
    figs += _cm_rate_figures(runs, quick, want)
    figs += _capi_figures(runs, quick, want)
    figs += _ipoib_figures(runs, quick, want)
    return figs


def _cm_rate_figures(runs: int, quick: bool, want: Callable[[str], bool]) -> list[Figure]:
    """rdma_cm connection rates (issue 26): each run is one ``cm_rate.py`` process that
    measures the TCP baseline, then RoCE and iWARP (in a private state directory)."""
    figs = {t: Figure(f"cm_rate_{t}", f"rdma_cm connect + accept + disconnect, {label}, "
                      "loopback", "conn/s", "plain Python TCP connect/accept/close", 0.1, True)
            for t, label in (("roce", "RoCE"), ("iwarp", "iWARP"))
            if want(f"cm_rate_{t}")}
    if not figs:
        return []
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "cm_rate.py"), "-n", "50" if quick else "300",
           "--json", "--transport", "tcp"]
    for t in figs:
        cmd += ["--transport", t]
    for _ in range(runs):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
            got = json.loads(r.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, ValueError, IndexError, OSError) as exc:
            err = getattr(exc, "stderr", None) or str(exc)
            for f in figs.values():
                f.error = f"{type(exc).__name__}: {str(err).strip()[-300:]}"
            break
        for t, f in figs.items():
            f.ours.append(float(got[t]))
            f.base.append(float(got["tcp"]))
    return list(figs.values())


def _ipoib_figures(runs: int, quick: bool, want: Callable[[str], bool]) -> list[Figure]:
    """iperf3 through ``softrdma ipoib``, both modes, vs the bare veth of the same round."""
    figs = {m: Figure(f"ipoib_{m}", f"iperf3 TCP through softrdma ipoib, {m} mode",
                      "Mbit/s", "iperf3 over the bare veth pair (MTU 9000)", goal, True)
            for m, goal in (("connected", 0.3), ("datagram", 0.1)) if want(f"ipoib_{m}")}
    if not figs:
        return []
    why = ipi.unavailable()
    try:
        if why is not None:
            raise RuntimeError(why)
        for base, got in ipi.rounds(runs, 1.0 if quick else 5.0, tuple(figs)):
            for m, f in figs.items():
                f.base.append(base / 1e6)
                f.ours.append(got[m] / 1e6)
    except Exception as exc:  # reported, not fatal
        for f in figs.values():
            f.error = f"{type(exc).__name__}: {exc}"
    return list(figs.values())


def _capi_figures(runs: int, quick: bool, want: Callable[[str], bool]) -> list[Figure]:
    """The C programs' figures (issue 22): stock tools under ``softrdma run`` vs softrdma's
    Python tools, on one private shared device (``capi_bench``)."""
    figs = [Figure("capi_write_bw", "ib_write_bw 64 KiB under softrdma run, shared device",
                   "MB/s", "softrdma write-bw, same flags", 0.9, True),
            Figure("capi_rc_lat", "ibv_rc_pingpong -s 64 under softrdma run, round trip",
                   "us", "softrdma rc-pingpong -s 64", 1.1, False)]
    figs = [f for f in figs if want(f.name)]
    if not figs:
        return []
    bw_iters, lat_iters = (300, 200) if quick else (3000, 1000)
    try:
        with cb.Device() as dev:
            for f in figs:
                if f.name == "capi_write_bw":
                    _pairs2(f, runs, lambda: cb.write_bw(dev, bw_iters))
                else:
                    _pairs2(f, runs, lambda: cb.rc_lat(dev, lat_iters))
    except cb.BenchError as exc:  # no compiler or headers: reported, not fatal
        for f in figs:
            f.error = f.error or str(exc)
    return figs


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(figs: list[Figure]) -> str:
    lines = [f"{'figure':22s} {'softrdma best':>14s} {'baseline best':>14s} {'ratio best':>10s} "
             f"{'median':>7s} {'goal':>7s}  met"]
    for f in figs:
        d = f.as_dict()
        lines.append(f"{f.name:22s} {_fmt(d['softrdma_best'], 1):>14s} "
                     f"{_fmt(d['baseline_best'], 1):>14s} {_fmt(d['ratio_best']):>10s} "
                     f"{_fmt(d['ratio_median']):>7s} {d['goal']:>7s}  "
                     f"{'-' if d['goal_met'] is None else ('yes' if d['goal_met'] else 'no')}"
                     f"{'  ERROR: ' + f.error if f.error else ''}")
        lines.append(f"{'':22s} {f.what} ({f.unit}) vs {f.baseline_what}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object, not a table")
    ap.add_argument("--runs", type=int, default=3, help="runs of each figure (default 3)")
    ap.add_argument("--quick", action="store_true", help="small transfers: a smoke run")
    ap.add_argument("--only", action="append", metavar="FIGURE", choices=FIGURES,
                    help="run only this figure (repeatable): " + ", ".join(FIGURES))
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error("--runs must be >= 1")
    mp.set_start_method("fork", force=True)
    t0 = time.time()
    figs = measure(a.runs, a.quick, set(a.only) if a.only else None)
    wake = wc.measure(300 if a.quick else 2000)
    load = os.getloadavg()
    if a.json:
        print(json.dumps({
            "cores": os.cpu_count(), "python": platform.python_version(),
            "python_executable": os.path.realpath(sys.executable),
            "python_build": _interpreter(),
            "machine": platform.machine(), "runs": a.runs, "quick": a.quick,
            "loadavg_after": [round(x, 2) for x in load],
            "wake": wake,
            "seconds": round(time.time() - t0, 1),
            "figures": {f.name: f.as_dict() for f in figs},
        }, indent=2))
    else:
        print(table(figs))
        print(f"{os.cpu_count()} cores, {a.runs} runs per figure, load after "
              f"{load[0]:.2f}, {time.time() - t0:.0f} s; UDP ping-pong round trip "
              f"{wake['same_core_us']} us on one core, {wake['cross_core_us']} us across "
              "cores (bench/wake_cost.py)")
        print(f"Python {platform.python_version()}, {os.path.realpath(sys.executable)} "
              f"({_interpreter()})")
    return 1 if any(f.error for f in figs) else 0


def _interpreter() -> str:
    """How the interpreter was built, which moves every figure: one Python version built
    two ways differs by several per cent per packet (Debian's ``python3.11``, whose
    executable has the interpreter linked in, against a pyenv build that loads
    ``libpython3.11.so``: 3-10 % less CPU per packet in ``bench/profile_roce.py``;
    docs/design.md, "IP over InfiniBand")."""
    try:
        with open("/proc/self/maps") as f:
            how = ("libpython loaded as a shared library" if "libpython" in f.read()
                   else "libpython linked in")
    except OSError:  # Py_ENABLE_SHARED would not tell: Debian's says 1 for a linked-in one
        how = "libpython: unknown"
    return f"{platform.python_compiler()}, {how}"


if __name__ == "__main__":
    raise SystemExit(main())
