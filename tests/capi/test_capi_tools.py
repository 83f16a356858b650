"""``softrdma run``: rdma-core's stock tools (ibverbs-utils, perftest) on softrdma.

Each runs unmodified under ``softrdma run`` on a private RoCE device on lo (shared
through devd, so the two processes of a pair and a Python peer talk to each other).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.capi import need_build, need_tool, preloaded, run, run_cmd, run_pair, tcp_port
from harness.capi_pairs import perftest_run_pair
from harness.device import private_device

from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.host.registry import Registry
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
    # -d: the device the program sees first (what a tool opens without its own -d)
    names = [line.split()[0] for line in p.stdout.splitlines()[2:] if line.strip()]
    other = next(n for n in names if n != names[0])
    first = subprocess.run([sys.executable, "-m", "softrdma", "run", "-d", other, "--",
                            "ibv_devices"], capture_output=True, text=True, check=False,
                           timeout=60)
    assert first.returncode == 0, first.stderr
    assert [line.split()[0] for line in first.stdout.splitlines()[2:]
            if line.strip()] == [other, *(n for n in names if n != other)]


def test_ibv_devinfo_verbose(device: str) -> None:
    need_tool("ibv_devinfo", "ibverbs-utils")
    p = run("ibv_devinfo", "-v")
    assert p.returncode == 0, p.stderr
    ours, iwarp = p.stdout.split("hca_id:\tsoftrdma_iw_lo")
    assert f"hca_id:\t{device}" in ours
    assert "transport:\t\t\tInfiniBand (0)" in ours
    assert "state:\t\t\tPORT_ACTIVE (4)" in ours
    assert "link_layer:\t\tEthernet" in ours
    assert re.search(r"max_qp:\s+65536", ours) and re.search(r"max_cqe:\s+32767", ours)
    assert re.search(r"GID\[\s*0\]:\s+::ffff:127\.0\.0\.1, RoCE v2", ours)
    info = next(d for d in get_device_list() if d.name == device)
    m = re.search(r"node_guid:\s+([0-9a-f:]+)", ours)
    assert m and int(m.group(1).replace(":", ""), 16) == info.node_guid
    assert "transport:\t\t\tiWARP (1)" in iwarp and "PORT_ACTIVE (4)" in iwarp


def _report(out: str) -> tuple[int, int]:
    m = re.search(r"(\d+) bytes in [\d.]+ seconds", out)
    n = re.search(r"(\d+) iters in", out)
    assert m and n, out
    return int(m.group(1)), int(n.group(1))


# tool, its size, options of both sides, of the server, of the client: the rc server sleeps
# on completion events (-e) and posts with ibv_post_send, its client busy-polls and posts
# with the ibv_wr_* API (-N: ibv_create_qp_ex, ibv_qp_to_qp_ex)
PAIRS = [
    ("ibv_rc_pingpong", 4096, (), ("-e",), ("-N",)),
    ("ibv_uc_pingpong", 4096, (), (), ()),
    ("ibv_ud_pingpong", 1024, ("-s", "1024"), (), ()),
    # ibv_srq_pingpong: test_srq_pingpong_16_qps_under_softrdma_run
]


@pytest.mark.parametrize("tool,size,extra,server_extra,client_extra", PAIRS,
                         ids=[p[0] for p in PAIRS])
def test_pingpong_two_c_processes(device: str, tool: str, size: int, extra: tuple[str, ...],
                                  server_extra: tuple[str, ...],
                                  client_extra: tuple[str, ...]) -> None:
    """Server and client both stock binaries on softrdma; -c checks the data."""
    need_tool(tool, "ibverbs-utils")
    port = tcp_port()
    common = [tool, "-d", device, "-g", "0", "-n", "20", "-c", "-p", str(port), *extra]
    procs, outs = run_pair(preloaded(*common, *server_extra),
                           preloaded(*common, *client_extra, "127.0.0.1"), port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        assert _report(out) == (2 * size * 20, 20)


def _qpns(out: str, side: str) -> list[int]:
    """The QPNs a pingpong printed on its ``local`` or ``remote`` address lines."""
    return [int(q, 16) for q in re.findall(rf"{side} address: .*QPN 0x([0-9a-f]+)", out)]


def test_srq_pingpong_16_qps_under_softrdma_run(device: str) -> None:
    """ibv_srq_pingpong with its default 16 QPs on one SRQ, both sides under the ``softrdma
    run`` wrapper, with the interop case's sizes (``-s 4096 -m 1024``): the QPNs each
    program prints are those its peer sends to, and devd routes every datagram to a live
    QP (none ``unknown_qpn``; late packets after a side destroyed its QPs would be
    ``closed_qpn``)."""
    need_tool("ibv_srq_pingpong", "ibverbs-utils")
    port = tcp_port()
    common = ["ibv_srq_pingpong", "-d", device, "-g", "0", "-n", "20", "-s", "4096",
              "-m", "1024", "-c", "-p", str(port)]
    procs, outs = run_pair(run_cmd(*common), run_cmd(*common, "127.0.0.1"), port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        assert _report(out) == (2 * 4096 * 20, 20)
    (srv, _), (cli, _) = outs
    assert len(set(_qpns(srv, "local"))) == 16 and len(set(_qpns(cli, "local"))) == 16
    assert _qpns(srv, "local") == _qpns(cli, "remote")
    assert _qpns(cli, "local") == _qpns(srv, "remote")
    with DevdLink(Registry().get(device), spawn=False, direct=False) as link:
        st = link.stats()
    assert (st["unknown_qpn"], st["malformed"], st["client_full"]) == (0, 0, 0), st


def test_rc_pingpong_against_python_tool(device: str) -> None:
    """The stock ibv_rc_pingpong (server) and softrdma's Python rc-pingpong (client) on
    one device, through devd."""
    need_tool("ibv_rc_pingpong", "ibverbs-utils")
    port = tcp_port()
    opts = ["-d", device, "-g", "0", "-n", "20", "-c", "-p", str(port)]
    procs, outs = run_pair(preloaded("ibv_rc_pingpong", *opts),
                           [sys.executable, "-m", "softrdma", "rc-pingpong", *opts,
                            "127.0.0.1"], port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        assert _report(out) == (2 * 4096 * 20, 20)


def test_ib_write_bw(device: str) -> None:
    need_tool("ib_write_bw", "perftest")
    port = tcp_port()
    common = ["ib_write_bw", "-d", device, "-x", "0", "-n", "50", "-s", "4096", "-p", str(port)]
    procs, outs = perftest_run_pair(preloaded(*common), preloaded(*common, "127.0.0.1"), port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        row = re.search(r"^\s*4096\s+50\s+([\d.]+)\s+([\d.]+)", out, re.M)
        assert row and float(row.group(2)) > 0, out
