"""``softrdma run``: rdma-core's stock tools (ibverbs-utils, perftest) on softrdma.

Each runs unmodified under ``softrdma run`` on a private RoCE device on lo (shared
through devd, so the two processes of a pair and a Python peer talk to each other).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from capi_harness import need_build, need_tool, run, run_cmd, run_pair, tcp_port
from device_harness import private_device

from softrdma.verbs import get_device_list


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    need_build()
    yield private_device("capitest", tmp_path, monkeypatch)


def test_ibv_devices_lists_softrdma(device: str) -> None:
    need_tool("ibv_devices", "ibverbs-utils")
    p = run("ibv_devices")
    assert p.returncode == 0, p.stderr
    rows = dict(line.split() for line in p.stdout.splitlines()[2:] if line.strip())
    assert device in rows and "softrdma_iw_lo" in rows
    assert re.fullmatch(r"[0-9a-f]{16}", rows[device])


def test_ibv_devinfo_verbose(device: str) -> None:
    need_tool("ibv_devinfo", "ibverbs-utils")
    p = run("ibv_devinfo", "-v", "-d", device)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"hca_id:\t{device}" in out
    assert "transport:\t\t\tInfiniBand (0)" in out
    assert "state:\t\t\tPORT_ACTIVE (4)" in out
    assert "link_layer:\t\tEthernet" in out
    assert re.search(r"max_qp:\s+65536", out) and re.search(r"max_cqe:\s+32767", out)
    assert re.search(r"GID\[\s*0\]:\s+::ffff:127\.0\.0\.1, RoCE v2", out)
    info = next(d for d in get_device_list() if d.name == device)
    m = re.search(r"node_guid:\s+([0-9a-f:]+)", out)
    assert m and int(m.group(1).replace(":", ""), 16) == info.node_guid
    iw = run("ibv_devinfo", "-d", "softrdma_iw_lo")
    assert iw.returncode == 0 and "transport:\t\t\tiWARP (1)" in iw.stdout


def _report(out: str) -> tuple[int, int]:
    m = re.search(r"(\d+) bytes in [\d.]+ seconds", out)
    n = re.search(r"(\d+) iters in", out)
    assert m and n, out
    return int(m.group(1)), int(n.group(1))


PAIRS = [
    ("ibv_rc_pingpong", ()),
    ("ibv_rc_pingpong", ("-e",)),
    ("ibv_uc_pingpong", ()),
    ("ibv_ud_pingpong", ("-s", "1024")),
    ("ibv_srq_pingpong", ("-q", "4")),
]


@pytest.mark.parametrize("tool,extra", PAIRS, ids=[" ".join((t, *x)) for t, x in PAIRS])
def test_pingpong_two_c_processes(device: str, tool: str, extra: tuple[str, ...]) -> None:
    """Server and client both stock binaries under ``softrdma run``; -c checks the data."""
    need_tool(tool, "ibverbs-utils")
    port = tcp_port()
    common = [tool, "-d", device, "-g", "0", "-n", "20", "-c", "-p", str(port), *extra]
    procs, outs = run_pair(run_cmd(*common), run_cmd(*common, "127.0.0.1"), port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        size = int(extra[1]) if extra[:1] == ("-s",) else 4096 if tool != "ibv_ud_pingpong" else 2048
        assert _report(out) == (2 * size * 20, 20)


@pytest.mark.parametrize("c_side", ["server", "client"])
def test_rc_pingpong_against_python_tool(device: str, c_side: str) -> None:
    """The stock ibv_rc_pingpong and softrdma's Python rc-pingpong on one device."""
    need_tool("ibv_rc_pingpong", "ibverbs-utils")
    port = tcp_port()
    opts = ["-d", device, "-g", "0", "-n", "20", "-c", "-p", str(port)]
    c_cmd = run_cmd("ibv_rc_pingpong", *opts)
    py_cmd = [sys.executable, "-m", "softrdma", "rc-pingpong", *opts]
    if c_side == "server":
        procs, outs = run_pair(c_cmd, [*py_cmd, "127.0.0.1"], port)
    else:
        procs, outs = run_pair([*py_cmd, "--bind", "127.0.0.1"], [*c_cmd, "127.0.0.1"], port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        assert _report(out) == (2 * 4096 * 20, 20)


def test_ib_write_bw(device: str) -> None:
    need_tool("ib_write_bw", "perftest")
    port = tcp_port()
    common = ["ib_write_bw", "-d", device, "-x", "0", "-n", "50", "-s", "4096", "-p", str(port)]
    procs, outs = run_pair(run_cmd(*common), run_cmd(*common, "127.0.0.1"), port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        row = re.search(r"^\s*4096\s+50\s+([\d.]+)\s+([\d.]+)", out, re.M)
        assert row and float(row.group(2)) > 0, out
