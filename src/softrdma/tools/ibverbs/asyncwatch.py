"""``softrdma asyncwatch``: ``ibv_asyncwatch`` (rdma-core ``libibverbs/examples/
asyncwatch.c``): open a device (``-d``/``--ib-dev``, default the first), print
``NAME: async event FD N``, then one line per asynchronous event until stopped,
``  event_type NAME (N), port P``. softrdma's port events follow the device's network
interface (:meth:`softrdma.verbs.Context.watch_port`): PORT_ERR when it goes down or
loses carrier, PORT_ACTIVE when it is back, GID_CHANGE when its addresses change.
Event types that are not about the port print as ``unexpected``, as the real tool does.
"""

from __future__ import annotations

import argparse
import sys

from ... import enums as e
from ...errors import DeviceError
from ...verbs.device import Context, all_devices

__all__ = ["add_arguments", "event_name", "run"]

_PORT_EVENTS = frozenset(int(x) for x in (
    e.IBV_EVENT_DEVICE_FATAL, e.IBV_EVENT_PORT_ACTIVE, e.IBV_EVENT_PORT_ERR,
    e.IBV_EVENT_LID_CHANGE, e.IBV_EVENT_PKEY_CHANGE, e.IBV_EVENT_SM_CHANGE,
    e.IBV_EVENT_CLIENT_REREGISTER, e.IBV_EVENT_GID_CHANGE))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-d", "--ib-dev", dest="ib_dev", metavar="DEV", default=None,
                        help="use IB device DEV (default first device found)")
    parser.add_argument("--count", type=int, default=None, metavar="N",
                        help="exit after N events (softrdma addition; default: run until "
                        "stopped)")


def event_name(event_type: int) -> str:
    """``event_name_str``: the device and port events by name, others ``unexpected``."""
    if event_type in _PORT_EVENTS:
        return e.ibv_event_type(event_type).name
    return "unexpected"


def run(args: argparse.Namespace) -> int:
    devs = all_devices()
    if args.ib_dev is not None:
        devs = [d for d in devs if d.name == args.ib_dev]
    if not devs:
        raise DeviceError(f"IB device {args.ib_dev or ''} not found")
    ctx = Context(devs[0].name)
    try:
        ctx.watch_port()
        print(f"{devs[0].name}: async event FD {ctx.async_fileno()}", flush=True)
        seen = 0
        while args.count is None or seen < args.count:
            ev = ctx.get_async_event()
            port = ev.element if isinstance(ev.element, int) else 0
            print(f"  event_type {event_name(ev.event_type)} ({ev.event_type}), port {port}",
                  flush=True)
            seen += 1
    finally:
        ctx.close()
    sys.stdout.flush()
    return 0
