"""``pyverbs.cq``: completion queues, extended CQs and completion channels (IBA 11.4.2;
rdma-core ``pyverbs/cq.pyx`` API).

:class:`CQ` is a :class:`softrdma.verbs.CQ`; :meth:`CQ.poll` returns pyverbs
:class:`WC` objects. ``WC.imm_data`` is, as in libibverbs, the immediate's big-endian wire
bytes read as a host integer (``socket.ntohl(wc.imm_data)`` is the value sent).

:class:`CQEX` (``ibv_create_cq_ex``) offers the iterator API ``start_poll`` /
``poll_next`` / ``end_poll`` and the ``read_*`` accessors for the fields chosen by
``wc_flags``. Supported: the standard fields (``IBV_WC_STANDARD_FLAGS``) and completion
timestamps (``IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`` and ``_WALLCLOCK``: the device's
completion clock, ``CLOCK_MONOTONIC`` ns, stamped as each completion is queued, and the
same instant on ``CLOCK_REALTIME``; :mod:`softrdma.verbs.cq`); CVLAN, flow tags and
tag-matching info fail with EOPNOTSUPP, as on rxe.
``IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`` is not supported (EOPNOTSUPP).

Resize (``ibv_resize_cq``, rxe ``rxe_cq_chk_attr``): the new size must be 1..max_cqe and
not below the number of completions queued (EINVAL).
"""

from __future__ import annotations

import errno
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from softrdma import verbs as _v
from softrdma.errors import SoftRdmaError
from softrdma.seam.types import WorkCompletion
from softrdma.verbs.device import MAX_CQE

from . import libibverbs_enums as e
from ._enum_names import flag_names, member_name
from .base import PyverbsCM, PyverbsObject, rdma_error, translate
from .pd import ParentDomain
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError
from .utils import flags_to_str

__all__ = ["CompChannel", "CQ", "CQEX", "CqInitAttrEx", "PollCqAttr", "WC", "WcTmInfo",
           "cqe_status_to_str", "cqe_opcode_to_str", "cqe_flags_to_str",
           "create_wc_flags_to_str", "flags_to_str"]

_TS_FLAGS = int(e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
                | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
_SUPPORTED_WC_FLAGS = int(e.IBV_WC_STANDARD_FLAGS) | _TS_FLAGS
_KNOWN_WC_FLAGS = sum(int(f) for f in e.ibv_create_cq_wc_flags)
_SUPPORTED_CQ_FLAGS = int(e.ibv_create_cq_attr_flags.IBV_CREATE_CQ_ATTR_SINGLE_THREADED)
_KNOWN_CQ_FLAGS = sum(int(f) for f in e.ibv_create_cq_attr_flags)
_KNOWN_COMP_MASK = int(e.IBV_CQ_INIT_ATTR_MASK_FLAGS | e.IBV_CQ_INIT_ATTR_MASK_PD)


class WC(WorkCompletion, PyverbsObject):
    """A work completion (``struct ibv_wc``): the engine's :class:`WorkCompletion` with
    pyverbs' argument order, ``slid``/``sl``/``dlid_path_bits`` as arguments and
    ``imm_data`` in network order (:meth:`from_engine`)."""

    def __init__(self, wr_id: int = 0, status: int = 0, opcode: int = 0, vendor_err: int = 0,
                 byte_len: int = 0, qp_num: int = 0, src_qp: int = 0, imm_data: int = 0,
                 wc_flags: int = 0, pkey_index: int = 0, slid: int = 0, sl: int = 0,
                 dlid_path_bits: int = 0) -> None:
        super().__init__(wr_id, status, opcode, qp_num, byte_len, imm_data, src_qp, wc_flags,
                         vendor_err, pkey_index)
        self.slid = slid
        self.sl = sl
        self.dlid_path_bits = dlid_path_bits

    @classmethod
    def from_engine(cls, w: WorkCompletion) -> WC:
        wc = cls(w.wr_id, int(w.status), int(w.opcode), w.vendor_err, w.byte_len, w.qp_num,
                 w.src_qp, socket.htonl(w.imm_data & 0xFFFFFFFF), int(w.wc_flags),
                 w.pkey_index, w.slid, w.sl, w.dlid_path_bits)
        if w.wc_flags & e.IBV_WC_WITH_INV:
            wc.imm_data = w.invalidated_rkey
            wc.invalidated_rkey = w.invalidated_rkey
        wc.timestamp = w.timestamp
        return wc

    def __str__(self) -> str:
        return (f"WC: wr_id {self.wr_id}, status {cqe_status_to_str(self.status)}, opcode "
                f"{cqe_opcode_to_str(self.opcode)}, byte_len {self.byte_len}, qp_num "
                f"{self.qp_num}, src_qp {self.src_qp}, wc_flags {self.wc_flags:#x}")

    __repr__ = __str__


class WcTmInfo(PyverbsObject):
    """``struct ibv_wc_tm_info``."""

    def __init__(self, tag: int = 0, priv: int = 0) -> None:
        super().__init__()
        self.tag = tag
        self.priv = priv


class CompChannel(_v.CompChannel, PyverbsCM):
    """A completion event channel (``ibv_create_comp_channel``)."""

    def __init__(self, context: Any) -> None:
        PyverbsObject.__init__(self)
        with translate("Failed to create a completion channel"):
            super().__init__(context)

    def get_cq_event(self, expected_cq: Any = None) -> Any:
        """Wait for the next CQ event (``ibv_get_cq_event``); it must be ``expected_cq``'s
        when one is given."""
        with translate("Failed to get CQ event"):
            cq = super().get_cq_event(None)
        if expected_cq is not None and cq is not expected_cq:
            raise PyverbsRDMAError("Received event on an unexpected CQ")
        return cq

    def close(self) -> None:
        _v.CompChannel.close(self)


def _cqe(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PyverbsUserError(f"cqe must be a number, got {value!r}") from None


class CQ(_v.CQ, PyverbsCM):
    """A completion queue (``ibv_create_cq``)."""

    def __init__(self, creator: Any, cqe: Any, cq_context: Any = None,
                 channel: CompChannel | None = None, comp_vector: int = 0) -> None:
        PyverbsObject.__init__(self)
        with translate("Failed to create a CQ"):
            super().__init__(creator, _cqe(cqe), cq_context, channel, int(comp_vector))
        self.num_events = 0

    @property
    def comp_channel(self) -> CompChannel | None:
        return self.channel  # type: ignore[return-value]

    def poll(self, num_entries: int = 1) -> tuple[int, list[WC]]:  # type: ignore[override]
        """Up to ``num_entries`` completions (``ibv_poll_cq``)."""
        try:  # not ``with translate``: the spin loop's call, where it costs most
            n, wcs = super().poll(num_entries)
        except SoftRdmaError as exc:
            raise rdma_error("Failed to poll CQ", exc) from exc
        if not n:
            # pyverbs programs spin on poll(): an empty one hands the GIL over at once, so
            # the progress threads of the process's other devices (a test's peer) run now
            # rather than after the 5 ms switch interval, a wait that a loaded host
            # stretches past an RC retry budget (see docs/design.md, XRC)
            time.sleep(0)
        return n, [WC.from_engine(w) for w in wcs]

    def req_notify(self, solicited_only: bool = False) -> None:
        """Arm the CQ (``ibv_req_notify_cq``)."""
        with translate("Request notify CQ returned"):
            super().req_notify(bool(solicited_only))

    def ack_events(self, num_events: int) -> None:
        with translate("Failed to ack CQ events"):
            super().ack_events(num_events)

    def resize(self, cqe: int) -> None:
        """``ibv_resize_cq``: EINVAL below the queued completions or above max_cqe."""
        self._check()
        cqe = _cqe(cqe)
        with self._runtime.lock:
            if not 1 <= cqe <= MAX_CQE or cqe < len(self._q):
                raise PyverbsRDMAError("Failed to resize CQ", errno.EINVAL)
            self.cqe = cqe

    def close(self) -> None:
        _v.CQ.close(self)


class CqInitAttrEx(PyverbsObject):
    """``struct ibv_cq_init_attr_ex``."""

    def __init__(self, cqe: int = 100, cq_context: Any = None,
                 channel: CompChannel | None = None, comp_vector: int = 0, wc_flags: int = 0,
                 comp_mask: int = 0, flags: int = 0, parent_domain: Any = None) -> None:
        super().__init__()
        self.cqe = cqe
        self.cq_context = cq_context
        self.comp_channel = channel
        self.comp_vector = comp_vector
        self.wc_flags = wc_flags
        self.comp_mask = comp_mask
        self.flags = flags
        self.parent_domain = parent_domain


class PollCqAttr(PyverbsObject):
    """``struct ibv_poll_cq_attr``."""

    def __init__(self, comp_mask: int = 0) -> None:
        super().__init__()
        self.comp_mask = comp_mask


def _wc_reader(name: str, flag: int | None = None) -> Callable[[CQEX], int]:
    """A ``read_<name>`` method of :class:`CQEX`: field ``name`` of the completion being
    polled, present only when the CQ was created with ``flag`` in its wc_flags (None:
    always)."""
    def read(self: CQEX) -> int:
        wc = self._wc() if flag is None else self._field(int(flag))
        return int(getattr(wc, name))
    read.__name__ = read.__qualname__ = f"read_{name}"
    return read


def _read_wallclock_ns(self: CQEX) -> int:
    """``ibv_wc_read_completion_wallclock_ns``: the completion's time on
    ``CLOCK_REALTIME`` (its monotonic stamp moved by the clocks' present offset)."""
    wc = self._field(int(e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK))
    return int(wc.timestamp) + time.time_ns() - time.monotonic_ns()


def _not_kept(what: str) -> Callable[[CQEX], int]:
    """A ``read_*`` method of :class:`CQEX` for a field a software CQ never keeps."""
    def read(self: CQEX) -> int:
        raise PyverbsUserError(f"The CQ was not created with {what}")
    return read


class CQEX(CQ):
    """An extended CQ (``ibv_create_cq_ex``) with the ``start_poll``/``poll_next`` API."""

    def __init__(self, context: Any, init_attr: CqInitAttrEx) -> None:
        if not isinstance(init_attr, CqInitAttrEx):
            raise PyverbsUserError("CQEX needs a CqInitAttrEx")
        a = init_attr
        if a.comp_mask & ~_KNOWN_COMP_MASK:
            raise PyverbsRDMAError("Failed to create extended CQ", errno.EINVAL)
        if a.wc_flags & ~_KNOWN_WC_FLAGS:
            raise PyverbsRDMAError("Failed to create extended CQ", errno.EINVAL)
        if a.wc_flags & ~_SUPPORTED_WC_FLAGS:
            raise PyverbsRDMAError("Failed to create extended CQ", errno.EOPNOTSUPP)
        if a.comp_mask & e.IBV_CQ_INIT_ATTR_MASK_FLAGS:
            if a.flags & ~_KNOWN_CQ_FLAGS:
                raise PyverbsRDMAError("Failed to create extended CQ", errno.EINVAL)
            if a.flags & ~_SUPPORTED_CQ_FLAGS:
                raise PyverbsRDMAError("Failed to create extended CQ", errno.EOPNOTSUPP)
        if a.comp_mask & e.IBV_CQ_INIT_ATTR_MASK_PD:
            pd = a.parent_domain
            if not isinstance(pd, ParentDomain):
                raise PyverbsRDMAError("Failed to create extended CQ", errno.EINVAL)
        try:
            super().__init__(context, a.cqe, a.cq_context, a.comp_channel, a.comp_vector)
        except PyverbsRDMAError as exc:
            raise PyverbsRDMAError("Failed to create extended CQ", exc.error_code) from exc
        self.wc_flags = int(a.wc_flags)
        self.timestamps = bool(self.wc_flags & _TS_FLAGS)  # no QP uses it yet
        self._cur: WC | None = None
        self._batch: deque[WC] = deque()
        self._polling = False

    def _next(self) -> int:
        if not self._batch:
            _, wcs = CQ.poll(self, 32)
            self._batch.extend(wcs)
        if not self._batch:
            self._cur = None
            return errno.ENOENT
        self._cur = self._batch.popleft()
        return 0

    def start_poll(self, attr: PollCqAttr) -> int:
        """Begin a polling pass (``ibv_start_poll``): 0 with a completion ready, ENOENT
        when the CQ is empty."""
        if self._polling:
            raise PyverbsRDMAError("Failed to poll CQ: a poll is in progress", errno.EINVAL)
        rc = self._next()
        self._polling = rc == 0
        return rc

    def poll_next(self) -> int:
        """The next completion of the pass (``ibv_next_poll``): 0 or ENOENT."""
        if not self._polling:
            raise PyverbsRDMAError("Failed to poll CQ: no poll in progress", errno.EINVAL)
        return self._next()

    def end_poll(self) -> None:
        """End the pass (``ibv_end_poll``); completions not yet read stay queued."""
        if self._batch:
            with self._runtime.lock:
                self._q.extendleft(reversed([self._engine_wc(w) for w in self._batch]))
            self._batch.clear()
        self._polling = False
        self._cur = None

    @staticmethod
    def _engine_wc(w: WC) -> WorkCompletion:
        wc = WorkCompletion(w.wr_id, w.status, w.opcode, w.qp_num, w.byte_len,
                            socket.ntohl(w.imm_data), w.src_qp, w.wc_flags, w.vendor_err,
                            w.pkey_index, w.invalidated_rkey)
        wc.timestamp = w.timestamp
        return wc

    def _wc(self) -> WC:
        if self._cur is None:
            raise PyverbsRDMAError("No completion is being polled", errno.EINVAL)
        return self._cur

    def _field(self, flag: int) -> WC:
        if not self.wc_flags & flag:
            raise PyverbsUserError("The CQ was not created with this field in wc_flags")
        return self._wc()

    @property
    def status(self) -> int:
        return self._wc().status

    @property
    def wr_id(self) -> int:
        return self._wc().wr_id

    # ibv_wc_read_*: one field of the completion being polled; the optional ones need
    # their IBV_WC_EX_WITH_* flag in the CQ's wc_flags, the ones a software CQ never
    # fills raise as on a CQ created without them
    read_opcode = _wc_reader("opcode")
    read_vendor_err = _wc_reader("vendor_err")
    read_byte_len = _wc_reader("byte_len", e.IBV_WC_EX_WITH_BYTE_LEN)
    read_imm_data = _wc_reader("imm_data", e.IBV_WC_EX_WITH_IMM)
    read_qp_num = _wc_reader("qp_num", e.IBV_WC_EX_WITH_QP_NUM)
    read_src_qp = _wc_reader("src_qp", e.IBV_WC_EX_WITH_SRC_QP)
    read_wc_flags = _wc_reader("wc_flags")
    read_slid = _wc_reader("slid", e.IBV_WC_EX_WITH_SLID)
    read_sl = _wc_reader("sl", e.IBV_WC_EX_WITH_SL)
    read_dlid_path_bits = _wc_reader("dlid_path_bits", e.IBV_WC_EX_WITH_DLID_PATH_BITS)
    read_timestamp = _wc_reader("timestamp", e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
    read_completion_wallclock_ns = _read_wallclock_ns
    read_cvlan = _not_kept("CVLAN")
    read_flow_tag = _not_kept("flow tags")

    def read_tm_info(self) -> WcTmInfo:
        raise PyverbsUserError("The CQ was not created with tag-matching info")


# ---- string helpers ------------------------------------------------------------------------
def cqe_status_to_str(status: int) -> str:
    return _v.wc_status_str(status)


def cqe_opcode_to_str(opcode: int) -> str:
    return member_name(e.ibv_wc_opcode, opcode, "Unknown opcode")


def cqe_flags_to_str(flags: int) -> str:
    return flag_names(flags, e.ibv_wc_flags)


def create_wc_flags_to_str(flags: int) -> str:
    return flag_names(flags, e.ibv_create_cq_wc_flags)
