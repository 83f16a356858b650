"""``softrdma devices``: the device list as ``ibv_devices`` prints it (rdma-core
``libibverbs/examples/device_list.c``): a header, then one line per device with its
node GUID (the EUI-64 of the interface's MAC, as rxe makes it) in 16 hex digits."""

from __future__ import annotations

import argparse

from ...verbs.device import all_devices

__all__ = ["add_arguments", "format_devices", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``ibv_devices`` takes no options."""


def format_devices(devices: list[tuple[str, int]]) -> str:
    """The ``ibv_devices`` table of ``(name, node_guid)`` pairs."""
    lines = [f"    {'device':<16}\t   node GUID", f"    {'------':<16}\t----------------"]
    lines += [f"    {name:<16}\t{guid:016x}" for name, guid in devices]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    print(format_devices([(d.name, d.node_guid) for d in all_devices()]))
    return 0
