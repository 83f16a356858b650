"""``rc-pingpong``'s device-feature flags, as ``ibv_rc_pingpong`` has them (rdma-core
``libibverbs/examples/rc_pingpong.c``): ``-o`` on-demand paging, ``-O`` implicit ODP,
``-P`` prefetch, ``-t`` completion timestamps, ``-j`` device memory, ``-N`` the new
post-send API (``ibv_wr_*``).

What a softrdma device has, as its ``ibv_query_device_ex`` reports it (the pyverbs
compatibility layer, ``compat/pyverbs/device.py``):

* ODP, implicit ODP included (``IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT``, RC SEND and
  RECV): softrdma never pins memory, the engine reaches registered bytes in place when a
  packet needs them, which is what ODP promises; the buffer's MR is therefore an
  ordinary one, and a prefetch (``ibv_advise_mr``) has nothing to fault in.
* Device memory, up to :data:`MAX_DM_SIZE` per context: a buffer of the process reached
  through a zero-based MR (``IBV_ACCESS_ZERO_BASED``, SGE addresses from 0), as
  ``ibv_reg_dm_mr`` gives; never sent inline.
* Completion timestamps (``completion_timestamp_mask`` all 64 bits, ``hca_core_clock``
  1 GHz: ``CLOCK_MONOTONIC`` ns, :mod:`softrdma.verbs.cq`; rxe has none): ``-t`` makes the
  CQ stamp its completions and reports the clock cycles between receive completions as
  the C tool does (:class:`RecvClock`).
* The new post-send API: a QP made with ``send_ops_flags = IBV_QP_EX_WITH_SEND`` posts
  through ``ibv_wr_start`` / ``ibv_wr_send`` / ``ibv_wr_set_sge`` / ``ibv_wr_complete``;
  :class:`NewSendBatch` is that sequence over the verbs QP.

The argument checks run in the C tool's order with its messages (``DM memory region
can't be on demand``, ``prefetch is valid only with on-demand memory region``, ``Device
memory is insufficient``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ... import enums as e
from ...errors import SoftRdmaError, StateError

__all__ = ["add_arguments", "ExtOptions", "MAX_DM_SIZE", "NewSendBatch", "check",
           "mr_access", "FeatureError", "RecvClock"]

#: Device memory per context (``max_dm_size``), the same as the pyverbs layer reports
#: (``compat.pyverbs.device.MAX_DM_SIZE``; tests/tools/test_pingpong_ext.py keeps them equal).
MAX_DM_SIZE = 256 * 1024


class FeatureError(SoftRdmaError):
    """A feature flag the device cannot honour; the message is the C tool's line."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``-o -O -P -t -j -N`` with rc_pingpong's long names."""
    p.add_argument("-o", "--odp", action="store_true", help="use on demand paging")
    p.add_argument("-O", "--iodp", action="store_true", help="use implicit on demand paging")
    p.add_argument("-P", "--prefetch", action="store_true", help="prefetch an ODP MR")
    p.add_argument("-t", "--ts", action="store_true", help="get CQE with timestamp")
    p.add_argument("-j", "--dm", action="store_true", help="use device memory")
    p.add_argument("-N", "--new_send", "--new-send", dest="new_send", action="store_true",
                   help="use new post send WR API")


@dataclass(frozen=True, slots=True)
class ExtOptions:
    """The feature flags (``use_odp``, ``implicit_odp``, ``prefetch_mr``, ``use_ts``,
    ``use_dm``, ``use_new_send`` of rc_pingpong.c)."""

    odp: bool = False
    implicit_odp: bool = False
    prefetch: bool = False
    ts: bool = False
    dm: bool = False
    new_send: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExtOptions:
        iodp = bool(getattr(args, "iodp", False))
        return cls(odp=bool(getattr(args, "odp", False)) or iodp, implicit_odp=iodp,
                   prefetch=bool(getattr(args, "prefetch", False)),
                   ts=bool(getattr(args, "ts", False)), dm=bool(getattr(args, "dm", False)),
                   new_send=bool(getattr(args, "new_send", False)))


def check(ext: ExtOptions, size: int) -> None:
    """rc_pingpong's checks, in its order: the flag combinations (``main``), then the
    device's features (``pp_init_ctx``). :class:`FeatureError` with the C line."""
    if ext.odp and ext.dm:
        raise FeatureError("DM memory region can't be on demand")
    if not ext.odp and ext.prefetch:
        raise FeatureError("prefetch is valid only with on-demand memory region")
    if ext.dm and MAX_DM_SIZE < size:
        raise FeatureError("Device memory is insufficient")


class RecvClock:
    """``-t``: the completion clock's cycles between one receive completion and the
    next (``rc_pingpong.c``'s ``ts_params``: a wrapped clock counted across the wrap, the
    minimum starting at 0xffffffff as there)."""

    __slots__ = ("prev", "max", "min", "total", "n", "mask")

    def __init__(self) -> None:
        from ...verbs.cq import COMPLETION_TIMESTAMP_MASK  # a flags module: verbs on use

        self.mask = COMPLETION_TIMESTAMP_MASK
        self.prev: int | None = None
        self.max = 0
        self.min = 0xFFFFFFFF
        self.total = 0
        self.n = 0

    def add(self, stamp: int) -> None:
        """A receive completion's timestamp."""
        prev = self.prev
        if prev is not None:
            delta = stamp - prev if stamp >= prev else \
                self.mask - prev + stamp + 1
            self.max = max(self.max, delta)
            self.min = min(self.min, delta)
            self.total += delta
            self.n += 1
        self.prev = stamp

    def lines(self) -> list[str]:
        """The C tool's three lines, none before a second receive."""
        if not self.n:
            return []
        return [f"Max receive completion clock cycles = {self.max}",
                f"Min receive completion clock cycles = {self.min}",
                f"Average receive completion clock cycles = {self.total / self.n:f}"]


def mr_access(ext: ExtOptions, access: int) -> int:
    """The access flags of the buffer's MR: a device-memory MR is zero-based
    (``IBV_ACCESS_ZERO_BASED``); ODP needs no flag on softrdma (see the module
    docstring)."""
    return access | int(e.IBV_ACCESS_ZERO_BASED) if ext.dm else access


class NewSendBatch:
    """``ibv_wr_start`` ... ``ibv_wr_complete`` on a QP created with
    ``IBV_QP_EX_WITH_SEND``: work requests built one call at a time and posted together;
    nothing is posted when one of them is incomplete."""

    def __init__(self, qp: Any, verbs: Any) -> None:
        self.qp = qp
        self.v = verbs
        self.wr_id = 0
        self.wr_flags = 0
        self._wrs: list[Any] | None = None

    def wr_start(self) -> None:
        self._wrs = []

    def wr_send(self) -> None:
        if self._wrs is None:
            raise StateError("ibv_wr_send outside ibv_wr_start/ibv_wr_complete")
        self._wrs.append(self.v.SendWR(wr_id=self.wr_id, opcode=int(e.IBV_WR_SEND),
                                       send_flags=self.wr_flags))

    def wr_set_sge(self, lkey: int, addr: int, length: int) -> None:
        if not self._wrs:
            raise StateError("ibv_wr_set_sge before a work request")
        self._wrs[-1].sg = [self.v.SGE(addr, length, lkey)]

    def wr_complete(self) -> None:
        wrs, self._wrs = self._wrs, None
        if wrs is None:
            raise StateError("ibv_wr_complete without ibv_wr_start")
        for wr in wrs:
            self.qp.post_send(wr)
