"""tshark on a capture, as the tests read it: one place for the command line.

``--disable-protocol rpcordma``: that dissector would take RDMAP for NFS/RDMA. For iWARP
(``mpa=True``) tshark also tries its heuristic dissectors first: MPA is found by one,
which tshark otherwise tries after its TCP port table, and a test's free port may be
one Wireshark gives another protocol (11207: Couchbase's TLS), whose dissector then
takes the stream (docs/watch-the-packets.md)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

TSHARK = shutil.which("tshark")
HEURISTIC_FIRST = ("-o", "tcp.try_heuristic_first:TRUE")


def tshark(path: Path, *args: str, mpa: bool = True) -> str:
    """tshark's standard output for ``path`` with ``args`` (``mpa``: heuristics first)."""
    assert TSHARK is not None
    opts = HEURISTIC_FIRST if mpa else ()
    return subprocess.run([TSHARK, "-r", str(path), "--disable-protocol", "rpcordma", *opts,
                           *args], capture_output=True, text=True, timeout=120,
                          check=True).stdout
