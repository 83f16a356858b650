"""``pcap-check`` on captures that hold UDP GSO batches (``tools.pcap_gso``): on ``lo`` the
kernel cuts a GSO send only at the receiving socket, so a capture shows the batch as one
datagram whose segments each carry the ICRC of the header the kernel gives them (IPv4
ID base+i, their own lengths; IBA 7.8.1, Annex A17)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

from harness.gso_frames import DST, ETH, SPORT, SRC, _batch_frame, _segments

from softrdma.tools.capture import pcap_check
from softrdma.tools.capture.pcap_gso import split_gso
from softrdma.wire import roce
from softrdma.wire.pcap import PcapWriter


def _check(frames: list[bytes], tmp_path: Path) -> tuple[int, str, str]:
    path = tmp_path / "gso.pcap"
    w = PcapWriter(path, linktype=1)
    for i, fr in enumerate(frames):
        w.write(fr, ts=1.0 + i)
    w.close()
    out, err = io.StringIO(), io.StringIO()
    rc = pcap_check.run([str(path)], out, err=err, verbose=True)
    return rc, out.getvalue(), err.getvalue()


def test_split_finds_the_segments_and_their_ids() -> None:
    segs = _segments(5, last=200, base_id=7)
    f = roce.parse_frame(_batch_frame(segs, base_id=7), 1)
    assert f is not None and not roce.frame_icrc_ok(f)
    batch = split_gso(f)
    assert batch is not None
    assert len(batch) == 5 and batch.size == len(segs[0]) and batch.base_id == 7
    for i, frame in enumerate(batch.frames):
        g = roce.parse_frame(frame, 1)
        assert g is not None and roce.frame_icrc_ok(g)
        assert g.packet.psn == 100 + i
        assert struct.unpack_from("!H", g.ip, 4)[0] == 7 + i
        assert bytes(g.ib) + g.icrc == segs[i]


def test_a_corrupt_segment_is_not_explained_away() -> None:
    segs = _segments(3)
    bad = bytearray(segs[1])
    bad[40] ^= 1
    f = roce.parse_frame(_batch_frame([segs[0], bytes(bad), segs[2]]), 1)
    assert f is not None and split_gso(f) is None


def test_ids_not_following_the_kernel_rule_fail() -> None:
    segs = _segments(3, base_id=0)
    segs[2] = _segments(3, base_id=5)[2]  # segment 2 computed with ID 7, not 2
    f = roce.parse_frame(_batch_frame(segs), 1)
    assert f is not None and split_gso(f) is None


def test_an_ordinary_bad_icrc_stays_bad() -> None:
    seg = bytearray(_segments(1)[0])
    seg[-1] ^= 0xFF
    f = roce.parse_frame(_batch_frame([bytes(seg)]), 1)
    assert f is not None and split_gso(f) is None


def test_pcap_check_checks_each_segment(tmp_path: Path) -> None:
    segs = _segments(4, last=512)
    other = _segments(1, dqpn=0x99)[0]
    single = ETH + roce.ipv4_header(SRC, DST, 8 + len(other)) + \
        roce.udp_header(SPORT, 4791, 8 + len(other)) + other
    rc, out, err = _check([_batch_frame(segs), single], tmp_path)
    assert rc == 0, err
    assert "a UDP GSO batch of 4 segments of 1040 bytes" in out and "IPv4 IDs 0..3" in out
    assert out.count("RC_SEND_MIDDLE") == 2
    assert "5 packets, 5 ok, 0 failed" in out


def test_pcap_check_still_fails_a_broken_batch(tmp_path: Path) -> None:
    segs = _segments(3)
    bad = bytearray(segs[2])
    bad[-2] ^= 1
    rc, out, err = _check([_batch_frame([segs[0], segs[1], bytes(bad)])], tmp_path)
    assert rc == 1
    assert "frame 1: bad ICRC" in err
