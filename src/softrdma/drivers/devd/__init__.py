"""softrdma.drivers.devd: the per-device daemon (:mod:`.daemon`, ``python -m
softrdma.drivers.devd.daemon``) and its client link (:mod:`.client`), the protocol
between them (:mod:`.proto`), starting it (:mod:`.spawn`), QPN allocation
(:mod:`.qpn`), forwarding (:mod:`.forward`), the kernel's reuseport demultiplexing
(:mod:`.reuseport`), admission (:mod:`.admission`), REJ for unlistened REQs
(:mod:`.cm`, :mod:`.cm_reject`), multicast (:mod:`.mcast`) and RoCEv1 (:mod:`.v1`).

Importing this package imports none of them: a client process imports
:mod:`.client`, never the daemon.
"""
