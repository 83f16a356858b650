"""IB transport header codec (softrdma.wire.ib) and opcode table (softrdma.wire.opcodes).

Oracles: the byte layouts (IBA 9.2 BTH, 9.3 extension headers) of ../shared/specs/ib-transport.md §2 and §4, scapy's independent BTH field
layout, and tshark's decode of the real rxe captures.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softrdma.errors import DecodeError
from softrdma.wire import ib
from softrdma.wire.opcodes import BTH_SIZE, HDR_SIZE, OPCODES, OPTABLE, Hdr, Kind, Pos, Transport
from softrdma.wire.pcap import read_pcap
from softrdma.wire.roce import parse_frame

CAPTURES = Path("/work/shared/captures")

U8 = st.integers(0, 0xFF)
U24 = st.integers(0, 0xFFFFFF)
U32 = st.integers(0, 0xFFFFFFFF)
U64 = st.integers(0, 0xFFFFFFFFFFFFFFFF)

# Every field of IBPacket that a header carries, with its width.
FIELDS = {
    "se": st.booleans(), "mig": st.booleans(), "tver": st.integers(0, 15),
    "pkey": st.integers(0, 0xFFFF), "fecn": st.booleans(), "becn": st.booleans(),
    "resv6": st.integers(0, 63), "dqpn": U24, "ackreq": st.booleans(),
    "resv7": st.integers(0, 127), "psn": U24,
}
HDR_FIELDS: dict[Hdr, dict[str, st.SearchStrategy[int]]] = {
    Hdr.RDETH: {"rdeth": U32},
    Hdr.DETH: {"qkey": U32, "deth_resv": U8, "src_qp": U24},
    Hdr.XRCETH: {"xrceth": U32},
    Hdr.FETH: {"feth": U32},
    Hdr.RETH: {"va": U64, "rkey": U32, "dma_len": U32},
    Hdr.ATMETH: {"va": U64, "rkey": U32, "swap_add": U64, "compare": U64},
    Hdr.AETH: {"syndrome": U8, "msn": U24},
    Hdr.ATMACK: {"orig": U64},
    Hdr.IMMDT: {"imm": U32},
    Hdr.IETH: {"inv_rkey": U32},
}
ALL_FIELDS = ("se", "mig", "pad", "tver", "pkey", "fecn", "becn", "resv6", "dqpn", "ackreq",
              "resv7", "psn", "va", "rkey", "dma_len", "swap_add", "compare", "syndrome", "msn",
              "orig", "qkey", "deth_resv", "src_qp", "imm", "inv_rkey", "rdeth", "xrceth", "feth")


@st.composite
def packets(draw: st.DrawFn) -> ib.IBPacket:
    opcode = draw(st.sampled_from(sorted(OPCODES)))
    info = OPCODES[opcode]
    payload = draw(st.binary(max_size=64)) if info.payload else b""
    p = ib.IBPacket(opcode, payload=payload)
    for name, strat in FIELDS.items():
        setattr(p, name, draw(strat))
    for h, fields in HDR_FIELDS.items():
        if h in info.hdrs:
            for name, strat in fields.items():
                setattr(p, name, draw(strat))
    return p


def fields_of(p: ib.IBPacket) -> dict[str, object]:
    d: dict[str, object] = {k: getattr(p, k) for k in ALL_FIELDS}
    d["opcode"] = p.opcode
    d["payload"] = bytes(p.payload)
    return d


@settings(max_examples=600, deadline=None)
@given(packets())
@pytest.mark.iba("9.2", "9.3")
def test_roundtrip_every_opcode(p: ib.IBPacket) -> None:
    wire = ib.encode(p)
    assert len(wire) == p.info.hdr_len + len(p.payload) + p.pad
    assert len(wire) % 4 == 0
    q = ib.decode(memoryview(wire))
    assert fields_of(q) == fields_of(p)
    assert ib.encode(q) == wire


def test_every_opcode_is_exercised_by_the_strategy() -> None:
    # The round-trip above samples from OPCODES; make sure each one also decodes by hand.
    for op, info in OPCODES.items():
        p = ib.IBPacket(op, psn=0x123456, dqpn=0xABCDEF, payload=b"xyz" if info.payload else b"")
        q = ib.decode(memoryview(ib.encode(p)))
        assert q.opcode == op and q.info is info
        assert q.psn == 0x123456 and q.dqpn == 0xABCDEF
        assert bytes(q.payload) == (b"xyz" if info.payload else b"")
        assert q.pad == (1 if info.payload else 0)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=80))
def test_decode_random_bytes_is_exact_or_decode_error(buf: bytes) -> None:
    try:
        p = ib.decode(memoryview(buf))
    except DecodeError:
        return
    # Pad bytes are re-emitted as zeros (IBA 9.2.3), everything else is kept.
    n = len(buf) - p.pad
    assert ib.encode(p) == buf[:n] + bytes(p.pad)


@pytest.mark.iba("9.2")
def test_bth_layout_from_the_spec() -> None:
    # IBA 9.2; ../shared/specs/ib-transport.md §2: CNP, P_Key 0xFFFF, BECN=1, DestQP 0x118, PSN 0 (+ 16 reserved).
    raw = bytes.fromhex("8100ffff4000011800000000") + bytes(16)
    p = ib.decode(memoryview(raw))
    assert p.info.name == "CNP" and p.info.kind is Kind.CNP
    assert (p.pkey, p.becn, p.fecn, p.dqpn, p.psn, p.ackreq) == (0xFFFF, True, False, 0x118, 0, False)
    assert len(p.payload) == 16


@pytest.mark.iba("9.2")
def test_bth_bits_each_field() -> None:
    p = ib.IBPacket(0x04, psn=0xFEDCBA, dqpn=0x123456, pkey=0x8001, payload=b"a")
    p.se, p.mig, p.tver, p.fecn, p.resv6, p.ackreq, p.resv7 = True, True, 0x5, True, 0x21, True, 0x11
    raw = ib.encode(p)
    assert raw[:12] == bytes([0x04, 0x80 | 0x40 | (3 << 4) | 5, 0x80, 0x01,
                              0x80 | 0x21, 0x12, 0x34, 0x56, 0x80 | 0x11, 0xFE, 0xDC, 0xBA])
    assert raw[12:] == b"a\0\0\0"


@pytest.mark.iba("9.3.2", "9.3.3", "9.3.4", "9.3.5", "9.3.6", "9.3.7")
def test_extension_header_layouts() -> None:
    # RDMA_WRITE_ONLY_WITH_IMMEDIATE: BTH, RETH (VA, R_Key, DMALen), ImmDt (IBA 9.3.3).
    p = ib.IBPacket(0x0B, payload=b"12345678")
    p.va, p.rkey, p.dma_len, p.imm = 0x0102030405060708, 0x0A0B0C0D, 8, 0xCAFEBABE
    raw = ib.encode(p)
    assert raw[12:28] == bytes.fromhex("0102030405060708" "0a0b0c0d" "00000008")
    assert raw[28:32] == bytes.fromhex("cafebabe") and raw[32:] == b"12345678"
    # COMPARE_SWAP: AtomicETH is packed (28 bytes, IBA 9.3.4).
    a = ib.IBPacket(0x13)
    a.va, a.rkey, a.swap_add, a.compare = 8, 0x11223344, 0xAAAAAAAAAAAAAAAA, 0x5555555555555555
    assert ib.encode(a)[12:] == bytes.fromhex("0000000000000008" "11223344"
                                              "aaaaaaaaaaaaaaaa" "5555555555555555")
    # ATOMIC_ACKNOWLEDGE: AETH then AtomicAckETH.
    k = ib.IBPacket(0x12)
    k.syndrome, k.msn, k.orig = 0x1F, 0x000102, 0x1122334455667788
    assert ib.encode(k)[12:] == bytes.fromhex("1f000102" "1122334455667788")
    # UD SEND_ONLY_WITH_IMMEDIATE: DETH (Q_Key, resv, SrcQP) then ImmDt.
    u = ib.IBPacket(0x65, payload=b"")
    u.qkey, u.src_qp, u.imm = 0x80010000, 0x000001, 7
    assert ib.encode(u)[12:] == bytes.fromhex("80010000" "00000001" "00000007")


@pytest.mark.iba("9.2.1")
def test_opcode_table_shape() -> None:
    assert OPTABLE[0x15] is None and OPTABLE[0xFF] is None and OPTABLE[0x66] is None
    assert set(op for op in OPCODES if op & 0xE0 == Transport.UD) == {0x64, 0x65}
    assert set(op for op in OPCODES if op & 0xE0 == Transport.UC) == set(range(0x20, 0x2C))
    for op, info in OPCODES.items():
        assert info.hdr_len == BTH_SIZE + sum(HDR_SIZE[h] for h in HDR_SIZE if h in info.hdrs)
        assert info.transport == op & 0xE0
    assert OPCODES[0x0D].hdrs == Hdr.AETH and OPCODES[0x0E].hdrs == Hdr.NONE
    assert OPCODES[0x0C].payload is False and OPCODES[0x0C].pos == Pos.ONLY
    assert OPCODES[0x11].is_response and not OPCODES[0x11].is_request
    assert OPCODES[0x64].hdrs == Hdr.DETH


@pytest.mark.parametrize("raw, why", [
    (b"", "too short"),
    (bytes(11), "too short"),
    (bytes([0x15]) + bytes(11), "opcode"),
    (bytes([0xFF]) + bytes(11), "opcode"),
    (bytes([0x0C]) + bytes(11) + bytes(15), "headers need"),          # RETH cut short
    (bytes([0x04, 0x30]) + bytes(10) + b"ab", "pad count"),          # pad 3 > 2 bytes
    (bytes([0x11]) + bytes(11) + bytes(4) + b"xxxx", "no payload"),  # ACK with data
])
def test_decode_errors(raw: bytes, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        ib.decode(memoryview(raw))


def test_ibpacket_rejects_unknown_opcode() -> None:
    with pytest.raises(DecodeError):
        ib.IBPacket(0x15)


@pytest.mark.iba("9.2.3", "9.7.5.2.1", "9.7.5.2.8", "9.7.7.2.3")
def test_helpers() -> None:
    assert ib.pad_bytes(0) == b"" and ib.pad_bytes(5) == b"\0\0\0" and ib.pad_bytes(6) == b"\0\0"
    assert ib.credit_code(0) == 0 and ib.credit_code(5) == 4 and ib.credit_code(6) == 5
    assert ib.credit_code(10**6) == 30
    assert ib.ack_timeout_s(0) == 0.0
    assert ib.ack_timeout_s(14) == pytest.approx(4.096e-6 * 16384)
    assert ib.RNR_TIMER_S[0] == pytest.approx(0.65536) and ib.RNR_TIMER_S[14] == pytest.approx(0.00128)
    ack = ib.IBPacket(0x11, psn=5)
    ack.syndrome, ack.msn = ib.NAK_PSN_SEQ_ERR, 3
    assert "NAK PSN sequence error" in ib.describe(ack)
    ack.syndrome = ib.AETH_RNR_NAK | 14
    assert "RNR-NAK timer=14" in ib.describe(ack)
    ack.syndrome = ib.AETH_CREDIT_INVALID
    assert "ACK MSN=3" in ib.describe(ack)


def test_scapy_bth_layout_agrees() -> None:
    from scapy.contrib.roce import BTH

    p = ib.IBPacket(0x2A, psn=0x0A0B0C, dqpn=0x0D0E0F, pkey=0x7FFF, payload=b"hello")
    p.se, p.becn, p.ackreq, p.va, p.rkey, p.dma_len = True, True, True, 1, 2, 5
    raw = ib.encode(p)
    s = BTH(raw[:12] + b"\0\0\0\0")  # scapy keeps its ICRC field after the BTH fields
    assert (s.opcode, s.solicited, s.padcount, s.pkey, s.becn, s.dqpn, s.ackreq, s.psn) == (
        0x2A, 1, 3, 0x7FFF, 1, 0x0D0E0F, 1, 0x0A0B0C)


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
@pytest.mark.parametrize("name", ["roce_read_bw", "roce_write_bw_rdmacm", "roce_ud_pingpong",
                                  "roce_ipv6_rc_pingpong"])
def test_decode_agrees_with_tshark(name: str) -> None:
    path = CAPTURES / f"{name}.pcap"
    out = subprocess.run(
        ["tshark", "-r", str(path), "-Y", "infiniband.bth", "-T", "fields", "-E", "separator=,",
         "-e", "frame.number", "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp",
         "-e", "infiniband.bth.psn", "-e", "infiniband.bth.a", "-e", "infiniband.bth.padcnt",
         "-e", "infiniband.reth.va", "-e", "infiniband.reth.dmalen", "-e", "infiniband.aeth.msn",
         "-e", "infiniband.deth.srcqp"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    theirs: dict[int, list[int | None]] = {}
    for line in out.splitlines():
        f = line.split(",")
        theirs[int(f[0])] = [int(x, 0) if x else None for x in f[1:]]
    ours: dict[int, list[int | None]] = {}
    for r in read_pcap(path):
        fr = parse_frame(r.data, r.linktype)
        if fr is None:
            continue
        p = fr.packet
        h = p.info.hdrs
        ours[r.index] = [
            p.opcode, p.dqpn, p.psn, int(p.ackreq), p.pad,
            p.va if h & Hdr.RETH else None,
            p.dma_len if h & Hdr.RETH else None,
            p.msn if h & Hdr.AETH else None,
            p.src_qp if h & Hdr.DETH else None,
        ]
    assert ours and ours == theirs


@settings(max_examples=200, deadline=None)
@given(opcode=st.sampled_from(sorted(OPCODES)), pkey=st.integers(0, 0xFFFF), dqpn=U32,
       psn=st.integers(0, 0x2FFFFFF), se=st.booleans(), pad=st.integers(0, 3),
       ackreq=st.booleans(), becn=st.booleans())
@pytest.mark.iba("9.2")
def test_bth_builder_packs_what_decode_reads(opcode: int, pkey: int, dqpn: int, psn: int,
                                             se: bool, pad: int, ackreq: bool,
                                             becn: bool) -> None:
    """The engine's BTH builder (IBA 9.2): every field where decode finds it, the QPN and
    PSN taken modulo 2^24, TVer, MigReq, FECN and the reserved bits 0."""
    info = OPTABLE[opcode]
    assert info is not None
    if not info.payload:  # no payload, no pad
        pad = 0
    body = ib.bth(opcode, pkey, dqpn, psn, se, pad, ackreq, becn) + bytes(info.hdr_len - BTH_SIZE)
    p = ib.decode(memoryview(body + bytes(pad)))
    assert (p.opcode, p.pkey, p.dqpn, p.psn) == (opcode, pkey, dqpn & 0xFFFFFF, psn & 0xFFFFFF)
    assert (p.se, p.pad, p.ackreq, p.becn) == (se, pad, ackreq, becn)
    assert (p.tver, p.mig, p.fecn, p.resv6, p.resv7) == (0, False, False, 0, 0)


@pytest.mark.iba("9.7.1")
def test_bth_run_is_the_builder_for_each_packet() -> None:
    """A run of MIDDLE headers (IBA 9.7.1): the BTH of each packet in turn, with
    consecutive PSNs that wrap at 2^24 and AckReq where asked."""
    ackreq = [False, True, False, False, True]
    run = ib.bth_run(0x07, 0x8001, 0x123456, 0xFFFFFE, ackreq)
    assert run == [ib.bth(0x07, 0x8001, 0x123456, (0xFFFFFE + i) & 0xFFFFFF, ackreq=a)
                   for i, a in enumerate(ackreq)]
    assert [ib.decode(memoryview(h)).psn for h in run] == [0xFFFFFE, 0xFFFFFF, 0, 1, 2]


@pytest.mark.iba("9.3.2", "9.3.3", "9.3.4", "9.3.5", "9.3.6", "9.3.7", "9.3.8")
def test_extension_header_builders() -> None:
    """RETH, AtomicETH, AETH, AtomicAckETH, DETH, ImmDt/IETH (IBA 9.3.2-9.3.8): the
    layouts of the codec's decode, fields masked to their widths."""
    hdr = ib.bth(0x13, 0xFFFF, 5, 9, ackreq=True) + ib.atmeth(0x1000, 7, -1, 1 << 64 | 3)
    p = ib.decode(memoryview(hdr))
    assert (p.va, p.rkey, p.swap_add, p.compare) == (0x1000, 7, (1 << 64) - 1, 3)
    p = ib.decode(memoryview(ib.bth(0x12, 0xFFFF, 5, 9) + ib.aeth(0x1F, 0x1234567)
                             + ib.atmack(42)))
    assert (p.syndrome, p.msn, p.orig) == (0x1F, 0x234567, 42)
    p = ib.decode(memoryview(ib.bth(0x0B, 0xFFFF, 5, 9) + ib.reth(0xAB, 0xCD, 0xEF)
                             + ib.immdt(-1)))
    assert (p.va, p.rkey, p.dma_len, p.imm) == (0xAB, 0xCD, 0xEF, 0xFFFFFFFF)
    p = ib.decode(memoryview(ib.bth(0x64, 0xFFFF, 1, 0) + ib.deth(0x80010000, 0x1000001)))
    assert (p.qkey, p.src_qp, p.deth_resv) == (0x80010000, 1, 0)


@pytest.mark.iba("9.2")
def test_transport_opcode_sets_follow_the_table() -> None:
    """UD_OPCODES and CONNECTED_OPCODES are the table's UD and RC/UC opcodes (IBA 9.2,
    Table 35), so that drivers never test an opcode's bits themselves."""
    from softrdma.wire.opcodes import CONNECTED_OPCODES, UD_OPCODES

    for code, info in OPCODES.items():
        assert (code in UD_OPCODES) == (info.transport == Transport.UD), hex(code)
        assert (code in CONNECTED_OPCODES) == (
            info.transport in (Transport.RC, Transport.UC)), hex(code)


def test_drivers_name_no_opcode_numbers() -> None:
    """Issue 23: the drivers ask wire.opcodes which transport a packet is (no ``op & 0xE0``
    masks nor opcode ranges of their own)."""
    import re

    drivers = Path(__file__).resolve().parents[2] / "src" / "softrdma" / "drivers"
    leak = re.compile(r"\[0\]\s*(?:&\s*0x[eE]0|[<>]=?\s*0x[0-9a-fA-F]{2}\b)")
    found = [f"{p.name}:{n}" for p in sorted(drivers.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if leak.search(line)]
    assert not found, found
