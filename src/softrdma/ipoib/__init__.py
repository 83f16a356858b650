"""softrdma.ipoib: IP over InfiniBand, sans-I/O (RFC 4391 datagram mode, RFC 4755
connected mode; docs/protocols.md §10).

* :mod:`.hwaddr` -- the 20-byte link-layer address with the RFC 4755 §3.1 flags, the
  broadcast/multicast MGIDs of a P_Key, the CM Service ID and private data;
* :mod:`.encap` -- the 4-byte encapsulation header and ARP with hardware type 32;
* :mod:`.nd` -- IPv6 Neighbor Discovery with the IPoIB link-layer address option;
* :mod:`.ip` -- what routing needs of an IP packet, ICMP errors, IPv4 fragmentation;
* :mod:`.neigh` -- the neighbour table (RFC 4861 states, as a table);
* :mod:`.conn` -- the IPoIB-CM connections (REQ crossing §3.3, MTU §5.1);
* :mod:`.iface` -- the interface engine; :mod:`.events` -- its outputs.

The driver (TUN device, verbs, IB CM) is :mod:`softrdma.apps.ipoib_runtime`.
"""
