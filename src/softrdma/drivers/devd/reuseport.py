"""Kernel-side demultiplexing of a shared device's UDP port: ``SO_REUSEPORT`` + classic BPF.

design.md "Devices shared by processes": every process of a shared RoCEv2 device binds its
own UDP socket to the device's ``(ip, 4791)`` (Annex A17) with
``SO_REUSEPORT``; the sockets form one reuseport group. ``devd`` binds the group's first
socket and attaches a classic BPF program (``SO_ATTACH_REUSEPORT_CBPF``) that returns, for
each datagram, the index of the socket it goes to. The program sees the UDP payload at
offset 0, so the BTH DestQP (IBA 9.2, bytes 5-7 of the BTH) is the low 24 bits of the
big-endian 32-bit word at offset 4.

QPN layout: a process on the direct path gets a **slot** ``1..SLOT_LAST`` from devd and
its QPNs are ``slot << SLOT_SHIFT | n``, so the program is a few instructions::

    ld  [4]              A = word at payload offset 4 (cBPF absolute loads are big-endian)
    and #0xffffff        A = DestQP
    jeq #qpn, ret idx    one pair per exception: an owned QPN outside its owner's range
    rsh #16              A = slot
    jeq #slot, ret idx   one pair per process on the direct path
    ret #0               everything else (QP1, multicast, unknown QPNs): devd's socket

Linux semantics mirrored by :class:`Group` (net/core/sock_reuseport.c): sockets are
appended to the group's array in bind order; when one closes, the last socket of the
array moves into its slot (``reuseport_detach_sock``); a program result at or beyond
the number of sockets falls back to the 4-tuple hash. A datagram shorter than 8 bytes
makes the absolute load fail, which returns 0 (devd, which counts it malformed).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import InvalidArgument

__all__ = [
    "BPF_MAXINSNS",
    "DIRECT_ENV",
    "SLOT_LAST",
    "SLOT_SHIFT",
    "SO_ATTACH_REUSEPORT_CBPF",
    "Group",
    "assemble",
    "attach",
    "direct_enabled",
    "run_program",
    "slot_of",
    "slot_range",
]

SO_ATTACH_REUSEPORT_CBPF = 51  # <asm-generic/socket.h>
BPF_MAXINSNS = 4096  # <linux/bpf_common.h>: the longest classic BPF program

# classic BPF opcodes (<linux/filter.h>, <linux/bpf_common.h>)
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_ALU_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
BPF_ALU_RSH_K = 0x74  # BPF_ALU | BPF_RSH | BPF_K
BPF_JMP_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K
_INSN = struct.Struct("=HBBI")  # struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}

BTH_DESTQP_WORD = 4  # byte offset of the word whose low 24 bits are DestQP (IBA 9.2)
QPN_MASK = 0xFFFFFF
SLOT_SHIFT = 16
SLOT_LAST = 0xFE  # slot 0xFF would hold QPN 0xFFFFFF (multicast, IBA 10.5); slot 0: devd
DEVD_INDEX = 0

DIRECT_ENV = "SOFTRDMA_DEVD_DIRECT"  # "0": every datagram through devd (the fallback path)


def direct_enabled() -> bool:
    """Whether processes bind their own reuseport socket (``SOFTRDMA_DEVD_DIRECT``, default on)."""
    return os.environ.get(DIRECT_ENV, "1").strip().lower() not in ("0", "no", "off", "false")


def slot_of(qpn: int) -> int:
    """The slot a QPN's range belongs to (0: devd's own range, QP0/QP1 among them)."""
    return (qpn & QPN_MASK) >> SLOT_SHIFT


def slot_range(slot: int) -> tuple[int, int]:
    """The first and last QPN of a slot."""
    if not 1 <= slot <= SLOT_LAST:
        raise InvalidArgument("slot", f"must be 1..{SLOT_LAST}")
    first = slot << SLOT_SHIFT
    return first, first | ((1 << SLOT_SHIFT) - 1)


def assemble(slots: Mapping[int, int], exceptions: Mapping[int, int] | None = None) -> bytes:
    """The program (an array of ``struct sock_filter``): ``slots`` maps slot -> socket
    index, ``exceptions`` maps a QPN -> socket index (checked first)."""
    exceptions = exceptions or {}
    insns = [(BPF_LD_W_ABS, 0, 0, BTH_DESTQP_WORD), (BPF_ALU_AND_K, 0, 0, QPN_MASK)]
    for qpn, index in sorted(exceptions.items()):
        insns += [(BPF_JMP_JEQ_K, 0, 1, qpn & QPN_MASK), (BPF_RET_K, 0, 0, index)]
    insns.append((BPF_ALU_RSH_K, 0, 0, SLOT_SHIFT))
    for slot, index in sorted(slots.items()):
        insns += [(BPF_JMP_JEQ_K, 0, 1, slot), (BPF_RET_K, 0, 0, index)]
    insns.append((BPF_RET_K, 0, 0, DEVD_INDEX))
    if len(insns) > BPF_MAXINSNS:
        raise InvalidArgument("exceptions", f"program of {len(insns)} instructions "
                              f"exceeds {BPF_MAXINSNS}")
    return b"".join(_INSN.pack(*i) for i in insns)


def run_program(program: bytes, payload: bytes) -> int:
    """Interpret an :func:`assemble` program over a UDP payload as the kernel does (tests,
    and a check of the assembler without a socket); only the opcodes it emits."""
    insns = [_INSN.unpack_from(program, o) for o in range(0, len(program), _INSN.size)]
    a = pc = 0
    while pc < len(insns):
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == BPF_LD_W_ABS:
            if k + 4 > len(payload):
                return 0  # a failed absolute load ends the program with 0
            a = int.from_bytes(payload[k : k + 4], "big")
        elif code == BPF_ALU_AND_K:
            a &= k
        elif code == BPF_ALU_RSH_K:
            a >>= k
        elif code == BPF_JMP_JEQ_K:
            pc += jt if a == k else jf
        elif code == BPF_RET_K:
            return int(k)
        else:
            raise InvalidArgument("program", f"opcode {code:#x} not interpreted")
    return 0


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]  # noqa: RUF012


def attach(sock: socket.socket, program: bytes) -> None:
    """Attach ``program`` to the reuseport group of ``sock`` (OSError if refused)."""
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // _INSN.size, ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, bytes(fprog))


@dataclass
class Group:
    """devd's mirror of one kernel reuseport group's socket array. Index 0 is devd's own
    socket; each member is an opaque owner key (the client). ``held`` keeps devd's copy of
    each member's socket, so that the socket leaves the group when devd closes it."""

    members: list[object | None] = field(default_factory=lambda: [None])
    held: dict[int, socket.socket] = field(default_factory=dict)  # id(owner) -> socket

    def join(self, owner: object, sock: socket.socket) -> int:
        """The owner's socket was bound last: its index."""
        self.members.append(owner)
        self.held[id(owner)] = sock
        return len(self.members) - 1

    def index_of(self, owner: object) -> int | None:
        try:
            return self.members.index(owner)
        except ValueError:
            return None

    def last(self) -> object | None:
        return self.members[-1] if len(self.members) > 1 else None

    def leave(self, owner: object) -> None:
        """Close devd's copy of the owner's socket and mirror ``reuseport_detach_sock``:
        the last member moves into the freed index."""
        index = self.index_of(owner)
        if index is None:
            return
        sock = self.held.pop(id(owner), None)
        if sock is not None:
            sock.close()
        last = self.members.pop()
        if index < len(self.members):
            self.members[index] = last

    def routes(self, slots: Mapping[Any, int]) -> dict[int, int]:
        """slot -> index for the members whose slot ``slots`` names."""
        out: dict[int, int] = {}
        for index, owner in enumerate(self.members):
            if owner is not None and owner in slots:
                out[slots[owner]] = index
        return out

    def close(self) -> None:
        for sock in self.held.values():
            sock.close()
        self.held.clear()
        del self.members[1:]


def check_program_fits(n_slots: int, n_exceptions: int) -> bool:
    """Whether a program for that many slots and exceptions stays within BPF_MAXINSNS."""
    return 4 + 2 * (n_slots + n_exceptions) <= BPF_MAXINSNS


def members_of(groups: Sequence[Group], owner: object) -> list[Group]:
    """The groups ``owner`` is a member of."""
    return [g for g in groups if g.index_of(owner) is not None]
