"""The Link Protocol's capability fields (issue 23): a link states what it can do, and
nobody probes a link with getattr/hasattr."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.links.dual import DualLink
from softrdma.drivers.links.fabric import Fabric, FabricLink
from softrdma.drivers.links.link import GsoLink, Link, LinkState, V1Link
from softrdma.drivers.links.rawether import RawEtherLink
from softrdma.drivers.links.udp import UdpLink
from softrdma.drivers.links.udp_multi import MultiUdpLink
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.errors import NotSupported

SRC = Path(__file__).resolve().parents[2] / "src" / "softrdma"
LINKS = (FabricLink, UdpLink, MultiUdpLink, RawEtherLink, DualLink, DevdLink)
#: a getattr/hasattr whose object is a link (``link``, ``self.link``, ``rt.link``, ``self.v2``)
_PROBE = re.compile(r"\b(?:getattr|hasattr)\(\s*(?:[\w.]*\.)?(?:link|_link|v1|v2|fabric)\b")


@pytest.mark.parametrize("cls", LINKS, ids=lambda c: c.__name__)
def test_every_link_class_states_its_capabilities(cls: type) -> None:
    """Each link class derives from LinkState, so every capability field has a value,
    and a capability it claims comes with the calls behind it."""
    assert issubclass(cls, LinkState)
    for field in ("gso", "roce_v1", "multicast", "shared"):
        assert isinstance(getattr(cls, field), bool), field
    if cls.gso:
        for call in ("gso_limit", "send_gso", "note_rx_ids"):
            assert callable(getattr(cls, call)), call
    for cap, call in (("roce_v1", "send_v1"), ("multicast", "attach_mcast"),
                      ("shared", "alloc_qpn"), ("shared", "report_counters")):
        own = any(call in vars(k) for k in cls.__mro__ if k is not LinkState)
        assert own == getattr(cls, cap), (cap, call)


def test_a_fabric_link_is_a_link_with_its_fabrics_clock() -> None:
    clock = VirtualClock()
    link = Fabric(clock).link("10.7.0.1")
    assert isinstance(link, Link) and isinstance(link, V1Link)
    assert not link.gso and not link.multicast and not link.shared and link.roce_v1
    assert link.clock is clock and link.port == 4791 and link.overflow_stats is None
    link.on_readable = None  # what a runtime sets, on a slotted link too
    link.fast_rc_meta = True
    with pytest.raises(NotSupported, match="multicast"):
        link.attach_mcast(b"\xff" * 16)
    with pytest.raises(NotSupported, match="QPN"):
        link.alloc_qpn()
    link.close()


def test_a_udp_link_batches_and_counts_kernel_drops() -> None:
    link = UdpLink("127.0.0.1", 0)
    try:
        assert isinstance(link, GsoLink) and link.gso and link.multicast and not link.roce_v1
        assert link.overflow_stats is link.stats and link.clock is None
        assert link.gid_entries == () and link.mtu is None
        link.on_readable = None
        link.fast_rc_meta = True
    finally:
        link.close()


def test_no_link_is_probed_with_getattr() -> None:
    """verbs/ and drivers/ read a link's capability fields; they do not probe it."""
    found = []
    for pkg in ("verbs", "drivers"):
        for path in sorted((SRC / pkg).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _PROBE.search(line):
                    found.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert found == []
