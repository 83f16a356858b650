"""The MPA framing part of the iWARP engine alone (softrdma.iwarp.mpa_stream, RFC 5044).

:class:`FpduRx` is driven with a stand-in sink (no DDP, RDMAP or connection): FPDUs made
by the independent encoder of :mod:`softrdma.wire.mpa` (CRC, markers) are fed in random
chunks, through the copy path, the zero-copy path and the whole-FPDU fast path; framing
errors become LLP Terminates (RFC 5044 §8) and a header error waits for the CRC.
:func:`frame` must be byte-exact with :func:`softrdma.wire.mpa.fpdu_encode`.
"""

from __future__ import annotations

import random

import pytest

from softrdma.iwarp.mpa_stream import DIRECT_MIN, Buf, FpduRx, StallWatch, frame
from softrdma.iwarp.terminate import IwarpFault
from softrdma.wire.crc import crc32c
from softrdma.wire.ddp import LlpEtype, MpaErrorCode, TerminateLayer
from softrdma.wire.mpa import FpduEncoder

HDR = 14  # the stand-in sink treats every ULPDU as a 14-octet header + payload


class Sink:
    """Every segment: a 14-octet header, its payload into one or two fresh buffers."""

    def __init__(self, *, fast: bool = False, split: bool = False) -> None:
        self.rx: FpduRx
        self.got: list[tuple[bytes, bytes]] = []
        self.fast = fast
        self.split = split
        self.fast_hits = 0
        self.fault: IwarpFault | None = None
        self._hdr = b""
        self._bufs: list[bytearray] = []

    def on_header(self) -> None:
        if self.fault is not None:
            raise self.fault
        rx = self.rx
        paylen = rx.ulen - HDR
        self._hdr = bytes(rx.hbuf[2:2 + HDR])
        cut = paylen // 2 if self.split else paylen
        self._bufs = [bytearray(cut), bytearray(paylen - cut)]
        rx.start_body([memoryview(b) for b in self._bufs if b], paylen)

    def on_fpdu(self) -> None:
        self.got.append((self._hdr, b"".join(self._bufs)))

    def fast_run(self, mv: memoryview, i: int, n: int) -> int:
        """One whole FPDU at a time, as a sink's fused path would (CRC checked here)."""
        if not self.fast:
            return 0
        ulen = int.from_bytes(mv[i:i + 2])
        end = i + 2 + ulen + (-(2 + ulen) & 3)
        if ulen <= HDR or end + 4 > n:
            return 0
        if self.rx.crc_on and crc32c(mv[i:end]) != int.from_bytes(mv[end:end + 4], "little"):
            return 0
        self._hdr = bytes(mv[i + 2:i + 2 + HDR])
        self._bufs = [bytearray(mv[i + 2 + HDR:i + 2 + ulen])]
        self.rx.ulen, self.rx.paylen = ulen, ulen - HDR
        self.fast_hits += 1
        self.on_fpdu()
        return end + 4 - i


def make_rx(sink: Sink, *, crc: bool, markers: bool) -> FpduRx:
    rx = FpduRx(sink, crc=crc, markers=markers)
    sink.rx = rx
    return rx


def segments(rng: random.Random, n: int) -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(n):
        size = rng.choice((0, 1, 3, 100, 700, 1500, 5000, 9000))
        out.append((bytes([0x80 | (i & 0x3F)]) + bytes(13), rng.randbytes(size)))
    return out


def encode(segs: list[tuple[bytes, bytes]], *, crc: bool, markers: bool) -> bytes:
    enc = FpduEncoder(crc=crc, markers=markers)
    return b"".join(bytes(b) for h, p in segs for b in enc.encode([h, p]))


@pytest.mark.parametrize("crc", [False, True])
@pytest.mark.parametrize("markers", [False, True])
def test_frame_is_byte_exact_with_the_wire_encoder(crc: bool, markers: bool) -> None:
    rng = random.Random(5044)
    ours = FpduEncoder(crc=crc, markers=markers)
    ref = FpduEncoder(crc=crc, markers=markers)
    for hdr, pay in segments(rng, 30):
        parts: list[Buf] = [hdr, memoryview(pay)] if pay else [hdr]
        bufs, n = frame(ours, parts, len(pay))
        want = b"".join(bytes(b) for b in ref.encode([hdr, pay]))
        assert b"".join(bytes(b) for b in bufs) == want
        assert n == len(want)
        assert ours.offset == ref.offset


@pytest.mark.parametrize("crc", [False, True])
@pytest.mark.parametrize("markers", [False, True])
@pytest.mark.parametrize("fast", [False, True])
def test_fpdus_in_random_chunks_are_delivered_whole(crc: bool, markers: bool, fast: bool) -> None:
    rng = random.Random(int(crc) * 4 + int(markers) * 2 + int(fast))
    segs = segments(rng, 40)
    wire = encode(segs, crc=crc, markers=markers)
    sink = Sink(fast=fast, split=True)
    rx = make_rx(sink, crc=crc, markers=markers)
    mv = memoryview(wire)
    i = 0
    while i < len(mv):
        n = rng.choice((1, 2, 7, 64, 1000, 20000))
        rx.feed(mv[i:i + n])
        i += n
    assert sink.got == segs
    assert rx.pos == len(wire) and not rx.mid_fpdu
    if fast and not markers:
        assert sink.fast_hits > 0  # whole FPDUs in a chunk skip the state machine
    else:
        assert sink.fast_hits == 0


def test_zero_copy_target_and_placed() -> None:
    payload = bytes(range(256)) * 40  # 10240 octets: worth a recv_into
    wire = encode([(bytes(HDR), payload)], crc=True, markers=False)
    sink = Sink()
    rx = make_rx(sink, crc=True, markers=False)
    assert rx.target() is None  # not in a payload yet
    rx.feed(memoryview(wire)[:16])  # ULPDU_Length + header
    t = rx.target()
    assert t is not None and len(t) == len(payload)
    assert rx.lookahead() == 0 + 4 + 20  # no PAD (2 + 10254 is a multiple of 4), CRC, next headers
    t[:4000] = payload[:4000]
    rx.placed(4000)
    t = rx.target()
    assert t is not None and len(t) == len(payload) - 4000
    t[:] = payload[4000:]
    rx.placed(len(t))
    rx.feed(memoryview(wire)[16 + len(payload):])
    assert sink.got == [(bytes(HDR), payload)]


def test_zero_copy_is_refused_with_markers_and_for_small_payloads() -> None:
    for markers, size in ((True, 3 * DIRECT_MIN), (False, DIRECT_MIN - 1)):
        wire = encode([(bytes(HDR), bytes(size))], crc=False, markers=markers)
        sink = Sink()
        rx = make_rx(sink, crc=False, markers=markers)
        rx.feed(memoryview(wire)[:24])
        assert rx.target() is None


def _llp(f: IwarpFault, code: MpaErrorCode) -> None:
    assert (f.layer, f.etype, f.code) == (TerminateLayer.LLP, LlpEtype.MPA, code)
    assert f.ddp_hdr is None  # LLP errors carry no header (RFC 5040 §4.8)


@pytest.mark.parametrize("fast", [False, True])
def test_bad_crc_is_an_llp_crc_error(fast: bool) -> None:
    wire = bytearray(encode([(bytes(HDR), b"x" * 100)], crc=True, markers=False))
    wire[20] ^= 1
    sink = Sink(fast=fast)
    rx = make_rx(sink, crc=True, markers=False)
    with pytest.raises(IwarpFault) as ei:
        rx.feed(memoryview(wire))
    _llp(ei.value, MpaErrorCode.CRC_MISMATCH)
    assert sink.got == [] and sink.fast_hits == 0


def test_marker_pointing_elsewhere_is_a_marker_error() -> None:
    wire = bytearray(encode([(bytes(HDR), bytes(2000))], crc=False, markers=True))
    wire[512 + 2:512 + 4] = (7).to_bytes(2, "big")  # FPDUPTR of the marker at offset 512
    rx = make_rx(Sink(), crc=False, markers=True)
    with pytest.raises(IwarpFault) as ei:
        rx.feed(memoryview(wire))
    _llp(ei.value, MpaErrorCode.MARKER_MISMATCH)


def test_ulpdu_shorter_than_any_ddp_header_loses_framing() -> None:
    rx = make_rx(Sink(), crc=False, markers=False)
    with pytest.raises(IwarpFault) as ei:
        rx.feed(memoryview(b"\x00\x05" + bytes(30)))
    _llp(ei.value, MpaErrorCode.MARKER_MISMATCH)


def test_header_error_waits_for_the_crc() -> None:
    """RFC 5044 §8: the FPDU's CRC is checked before a header error is reported."""
    seg = [(bytes(HDR), b"y" * 300)]
    good = encode(seg, crc=True, markers=False)
    fault = IwarpFault.local_catastrophic("header rejected")
    sink = Sink()
    sink.fault = fault
    rx = make_rx(sink, crc=True, markers=False)
    rx.feed(memoryview(good)[:-1])
    assert rx.pending is fault  # held while the payload and trailer arrive
    with pytest.raises(IwarpFault) as ei:
        rx.feed(memoryview(good)[-1:])
    assert ei.value is fault
    bad = bytearray(good)
    bad[-1] ^= 0xFF
    sink = Sink()
    sink.fault = fault
    rx = make_rx(sink, crc=True, markers=False)
    with pytest.raises(IwarpFault) as ei:
        rx.feed(memoryview(bad))
    _llp(ei.value, MpaErrorCode.CRC_MISMATCH)


def test_dead_stream_consumes_nothing() -> None:
    sink = Sink()
    rx = make_rx(sink, crc=False, markers=False)
    rx.dead = True
    rx.feed(memoryview(encode([(bytes(HDR), b"z")], crc=False, markers=False)))
    assert sink.got == [] and rx.pos == 0


def test_a_stalled_partial_fpdu_times_out_an_idle_stream_does_not() -> None:
    """Issue 21: a header announcing 64 KiB, then silence, ends the stream after the
    stall limit (LLP "TCP connection lost", RFC 5044 §8); each new octet restarts the
    wait, and silence between whole FPDUs is never a stall."""
    sink = Sink()
    rx = make_rx(sink, crc=False, markers=False)
    watch = StallWatch()
    wire = encode([(bytes(HDR), b"z" * 100)], crc=False, markers=False)
    rx.feed(memoryview(wire))  # one whole FPDU, then an idle stream
    assert sink.got and all(watch.check(rx, t, 5.0) is None for t in (0.0, 10.0, 1000.0))
    rx.feed(memoryview(b"\xff\xff\0"))  # ULPDU_Length 65535 and one more octet
    assert watch.check(rx, 1000.0, 5.0) is None
    assert watch.check(rx, 1004.0, 5.0) is None
    rx.feed(memoryview(b"\0"))  # progress: the wait starts again
    assert watch.check(rx, 1004.5, 5.0) is None
    assert watch.check(rx, 1009.0, 5.0) is None
    f = watch.check(rx, 1009.6, 5.0)
    assert f is not None and "65535" in f.reason
    _llp(f, MpaErrorCode.TCP_CONNECTION_LOST)


def _bulk(n: int, size: int) -> list[tuple[bytes, bytes]]:
    rng = random.Random(size)
    return [(bytes([0x80 | (i & 0x3F)]) + bytes(13), rng.randbytes(size)) for i in range(n)]


@pytest.mark.parametrize("chunk", [20_000, 9_050, 3 * 9_020 + 17])
def test_an_fpdu_cut_after_a_run_is_carried_and_taken_whole(chunk: int) -> None:
    """Each read of the TCP runtime ends inside an FPDU: after a run of whole FPDUs its
    start is carried until the rest arrives, then the fast path takes it whole (before,
    the general path took it in header, payload and trailer steps over two chunks)."""
    segs = _bulk(30, 9000)
    wire = encode(segs, crc=True, markers=False)
    sink = Sink(fast=True)
    headers: list[int] = []
    real = sink.on_header

    def counting() -> None:
        headers.append(1)
        real()

    sink.on_header = counting  # type: ignore[method-assign]
    rx = make_rx(sink, crc=True, markers=False)
    mv = memoryview(bytearray(wire))
    size = len(wire) // len(segs)  # 9020 octets each
    for i in range(0, len(mv), chunk):
        rx.feed(mv[i:i + chunk])
        if i + chunk < len(mv) and (i + chunk) % size:  # cut inside an FPDU
            assert rx.mid_fpdu
    assert sink.got == segs
    assert sink.fast_hits == len(segs) and headers == []
    assert rx.pos == len(wire) and not rx.mid_fpdu


def test_a_carried_fpdu_with_a_bad_crc_is_the_crc_error() -> None:
    segs = _bulk(3, 9000)
    wire = bytearray(encode(segs, crc=True, markers=False))
    wire[-1] ^= 1  # the last FPDU's CRC
    sink = Sink(fast=True)
    rx = make_rx(sink, crc=True, markers=False)
    rx.feed(memoryview(wire)[:2 * 9020 + 5000])  # two whole FPDUs and a cut one
    assert len(sink.got) == 2 and rx.mid_fpdu
    with pytest.raises(IwarpFault) as ei:
        rx.feed(memoryview(wire)[2 * 9020 + 5000:])
    _llp(ei.value, MpaErrorCode.CRC_MISMATCH)
    assert len(sink.got) == 2


def test_a_carried_fpdu_stalls_and_progresses_like_any_partial_fpdu() -> None:
    """The StallWatch sees the octets of a carried FPDU as progress, and its silence as
    a stall (issue 21)."""
    segs = _bulk(2, 9000)
    wire = encode(segs, crc=False, markers=False)
    sink = Sink(fast=True)
    rx = make_rx(sink, crc=False, markers=False)
    watch = StallWatch()
    rx.feed(memoryview(wire)[:9020 + 100])  # one whole FPDU, then 100 octets carried
    assert sink.fast_hits == 1 and rx.mid_fpdu
    assert watch.check(rx, 0.0, 5.0) is None
    rx.feed(memoryview(wire)[9020 + 100:9020 + 101])  # one more octet: progress
    assert watch.check(rx, 4.0, 5.0) is None
    assert watch.check(rx, 8.5, 5.0) is None
    f = watch.check(rx, 9.5, 5.0)
    assert f is not None
    _llp(f, MpaErrorCode.TCP_CONNECTION_LOST)
    rx.feed(memoryview(wire)[9020 + 101:])
    assert sink.got == segs and sink.fast_hits == 2 and not rx.mid_fpdu
