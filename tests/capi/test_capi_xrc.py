"""``ibv_xsrq_pingpong -c 2`` under ``softrdma run`` (issue 22): a server and two client
processes on one shared device; the server sends each client's messages round robin
through the XRC INI QPs connected to *both* clients' TGT QPs, so half of them reach a
client's SRQ through the other client's TGT QP, in the other process (IBA 9.8.5, Annex
A14: the XRC domain of ``/tmp/xrc_domain`` is one domain for the three processes;
softrdma.drivers.devd.xrc hands those SENDs over)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.capi import need_build, need_tool, preloaded, run_pair, tcp_port
from harness.device import private_device

ADDR = re.compile(r"^ +(local|remote): LID 0000, QPN RECV ([0-9a-f]{6}) SEND ([0-9a-f]{6}), "
                  r"PSN [0-9a-f]{6}, SRQN ([0-9a-f]{6}), GID ")


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    need_build()
    yield private_device("capixrc", tmp_path, monkeypatch)


@pytest.mark.parametrize("events", [False, True], ids=["poll", "events"])
@pytest.mark.iba("9.8.5", "10.2.9")
def test_xsrq_pingpong_two_clients(device: str, events: bool) -> None:
    need_tool("ibv_xsrq_pingpong", "ibverbs-utils")
    port = tcp_port()
    common = ["ibv_xsrq_pingpong", "-d", device, "-g", "0", "-n", "6", "-p", str(port)]
    server = preloaded(*common, "-c", "2", *(["-e"] if events else []))
    client = preloaded(*common, "127.0.0.1")
    procs, outs = run_pair(server, client, port, client)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        assert out.splitlines()[-1] == "success", out
    lines = [[m.groups() for m in map(ADDR.match, out.splitlines()) if m] for out, _ in outs]
    # the server: one local and one remote line per client; each client one of each
    assert [len(x) for x in lines] == [4, 2, 2], outs
    server_remote = {g[1:] for g in lines[0] if g[0] == "remote"}
    clients_local = {g[1:] for x in lines[1:] for g in x if g[0] == "local"}
    assert server_remote == clients_local and len(clients_local) == 2
    # three processes, three SRQ numbers
    srqns = {g[3] for x in lines for g in x if g[0] == "local"}
    assert len(srqns) == 3, lines
