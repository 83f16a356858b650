"""UD multicast across hosts over RoCEv2 and RoCEv1 (issue 11, Annex A16; ../shared/specs/roce.md §4): one sender reaches two
receivers on two other hosts, each in its own network namespace with its own devd (or an
in-process device); a detach stops delivery to that receiver only.

The MGID is the IP group (``::ffff:239.x.y.z`` -> 239.x.y.z; an IPv6 MGID is itself the
group); the receiving host joins it on ``eth0`` (IGMP/MLD) when its first QP attaches.
On RoCEv1 the MGID maps to the Ethernet multicast MAC 33:33 + its last 4 bytes, which
the receiving host adds to eth0's filter (``PACKET_ADD_MEMBERSHIP``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.netns import (
    DEVICE_V1,
    GID_IDX_IPV4,
    GID_IDX_IPV6,
    GID_IDX_V1_LINK_LOCAL,
    Host,
    Lines,
    Network,
    skip_reason,
)

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

ENDPOINT = str(Path(__file__).resolve().parents[1] / "harness/netns_endpoint.py")


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    with Network(3, tmp_path_factory.mktemp("mcast"), v1_device=True) as n:
        yield n


def _receiver(h: Host, mgid: str, shared: int, device: str) -> Lines:
    p = h.spawn([sys.executable, ENDPOINT, "recv", mgid, "--shared", str(shared),
                 "--device", device])
    assert "ready" in p.json()
    return p


def _send(h: Host, mgid: str, gid_idx: int, shared: int, device: str, *texts: str) -> None:
    out = h.run([sys.executable, ENDPOINT, "send", mgid, str(gid_idx), *texts,
                 "--shared", str(shared), "--device", device], timeout=60)
    assert json.loads(out.stdout.splitlines()[-1]) == {"sent": len(texts)}


def _command(p: Lines, cmd: str) -> dict[str, object]:
    p.send(cmd)
    return p.json()


V1 = 1  # RoCEv1: the MGID's Ethernet multicast MAC (33:33 + its last 4 bytes, Annex A16; ../shared/specs/roce.md §4)


@pytest.mark.parametrize(("family", "shared"), [
    (4, 1), (6, 1), (4, 0), (V1, 1)],
    ids=["ipv4-devd", "ipv6-devd", "ipv4-in-process", "roce-v1-devd"])
def test_one_sender_two_receivers_then_detach(net: Network, family: int, shared: int) -> None:
    tag = f"{os.getpid() & 0xFF}"
    mgid = (f"::ffff:239.77.{family}{shared}.{tag}" if family == 4
            else f"ff0e::77:{family}{shared}:{os.getpid() & 0xFFFF:x}")
    gid_idx = GID_IDX_IPV4 if family == 4 else GID_IDX_IPV6
    device = "rxe0"
    if family == V1:
        device, gid_idx = DEVICE_V1, GID_IDX_V1_LINK_LOCAL
    # an in-process device has the shared device's GID table (every address of its netdev)
    sender, r1, r2 = net.hosts
    if not shared:  # the in-process device binds UDP 4791 itself: no devd may hold it
        for h in net.hosts:
            h.stop_devd()
    p1 = _receiver(r1, mgid, shared, device)
    p2 = _receiver(r2, mgid, shared, device)
    try:
        _send(sender, mgid, gid_idx, shared, device, "hello-1", "hello-2")
        for p in (p1, p2):
            got = [p.json(), p.json()]
            assert [g["msg"] for g in got] == ["hello-1", "hello-2"]
            # A16.9.12: a UD completion from a RoCE peer carries no SLID
            assert all(g["slid"] == 0 and g["grh"] for g in got)
        assert _command(p2, "detach") == {"detached": True}
        _send(sender, mgid, gid_idx, shared, device, "after-detach")
        assert p1.json()["msg"] == "after-detach"
        # p2 left the group: nothing reaches it (a marker proves p1's copy went by first)
        try:
            extra = p2.json(timeout=1.5)
        except AssertionError as exc:
            assert "silent" in str(exc), exc
        else:
            pytest.fail(f"the receiver that detached still printed {extra}")
        assert _command(p2, "attach") == {"attached": True}
        _send(sender, mgid, gid_idx, shared, device, "rejoined")
        assert p2.json()["msg"] == "rejoined"
        assert p1.json()["msg"] == "rejoined"
    finally:
        for p in (p1, p2):
            if p.proc.poll() is None:
                try:
                    p.send("quit")
                    p.proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    p.proc.kill()
