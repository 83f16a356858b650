"""Queue pairs and shared receive queues: QP types, states, attribute masks, work request
opcodes and send flags, SRQ types and masks, XRC domains (verbs.h: ``ibv_create_qp_ex``,
``ibv_modify_qp``, ``ibv_post_send``, ``ibv_create_srq_ex``, ``ibv_open_xrcd``).

Values of rdma-core's <infiniband/verbs.h>, generated from the header (see :mod:`softrdma.enums`).
"""

from enum import IntEnum, IntFlag


class ibv_qp_type(IntEnum):
    IBV_QPT_RC = 2
    IBV_QPT_UC = 3
    IBV_QPT_UD = 4
    IBV_QPT_RAW_PACKET = 8
    IBV_QPT_XRC_SEND = 9
    IBV_QPT_XRC_RECV = 10
    IBV_QPT_DRIVER = 255


class ibv_qp_attr_mask(IntFlag):
    IBV_QP_STATE = 1
    IBV_QP_CUR_STATE = 2
    IBV_QP_EN_SQD_ASYNC_NOTIFY = 4
    IBV_QP_ACCESS_FLAGS = 8
    IBV_QP_PKEY_INDEX = 16
    IBV_QP_PORT = 32
    IBV_QP_QKEY = 64
    IBV_QP_AV = 128
    IBV_QP_PATH_MTU = 256
    IBV_QP_TIMEOUT = 512
    IBV_QP_RETRY_CNT = 1024
    IBV_QP_RNR_RETRY = 2048
    IBV_QP_RQ_PSN = 4096
    IBV_QP_MAX_QP_RD_ATOMIC = 8192
    IBV_QP_ALT_PATH = 16384
    IBV_QP_MIN_RNR_TIMER = 32768
    IBV_QP_SQ_PSN = 65536
    IBV_QP_MAX_DEST_RD_ATOMIC = 131072
    IBV_QP_PATH_MIG_STATE = 262144
    IBV_QP_CAP = 524288
    IBV_QP_DEST_QPN = 1048576
    IBV_QP_RATE_LIMIT = 33554432


class ibv_qp_state(IntEnum):
    IBV_QPS_RESET = 0
    IBV_QPS_INIT = 1
    IBV_QPS_RTR = 2
    IBV_QPS_RTS = 3
    IBV_QPS_SQD = 4
    IBV_QPS_SQE = 5
    IBV_QPS_ERR = 6
    IBV_QPS_UNKNOWN = 7


class ibv_mig_state(IntEnum):
    IBV_MIG_MIGRATED = 0
    IBV_MIG_REARM = 1
    IBV_MIG_ARMED = 2


class ibv_wr_opcode(IntEnum):
    IBV_WR_RDMA_WRITE = 0
    IBV_WR_RDMA_WRITE_WITH_IMM = 1
    IBV_WR_SEND = 2
    IBV_WR_SEND_WITH_IMM = 3
    IBV_WR_RDMA_READ = 4
    IBV_WR_ATOMIC_CMP_AND_SWP = 5
    IBV_WR_ATOMIC_FETCH_AND_ADD = 6
    IBV_WR_LOCAL_INV = 7
    IBV_WR_BIND_MW = 8
    IBV_WR_SEND_WITH_INV = 9
    IBV_WR_TSO = 10
    IBV_WR_DRIVER1 = 11
    IBV_WR_ATOMIC_WRITE = 15


class ibv_send_flags(IntFlag):
    IBV_SEND_FENCE = 1
    IBV_SEND_SIGNALED = 2
    IBV_SEND_SOLICITED = 4
    IBV_SEND_INLINE = 8
    IBV_SEND_IP_CSUM = 16


class ibv_srq_attr_mask(IntFlag):
    IBV_SRQ_MAX_WR = 1
    IBV_SRQ_LIMIT = 2


class ibv_srq_type(IntEnum):
    IBV_SRQT_BASIC = 0
    IBV_SRQT_XRC = 1
    IBV_SRQT_TM = 2


class ibv_qp_init_attr_mask(IntFlag):
    IBV_QP_INIT_ATTR_PD = 1
    IBV_QP_INIT_ATTR_XRCD = 2
    IBV_QP_INIT_ATTR_CREATE_FLAGS = 4
    IBV_QP_INIT_ATTR_MAX_TSO_HEADER = 8
    IBV_QP_INIT_ATTR_IND_TABLE = 16
    IBV_QP_INIT_ATTR_RX_HASH = 32
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS = 64


class ibv_qp_create_send_ops_flags(IntFlag):
    IBV_QP_EX_WITH_RDMA_WRITE = 1
    IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM = 2
    IBV_QP_EX_WITH_SEND = 4
    IBV_QP_EX_WITH_SEND_WITH_IMM = 8
    IBV_QP_EX_WITH_RDMA_READ = 16
    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP = 32
    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD = 64
    IBV_QP_EX_WITH_LOCAL_INV = 128
    IBV_QP_EX_WITH_BIND_MW = 256
    IBV_QP_EX_WITH_SEND_WITH_INV = 512
    IBV_QP_EX_WITH_TSO = 1024
    IBV_QP_EX_WITH_ATOMIC_WRITE = 4096


class ibv_xrcd_init_attr_mask(IntFlag):
    IBV_XRCD_INIT_ATTR_FD = 1
    IBV_XRCD_INIT_ATTR_OFLAGS = 2
    IBV_XRCD_INIT_ATTR_RESERVED = 4


IBV_QPT_RC = ibv_qp_type.IBV_QPT_RC
IBV_QPT_UC = ibv_qp_type.IBV_QPT_UC
IBV_QPT_UD = ibv_qp_type.IBV_QPT_UD
IBV_QPT_RAW_PACKET = ibv_qp_type.IBV_QPT_RAW_PACKET
IBV_QPT_XRC_SEND = ibv_qp_type.IBV_QPT_XRC_SEND
IBV_QPT_XRC_RECV = ibv_qp_type.IBV_QPT_XRC_RECV
IBV_QPT_DRIVER = ibv_qp_type.IBV_QPT_DRIVER
IBV_QP_STATE = ibv_qp_attr_mask.IBV_QP_STATE
IBV_QP_CUR_STATE = ibv_qp_attr_mask.IBV_QP_CUR_STATE
IBV_QP_EN_SQD_ASYNC_NOTIFY = ibv_qp_attr_mask.IBV_QP_EN_SQD_ASYNC_NOTIFY
IBV_QP_ACCESS_FLAGS = ibv_qp_attr_mask.IBV_QP_ACCESS_FLAGS
IBV_QP_PKEY_INDEX = ibv_qp_attr_mask.IBV_QP_PKEY_INDEX
IBV_QP_PORT = ibv_qp_attr_mask.IBV_QP_PORT
IBV_QP_QKEY = ibv_qp_attr_mask.IBV_QP_QKEY
IBV_QP_AV = ibv_qp_attr_mask.IBV_QP_AV
IBV_QP_PATH_MTU = ibv_qp_attr_mask.IBV_QP_PATH_MTU
IBV_QP_TIMEOUT = ibv_qp_attr_mask.IBV_QP_TIMEOUT
IBV_QP_RETRY_CNT = ibv_qp_attr_mask.IBV_QP_RETRY_CNT
IBV_QP_RNR_RETRY = ibv_qp_attr_mask.IBV_QP_RNR_RETRY
IBV_QP_RQ_PSN = ibv_qp_attr_mask.IBV_QP_RQ_PSN
IBV_QP_MAX_QP_RD_ATOMIC = ibv_qp_attr_mask.IBV_QP_MAX_QP_RD_ATOMIC
IBV_QP_ALT_PATH = ibv_qp_attr_mask.IBV_QP_ALT_PATH
IBV_QP_MIN_RNR_TIMER = ibv_qp_attr_mask.IBV_QP_MIN_RNR_TIMER
IBV_QP_SQ_PSN = ibv_qp_attr_mask.IBV_QP_SQ_PSN
IBV_QP_MAX_DEST_RD_ATOMIC = ibv_qp_attr_mask.IBV_QP_MAX_DEST_RD_ATOMIC
IBV_QP_PATH_MIG_STATE = ibv_qp_attr_mask.IBV_QP_PATH_MIG_STATE
IBV_QP_CAP = ibv_qp_attr_mask.IBV_QP_CAP
IBV_QP_DEST_QPN = ibv_qp_attr_mask.IBV_QP_DEST_QPN
IBV_QP_RATE_LIMIT = ibv_qp_attr_mask.IBV_QP_RATE_LIMIT
IBV_QPS_RESET = ibv_qp_state.IBV_QPS_RESET
IBV_QPS_INIT = ibv_qp_state.IBV_QPS_INIT
IBV_QPS_RTR = ibv_qp_state.IBV_QPS_RTR
IBV_QPS_RTS = ibv_qp_state.IBV_QPS_RTS
IBV_QPS_SQD = ibv_qp_state.IBV_QPS_SQD
IBV_QPS_SQE = ibv_qp_state.IBV_QPS_SQE
IBV_QPS_ERR = ibv_qp_state.IBV_QPS_ERR
IBV_QPS_UNKNOWN = ibv_qp_state.IBV_QPS_UNKNOWN
IBV_MIG_MIGRATED = ibv_mig_state.IBV_MIG_MIGRATED
IBV_MIG_REARM = ibv_mig_state.IBV_MIG_REARM
IBV_MIG_ARMED = ibv_mig_state.IBV_MIG_ARMED
IBV_WR_RDMA_WRITE = ibv_wr_opcode.IBV_WR_RDMA_WRITE
IBV_WR_RDMA_WRITE_WITH_IMM = ibv_wr_opcode.IBV_WR_RDMA_WRITE_WITH_IMM
IBV_WR_SEND = ibv_wr_opcode.IBV_WR_SEND
IBV_WR_SEND_WITH_IMM = ibv_wr_opcode.IBV_WR_SEND_WITH_IMM
IBV_WR_RDMA_READ = ibv_wr_opcode.IBV_WR_RDMA_READ
IBV_WR_ATOMIC_CMP_AND_SWP = ibv_wr_opcode.IBV_WR_ATOMIC_CMP_AND_SWP
IBV_WR_ATOMIC_FETCH_AND_ADD = ibv_wr_opcode.IBV_WR_ATOMIC_FETCH_AND_ADD
IBV_WR_LOCAL_INV = ibv_wr_opcode.IBV_WR_LOCAL_INV
IBV_WR_BIND_MW = ibv_wr_opcode.IBV_WR_BIND_MW
IBV_WR_SEND_WITH_INV = ibv_wr_opcode.IBV_WR_SEND_WITH_INV
IBV_WR_TSO = ibv_wr_opcode.IBV_WR_TSO
IBV_WR_DRIVER1 = ibv_wr_opcode.IBV_WR_DRIVER1
IBV_WR_ATOMIC_WRITE = ibv_wr_opcode.IBV_WR_ATOMIC_WRITE
IBV_SEND_FENCE = ibv_send_flags.IBV_SEND_FENCE
IBV_SEND_SIGNALED = ibv_send_flags.IBV_SEND_SIGNALED
IBV_SEND_SOLICITED = ibv_send_flags.IBV_SEND_SOLICITED
IBV_SEND_INLINE = ibv_send_flags.IBV_SEND_INLINE
IBV_SEND_IP_CSUM = ibv_send_flags.IBV_SEND_IP_CSUM
IBV_SRQ_MAX_WR = ibv_srq_attr_mask.IBV_SRQ_MAX_WR
IBV_SRQ_LIMIT = ibv_srq_attr_mask.IBV_SRQ_LIMIT
IBV_SRQT_BASIC = ibv_srq_type.IBV_SRQT_BASIC
IBV_SRQT_XRC = ibv_srq_type.IBV_SRQT_XRC
IBV_SRQT_TM = ibv_srq_type.IBV_SRQT_TM
IBV_QP_INIT_ATTR_PD = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_PD
IBV_QP_INIT_ATTR_XRCD = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_XRCD
IBV_QP_INIT_ATTR_CREATE_FLAGS = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_CREATE_FLAGS
IBV_QP_INIT_ATTR_MAX_TSO_HEADER = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_MAX_TSO_HEADER
IBV_QP_INIT_ATTR_IND_TABLE = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_IND_TABLE
IBV_QP_INIT_ATTR_RX_HASH = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_RX_HASH
IBV_QP_INIT_ATTR_SEND_OPS_FLAGS = ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
IBV_QP_EX_WITH_RDMA_WRITE = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_RDMA_WRITE
IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
IBV_QP_EX_WITH_SEND = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_SEND
IBV_QP_EX_WITH_SEND_WITH_IMM = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_SEND_WITH_IMM
IBV_QP_EX_WITH_RDMA_READ = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_RDMA_READ
IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
IBV_QP_EX_WITH_LOCAL_INV = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_LOCAL_INV
IBV_QP_EX_WITH_BIND_MW = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_BIND_MW
IBV_QP_EX_WITH_SEND_WITH_INV = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_SEND_WITH_INV
IBV_QP_EX_WITH_TSO = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_TSO
IBV_QP_EX_WITH_ATOMIC_WRITE = ibv_qp_create_send_ops_flags.IBV_QP_EX_WITH_ATOMIC_WRITE
IBV_XRCD_INIT_ATTR_FD = ibv_xrcd_init_attr_mask.IBV_XRCD_INIT_ATTR_FD
IBV_XRCD_INIT_ATTR_OFLAGS = ibv_xrcd_init_attr_mask.IBV_XRCD_INIT_ATTR_OFLAGS
IBV_XRCD_INIT_ATTR_RESERVED = ibv_xrcd_init_attr_mask.IBV_XRCD_INIT_ATTR_RESERVED
