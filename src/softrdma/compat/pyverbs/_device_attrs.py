"""pyverbs' attribute objects of a device (rdma-core ``pyverbs/device.pyx``): the struct
wrappers ``ibv_device_attr(_ex)``, ``ibv_port_attr``, ``ibv_gid_entry``,
``ibv_alloc_dm_attr`` and the capability groups, and :func:`device_attr`, which gives the
verbs layer's :class:`softrdma.verbs.DeviceAttr` pyverbs' shape (IBA 11.2.1.2 Query HCA).
Re-exported by :mod:`.device`, their pyverbs home.
"""

from __future__ import annotations

from typing import Any

from softrdma import verbs as _v
from softrdma.verbs.limits import MAX_MW

from . import libibverbs_enums as e
from ._device_str import translate_gid_type
from .addr import GID
from .base import PyverbsObject
from .pyverbs_error import PyverbsUserError

__all__ = [
    "DeviceAttr", "DeviceAttrEx", "ODPCaps", "TSOCaps", "RSSCaps", "TMCaps",
    "CQModerationCaps", "PCIAtomicCaps", "PacketPacingCaps", "PortAttr", "GIDEntry",
    "AllocDmAttr", "QueryDeviceExInput", "EXTRA_DEVICE_CAPS", "device_attr",
]


class _Attrs(PyverbsObject):
    """A plain attribute holder (pyverbs' struct wrappers)."""

    _fields: tuple[str, ...] = ()

    def __init__(self, **values: Any) -> None:
        super().__init__()
        for f in self._fields:
            setattr(self, f, values.pop(f, 0))
        if values:
            raise PyverbsUserError(f"{type(self).__name__}: unknown fields {sorted(values)}")

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __str__(self) -> str:
        return "".join(f"{f:28}: {getattr(self, f)}\n" for f in self._fields)


class DeviceAttr(_Attrs):
    """``struct ibv_device_attr``."""

    _fields = (
        "fw_version", "node_guid", "sys_image_guid", "max_mr_size", "page_size_cap",
        "vendor_id", "vendor_part_id", "hw_ver", "max_qp", "max_qp_wr", "device_cap_flags",
        "max_sge", "max_sge_rd", "max_cq", "max_cqe", "max_mr", "max_pd", "max_qp_rd_atom",
        "max_ee_rd_atom", "max_res_rd_atom", "max_qp_init_rd_atom", "max_ee_init_rd_atom",
        "atomic_caps", "max_ee", "max_rdd", "max_mw", "max_raw_ipv6_qps", "max_raw_ethy_qp",
        "max_mcast_grp", "max_mcast_qp_attach", "max_total_mcast_qp_attach", "max_ah",
        "max_fmr", "max_map_per_fmr", "max_srq", "max_srq_wr", "max_srq_sge", "max_pkeys",
        "local_ca_ack_delay", "phys_port_cnt",
    )


class ODPCaps(_Attrs):
    """``struct ibv_odp_caps``."""

    _fields = ("general_caps", "rc_odp_caps", "uc_odp_caps", "ud_odp_caps", "xrc_odp_caps")


class TSOCaps(_Attrs):
    _fields = ("max_tso", "supported_qpts")


class RSSCaps(_Attrs):
    _fields = ("supported_qpts", "max_rwq_indirection_tables",
               "max_rwq_indirection_table_size", "rx_hash_function", "rx_hash_fields_mask")


class TMCaps(_Attrs):
    _fields = ("max_rndv_hdr_size", "max_num_tags", "flags", "max_ops", "max_sge")


class CQModerationCaps(_Attrs):
    _fields = ("max_cq_count", "max_cq_period")


class PCIAtomicCaps(_Attrs):
    _fields = ("fetch_add", "swap", "compare_swap")


class PacketPacingCaps(_Attrs):
    _fields = ("qp_rate_limit_min", "qp_rate_limit_max", "supported_qpts")


class DeviceAttrEx(_Attrs):
    """``struct ibv_device_attr_ex``."""

    _fields = (
        "orig_attr", "comp_mask", "odp_caps", "completion_timestamp_mask", "hca_core_clock",
        "device_cap_flags_ex", "tso_caps", "rss_caps", "max_wq_type_rq", "packet_pacing_caps",
        "raw_packet_caps", "tm_caps", "cq_mod_caps", "max_dm_size", "pci_atomic_caps",
        "phys_port_cnt_ex",
    )


class QueryDeviceExInput(PyverbsObject):
    """``struct ibv_query_device_ex_input`` (comp_mask only)."""

    def __init__(self, comp_mask: int = 0) -> None:
        super().__init__()
        self.comp_mask = comp_mask


class PortAttr(_Attrs):
    """``struct ibv_port_attr``."""

    _fields = (
        "state", "max_mtu", "active_mtu", "gid_tbl_len", "port_cap_flags", "max_msg_sz",
        "bad_pkey_cntr", "qkey_viol_cntr", "pkey_tbl_len", "lid", "sm_lid", "lmc",
        "max_vl_num", "sm_sl", "subnet_timeout", "init_type_reply", "active_width",
        "active_speed", "phys_state", "link_layer", "flags", "port_cap_flags2",
    )


class GIDEntry(PyverbsObject):
    """``struct ibv_gid_entry`` (``ibv_query_gid_ex`` / ``ibv_query_gid_table``)."""

    def __init__(self, raw: bytes, gid_index: int, port_num: int, gid_type: int,
                 ndev_ifindex: int) -> None:
        super().__init__()
        self.gid_subnet_prefix = int.from_bytes(raw[:8], "little")
        self.gid_interface_id = int.from_bytes(raw[8:], "little")
        self.gid_index = gid_index
        self.port_num = port_num
        self.gid_type = gid_type
        self.ndev_ifindex = ndev_ifindex
        self._raw = raw

    def gid_str(self) -> str:
        return GID(self._raw).gid

    def __str__(self) -> str:
        return (f"GID {self.gid_str()}, index {self.gid_index}, port {self.port_num}, "
                f"type {translate_gid_type(self.gid_type)}, ifindex {self.ndev_ifindex}")


class AllocDmAttr(PyverbsObject):
    """``struct ibv_alloc_dm_attr``."""

    def __init__(self, length: int = 0, log_align_req: int = 0, comp_mask: int = 0) -> None:
        super().__init__()
        self.length = length
        self.log_align_req = log_align_req
        self.comp_mask = comp_mask



#: Capabilities the compatibility layer adds to the verbs layer's: memory windows of type
#: 1 and 2B (:mod:`softrdma.ib.mw`), as rxe reports them.
EXTRA_DEVICE_CAPS = int(e.IBV_DEVICE_MEM_WINDOW | e.IBV_DEVICE_MEM_WINDOW_TYPE_2B)


def device_attr(a: _v.DeviceAttr) -> DeviceAttr:
    caps = a.device_cap_flags | EXTRA_DEVICE_CAPS
    return DeviceAttr(
        fw_version=a.fw_ver, node_guid=a.node_guid, sys_image_guid=a.sys_image_guid,
        max_mr_size=a.max_mr_size, page_size_cap=a.page_size_cap, vendor_id=a.vendor_id,
        vendor_part_id=a.vendor_part_id, hw_ver=a.hw_ver, max_qp=a.max_qp,
        max_qp_wr=a.max_qp_wr, device_cap_flags=caps, max_sge=a.max_sge,
        max_sge_rd=a.max_sge_rd, max_cq=a.max_cq, max_cqe=a.max_cqe, max_mr=a.max_mr,
        max_pd=a.max_pd, max_qp_rd_atom=a.max_qp_rd_atom, max_ee_rd_atom=a.max_ee_rd_atom,
        max_res_rd_atom=a.max_res_rd_atom, max_qp_init_rd_atom=a.max_qp_init_rd_atom,
        max_ee_init_rd_atom=a.max_ee_init_rd_atom, atomic_caps=a.atomic_caps, max_ee=a.max_ee,
        max_rdd=a.max_rdd, max_mw=max(a.max_mw, MAX_MW), max_raw_ipv6_qps=a.max_raw_ipv6_qp,
        max_raw_ethy_qp=a.max_raw_ethy_qp, max_mcast_grp=a.max_mcast_grp,
        max_mcast_qp_attach=a.max_mcast_qp_attach,
        max_total_mcast_qp_attach=a.max_total_mcast_qp_attach, max_ah=a.max_ah,
        max_fmr=a.max_fmr, max_map_per_fmr=a.max_map_per_fmr, max_srq=a.max_srq,
        max_srq_wr=a.max_srq_wr, max_srq_sge=a.max_srq_sge, max_pkeys=a.max_pkeys,
        local_ca_ack_delay=a.local_ca_ack_delay, phys_port_cnt=a.phys_port_cnt)

