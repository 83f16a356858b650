"""What a wake-up costs on this machine: a plain Python UDP ping-pong of 64-byte datagrams
between two processes, both pinned to one core, and pinned to two different cores.

Every latency figure of ``bench/run.py`` is a ping-pong between processes, and where the
scheduler puts them decides much of it. On a machine whose idle cores sleep deeply (a
virtual machine whose vCPU halts when idle: its host must reschedule it on an interrupt)
a process woken on another core waits for that core to wake; on the same core the
kernel switches to it at once. Measured on the 2-core virtual machine of issues 22 and 26:
a round trip of 18-24 us on one core against 78-84 us across cores in one window and
306-343 us in another, while the same ping-pong unpinned took 15-18 us in some minutes
and 70-99 us in others. So a run of a
latency figure and the run beside it can land in different placements and differ by
several times; ``bench/run.py --json`` records both round trips (``wake``) with every
result, so that a reader can tell such a machine from a quiet one.

Run: ``python bench/wake_cost.py [--iters N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

__all__ = ["pingpong_rt", "measure"]


def _echo(sock: socket.socket, iters: int, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    buf = bytearray(2048)
    for _ in range(iters):
        n, addr = sock.recvfrom_into(buf)
        sock.sendto(memoryview(buf)[:n], addr)


def pingpong_rt(cpu_a: int, cpu_b: int, iters: int = 2000) -> float:
    """The mean round trip (us) of ``iters`` 64-byte UDP ping-pongs on the loopback between
    this process pinned to ``cpu_a`` and a forked child pinned to ``cpu_b`` (this
    process's CPU affinity is restored afterwards)."""
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    keep = os.sched_getaffinity(0)
    try:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        a.settimeout(10.0)
        dst = b.getsockname()
        pid = os.fork()
        if pid == 0:  # the echo side: nothing of the parent's runs here
            code = 0
            try:
                _echo(b, iters + 1, cpu_b)
            except BaseException:  # noqa: BLE001 - a forked child must not return
                code = 1
            os._exit(code)
        try:
            os.sched_setaffinity(0, {cpu_a})
            data = bytes(64)
            buf = bytearray(2048)
            a.sendto(data, dst)  # the first exchange: both processes placed and running
            a.recv_into(buf)
            t0 = time.perf_counter()
            for _ in range(iters):
                a.sendto(data, dst)
                a.recv_into(buf)
            return (time.perf_counter() - t0) / iters * 1e6
        finally:
            os.sched_setaffinity(0, keep)
            os.waitpid(pid, 0)
    finally:
        a.close()
        b.close()


def measure(iters: int = 2000) -> dict[str, float | None]:
    """``same_core_us`` and ``cross_core_us`` (None on a one-core machine): the round trips
    of :func:`pingpong_rt` with both processes on the first usable core, and on the first
    two."""
    cpus = sorted(os.sched_getaffinity(0))
    out: dict[str, float | None] = {"same_core_us": round(pingpong_rt(cpus[0], cpus[0], iters), 1),
                                    "cross_core_us": None}
    if len(cpus) > 1:
        out["cross_core_us"] = round(pingpong_rt(cpus[0], cpus[1], iters), 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    a = ap.parse_args()
    if a.iters < 1:
        ap.error("--iters must be >= 1")
    print(json.dumps(measure(a.iters)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
