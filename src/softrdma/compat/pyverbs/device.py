"""``pyverbs.device``: devices, contexts and their attributes (IBA 11.2.1; rdma-core
``pyverbs/device.pyx`` API).

:func:`get_device_list` lists the softrdma devices of the registry (``softrdma link
add``); the one named by ``$SOFTRDMA_PYVERBS_DEVICE`` (``softrdma pyverbs --dev``) comes
first. :class:`Context` opens one (a :class:`softrdma.verbs.Context`).

Query results have the shape libibverbs gives for a software RoCE device (rxe): node type
CA, transport IB, port ACTIVE, link layer Ethernet, a GID table of
:data:`GID_TABLE_LEN` entries (rxe's ``RXE_PORT_GID_TBL_LEN``) in which the populated
entries are the RoCE v2 GIDs of the netdev's IP addresses and the others read as zero
(``ibv_query_gid``) or ENODATA (``ibv_query_gid_ex``). Device memory (:class:`DM`) is
memory the device owns, up to :data:`MAX_DM_SIZE` per context.
"""

from __future__ import annotations

import errno
import os
import socket
import weakref
from dataclasses import dataclass
from typing import Any

from softrdma import verbs as _v
from softrdma.compat import DEVICE_ENV
from softrdma.errors import DeviceError, SoftRdmaError
from softrdma.verbs._object import VerbsObject
from softrdma.verbs.cq import COMPLETION_TIMESTAMP_MASK, HCA_CORE_CLOCK_KHZ, completion_clock

from . import libibverbs_enums as e
from ._device_attrs import (
    AllocDmAttr,
    CQModerationCaps,
    DeviceAttr,
    DeviceAttrEx,
    GIDEntry,
    ODPCaps,
    PacketPacingCaps,
    PCIAtomicCaps,
    PortAttr,
    QueryDeviceExInput,
    RSSCaps,
    TMCaps,
    TSOCaps,
    device_attr,
)
from ._device_str import (
    guid_format,
    guid_to_hex,
    phys_state_to_str,
    port_state_to_str,
    speed_to_str,
    str_from_flags,
    translate_device_caps,
    translate_event_type,
    translate_gid_type,
    translate_link_layer,
    translate_mtu,
    translate_node_type,
    translate_port_cap_flags,
    translate_port_cap_flags2,
    translate_transport_type,
    width_to_str,
)
from ._imports import file_handle, import_context, resolve, unimport
from .addr import GID
from .base import PyverbsCM, PyverbsObject, rdma_error, translate
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError

__all__ = [
    "Device", "get_device_list", "Context", "DeviceAttr", "DeviceAttrEx", "ODPCaps",
    "TSOCaps", "RSSCaps", "TMCaps", "CQModerationCaps", "PCIAtomicCaps", "PacketPacingCaps",
    "PortAttr", "GIDEntry", "AsyncEvent", "AllocDmAttr", "DM", "QueryDeviceExInput",
    "GID_TABLE_LEN", "translate_mtu", "translate_link_layer", "translate_node_type",
    "translate_transport_type", "translate_gid_type", "translate_event_type",
    "translate_device_caps", "translate_port_cap_flags", "translate_port_cap_flags2",
    "port_state_to_str", "phys_state_to_str", "width_to_str", "speed_to_str",
    "guid_format", "guid_to_hex", "str_from_flags", "rdma_get_devices",
]

_O = e.ibv_odp_transport_cap_bits
#: ODP capabilities (``struct ibv_odp_caps``): every transport operation softrdma runs.
ODP_GENERAL_CAPS = int(e.IBV_ODP_SUPPORT | e.IBV_ODP_SUPPORT_IMPLICIT)
ODP_RC_CAPS = int(_O.IBV_ODP_SUPPORT_SEND | _O.IBV_ODP_SUPPORT_RECV | _O.IBV_ODP_SUPPORT_WRITE
                  | _O.IBV_ODP_SUPPORT_READ | _O.IBV_ODP_SUPPORT_ATOMIC
                  | _O.IBV_ODP_SUPPORT_SRQ_RECV)
ODP_UC_CAPS = int(_O.IBV_ODP_SUPPORT_SEND | _O.IBV_ODP_SUPPORT_RECV | _O.IBV_ODP_SUPPORT_WRITE
                  | _O.IBV_ODP_SUPPORT_SRQ_RECV)
ODP_UD_CAPS = int(_O.IBV_ODP_SUPPORT_SEND | _O.IBV_ODP_SUPPORT_RECV
                  | _O.IBV_ODP_SUPPORT_SRQ_RECV)
#: XRC: the RC operations; receives only through XRC SRQs (softrdma.ib.xrc)
ODP_XRC_CAPS = ODP_RC_CAPS & ~int(_O.IBV_ODP_SUPPORT_RECV)

#: GID table length a software RoCE port reports (rxe ``RXE_PORT_GID_TBL_LEN``).
GID_TABLE_LEN = _v.device.GID_TABLE_LEN
_IB_GID_TYPE_ROCE_V1 = 1
_IB_GID_TYPE_ROCE_V2 = 2  # enum ibv_gid_type (verbs.h): IB 0, RoCE v1 1, RoCE v2 2


@dataclass(eq=False)
class Device(PyverbsObject):
    """An entry of :func:`get_device_list` (``struct ibv_device``)."""

    name: bytes
    guid: int
    node_type: int
    transport_type: int
    index: int = 0

    def __str__(self) -> str:
        return (f"Device {self.name.decode()}, node type {translate_node_type(self.node_type)}, "
                f"transport type {translate_transport_type(self.transport_type)}, "
                f"guid {guid_format(self.guid)}")


def _ordered_devices() -> list[_v.DeviceInfo]:
    devs = _v.get_device_list()
    want = os.environ.get(DEVICE_ENV)
    if want:
        devs.sort(key=lambda d: d.name != want)
    return devs


def get_device_list() -> list[Device]:
    """The softrdma devices (``ibv_get_device_list``)."""
    try:
        devs = _ordered_devices()
    except SoftRdmaError as exc:
        raise rdma_error("Failed to get devices list", exc) from exc
    out = []
    for i, d in enumerate(devs):
        iwarp = d.type == "iwarp"
        out.append(Device(d.name.encode(), int.from_bytes(d.node_guid.to_bytes(8, "big"), "little"),
                          int(e.IBV_NODE_RNIC if iwarp else e.IBV_NODE_CA),
                          int(e.IBV_TRANSPORT_IWARP if iwarp else e.IBV_TRANSPORT_IB), i))
    return out


def rdma_get_devices() -> list[Device]:
    """``rdma_get_devices``: the same list (every softrdma device is RDMA-CM capable)."""
    return get_device_list()


class AsyncEvent(PyverbsObject):
    """An asynchronous event (``struct ibv_async_event``); :meth:`ack` acknowledges it."""

    def __init__(self, ctx: Context, event: Any) -> None:
        super().__init__()
        self._ctx = ctx
        self._event = event
        self.event_type = int(event.event_type)
        self.element = event.element

    def ack(self) -> None:
        self._ctx.ack_async_event(self._event)


#: Device memory a softrdma device offers per context (``max_dm_size``; mlx5's MEMIC size).
MAX_DM_SIZE = 256 * 1024


class DM(VerbsObject, PyverbsCM):
    """Device memory (``ibv_alloc_dm``): memory owned by the device, reached by the host
    only through :meth:`copy_to_dm` / :meth:`copy_from_dm` (4-byte aligned offsets and
    lengths, as libibverbs requires) and by the engine through a DMMR
    (``ibv_reg_dm_mr``, zero-based). A softrdma device's memory is a buffer of the
    process that opened it; each context may hold up to :data:`MAX_DM_SIZE` bytes."""

    _close_rank = 5
    _handle: int | None = None
    _origin: DM | None = None
    length: int
    memory: bytearray

    def __init__(self, context: Context, dm_attr: AllocDmAttr | None = None,
                 **kwargs: Any) -> None:
        VerbsObject.__init__(self)
        if kwargs.get("handle") is not None:  # ibv_import_dm: the same device memory
            orig = resolve(context, "dm", kwargs["handle"], DM)
            assert isinstance(orig, DM)
            self._depend_on(context)
            self.context, self.length, self.memory = context, orig.length, orig.memory
            self._handle, self._origin = orig._handle, orig
            return
        if not isinstance(context, Context) or not isinstance(dm_attr, AllocDmAttr):
            raise PyverbsUserError("DM needs a Context and an AllocDmAttr")
        length = int(dm_attr.length)
        used = sum(int(dm.length) for dm in context._dms if not dm.closed)
        if (dm_attr.comp_mask or length <= 0 or length > MAX_DM_SIZE - used
                or not 0 <= int(dm_attr.log_align_req) < 64):
            code = errno.EINVAL if dm_attr.comp_mask or length <= 0 else errno.ENOMEM
            raise PyverbsRDMAError(f"Failed to allocate device memory of size {length}. "
                                   f"Max available size {MAX_DM_SIZE - used}.", code)
        try:
            self._depend_on(context)
        except SoftRdmaError as exc:
            raise rdma_error("Failed to allocate device memory", exc) from exc
        self.context = context
        self.length = length
        self.memory = bytearray(length)
        context._dms.add(self)

    @property
    def handle(self) -> int:
        return file_handle(self, self.context, "dm")

    def _range(self, offset: int, length: int, what: str) -> None:
        self._check()
        if offset < 0 or length < 0 or offset & 3 or length & 3 or offset + length > self.length:
            raise PyverbsRDMAError(f"Failed to copy {what} dm", errno.EINVAL)

    def copy_to_dm(self, dm_offset: int, data: bytes | str, length: int) -> None:
        """``ibv_memcpy_to_dm``."""
        if isinstance(data, str):
            data = data.encode()
        dm_offset, length = int(dm_offset), int(length)
        self._range(dm_offset, length, "to")
        self.memory[dm_offset:dm_offset + length] = bytes(data[:length]).ljust(length, b"\0")

    def copy_from_dm(self, dm_offset: int, length: int) -> bytes:
        """``ibv_memcpy_from_dm``."""
        dm_offset, length = int(dm_offset), int(length)
        self._range(dm_offset, length, "from")
        return bytes(self.memory[dm_offset:dm_offset + length])

    def unimport(self) -> None:
        """``ibv_unimport_dm`` (see :mod:`._imports`)."""
        unimport(self, "DM")

    def close(self) -> None:
        """Free the device memory (``ibv_free_dm``) and the MRs on it; idempotent. An
        imported DM frees the shared memory: the original is closed too."""
        if self.closed:
            return
        VerbsObject.close(self)
        if self._origin is not None:
            self._origin.close()


# ---- the context -------------------------------------------------------------------------------
class Context(_v.Context, PyverbsObject):
    """An opened softrdma device (``ibv_open_device``; pyverbs ``Context``).

    ``Context(name="softrdma_lo")``. ``attr`` (provider attributes) and ``cmid`` are not
    supported (EOPNOTSUPP); ``cmd_fd`` imports a context opened in this process
    (``ibv_import_device``, see :mod:`._imports`): a descriptor from another process
    fails with EOPNOTSUPP.
    """

    def __init__(self, name: str | bytes | None = None, attr: Any = None, cmid: Any = None,
                 cmd_fd: int | None = None, **kwargs: Any) -> None:
        PyverbsObject.__init__(self)
        name = kwargs.pop("name", name)
        if kwargs:
            raise PyverbsUserError(f"Context: unexpected arguments {sorted(kwargs)}")
        if isinstance(name, bytes):
            name = name.decode()
        if attr is not None or cmid is not None:
            raise PyverbsRDMAError("Opening a device with provider attributes or a CMID is "
                                   "not supported by softrdma", errno.EOPNOTSUPP)
        if cmd_fd is not None:  # ibv_import_device (see ._imports)
            import_context(self, cmd_fd)
        elif name is None:
            raise PyverbsUserError("Device name must be provided")
        else:
            try:
                super().__init__(name)
            except DeviceError as exc:
                # the cause in the text: errno 19 alone hid "UDP port 4791 is in use"
                raise PyverbsRDMAError(f"Failed to open device {name}: {exc}",
                                       exc.errno) from exc
            except SoftRdmaError as exc:
                raise rdma_error(f"Failed to open device {name}", exc) from exc
        self.num_comp_vectors = 1
        self._dms: weakref.WeakSet[DM] = weakref.WeakSet()
        try:
            self._ifindex = socket.if_nametoindex(self.netdev) if self.netdev else 0
        except OSError:
            self._ifindex = 0

    @property
    def cmd_fd(self) -> int:
        """The descriptor that stands for the opened device (its async-event fd)."""
        self._check()
        return self.async_fileno()

    @property
    def context(self) -> Context:
        return self

    # ---- device -------------------------------------------------------------------------------
    def query_device(self) -> DeviceAttr:  # type: ignore[override]
        """``ibv_query_device``."""
        with translate("Failed to query device"):
            a = super().query_device()
        return device_attr(a)

    def query_device_ex(self, ex_input: QueryDeviceExInput | None = None) -> DeviceAttrEx:
        """``ibv_query_device_ex``. On-demand paging is supported, implicit ODP
        included, for RC, UC, UD and XRC (softrdma never pins memory; see
        :mod:`softrdma.compat.pyverbs.mr`); device memory up to :data:`MAX_DM_SIZE`; no
        TSO, RSS or tag matching (rxe's answers)."""
        orig = self.query_device()
        return DeviceAttrEx(
            orig_attr=orig, comp_mask=0,
            odp_caps=ODPCaps(general_caps=ODP_GENERAL_CAPS, rc_odp_caps=ODP_RC_CAPS,
                             uc_odp_caps=ODP_UC_CAPS, ud_odp_caps=ODP_UD_CAPS,
                             xrc_odp_caps=ODP_XRC_CAPS),
            completion_timestamp_mask=COMPLETION_TIMESTAMP_MASK,
            hca_core_clock=HCA_CORE_CLOCK_KHZ,
            device_cap_flags_ex=orig.device_cap_flags,
            tso_caps=TSOCaps(), rss_caps=RSSCaps(), max_wq_type_rq=0,
            packet_pacing_caps=PacketPacingCaps(), raw_packet_caps=0, tm_caps=TMCaps(),
            cq_mod_caps=CQModerationCaps(), max_dm_size=MAX_DM_SIZE, pci_atomic_caps=PCIAtomicCaps(),
            phys_port_cnt_ex=orig.phys_port_cnt)

    def query_rt_values_ex(self, comp_mask: int = int(e.IBV_VALUES_MASK_RAW_CLOCK)
                           ) -> tuple[int, int]:
        """``ibv_query_rt_values_ex``: (seconds, nanoseconds) of the completion clock
        (``CLOCK_MONOTONIC`` ns, all in the nanoseconds as the mlx5 provider gives its
        own; :mod:`softrdma.verbs.cq`)."""
        if comp_mask & ~int(e.IBV_VALUES_MASK_RAW_CLOCK) or not comp_mask:
            raise PyverbsRDMAError("Failed to query real time values", errno.EINVAL)
        return 0, completion_clock()

    # ---- port ----------------------------------------------------------------------------------
    def query_port(self, port_num: int = 1) -> PortAttr:  # type: ignore[override]
        """``ibv_query_port``; a port other than 1 fails with EINVAL."""
        with translate("Failed to query port"):
            p = super().query_port(port_num)
        return PortAttr(
            state=p.state, max_mtu=p.max_mtu, active_mtu=p.active_mtu, gid_tbl_len=GID_TABLE_LEN,
            port_cap_flags=p.port_cap_flags, max_msg_sz=p.max_msg_sz,
            bad_pkey_cntr=p.bad_pkey_cntr, qkey_viol_cntr=p.qkey_viol_cntr,
            pkey_tbl_len=p.pkey_tbl_len, lid=p.lid, sm_lid=p.sm_lid, lmc=p.lmc,
            max_vl_num=p.max_vl_num, sm_sl=p.sm_sl, subnet_timeout=p.subnet_timeout,
            init_type_reply=p.init_type_reply, active_width=p.active_width,
            active_speed=p.active_speed, phys_state=p.phys_state, link_layer=p.link_layer,
            flags=p.flags, port_cap_flags2=p.port_cap_flags2)

    def query_pkey(self, port_num: int = 1, index: int = 0) -> int:
        """``ibv_query_pkey``."""
        with translate("Failed to query pkey"):
            return int(super().query_pkey(port_num, index))

    def _gid_raw(self, port_num: int, index: int) -> bytes | None:
        """The GID at ``index`` (None for an empty entry); EINVAL outside the table."""
        if port_num != 1:
            raise PyverbsRDMAError("Failed to query gid", errno.EINVAL)
        if not isinstance(index, int) or not 0 <= index < GID_TABLE_LEN:
            raise PyverbsRDMAError(f"Failed to query gid {index}", errno.EINVAL)
        self._check()
        gids = self.port.gids
        return bytes(gids[index]) if index < len(gids) else None

    def query_gid(self, port_num: int = 1, index: int = 0) -> Any:
        """``ibv_query_gid``: an empty entry reads as the zero GID."""
        raw = self._gid_raw(port_num, index)
        return GID(raw if raw is not None else bytes(16))

    def _gid_type(self, index: int) -> int:
        """``enum ibv_gid_type`` of entry ``index`` (RoCE v1 or v2, Annex A16)."""
        types = self.port.gid_types
        return int(types[index]) if index < len(types) else _IB_GID_TYPE_ROCE_V2

    def query_gid_type(self, port_num: int = 1, index: int = 0) -> int:
        """``ibv_query_gid_type`` (``enum ibv_gid_type_sysfs``): "IB/RoCE v1" or "RoCE v2"."""
        if self._gid_raw(port_num, index) is None:
            raise PyverbsRDMAError("Failed to query gid type", errno.ENODATA)
        if self._gid_type(index) == _IB_GID_TYPE_ROCE_V1:
            return int(e.ibv_gid_type_sysfs.IBV_GID_TYPE_SYSFS_IB_ROCE_V1)
        return int(e.ibv_gid_type_sysfs.IBV_GID_TYPE_SYSFS_ROCE_V2)

    def query_gid_ex(self, port_num: int = 1, gid_index: int = 0, flags: int = 0) -> GIDEntry:
        """``ibv_query_gid_ex``: ENODATA for an empty entry, EINVAL outside the table."""
        if flags:
            raise PyverbsRDMAError("Failed to query gid ex", errno.EINVAL)
        raw = self._gid_raw(port_num, gid_index)
        if raw is None:
            raise PyverbsRDMAError(f"Failed to query gid {gid_index} of port {port_num}",
                                   errno.ENODATA)
        return GIDEntry(raw, gid_index, port_num, self._gid_type(gid_index), self._ifindex)

    def query_gid_table(self, max_entries: int, flags: int = 0) -> list[GIDEntry]:
        """``ibv_query_gid_table``: the populated entries; a buffer smaller than them
        (or flags) gives ``-EINVAL`` (the function's negative return, as pyverbs reports)."""
        self._check()
        gids = self.port.gids
        if flags or not isinstance(max_entries, int) or max_entries < len(gids):
            raise PyverbsRDMAError("Failed to query gid tables of the device", -errno.EINVAL)
        return [GIDEntry(bytes(g), i, 1, self._gid_type(i), self._ifindex)
                for i, g in enumerate(gids)]

    # ---- events -----------------------------------------------------------------------------
    def get_async_event(self, timeout: float | None = None) -> AsyncEvent:  # type: ignore[override]
        """``ibv_get_async_event`` (blocks until an event arrives; ``timeout`` is a
        softrdma addition)."""
        with translate("Failed to get async event"):
            ev = super().get_async_event(timeout)
        return AsyncEvent(self, ev)

    def close(self) -> None:
        """Close the context and every object created on it (``ibv_close_device``)."""
        super().close()
