"""``SOFTRDMA_TRACE=pkt`` and ``Context(pcap=FILE)`` / ``--pcap`` beyond RoCEv2: RoCEv1
(Ethernet frames, EtherType 0x8915, linktype EN10MB; Annex A16) and iWARP (the TCP
stream as Ethernet/IP/TCP frames carrying MPA frames and FPDUs, RFC 5044). tshark decodes
both and ``softrdma pcap-check`` passes them."""

from __future__ import annotations

import io
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from harness import iwarp_session
from harness.iwarp_session import _iwarp_session
from harness.trace import captured_trace, rc_pair, rc_send
from harness.tshark import TSHARK, tshark

from softrdma import enums as e
from softrdma.drivers.capture.tap_stream import MAX_SEGMENT, StreamTap, tcp_frame
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.tools.capture import pcap_check
from softrdma.wire.pcap import LINKTYPE_ETHERNET, read_pcap
from softrdma.wire.tcpstream import parse_tcp


@pytest.fixture
def traced() -> Iterator[io.StringIO]:
    with captured_trace("pkt") as buf:
        yield buf


# ---- RoCEv1 -----------------------------------------------------------------------------------
def test_rocev1_capture_and_trace(tmp_path: Path, traced: io.StringIO) -> None:
    fab = Fabric(VirtualClock())
    pcap = tmp_path / "v1.pcap"
    ctxs, sides = rc_pair(fab, ("10.6.0.1", "10.6.0.2"), pcap, roce_ver="1")
    try:
        assert [c.query_gid_type(1, 0) for c in ctxs] == [e.IBV_GID_TYPE_ROCE_V1] * 2
        rc_send(fab, sides, 2500)
    finally:
        for ctx in ctxs:
            ctx.close()
    recs = list(read_pcap(pcap))
    # SEND_FIRST, SEND_MIDDLE, SEND_LAST and one ACK, each once (sent by a tapped device)
    assert len(recs) == 4
    assert all(r.linktype == LINKTYPE_ETHERNET and r.data[12:14] == b"\x89\x15" for r in recs)
    lines = [ln for ln in traced.getvalue().splitlines() if "softrdma.pkt" in ln]
    assert sum(" tx v1 " in ln for ln in lines) == 4 and sum(" rx v1 " in ln for ln in lines) == 4
    assert any("SEND_FIRST" in ln and "PSN=" in ln for ln in lines)
    assert any("ACKNOWLEDGE" in ln for ln in lines)
    out = io.StringIO()
    assert pcap_check.run([str(pcap)], out) == 0, out.getvalue()
    assert out.getvalue().splitlines()[-1].endswith("4 packets, 4 ok, 0 failed")
    if TSHARK is None:
        pytest.skip("tshark is not installed")
    text = tshark(pcap, "-T", "fields", "-e", "eth.type", "-e", "infiniband.bth.opcode",
                  "-e", "infiniband.invariant.crc", mpa=False)
    rows = [r.split("\t") for r in text.splitlines()]
    assert [r[0] for r in rows] == ["0x8915"] * 4
    assert [int(r[1]) for r in rows] == [0, 1, 2, 17]  # RC SEND FIRST/MIDDLE/LAST, ACK
    assert all(r[2] for r in rows)  # the ICRC field decoded


def test_iwarp_capture_is_decoded_by_tshark_and_pcap_check(tmp_path: Path,
                                                            traced: io.StringIO) -> None:
    pcap = tmp_path / "iw.pcap"
    _iwarp_session(pcap)
    recs = list(read_pcap(pcap))
    segs = [parse_tcp(r.linktype, r.data) for r in recs]
    assert all(s is not None for s in segs)
    assert segs[0] is not None and segs[0].flags & 0x02  # the SYN of the initiator
    # each direction written once: sequence numbers follow each other without overlap
    nxt: dict[tuple[str, int], int] = {}
    for sg in segs[3:]:
        assert sg is not None
        key = (sg.src, sg.sport)
        if key in nxt:
            assert sg.seq == nxt[key]
        nxt[key] = sg.seq + len(sg.payload)
        assert len(sg.payload) <= MAX_SEGMENT
    out = io.StringIO()
    assert pcap_check.run([str(pcap)], out) == 0, out.getvalue()
    assert ", 0 failed" in out.getvalue().splitlines()[-1]
    lines = [ln for ln in traced.getvalue().splitlines() if "softrdma.pkt" in ln]
    assert any(" tx " in ln and "MPA Request" in ln for ln in lines)
    assert any(" rx " in ln and "MPA Reply" in ln for ln in lines)
    assert any(ln.endswith("TCP len=24 Send") for ln in lines)  # the empty Send
    assert any(" tx " in ln and "Send x" in ln for ln in lines)  # a 300000-byte message
    assert any(" rx " in ln and "RDMA Write" in ln for ln in lines)
    if TSHARK is None:
        pytest.skip("tshark is not installed")
    _assert_tshark_decodes(pcap)


def _assert_tshark_decodes(pcap: Path) -> None:
    text = tshark(pcap, "-V")
    assert text.count("Request frame header") == 1 and text.count("Reply frame header") == 1
    assert "Malformed" not in text and "Bad CRC" not in text
    assert text.count("(Good CRC32)") >= 6
    ops = tshark(pcap, "-T", "fields", "-e", "iwarp_rdma.opcode")
    assert "0x03" in ops and "0x00" in ops  # Send, RDMA Write


@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
def test_iwarp_capture_on_a_port_wireshark_gives_to_tls(tmp_path: Path) -> None:
    """The listener on TCP port 11207, which Wireshark's port table gives to TLS: the
    capture still decodes as MPA and DDP/RDMAP (the heuristic first), as the docs tell
    users to run tshark."""
    pcap = tmp_path / "iw11207.pcap"
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", 11207))
        except OSError:
            pytest.skip("TCP port 11207 is in use on this machine")
    with mock.patch.object(iwarp_session.ports, "free_port", return_value=11207):
        _iwarp_session(pcap)
    plain = tshark(pcap, "-V", mpa=False)
    assert "Transport Layer Security" in plain  # the port table's choice, without the option
    _assert_tshark_decodes(pcap)


def test_a_receive_recorded_before_its_send_is_written_once(tmp_path: Path) -> None:
    """Both ends of a loopback connection tapped by one device: a receive may be recorded
    before the send that fed it (the sending thread lost its CPU between ``sendmsg`` and
    its tap, as on a busy machine). Each byte is written once, in order, by whichever
    report reaches it first; the frames' sequence numbers follow each other."""
    pcap = tmp_path / "race.pcap"
    data = bytes(range(256)) * 4
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
    tap = StreamTap("iw0", str(pcap), None)
    try:
        tap.rx(b, [data[:600]])  # the receive of the first 600 bytes, before their send
        tap.tx(a, [data], len(data))  # the whole send: only its last 424 bytes are new
        tap.rx(b, [data[600:]])  # already written by the send
        tap.tx(a, [b"tail"], 4)
    finally:
        tap.close()
        a.close()
        b.close()
    segs = [parse_tcp(r.linktype, r.data) for r in read_pcap(pcap)]
    assert all(sg is not None for sg in segs)
    payload = b"".join(sg.payload for sg in segs if sg is not None)
    assert payload == data + b"tail"
    seq = [sg.seq for sg in segs if sg is not None]
    lens = [len(sg.payload) for sg in segs if sg is not None]
    assert all(seq[k + 1] == seq[k] + lens[k] for k in range(len(seq) - 1))


def test_tcp_frame_checksums_and_lengths() -> None:
    f = tcp_frame((b"\x7f\0\0\1", 4000), (b"\x7f\0\0\1", 5000), 1, 1, 0x18, b"abc")
    seg = parse_tcp(LINKTYPE_ETHERNET, f)
    assert seg is not None and seg.payload == b"abc" and (seg.sport, seg.dport) == (4000, 5000)
    ip = f[14:34]
    words = struct.unpack("!10H", ip)
    assert (sum(words) + (sum(words) >> 16)) & 0xFFFF == 0xFFFF  # IPv4 header checksum
    f6 = tcp_frame((b"\0" * 15 + b"\1", 4000), (b"\0" * 15 + b"\1", 5000), 9, 1, 0x18, b"x")
    seg6 = parse_tcp(LINKTYPE_ETHERNET, f6)
    assert seg6 is not None and seg6.seq == 9 and seg6.payload == b"x"
