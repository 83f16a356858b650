"""Parsing what the tools print: perftest tables, pingpong and rping lines, counters.

Pure functions over text, so they are unit-tested without the lab. The formats are
rdma-core's and perftest 4.5's, which softrdma's tools copy:

* perftest BW table: ``#bytes #iterations BW peak[MB/sec] BW average[MB/sec]
  MsgRate[Mpps]`` (``[Gb/sec]`` with ``--report_gbits``), one row of numbers after it;
* perftest latency table: ``#bytes #iterations t_min[usec] t_max[usec] t_typical[usec]
  t_avg[usec] t_stdev[usec] 99% percentile[usec] 99.9% percentile[usec]``;
* ``ibv_*_pingpong``: ``N bytes in S seconds = R Mbit/sec`` and ``N iters in S seconds
  = U usec/iter``;
* ``rdma statistic show link DEV/1``: ``link rxe0/1 name value name value ...``;
* ``rdma res show qp``: one line per QP, ``link rxe0/1 lqpn N type RC state RTS ...
  comm NAME``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "Figures", "parse_perftest", "parse_pingpong", "parse_rdma_statistic",
    "parse_hw_counters", "user_qps", "counter_delta", "error_lines", "pcap_check_lines",
    "pcap_check_packets", "FIRST_CONNECTION_FAILED", "first_connection_failed",
    "second_connection_refused", "rstream_done",
]

Figures = dict[str, float]

#: what a perftest ``-R`` client prints when its first rdma_cm connection (perftest's own
#: exchange channel: ``establish_connection`` -> ``rdma_client_connect``) failed, e.g. on a
#: REJ with reason 8, Invalid Service ID (IBA 12.6.7.2: nobody listens on it yet); its
#: server saw no request then and still waits for its first client
FIRST_CONNECTION_FAILED = "Unable to perform rdma_client function"

_NUM = r"[-+]?\d+(?:\.\d+)?"
_BW_KEYS = ("bytes", "iterations", "bw_peak", "bw_avg", "msg_rate")
_LAT_KEYS = ("bytes", "iterations", "t_min", "t_max", "t_typical", "t_avg", "t_stdev",
             "p99", "p999")
_PP_BYTES = re.compile(rf"(\d+) bytes in ({_NUM}) seconds = ({_NUM}) Mbit/sec")
_PP_ITERS = re.compile(rf"(\d+) iters in ({_NUM}) seconds = ({_NUM}) usec/iter")
_STAT = re.compile(r"^link (\S+)/(\d+)\s+(.*)$")
_PCAP_SUMMARY = re.compile(r": (\d+) packets, (\d+) ok, (\d+) failed")
_PCAP_CONV = re.compile(r": \d+ connections? followed, \d+ inconsistent")
_QP = re.compile(r"^link \S+ lqpn (\d+) .*?type (\S+).*?state (\S+)(?:.*comm (.*))?$")

# Lines that mean a failed completion or run in rdma-core's and perftest's tools (and
# softrdma's copies of them): "Failed status", "cq completion failed status",
# "Completion with error", "Couldn't", "Error ..." and librdmacm's "error".
_ERROR = re.compile(r"(failed status|completion failed|completion with error|couldn't|"
                    r"\berror\b|\bunable to\b|\bfail(ed)?\b)", re.IGNORECASE)


def parse_perftest(text: str) -> Figures:
    """The first result row under a perftest BW or latency header ({} if there is none).

    Keys: BW ``bytes iterations bw_peak bw_avg msg_rate`` plus ``unit`` (1 MB/sec,
    0 Gb/sec); latency ``bytes iterations t_min t_max t_typical t_avg t_stdev p99 p999``
    (microseconds)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "#bytes" not in line:
            continue
        lat = "t_min" in line or "t_avg" in line
        if not lat and "BW" not in line:
            continue
        keys = _LAT_KEYS if lat else _BW_KEYS
        for row in lines[i + 1:]:
            cells = row.split()
            if not cells or not re.fullmatch(r"\d+", cells[0]):
                if cells and cells[0].startswith("-"):
                    break  # the table's closing rule: no row
                continue
            try:
                vals = [float(c) for c in cells[: len(keys)]]
            except ValueError:
                break
            if len(vals) < len(keys) - (2 if lat else 0):
                break
            out: Figures = dict(zip(keys, vals, strict=False))
            if not lat:
                out["unit"] = 0.0 if "Gb/sec" in line else 1.0
            return out
    return {}


def parse_pingpong(text: str) -> Figures:
    """``ibv_*_pingpong``'s two result lines: ``mbit`` (Mbit/sec) and ``usec_iter``."""
    out: Figures = {}
    m = _PP_BYTES.search(text)
    if m:
        out["bytes"] = float(m.group(1))
        out["mbit"] = float(m.group(3))
    m = _PP_ITERS.search(text)
    if m:
        out["iterations"] = float(m.group(1))
        out["usec_iter"] = float(m.group(3))
    return out


def parse_rdma_statistic(text: str) -> dict[str, int]:
    """``rdma statistic show link DEV/1`` as {counter: value} (first link line)."""
    for line in text.splitlines():
        m = _STAT.match(line.strip())
        if not m:
            continue
        words = m.group(3).split()
        out: dict[str, int] = {}
        for name, value in zip(words[::2], words[1::2], strict=False):
            if value.isdigit():
                out[name] = int(value)
        return out
    return {}


def parse_hw_counters(text: str) -> dict[str, int]:
    """``grep . /sys/class/infiniband/DEV/ports/1/hw_counters/*`` (``path:value`` lines)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        path, sep, value = line.rpartition(":")
        if sep and value.strip().isdigit():
            out[path.rsplit("/", 1)[-1]] = int(value.strip())
    return out


def user_qps(text: str) -> list[str]:
    """The QPs of ``rdma res show qp`` that belong to user processes (not the GSI QP,
    not kernel consumers, whose ``comm`` is in brackets)."""
    out: list[str] = []
    for line in text.splitlines():
        m = _QP.match(line.strip())
        if not m:
            continue
        comm = (m.group(4) or "").strip()
        if m.group(2) in ("GSI", "SMI") or comm.startswith("["):
            continue
        out.append(line.strip())
    return out


def counter_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """after - before for every counter in ``after`` (a counter new in ``after`` counts
    from 0); only non-zero changes are kept."""
    out = {k: v - before.get(k, 0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v}


def rstream_done(text: str) -> bool:
    """rstream / riostream (librdmacm's examples) printed their result row: the custom
    test (``-S``/``-C``) ran to its end, and with ``-T v`` every byte matched."""
    return any(line.startswith("custom ") for line in text.splitlines())


def error_lines(text: str) -> list[str]:
    """The lines of a tool's output that report a failure."""
    return [line.strip() for line in text.splitlines() if _ERROR.search(line)]


# the server's ordinary end: the next advertisement's wait ends in DISCONNECTED (10)
_RPING_LEAVING = "wait for RDMA_READ_ADV state 10"
RPING_TEARDOWN_RACE = "rdma_get_cm_event: Bad file descriptor"


def rping_teardown_race(text: str) -> bool:
    """Whether a Linux rping's exit code 255 came from its own teardown race, not the
    connection: it saw the peer's DISCONNECT, and its CM event thread then read the event
    channel that the main thread had just destroyed (``perror("rdma_get_cm_event")``,
    ``exit(-1)``). rdma-core fixed this in v59 (commit f3ae6534, "rping: terminate CM event
    thread before exiting"); the lab's Debian bookworm guest has v44. Every other line must be
    a ping or one of rping's ordinary leaving lines, so any other failure still shows."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if RPING_TEARDOWN_RACE not in lines or not any("DISCONNECT EVENT" in ln for ln in lines):
        return False
    return all(ln == RPING_TEARDOWN_RACE or "ping data" in ln
               or ln == _RPING_LEAVING or "DISCONNECT EVENT" in ln for ln in lines)


def pcap_check_lines(text: str) -> tuple[str, str]:
    """``softrdma pcap-check FILE``'s output: (its summary line ``FILE: N packets, N ok,
    N failed``, its first other line: the first inconsistency), '' where absent."""
    summary = first = ""
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if _PCAP_SUMMARY.search(line):
            summary = summary or line
        elif _PCAP_CONV.search(line) and summary:
            summary += "; " + line.split(": ", 1)[-1]  # the conversation checks' summary
        elif not first:
            first = line
    return summary, first


def pcap_check_packets(summary: str) -> int:
    """The packet count of a pcap-check summary line (-1 if it is not one)."""
    m = _PCAP_SUMMARY.search(summary)
    return int(m.group(1)) if m else -1


def first_connection_failed(text: str) -> bool:
    """Whether a perftest client's output says its first rdma_cm connection failed
    (:data:`FIRST_CONNECTION_FAILED` on a line of its own, perftest prints it indented)."""
    return any(line.strip() == FIRST_CONNECTION_FAILED for line in text.splitlines())


def second_connection_refused(text: str) -> bool:
    """Whether a perftest ``-R`` client's second rdma_cm connection (the test's QPs, made
    just after the exchange channel's last handshake) was rejected: perftest 4.5 prints
    ``Event: RDMA_CM_EVENT_REJECTED; error: N.``, ``Failed to connect RDMA CM events``
    (its ``_rdma_cm_client_connection``, this connection's only) and, giving up on it,
    ``Failed to create RDMA CM connection`` (``create_rdma_cm_connection``); on Linux
    4.5-0.17's retry, which reuses the ids it freed, may crash before that last line."""
    lines = [line.strip() for line in text.splitlines()]
    return (any(line.startswith("Event: RDMA_CM_EVENT_REJECTED;") for line in lines)
            and any(line.startswith(("Failed to create RDMA CM connection",
                                     "Failed to connect RDMA CM events")) for line in lines))
