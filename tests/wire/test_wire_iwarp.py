"""iWARP wire layer: MPA frames, FPDUs, markers, CRC (softrdma.wire.mpa), DDP/RDMAP and
the Terminate message (softrdma.wire.ddp).

Oracles (RFC 5044, RFC 6581, RFC 5041, RFC 5040): the worked examples of ../shared/specs/iwarp.md §1 and §3 (bytes computed independently of this
code), the iSCSI CRC32c vectors, the bit layouts of ../shared/specs/iwarp.md §2/§5/§6 written out by
hand, the RFC 5044 MULPDU formula, and round trips / fuzzing with hypothesis.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softrdma.errors import DecodeError, InvalidArgument, SoftRdmaError, StateError
from softrdma.wire import ddp, mpa
from softrdma.wire.crc import crc32c

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ../shared/specs/iwarp.md §3 worked examples (CRC enabled).
HELLO_FPDU = bytes.fromhex(
    "0017" "41" "43" "00000000" "00000000" "00000001" "00000000" "68656c6c6f" "000000" "b990b10c")
RTR_WRITE_FPDU = bytes.fromhex("000e" "c1" "40" "00000001" "0000000000000000" "ebd34c5f")
# ../shared/specs/iwarp.md §1 (RFC 5044 §7.1, RFC 6581): siw's default MPA v2 Request (Enhanced, IRD = ORD = 16).
V2_REQUEST = bytes.fromhex("4d504120494420526571204672616d65" "10" "02" "0004" "0010" "0010")


def join(bufs: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(b) for b in bufs)


# --- CRC and worked examples -----------------------------------------------------------------


def test_crc32c_check_values() -> None:
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"123456789") == 0xE3069283


def test_hello_send_fpdu_worked_example() -> None:
    seg = ddp.Segment(ddp.DdpUntagged(ddp.RdmapOpcode.SEND, qn=0, msn=1, mo=0), b"hello")
    assert join(mpa.fpdu_encode(ddp.encode_segment(seg), crc=True)) == HELLO_FPDU
    # CRC off: same bytes with a zero CRC field.
    assert join(mpa.fpdu_encode(ddp.encode_segment(seg), crc=False)) == HELLO_FPDU[:-4] + bytes(4)
    (f,) = mpa.FpduDeframer(crc=True, markers=False).feed(HELLO_FPDU)
    assert f.crc == 0x0CB190B9 and f.raw == HELLO_FPDU and f.pad == bytes(3)
    back = ddp.decode_segment(f.ulpdu)
    assert back == seg
    assert ddp.describe(back) == "Send QN=0 MSN=1 MO=0 L len=5"


def test_rtr_write_fpdu_worked_example() -> None:
    seg = ddp.Segment(ddp.DdpTagged(ddp.RdmapOpcode.RDMA_WRITE, stag=1, to=0))
    assert join(mpa.fpdu_encode(ddp.encode_segment(seg), crc=True)) == RTR_WRITE_FPDU
    (f,) = mpa.FpduDeframer(crc=True, markers=False).feed(RTR_WRITE_FPDU)
    assert f.crc == 0x5F4CD3EB
    assert ddp.decode_segment(f.ulpdu) == seg


def test_fpdu_encode_does_not_copy_the_payload() -> None:
    payload = memoryview(bytearray(b"x" * 1000))
    hdr = ddp.encode_segment_headers(ddp.Segment(ddp.DdpUntagged(3, 0, 7)))
    out = mpa.fpdu_encode([hdr, payload], crc=True)
    assert any(b is payload for b in out)
    whole = join(out)
    assert crc32c(whole[:-4]) == int.from_bytes(whole[-4:], "little")
    assert len(whole) % 4 == 0


# --- MPA Request / Reply -------------------------------------------------------------------


def test_mpa_v2_request_example() -> None:
    req = mpa.MpaRequest.build(v2=mpa.MpaV2Params(ird=16, ord=16))
    assert req.encode() == V2_REQUEST
    back = mpa.decode_mpa_frame(V2_REQUEST)
    assert isinstance(back, mpa.MpaRequest) and back == req
    assert back.enhanced and back.revision == 2 and not back.crc and not back.markers
    assert back.v2 == mpa.MpaV2Params(16, 16) and back.user_data == b""


def test_mpa_flags_and_v2_bits_by_hand() -> None:
    rep = mpa.MpaReply(markers=True, crc=True, reject=True, enhanced=True, revision=2,
                       private_data=bytes.fromhex("c003" "8005") + b"ud", reserved=0x8)
    raw = rep.encode()
    assert raw[:16] == b"MPA ID Rep Frame"
    assert raw[16] == 0x80 | 0x40 | 0x20 | 0x10 | 0x08
    assert raw[17:20] == b"\x02\x00\x06"
    v2 = rep.v2
    assert v2 == mpa.MpaV2Params(ird=3, ord=5, peer_to_peer=True, rtr_send=True, rtr_write=True)
    assert rep.user_data == b"ud"
    assert mpa.decode_mpa_frame(raw) == rep
    assert mpa.MpaV2Params(0, 0, rtr_read=True).encode() == bytes.fromhex("00004000")
    # Revision 1 or no Enhanced flag: the private data is all user data.
    r1 = mpa.MpaRequest(enhanced=True, revision=1, private_data=b"abcd")
    assert r1.v2 is None and r1.user_data == b"abcd"


def test_mpa_build_limits() -> None:
    mpa.MpaRequest.build(user_data=b"u" * mpa.MPA_MAX_PRIVDATA_SEND)
    with pytest.raises(InvalidArgument):
        mpa.MpaRequest.build(v2=mpa.MpaV2Params(1, 1), user_data=b"u" * 253)
    with pytest.raises(InvalidArgument):
        mpa.MpaRequest.build(v2=mpa.MpaV2Params(1, 1), revision=1)
    with pytest.raises(InvalidArgument):
        mpa.MpaV2Params(0x4000, 1).encode()
    # Decoding accepts the RFC's 512 bytes, not 513.
    ok = mpa.MpaReply(private_data=bytes(512)).encode()
    assert len(mpa.decode_mpa_frame(ok).private_data) == 512
    with pytest.raises(InvalidArgument):
        mpa.MpaReply(private_data=bytes(513)).encode()


def test_parser_byte_by_byte_with_remainder() -> None:
    p = mpa.MpaFrameParser(mpa.MpaRequest)
    data = V2_REQUEST + HELLO_FPDU
    frame = None
    for i in range(len(V2_REQUEST) - 1):
        assert p.feed(data[i:i + 1]) is None
    frame = p.feed(data[len(V2_REQUEST) - 1:])
    assert frame is not None and frame.v2 == mpa.MpaV2Params(16, 16)
    assert p.remainder == HELLO_FPDU
    with pytest.raises(StateError):
        p.feed(b"more")


def test_parser_errors_carry_mpa_code() -> None:
    with pytest.raises(mpa.MpaFrameError) as ei:
        mpa.MpaFrameParser(mpa.MpaRequest).feed(b"MPA ID Rep")  # fails before 16 bytes
    assert ei.value.code == ddp.MpaErrorCode.INVALID_REQ_REP and int(ei.value.code) == 0x04
    assert isinstance(ei.value, DecodeError)
    with pytest.raises(mpa.MpaFrameError, match="key"):
        mpa.MpaFrameParser().feed(b"GET / HTTP/1.1\r\n")
    too_long = V2_REQUEST[:18] + (513).to_bytes(2, "big")
    with pytest.raises(mpa.MpaFrameError, match="PD_Length 513"):
        mpa.MpaFrameParser().feed(too_long)
    with pytest.raises(mpa.MpaFrameError, match="PD_Length 300"):
        mpa.MpaFrameParser(max_pd=256).feed(V2_REQUEST[:18] + (300).to_bytes(2, "big"))
    with pytest.raises(mpa.MpaFrameError, match="revision 3"):
        mpa.MpaFrameParser().feed(V2_REQUEST[:17] + b"\x03" + V2_REQUEST[18:])
    assert mpa.MpaFrameParser(revisions=(0, 1, 2)).feed(V2_REQUEST[:17] + b"\x00\x00\x00") is not None
    with pytest.raises(mpa.MpaFrameError, match="Enhanced"):
        mpa.MpaFrameParser().feed(V2_REQUEST[:18] + b"\x00\x02\x00\x10")
    with pytest.raises(mpa.MpaFrameError):
        mpa.decode_mpa_frame(V2_REQUEST + b"x")


@FUZZ
@given(st.binary(max_size=600), st.integers(1, 64), st.booleans())
def test_fuzz_mpa_parser(data: bytes, chunk: int, keyed: bool) -> None:
    if keyed:
        data = mpa.KEY_REP + data
    p = mpa.MpaFrameParser()
    try:
        for i in range(0, len(data), chunk):
            if p.feed(data[i:i + chunk]) is not None:
                break
    except SoftRdmaError as e:
        assert isinstance(e, (DecodeError, StateError))
    try:
        mpa.decode_mpa_frame(data)
    except DecodeError:
        pass


@FUZZ
@given(st.booleans(), st.booleans(), st.booleans(), st.booleans(), st.integers(0, 15),
       st.integers(0, 255), st.binary(max_size=512))
def test_mpa_frame_round_trip(reply: bool, m: bool, c: bool, r: bool, rsvd: int, rev: int,
                              pd: bytes) -> None:
    cls = mpa.MpaReply if reply else mpa.MpaRequest
    f = cls(markers=m, crc=c, reject=r, enhanced=bool(rsvd & 1), revision=rev, private_data=pd,
            reserved=rsvd)
    raw = f.encode()
    assert mpa.decode_mpa_frame(raw) == f
    assert mpa.decode_mpa_frame(raw).encode() == raw


# --- FPDU deframer ---------------------------------------------------------------------------


def _ulpdu(rng: random.Random) -> bytes:
    op = rng.choice([0, 2]) if rng.random() < 0.5 else rng.choice([3, 4, 5, 6])
    if op in (0, 2):
        seg = ddp.Segment(ddp.DdpTagged(op, rng.getrandbits(32), rng.getrandbits(64),
                                        last=rng.random() < 0.5), rng.randbytes(rng.randrange(0, 1500)))
    else:
        seg = ddp.Segment(ddp.DdpUntagged(op, 0, rng.getrandbits(32), rng.getrandbits(32)),
                          rng.randbytes(rng.randrange(0, 1500)))
    return ddp.encode_segment_bytes(seg)


def _chunks(data: bytes, rng: random.Random) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        n = rng.choice([1, 3, 4, 7, 100, 511, 512, 513, 1448, 5000])
        out.append(data[i:i + n])
        i += n
    return out


@FUZZ
@given(st.integers(0, 2**32), st.booleans(), st.booleans(), st.integers(0, 5000))
def test_encoder_deframer_round_trip(seed: int, crc: bool, markers: bool, start: int) -> None:
    rng = random.Random(seed)
    start -= start % 4  # FPDU streams start 4-aligned; markers sit at multiples of 512
    ulpdus = [_ulpdu(rng) for _ in range(rng.randrange(1, 6))]
    enc = mpa.FpduEncoder(crc=crc, markers=markers, stream_offset=start)
    wire = []
    for u in ulpdus:
        cut = rng.randrange(0, len(u) + 1)
        wire.append(join(enc.encode([u[:cut], memoryview(u)[cut:]])))
    stream = b"".join(wire)
    assert enc.offset == start + len(stream)
    dfr = mpa.FpduDeframer(crc=crc, markers=markers, stream_offset=start)
    got = []
    for c in _chunks(stream, rng):
        got.extend(dfr.feed(c))
    assert [bytes(f.ulpdu) for f in got] == ulpdus
    assert [f.raw for f in got] == wire
    assert dfr.buffered == 0 and dfr.offset == start + len(stream)
    if markers:
        n_markers = sum(len(f.markers) for f in got)
        expected = len(range(start + (-start) % 512, start + len(stream), 512))
        assert n_markers == expected
        assert all(r == 0 for f in got for r, _ in f.markers)
    # Re-encoding a received FPDU at its offset gives its bytes back.
    for f in got:
        again = mpa.FpduEncoder(crc=crc, markers=markers, stream_offset=f.offset).encode([f.ulpdu])
        assert join(again) == f.raw


def test_markers_by_hand() -> None:
    # Stream offset 0: the first FPDU starts with a marker pointing at itself.
    enc = mpa.FpduEncoder(crc=False, markers=True)
    seg = ddp.encode_segment_bytes(ddp.Segment(ddp.DdpTagged(0, 1, 0)))  # 14 bytes
    first = join(enc.encode([seg]))
    assert first[:4] == bytes(4) and first[4:6] == b"\x00\x0e" and len(first) == 4 + 20
    # An FPDU that crosses offset 512: a marker there with FPDUPTR = 512 - its start.
    big = bytes(600)
    before = enc.offset
    second = join(enc.encode([big]))
    m = 512 - before
    assert second[m:m + 4] == (0).to_bytes(2, "big") + m.to_bytes(2, "big")
    dfr = mpa.FpduDeframer(crc=False, markers=True, min_ulpdu=0)
    a, b = dfr.feed(first + second)
    assert a.markers == ((0, 0),) and b.markers == ((0, m),)
    assert bytes(b.ulpdu) == big


def test_marker_between_pad_and_crc() -> None:
    # Start at 512 - 4 - 508 = 0 with a leading marker; choose a ULPDU so the CRC sits at 512.
    # Leading marker (4) + ULPDU_Length (2) + ULPDU + pad = 512  ->  ULPDU + pad = 506.
    ulpdu = bytes(505)  # pad 1 (2 + 505 + 1 = 508)
    enc = mpa.FpduEncoder(crc=True, markers=True)
    raw = join(enc.encode([ulpdu]))
    assert len(raw) == 4 + 508 + 4 + 4
    assert raw[512:516] == b"\x00\x00\x02\x00"  # marker, FPDUPTR 512
    assert crc32c(raw[:516]) == int.from_bytes(raw[516:], "little")
    (f,) = mpa.FpduDeframer(crc=True, markers=True).feed(raw)
    assert f.markers == ((0, 0), (0, 512)) and bytes(f.ulpdu) == ulpdu


def test_marked_span_matches_marker_positions() -> None:
    for pos in range(0, 2048, 4):
        for n in (8, 500, 508, 509, 512, 1020, 1024, 3000):
            span = mpa.marked_span(pos, n)
            k = len(range(pos + (-pos) % 512, pos + span, 512))
            assert span == n + 4 * k, (pos, n)


def test_deframer_errors() -> None:
    # Bad CRC: typed error, FPDU consumed, decoding goes on.
    bad = bytearray(HELLO_FPDU)
    bad[10] ^= 1
    dfr = mpa.FpduDeframer(crc=True, markers=False)
    with pytest.raises(mpa.MpaCrcError) as ei:
        dfr.feed(RTR_WRITE_FPDU + bytes(bad) + RTR_WRITE_FPDU)
    assert ei.value.code == ddp.MpaErrorCode.CRC_MISMATCH
    assert [f.raw for f in ei.value.fpdus] == [RTR_WRITE_FPDU]
    assert ei.value.fpdu.raw == bytes(bad) and ei.value.computed != ei.value.fpdu.crc
    assert [f.raw for f in dfr.feed(b"")] == [RTR_WRITE_FPDU]
    # CRC not negotiated: not checked.
    assert len(mpa.FpduDeframer(crc=False, markers=False).feed(bytes(bad))) == 1
    # Bad length: sticky until resync.
    dfr = mpa.FpduDeframer(crc=False, markers=False)
    with pytest.raises(mpa.MpaLengthError) as li:
        dfr.feed(b"\x00\x02abcdef")
    assert li.value.code == ddp.MpaErrorCode.MARKER_MISMATCH
    with pytest.raises(mpa.MpaLengthError):
        dfr.feed(RTR_WRITE_FPDU)
    dfr.resync(0)
    assert len(dfr.feed(RTR_WRITE_FPDU)) == 1
    with pytest.raises(mpa.MpaLengthError):
        mpa.FpduDeframer(crc=False, markers=False, max_ulpdu=20).feed(HELLO_FPDU)
    # Wrong FPDUPTR.
    raw = bytearray(join(mpa.FpduEncoder(crc=False, markers=True).encode([bytes(600)])))
    raw[512 + 3] ^= 4
    with pytest.raises(mpa.MpaMarkerError):
        mpa.FpduDeframer(crc=False, markers=True).feed(bytes(raw))


@FUZZ
@given(st.binary(max_size=3000), st.booleans(), st.booleans(), st.integers(0, 1024),
       st.integers(1, 600))
def test_fuzz_deframer(data: bytes, crc: bool, markers: bool, start: int, chunk: int) -> None:
    dfr = mpa.FpduDeframer(crc=crc, markers=markers, stream_offset=start * 4, min_ulpdu=0)
    for i in range(0, len(data), chunk):
        try:
            for f in dfr.feed(data[i:i + chunk]):
                assert len(f.raw) >= 8
        except mpa.MpaCrcError:
            pass
        except mpa.MpaError:
            assert dfr.failed is not None
            return


def test_mulpdu() -> None:
    assert mpa.mulpdu(1448, markers=False) == 1442
    assert mpa.mulpdu(1460, markers=False) == 1454
    assert mpa.mulpdu(1448, markers=True) == 1448 - (6 + 4 * 3)
    assert mpa.mulpdu(1450, markers=False) == 1450 - 8
    with pytest.raises(InvalidArgument):
        mpa.mulpdu(6, markers=False)


@FUZZ
@given(st.integers(64, 9000), st.integers(0, 4095))
def test_mulpdu_fpdu_fits_one_segment(mss: int, start: int) -> None:
    for markers in (False, True):
        n = mpa.mulpdu(mss, markers)
        plain = 2 + n + mpa.pad_len(n) + 4
        span = mpa.marked_span(start * 4, plain) if markers else plain
        assert span <= mss


# --- DDP / RDMAP ---------------------------------------------------------------------------


def test_ddp_headers_by_hand() -> None:
    t = ddp.DdpTagged(ddp.RdmapOpcode.RDMA_READ_RESPONSE, stag=0x11223344,
                      to=0x0102030405060708, last=False)
    assert ddp.encode_ddp(t) == bytes.fromhex("81" "42" "11223344" "0102030405060708")
    u = ddp.DdpUntagged(ddp.RdmapOpcode.SEND_SE_INVALIDATE, qn=0, msn=9, mo=4096,
                        rsvdulp=0xCAFEBABE)
    assert ddp.encode_ddp(u) == bytes.fromhex("41" "46" "cafebabe" "00000000" "00000009" "00001000")
    assert ddp.decode_ddp(ddp.encode_ddp(t)) == t and ddp.decode_ddp(ddp.encode_ddp(u)) == u
    # Reserved bits and versions are kept.
    odd = bytes.fromhex("be" "f3") + bytes(12)
    h = ddp.decode_ddp(odd)
    assert h.tagged and not h.last and h.ddp_rsvd == 0xF and h.dv == 2 and h.rv == 3
    assert h.rdmap_rsvd == 3 and h.opcode == 3
    assert ddp.encode_ddp(h) == odd
    assert ddp.check_segment(ddp.Segment(h)) == "DDP version 2, expected 1"


def test_opcodes() -> None:
    assert [int(o) for o in ddp.RdmapOpcode][:8] == list(range(8))
    assert int(ddp.RdmapOpcode.TERMINATE) == 7 and int(ddp.RdmapOpcode.SEND_SE_INVALIDATE) == 6
    assert ddp.opcode_name(0xC) == "reserved opcode 0xc"


def test_read_request() -> None:
    rr = ddp.ReadRequest(0xAABBCCDD, 0x1000, 4096, 0x01020304, 0x2000)
    seg = ddp.Segment(ddp.DdpUntagged(1, ddp.QN_READ_REQUEST, 1), read_request=rr)
    raw = ddp.encode_segment_bytes(seg)
    assert len(raw) == 46
    assert raw[18:] == bytes.fromhex("aabbccdd" "0000000000001000" "00001000" "01020304"
                                     "0000000000002000")
    assert ddp.decode_segment(raw) == seg
    assert ddp.check_segment(seg) is None
    assert "size=4096" in ddp.describe(seg)
    with pytest.raises(DecodeError):
        ddp.decode_segment(raw[:40])
    with pytest.raises(InvalidArgument):
        ddp.encode_segment(ddp.Segment(ddp.DdpUntagged(1, 1, 1)))


def test_terminate_by_hand() -> None:
    victim = ddp.encode_ddp(ddp.DdpUntagged(3, 0, 5))
    term = ddp.Terminate(ddp.TerminateLayer.DDP, ddp.DdpEtype.UNTAGGED_BUFFER,
                         ddp.DdpUntaggedErrorCode.INVALID_MSN_RANGE, m=True, d=True,
                         ddp_seg_len=18, ddp_hdr=victim)
    assert term.encode() == bytes.fromhex("12" "03" "c000" "0012") + victim
    seg = ddp.Segment(ddp.DdpUntagged(7, ddp.QN_TERMINATE, 1), terminate=term)
    raw = ddp.encode_segment_bytes(seg)
    assert ddp.decode_segment(raw) == seg and ddp.check_segment(seg) is None
    assert "DDP / Untagged Buffer Error / Invalid MSN - MSN range is not valid" in ddp.describe(seg)
    # Remote protection error with the Read Request headers (M, D, R).
    rreq = ddp.ReadRequest(1, 2, 3, 4, 5).encode()
    rhdr = ddp.encode_ddp(ddp.DdpUntagged(1, 1, 1))
    t2 = ddp.Terminate(0, 1, 0x02, True, True, True, 0, 46, rhdr, rreq)
    assert t2.encode()[:4] == bytes.fromhex("01 02 e0 00") and len(t2.encode()) == 4 + 2 + 18 + 28
    assert ddp.Terminate.decode(t2.encode()) == t2
    # Catastrophic: the control word only.
    t3 = ddp.Terminate(ddp.TerminateLayer.LLP, ddp.LlpEtype.MPA, ddp.MpaErrorCode.CRC_MISMATCH)
    assert t3.encode() == bytes.fromhex("20020000")
    assert ddp.error_name(2, 0, 2) == "LLP / MPA Error / Received MPA CRC does not match"
    with pytest.raises(InvalidArgument):
        ddp.Terminate(0, 1, 0, d=True).encode()
    with pytest.raises(DecodeError):
        ddp.Terminate.decode(bytes.fromhex("01020000"[:6]))
    with pytest.raises(DecodeError):
        ddp.Terminate.decode(bytes.fromhex("0102c000 0012 41"))


def test_error_tables_are_complete_and_named() -> None:
    assert [c.value for c in ddp.RdmapErrorCode] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xFF]
    assert [c.value for c in ddp.DdpTaggedErrorCode] == [0, 1, 2, 3, 4]
    assert [c.value for c in ddp.DdpUntaggedErrorCode] == [1, 2, 3, 4, 5, 6]
    assert [c.value for c in ddp.MpaErrorCode] == [1, 2, 3, 4, 5, 6, 7]
    for layer, etype, codes in ((0, 1, list(ddp.RdmapErrorCode)),
                                (1, 1, list(ddp.DdpTaggedErrorCode)),
                                (1, 2, list(ddp.DdpUntaggedErrorCode)),
                                (2, 0, list(ddp.MpaErrorCode))):
        for code in codes:
            assert "code" not in ddp.error_name(layer, etype, code)
    assert ddp.error_name(0, 2, 6) == "RDMAP / Remote Operation Error / Unexpected OpCode"
    assert ddp.error_name(5, 9, 0x77) == "layer 5 / etype 9 / code 0x77"


def test_check_segment_rules() -> None:
    def bad(seg: ddp.Segment) -> str:
        why = ddp.check_segment(seg)
        assert why is not None
        return why

    assert "untagged" in bad(ddp.Segment(ddp.DdpTagged(3, 1, 0)))
    assert "tagged" in bad(ddp.Segment(ddp.DdpUntagged(0, 0, 1)))
    assert "QN 1" in bad(ddp.Segment(ddp.DdpUntagged(3, 1, 1)))
    assert "RsvdULP" in bad(ddp.Segment(ddp.DdpUntagged(3, 0, 1, rsvdulp=5)))
    assert ddp.check_segment(ddp.Segment(ddp.DdpUntagged(4, 0, 1, rsvdulp=5))) is None
    assert "opcode 0x8" in bad(ddp.Segment(ddp.DdpUntagged(8, 0, 1)))
    assert "single" in bad(ddp.Segment(ddp.DdpUntagged(1, 1, 1, last=False),
                                       read_request=ddp.ReadRequest(1, 1, 1, 1, 1)))
    assert "RDMAP version" in bad(ddp.Segment(ddp.DdpTagged(0, 1, 0, rv=0)))
    assert "reserved" in bad(ddp.Segment(ddp.DdpTagged(0, 1, 0, ddp_rsvd=1)))


_tagged = st.builds(ddp.DdpTagged, st.integers(0, 15), st.integers(0, 2**32 - 1),
                    st.integers(0, 2**64 - 1), st.booleans(), st.integers(0, 15), st.integers(0, 3),
                    st.integers(0, 3), st.integers(0, 3))
_untagged = st.builds(ddp.DdpUntagged, st.sampled_from([0, 2, 3, 4, 5, 6, 8, 15]),
                      st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
                      st.booleans(), st.integers(0, 2**32 - 1), st.integers(0, 15), st.integers(0, 3),
                      st.integers(0, 3), st.integers(0, 3))
_u32 = st.integers(0, 2**32 - 1)
_u64 = st.integers(0, 2**64 - 1)


@st.composite
def _terminates(draw: st.DrawFn) -> ddp.Terminate:
    m, d, r = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    hdr = None
    if d:
        h = draw(st.one_of(_tagged, _untagged))
        hdr = ddp.encode_ddp(h)
    return ddp.Terminate(draw(st.integers(0, 15)), draw(st.integers(0, 15)), draw(st.integers(0, 255)),
                         m, d, r, draw(st.integers(0, 0x1FFF)),
                         draw(st.integers(0, 0xFFFF)) if (m or d) else None, hdr,
                         draw(st.binary(min_size=28, max_size=28)) if r else None,
                         draw(st.binary(max_size=8)))


@st.composite
def _segments(draw: st.DrawFn) -> ddp.Segment:
    kind = draw(st.sampled_from(["tagged", "untagged", "rr", "term"]))
    if kind == "tagged":
        return ddp.Segment(draw(_tagged), draw(st.binary(max_size=64)))
    if kind == "untagged":
        return ddp.Segment(draw(_untagged), draw(st.binary(max_size=64)))
    if kind == "rr":
        rr = ddp.ReadRequest(draw(_u32), draw(_u64), draw(_u32), draw(_u32), draw(_u64))
        h = ddp.DdpUntagged(1, draw(_u32), draw(_u32), draw(_u32), draw(st.booleans()))
        return ddp.Segment(h, draw(st.binary(max_size=16)), read_request=rr)
    h = ddp.DdpUntagged(7, draw(_u32), draw(_u32), draw(_u32), draw(st.booleans()))
    return ddp.Segment(h, b"", terminate=draw(_terminates()))


@FUZZ
@given(_segments())
def test_segment_round_trip(seg: ddp.Segment) -> None:
    raw = ddp.encode_segment_bytes(seg)
    back = ddp.decode_segment(raw)
    assert back == seg
    assert ddp.encode_segment_bytes(back) == raw
    assert isinstance(ddp.describe(back), str)


@FUZZ
@given(st.binary(max_size=120))
def test_fuzz_ddp_decoders(data: bytes) -> None:
    for fn in (ddp.decode_segment, ddp.decode_ddp, ddp.Terminate.decode, ddp.ReadRequest.decode):
        try:
            out = fn(data)
        except DecodeError:
            continue
        if isinstance(out, ddp.Segment):
            assert ddp.encode_segment_bytes(out) == data
            ddp.check_segment(out)
            ddp.describe(out)
        elif isinstance(out, ddp.Terminate):
            assert out.encode() == data
            out.describe()
