"""How the out-of-band servers wait and the clients connect (the ``ibv_*_pingpong``,
``ibv_srq_pingpong`` and perftest TCP exchanges).

* A server waits for its client until it is stopped (Ctrl-C), as the C tools do, and
  says so once on stderr: ``softrdma rc-pingpong: waiting for a client on 18515`` (its
  stdout stays the C tool's). ``--timeout`` bounds each step once a client is there.
* A client whose connection is refused fails at once, as the C tools do (``Couldn't
  connect to HOST:PORT: Connection refused``), instead of retrying in silence. A script
  that starts server and client together sets ``SOFTRDMA_CONNECT_RETRY=SECONDS``: refused
  connections are then retried for that long (the test suite does).
"""

from __future__ import annotations

import os
import sys

__all__ = ["CONNECT_RETRY_ENV", "connect_retry_s", "announce_wait"]

CONNECT_RETRY_ENV = "SOFTRDMA_CONNECT_RETRY"


def connect_retry_s() -> float:
    """How long a refused connection is retried (``$SOFTRDMA_CONNECT_RETRY``, default 0)."""
    try:
        return max(0.0, float(os.environ.get(CONNECT_RETRY_ENV, "0") or 0))
    except ValueError:
        return 0.0


def announce_wait(tool: str, port: int) -> None:
    """The server's one line: ``softrdma TOOL: waiting for a client on PORT``."""
    print(f"softrdma {tool}: waiting for a client on {port}", file=sys.stderr, flush=True)
