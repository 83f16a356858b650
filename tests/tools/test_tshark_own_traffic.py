"""softrdma's own packets decode in tshark with no malformed or expert-error marks, and
pass ``softrdma pcap-check``: every opcode family the engine emits, captured from the
in-memory fabric, and (as root) real RoCEv2 traffic captured on the loopback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness.mw import type2_window
from harness.verbs_pair import ACC, RC, UD, Side, connect
from harness.wait import Capture

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.tools.capture import pcap_check

W = e.ibv_wr_opcode
TSHARK = shutil.which("tshark")
needs_tshark = pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")


def tshark_problems(path: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """Frames that tshark marks malformed or with an expert error."""
    assert TSHARK is not None
    out = subprocess.run(
        [TSHARK, "-r", str(path), *extra, "-Y", "_ws.malformed || _ws.expert.severity >= 8388608",
         "-T", "fields", "-e", "frame.number", "-e", "_ws.col.Info"],
        capture_output=True, text=True, timeout=60, check=True)
    return [line for line in out.stdout.splitlines() if line.strip()]


def tshark_opcodes(path: Path, extra: tuple[str, ...] = ()) -> list[int]:
    assert TSHARK is not None
    out = subprocess.run([TSHARK, "-r", str(path), *extra, "-T", "fields", "-e",
                          "infiniband.bth.opcode"],
                         capture_output=True, text=True, timeout=60, check=True)
    return [int(x, 0) for x in out.stdout.split() if x]


def _opcodes_so_far(path: Path, extra: tuple[str, ...] = ()) -> set[int]:
    """The opcodes in a capture still being written (its last frame may be cut short)."""
    try:
        return set(tshark_opcodes(path, extra))
    except subprocess.CalledProcessError:
        return set()


def every_opcode_capture(path: Path, roce_ver: str = "2") -> None:
    clock = VirtualClock()
    fab = Fabric(clock, seed=1)
    fab.capture(str(path))
    a = Side(v.Context(fabric=fab.link("10.9.0.1", roce_ver=roce_ver)), RC, bytearray(1 << 16))
    b = Side(v.Context(fabric=fab.link("10.9.0.2", roce_ver=roce_ver)), RC, bytearray(1 << 16))
    connect(a, b)
    run = lambda: clock.run(max_events=100000)  # noqa: E731
    # RNR NAK: a SEND before any receive is posted, then the receive
    s = v.SendWR(1, opcode=int(W.IBV_WR_SEND), sg=[a.sge(0, 3000)])
    a.qp.post_send(s)
    clock.run(until=clock.now() + 0.0005)
    b.qp.post_recv(v.RecvWR(1, 1, [b.sge(0, 8000)]))
    run()
    for op, n in ((W.IBV_WR_SEND_WITH_IMM, 5), (W.IBV_WR_SEND_WITH_IMM, 2500),
                  (W.IBV_WR_SEND_WITH_INV, 2500), (W.IBV_WR_SEND_WITH_INV, 100),
                  (W.IBV_WR_SEND, 100), (W.IBV_WR_RDMA_WRITE_WITH_IMM, 2100)):
        b.qp.post_recv(v.RecvWR(2, 1, [b.sge(0, 8000)]))
        w = v.SendWR(2, opcode=int(op), sg=[a.sge(0, n)])
        if op == W.IBV_WR_SEND_WITH_INV:  # RoCE: only a type-2 window may be invalidated
            spare = v.MR(b.pd, 64, ACC | int(e.IBV_ACCESS_MW_BIND))
            w.invalidate_rkey = type2_window(b.ctx, b.pd, b.qp, spare)
        elif op == W.IBV_WR_RDMA_WRITE_WITH_IMM:
            w.set_wr_rdma(b.mr.rkey, b.mr.addr + 100)
        w.imm_data = 0x1234
        a.qp.post_send(w)
        run()
    for op, n in ((W.IBV_WR_RDMA_WRITE, 0), (W.IBV_WR_RDMA_WRITE, 3500),
                  (W.IBV_WR_RDMA_READ, 4000), (W.IBV_WR_RDMA_READ, 10)):
        w = v.SendWR(3, opcode=int(op), sg=[a.sge(8192, n)] if n else [])
        w.set_wr_rdma(b.mr.rkey, b.mr.addr + 100)
        a.qp.post_send(w)
        run()
    for op in (W.IBV_WR_ATOMIC_CMP_AND_SWP, W.IBV_WR_ATOMIC_FETCH_AND_ADD):
        w = v.SendWR(4, opcode=int(op), sg=[a.sge(16384, 8)])
        w.set_wr_atomic(b.mr.rkey, b.mr.addr + 1024, 0, 1)
        a.qp.post_send(w)
        run()
    # a NAK (remote access error)
    w = v.SendWR(5, opcode=int(W.IBV_WR_RDMA_WRITE), sg=[a.sge(0, 16)])
    w.set_wr_rdma(b.mr.rkey ^ 0x55, b.mr.addr)
    a.qp.post_send(w)
    run()
    # UD, with and without immediate
    c = Side(v.Context(fabric=fab.link("10.9.0.3", roce_ver=roce_ver)), UD, bytearray(1 << 14))
    d = Side(v.Context(fabric=fab.link("10.9.0.4", roce_ver=roce_ver)), UD, bytearray(1 << 14))
    connect(c, d)
    ah = v.AH(c.pd, v.AHAttr(gr=v.GlobalRoute(dgid=d.ctx.query_gid(1, 0), hop_limit=64)))
    for imm in (False, True):
        d.qp.post_recv(v.RecvWR(7, 1, [d.sge(0, 4096)]))
        w = v.SendWR(7, opcode=int(W.IBV_WR_SEND_WITH_IMM if imm else W.IBV_WR_SEND),
                     sg=[c.sge(0, 301)])
        w.set_wr_ud(ah, d.qp.qp_num, 0x11223344)
        a_imm = 77
        w.imm_data = a_imm
        c.qp.post_send(w)
        run()
    fab.stop_capture()
    for x in (a, b, c, d):
        x.ctx.close()


@needs_tshark
@pytest.mark.parametrize("roce_ver", ["2", "1"], ids=["rocev2", "rocev1"])
def test_every_opcode_family_decodes_cleanly(tmp_path: Path, roce_ver: str) -> None:
    """RoCEv1 (Annex A16): Ethernet 0x8915 + GRH, which tshark dissects as RoCE too."""
    path = tmp_path / "softrdma_ops.pcap"
    every_opcode_capture(path, roce_ver)
    ops = set(tshark_opcodes(path))
    expected = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x08, 0x09, 0x0A, 0x0C, 0x0D, 0x0F,
                0x10, 0x11, 0x12, 0x13, 0x14, 0x16, 0x17, 0x64, 0x65}
    assert expected <= ops, sorted(expected - ops)
    assert tshark_problems(path) == []
    out = tmp_path / "out.txt"
    with out.open("w") as fh:
        assert pcap_check.run([str(path)], fh) == 0
    assert " 0 failed" in out.read_text()


@needs_tshark
@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on the loopback needs root")
def test_live_loopback_capture_of_demo_and_pingpong(tmp_path: Path) -> None:
    """Real RoCEv2 datagrams on lo, from the demo (RC, all operations) and ud-pingpong."""
    port = 40000 + os.getpid() % 20000
    path = tmp_path / "live.pcap"
    assert TSHARK is not None
    decode_as = ("-d", f"udp.port=={port},infiniband")  # not 4791: tell tshark it is RoCEv2
    want = {0x11, 0x0C, 0x12, 0x13, 0x14}
    cap = Capture([TSHARK, "-i", "lo", "-f", f"udp port {port}", "-w", str(path), "-q"])
    try:
        env = dict(os.environ, SOFTRDMA_STATE_DIR=str(tmp_path / "state"))
        r = subprocess.run([sys.executable, "-m", "softrdma", "demo", "--port", str(port)],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        cap.stop(lambda: want <= _opcodes_so_far(path, decode_as))
    assert tshark_problems(path, decode_as) == []
    ops = set(tshark_opcodes(path, decode_as))
    # the demo's SEND, RDMA WRITE, RDMA READ (+ responses), both atomics and their ACKs
    assert want <= ops, sorted(ops)
    assert ops & {0x04, 0x00} and ops & {0x0A, 0x06} and ops & {0x10, 0x0D}, sorted(ops)
    out = tmp_path / "out.txt"
    with out.open("w") as fh:
        assert pcap_check.run([str(path)], fh, udp_ports=(port,)) == 0, out.read_text()
    assert " 0 failed" in out.read_text() and " 0 packets" not in out.read_text()
