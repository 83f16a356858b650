"""A process whose descriptors are numbered past ``FD_SETSIZE`` (1024) before it opens a
device (an MPI rank, a storage target or a server with many files and connections): every
wait of softrdma's works there (``drivers.runtime.fdwait``). ``select(2)`` cannot take such
a descriptor; with it ``ibv_get_cq_event`` and ``ibv_get_async_event`` raised
``ValueError`` and the progress thread's wait returned at once, spinning.

The checks run in a child process that first takes descriptors up to 1100 (this test
process keeps its own)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")
TESTS = str(Path(__file__).resolve().parents[1])

_CHILD = r"""
import os, resource, sys, threading, time
sys.path[:0] = [sys.argv[1], sys.argv[2]]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
held = []
while not held or held[-1] < 1100:
    held.append(os.open(os.devnull, os.O_RDONLY))
from harness.ports import free_port
from harness.verbs_pair import RC, Side, connect
from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm import rdma_cm as rc
from softrdma.drivers.links.udp import UdpLink

port = free_port()
ca = v.Context(link=UdpLink("127.0.0.1", port))
cb = v.Context(link=UdpLink("127.0.0.2", port))
assert ca.async_fileno() > 1024, ca.async_fileno()
a, b = Side(ca, RC, bytearray(1 << 16), True), Side(cb, RC, bytearray(1 << 16), True)
connect(a, b, int(e.IBV_MTU_4096), timeout=14)
SEND, SIG = int(e.IBV_WR_SEND), int(e.IBV_SEND_SIGNALED)

# a completion event (ibv_get_cq_event), then the completion and its data
b.qp.post_recv(v.RecvWR(1, 1, [b.sge(0, 64)]))
b.cq.req_notify()
a.buf[:5] = b"first"
a.qp.post_send(v.SendWR(2, opcode=SEND, sg=[a.sge(0, 5)], send_flags=SIG))
assert b.ch.get_cq_event(120.0) is b.cq
b.cq.ack_events(1)
n, wcs = b.cq.poll(4)
assert n == 1 and wcs[0].wr_id == 1 and wcs[0].status == 0, wcs
assert bytes(b.buf[:5]) == b"first"
print("ok get_cq_event", flush=True)

# no asynchronous event: a timeout, not an error
try:
    ca.get_async_event(0.2)
except TimeoutError:
    print("ok get_async_event timeout", flush=True)

# an rdma_cm event channel with nothing queued
ch = rc.EventChannel()
assert ch.poll(0.2) is False
print("ok event channel poll", flush=True)
ch.close()

# idle: the progress threads sleep (a spinning one would take about the whole window)
c0 = time.process_time()
time.sleep(0.3)  # the observation window of something that must not happen
print("idle cpu", round(time.process_time() - c0, 3), flush=True)

# a busy poll that waits 0.5 s for its answer sleeps in the kernel after its short spin
b.qp.post_recv(v.RecvWR(3, 1, [b.sge(0, 64)]))
a.buf[:6] = b"second"
threading.Timer(0.5, lambda: a.qp.post_send(
    v.SendWR(4, opcode=SEND, sg=[a.sge(0, 6)], send_flags=SIG))).start()
t0 = time.thread_time()
end = time.monotonic() + 120
while time.monotonic() < end:
    n, wcs = b.cq.poll(1)
    if n:
        break
assert n == 1 and wcs[0].wr_id == 3 and bytes(b.buf[:6]) == b"second", wcs
print("busy poll cpu", round(time.thread_time() - t0, 3), flush=True)
ca.close()
cb.close()
"""


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 2048,
                    reason="the hard limit on open files is below 2048 (ulimit -Hn)")
def test_waits_work_with_descriptors_past_fd_setsize() -> None:
    p = subprocess.run([sys.executable, "-c", _CHILD, SRC, TESTS], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, SOFTRDMA_SHARED="0"))
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[:3] == ["ok get_cq_event", "ok get_async_event timeout",
                         "ok event channel poll"], p.stdout
    idle = float(lines[3].split()[-1])
    busy = float(lines[4].split()[-1])
    # CPU time only counts when the thread runs, so a loaded machine lowers it, never
    # raises it: a spinning wait would be near 0.3 and 0.5 (sleeping: about 0.01 each)
    assert idle < 0.15, p.stdout
    assert busy < 0.3, p.stdout
