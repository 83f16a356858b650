"""``softrdma run``: rsockets programs (rstream, riostream, rcopy) on softrdma.

rsockets is part of librdmacm itself: besides the exported rdma_* calls (served by the C
interface) it calls the library's internal ``ucma_complete`` and ``ucma_max_qpsize`` on
the ids, which read librdmacm's private id fields after the ``rdma_cm_id`` (its cma_dev
and sync). Our ids keep that layout (``capi/rdmacm.c``, ``struct sr_cm_id``); before, rstream
crashed in ``rconnect`` (SIGSEGV) on the first connection.

Each pair checks the data: rstream's and riostream's ``-T v`` fill every transfer with a
running byte pattern and compare it on receipt (``data verification failed byte N`` and a
non-zero exit otherwise); rcopy's copy is compared with its source.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.capi import cm_device, need_tool, preloaded, run_pair, tcp_port
from harness.capi_pairs import against_daemon, pair

from softrdma.verbs.device import IWARP_LOOPBACK

#: rstream's result row: name, bytes, transfers, iterations, total, time, Gb/sec, usec/xfer
#: (sizes and counts as rstream's size_str writes them: 4k, 64k, 1k for 1000)
ROW = re.compile(r"^custom\s+(\S+)\s+(\S+)\s+(\d+)\s+\S+\s+[\d.]+s\s+([\d.]+)\s+([\d.]+)\s*$",
                 re.M)


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield cm_device("capirs", "rstream", tmp_path, monkeypatch)


def _rows(out: str, size: str, count: int) -> None:
    """rstream/riostream printed one result row for ``count`` transfers of ``size``."""
    rows = ROW.findall(out)
    assert len(rows) == 1, out
    name_size, xfers, _iters, gbps, usec = rows[0]
    shown = f"{count // 1000}k" if count % 1000 == 0 else str(count)
    assert (name_size, xfers) == (size, shown), out
    # the time per transfer: rstream's 2-decimal Gb/sec of 50 8 KiB transfers is 0.00
    # once a busy machine stretches them past about 1.3 s
    assert float(usec) > 0 and float(gbps) >= 0, out
    assert "verification failed" not in out


def _stream(tool: str, port: str, *opts: str, server_opts: tuple[str, ...] = (),
            client_opts: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """``tool``'s server and client on the loopback, data checked (-T v), with ``opts``
    on both and the side's own options after them."""
    common = ["-p", port, "-T", "v", *opts]
    return (preloaded(tool, "-b", "127.0.0.1", *common, *server_opts),
            preloaded(tool, "-s", "127.0.0.1", *common, *client_opts))


def test_rstream_roce_verified(device: str) -> None:
    """rstream over RoCE: 64 KiB transfers both ways, every byte checked (-T v), through
    rsockets' RDMA WRITEs with immediate data and its credit messages."""
    server, client = _stream("rstream", str(tcp_port()), "-S", "65536", "-C", "20")
    (sout, serr), (cout, cerr) = pair(server, client)
    _rows(sout, "64k", 20)
    _rows(cout, "64k", 20)
    assert "Traceback" not in serr + cerr


@pytest.mark.parametrize("mode", ["n", "b"])
def test_rstream_roce_nonblocking_and_blocking_calls(device: str, mode: str) -> None:
    """rstream -T n (MSG_DONTWAIT: rsend/rrecv return EAGAIN and rsockets drives the
    connection and its CQ without blocking) and -T b (MSG_WAITALL), 300 transfers of
    4 KiB each way, checked."""
    server, client = _stream("rstream", str(tcp_port()), "-T", mode, "-S", "4096",
                             "-C", "300")
    (sout, _), (cout, _) = pair(server, client)
    _rows(sout, "4k", 300)
    _rows(cout, "4k", 300)


def test_rstream_async_server_rdma_getaddrinfo_client(device: str) -> None:
    """The server waits in rpoll (-T a: rsockets' poll over the listener's accept queue
    and the connection's CQ channel); the client resolves through rdma_getaddrinfo
    (-T r)."""
    server, client = _stream("rstream", str(tcp_port()), "-S", "8192", "-C", "50",
                             server_opts=("-T", "a"), client_opts=("-T", "r"))
    (sout, _), (cout, _) = pair(server, client)
    _rows(sout, "8k", 50)
    _rows(cout, "8k", 50)


def test_rstream_iwarp_verified(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """rstream over iWARP (the built-in loopback device): rsockets sees
    IBV_TRANSPORT_IWARP and sends its messages as SENDs (RS_OPT_MSG_SEND), not WRITEs with
    immediate data. Its server listens on TCP, so the client starts once the port does."""
    monkeypatch.setenv("SOFTRDMA_CAPI_DEVICE", IWARP_LOOPBACK)
    port = tcp_port()
    server, client = _stream("rstream", str(port), "-S", "65536", "-C", "20")
    procs, outs = run_pair(server, client, port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        _rows(out, "64k", 20)


def test_riostream_verified(device: str) -> None:
    """riostream: the server maps its buffer (riomap), the client writes into it with
    riowrite (RDMA WRITEs to the peer's mapping) and signals with rsend; checked (-T v)."""
    need_tool("riostream", "rdmacm-utils")
    server, client = _stream("riostream", str(tcp_port()), "-S", "65536", "-C", "20")
    (sout, _), (cout, _) = pair(server, client)
    _rows(sout, "64k", 20)
    _rows(cout, "64k", 20)


def test_rcopy_copies_a_file(device: str, tmp_path: Path) -> None:
    """rcopy: a 3 MB file of random bytes to an rcopy server (which serves for ever and is
    stopped afterwards); the copy is byte for byte the source."""
    need_tool("rcopy", "rdmacm-utils")
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(os.urandom(3_000_000))
    port = str(tcp_port())
    cli = against_daemon(preloaded("rcopy", "-p", port),
                         preloaded("rcopy", str(src), f"127.0.0.1:{dst}", "-p", port))
    assert "3000000 bytes in" in cli.stdout, (cli.stdout, cli.stderr)
    assert dst.read_bytes() == src.read_bytes()


def test_rspreload_beside_softrdma_is_refused_clearly(device: str) -> None:
    """librspreload preloaded with softrdma: it would make softrdma's own sockets
    rsockets (the process hung). softrdma says why once and refuses its verbs, so the
    program ends (here ibv_devices, with libibverbs' own error) instead of hanging."""
    found = sorted(Path("/usr/lib").glob("*/rsocket/librspreload.so"))
    if not found:
        pytest.skip("librspreload.so is not installed (Debian package librdmacm1)")
    cmd = preloaded("ibv_devices")
    env_words = [w for w in cmd if w.startswith("LD_PRELOAD=")]
    assert len(env_words) == 1, cmd
    cmd[cmd.index(env_words[0])] = f"{env_words[0]} {found[0]}"
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode != 0, p.stdout
    assert p.stderr.count("softrdma: librspreload is preloaded too") == 1, p.stderr
    assert "Traceback" not in p.stderr
