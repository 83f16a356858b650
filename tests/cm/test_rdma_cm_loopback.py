"""rdma_cm over a device shared through devd, both ends in one process: the CM MADs of
the connection (REQ, REP, RTU, DREQ, DREP) are handed back to the process's own CM
without the devd hop (issue 26: each hop was a send, a devd forward and a progress-thread
wake-up); ``SOFTRDMA_CM_LOOPBACK=0`` sends them on the wire as before. The QPs' numbers
come from devd leases, not an exchange per QP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.rdma_cm import expect, next_non_timewait, setup_env

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm import rdma_cm as rc
from softrdma.drivers.cm import gsi
from softrdma.drivers.devd.proto import OP_ALLOC_QPN, OP_FREE_QPN
from softrdma.drivers.devd.requests import DevdRequests

T = rc.RdmaCmEventType


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from setup_env(tmp_path, monkeypatch)


def connect_and_close() -> tuple[int, int]:
    """One connection in this process on the RoCE device: how many CM MADs devd routed
    and how many the CM looped back meanwhile."""
    chs, chc = rc.EventChannel(), rc.EventChannel()
    lst = rc.CmId(chs)
    lst.bind_addr(("127.0.0.1", 0), device="roce")
    lst.listen(4)
    assert lst.local_addr is not None
    cli = rc.CmId(chc)
    cli.resolve_addr(None, ("127.0.0.1", lst.local_addr[1]), 2000, device="roce")
    expect(chc, T.ADDR_RESOLVED)
    cli.resolve_route()
    expect(chc, T.ROUTE_RESOLVED)
    dev = cli.device
    assert dev is not None and dev.binding is not None
    link = cli.verbs.runtime.link
    routed0, looped0 = link.stats()["cm_routed"], dev.binding.loopback_mads
    pd = v.PD(cli.verbs)
    cq = v.CQ(cli.verbs, 16)

    def attr() -> v.QPInitAttr:
        return v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4, 1, 1))
    cli.create_qp(pd, attr())
    cli.connect(rc.ConnParam(private_data=b"loop"))
    req = expect(chs, T.CONNECT_REQUEST)
    assert req.private_data.startswith(b"loop")
    req.id.create_qp(pd, attr())
    req.id.accept(rc.ConnParam(private_data=b"back"))
    est = expect(chc, T.ESTABLISHED)
    assert est.private_data.startswith(b"back")
    expect(chs, T.ESTABLISHED)
    assert cli.qp.qp_state == req.id.qp.qp_state == e.IBV_QPS_RTS
    cli.disconnect()
    expect(chc, T.DISCONNECTED)
    assert next_non_timewait(chs).event == T.DISCONNECTED
    routed = link.stats()["cm_routed"] - routed0
    looped = dev.binding.loopback_mads - looped0
    for cid in (cli, req.id):
        cid.destroy_qp()
        cid.destroy()
    lst.destroy()
    chs.close()
    chc.close()
    return routed, looped


def test_a_connection_inside_one_process_skips_devd(env: Path) -> None:
    routed, looped = connect_and_close()
    # REQ, REP, RTU, DREQ, DREP: no data was in flight, so the DREQ overtakes nothing
    # (CmAgent.takes)
    assert looped == 5
    assert routed == 0


def test_loopback_off_sends_the_mads_through_devd(env: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gsi.LOOPBACK_ENV, "0")
    routed, looped = connect_and_close()
    assert looped == 0
    assert routed == 5


def test_qps_of_connections_take_no_devd_exchange_each(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The QPs of a connection get and give back their numbers without a devd exchange
    each (QPN leases, drivers.devd.requests): three connections, six QPs, no ALLOC_QPN
    or FREE_QPN request waited for one by one."""
    connect_and_close()  # the device is open, its first lease taken
    ops: list[int] = []
    orig = DevdRequests._request

    def counting(self: DevdRequests, op: int, *a: Any, **k: Any) -> tuple[int, bytes]:
        ops.append(op)
        return orig(self, op, *a, **k)
    monkeypatch.setattr(DevdRequests, "_request", counting)
    for _ in range(3):
        connect_and_close()
    assert OP_ALLOC_QPN not in ops and OP_FREE_QPN not in ops, ops
