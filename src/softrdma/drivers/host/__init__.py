"""The drivers' host/ room: facts of the host: netdevs, routes, neighbours, port watching,
the device registry, per-process resources and counters that outlive processes.

Importing this package imports none of its modules."""
