"""``softrdma run``: the perftest matrix and qperf ``-cm1`` between two C processes.

Every ``ib_{write,read,send,atomic}_{bw,lat}``, plain (its TCP exchange) and ``-R``
(rdma_cm), each side a stock binary on a private RoCE device on lo shared through devd;
the stock ``ib_write_bw`` against softrdma's Python ``write-bw`` on the same device, each
as the server; qperf's RC tests over rdma_cm (``-cm1``). Iterations and sizes are small
(the suite stays short); ``-a`` is checked once, with two iterations per size.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.capi import (
    TIMEOUT,
    _listening,
    need_build,
    need_tool,
    preloaded,
    tcp_port,
)
from harness.capi_pairs import perftest_pair, perftest_run_pair
from harness.device import private_device

ITERS = 5
TOOLS = [f"ib_{op}_{kind}" for op in ("write", "read", "send", "atomic")
         for kind in ("bw", "lat")]
#: a report row: size, iterations, then the figures (BW peak, average, msg rate; or
#: t_min, t_max, t_typical, t_avg...)
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", re.M)


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    need_build()
    need_tool("ib_write_bw", "perftest")
    name = private_device("capiperf", tmp_path, monkeypatch)
    monkeypatch.setenv("SOFTRDMA_CAPI_DEVICE", name)  # -R: the ids resolve to it
    yield name


def _rows(out: str) -> list[tuple[int, int, float, float, float]]:
    return [(int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4)),
             float(m.group(5))) for m in ROW.finditer(out)]


def _check(tool: str, out: str, size: int, iters: int, *, report: bool = True) -> None:
    """The side that reports (both for a bw test, the client for a latency test): one row
    of ``size`` bytes and ``iters`` iterations with a positive figure (a bandwidth's
    message rate: 8-byte atomics on a busy machine print 0.00 MB/sec); a latency's
    t_min <= t_max."""
    rows = _rows(out)
    if not report:
        assert "local address" in out and "remote address" in out, out
        return
    assert len(rows) == 1, out
    got_size, got_iters, a, b, c = rows[0]
    assert (got_size, got_iters) == (size, iters), out
    if tool.endswith("_lat"):
        assert 0 < a <= b, out
    else:
        assert c > 0, out


def _size(tool: str) -> tuple[list[str], int]:
    if "atomic" in tool:
        return [], 8
    size = 4096 if tool.endswith("_bw") else 64
    return ["-s", str(size)], size


# one case per operation, each of bw/lat with each of plain/-R, stays in the default suite;
# the other twelve run in the slow job (.ci/slow)
@pytest.mark.parametrize(("tool", "mode"), [
    pytest.param(tool, mode, marks=() if (tool, mode) in {
        ("ib_write_lat", "plain"), ("ib_send_bw", "plain"), ("ib_read_bw", "rdma_cm"),
        ("ib_atomic_lat", "rdma_cm"), ("ib_send_lat", "xrc")} else pytest.mark.slow)
    for tool in TOOLS for mode in ("plain", "rdma_cm", "xrc")])
def test_perftest_matrix(device: str, tool: str, mode: str) -> None:
    """Both sides stock perftest; the connection set up through the TCP exchange (plain)
    or rdma_cm (``-R``, whose server listens through the IB CM: the client is started
    again while the server is not listening yet); ``xrc``: plain with ``-c XRC`` (XRC
    SEND and RECV QPs and an XRC SRQ on each side; perftest has no XRC over rdma_cm)."""
    need_tool(tool, "perftest")
    sizes, size = _size(tool)
    port = tcp_port()
    common = [tool, "-d", device, "-n", str(ITERS), "-p", str(port), *sizes]
    if mode != "rdma_cm":
        if mode == "xrc":
            common += ["-c", "XRC"]
        procs, outs = perftest_run_pair(preloaded(*common, "-x", "0"),
                               preloaded(*common, "-x", "0", "127.0.0.1"), port)
        for p, (out, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, (out, err)
        (sout, serr), (cout, cerr) = outs
        assert f"Connection type : {'XRC' if mode == 'xrc' else 'RC'}" in cout, cout
    else:
        (sout, serr), (cout, cerr) = perftest_pair(preloaded(*common, "-R"),
                                                   preloaded(*common, "-R", "127.0.0.1"))
        assert "rdma_cm QPs\t : ON" in cout, cout
    lat = tool.endswith("_lat")
    # a latency test's server reports nothing (ib_send_lat: both sides do)
    _check(tool, sout, size, ITERS, report=not lat or tool == "ib_send_lat")
    _check(tool, cout, size, ITERS)
    for err in (serr, cerr):
        assert "Traceback" not in err


def test_perftest_all_sizes(device: str) -> None:
    """``-a``: every size from 2 bytes to 8 MiB, a row each on the client (the
    ib_write_bw server prints the last one only, as perftest does)."""
    port = tcp_port()
    common = ["ib_write_bw", "-d", device, "-x", "0", "-a", "-n", "5", "-p", str(port)]
    procs, outs = perftest_run_pair(preloaded(*common), preloaded(*common, "127.0.0.1"), port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
    (sout, _), (cout, _) = outs
    rows = _rows(cout)
    assert [r[0] for r in rows] == [1 << i for i in range(1, 24)], cout
    assert all(r[1] == 5 and r[4] > 0 for r in rows), cout
    assert [r[:2] for r in _rows(sout)] == [(1 << 23, 5)], sout


@pytest.mark.parametrize("c_side", ["server", "client"])
def test_ib_write_bw_against_python_write_bw(device: str, c_side: str) -> None:
    """The stock ib_write_bw and softrdma's Python write-bw on one device (through devd),
    the C program as the server and as the client."""
    port = tcp_port()
    opts = ["-d", device, "-x", "0", "-n", "20", "-s", "4096", "-p", str(port)]
    c = preloaded("ib_write_bw", *opts)
    py = [sys.executable, "-m", "softrdma", "write-bw", *opts]
    if c_side == "server":
        procs, outs = perftest_run_pair(c, [*py, "127.0.0.1"], port)
    else:
        procs, outs = perftest_run_pair(py, [*c, "127.0.0.1"], port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        _check("ib_write_bw", out, 4096, 20)



@pytest.mark.parametrize("c_side", ["server", "client"])
def test_ib_write_bw_rdma_cm_against_python_write_bw(device: str, c_side: str,
                                                      monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """``-R``: the stock ib_write_bw and the Python write-bw, each as the server: the
    control connection, then the data connection to the server's second listen, both
    through rdma_cm (private data, the ``struct pingpong_dest`` exchange as SENDs)."""
    monkeypatch.setenv("SOFTRDMA_CONNECT_RETRY", "5")  # the Python client: a refused REQ
    port = tcp_port()
    opts = ["-d", device, "-x", "0", "-n", "20", "-s", "4096", "-p", str(port), "-R"]
    c = preloaded("ib_write_bw", *opts)
    py = [sys.executable, "-m", "softrdma", "write-bw", *opts]
    if c_side == "server":
        (sout, serr), (cout, cerr) = perftest_pair(c, [*py, "127.0.0.1"])
    else:
        (sout, serr), (cout, cerr) = perftest_pair(py, [*c, "127.0.0.1"])
    for out, err in ((sout, serr), (cout, cerr)):
        assert "Traceback" not in err
        _check("ib_write_bw", out, 4096, 20)
    assert "rdma_cm QPs\t : ON" in cout, cout

QPERF_TESTS = ["rc_bw", "rc_lat", "rc_rdma_write_bw", "rc_rdma_read_bw"]


def _qperf(port: int, test: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """A fresh qperf server and one client test against it: the client, and what the
    server printed. qperf 0.4.11 (Debian) sends
    its rdma_cm port to the client before rdma_listen (upstream fixed it after 0.4.11,
    "Fix rdmacm race"): a client that comes first is rejected, and its server keeps
    waiting, so both are started again (generous deadline).

    The server runs in a process group of its own, and the whole group is killed: qperf's
    server forks a child for each client, and that child holds the server's output open.
    Killing the parent alone left a child that outlived it, and ``communicate`` waited
    for it forever (the child had deadlocked: tests/capi/exit_in_handler.c)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        srv = subprocess.Popen(preloaded("qperf", "-lp", str(port)), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
        try:
            while not _listening(port) and srv.poll() is None:
                if time.monotonic() > deadline:
                    raise AssertionError("the qperf server did not listen")
                time.sleep(0.05)
            cli = subprocess.run(preloaded("qperf", "-lp", str(port), "-cm1", "-t", "1",
                                           "127.0.0.1", test),
                                 capture_output=True, text=True, timeout=TIMEOUT, check=False)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(srv.pid, signal.SIGKILL)
            server_out = srv.communicate(timeout=TIMEOUT)[0] or ""
        raced = "Event rejected" in cli.stdout + cli.stderr
        if cli.returncode == 0 or not raced or time.monotonic() > deadline:
            return cli, server_out
        port = tcp_port()
        time.sleep(0.2)


@pytest.mark.parametrize("test", [  # a SEND and an RDMA READ test; the others: slow job
    pytest.param(t, marks=() if t in ("rc_bw", "rc_rdma_read_bw") else pytest.mark.slow)
    for t in QPERF_TESTS])
def test_qperf_cm(device: str, test: str) -> None:
    """qperf -cm1: rdma_bind_addr to port 0, rdma_get_src_port before rdma_listen (the
    port is picked at bind), then the RC test over the rdma_cm connection."""
    need_tool("qperf", "qperf")
    cli, _ = _qperf(tcp_port(), test)
    assert cli.returncode == 0, (cli.stdout, cli.stderr)
    assert cli.stdout.startswith(f"{test}:"), cli.stdout
    figure = re.search(r"(bw|latency)\s+=\s+([\d.]+) (\S+)", cli.stdout)
    assert figure and float(figure.group(2)) > 0, cli.stdout
    assert "Traceback" not in cli.stderr


def test_qperf_ud_lat_fails_as_on_rxe(device: str) -> None:
    """qperf's UD tests ignore -cm1 and make a LID-only address handle: on RoCE that is
    EINVAL (a RoCE AH needs a GRH, as Linux's ib_resolve_eth_dmac says), a clear error,
    no crash. Whichever side creates its AH first says so: when the server does, the
    client may print only ``server:`` (qperf's report of the server's failure)."""
    need_tool("qperf", "qperf")
    cli, server_out = _qperf(tcp_port(), "ud_lat")
    assert cli.returncode != 0
    said = cli.stdout + cli.stderr + server_out
    assert "failed to create address handle: Invalid argument" in said, said
    assert "Traceback" not in said
