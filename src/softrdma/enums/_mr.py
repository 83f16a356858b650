"""Memory: access flags, memory window types, re-registration flags (verbs.h: ``ibv_reg_mr``,
``ibv_alloc_mw``, ``ibv_rereg_mr``).

Values of rdma-core's <infiniband/verbs.h>, generated from the header (see :mod:`softrdma.enums`).
"""

from enum import IntEnum, IntFlag


class ibv_access_flags(IntFlag):
    IBV_ACCESS_LOCAL_WRITE = 1
    IBV_ACCESS_REMOTE_WRITE = 2
    IBV_ACCESS_REMOTE_READ = 4
    IBV_ACCESS_REMOTE_ATOMIC = 8
    IBV_ACCESS_MW_BIND = 16
    IBV_ACCESS_ZERO_BASED = 32
    IBV_ACCESS_ON_DEMAND = 64
    IBV_ACCESS_HUGETLB = 128
    IBV_ACCESS_RELAXED_ORDERING = 1 << 20


class ibv_mw_type(IntEnum):
    IBV_MW_TYPE_1 = 1
    IBV_MW_TYPE_2 = 2


class ibv_rereg_mr_flags(IntFlag):
    IBV_REREG_MR_CHANGE_TRANSLATION = 1
    IBV_REREG_MR_CHANGE_PD = 2
    IBV_REREG_MR_CHANGE_ACCESS = 4
    IBV_REREG_MR_FLAGS_SUPPORTED = 7


IBV_ACCESS_LOCAL_WRITE = ibv_access_flags.IBV_ACCESS_LOCAL_WRITE
IBV_ACCESS_REMOTE_WRITE = ibv_access_flags.IBV_ACCESS_REMOTE_WRITE
IBV_ACCESS_REMOTE_READ = ibv_access_flags.IBV_ACCESS_REMOTE_READ
IBV_ACCESS_REMOTE_ATOMIC = ibv_access_flags.IBV_ACCESS_REMOTE_ATOMIC
IBV_ACCESS_MW_BIND = ibv_access_flags.IBV_ACCESS_MW_BIND
IBV_ACCESS_ZERO_BASED = ibv_access_flags.IBV_ACCESS_ZERO_BASED
IBV_ACCESS_ON_DEMAND = ibv_access_flags.IBV_ACCESS_ON_DEMAND
IBV_ACCESS_HUGETLB = ibv_access_flags.IBV_ACCESS_HUGETLB
IBV_ACCESS_RELAXED_ORDERING = ibv_access_flags.IBV_ACCESS_RELAXED_ORDERING
IBV_MW_TYPE_1 = ibv_mw_type.IBV_MW_TYPE_1
IBV_MW_TYPE_2 = ibv_mw_type.IBV_MW_TYPE_2
IBV_REREG_MR_CHANGE_TRANSLATION = ibv_rereg_mr_flags.IBV_REREG_MR_CHANGE_TRANSLATION
IBV_REREG_MR_CHANGE_PD = ibv_rereg_mr_flags.IBV_REREG_MR_CHANGE_PD
IBV_REREG_MR_CHANGE_ACCESS = ibv_rereg_mr_flags.IBV_REREG_MR_CHANGE_ACCESS
IBV_REREG_MR_FLAGS_SUPPORTED = ibv_rereg_mr_flags.IBV_REREG_MR_FLAGS_SUPPORTED
