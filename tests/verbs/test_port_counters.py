"""Port counters (issue 11, "Counters per port"): packets, bytes, retransmissions, RNR
NAKs, ICRC errors and drops by reason, from the API (``Context.query_port_counters``),
``softrdma devinfo -v`` and ``softrdma stats``; on a shared device the device's totals
across processes (devd aggregates each process's reports).

The engine cases run on the in-memory fabric's virtual clock, so every number is exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import device as device_harness
from harness.counters_pair import Pair
from harness.device import reap
from harness.ports import free_port

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.errors import InvalidArgument
from softrdma.seam.counters import DROP_REASONS, DropReason
from softrdma.tools.cli import main

LW = int(e.IBV_ACCESS_LOCAL_WRITE)
SRC = str(Path(__file__).resolve().parents[2] / "src")
BTH, AETH, ICRC = 12, 4, 4
MTU = 1024


@pytest.fixture()
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


def _wcs(cq: v.CQ) -> list[v.WC]:
    return cq.poll(16)[1]


def test_packets_and_bytes_are_exact(pair: Pair) -> None:
    pair.send(3000)  # 3 packets at MTU 1024: 1024 + 1024 + 952 payload bytes
    pair.clock.run()
    assert [w.status for w in _wcs(pair.sides[0][0])] == [e.IBV_WC_SUCCESS]
    a, b = pair.a.query_port_counters(), pair.b.query_port_counters()
    assert isinstance(a, v.PortCounters) and not a.shared and a.port_num == 1
    assert a.sent_pkts == 3 and a.sent_bytes == 3000 + 3 * (BTH + ICRC)
    assert b.rcvd_pkts == 3 and b.rcvd_bytes == a.sent_bytes
    acks = b.sent_pkts
    assert acks >= 1 and a.rcvd_pkts == acks
    assert b.sent_bytes == acks * (BTH + AETH + ICRC) == a.rcvd_bytes
    assert a.total_drops == b.total_drops == 0
    assert a.retransmitted_pkts == 0


@pytest.mark.iba("9.7.6.1.3")
def test_retransmissions_are_counted(pair: Pair) -> None:
    # lose the SEND_MIDDLE once: the responder NAKs the LAST (PSN sequence error), the
    # requester goes back and sends MIDDLE and LAST again (IBA 9.7.6.1.3)
    pair.fab.add_rule(lambda d: d.data[0] == 0x01, "drop", count=1)
    pair.send(3000)
    pair.clock.run()
    assert [w.status for w in _wcs(pair.sides[0][0])] == [e.IBV_WC_SUCCESS]
    a, b = pair.a.query_port_counters(), pair.b.query_port_counters()
    assert a.retransmitted_pkts == 2
    assert a.sent_pkts == 5 and a["completer_retry"] == 1 and a["rcvd_nak"] == 1
    assert b.drops["out_of_seq_request"] == 1 and b["sent_nak"] == 1


@pytest.mark.iba("9.7.5.2.8")
def test_rnr_naks_are_counted(pair: Pair) -> None:
    pair.send(100, recv=False)  # no receive WQE: RNR NAK (IBA 9.7.5.2.8)
    pair.clock.run(until=pair.clock.now() + 0.0001)
    _cqb, qb, mb = pair.sides[1]
    assert pair.b.query_port_counters().send_rnr_nak >= 1
    qb.post_recv(v.RecvWR(1, 1, [v.SGE(mb.addr, 8192, mb.lkey)]))
    pair.clock.run()
    assert [w.status for w in _wcs(pair.sides[0][0])] == [e.IBV_WC_SUCCESS]
    a, b = pair.a.query_port_counters(), pair.b.query_port_counters()
    assert a.rcvd_rnr_nak == b.send_rnr_nak >= 1
    assert a.retransmitted_pkts == a.rcvd_rnr_nak  # the one packet, again after each RNR


def test_icrc_errors_are_counted() -> None:
    p = Pair(seed=3)
    try:
        p.fab.add_rule(lambda d: d.data[0] == 0x04, "corrupt", count=1)  # the SEND_ONLY
        p.send(200)
        p.clock.run()
        assert [w.status for w in _wcs(p.sides[0][0])] == [e.IBV_WC_SUCCESS]
        b = p.b.query_port_counters()
        assert b.rcvd_icrc_err == 1 and b.drops["rcvd_icrc_err"] == 1 and b.total_drops == 1
        assert p.a.query_port_counters().retransmitted_pkts == 1  # after the ACK timeout
    finally:
        p.close()


def test_every_drop_reason_is_described() -> None:
    assert set(DROP_REASONS) == set(DropReason)
    for reason in DropReason:
        layer, what, clause = DROP_REASONS[reason]
        assert layer in ("link", "network", "transport") and what and clause
        assert v.PortCounters.describe(reason.value).startswith(layer)


def test_query_port_counters_checks_its_port(pair: Pair) -> None:
    with pytest.raises(InvalidArgument):
        pair.a.query_port_counters(2)


# -- a shared device: several processes, one device -----------------------------------------

@pytest.fixture()
def shared_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from device_harness.shared_device("ctrtest", tmp_path, monkeypatch)


def _pingpong_pair(device: str, iters: int) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    tcp = str(free_port())
    common = ["rc-pingpong", "-d", device, "-p", tcp, "-n", str(iters), "-s", "1000",
              "--timeout", "20"]
    procs = [subprocess.Popen([sys.executable, "-m", "softrdma", *common, *extra], env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for extra in (["--bind", "127.0.0.1"], ["127.0.0.1"])]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        reap(*procs)
    for p, (_o, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err


def test_shared_device_counts_every_process(shared_device: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    iters = 25
    with v.Context(shared_device) as ctx:  # keeps the device's devd alive
        before = ctx.query_port_counters()
        assert before.shared and before.sent_pkts == 0
        _pingpong_pair(shared_device, iters)  # two other processes, gone by now
        pc = ctx.query_port_counters()
        # each side sent `iters` one-packet messages and got them back, plus ACKs
        assert pc.sent_pkts >= 2 * iters and pc.rcvd_pkts >= 2 * iters
        assert pc.sent_bytes >= 2 * iters * (1000 + BTH + ICRC)
        assert pc.rcvd_bytes >= 2 * iters * (1000 + BTH + ICRC)
        assert pc.total_drops == 0
        assert main(["stats", "-j", "show", "link", f"{shared_device}/1"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got[0]["ifname"] == shared_device and got[0]["port"] == 1
        assert got[0]["sent_pkts"] == pc.sent_pkts and got[0]["rcvd_bytes"] == pc.rcvd_bytes
        assert main(["stats", "-d", shared_device]) == 0
        line = capsys.readouterr().out.strip()
        assert line.startswith(f"link {shared_device}/1 sent_pkts {pc.sent_pkts} rcvd_pkts ")
        assert " rcvd_icrc_err 0 " in line and " rcvd_qp0 0 " in line
        assert main(["stats", "-d", shared_device, "-w", "0.05", "-n", "2"]) == 0
        watched = capsys.readouterr().out.splitlines()
        assert len(watched) == 4 and watched[1].startswith(f"link {shared_device}/1 ")
        assert main(["devinfo", "-v", "-d", shared_device]) == 0
        out = capsys.readouterr().out
        assert "counters (device, all processes):" in out
        assert f"\t\t\t\tsent_pkts:\t{pc.sent_pkts}\n" in out
        assert "\t\t\t\trcvd_qp0:\t0\n" in out


def test_stats_bad_arguments(shared_device: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "show", "link", f"{shared_device}/2"]) == 1
    assert "error: link:" in capsys.readouterr().err
    assert main(["stats", "-d", "nosuchdev"]) == 1
    assert "no softrdma device named 'nosuchdev'" in capsys.readouterr().err
    assert main(["stats", "-w", "0"]) == 1
    assert main(["stats", "frob"]) == 1
    err = capsys.readouterr().err
    assert err.count("softrdma stats: error:") == 2 and "Traceback" not in err
