"""The drivers' runtime/ room: the progress core and the runtimes that bind an engine to
its I/O (RoCE over a link, iWARP over TCP sockets), clocks and worker threads.

Importing this package imports none of its modules."""
