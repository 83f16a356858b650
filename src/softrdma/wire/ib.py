"""IB transport headers: BTH and the extension headers (IBA Vol 1 §9.2-9.3; rxe_hdr.h).

One precompiled ``struct.Struct`` per header; :func:`decode` and :func:`encode` are exact
inverses, driven by the opcode table in :mod:`softrdma.wire.opcodes`. Reserved bits are
kept so that any packet re-encodes to the bytes it was decoded from.

Header layouts (all big-endian):

* BTH (12): OpCode | SE M PadCnt(2) TVer(4) | P_Key(16) | FECN BECN Resv6 | DestQP(24) |
  A Resv7 | PSN(24)  (IBA 9.2)
* RETH (16): VA(64) R_Key(32) DMALen(32)  (IBA 9.3.3)
* AtomicETH (28): VA(64) R_Key(32) SwapOrAdd(64) Compare(64)  (IBA 9.3.4)
* AETH (4): Syndrome(8) MSN(24)  (IBA 9.3.5)
* AtomicAckETH (8): OrigRemData(64)  (IBA 9.3.6)
* DETH (8): Q_Key(32) Resv(8) SrcQP(24)  (IBA 9.3.2)
* RDETH (4): Resv(8) EECnxt(24); XRCETH (4): Resv(8) XRCSRQ(24); FETH (4)
* ImmDt (4), IETH (4): R_Key to invalidate  (IBA 9.3.7-9.3.8)
"""

from __future__ import annotations

import struct

from ..errors import DecodeError
from .fields import U32 as U32
from .fields import U64 as U64
from .opcodes import BTH_SIZE, OPTABLE, Hdr, OpInfo

BTH = struct.Struct("!BBHII")
RETH = struct.Struct("!QII")
ATMETH = struct.Struct("!QIQQ")
DETH = struct.Struct("!II")

# Extension-header bits as plain ints: IntFlag arithmetic is slow on the hot path.
_RDETH = int(Hdr.RDETH)
_DETH = int(Hdr.DETH)
_XRCETH = int(Hdr.XRCETH)
_FETH = int(Hdr.FETH)
_RETH = int(Hdr.RETH)
_ATMETH = int(Hdr.ATMETH)
_AETH = int(Hdr.AETH)
_ATMACK = int(Hdr.ATMACK)
_IMMDT = int(Hdr.IMMDT)
_IETH = int(Hdr.IETH)

BTH_SE = 0x80
BTH_MIG = 0x40
BTH_FECN = 0x80000000  # BTH word 1 (IBA 9.2): FECN, BECN
BTH_BECN = 0x40000000
BTH_ACKREQ = 0x80000000  # BTH word 2 (IBA 9.2): the AckReq (A) bit
_ZERO_PAD = (b"", b"\0", b"\0\0", b"\0\0\0")


# ---- packing one header: the transport engine's builders (IBA 9.2-9.3) ----------------------
def bth(opcode: int, pkey: int, dqpn: int, psn: int, se: bool = False, pad: int = 0,
        ackreq: bool = False, becn: bool = False) -> bytes:
    """A BTH (IBA 9.2): TVer 0, MigReq 0, FECN 0; ``pad`` is the PadCnt of the payload
    that follows (:func:`pad_bytes`)."""
    return BTH.pack(opcode, se << 7 | (pad & 3) << 4, pkey, becn << 30 | (dqpn & 0xFFFFFF),
                    ackreq << 31 | (psn & 0xFFFFFF))


def bth_run(opcode: int, pkey: int, dqpn: int, psn: int, ackreq: list[bool]) -> list[bytes]:
    """The BTHs of a run of ``len(ackreq)`` packets with consecutive PSNs from ``psn``
    (the MIDDLEs of a message, IBA 9.7.1): as :func:`bth` without SE or pad, packet
    ``i`` with the AckReq bit when ``ackreq[i]``."""
    pack = BTH.pack
    w1 = dqpn & 0xFFFFFF
    return [pack(opcode, 0, pkey, w1, (BTH_ACKREQ if a else 0) | ((psn + i) & 0xFFFFFF))
            for i, a in enumerate(ackreq)]


def reth(va: int, rkey: int, dma_len: int) -> bytes:
    """An RETH (IBA 9.3.3): virtual address, R_Key, DMA length."""
    return RETH.pack(va, rkey, dma_len)


def atmeth(va: int, rkey: int, swap_add: int, compare: int) -> bytes:
    """An AtomicETH (IBA 9.3.4): the two data words are taken modulo 2^64."""
    return ATMETH.pack(va, rkey, swap_add & 0xFFFFFFFFFFFFFFFF, compare & 0xFFFFFFFFFFFFFFFF)


def aeth(syndrome: int, msn: int) -> bytes:
    """An AETH (IBA 9.3.5): the syndrome (Table 44) and the MSN."""
    return U32.pack((syndrome & 0xFF) << 24 | (msn & 0xFFFFFF))


def atmack(orig: int) -> bytes:
    """An AtomicAckETH (IBA 9.3.6): the original remote data."""
    return U64.pack(orig & 0xFFFFFFFFFFFFFFFF)


def deth(qkey: int, src_qp: int) -> bytes:
    """A DETH (IBA 9.3.2): the Q_Key and the source QP."""
    return DETH.pack(qkey & 0xFFFFFFFF, src_qp & 0xFFFFFF)


def immdt(value: int) -> bytes:
    """An ImmDt (IBA 9.3.7) or an IETH (IBA 9.3.8: the R_Key to invalidate): 4 bytes."""
    return U32.pack(value & 0xFFFFFFFF)

# AETH syndrome classes (IBA 9.7.5.2.1, Table 44).
AETH_ACK = 0x00
AETH_RNR_NAK = 0x20
AETH_NAK = 0x60
AETH_TYPE_MASK = 0x60
AETH_CREDIT_INVALID = 0x1F  # "no end-to-end credits"; rxe always sends it

NAK_PSN_SEQ_ERR = 0x60
NAK_INVALID_REQUEST = 0x61
NAK_REMOTE_ACCESS = 0x62
NAK_REMOTE_OP_ERR = 0x63
NAK_INVALID_RD_REQUEST = 0x64

NAK_NAMES = {
    NAK_PSN_SEQ_ERR: "PSN sequence error",
    NAK_INVALID_REQUEST: "invalid request",
    NAK_REMOTE_ACCESS: "remote access error",
    NAK_REMOTE_OP_ERR: "remote operational error",
    NAK_INVALID_RD_REQUEST: "invalid RD request",
}

# RNR NAK timer codes -> seconds (IBA 9.7.5.2.8, Table 45; linux enum ib_rnr_timeout).
RNR_TIMER_MS = (
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12,
    0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92,
    2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72,
    40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
)
RNR_TIMER_S = tuple(ms / 1000.0 for ms in RNR_TIMER_MS)

# AETH credit count codes (IBA 9.7.7.2.3, Table 46).
CREDIT_TABLE = (
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
    1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
)


def credit_code(credits: int) -> int:
    """The largest AETH credit code whose credit count is <= ``credits``."""
    code = 0
    for i, c in enumerate(CREDIT_TABLE):
        if c <= credits:
            code = i
    return code


def ack_timeout_s(timeout: int) -> float:
    """Local ACK timeout in seconds: 4.096 us * 2^timeout; 0 means infinite (IBA 9.7.6.1.3)."""
    return 0.0 if timeout == 0 else 4.096e-6 * (1 << timeout)


class IBPacket:
    """A decoded transport packet (BTH through payload; pad and ICRC excluded).

    Fields of absent headers keep their defaults. ``payload`` is a memoryview into the
    buffer that was decoded (no copy).
    """

    __slots__ = (
        "opcode", "info", "se", "mig", "pad", "tver", "pkey", "fecn", "becn", "resv6", "dqpn",
        "ackreq", "resv7", "psn",
        "va", "rkey", "dma_len", "swap_add", "compare", "syndrome", "msn", "orig",
        "qkey", "deth_resv", "src_qp", "imm", "inv_rkey", "rdeth", "xrceth", "feth", "payload",
    )

    def __init__(self, opcode: int = 0, *, psn: int = 0, dqpn: int = 0, pkey: int = 0xFFFF,
                 payload: memoryview | bytes = b"") -> None:
        info = OPTABLE[opcode]
        if info is None:
            raise DecodeError(f"unknown opcode {opcode:#04x}")
        self.opcode = opcode
        self.info: OpInfo = info
        self.se = False
        self.mig = False
        self.pad = (-len(payload)) & 3
        self.tver = 0
        self.pkey = pkey
        self.fecn = False
        self.becn = False
        self.resv6 = 0
        self.dqpn = dqpn
        self.ackreq = False
        self.resv7 = 0
        self.psn = psn
        self.va = 0
        self.rkey = 0
        self.dma_len = 0
        self.swap_add = 0
        self.compare = 0
        self.syndrome = 0
        self.msn = 0
        self.orig = 0
        self.qkey = 0
        self.deth_resv = 0
        self.src_qp = 0
        self.imm = 0
        self.inv_rkey = 0
        self.rdeth = 0
        self.xrceth = 0
        self.feth = 0
        self.payload = memoryview(payload)

    def __repr__(self) -> str:
        return (f"IBPacket({self.info.name}, dqpn={self.dqpn:#x}, psn={self.psn:#x}, "
                f"len={len(self.payload)})")


def decode(buf: memoryview) -> IBPacket:
    """Decode BTH .. payload + pad (the ICRC already removed). Raises DecodeError."""
    n = len(buf)
    if n < BTH_SIZE:
        raise DecodeError(f"packet too short for a BTH: {n} bytes")
    opcode, b1, pkey, w1, w2 = BTH.unpack_from(buf, 0)
    info = OPTABLE[opcode]
    if info is None:
        raise DecodeError(f"unknown or reserved opcode {opcode:#04x}")
    hlen = info.hdr_len
    if n < hlen:
        raise DecodeError(f"{info.name}: {n} bytes, headers need {hlen}")
    p = IBPacket.__new__(IBPacket)
    p.opcode = opcode
    p.info = info
    p.se = bool(b1 & 0x80)
    p.mig = bool(b1 & 0x40)
    pad = (b1 >> 4) & 3
    p.pad = pad
    p.tver = b1 & 0x0F
    p.pkey = pkey
    p.fecn = bool(w1 & 0x80000000)
    p.becn = bool(w1 & 0x40000000)
    p.resv6 = (w1 >> 24) & 0x3F
    p.dqpn = w1 & 0xFFFFFF
    p.ackreq = bool(w2 & 0x80000000)
    p.resv7 = (w2 >> 24) & 0x7F
    p.psn = w2 & 0xFFFFFF
    p.va = p.rkey = p.dma_len = p.swap_add = p.compare = 0
    p.syndrome = p.msn = p.orig = p.qkey = p.deth_resv = p.src_qp = 0
    p.imm = p.inv_rkey = p.rdeth = p.xrceth = p.feth = 0
    off = BTH_SIZE
    hdrs = info.hdrs_int
    if hdrs:
        if hdrs & _RDETH:
            p.rdeth = U32.unpack_from(buf, off)[0]
            off += 4
        if hdrs & _DETH:
            p.qkey, w = DETH.unpack_from(buf, off)
            p.deth_resv = w >> 24
            p.src_qp = w & 0xFFFFFF
            off += 8
        if hdrs & _XRCETH:
            p.xrceth = U32.unpack_from(buf, off)[0]
            off += 4
        if hdrs & _FETH:
            p.feth = U32.unpack_from(buf, off)[0]
            off += 4
        if hdrs & _RETH:
            p.va, p.rkey, p.dma_len = RETH.unpack_from(buf, off)
            off += 16
        elif hdrs & _ATMETH:
            p.va, p.rkey, p.swap_add, p.compare = ATMETH.unpack_from(buf, off)
            off += 28
        if hdrs & _AETH:
            w = U32.unpack_from(buf, off)[0]
            p.syndrome = w >> 24
            p.msn = w & 0xFFFFFF
            off += 4
        if hdrs & _ATMACK:
            p.orig = U64.unpack_from(buf, off)[0]
            off += 8
        if hdrs & _IMMDT:
            p.imm = U32.unpack_from(buf, off)[0]
            off += 4
        elif hdrs & _IETH:
            p.inv_rkey = U32.unpack_from(buf, off)[0]
            off += 4
    plen = n - off - pad
    if plen < 0:
        raise DecodeError(f"{info.name}: pad count {pad} exceeds the {n - off} bytes after the headers")
    if not info.payload and plen != 0:
        raise DecodeError(f"{info.name}: carries no payload but has {plen} bytes after the headers")
    p.payload = buf[off:off + plen]
    return p


def encode_headers(p: IBPacket) -> bytearray:
    """BTH and extension headers of ``p`` (no payload, pad or ICRC)."""
    info = p.info
    out = bytearray(info.hdr_len)
    b1 = (0x80 if p.se else 0) | (0x40 if p.mig else 0) | ((p.pad & 3) << 4) | (p.tver & 0x0F)
    w1 = (0x80000000 if p.fecn else 0) | (0x40000000 if p.becn else 0) | ((p.resv6 & 0x3F) << 24) | (p.dqpn & 0xFFFFFF)
    w2 = (0x80000000 if p.ackreq else 0) | ((p.resv7 & 0x7F) << 24) | (p.psn & 0xFFFFFF)
    BTH.pack_into(out, 0, p.opcode, b1, p.pkey, w1, w2)
    off = BTH_SIZE
    hdrs = info.hdrs
    if hdrs & Hdr.RDETH:
        U32.pack_into(out, off, p.rdeth)
        off += 4
    if hdrs & Hdr.DETH:
        DETH.pack_into(out, off, p.qkey, ((p.deth_resv & 0xFF) << 24) | (p.src_qp & 0xFFFFFF))
        off += 8
    if hdrs & Hdr.XRCETH:
        U32.pack_into(out, off, p.xrceth)
        off += 4
    if hdrs & Hdr.FETH:
        U32.pack_into(out, off, p.feth)
        off += 4
    if hdrs & Hdr.RETH:
        RETH.pack_into(out, off, p.va, p.rkey, p.dma_len)
        off += 16
    elif hdrs & Hdr.ATMETH:
        ATMETH.pack_into(out, off, p.va, p.rkey, p.swap_add, p.compare)
        off += 28
    if hdrs & Hdr.AETH:
        U32.pack_into(out, off, ((p.syndrome & 0xFF) << 24) | (p.msn & 0xFFFFFF))
        off += 4
    if hdrs & Hdr.ATMACK:
        U64.pack_into(out, off, p.orig)
        off += 8
    if hdrs & Hdr.IMMDT:
        U32.pack_into(out, off, p.imm)
        off += 4
    elif hdrs & Hdr.IETH:
        U32.pack_into(out, off, p.inv_rkey)
        off += 4
    return out



def encode(p: IBPacket) -> bytes:
    """BTH .. payload + pad (zero bytes), without the ICRC. Inverse of :func:`decode`."""
    return bytes(encode_headers(p)) + bytes(p.payload) + _ZERO_PAD[p.pad & 3]


def pad_bytes(n: int) -> bytes:
    """The zero pad that makes a payload of ``n`` bytes a multiple of 4 (IBA 9.2.3)."""
    return _ZERO_PAD[(-n) & 3]


def describe(p: IBPacket) -> str:
    """One readable line, in the spirit of tshark's summary."""
    s = f"{p.info.name} QP={p.dqpn:#08x} PSN={p.psn:#08x}"
    if p.info.hdrs & Hdr.AETH:
        t = p.syndrome & AETH_TYPE_MASK
        if t == AETH_ACK:
            s += f" ACK MSN={p.msn}"
        elif t == AETH_RNR_NAK:
            s += f" RNR-NAK timer={p.syndrome & 0x1F}"
        else:
            s += f" NAK {NAK_NAMES.get(p.syndrome, hex(p.syndrome))}"
    if len(p.payload):
        s += f" len={len(p.payload)}"
    return s
