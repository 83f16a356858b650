"""What a device reports (IBA 11.2.1.2 Query HCA, 11.2.2 Query Port): rxe's limits
(``rxe_param.h``), capability flags, ``struct ibv_device_attr`` / ``ibv_port_attr``, a
device list entry (:class:`DeviceInfo`), the async event record, and the netdev facts a
device takes (its IB MTU, its node GUID). Re-exported by :mod:`.device`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import enums as e
from ..drivers.host import registry
from ..errors import DeviceError
from .limits import (
    MAX_AH,
    MAX_CQ,
    MAX_MR,
    MAX_PD,
    MAX_QP,
    MAX_SRQ,
)

# rxe_param.h (device limits softrdma reports and enforces; the object counts: .limits)
MAX_QP_WR = 0x4000
MAX_SGE = 32
MAX_INLINE_DATA = 400
MAX_CQE = (1 << 15) - 1
#: GID table entries of a RoCE port (rxe ``RXE_PORT_GID_TBL_LEN``): the netdev's
#: addresses first, the rest empty; an iWARP port's table is its populated entries (siw)
GID_TABLE_LEN = 1024
MAX_QP_RD_ATOM = 128
MAX_QP_INIT_RD_ATOM = 128
MAX_RES_RD_ATOM = 0x3F000
MAX_MCAST_GRP = 8192
MAX_MCAST_QP_ATTACH = 56
MAX_TOTAL_MCAST_QP_ATTACH = 0x70000
MAX_SRQ_WR = 0x4000
MAX_SRQ_SGE = 27
MAX_MSG_SZ = 1 << 31  # 2^31 bytes, IBA ch. 9 (as rxe)
RXE_MAX_HDR_LENGTH = 80  # rxe: Ethernet MTU minus this is the largest IB MTU that fits
LOCAL_CA_ACK_DELAY = 15
VENDOR_ID = 0xFFFFFF  # rxe's vendor id

DEVICE_CAP_FLAGS = (
    e.IBV_DEVICE_BAD_PKEY_CNTR | e.IBV_DEVICE_BAD_QKEY_CNTR | e.IBV_DEVICE_CHANGE_PHY_PORT
    | e.IBV_DEVICE_UD_AV_PORT_ENFORCE | e.IBV_DEVICE_PORT_ACTIVE_EVENT
    | e.IBV_DEVICE_SYS_IMAGE_GUID | e.IBV_DEVICE_RC_RNR_NAK_GEN | e.IBV_DEVICE_SRQ_RESIZE
)
PORT_CAP_FLAGS = e.IBV_PORT_CM_SUP | e.IBV_PORT_IP_BASED_GIDS
#: memory windows of type 1 and 2B on the IB transport (softrdma.ib.mw; rxe reports them,
#: siw none)
MW_CAP_FLAGS = e.IBV_DEVICE_MEM_WINDOW | e.IBV_DEVICE_MEM_WINDOW_TYPE_2B
#: the XRC transport on the IB transport (softrdma.ib.xrc; rxe has none)
XRC_CAP_FLAGS = e.IBV_DEVICE_XRC


def mtu_enum_for_netdev_mtu(mtu: int) -> int:
    """The IB MTU enum that fits a netdev MTU (rxe ``eth_mtu_int_to_enum``)."""
    payload = mtu - RXE_MAX_HDR_LENGTH
    for enum, size in ((5, 4096), (4, 2048), (3, 1024), (2, 512), (1, 256)):
        if payload >= size:
            return enum
    raise DeviceError(f"netdev MTU {mtu} is too small for RoCE (needs >= {256 + RXE_MAX_HDR_LENGTH})")


def guid_from_mac(mac: bytes) -> int:
    """EUI-64 from a MAC (rxe ``rxe_node_guid``: addrconf_addr_eui48)."""
    if len(mac) != 6:
        mac = bytes(6)
    eui = bytes([mac[0] ^ 2, mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]])
    return int.from_bytes(eui, "big")


@dataclass(slots=True)
class DeviceInfo:
    """One entry of :func:`get_device_list`."""

    name: str
    netdev: str | None = None
    type: str = "roce"
    node_guid: int = 0
    udp_port: int = 4791
    ips: tuple[bytes, ...] = ()
    record: registry.DeviceRecord | None = None  # the registry's own record


@dataclass(slots=True)
class DeviceAttr:
    """``struct ibv_device_attr`` (values as rxe reports them, ``rxe_param.h``;
    :meth:`Context.query_device` gives the enforced object limits, :mod:`.limits`, and
    the ``max_mr_size`` this host can back)."""

    fw_ver: str = "0.0.0"
    node_guid: int = 0
    sys_image_guid: int = 0
    max_mr_size: int = (1 << 64) - 1
    page_size_cap: int = 0xFFFFF000
    vendor_id: int = VENDOR_ID
    vendor_part_id: int = 0
    hw_ver: int = 0
    max_qp: int = MAX_QP
    max_qp_wr: int = MAX_QP_WR
    device_cap_flags: int = int(DEVICE_CAP_FLAGS)
    max_sge: int = MAX_SGE
    max_sge_rd: int = MAX_SGE
    max_cq: int = MAX_CQ
    max_cqe: int = MAX_CQE
    max_mr: int = MAX_MR
    max_pd: int = MAX_PD
    max_qp_rd_atom: int = MAX_QP_RD_ATOM
    max_ee_rd_atom: int = 0
    max_res_rd_atom: int = MAX_RES_RD_ATOM
    max_qp_init_rd_atom: int = MAX_QP_INIT_RD_ATOM
    max_ee_init_rd_atom: int = 0
    atomic_caps: int = int(e.IBV_ATOMIC_HCA)
    max_ee: int = 0
    max_rdd: int = 0
    max_mw: int = 0
    max_raw_ipv6_qp: int = 0
    max_raw_ethy_qp: int = 0
    max_mcast_grp: int = MAX_MCAST_GRP
    max_mcast_qp_attach: int = MAX_MCAST_QP_ATTACH
    max_total_mcast_qp_attach: int = MAX_TOTAL_MCAST_QP_ATTACH
    max_ah: int = MAX_AH
    max_fmr: int = 0
    max_map_per_fmr: int = 0
    max_srq: int = MAX_SRQ
    max_srq_wr: int = MAX_SRQ_WR
    max_srq_sge: int = MAX_SRQ_SGE
    max_pkeys: int = 1
    local_ca_ack_delay: int = LOCAL_CA_ACK_DELAY
    phys_port_cnt: int = 1
    max_inline_data: int = MAX_INLINE_DATA


@dataclass(slots=True)
class PortAttr:
    """``struct ibv_port_attr`` of port 1."""

    state: int = int(e.IBV_PORT_ACTIVE)
    max_mtu: int = int(e.IBV_MTU_4096)
    active_mtu: int = int(e.IBV_MTU_1024)
    gid_tbl_len: int = 0
    port_cap_flags: int = int(PORT_CAP_FLAGS)
    max_msg_sz: int = MAX_MSG_SZ
    bad_pkey_cntr: int = 0
    qkey_viol_cntr: int = 0
    pkey_tbl_len: int = 1
    lid: int = 0
    sm_lid: int = 0
    lmc: int = 0
    max_vl_num: int = 1
    sm_sl: int = 0
    subnet_timeout: int = 0
    init_type_reply: int = 0
    active_width: int = 1   # IB_WIDTH_1X
    active_speed: int = 1   # SDR (ib_get_eth_speed for an unknown/slow netdev)
    phys_state: int = 5     # LINK_UP
    link_layer: int = 2     # IBV_LINK_LAYER_ETHERNET
    flags: int = 0
    port_cap_flags2: int = 0


@dataclass(slots=True)
class AsyncEvent:
    """An asynchronous event (``struct ibv_async_event``): ``element`` is the QP, CQ or
    SRQ it is about (None for device events)."""

    event_type: int
    element: object = None
    extra: dict[str, object] = field(default_factory=dict)

