"""Seeing the protocol: ``SOFTRDMA_TRACE=qp,cm,pkt`` / ``--trace`` (Python logging: QP
state transitions, CM states and rdma_cm events, one line per packet) and
``Context(pcap=FILE)`` / ``--pcap FILE`` (a pcap that pcap-check and tshark read, each
packet once, without root or tcpdump)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.ports import free_port
from harness.rdma_cm import child_env, make_state_dir
from harness.trace import captured_trace, rc_pair, rc_send

from softrdma import enums as e
from softrdma import trace
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.errors import InvalidArgument
from softrdma.tools.capture import pcap_check
from softrdma.wire.pcap import read_pcap


@pytest.fixture
def traced() -> Iterator[io.StringIO]:
    with captured_trace("all") as buf:
        yield buf


def test_context_pcap_writes_each_packet_once(tmp_path: Path) -> None:
    pcap = tmp_path / "pair.pcap"
    fab = Fabric(VirtualClock())
    ctxs, sides = rc_pair(fab, ("10.3.0.1", "10.3.0.2"), pcap)
    try:
        rc_send(fab, sides, 2500)  # FIRST, MIDDLE, LAST at MTU 1024, then the ACK
    finally:
        for c in ctxs:
            c.close()
    frames = list(read_pcap(pcap))
    assert len(frames) == fab.stats.sent == 4  # sent by one device, received by the other
    out, err = io.StringIO(), io.StringIO()
    assert pcap_check.run([str(pcap)], out=out, err=err) == 0, err.getvalue()
    assert "4 packets, 4 ok, 0 failed" in out.getvalue()
    if shutil.which("tshark"):
        ops = subprocess.run(["tshark", "-r", str(pcap), "-T", "fields", "-e",
                              "infiniband.bth.opcode"], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
        assert ops == ["0", "1", "2", "17"]  # SEND_FIRST, MIDDLE, LAST, ACKNOWLEDGE


def test_no_tap_without_pcap_or_trace() -> None:
    fab = Fabric(VirtualClock())
    ctx = v.Context(fabric=fab.link("10.3.0.9"))
    try:
        assert ctx.runtime.tap is None  # type: ignore[attr-defined]  # nothing on the path
    finally:
        ctx.close()


def test_packet_and_qp_trace_lines(traced: io.StringIO) -> None:
    fab = Fabric(VirtualClock())
    ctxs, sides = rc_pair(fab, ("10.3.0.1", "10.3.0.2"))
    try:
        rc_send(fab, sides, 100)
        sides[0][1].modify(v.QPAttr(qp_state=e.IBV_QPS_ERR), int(e.IBV_QP_STATE))
    finally:
        for c in ctxs:
            c.close()
    lines = traced.getvalue().splitlines()
    qpn_b = sides[1][1].qp_num
    assert f"softrdma.qp: QP 0x{sides[0][1].qp_num:06x} RC: RESET -> INIT" in lines
    assert any(x.endswith("RC: RTR -> RTS") for x in lines)
    assert any(x.endswith("RC: RTS -> ERR") for x in lines)
    tx = [x for x in lines if " tx 10.3.0.1:" in x]
    assert tx and tx[0].endswith(f"RC_SEND_ONLY QP=0x{qpn_b:06x} PSN=0x000007 len=100")
    assert any(" rx 10.3.0.2:" in x and "RC_ACKNOWLEDGE" in x and "ACK MSN=1" in x
               for x in lines)


def test_trace_spec_errors() -> None:
    assert trace.parse("pkt, qp") == ("pkt", "qp")
    assert trace.parse("all") == trace.KINDS
    with pytest.raises(InvalidArgument, match="unknown trace kind 'pkts'"):
        trace.parse("pkts")


def _cli(tmp_path: Path, *args: str, env_extra: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "softrdma", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_trace_shows_cm_states_events_and_packets(tmp_path: Path) -> None:
    """Nobody listens: the trace shows the REQ going out, the REJ coming back, the CM
    states and the REJECTED event."""
    r = _cli(tmp_path, "--trace", "cm,pkt", "rdma-client", "-p", str(free_port()))
    assert r.returncode == 1
    err = r.stderr.splitlines()
    assert any(x.startswith("softrdma.cm: CM 0x") and x.endswith("IDLE -> REQ_SENT")
               for x in err), r.stderr
    assert any("softrdma.cm: rdma_cm RDMA_CM_EVENT_REJECTED" in x for x in err)
    assert any(" tx 127.0.0.1:" in x and "UD_SEND_ONLY QP=0x000001" in x for x in err)
    assert any(" rx 127.0.0.1:" in x and "UD_SEND_ONLY QP=0x000001" in x for x in err)
    assert "rdma_connect: Connection refused" in r.stderr


def test_env_trace_and_bad_value(tmp_path: Path) -> None:
    code = ("from softrdma import verbs as v, enums as e\n"
            "from softrdma.drivers.links.fabric import Fabric\n"
            "from softrdma.drivers.runtime.clock import VirtualClock\n"
            "ctx = v.Context(fabric=Fabric(VirtualClock()).link('10.4.0.1'))\n"
            "pd = v.PD(ctx); cq = v.CQ(ctx, 4)\n"
            "qp = v.QP(pd, v.QPInitAttr(e.IBV_QPT_UD, scq=cq, rcq=cq), v.QPAttr(qkey=1))\n")
    env = dict(os.environ, SOFTRDMA_TRACE="qp",
               PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "softrdma.qp: QP 0x000011 UD: RESET -> INIT" in r.stderr
    assert "softrdma.qp: QP 0x000011 UD: RTR -> RTS" in r.stderr
    env["SOFTRDMA_TRACE"] = "bogus"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0
    assert r.stderr.startswith("softrdma: ignoring SOFTRDMA_TRACE='bogus'")


def test_cli_pcap_of_a_pingpong(tmp_path: Path) -> None:
    state, port = make_state_dir(tmp_path)
    pcap = tmp_path / "pp.pcap"
    env = child_env(state)
    env["SOFTRDMA_SHARED"] = "0"
    r = subprocess.run([sys.executable, "-m", "softrdma", "--pcap", str(pcap), "rc-pingpong",
                        "--loopback", "-d", "cmtest_lo", "-n", "10", "-s", "2000"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    frames = list(read_pcap(pcap))
    assert len(frames) >= 40  # 10 x (2 packets each way) + the ACKs
    out, err = io.StringIO(), io.StringIO()
    assert pcap_check.run([str(pcap)], out=out, err=err, udp_ports=(port,)) == 0, \
        err.getvalue()
    assert f"{len(frames)} packets, {len(frames)} ok, 0 failed" in out.getvalue()


def test_cli_pcap_unwritable(tmp_path: Path) -> None:
    r = _cli(tmp_path, "--pcap", str(tmp_path / "no" / "such" / "dir.pcap"), "devices")
    assert r.returncode == 2
    assert r.stderr.startswith("softrdma: error: --pcap: cannot write")


def test_a_tap_closed_by_a_collection_in_a_thread_holding_the_writers(tmp_path: Path) -> None:
    """A freed context's finalizer closes its tap, in whichever thread's collection freed
    it; a collection may start while that thread holds the table of capture files
    (opening another capture) or a file's own lock (writing a frame): both locks are
    re-entrant, so the thread does not wait for itself, and the last tap's close closes
    the file."""
    import weakref

    from harness.collect import Cyclic, collect_while_holding, collector_paused

    from softrdma.drivers.capture import tap

    w = tap._open_writer(str(tmp_path / "x.pcap"))
    with collector_paused():
        for lock in (tap._writers_lock, w.lock):
            w.users += 1
            obj = Cyclic()
            weakref.finalize(obj, tap._close_writer, w)
            del obj
            assert collect_while_holding(lock), "the collecting thread waited for itself"
    assert w.users == 1 and w.path in tap._writers
    tap._close_writer(w)
    assert w.path not in tap._writers and list(read_pcap(str(tmp_path / "x.pcap"))) == []
