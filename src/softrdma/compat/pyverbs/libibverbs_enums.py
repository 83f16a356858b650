"""libibverbs enumerations as pyverbs exposes them (``pyverbs.enums``).

One source per value: the enums softrdma itself uses (``ibv_qp_type``, ``ibv_access_flags``,
``ibv_wc_status``... and their members as module-level names) are those of
:mod:`softrdma.enums`, re-exported here; this module defines only the enums of rdma-core's
``libibverbs_enums.pxd`` that softrdma.enums does not have, each an ``IntEnum`` with the
members pyverbs lists, in its order, with the values of ``<infiniband/verbs.h>``
(tests/compat/test_pyverbs_enums.py re-parses the installed header and checks each one).
Each member is also a module-level name, as in pyverbs (``e.IBV_QPT_RC``).
"""

# The enums below were generated from the enum lists of rdma-core 44's pyverbs (see the
# module docstring); do not edit them by hand.

from enum import IntEnum

from softrdma.enums import *  # noqa: F403

from ._enum_names import export_members

__all__: list[str] = []


class ibv_counter_description(IntEnum):
    IBV_COUNTER_PACKETS = 0
    IBV_COUNTER_BYTES = 1


class ibv_create_cq_attr_flags(IntEnum):
    IBV_CREATE_CQ_ATTR_SINGLE_THREADED = 1
    IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN = 2


class ibv_flow_attr_type(IntEnum):
    IBV_FLOW_ATTR_NORMAL = 0
    IBV_FLOW_ATTR_ALL_DEFAULT = 1
    IBV_FLOW_ATTR_MC_DEFAULT = 2
    IBV_FLOW_ATTR_SNIFFER = 3


class ibv_flow_flags(IntEnum):
    IBV_FLOW_ATTR_FLAGS_DONT_TRAP = 2
    IBV_FLOW_ATTR_FLAGS_EGRESS = 4


class ibv_flow_spec_type(IntEnum):
    IBV_FLOW_SPEC_ETH = 32
    IBV_FLOW_SPEC_IPV4 = 48
    IBV_FLOW_SPEC_IPV6 = 49
    IBV_FLOW_SPEC_IPV4_EXT = 50
    IBV_FLOW_SPEC_ESP = 52
    IBV_FLOW_SPEC_TCP = 64
    IBV_FLOW_SPEC_UDP = 65
    IBV_FLOW_SPEC_VXLAN_TUNNEL = 80
    IBV_FLOW_SPEC_GRE = 81
    IBV_FLOW_SPEC_MPLS = 96
    IBV_FLOW_SPEC_INNER = 256
    IBV_FLOW_SPEC_ACTION_TAG = 4096
    IBV_FLOW_SPEC_ACTION_DROP = 4097
    IBV_FLOW_SPEC_ACTION_HANDLE = 4098
    IBV_FLOW_SPEC_ACTION_COUNT = 4099


class ibv_fork_status(IntEnum):
    IBV_FORK_DISABLED = 0
    IBV_FORK_ENABLED = 1
    IBV_FORK_UNNEEDED = 2


class ibv_gid_type_sysfs(IntEnum):
    IBV_GID_TYPE_SYSFS_IB_ROCE_V1 = 0
    IBV_GID_TYPE_SYSFS_ROCE_V2 = 1


class ibv_ops_flags(IntEnum):
    IBV_OPS_SIGNALED = 1
    IBV_OPS_TM_SYNC = 2


class ibv_ops_wr_opcode(IntEnum):
    IBV_WR_TAG_ADD = 0
    IBV_WR_TAG_DEL = 1
    IBV_WR_TAG_SYNC = 2


class ibv_parent_domain_init_attr_mask(IntEnum):
    IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS = 1
    IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT = 2


class ibv_port_cap_flags2(IntEnum):
    IBV_PORT_SET_NODE_DESC_SUP = 1
    IBV_PORT_INFO_EXT_SUP = 2
    IBV_PORT_VIRT_SUP = 4
    IBV_PORT_SWITCH_PORT_STATE_TABLE_SUP = 8
    IBV_PORT_LINK_WIDTH_2X_SUP = 16
    IBV_PORT_LINK_SPEED_HDR_SUP = 32
    IBV_PORT_LINK_SPEED_NDR_SUP = 1024


class ibv_qp_create_flags(IntEnum):
    IBV_QP_CREATE_BLOCK_SELF_MCAST_LB = 2
    IBV_QP_CREATE_SCATTER_FCS = 256
    IBV_QP_CREATE_CVLAN_STRIPPING = 512
    IBV_QP_CREATE_SOURCE_QPN = 1024
    IBV_QP_CREATE_PCI_WRITE_END_PADDING = 2048


class ibv_read_counters_flags(IntEnum):
    IBV_READ_COUNTERS_ATTR_PREFER_CACHED = 1


class ibv_rereg_mr_err_code(IntEnum):
    IBV_REREG_MR_ERR_INPUT = -1
    IBV_REREG_MR_ERR_DONT_FORK_NEW = -2
    IBV_REREG_MR_ERR_DO_FORK_OLD = -3
    IBV_REREG_MR_ERR_CMD = -4
    IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW = -5


class ibv_rx_hash_fields(IntEnum):
    IBV_RX_HASH_SRC_IPV4 = 1
    IBV_RX_HASH_DST_IPV4 = 2
    IBV_RX_HASH_SRC_IPV6 = 4
    IBV_RX_HASH_DST_IPV6 = 8
    IBV_RX_HASH_SRC_PORT_TCP = 16
    IBV_RX_HASH_DST_PORT_TCP = 32
    IBV_RX_HASH_SRC_PORT_UDP = 64
    IBV_RX_HASH_DST_PORT_UDP = 128


class ibv_rx_hash_function_flags(IntEnum):
    IBV_RX_HASH_FUNC_TOEPLITZ = 1


class ibv_srq_init_attr_mask(IntEnum):
    IBV_SRQ_INIT_ATTR_TYPE = 1
    IBV_SRQ_INIT_ATTR_PD = 2
    IBV_SRQ_INIT_ATTR_XRCD = 4
    IBV_SRQ_INIT_ATTR_CQ = 8
    IBV_SRQ_INIT_ATTR_TM = 16


class ibv_tm_cap_flags(IntEnum):
    IBV_TM_CAP_RC = 1


class ibv_tmh_op(IntEnum):
    IBV_TMH_NO_TAG = 0
    IBV_TMH_RNDV = 1
    IBV_TMH_FIN = 2
    IBV_TMH_EAGER = 3


class ibv_wq_attr_mask(IntEnum):
    IBV_WQ_ATTR_STATE = 1
    IBV_WQ_ATTR_CURR_STATE = 2
    IBV_WQ_ATTR_FLAGS = 4


class ibv_wq_flags(IntEnum):
    IBV_WQ_FLAGS_CVLAN_STRIPPING = 1
    IBV_WQ_FLAGS_SCATTER_FCS = 2
    IBV_WQ_FLAGS_DELAY_DROP = 4
    IBV_WQ_FLAGS_PCI_WRITE_END_PADDING = 8


class ibv_wq_init_attr_mask(IntEnum):
    IBV_WQ_INIT_ATTR_FLAGS = 1


class ibv_wq_state(IntEnum):
    IBV_WQS_RESET = 0
    IBV_WQS_RDY = 1
    IBV_WQS_ERR = 2
    IBV_WQS_UNKNOWN = 3


class ibv_wq_type(IntEnum):
    IBV_WQT_RQ = 0


IBV_LINK_LAYER_ETHERNET = 2
IBV_LINK_LAYER_INFINIBAND = 1
IBV_LINK_LAYER_UNSPECIFIED = 0
IBV_QPF_GRH_REQUIRED = 1
IBV_WC_STANDARD_FLAGS = 127
_IBV_ADVISE_MR_ADVICE_PREFETCH = 0
_IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT = 2
_IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE = 1
_IBV_ADVISE_MR_FLAG_FLUSH = 1
_IBV_ALLOCATOR_USE_DEFAULT = 18446744073709551615
_IBV_DEVICE_PCI_WRITE_END_PADDING = 68719476736
_IBV_DEVICE_RAW_SCATTER_FCS = 17179869184

__all__ = export_members(globals())
