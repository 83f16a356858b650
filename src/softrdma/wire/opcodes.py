"""The IB transport opcode table, as data (IBA Vol 1 §9.2, Table 35; rxe ``rxe_opcode.c``).

For each opcode: its transport service, the extension headers that follow the BTH (in
wire order), whether it carries a payload, its position in a message (FIRST, MIDDLE,
LAST, ONLY) and what kind of operation it is. The codec in :mod:`softrdma.wire.ib` and
the transport engine are both driven by this table.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class Transport(IntEnum):
    """Transport service: the top three bits of the opcode (IBA 9.2, Table 35)."""

    RC = 0x00
    UC = 0x20
    RD = 0x40
    UD = 0x60
    CNP = 0x80
    XRC = 0xA0


class Hdr(IntFlag):
    """Extension headers that may follow the BTH (IBA 9.3)."""

    NONE = 0
    RDETH = 1
    DETH = 2
    RETH = 4
    ATMETH = 8
    AETH = 16
    ATMACK = 32
    IMMDT = 64
    IETH = 128
    XRCETH = 256
    FETH = 512


class Pos(IntFlag):
    """Position of a packet in its message."""

    FIRST = 1
    MIDDLE = 2
    LAST = 4
    ONLY = FIRST | LAST


class Kind(IntEnum):
    """What a packet is part of."""

    SEND = 1
    WRITE = 2
    READ_REQ = 3
    READ_RESP = 4
    ACK = 5
    ATOMIC_ACK = 6
    CMP_SWAP = 7
    FETCH_ADD = 8
    CNP = 9
    FLUSH = 10
    ATOMIC_WRITE = 11


# Size in bytes of each extension header (IBA 9.3; rxe_hdr.h).
HDR_SIZE: dict[Hdr, int] = {
    Hdr.RDETH: 4,
    Hdr.DETH: 8,
    Hdr.RETH: 16,
    Hdr.ATMETH: 28,
    Hdr.AETH: 4,
    Hdr.ATMACK: 8,
    Hdr.IMMDT: 4,
    Hdr.IETH: 4,
    Hdr.XRCETH: 4,
    Hdr.FETH: 4,
}

# Wire order of extension headers after the BTH (rxe_opcode.c offsets): RDETH, DETH,
# XRCETH, FETH, RETH | AtomicETH, AETH, AtomicAckETH, ImmDt | IETH.
HDR_ORDER: tuple[Hdr, ...] = (
    Hdr.RDETH, Hdr.DETH, Hdr.XRCETH, Hdr.FETH, Hdr.RETH, Hdr.ATMETH, Hdr.AETH, Hdr.ATMACK,
    Hdr.IMMDT, Hdr.IETH,
)

BTH_SIZE = 12
ICRC_SIZE = 4


class OpInfo:
    """One row of the opcode table."""

    __slots__ = ("opcode", "name", "transport", "hdrs", "hdrs_int", "payload", "pos", "pos_int",
                 "kind", "hdr_len", "is_request", "is_response", "imm", "inv")

    def __init__(self, opcode: int, name: str, hdrs: Hdr, payload: bool, pos: Pos,
                 kind: Kind) -> None:
        self.opcode = opcode
        self.name = name
        self.transport = Transport(opcode & 0xE0)
        self.hdrs = hdrs
        self.hdrs_int = int(hdrs)  # plain int for the decoder's hot path
        self.payload = payload
        self.pos = pos
        self.pos_int = int(pos)
        self.kind = kind
        self.hdr_len = BTH_SIZE + sum(HDR_SIZE[h] for h in HDR_ORDER if h in hdrs)
        self.is_response = kind in (Kind.READ_RESP, Kind.ACK, Kind.ATOMIC_ACK)
        self.is_request = not self.is_response and kind != Kind.CNP
        self.imm = Hdr.IMMDT in hdrs
        self.inv = Hdr.IETH in hdrs

    def __repr__(self) -> str:
        return f"OpInfo({self.opcode:#04x} {self.name})"


# (operation code in bits 4..0, name, headers, payload, position, kind) — IBA Table 35.
_OPS: tuple[tuple[int, str, Hdr, bool, Pos, Kind], ...] = (
    (0x00, "SEND_FIRST", Hdr.NONE, True, Pos.FIRST, Kind.SEND),
    (0x01, "SEND_MIDDLE", Hdr.NONE, True, Pos.MIDDLE, Kind.SEND),
    (0x02, "SEND_LAST", Hdr.NONE, True, Pos.LAST, Kind.SEND),
    (0x03, "SEND_LAST_WITH_IMMEDIATE", Hdr.IMMDT, True, Pos.LAST, Kind.SEND),
    (0x04, "SEND_ONLY", Hdr.NONE, True, Pos.ONLY, Kind.SEND),
    (0x05, "SEND_ONLY_WITH_IMMEDIATE", Hdr.IMMDT, True, Pos.ONLY, Kind.SEND),
    (0x06, "RDMA_WRITE_FIRST", Hdr.RETH, True, Pos.FIRST, Kind.WRITE),
    (0x07, "RDMA_WRITE_MIDDLE", Hdr.NONE, True, Pos.MIDDLE, Kind.WRITE),
    (0x08, "RDMA_WRITE_LAST", Hdr.NONE, True, Pos.LAST, Kind.WRITE),
    (0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", Hdr.IMMDT, True, Pos.LAST, Kind.WRITE),
    (0x0A, "RDMA_WRITE_ONLY", Hdr.RETH, True, Pos.ONLY, Kind.WRITE),
    (0x0B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", Hdr.RETH | Hdr.IMMDT, True, Pos.ONLY, Kind.WRITE),
    (0x0C, "RDMA_READ_REQUEST", Hdr.RETH, False, Pos.ONLY, Kind.READ_REQ),
    (0x0D, "RDMA_READ_RESPONSE_FIRST", Hdr.AETH, True, Pos.FIRST, Kind.READ_RESP),
    (0x0E, "RDMA_READ_RESPONSE_MIDDLE", Hdr.NONE, True, Pos.MIDDLE, Kind.READ_RESP),
    (0x0F, "RDMA_READ_RESPONSE_LAST", Hdr.AETH, True, Pos.LAST, Kind.READ_RESP),
    (0x10, "RDMA_READ_RESPONSE_ONLY", Hdr.AETH, True, Pos.ONLY, Kind.READ_RESP),
    (0x11, "ACKNOWLEDGE", Hdr.AETH, False, Pos.ONLY, Kind.ACK),
    (0x12, "ATOMIC_ACKNOWLEDGE", Hdr.AETH | Hdr.ATMACK, False, Pos.ONLY, Kind.ATOMIC_ACK),
    (0x13, "COMPARE_SWAP", Hdr.ATMETH, False, Pos.ONLY, Kind.CMP_SWAP),
    (0x14, "FETCH_ADD", Hdr.ATMETH, False, Pos.ONLY, Kind.FETCH_ADD),
    (0x16, "SEND_LAST_WITH_INVALIDATE", Hdr.IETH, True, Pos.LAST, Kind.SEND),
    (0x17, "SEND_ONLY_WITH_INVALIDATE", Hdr.IETH, True, Pos.ONLY, Kind.SEND),
    (0x1C, "FLUSH", Hdr.FETH | Hdr.RETH, False, Pos.ONLY, Kind.FLUSH),
    (0x1D, "ATOMIC_WRITE", Hdr.RETH, True, Pos.ONLY, Kind.ATOMIC_WRITE),
)

# Which operation codes each transport has (IBA Table 35; UC: sends and writes; UD: send only).
_UC_OPS = frozenset(range(0x00, 0x0C))
_UD_OPS = frozenset((0x04, 0x05))
_RD_OPS = frozenset(op for op, *_ in _OPS if op <= 0x14)


def _build() -> dict[int, OpInfo]:
    table: dict[int, OpInfo] = {}
    for op, name, hdrs, payload, pos, kind in _OPS:
        table[Transport.RC | op] = OpInfo(Transport.RC | op, "RC_" + name, hdrs, payload, pos, kind)
        # XRC (IBA 1.2 §9.2): the RC operations with an XRCETH after the BTH.
        table[Transport.XRC | op] = OpInfo(
            Transport.XRC | op, "XRC_" + name, hdrs | Hdr.XRCETH if kind not in (
                Kind.READ_RESP, Kind.ACK, Kind.ATOMIC_ACK) else hdrs, payload, pos, kind)
        if op in _UC_OPS:
            table[Transport.UC | op] = OpInfo(Transport.UC | op, "UC_" + name, hdrs, payload, pos, kind)
        if op in _RD_OPS:
            rd_hdrs = hdrs | Hdr.RDETH
            if kind not in (Kind.READ_RESP, Kind.ACK, Kind.ATOMIC_ACK):
                rd_hdrs |= Hdr.DETH
            table[Transport.RD | op] = OpInfo(Transport.RD | op, "RD_" + name, rd_hdrs, payload, pos, kind)
        if op in _UD_OPS:
            table[Transport.UD | op] = OpInfo(
                Transport.UD | op, "UD_" + name, hdrs | Hdr.DETH, payload, pos, kind)
    # RoCEv2 Congestion Notification Packet: BTH + 16 reserved bytes (RoCEv2 A17.9.2;
    # ib_pack.h IB_OPCODE_CNP). The reserved bytes are carried as the payload.
    table[0x81] = OpInfo(0x81, "CNP", Hdr.NONE, True, Pos.ONLY, Kind.CNP)
    return table


OPCODES: dict[int, OpInfo] = _build()

# Fast lookup by opcode byte; None for reserved/unknown opcodes.
OPTABLE: list[OpInfo | None] = [OPCODES.get(i) for i in range(256)]

# Symbolic constants for the opcodes the engine emits.
RC_SEND_FIRST = 0x00
RC_SEND_MIDDLE = 0x01
RC_SEND_LAST = 0x02
RC_SEND_LAST_IMM = 0x03
RC_SEND_ONLY = 0x04
RC_SEND_ONLY_IMM = 0x05
RC_WRITE_FIRST = 0x06
RC_WRITE_MIDDLE = 0x07
RC_WRITE_LAST = 0x08
RC_WRITE_LAST_IMM = 0x09
RC_WRITE_ONLY = 0x0A
RC_WRITE_ONLY_IMM = 0x0B
RC_READ_REQUEST = 0x0C
RC_READ_RESPONSE_FIRST = 0x0D
RC_READ_RESPONSE_MIDDLE = 0x0E
RC_READ_RESPONSE_LAST = 0x0F
RC_READ_RESPONSE_ONLY = 0x10
RC_ACK = 0x11
RC_ATOMIC_ACK = 0x12
RC_CMP_SWAP = 0x13
RC_FETCH_ADD = 0x14
RC_SEND_LAST_INV = 0x16
RC_SEND_ONLY_INV = 0x17
RC_ATOMIC_WRITE = 0x1D
UD_SEND_ONLY = 0x64
UD_SEND_ONLY_IMM = 0x65
CNP = 0x81

#: the opcodes of the connected transports, RC and UC (IBA 9.2, Table 35: the top three
#: bits 000 and 001): their packets carry no DETH and need no GRH area on receive
CONNECTED_OPCODES = frozenset(range(Transport.RC, Transport.RD))
#: the opcodes of UD (IBA 9.2, Table 35: top three bits 011): their receives place the
#: 40-byte GRH area in front of the payload (IBA 11.4.1.1)
UD_OPCODES = frozenset(range(Transport.UD, Transport.CNP))
