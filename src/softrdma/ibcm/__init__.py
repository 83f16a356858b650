"""softrdma.ibcm: the InfiniBand Communication Manager engine (IBA Vol 1 ch. 12).

Sans-I/O, beside the transports: it imports ``wire``, ``seam`` and ``ib`` only.

Modules:

* :mod:`.state` -- the IBA 12.9 state machine as a table ``(state, input) -> (typed
  action, next state)``, over the states and typed inputs of :mod:`.model`; the actions
  live in :mod:`.establish` (REQ/REP/RTU), :mod:`.release` (REJ, DREQ/DREP, TimeWait),
  :mod:`.mra_lap` (MRA, duplicates, LAP), :mod:`.retry` (timeouts) and :mod:`.sidr`;
* :mod:`.agent` -- :class:`~.agent.CmAgent`, the CM of one port (MADs in, MADs out,
  timers, queued events); :mod:`.cmid` -- :class:`~.cmid.IbCmId`, one connection
  (``struct ib_cm_id``; the rdma_cm-style id is :class:`softrdma.cm.rdma_cm.CmId`);
  :mod:`.params` -- what consumers pass and the RoCE guards (A16.5.2);
* :mod:`.events` -- :class:`~.events.CmEvent` (librdmacm event names) and readable
  rejections;
* :mod:`.ipcm` -- the RDMA IP CM Service (Annex A11), server checks and client;
* :mod:`.sidr` -- Service ID Resolution for UD services (IBA 12.11);
* :mod:`.qpctl` -- the QP transitions the CM makes; :mod:`.userqp` -- a QP the
  application moves itself;
* :mod:`.ratelimit` -- how often the CM answers a stranger (REJ, DREP).

Its driver is :class:`softrdma.drivers.cm.gsi.CmBinding`, the agent on QP1 of a device
(verbs ``Context``), driven by the device runtime. The librdmacm-shaped API over it is
:mod:`softrdma.cm`.

Use (the rdma_cm-style layer sits on exactly this)::

    cm = CmBinding.attach(ctx)                       # one per device
    lst = cm.agent.create_id(handler)                # handler(ev: CmEvent), lock not held
    ip_listen(lst, 7471)                             # A11 Service ID 0x0000000001061d2f
    cid = cm.agent.create_id(handler)
    IpCmClient(cid).connect(qp, "10.0.0.1", "10.0.0.2", 7471, private_data=b"...")
    # server handler: CONNECT_REQUEST (ev.cm_id, ev.private_data, ev.remote_ip/port)
    #   -> ev.cm_id.accept(qp, AcceptParams(...)) or ev.cm_id.reject(b"...")
    # client handler: ESTABLISHED | REJECTED (ev.reject.reason/.ip_cm/.text) | UNREACHABLE
    cid.disconnect()                                 # -> DISCONNECTED, then TIMEWAIT_EXIT

The agent only queues events (typed, frozen :class:`~softrdma.ibcm.events.CmEvent`); the binding
delivers them after the device lock is released (at the end of a consumer call, or from
the virtual clock or the binding's event thread after MAD and timer processing), so a
handler may call CM methods, create or destroy verbs objects, or block. Without a
handler, events go to ``agent.events`` and :meth:`~softrdma.drivers.cm.gsi.CmBinding.get_event` returns
them.
"""
