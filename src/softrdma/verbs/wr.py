"""Work requests: SGE, SendWR, RecvWR and their validation into engine WQEs (IBA 10.8, 11.4.1).

Post-time checks are rxe's (``rxe_verbs.c`` ``rxe_post_send_kernel``/``validate_send_wr``,
``post_one_recv``; ``rxe_opcode.c`` ``rxe_wr_opcode_info``), all EINVAL:

* the opcode must be valid for the QP type (UD: SEND and SEND_WITH_IMM; UC: no READ and
  no atomics; RC: all that softrdma implements; BIND_MW of a type 2 window on RC and
  UC; ATOMIC_WRITE on RC with its 8 bytes from :meth:`SendWR.set_wr_atomic_write`, as
  ``ibv_wr_atomic_write`` gives them: one without is EOPNOTSUPP);
* IBV_SEND_INLINE only with SEND*/RDMA_WRITE*, and at most ``max_inline_data`` bytes;
* at most ``max_send_sge`` / ``max_recv_sge`` SGEs;
* atomics need >= 8 bytes of local buffer and an 8-byte aligned remote address;
* UD needs an address handle of the QP's PD.

An unknown or out-of-range *lkey* is not checked here: as in rxe it completes the WR with
``IBV_WC_LOC_PROT_ERR`` when the engine reaches it (IBA 10.6.3.1; rxe ``copy_data``: a
local protection violation is a completion error, not a posting error).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .. import enums as e
from ..errors import InvalidArgument, NotSupported
from ..seam.protocols import DeviceEngine
from ..seam.types import SGE as _EngineSGE
from ..seam.types import RecvWQE, SendWQE
from ._args import U24, U32, U64, data_bytes, u32, u64, uint
from .mw import MW_TYPE_2, bind_wqe

__all__ = ["SGE", "SendWR", "RecvWR", "build_send_wqe", "build_recv_wqe", "build_send_wqes",
           "build_recv_wqes", "chain",
           "QPT_OPCODES", "INLINE_OPCODES"]

RC, UC, UD = int(e.IBV_QPT_RC), int(e.IBV_QPT_UC), int(e.IBV_QPT_UD)
XRC_SEND = int(e.IBV_QPT_XRC_SEND)
_W = e.ibv_wr_opcode

#: Opcodes each QP type accepts (rxe_wr_opcode_info restricted to what the engine runs).
QPT_OPCODES: dict[int, frozenset[int]] = {
    RC: frozenset(int(o) for o in (
        _W.IBV_WR_RDMA_WRITE, _W.IBV_WR_RDMA_WRITE_WITH_IMM, _W.IBV_WR_SEND,
        _W.IBV_WR_SEND_WITH_IMM, _W.IBV_WR_RDMA_READ, _W.IBV_WR_ATOMIC_CMP_AND_SWP,
        _W.IBV_WR_ATOMIC_FETCH_AND_ADD, _W.IBV_WR_SEND_WITH_INV, _W.IBV_WR_LOCAL_INV,
        _W.IBV_WR_BIND_MW, _W.IBV_WR_ATOMIC_WRITE)),
    UC: frozenset(int(o) for o in (
        _W.IBV_WR_RDMA_WRITE, _W.IBV_WR_RDMA_WRITE_WITH_IMM, _W.IBV_WR_SEND,
        _W.IBV_WR_SEND_WITH_IMM, _W.IBV_WR_SEND_WITH_INV, _W.IBV_WR_BIND_MW)),
    UD: frozenset(int(o) for o in (_W.IBV_WR_SEND, _W.IBV_WR_SEND_WITH_IMM)),
}
# XRC INI QPs: the RC operations (Annex A14: XRC carries every RC request), each to an
# SRQ; the Atomic Write (IBA 1.5) has no XRC opcode here.
QPT_OPCODES[XRC_SEND] = QPT_OPCODES[RC] - {int(_W.IBV_WR_ATOMIC_WRITE)}
#: Opcodes that may carry IBV_SEND_INLINE (WR_INLINE_MASK).
INLINE_OPCODES = frozenset(int(o) for o in (
    _W.IBV_WR_RDMA_WRITE, _W.IBV_WR_RDMA_WRITE_WITH_IMM, _W.IBV_WR_SEND,
    _W.IBV_WR_SEND_WITH_IMM, _W.IBV_WR_SEND_WITH_INV))
_BIND_MW = int(_W.IBV_WR_BIND_MW)
_ATOMIC_WRITE = int(_W.IBV_WR_ATOMIC_WRITE)
_ATOMICS = frozenset(int(o) for o in (_W.IBV_WR_ATOMIC_CMP_AND_SWP, _W.IBV_WR_ATOMIC_FETCH_AND_ADD))
_RDMA = frozenset(int(o) for o in (_W.IBV_WR_RDMA_WRITE, _W.IBV_WR_RDMA_WRITE_WITH_IMM,
                                   _W.IBV_WR_RDMA_READ))
_IMM = frozenset(int(o) for o in (_W.IBV_WR_RDMA_WRITE_WITH_IMM, _W.IBV_WR_SEND_WITH_IMM))
_INV = frozenset(int(o) for o in (_W.IBV_WR_SEND_WITH_INV, _W.IBV_WR_LOCAL_INV))
# what a WQE of an opcode carries beyond its SGEs, one lookup per WR
_X_IMM, _X_RDMA, _X_ATOMIC, _X_INV = 1, 2, 4, 8
_EXTRA: dict[int, int] = {
    o: (_X_IMM if o in _IMM else 0) | (_X_RDMA if o in _RDMA else 0)
    | (_X_ATOMIC if o in _ATOMICS else 0) | (_X_INV if o in _INV else 0)
    for o in _IMM | _RDMA | _ATOMICS | _INV}
_INLINE_FLAG = int(e.IBV_SEND_INLINE)
_SEND_FLAGS = int(e.IBV_SEND_FENCE | e.IBV_SEND_SIGNALED | e.IBV_SEND_SOLICITED
                  | e.IBV_SEND_INLINE | e.IBV_SEND_IP_CSUM)


class SGE(_EngineSGE):
    """A scatter/gather element ``(addr, length, lkey)`` (``struct ibv_sge``)."""

    __slots__ = ()

    def __init__(self, addr: int = 0, length: int = 0, lkey: int = 0) -> None:
        super().__init__(u64(addr, "sge.addr"), u32(length, "sge.length"), u32(lkey, "sge.lkey"))


def _take_sges(sg: Sequence[object] | None, num_sge: int, argument: str) -> list[_EngineSGE]:
    if sg is None:
        given: list[object] = []
    else:
        try:
            given = list(sg)
        except TypeError:
            raise InvalidArgument(f"{argument}.sg", f"expected a list of SGEs, got "
                                  f"{type(sg).__name__}") from None
    num_sge = uint(num_sge, U32, f"{argument}.num_sge")
    if num_sge == 0:
        num_sge = len(given)  # convenience: sg given without num_sge uses all of it
    if num_sge > len(given):
        raise InvalidArgument(f"{argument}.num_sge", f"{num_sge} > len(sg) = {len(given)}")
    out: list[_EngineSGE] = []
    for s in given[:num_sge]:
        if not isinstance(s, _EngineSGE):
            raise InvalidArgument(f"{argument}.sg", f"expected SGE, got {type(s).__name__}")
        out.append(s)
    return out


class _ScatterGather:
    """A work request's scatter/gather list, ``sg`` (pyverbs also names it ``sg_list``)."""

    __slots__ = ()
    sg: list[_EngineSGE]

    @property
    def num_sge(self) -> int:
        return len(self.sg)

    @property
    def sg_list(self) -> list[_EngineSGE]:
        return self.sg


class SendWR(_ScatterGather):
    """A send work request (``struct ibv_send_wr``; pyverbs ``SendWR``)."""

    __slots__ = ("wr_id", "wr_next", "sg", "opcode", "send_flags", "imm_data",
                 "invalidate_rkey", "remote_addr", "rkey", "compare_add", "swap", "ah",
                 "remote_qpn", "remote_qkey", "inline_data", "mw", "bind_info", "remote_srqn",
                 "atomic_wr")

    def __init__(self, wr_id: int = 0, wr_next: SendWR | None = None, num_sge: int = 0,
                 sg: Sequence[object] | None = None, opcode: int = int(e.IBV_WR_SEND),
                 send_flags: int = int(e.IBV_SEND_SIGNALED)) -> None:
        self.wr_id = u64(wr_id, "wr.wr_id")
        self.wr_next = wr_next
        self.sg: list[_EngineSGE] = _take_sges(sg, num_sge, "wr")
        self.opcode = opcode
        self.send_flags = send_flags
        self.imm_data = 0
        self.invalidate_rkey = 0
        self.remote_addr = 0
        self.rkey = 0
        self.compare_add = 0
        self.swap = 0
        self.ah: Any = None
        self.remote_qpn = 0
        self.remote_qkey = 0
        self.inline_data: bytes | None = None
        self.mw: Any = None
        self.bind_info: Any = None
        self.remote_srqn = 0
        self.atomic_wr: bytes | None = None

    def set_qp_type_xrc(self, remote_srqn: int) -> None:
        """The XRC SRQ that is to receive this request (``qp_type.xrc.remote_srqn``,
        ``ibv_wr_set_xrc_srqn``); XRC INI QPs only."""
        self.remote_srqn = remote_srqn

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        """Remote key and address of an RDMA READ/WRITE."""
        self.rkey = rkey
        self.remote_addr = addr

    def set_wr_atomic(self, rkey: int, addr: int, compare_add: int, swap: int = 0) -> None:
        """Remote key and address, compare/add and swap operands of an atomic."""
        self.rkey = rkey
        self.remote_addr = addr
        self.compare_add = compare_add
        self.swap = swap

    def set_wr_atomic_write(self, rkey: int, addr: int, data: bytes) -> None:
        """Remote key and address of an RDMA Atomic Write and the 8 bytes it stores there
        in one piece (IBA 1.5, opcode 0x1D; ``ibv_wr_atomic_write``; not in pyverbs'
        ``SendWR``)."""
        self.rkey = rkey
        self.remote_addr = addr
        self.atomic_wr = bytes(data_bytes(data, "atomic_wr"))

    def set_wr_ud(self, ah: Any, rqpn: int, rqkey: int) -> None:
        """Address handle, remote QPN and Q_Key of a UD send."""
        self.ah = ah
        self.remote_qpn = rqpn
        self.remote_qkey = rqkey

    def set_bind_wr(self, mw: Any, bind_info: Any) -> None:
        """The type-2 window a BIND_MW request binds and how (:class:`~.mw.MWBindInfo`);
        ``rkey`` is the window's new key (``inc_rkey(mw.rkey)``)."""
        self.mw = mw
        self.bind_info = bind_info

    def set_inline_data(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` inline (copied now; sets IBV_SEND_INLINE). Not in pyverbs."""
        self.inline_data = bytes(data_bytes(data, "data"))
        self.send_flags |= _INLINE_FLAG

    def __repr__(self) -> str:
        return (f"SendWR(wr_id={self.wr_id}, opcode={self.opcode}, send_flags={self.send_flags:#x}, "
                f"sg={self.sg!r})")


class RecvWR(_ScatterGather):
    """A receive work request (``struct ibv_recv_wr``; pyverbs ``RecvWR``)."""

    __slots__ = ("wr_id", "sg", "wr_next")

    def __init__(self, wr_id: int = 0, num_sge: int = 0, sg: Sequence[object] | None = None,
                 wr_next: RecvWR | None = None) -> None:
        self.wr_id = u64(wr_id, "wr.wr_id")
        self.sg: list[_EngineSGE] = _take_sges(sg, num_sge, "wr")
        self.wr_next = wr_next

    def __repr__(self) -> str:
        return f"RecvWR(wr_id={self.wr_id}, sg={self.sg!r})"


def chain(wrs: Any, kind: type[SendWR] | type[RecvWR]) -> Iterator[Any]:
    """The WRs of a WR, a list of WRs, or a ``wr_next`` chain, in posting order. Each
    must be a ``kind`` (``None`` is no WR): InvalidArgument naming ``wr`` when the
    iteration reaches one that is not, so that the WRs before it can be posted (as
    ``ibv_post_send``'s ``bad_wr``). An empty list has none."""
    items = wrs if isinstance(wrs, (list, tuple)) else (wrs,)
    for i, w in enumerate(items):
        if not isinstance(w, kind):
            where = "wr" if items is not wrs else f"wr[{i}]"
            raise InvalidArgument(where, f"expected a {kind.__name__}, got {type(w).__name__}")
        seen = 0
        while w is not None:
            if not isinstance(w, kind):
                raise InvalidArgument("wr.wr_next", f"expected a {kind.__name__} or None, got "
                                      f"{type(w).__name__}")
            yield w
            w = w.wr_next
            seen += 1
            if seen > 1 << 20:
                raise InvalidArgument("wr.wr_next", "the wr_next chain loops")


def _gather_inline(port: DeviceEngine, sg: list[_EngineSGE]) -> bytes:
    """The bytes an inline send copies from its SGEs (looked up by lkey, else by address)."""
    out = bytearray()
    for s in sg:
        mr = port.lookup_mr(s.lkey)
        off = mr.offset_of(s.addr, s.length) if mr is not None and mr.valid else -1
        if off < 0:
            mr = None
            for cand in port.mrs.values():
                if cand.valid and not cand.zero_based:
                    o = cand.offset_of(s.addr, s.length)
                    if o >= 0:
                        mr, off = cand, o
                        break
        if mr is None:
            raise InvalidArgument("wr.sg", f"inline data at {s.addr:#x}+{s.length} is not "
                                  "inside a registered buffer")
        out += mr.buf[off:off + s.length]
    return bytes(out)


def build_send_wqe(wr: SendWR, qp_type: int, max_send_sge: int, max_inline: int, port: DeviceEngine,
                   pd: object) -> SendWQE:
    """Validate ``wr`` for a QP and turn it into the engine's :class:`SendWQE`."""
    if not isinstance(wr, SendWR):
        raise InvalidArgument("wr", f"expected SendWR, got {type(wr).__name__}")
    opcode = wr.opcode
    flags = wr.send_flags
    wr_id = wr.wr_id
    if type(wr_id) is not int or not 0 <= wr_id <= U64:
        wr_id = u64(wr_id, "wr.wr_id")
    if type(opcode) is not int:
        opcode = uint(opcode, U32, "wr.opcode")
    if opcode not in QPT_OPCODES[qp_type]:
        raise InvalidArgument("wr.opcode", f"opcode {opcode!r} is not valid on a "
                              f"{e.ibv_qp_type(qp_type).name} QP")
    if type(flags) is not int:
        if not isinstance(flags, int):
            raise InvalidArgument("wr.send_flags", f"unknown send flags {flags!r}")
        flags = int(flags)  # a plain int: IntFlag arithmetic is slow per WR
    if flags & ~_SEND_FLAGS or flags < 0:
        raise InvalidArgument("wr.send_flags", f"unknown send flags {flags!r}")
    if opcode == _BIND_MW:
        if wr.mw is None or getattr(wr.mw, "type", None) != MW_TYPE_2:
            raise InvalidArgument("wr.mw", "a BIND_MW work request binds a type 2 MW "
                                           "(type 1: QP.bind_mw)")
        return bind_wqe(wr.mw, wr.bind_info, wr.rkey, wr_id, flags)
    if opcode == _ATOMIC_WRITE:
        return _atomic_write_wqe(wr, wr_id, flags)
    sg = wr.sg
    nsge = len(sg)
    if nsge > max_send_sge:
        raise InvalidArgument("wr.num_sge", f"{nsge} SGEs > max_send_sge {max_send_sge}")
    if nsge == 1:
        one = sg[0]
        length = one.length
    else:
        length = 0
        for s in sg:
            length += s.length
    inline: bytes | None = None
    if flags & _INLINE_FLAG:
        if opcode not in INLINE_OPCODES:
            raise _inline_refused()
        inline = wr.inline_data if wr.inline_data is not None else _gather_inline(port, sg)
        if len(inline) > max_inline:
            raise InvalidArgument("wr.sg", f"{len(inline)} inline bytes > max_inline_data {max_inline}")
        sg_copy: list[_EngineSGE] = []
    elif nsge == 1:
        sg_copy = [_EngineSGE(one.addr, length, one.lkey)]
    else:
        sg_copy = [_EngineSGE(s.addr, s.length, s.lkey) for s in sg]
    # positional: the cheapest call (keyword arguments cost about 0.2 us a WR)
    wqe = SendWQE(wr_id, opcode, flags, sg_copy, length, inline)
    extra = _EXTRA.get(opcode, 0)
    if extra:
        if extra & _X_IMM:
            wqe.imm_data = u32(wr.imm_data, "wr.imm_data")
        if extra & (_X_RDMA | _X_ATOMIC):
            addr = u64(wr.remote_addr, "wr.remote_addr")
            rkey = u32(wr.rkey, "wr.rkey")
            wqe.remote_addr = addr
            wqe.rkey = rkey
            if extra & _X_ATOMIC:
                if length < 8:
                    raise InvalidArgument("wr.sg", f"an atomic needs 8 bytes of local buffer, got {length}")
                _check_atomic_address(addr)
                wqe.compare_add = u64(wr.compare_add, "wr.compare_add")
                wqe.swap = u64(wr.swap, "wr.swap")
        elif extra & _X_INV:
            wqe.invalidate_rkey = u32(wr.invalidate_rkey, "wr.invalidate_rkey")
    if qp_type == UD:
        ah = wr.ah
        try:  # a softrdma.verbs.AH (a VerbsObject: its _closed is what closed reads)
            av, closed, ah_pd = ah.av, ah._closed, ah.pd
        except AttributeError:
            av = getattr(ah, "av", None)
            closed, ah_pd = getattr(ah, "closed", False), getattr(ah, "pd", pd)
        if ah is None or av is None:
            raise InvalidArgument("wr.ah", "a UD send needs an address handle (set_wr_ud)")
        if closed:
            raise InvalidArgument("wr.ah", "the address handle is closed")
        if ah_pd is not pd:
            raise InvalidArgument("wr.ah", "the address handle belongs to another PD")
        wqe.ah = av
        qpn, qkey = wr.remote_qpn, wr.remote_qkey
        wqe.remote_qpn = (qpn if type(qpn) is int and 0 <= qpn <= U24
                          else uint(qpn, U24, "wr.remote_qpn"))
        wqe.remote_qkey = (qkey if type(qkey) is int and 0 <= qkey <= U32
                           else u32(qkey, "wr.remote_qkey"))
    elif qp_type == XRC_SEND:
        wqe.xrc_srqn = uint(wr.remote_srqn, U24, "wr.remote_srqn")  # XRCETH: 24 bits
    return wqe


def _inline_refused() -> InvalidArgument:
    """IBV_SEND_INLINE on an opcode that carries no inline data (rxe ``WR_INLINE_MASK``)."""
    return InvalidArgument("wr.send_flags", "IBV_SEND_INLINE is only valid with SEND and "
                           "RDMA_WRITE opcodes")


def _check_atomic_address(addr: int) -> None:
    """An atomic's remote address (compare-and-swap, fetch-and-add, Atomic Write) is
    8-byte aligned."""
    if addr & 7:
        raise InvalidArgument("wr.remote_addr", f"atomic address {addr:#x} is not 8-byte aligned")


def _atomic_write_wqe(wr: SendWR, wr_id: int, flags: int) -> SendWQE:
    """An RDMA Atomic Write's WQE: 8 bytes to an 8-byte aligned remote address (IBA 1.5;
    rxe ``wr_atomic_write``)."""
    data = wr.atomic_wr
    if data is None:
        raise NotSupported("wr.opcode: an ATOMIC_WRITE carries its 8 bytes, given by "
                           "set_wr_atomic_write (ibv_wr_atomic_write), not by SGEs")
    if len(data) != 8:
        raise InvalidArgument("wr.atomic_wr", f"an ATOMIC_WRITE stores 8 bytes, got {len(data)}")
    if flags & _INLINE_FLAG:
        raise _inline_refused()
    addr = u64(wr.remote_addr, "wr.remote_addr")
    _check_atomic_address(addr)
    return SendWQE(wr_id, _ATOMIC_WRITE, flags, inline_data=data, remote_addr=addr,
                   rkey=u32(wr.rkey, "wr.rkey"))


def build_recv_wqe(wr: RecvWR, max_recv_sge: int) -> RecvWQE:
    """Validate ``wr`` against ``max_recv_sge`` and build the engine's :class:`RecvWQE`."""
    if not isinstance(wr, RecvWR):
        raise InvalidArgument("wr", f"expected RecvWR, got {type(wr).__name__}")
    sg = wr.sg
    if len(sg) > max_recv_sge:
        raise InvalidArgument("wr.num_sge", f"{len(sg)} SGEs > max_recv_sge {max_recv_sge}")
    wr_id = wr.wr_id
    if type(wr_id) is not int or not 0 <= wr_id <= U64:
        wr_id = u64(wr_id, "wr.wr_id")
    if len(sg) == 1:
        one = sg[0]
        return RecvWQE(wr_id, [_EngineSGE(one.addr, one.length, one.lkey)])
    return RecvWQE(wr_id, [_EngineSGE(s.addr, s.length, s.lkey) for s in sg])


def _walk(wrs: Any, kind: type[SendWR] | type[RecvWR]) -> Any:
    """The WRs of ``wrs`` in posting order: a list of plain ``kind`` WRs without
    ``wr_next`` (a driver re-posting its requests) as it is, anything else through
    :func:`chain`, which checks each WR's type and follows the chains."""
    if type(wrs) is list and all(type(w) is kind and w.wr_next is None for w in wrs):
        return wrs
    return chain(wrs, kind)


def build_recv_wqes(wrs: Any, max_recv_sge: int) -> tuple[list[RecvWQE], Exception | None]:
    """The receive WQEs of ``wrs`` (a WR, a list, a ``wr_next`` chain), each as
    :func:`build_recv_wqe` builds it, and the error that stopped the walk (None: none);
    the WQEs before a bad WR are kept (``bad_wr``)."""
    wqes: list[RecvWQE] = []
    try:
        for w in _walk(wrs, RecvWR):
            wqes.append(build_recv_wqe(w, max_recv_sge))
    except InvalidArgument as exc:
        return wqes, exc
    return wqes, None


def build_send_wqes(wrs: Any, qp_type: int, max_send_sge: int, max_inline: int,
                    port: DeviceEngine, pd: object) -> tuple[list[SendWQE], Exception | None]:
    """The send WQEs of ``wrs`` (a WR, a list, a ``wr_next`` chain), each as
    :func:`build_send_wqe` builds it, and the error that stopped the walk (None: none);
    the WQEs before a bad WR are kept (``bad_wr``)."""
    wqes: list[SendWQE] = []
    try:
        for w in _walk(wrs, SendWR):
            wqes.append(build_send_wqe(w, qp_type, max_send_sge, max_inline, port, pd))
    except (InvalidArgument, NotSupported) as exc:
        return wqes, exc
    return wqes, None
