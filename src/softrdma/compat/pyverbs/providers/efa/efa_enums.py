"""EFA direct-verbs enumerations (``pyverbs.providers.efa.efa_enums``).

softrdma has no EFA devices; values are those of ``<infiniband/efadv.h>``.
"""

# Generated from the enum lists of rdma-core 44's pyverbs (see the module docstring);
# do not edit by hand.

from ..._enum_names import export_members

__all__: list[str] = []

EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID = 4
EFADV_DEVICE_ATTR_CAPS_RDMA_READ = 1
EFADV_QP_DRIVER_TYPE_SRD = 0
EFADV_WC_EX_WITH_SGID = 1

__all__ = export_members(globals())
