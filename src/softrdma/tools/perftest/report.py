"""perftest's output (perftest_parameters.c): the header block, the address lines, the BW
and latency tables with perftest's formulas and printf formats, ``--json``, and the live
progress line.

BW (``print_report_bw``): average = size x iterations / (last completion - first post);
peak = the best rate of any run of consecutive WRs, from post to the completion that
covers it; MB/sec is 2^20 bytes/s, Gb/sec 10^9 bits/s (``--report_gbits``). Latency
(``print_report_lat``): the gaps between consecutive posts (halved for the ping-pong
tests, WRITE and SEND), sorted, the 2 largest dropped (``LAT_MEASURE_TAIL``); t_typical
is the median, stdev is computed on integer-truncated deviations as perftest does.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from .oob import BwReport, Dest
from .options import Options

RESULT_LINE = "-" * 87
RESULT_FMT = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
RESULT_FMT_G = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
RESULT_FMT_LAT = (" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    "
                  "t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ")
LAT_MEASURE_TAIL = 2
MBS_FACTOR = 0x100000
GBS_FACTOR = 125000000
PROGRESS_AFTER_S = 2.0


def c_hex(value: int, width: int) -> str:
    """printf ``%#0<width>x``: ``0x`` counts in the width, and 0 has no prefix."""
    if value == 0:
        return "0" * width
    return "0x" + format(value, "x").rjust(width - 2, "0")


def header(o: Options, device: str, transport: str, mtu_bytes: int, gid_index: int,
           out_reads: int) -> list[str]:
    """``ctx_print_test_info``."""
    spec = o.spec
    title = spec.title + " "
    if spec.verb == "atomic":
        title += o.atomic_type + " "
    if spec.tst == "bw" and o.duplex:
        title += "Bidirectional "
    title += "BW " if spec.tst == "bw" else "Latency "
    lines = [RESULT_LINE, " " * 20 + title + "Test"]
    if o.events:
        lines.append(f" Test with events. Using {device}_comp0")
    lines += [f" Dual-port       : OFF\t\tDevice         : {device}",
              f" Number of qps   : {o.num_qps}\t\tTransport type : "
              f"{'IW' if transport == 'iwarp' else 'IB'}",
              f" Connection type : {o.connection}\t\tUsing SRQ      : OFF",
              f" PCIe relax order: {'OFF' if o.name == 'write-lat' else 'ON'}",
              " ibv_wr* API     : OFF"]
    if o.is_client or o.duplex:
        lines.append(f" TX depth        : {o.tx_depth}")
    if spec.verb == "send" and (not o.is_client or o.duplex):
        lines.append(f" RX depth        : {o.rx_depth}")
    if spec.tst == "bw":
        lines.append(f" CQ Moderation   : {o.cq_mod}")
    lines += [f" Mtu             : {mtu_bytes}[B]", " Link type       : Ethernet",
              f" GID index       : {gid_index}"]
    if spec.verb in ("read", "atomic"):
        lines.append(f" Outstand reads  : {out_reads}")
    else:
        lines.append(f" Max inline data : {o.inline_size}[B]")
    lines.append(f" rdma_cm QPs\t : {'ON' if o.rdma_cm else 'OFF'}")
    method = f" Data ex. method : {'rdma_cm' if o.rdma_cm else 'Ethernet'}"
    if o.rdma_cm and not o.is_client:
        lines += [method, RESULT_LINE, " Waiting for client rdma_cm QP to connect",
                  " Please run the same command with the IB/RoCE interface IP"]
    else:
        lines.append(method)
    lines.append(RESULT_LINE)
    return lines


def address_lines(side: str, d: Dest, verb: str) -> list[str]:
    """``ctx_print_pingpong_data`` (BASIC_ADDR_FMT [+ READ_FMT] [+ RDMA_FMT], PERF_GID_FMT)."""
    line = (f" {side} address: LID {c_hex(d.lid, 4)} QPN {c_hex(d.qpn, 6)} "
            f"PSN {c_hex(d.psn, 6)}")
    if verb in ("read", "atomic"):
        line += f" OUT {c_hex(d.out_reads, 4)}"
    if verb != "send":
        line += f" RKey {c_hex(d.rkey, 8)} VAddr {c_hex(d.vaddr, 16)}"
    return [line, " GID: " + ":".join(f"{b:02d}" for b in d.gid)]


# ---- BW --------------------------------------------------------------------------------

def bw_peak_delta(tposted: list[float], tcompleted: list[float], cq_mod: int) -> float:
    """The shortest time per message of any run of WRs (perftest's ``opt_delta``)."""
    n = len(tcompleted)
    best = tcompleted[-1] - tposted[0] if n else 0.0
    signaled = list(range(cq_mod - 1, n, cq_mod))
    if n % cq_mod:
        signaled.append(n - 1)
    step = max(1, (n * len(signaled)) // 400_000)  # bound the O(n^2/cq_mod) search
    for i in range(0, n, step):
        tp = tposted[i]
        for j in signaled:
            if j >= i:
                t = (tcompleted[j] - tp) / (j - i + 1)
                if t < best:
                    best = t
    return best


def bw_report(size: int, tposted: list[float], tcompleted: list[float], cq_mod: int,
              gbits: bool) -> BwReport:
    """``print_report_bw`` (times in seconds)."""
    n = len(tcompleted)
    factor = GBS_FACTOR if gbits else MBS_FACTOR
    total = max(tcompleted[-1] - tposted[0], 1e-9) if n else 1e-9
    avg = size * n / (total * factor)
    rate = n / (total * 1e6)
    delta = max(bw_peak_delta(tposted, tcompleted, cq_mod), 1e-12) if n else 1e-12
    peak = size / (delta * factor)
    return BwReport(size, n, peak, avg, rate)


def output_number(o: Options, r: BwReport | LatReport) -> str:
    """``--output``: the one number perftest prints (``"%lf"``): the average BW, the
    message rate, or the average latency."""
    if isinstance(r, BwReport):
        return f"{r.msg_rate if o.output == 'message_rate' else r.bw_avg:f}"
    return f"{r.t_avg:f}"


def sum_reports(mine: BwReport, theirs: BwReport) -> BwReport:
    """``print_full_bw_report`` of a bidirectional run: both directions added."""
    return BwReport(mine.size, mine.iters, mine.bw_peak + theirs.bw_peak,
                    mine.bw_avg + theirs.bw_avg, mine.msg_rate + theirs.msg_rate)


def bw_table_header(gbits: bool) -> list[str]:
    return [RESULT_LINE, RESULT_FMT_G if gbits else RESULT_FMT]


def bw_line(r: BwReport, gbits: bool) -> str:
    """``REPORT_FMT`` (or ``REPORT_FMT_EXT`` below 0.1 Gb/sec)."""
    if gbits and r.bw_avg < 0.1:
        return (f" {r.size:<7d}    {r.iters}           {r.bw_peak:<7.6f}            "
                f"{r.bw_avg:<7.6f}            {r.msg_rate:<7.6f}")
    return (f" {r.size:<7d}    {r.iters:<10d}       {r.bw_peak:<7.2f}            "
            f"{r.bw_avg:<7.2f}\t\t   {r.msg_rate:<7.6f}")


# ---- latency ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LatReport:
    size: int
    iters: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float
    t_stdev: float
    p99: float
    p99_9: float


def lat_report(size: int, tposted: list[float], rtt_factor: int) -> LatReport:
    """``print_report_lat`` (times in seconds in, microseconds out)."""
    iters = len(tposted)
    q = 1e-6 * rtt_factor
    delta = sorted((tposted[i + 1] - tposted[i]) / q for i in range(iters - 1))
    cnt = len(delta) - LAT_MEASURE_TAIL
    if cnt < 1:
        cnt = max(len(delta), 1)
        delta = delta or [0.0]
    median = (delta[cnt // 2] + delta[cnt // 2 - 1]) / 2 if (cnt - 1) % 2 else delta[cnt // 2]
    avg = sum(delta[:cnt]) / cnt
    var = sum(float(int(avg - d) ** 2) for d in delta[:cnt])
    top = len(delta) - 1
    return LatReport(size, iters, delta[0], delta[min(cnt, top)], median, avg,
                     math.sqrt(var / cnt), delta[min(math.ceil(cnt * 0.99), top)],
                     delta[min(math.ceil(cnt * 0.999), top)])


def lat_table_header() -> list[str]:
    return [RESULT_LINE, RESULT_FMT_LAT]


def lat_line(r: LatReport) -> str:
    """``REPORT_FMT_LAT``."""
    return (f" {r.size:<7d} {r.iters}          {r.t_min:<7.2f}        {r.t_max:<7.2f}      "
            f"{r.t_typical:<7.2f}  \t       {r.t_avg:<7.2f}     \t{r.t_stdev:<7.2f}\t\t"
            f"{r.p99:<7.2f} \t\t{r.p99_9:<7.2f}")


# ---- JSON and progress -----------------------------------------------------------------

def json_object(o: Options, device: str, transport: str, mtu_bytes: int,
                results: list[BwReport] | list[LatReport], role: str,
                error: str | None = None) -> str:
    """The ``--json`` form: the test parameters and one entry per message size; a run
    that failed has ``error`` (the message also on stderr) and the sizes it finished."""
    unit = "Gb/sec" if o.report_gbits else "MB/sec"
    rows: list[dict[str, float | int]] = []
    for r in results:
        if isinstance(r, BwReport):
            rows.append({"MsgSize": r.size, "n_iterations": r.iters, "BW_peak": r.bw_peak,
                         "BW_average": r.bw_avg, "MsgRate": r.msg_rate})
        else:
            rows.append({"MsgSize": r.size, "n_iterations": r.iters, "t_min": r.t_min,
                         "t_max": r.t_max, "t_typical": r.t_typical, "t_avg": r.t_avg,
                         "t_stdev": r.t_stdev, "percentile_99": r.p99,
                         "percentile_99_9": r.p99_9})
    obj = {"test": o.name, "role": role, "device": device, "transport": transport,
           "connection_type": o.connection, "bidirectional": o.duplex, "num_of_qps": o.num_qps, "mtu": mtu_bytes,
           "rdma_cm": o.rdma_cm, "bw_unit": unit if o.spec.tst == "bw" else None,
           "lat_unit": "usec" if o.spec.tst == "lat" else None, "results": rows}
    if error is not None:
        obj["error"] = error
    return json.dumps(obj, sort_keys=False)


class Progress:
    """A live ``\\r`` line on stderr once a run takes longer than a few seconds; silent
    under ``--json`` or when stdout is not a terminal. A run of ``-n`` messages shows
    how many of ``total`` completed; a run of ``-D duration`` seconds shows the messages
    completed and the time against the duration (``-n`` does not apply there)."""

    def __init__(self, enabled: bool, total: int, what: str,
                 stream: TextIO | None = None, duration: float | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.duration = duration
        self.total = total
        self.what = what
        self.start = time.monotonic()
        self.last = 0.0
        self.shown = False

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.start < PROGRESS_AFTER_S or now - self.last < 0.5:
            return
        self.last = now
        elapsed = now - self.start
        if self.duration:
            pct = min(100.0, 100.0 * elapsed / self.duration)
            self.stream.write(f"\r {self.what}: {done} done, {elapsed:6.1f}/"
                              f"{self.duration:g} s ({pct:5.1f}%)")
        else:
            pct = 100.0 * done / self.total if self.total else 0.0
            self.stream.write(f"\r {self.what}: {done}/{self.total} ({pct:5.1f}%) "
                              f"{elapsed:6.1f} s")
        self.stream.flush()
        self.shown = True

    def finish(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 60 + "\r")
            self.stream.flush()
            self.shown = False
