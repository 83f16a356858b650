"""softrdma.cm: the librdmacm-shaped connection API (``rdma_cm.h``) over the IB CM and
iWARP connection setup.

Modules:

* :mod:`.rdma_cm` -- :class:`~.rdma_cm.CmId` and the ``rdma_*`` calls; the transport
  underneath, chosen once per id, is the IB CM engine (:mod:`softrdma.ibcm`, on QP1
  through :mod:`softrdma.drivers.cm.gsi`) or TCP + MPA (:mod:`softrdma.drivers.cm.iwconnect`);
  :mod:`.rdma_state` -- the id's state (Linux ``enum rdma_cm_state``);
* :mod:`.rdma_events` -- event channels and ``RDMA_CM_EVENT_*``; :mod:`.rdma_devices`
  -- the device list and which device an address is on; :mod:`.rdma_qpattr`,
  :mod:`.rdma_mcast`, :mod:`.rdma_iwwatch`;
* :mod:`.hello` -- the iWARP-over-IB Hello/HelloReply dialect and the FlowC 0 stream (a
  verbs user).
"""
