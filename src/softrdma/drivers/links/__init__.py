"""The drivers' links/ room: the datagram links: the
:class:`~softrdma.drivers.links.link.Link` protocol and its implementations (UDP, raw
Ethernet, both, the in-memory fabric, TUN).

Importing this package imports none of its modules."""
