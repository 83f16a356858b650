"""Traffic of softrdma iWARP sessions passes ``softrdma pcap-check`` and tshark.

* Synthetic capture: an in-memory session (every RDMAP operation, MPA v2, CRC and
  markers variants) laid out as Ethernet/IPv4/TCP frames, one MPA frame or FPDU per TCP
  segment; ``pcap-check`` (tools/pcap_check_iwarp) re-parses, CRC-checks and re-encodes
  every frame, and tshark's MPA dissector reports "Good CRC32" for every FPDU.
* Live capture (root with dumpcap only): dumpcap on ``lo`` while two verbs QPs talk over
  real TCP sockets; pcap-check passes on what the kernel put on the wire.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
from harness import ports
from harness.iwarp import Side, connect_pair, pump
from harness.wait import Capture

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm import iwconnect
from softrdma.iwarp.mpa_setup import MpaConfig
from softrdma.tools.capture import pcap_check
from softrdma.wire.pcap import PcapWriter

ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)


def _frames(log: list[tuple[int, bytes]]) -> list[bytes]:
    """Ethernet + IPv4 + TCP frames for the logged segments (handshake, data, FIN)."""
    ep = {0: (b"\x0a\x00\x00\x01", 40001), 1: (b"\x0a\x00\x00\x02", 7174)}
    seq = {0: 1000, 1: 500000}

    def frame(side: int, flags: int, payload: bytes) -> bytes:
        (src, sport), (dst, dport) = ep[side], ep[1 - side]
        tcp = struct.pack("!HHIIBBHHH", sport, dport, seq[side] % 2**32, seq[1 - side] % 2**32,
                          5 << 4, flags, 65535, 0, 0)
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), 0, 0x4000, 64, 6, 0,
                         src, dst)
        return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + tcp + payload

    out = [frame(0, 0x02, b"")]
    seq[0] += 1
    out.append(frame(1, 0x12, b""))
    seq[1] += 1
    out.append(frame(0, 0x10, b""))
    for side, data in log:
        out.append(frame(side, 0x18, data))
        seq[side] += len(data)
    for side in (0, 1):
        out.append(frame(side, 0x11, b""))
        seq[side] += 1
    return out


def _session(crc: bool, markers: bool) -> tuple[list[tuple[int, bytes]], int]:
    log: list[tuple[int, bytes]] = []
    a, b = Side("a"), Side("b")
    connect_pair(a, b, MpaConfig(crc=crc, markers=markers, ird=2, ord=2),
                 MpaConfig(markers=markers, ird=2, ord=2), pd_a=b"hi", log=log)
    src, dst = a.mr(20000), b.mr(20000)
    src.buf[:] = bytes(range(200)) * 100
    inv = b.mr(16)
    for i in range(3):
        b.post_recv(dst, 20000, wr_id=i)
    a.post(e.IBV_WR_SEND, src, 5000)
    a.post(e.IBV_WR_SEND, src, 0, flags=int(e.IBV_SEND_SIGNALED | e.IBV_SEND_SOLICITED))
    a.post(e.IBV_WR_RDMA_WRITE, src, 7000, rkey=dst.rkey, raddr=dst.addr)
    a.post(e.IBV_WR_RDMA_READ, src, 9000, rkey=dst.rkey, raddr=dst.addr)
    a.post(e.IBV_WR_SEND_WITH_INV, src, 33, inv=inv.rkey)
    pump(a, b, log=log)
    a.post(e.IBV_WR_RDMA_WRITE, src, 10, rkey=inv.rkey, raddr=inv.addr)  # -> Terminate
    pump(a, b, log=log)
    assert b.conn is not None and b.conn.fault is not None
    assert a.conn is not None and a.conn.term_received is not None  # b's Terminate
    assert len(a.scq) == 6 and all(w.status == 0 for w in a.scq)  # the Write left first
    fpdus = sum(1 for _s, d in log if not d.startswith(b"MPA ID"))
    return log, fpdus


@pytest.mark.parametrize("crc,markers", [(False, False), (True, False), (True, True)])
def test_synthetic_capture_passes_pcap_check_and_tshark(tmp_path: Path, crc: bool,
                                                        markers: bool) -> None:
    log, fpdus = _session(crc, markers)
    frames = _frames(log)
    path = tmp_path / "iwarp.pcap"
    with PcapWriter(path) as w:
        for i, f in enumerate(frames):
            w.write(f, 1.0 + i / 1000)
    out = io.StringIO()
    assert pcap_check.run([str(path)], out) == 0, out.getvalue()
    assert out.getvalue().splitlines()[-1] == \
        f"{path}: {fpdus + 2} packets, {fpdus + 2} ok, 0 failed"
    if shutil.which("tshark") is None or markers:
        return  # tshark's MPA dissector does not follow markers across FPDUs
    res = subprocess.run(["tshark", "-r", str(path), "-V", "--disable-protocol", "rpcordma"],
                         capture_output=True, text=True, timeout=60, check=True)
    text = res.stdout
    assert text.count("Request frame header") == 1 and text.count("Reply frame header") == 1
    assert "Malformed" not in text
    if crc:
        assert text.count("(Good CRC32)") == fpdus
        assert "Bad CRC" not in text
    ulpdus = subprocess.run(["tshark", "-r", str(path), "--disable-protocol", "rpcordma", "-T",
                             "fields", "-e", "iwarp_mpa.ulpdulength"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert sum(len(ln.split(",")) for ln in ulpdus.split() if ln) == fpdus
    assert "Terminate" in subprocess.run(
        ["tshark", "-r", str(path), "--disable-protocol", "rpcordma"],
        capture_output=True, text=True, timeout=60, check=True).stdout


def _checked_packets(path: Path) -> int:
    """How many packets of a capture still being written pcap-check passes (0 while it
    fails, or the file is cut short)."""
    out = io.StringIO()
    try:
        if pcap_check.run([str(path)], out) != 0:
            return 0
        return int(out.getvalue().splitlines()[-1].split(": ")[1].split()[0])
    except Exception:
        return 0


def _can_capture() -> bool:
    return shutil.which("dumpcap") is not None and os.geteuid() == 0


@pytest.mark.skipif(not _can_capture(), reason="live capture needs root and dumpcap")
def test_live_loopback_capture(tmp_path: Path) -> None:
    port = ports.free_port()
    path = tmp_path / "live.pcapng"
    cap = Capture(["dumpcap", "-q", "-i", "lo", "-f", f"tcp port {port}", "-w", str(path)])
    try:
        ctx = v.Context(transport="iwarp")
        try:
            pd = v.PD(ctx)
            cq = v.CQ(ctx, 64)
            qps = [v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                         cap=v.QPCap(8, 8, 1, 1))) for _ in range(2)]
            mr = v.MR(pd, 1 << 20, ACC)
            lst = iwconnect.listen(ctx, port, cfg=MpaConfig(crc=True))
            t = threading.Thread(target=lambda: lst.accept(qps[1], b"srv"))
            t.start()
            conn = iwconnect.connect(qps[0], "127.0.0.1", port, b"cli", cfg=MpaConfig(crc=True))
            t.join(120)
            for size in (0, 100, 5000, 300000):
                qps[1].post_recv(v.RecvWR(1, 1, [v.SGE(mr.addr, 1 << 19, mr.lkey)]))
                qps[0].post_send(v.SendWR(2, None, 1, [v.SGE(mr.addr + (1 << 19), size,
                                                             mr.lkey)]))
                got = 0
                end = time.monotonic() + 120
                while got < 2 and time.monotonic() < end:
                    n, _w = cq.poll(2)
                    got += n
                assert got == 2
            conn.disconnect()
            lst.close()
        finally:
            ctx.close()
    finally:
        cap.stop(lambda: _checked_packets(path) >= 10)
    out = io.StringIO()
    assert pcap_check.run([str(path)], out) == 0, out.getvalue()
    last = out.getvalue().splitlines()[-1]
    assert ", 0 failed" in last and int(last.split(": ")[1].split()[0]) >= 10
