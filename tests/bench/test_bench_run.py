"""``bench/run.py --json``: one JSON object with each figure, its baseline in the same run,
the ratios, the goal and the core count (issue 15's entry point; the figures themselves
are not asserted: benchmarks print, tests check behaviour)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.bench_run import quick_run

BENCH = Path(__file__).resolve().parents[2] / "bench" / "run.py"


def test_run_json_quick_one_figure() -> None:
    doc = quick_run(2, "roce_write_bw", timeout=240)
    assert doc["cores"] == os.cpu_count()
    assert doc["runs"] == 2 and doc["quick"] is True
    # the interpreter that ran it, and how it was built (the figures move with both)
    assert doc["python_executable"] == os.path.realpath(sys.executable)
    assert doc["python_build"].endswith(("libpython loaded as a shared library",
                                         "libpython linked in"))
    wake = doc["wake"]  # the machine's wake-up cost, same core and across cores
    assert wake["same_core_us"] > 0
    assert (wake["cross_core_us"] is None) == (len(os.sched_getaffinity(0)) == 1)
    assert wake["cross_core_us"] is None or wake["cross_core_us"] > 0
    assert list(doc["figures"]) == ["roce_write_bw"]
    fig = doc["figures"]["roce_write_bw"]
    assert fig["error"] is None
    assert len(fig["softrdma"]) == len(fig["baseline_values"]) == 2
    assert all(x > 0 for x in fig["softrdma"] + fig["baseline_values"])
    ratios = [o / b for o, b in zip(fig["softrdma"], fig["baseline_values"], strict=True)]
    assert fig["ratios"] == ratios
    assert fig["ratio_best"] == max(ratios)
    assert fig["goal"] == ">= 1.0"
    assert fig["goal_met"] == (fig["ratio_median"] >= 1.0)


def test_run_rejects_bad_runs() -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--runs", "0"], capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 2
    assert "--runs must be >= 1" in out.stderr
    assert "Traceback" not in out.stderr


def test_run_rejects_an_unknown_figure() -> None:
    """A figure name that does not exist is an error naming the choices, not a silent
    empty run."""
    out = subprocess.run([sys.executable, str(BENCH), "--only", "rc_pingpong"],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 2
    assert "invalid choice: 'rc_pingpong'" in out.stderr and "rc_send_lat" in out.stderr
    assert "Traceback" not in out.stderr



def test_run_ackwait_figure() -> None:
    """``rc_send_lat_ackwait`` (issue 26): the ping-pong whose sides also await each SEND's
    ACK, beside the plain ping-pong of the same run, as round trips."""
    fig = quick_run(1, "rc_send_lat_ackwait", timeout=240)["figures"]["rc_send_lat_ackwait"]
    assert fig["error"] is None
    assert len(fig["softrdma"]) == len(fig["baseline_values"]) == 1
    assert all(x > 0 for x in fig["softrdma"] + fig["baseline_values"])
    assert fig["goal"] == "<= 1.2" and fig["unit"] == "us"


def test_cm_rate_figures_share_one_tcp_baseline_per_run() -> None:
    """Issue 26: the rdma_cm connection rate over RoCE and iWARP, each beside plain TCP
    connect/accept/close measured in the same ``cm_rate.py`` process (which used to fail
    at exit removing a state directory its devd still wrote in)."""
    figs = quick_run(1, "cm_rate_roce", "cm_rate_iwarp", timeout=300)["figures"]
    assert list(figs) == ["cm_rate_roce", "cm_rate_iwarp"]
    for fig in figs.values():
        assert fig["error"] is None
        assert fig["unit"] == "conn/s" and fig["goal"] == ">= 0.1"
        assert len(fig["softrdma"]) == 1 and fig["softrdma"][0] > 0
    assert figs["cm_rate_roce"]["baseline_values"] == figs["cm_rate_iwarp"]["baseline_values"]


def test_ports_skip_ones_in_use() -> None:
    """The bench's ports: a group with a port some socket holds (UDP bound, TCP listening)
    is skipped, so a tool's server never fails to listen on a port already taken."""
    import importlib.util
    import socket
    spec = importlib.util.spec_from_file_location("bench_run", BENCH)
    assert spec is not None and spec.loader is not None
    run = importlib.util.module_from_spec(spec)
    sys.modules["bench_run"] = run  # its dataclasses look their module up
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec.loader.exec_module(run)
    finally:
        sys.path.remove(str(BENCH.parent))
        del sys.modules["bench_run"]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held_tcp, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held_udp:
        held_tcp.bind(("127.0.0.1", 0))
        held_tcp.listen(1)
        first = held_tcp.getsockname()[1]
        held_udp.bind(("127.0.0.1", 0))
        ports = run._Ports(first)
        got = ports.take(4)
        assert got >= first + 4  # the group holding the listener was skipped
        assert all(run.port_free(p) for p in range(got, got + 4))
        udp_port = held_udp.getsockname()[1]
        assert not run.port_free(udp_port)
