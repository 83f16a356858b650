"""The one seam between the transports and the layers above them.

* :mod:`.types` - the data model: work requests, completions, memory regions;
* :mod:`.states` - QP states and types by name;
* :mod:`.events` - the typed asynchronous events engines emit, and their queue;
* :mod:`.protocols` - what a device engine and a QP engine are (``typing.Protocol``);
* :mod:`.queues` - the receive queue, SRQ, post checks and flush both QPs share;
* :mod:`.tables` - the memory table and timer set both devices compose.

It imports only ``softrdma.enums`` and ``softrdma.errors``; ``softrdma.ib`` and
``softrdma.iwarp`` import it, never each other through it.
"""
