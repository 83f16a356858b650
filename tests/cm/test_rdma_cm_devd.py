"""devd routing of CM MADs: two processes listening on different ports of one RoCE device
each get their own REQs (and the REP/RTU/DREQ traffic of their connections), a second
listener on a taken port is refused across processes, and devd counts what it routed."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.rdma_cm import ROCE_DEV, Ep, child_env, expect, setup_env

from softrdma.cm import rdma_cm as rc
from softrdma.cm.rdma_cm import EventChannel
from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.host.registry import Registry
from softrdma.errors import StateError

T = rc.RdmaCmEventType

SERVER = textwrap.dedent("""
    import sys
    from softrdma import enums as e, verbs as v
    from softrdma.cm import rdma_cm as rc
    port, n = int(sys.argv[1]), int(sys.argv[2])
    ch = rc.EventChannel()
    lst = rc.CmId(ch)
    lst.bind_addr(("127.0.0.1", port), device="roce")
    lst.listen(4)
    print("ready", flush=True)
    kids = []
    done = 0
    while done < n:
        ev = ch.get_cm_event(20)
        if ev.event == rc.RDMA_CM_EVENT_CONNECT_REQUEST:
            cq = v.CQ(ev.id.verbs, 8)
            ev.id.create_qp(None, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq))
            ev.id.accept(rc.ConnParam(private_data=f"served by {port}".encode()))
            kids.append(ev.id)
        elif ev.event == rc.RDMA_CM_EVENT_DISCONNECTED:
            done += 1
    print("done", flush=True)
    rc.release_devices()
""")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from setup_env(tmp_path, monkeypatch)


def test_two_listening_processes_on_one_device(env: Path) -> None:
    ports = random.sample(range(20000, 30000), 2)
    cenv = child_env(env)
    procs = [subprocess.Popen([sys.executable, "-c", SERVER, str(p), "2"], env=cenv,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for p in ports]
    try:
        for pr in procs:
            assert pr.stdout is not None
            assert pr.stdout.readline().strip() == "ready", pr.stderr
        ch = EventChannel()
        # a third process (this one) cannot take a port another process listens on
        lst = rc.CmId(ch)
        lst.bind_addr(("127.0.0.1", ports[0]), device="roce")
        with pytest.raises(StateError, match="in use|listener"):
            lst.listen()
        lst.destroy()
        for _round in range(2):
            for port in ports:
                cli = rc.CmId(ch)
                cli.resolve_addr(None, ("127.0.0.1", port), 2000, device="roce")
                expect(ch, T.ADDR_RESOLVED)
                cli.resolve_route()
                expect(ch, T.ROUTE_RESOLVED)
                Ep(cli)
                cli.connect(rc.ConnParam(private_data=b"which one?"))
                est = expect(ch, T.ESTABLISHED)
                assert est.private_data.rstrip(b"\0") == f"served by {port}".encode()
                cli.disconnect()
                while True:  # TIMEWAIT_EXIT of an earlier connection may come first
                    ev = ch.get_cm_event(10)
                    if ev.event == T.DISCONNECTED and ev.id is cli:
                        break
                cli.destroy_qp()
                cli.destroy()
        for pr in procs:
            out, err = pr.communicate(timeout=20)
            assert pr.returncode == 0, err
            assert out.strip() == "done"
        link = DevdLink(Registry(env).get(ROCE_DEV), state_dir=env, spawn=False)
        try:
            st = link.stats()
        finally:
            link.close()
        # every REQ went to one listener; replies went to the owners of the comm IDs
        assert st["cm_routed"] >= 4 * 4
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.communicate()
