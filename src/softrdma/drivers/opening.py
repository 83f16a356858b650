"""The drivers' entry point: open a device as an engine, the runtime that drives it and
its link.

The verbs layer (:class:`softrdma.verbs.device.Context`) finds the device (its name, GID
table, MTU; a registry record or a link it was given) and calls :func:`open_device`,
which composes the rest, the way a uverbs open binds a device to its driver:

* RoCE (``transport="roce"``): an :class:`~softrdma.ib.port.Port` over the given
  :class:`~softrdma.drivers.links.link.Link`, driven by a
  :class:`~softrdma.drivers.runtime.roce.Runtime`, with the packet tap
  (:func:`~softrdma.drivers.capture.tap.tap_for`); a link whose device is shared by processes
  (``link.shared``, devd) hands out the QPNs;
* iWARP (``transport="iwarp"``): an :class:`~softrdma.iwarp.qp.IwarpDevice` driven over
  TCP sockets by a :class:`~softrdma.drivers.runtime.tcp.TcpRuntime` (no datagram link),
  with the stream tap (:func:`~softrdma.drivers.capture.tap_stream.stream_tap_for`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..errors import InvalidArgument
from ..ib.port import Port
from ..seam.protocols import DeviceEngine
from .capture.tap import tap_for
from .devd.client import DevdLink
from .links.link import ROCE_V2_UDP_PORT, Link
from .runtime.progress import DeviceRuntime
from .runtime.roce import Runtime

__all__ = ["OpenedDevice", "open_device", "mpa_crc_wish", "TRANSPORTS"]

TRANSPORTS = ("roce", "iwarp")


def mpa_crc_wish(device_setting: bool) -> bool:
    """An iWARP device's effective MPA CRC wish: ``$SOFTRDMA_MPA_CRC`` over the device's
    ``mpa_crc`` setting (:func:`softrdma.iwarp.mpa_setup.device_mpa_crc`; InvalidArgument
    for a bad value). Here, with the iWARP imports: a RoCE process never needs them."""
    from ..iwarp.mpa_setup import MPA_CRC_ENV, device_mpa_crc

    return device_mpa_crc(device_setting, os.environ.get(MPA_CRC_ENV))


class OpenedDevice(NamedTuple):
    """What :func:`open_device` returns: the sans-I/O engine, its runtime, its link
    (None for iWARP, whose runtime owns one TCP socket per connection)."""

    engine: DeviceEngine
    runtime: DeviceRuntime
    link: Link | None


def open_device(transport: str, name: str, gids: Sequence[bytes], *, max_mtu: int,
                link: Link | None = None, gid_types: Sequence[int] | None = None,
                udp_port: int = ROCE_V2_UDP_PORT, progress: str = "thread",
                clock: Callable[[], float] | None = None,
                pcap: str | os.PathLike[str] | None = None) -> OpenedDevice:
    """Compose device ``name``'s engine, runtime and link (see the module docstring).

    ``gids`` is the GID table (``gid_types``: each entry's ``ibv_gid_type``, None: all
    RoCE v2), ``max_mtu`` the largest path MTU in bytes (IBA 9.6.1.1: 256 .. 4096).
    RoCE needs ``link``; iWARP takes none. ``progress`` is ``"thread"`` or ``"manual"``
    (:class:`~softrdma.drivers.runtime.progress.ProgressMode`), ``clock`` the time source (None:
    the link's virtual clock, else ``time.monotonic``), ``pcap`` a capture file (None:
    ``$SOFTRDMA_PCAP``). The link is not closed when this fails: the caller opened it.
    """
    if transport == "iwarp":
        if link is not None:
            raise InvalidArgument("link", "an iWARP device has no datagram link")
        # imported here: a RoCE process never loads the iWARP stack (MPA, DDP, RDMAP,
        # CRC-32C), about a quarter of the verbs' import time
        from ..iwarp.qp import IwarpDevice
        from .capture.tap_stream import stream_tap_for
        from .runtime.tcp import TcpRuntime

        dev = IwarpDevice(list(gids), max_mtu=max_mtu)
        trt = TcpRuntime(dev, mode=progress, clock=clock)
        trt.tap = stream_tap_for(name, pcap)  # pcap=FILE / $SOFTRDMA_PCAP, TRACE=pkt
        trt.counters_name = name  # softrdma stats adds up every process's counters
        return OpenedDevice(dev, trt, None)
    if transport != "roce":
        raise InvalidArgument("transport", f"must be one of {TRANSPORTS}, got {transport!r}")
    if link is None:
        raise InvalidArgument("link", "a RoCE device needs a link")
    # devd hands out the device's QPNs; a DevdLink leases them and takes them back
    # without a round trip per QP (drivers.devd.requests)
    alloc: Callable[[], int] | None = link.alloc_qpn if link.shared else None
    free: Callable[[int], None] | None = link.free_qpn if link.shared else None
    if isinstance(link, DevdLink):
        alloc, free = link.lease_qpn, link.release_qpn
    port = Port(list(gids), max_mtu=max_mtu, qpn_alloc=alloc, qpn_free=free,
                gid_types=list(gid_types) if gid_types is not None else None)
    rt = Runtime(port, link, mode=progress, clock=clock, udp_port=udp_port)
    rt.tap = tap_for(name, pcap, port.qps)  # pcap=FILE / $SOFTRDMA_PCAP, TRACE=pkt
    return OpenedDevice(port, rt, link)
