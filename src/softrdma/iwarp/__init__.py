"""softrdma.iwarp: the iWARP stack (RFC 5044 MPA, RFC 6581, RFC 5041 DDP, RFC 5040 RDMAP).

* :mod:`.engine` - the sans-I/O per-connection engine (:class:`IwarpConn`), composed of
  :mod:`.mpa_stream` (MPA framing), :mod:`.ddp_place` (DDP segmentation and placement),
  :mod:`.rdmap` / :mod:`.rdmap_tx` (RDMAP receive / transmit) and :mod:`.orq_irq` (the
  ORQ/IRQ); it reports typed connection events (:mod:`.events`);
* :mod:`.qp` - the device (:class:`IwarpDevice`, STag-keyed memory) and QP
  (:class:`IwarpQP`) the verbs layer drives;
* :mod:`.stag`, :mod:`.terminate`, :mod:`.mpa_setup` - STags, Terminate construction,
  MPA negotiation;
The package is sans-I/O: the TCP sockets are :mod:`softrdma.drivers.runtime.tcp`'s, and
connection setup (:func:`~softrdma.drivers.cm.iwconnect.connect` /
:func:`~softrdma.drivers.cm.iwconnect.listen`) is :mod:`softrdma.drivers.cm.iwconnect`'s.

Open a device with ``softrdma.verbs.Context(transport="iwarp")`` (or a registry device of
type ``iwarp``); then ``iwconnect.connect(qp, host, port, private_data)`` on one side and
``iwconnect.listen(ctx, port).accept(qp, private_data)`` on the other.
"""

from .engine import ConnState, IwarpConn
from .mpa_setup import ConnectionRejected, MpaConfig, Negotiated
from .qp import IwarpDevice, IwarpQP

__all__ = ["ConnState", "IwarpConn", "ConnectionRejected", "MpaConfig", "Negotiated",
           "IwarpDevice", "IwarpQP"]
