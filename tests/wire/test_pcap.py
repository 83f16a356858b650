"""pcap / pcapng reader and pcap writer (softrdma.wire.pcap).

Oracles: tshark's frame numbers, lengths and timestamps for every shared capture,
editcap's pcapng and nanosecond-pcap conversions, and a pcapng encoder written here from
the pcapng draft (both byte orders, EPB/SPB/OPB, if_tsresol, several sections).
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from softrdma.errors import ClosedError, DecodeError, InvalidArgument
from softrdma.wire.pcap import PcapRecord, PcapWriter, read_pcap

CAPTURES = Path("/work/shared/captures")
ALL_PCAPS = sorted(CAPTURES.glob("*.pcap"))
HAVE_TSHARK = shutil.which("tshark") is not None
HAVE_EDITCAP = shutil.which("editcap") is not None


def test_there_are_captures() -> None:
    assert len(ALL_PCAPS) >= 10


@pytest.mark.skipif(not HAVE_TSHARK, reason="tshark not installed")
@pytest.mark.parametrize("path", ALL_PCAPS, ids=[p.name for p in ALL_PCAPS])
def test_every_capture_agrees_with_tshark(path: Path) -> None:
    out = subprocess.run(
        ["tshark", "-r", str(path), "-T", "fields", "-E", "separator=,", "-e", "frame.number",
         "-e", "frame.len", "-e", "frame.cap_len", "-e", "frame.time_epoch"],
        capture_output=True, text=True, check=True, timeout=60).stdout.split()
    recs = list(read_pcap(path))
    assert len(recs) == len(out) > 0
    for r, line in zip(recs, out, strict=True):
        num, flen, caplen, ts = line.split(",")
        assert (r.index, r.orig_len, len(r.data), r.linktype) == (int(num), int(flen), int(caplen), 1)
        assert r.ts == pytest.approx(float(ts), abs=2e-6)


def test_record_data_matches_the_file_bytes() -> None:
    path = CAPTURES / "host_peer_roce.pcap"
    raw = path.read_bytes()
    off = 24
    recs = list(read_pcap(path))
    for r in recs:
        incl = struct.unpack_from("<I", raw, off + 8)[0]
        assert r.data == raw[off + 16:off + 16 + incl]
        off += 16 + incl
    assert off == len(raw)
    with path.open("rb") as f:  # a file object works too, and is left open
        assert [r.data for r in read_pcap(f)] == [r.data for r in recs]
        assert not f.closed


# --------------------------------------------------------------------- conversions
@pytest.mark.skipif(not HAVE_EDITCAP, reason="editcap not installed")
@pytest.mark.parametrize("fmt", ["pcapng", "nsecpcap"])
def test_editcap_conversions(tmp_path: Path, fmt: str) -> None:
    src = CAPTURES / "roce_ipv6_rc_pingpong.pcap"
    dst = tmp_path / f"x.{fmt}"
    subprocess.run(["editcap", "-F", fmt, str(src), str(dst)], check=True, capture_output=True,
                   timeout=60)
    head = dst.read_bytes()[:4]
    assert head == (b"\x0a\x0d\x0d\x0a" if fmt == "pcapng" else struct.pack("<I", 0xA1B23C4D))
    a = list(read_pcap(src))
    b = list(read_pcap(dst))
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert (x.data, x.orig_len, x.index, x.linktype) == (y.data, y.orig_len, y.index, y.linktype)
        assert x.ts == pytest.approx(y.ts, abs=1e-6)


# --------------------------------------------------------------------- pcapng encoder
def _block(order: str, btype: int, body: bytes) -> bytes:
    body += bytes(-len(body) % 4)
    total = 12 + len(body)
    return struct.pack(order + "II", btype, total) + body + struct.pack(order + "I", total)


def _opt(order: str, code: int, value: bytes) -> bytes:
    return struct.pack(order + "HH", code, len(value)) + value + bytes(-len(value) % 4)


def _shb(order: str) -> bytes:
    body = struct.pack(order + "IHHq", 0x1A2B3C4D, 1, 0, -1) + _opt(order, 4, b"softrdma test") + _opt(order, 0, b"")
    return _block(order, 0x0A0D0D0A, body)


def _idb(order: str, linktype: int, snaplen: int = 0, tsresol: int | None = None,
         tsoffset: int = 0) -> bytes:
    opts = b""
    if tsresol is not None:
        opts += _opt(order, 9, bytes([tsresol]))
    if tsoffset:
        opts += _opt(order, 14, struct.pack(order + "q", tsoffset))
    if opts:
        opts += _opt(order, 0, b"")
    return _block(order, 1, struct.pack(order + "HHI", linktype, 0, snaplen) + opts)


def _epb(order: str, ifid: int, ticks: int, data: bytes, orig: int | None = None) -> bytes:
    return _block(order, 6, struct.pack(order + "IIIII", ifid, ticks >> 32, ticks & 0xFFFFFFFF,
                                        len(data), len(data) if orig is None else orig) + data)


def _spb(order: str, data: bytes, orig: int | None = None) -> bytes:
    return _block(order, 3, struct.pack(order + "I", len(data) if orig is None else orig) + data)


def _opb(order: str, ifid: int, ticks: int, data: bytes) -> bytes:
    return _block(order, 2, struct.pack(order + "HHIIII", ifid, 0, ticks >> 32, ticks & 0xFFFFFFFF,
                                        len(data), len(data)) + data)


@pytest.mark.parametrize("order", ["<", ">"], ids=["little", "big"])
def test_pcapng_blocks(tmp_path: Path, order: str) -> None:
    blob = (
        _shb(order)
        + _idb(order, 1)                                   # interface 0: Ethernet, usec
        + _idb(order, 101, tsresol=9, tsoffset=100)        # interface 1: raw IP, nsec, +100 s
        + _epb(order, 0, 1_700_000_000_123_456, b"frame-one", orig=1500)
        + _block(order, 5, struct.pack(order + "III", 0, 0, 0))  # ISB: skipped
        + _epb(order, 1, 2_000_000_000_500_000_000, b"\x45" + b"two")
        + _spb(order, b"simple!")
        + _opb(order, 1, 3_000_000_000, b"obsolete")
        + _block(order, 0x99, b"unknown block")
        # A second section, of the other byte order, resets the interfaces.
        + _shb(">" if order == "<" else "<")
        + _idb(">" if order == "<" else "<", 276, tsresol=0x80 | 10)   # 2^-10 s
        + _epb(">" if order == "<" else "<", 0, 1024 * 5, b"sll2")
    )
    path = tmp_path / "t.pcapng"
    path.write_bytes(blob)
    recs = list(read_pcap(path))
    assert [(r.index, r.linktype, r.data, r.orig_len) for r in recs] == [
        (1, 1, b"frame-one", 1500), (2, 101, b"\x45two", 4), (3, 1, b"simple!", 7),
        (4, 101, b"obsolete", 8), (5, 276, b"sll2", 4)]
    assert recs[0].ts == pytest.approx(1_700_000_000.123456)
    assert recs[1].ts == pytest.approx(2_000_000_100.5)
    assert recs[2].ts == 0.0
    assert recs[3].ts == pytest.approx(103.0)
    assert recs[4].ts == pytest.approx(5.0)
    if HAVE_TSHARK and order == "<":
        out = subprocess.run(["tshark", "-r", str(path), "-T", "fields", "-e", "frame.len"],
                             capture_output=True, text=True, timeout=60)
        assert out.stdout.split() == ["1500", "4", "7", "8", "4"]


def test_pcapng_spb_uses_snaplen(tmp_path: Path) -> None:
    path = tmp_path / "s.pcapng"
    path.write_bytes(_shb("<") + _idb("<", 1, snaplen=4) + _spb("<", b"abcdefgh", orig=100))
    (r,) = read_pcap(path)
    assert r.data == b"abcd" and r.orig_len == 100


@pytest.mark.parametrize("blob, why", [
    (_shb("<")[:20], "truncated"),
    (_shb("<")[:8] + b"\x00\x00\x00\x00" + _shb("<")[12:], "byte-order magic"),
    (struct.pack("<II", 0x0A0D0D0A, 13) + struct.pack("<I", 0x1A2B3C4D), "section header block length"),
    (_shb("<") + _epb("<", 0, 0, b"x"), "undeclared interface"),
    (_shb("<") + _spb("<", b"x"), "before any interface"),
    (_shb("<") + _idb("<", 1) + _epb("<", 0, 0, b"abcd")[:-3], "truncated"),
    (_shb("<") + _idb("<", 1) + _epb("<", 0, 0, b"abcd")[:-4] + b"\x00\x00\x00\x01", "trailing length"),
    (_shb("<") + struct.pack("<II", 6, 14) + bytes(6), "bad block length"),
    (_shb("<") + _idb("<", 1) + _block("<", 6, struct.pack("<IIIII", 0, 0, 0, 99, 99)), "overruns"),
    (_shb("<") + _idb("<", 1) + _block("<", 6, b"short"), "too short"),
    (_shb("<") + b"\x01\x00", "truncated block header"),
])
def test_pcapng_errors(tmp_path: Path, blob: bytes, why: str) -> None:
    path = tmp_path / "bad.pcapng"
    path.write_bytes(blob)
    with pytest.raises(DecodeError, match=why):
        list(read_pcap(path))


# --------------------------------------------------------------------- classic variants
def _classic(order: str, magic: int, linktype: int, recs: list[tuple[int, int, bytes, int]]) -> bytes:
    out = struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, 65535, linktype)
    for sec, frac, data, orig in recs:
        out += struct.pack(order + "IIII", sec, frac, len(data), orig) + data
    return out


@pytest.mark.parametrize("order", ["<", ">"], ids=["little", "big"])
@pytest.mark.parametrize("nsec", [False, True], ids=["usec", "nsec"])
def test_classic_byte_orders_and_resolutions(order: str, nsec: bool) -> None:
    magic = 0xA1B23C4D if nsec else 0xA1B2C3D4
    frac = 123_456_789 if nsec else 123_456
    blob = _classic(order, magic, 0x10000000 | 113, [(1000, frac, b"abc", 3), (1001, 0, b"", 60)])
    recs = list(read_pcap(io.BytesIO(blob)))
    assert recs == [PcapRecord(recs[0].ts, 113, b"abc", 3, 1), PcapRecord(1001.0, 113, b"", 60, 2)]
    assert recs[0].ts == pytest.approx(1000.123456789 if nsec else 1000.123456, abs=1e-9)


@pytest.mark.parametrize("blob, why", [
    (b"", "empty file"),
    (b"\xd4\xc3", "truncated file header"),
    (b"this is not a capture file at all", "not a pcap"),
    (struct.pack("<I", 0xA1B2C3D4) + bytes(10), "truncated pcap file header"),
    (_classic("<", 0xA1B2C3D4, 1, [(1, 0, b"abcdef", 6)])[:-2], "frame 1: truncated record"),
    (_classic("<", 0xA1B2C3D4, 1, [(1, 0, b"ab", 2)]) + bytes(7), "frame 2: truncated record header"),
    (_classic("<", 0xA1B2C3D4, 1, []) + struct.pack("<IIII", 0, 0, 1 << 30, 1 << 30), "implausible"),
])
def test_classic_errors(blob: bytes, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        list(read_pcap(io.BytesIO(blob)))


def test_truncated_shared_capture(tmp_path: Path) -> None:
    raw = (CAPTURES / "roce_rping.pcap").read_bytes()
    path = tmp_path / "cut.pcap"
    path.write_bytes(raw[:len(raw) - 100])
    it = read_pcap(path)
    good = []
    with pytest.raises(DecodeError, match="truncated record"):
        for r in it:
            good.append(r)
    assert len(good) == 64


def test_missing_file_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        list(read_pcap(tmp_path / "nope.pcap"))


# --------------------------------------------------------------------- writer
def test_writer_roundtrip(tmp_path: Path) -> None:
    src = list(read_pcap(CAPTURES / "roce_ud_pingpong.pcap"))
    path = tmp_path / "w.pcap"
    with PcapWriter(path) as w:
        for r in src:
            w.write(r.data, ts=r.ts)
    assert w.count == len(src)
    back = list(read_pcap(path))
    assert [(r.data, r.orig_len, r.index, r.linktype) for r in back] == [
        (r.data, r.orig_len, r.index, r.linktype) for r in src]
    assert all(a.ts == pytest.approx(b.ts, abs=1e-6) for a, b in zip(src, back, strict=True))
    # Same bytes as the original capture (tcpdump wrote the same format).
    orig = (CAPTURES / "roce_ud_pingpong.pcap").read_bytes()
    assert path.read_bytes()[24:] == orig[24:]


def test_writer_snaplen_linktype_fileobj_and_close() -> None:
    buf = io.BytesIO()
    w = PcapWriter(buf, linktype=276, snaplen=4)
    w.write(b"abcdefgh", ts=12.5)
    w.write(bytearray(b"xy"))
    w.close()
    w.close()  # idempotent
    assert not buf.closed
    with pytest.raises(ClosedError):
        w.write(b"late")
    buf.seek(0)
    recs = list(read_pcap(buf))
    assert [(r.data, r.orig_len, r.linktype) for r in recs] == [(b"abcd", 8, 276), (b"xy", 2, 276)]
    assert recs[0].ts == 12.5 and recs[1].ts > 1.6e9
    with pytest.raises(InvalidArgument):
        PcapWriter(io.BytesIO(), snaplen=0)


@pytest.mark.skipif(not HAVE_TSHARK, reason="tshark not installed")
def test_tshark_reads_what_we_write(tmp_path: Path) -> None:
    path = tmp_path / "t.pcap"
    frames = [r.data for r in read_pcap(CAPTURES / "roce_ucmatose.pcap")][:5]
    with PcapWriter(str(path)) as w:
        for i, d in enumerate(frames):
            w.write(d, ts=1_800_000_000 + i * 0.25)
    out = subprocess.run(["tshark", "-r", str(path), "-T", "fields", "-e", "frame.len",
                          "-e", "frame.time_epoch"], capture_output=True, text=True, check=True,
                         timeout=60).stdout.split("\n")
    rows = [line.split("\t") for line in out if line]
    assert [int(a) for a, _ in rows] == [len(d) for d in frames]
    assert [float(b) for _, b in rows] == pytest.approx([1_800_000_000 + i * 0.25 for i in range(5)])
