"""``pyverbs.wr``: scatter/gather elements and work requests (IBA 10.8, 11.4.1; rdma-core
``pyverbs/wr.pyx`` API).

The pyverbs work requests mirror ``struct ibv_send_wr`` / ``ibv_recv_wr``, unions
included: ``SendWR.imm_data`` is the raw ``__be32`` field (so a sender writes
``socket.htonl(value)``), and for SEND_WITH_INV / LOCAL_INV it carries the R_Key to
invalidate (the ``invalidate_rkey`` member of the same union). :meth:`SendWR.to_verbs`
and :meth:`RecvWR.to_verbs` give the softrdma work requests the verbs layer posts.
"""

from __future__ import annotations

import ctypes
import socket
from typing import Any

from softrdma import verbs as _v

from . import libibverbs_enums as e
from ._enum_names import flag_names
from .base import PyverbsCM, inc_rkey
from .pyverbs_error import PyverbsUserError

__all__ = ["SGE", "RecvWR", "SendWR", "send_flags_to_str"]

_IMM_OPS = frozenset({int(e.IBV_WR_SEND_WITH_IMM), int(e.IBV_WR_RDMA_WRITE_WITH_IMM)})
_INV_OPS = frozenset({int(e.IBV_WR_SEND_WITH_INV), int(e.IBV_WR_LOCAL_INV)})
_NO_SGE_OPS = frozenset({int(e.IBV_WR_LOCAL_INV), int(e.IBV_WR_BIND_MW),
                         int(e.IBV_WR_SEND_WITH_INV)})
_INLINE = int(e.IBV_SEND_INLINE)


class SGE(_v.SGE, PyverbsCM):
    """A scatter/gather element ``(addr, length, lkey)`` (``struct ibv_sge``)."""

    def __init__(self, addr: int, length: int, lkey: int) -> None:
        try:
            super().__init__(int(addr), int(length), int(lkey))
        except ValueError as exc:
            raise PyverbsUserError(f"SGE: {exc}") from exc

    def read(self, length: int, offset: int) -> bytes:
        """``length`` bytes at the SGE's address + ``offset``."""
        return ctypes.string_at(self.addr + offset, length)

    def __str__(self) -> str:
        return f"Address: {self.addr:#x}, Length: {self.length}, Key: {self.lkey:#x}"


def _copy_sges(sg: Any, num_sge: int) -> list[SGE]:
    if num_sge == 0:
        return []
    if sg is None:
        raise PyverbsUserError("A WR needs at least one SGE")
    items = list(sg) if isinstance(sg, (list, tuple)) else [sg]
    if num_sge > len(items):
        raise PyverbsUserError(f"num_sge {num_sge} is larger than the SGE list ({len(items)})")
    out = []
    for s in items[:num_sge]:
        if not isinstance(s, _v.SGE):
            raise PyverbsUserError(f"Expected SGE, got {type(s).__name__}")
        out.append(SGE(s.addr, s.length, s.lkey))
    return out


class _SgeList(PyverbsCM):
    """A WR's ``num_sge`` is the length of its SGE list ``sg``; setting it truncates."""

    sg: list[SGE]

    @property
    def num_sge(self) -> int:
        return len(self.sg)

    @num_sge.setter
    def num_sge(self, val: int) -> None:
        self.sg = self.sg[:val]


class RecvWR(_SgeList):
    """A receive work request (``struct ibv_recv_wr``)."""

    def __init__(self, wr_id: int = 0, num_sge: int = 0, sg: Any = None,
                 next_wr: RecvWR | None = None) -> None:
        super().__init__()
        if num_sge < 1 or sg is None:
            raise PyverbsUserError("A WR needs at least one SGE")
        self.sg = _copy_sges(sg, num_sge)
        self.wr_id = wr_id
        self.next_wr = next_wr

    def to_verbs(self) -> _v.RecvWR:
        return _v.RecvWR(self.wr_id, len(self.sg), list(self.sg))

    def __str__(self) -> str:
        return f"WR ID: {self.wr_id}, Num SGE: {self.num_sge}"


class SendWR(_SgeList):
    """A send work request (``struct ibv_send_wr``)."""

    def __init__(self, wr_id: int = 0, opcode: int = int(e.IBV_WR_SEND), num_sge: int = 0,
                 imm_data: int = 0, sg: Any = None, send_flags: int = int(e.IBV_SEND_SIGNALED),
                 next_wr: SendWR | None = None) -> None:
        super().__init__()
        if opcode not in _NO_SGE_OPS and (num_sge < 1 or sg is None):
            raise PyverbsUserError("A WR needs at least one SGE")
        self.sg = _copy_sges(sg, num_sge)
        self.wr_id = wr_id
        self.next_wr = next_wr
        self.opcode = opcode
        self.send_flags = send_flags
        self.imm_data = imm_data
        self.ah: Any = None
        self.remote_qpn = 0
        self.remote_qkey = 0
        self.remote_addr = 0
        self._rkey = 0
        self.compare_add = 0
        self.swap = 0
        self.remote_srqn = 0
        self.mw: Any = None
        self.bind_info: Any = None
        self._bind_rkey = 0

    @property
    def sg_list(self) -> list[SGE]:
        return self.sg

    @sg_list.setter
    def sg_list(self, val: SGE) -> None:
        """Point the request at one SGE (pyverbs sets ``sg_list`` to a single element)."""
        self.sg = [SGE(val.addr, val.length, val.lkey)]

    def set_wr_ud(self, ah: Any, rqpn: int, rqkey: int) -> None:
        """Address handle, remote QPN and Q_Key of a UD send."""
        if ah is None:
            raise PyverbsUserError("set_wr_ud needs an AH")
        self.ah = ah
        self.remote_qpn = rqpn
        self.remote_qkey = rqkey

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        """Remote key and address of an RDMA READ/WRITE."""
        self._rkey = rkey
        self.remote_addr = addr

    def set_wr_atomic(self, rkey: int, addr: int, compare_add: int, swap: int = 0) -> None:
        """Remote key/address and operands of an atomic."""
        self._rkey = rkey
        self.remote_addr = addr
        self.compare_add = compare_add
        self.swap = swap

    def set_bind_wr(self, mw: Any, bind_info: Any) -> None:
        """A type-2 memory-window bind (``bind_mw``): the new R_Key is the window's with
        its key byte incremented (``ibv_inc_rkey``)."""
        self.mw = mw
        self.bind_info = bind_info
        self._bind_rkey = inc_rkey(mw.rkey)

    @property
    def rkey(self) -> int:
        """The R_Key a bind WR gives the window (``bind_mw.rkey``)."""
        return self._bind_rkey

    def set_qp_type_xrc(self, remote_srqn: int) -> None:
        """The remote XRC SRQ number (``qp_type.xrc.remote_srqn``)."""
        self.remote_srqn = remote_srqn

    def to_verbs(self) -> _v.SendWR:
        """The softrdma :class:`~softrdma.verbs.SendWR` this request stands for."""
        w = _v.SendWR(self.wr_id, None, len(self.sg), list(self.sg), self.opcode,
                      self.send_flags)
        op = self.opcode
        if op in _IMM_OPS:
            w.imm_data = socket.ntohl(self.imm_data & 0xFFFFFFFF)
        elif op in _INV_OPS:
            w.invalidate_rkey = self.imm_data & 0xFFFFFFFF
        w.remote_addr = self.remote_addr
        w.rkey = self._rkey
        w.compare_add = self.compare_add
        w.swap = self.swap
        if self.ah is not None:
            w.set_wr_ud(self.ah, self.remote_qpn, self.remote_qkey)
        w.remote_srqn = self.remote_srqn
        if self.send_flags & _INLINE and self.sg:
            w.inline_data = b"".join(ctypes.string_at(s.addr, s.length) for s in self.sg
                                     if s.length)
        return w

    def __str__(self) -> str:
        return (f"WR ID: {self.wr_id}, Num SGE: {self.num_sge}, Opcode: {self.opcode}, "
                f"Send flags: {send_flags_to_str(self.send_flags)}, Imm Data: {self.imm_data}")


def send_flags_to_str(flags: int) -> str:
    return flag_names(flags, e.ibv_send_flags)
