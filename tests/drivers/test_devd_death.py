"""When devd dies (issue 13 item 7): the device raises IBV_EVENT_DEVICE_FATAL, its QPs go
to ERR with flush completions, later verbs calls fail with a clear DeviceError, and no
thread dies with a traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.ports import free_port
from harness.verbs_pair import RC, Side, connect

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.devd.proto import socket_path
from softrdma.drivers.host.registry import DeviceRecord, Registry, ensure_state_dir
from softrdma.errors import DeviceError

_DAEMON = """
import sys
from softrdma.drivers.devd.daemon import Devd
from softrdma.drivers.host.registry import DeviceRecord
Devd(DeviceRecord("dd0", "lo", "roce", int(sys.argv[2])), sys.argv[1], idle_timeout=60,
     ips=["127.0.0.1"]).serve_forever()
"""


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[tuple[DeviceRecord, Path, subprocess.Popen[bytes]]]:
    state = ensure_state_dir(tmp_path / "state")
    rec = Registry(state).add("dd0", "lo", "roce", free_port())
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(state))
    p = subprocess.Popen([sys.executable, "-c", _DAEMON, str(state), str(rec.udp_port)])
    try:
        deadline = time.monotonic() + 20
        while not socket_path("dd0", state).exists():
            assert p.poll() is None and time.monotonic() < deadline, "devd did not start"
            time.sleep(0.02)
        yield rec, state, p
    finally:
        p.kill()
        p.wait(10)


def test_devd_death_is_device_fatal(daemon) -> None:
    rec, state, proc = daemon
    crashes: list[threading.ExceptHookArgs] = []
    old_hook = threading.excepthook
    threading.excepthook = crashes.append
    ctx = v.Context("dd0", shared=True)  # a client of the daemon above
    try:
        a = Side(ctx, RC, bytearray(1 << 16), channel=True)
        b = Side(ctx, RC, bytearray(1 << 16))
        connect(a, b)
        b.buf[:5] = b"hello"
        a.qp.post_recv(v.RecvWR(1, 1, [a.sge(0, 64)]))
        b.qp.post_send(v.SendWR(2, sg=[b.sge(0, 5)]))  # the data path works
        end = time.monotonic() + 5
        got: list[v.WC] = []
        while len(got) < 2 and time.monotonic() < end:
            got += a.cq.poll(4)[1] + b.cq.poll(4)[1]
        assert sorted((w.wr_id, w.status) for w in got) == [(1, 0), (2, 0)]
        a.qp.post_recv([v.RecvWR(10 + i, 1, [a.sge(0, 64)]) for i in range(3)])
        assert a.ch is not None
        a.cq.req_notify()
        proc.send_signal(signal.SIGKILL)  # the idle application's devd dies
        proc.wait(10)
        end = time.monotonic() + 10
        while getattr(ctx.runtime, "fatal", None) is None and time.monotonic() < end:
            time.sleep(0.01)
        ev = ctx.get_async_event(timeout=10)  # still readable after the failure
        assert ev.event_type == e.IBV_EVENT_DEVICE_FATAL and ev.element is None
        assert a.ch.get_cq_event(timeout=5) is a.cq  # the flush completions wake waiters
        a.cq.ack_events(1)
        flushed = a.cq.poll(8)[1]
        assert [(w.wr_id, w.status) for w in flushed] == [
            (10 + i, e.IBV_WC_WR_FLUSH_ERR) for i in range(3)]
        assert a.qp.qp_state == b.qp.qp_state == e.IBV_QPS_ERR
        with pytest.raises(DeviceError, match="devd .*is gone.*no longer usable"):
            b.qp.post_send(v.SendWR(3, sg=[b.sge(0, 5)]))
        with pytest.raises(DeviceError, match="no longer usable"):
            v.PD(ctx).close()
        a.qp.close()  # releasing objects still works
    finally:
        ctx.close()
        threading.excepthook = old_hook
    assert crashes == []
