"""The drivers' cm/ room: the connection managers' drivers: the IB CM on QP1 (``gsi``) and
iWARP TCP connection setup (``iwconnect``).

Importing this package imports none of its modules."""
