"""Two RoCE contexts on the loopback (127.0.0.1 <-> 127.0.0.2) for the CM over UDP.

(Moved from tests/ibcm/test_cm_udp.py, which other test files imported.)"""

from __future__ import annotations

from typing import Any

import pytest

from harness.ports import free_port
from softrdma import verbs as v
from softrdma.drivers.links.udp import UdpLink
from softrdma.errors import SoftRdmaError


def contexts() -> tuple[Any, Any]:
    last: Exception | None = None
    for _ in range(20):
        port = free_port()
        try:
            la = UdpLink("127.0.0.1", port=port)
        except (OSError, SoftRdmaError) as exc:
            last = exc
            continue
        try:
            lb = UdpLink("127.0.0.2", port=port)
        except (OSError, SoftRdmaError) as exc:
            la.close()
            last = exc
            continue
        return v.Context(link=la), v.Context(link=lb)
    pytest.skip(f"no free UDP port pair on the loopback: {last}")
