"""Two rules the kernel's rdma_cm (``drivers/infiniband/core/cma.c``) has and programs
count on (libfabric's verbs provider: ``fi_pingpong -p verbs -e msg`` and ``verbs;ofi_rxm``):

* a loopback address binds no device (``cma_any_addr`` counts it as a wildcard): here,
  one that no softrdma device owns (a device on ``lo`` owns 127.0.0.1, and a program
  binding it gets that device); the id's ``verbs`` stays None, and it listens on the
  devices the wildcard would;
* a ``struct rdma_conn_param`` retry count above 7 is taken as 7 (``cma_connect_ib``,
  ``cma_accept_ib``: ``min_t(u8, 7, ...)``), not refused.
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.rdma_cm import expect, next_non_timewait, setup_env

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm import rdma_cm as rc
from softrdma.cm.rdma_devices import bind_device
from softrdma.errors import DeviceError, SoftRdmaError

T = rc.RdmaCmEventType


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from setup_env(tmp_path, monkeypatch)


def test_bind_device_rules(env: Path) -> None:
    """127.0.0.1 is the test device's (on lo); 127.0.0.2 is loopback that no device owns:
    none; 10.255.255.1 is no device's and not loopback: EADDRNOTAVAIL."""
    entry = bind_device(ipaddress.ip_address("127.0.0.1"), "roce")
    assert entry is not None and entry.netdev == "lo"
    assert bind_device(ipaddress.ip_address("127.0.0.2"), "roce") is None
    with pytest.raises(DeviceError) as err:
        bind_device(ipaddress.ip_address("10.255.255.1"), "roce")
    assert err.value.errno == errno.EADDRNOTAVAIL


def test_an_unowned_loopback_bind_has_no_device_and_listens(env: Path) -> None:
    ch = rc.EventChannel()
    lst = rc.CmId(ch)
    lst.bind_addr(("127.0.0.2", 0), device="roce")
    assert lst.verbs is None and lst.device is None
    lst.listen(4)
    assert lst.local_addr is not None and lst.local_addr[0] == "127.0.0.2"
    assert lst.local_addr[1] != 0
    lst.destroy()
    ch.close()


Setup = tuple[rc.CmId, rc.RdmaCmEvent, rc.CmId, v.PD, v.CQ, rc.EventChannel,
              rc.EventChannel]


def _connect(dst: str, param: rc.ConnParam) -> Setup:
    """A listener bound to 127.0.0.1, a client connecting to ``dst`` with ``param``, both
    ESTABLISHED: the client, the CONNECT_REQUEST, the listener, the client's PD and CQ
    (the request's QP shares them) and the client's and the listener's channels."""
    chs, chc = rc.EventChannel(), rc.EventChannel()
    lst = rc.CmId(chs)
    lst.bind_addr(("127.0.0.1", 0), device="roce")
    lst.listen(4)
    assert lst.local_addr is not None and lst.local_addr[0] == "127.0.0.1"
    cli = rc.CmId(chc)
    cli.resolve_addr(None, (dst, lst.local_addr[1]), 2000, device="roce")
    expect(chc, T.ADDR_RESOLVED)
    cli.resolve_route()
    expect(chc, T.ROUTE_RESOLVED)
    pd = v.PD(cli.verbs)
    cq = v.CQ(cli.verbs, 16)

    def attr() -> v.QPInitAttr:
        return v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4, 1, 1))
    cli.create_qp(pd, attr())
    cli.connect(param)
    req = expect(chs, T.CONNECT_REQUEST)
    assert req.id.verbs is not None  # the request's id has the device
    req.id.create_qp(pd, attr())
    req.id.accept(param)
    expect(chc, T.ESTABLISHED)
    expect(chs, T.ESTABLISHED)
    return cli, req, lst, pd, cq, chc, chs


def _close(setup: Setup) -> None:
    cli, req, lst, pd, cq, chc, chs = setup
    cli.disconnect()
    expect(chc, T.DISCONNECTED)
    assert next_non_timewait(chs).event == T.DISCONNECTED
    for cid in (cli, req.id):
        cid.destroy_qp()
        cid.destroy()
    lst.destroy()
    cq.close()
    pd.close()
    chc.close()
    chs.close()


def test_a_loopback_address_a_device_owns_binds_it(env: Path) -> None:
    """``bind_addr(127.0.0.1)`` gets the device on lo (its ``verbs``), and the connection
    through it works (the listening id's context is the device's)."""
    setup = _connect("127.0.0.1", rc.ConnParam(private_data=b"own"))
    cli, req, lst = setup[0], setup[1], setup[2]
    assert lst.verbs is not None and lst.verbs is req.id.verbs
    assert req.private_data.startswith(b"own")
    assert cli.qp.qp_state == req.id.qp.qp_state == e.IBV_QPS_RTS
    _close(setup)


def test_retry_counts_above_7_are_taken_as_7(env: Path) -> None:
    setup = _connect("127.0.0.1", rc.ConnParam(retry_count=15, rnr_retry_count=255))
    mask = e.ibv_qp_attr_mask.IBV_QP_RETRY_CNT | e.ibv_qp_attr_mask.IBV_QP_RNR_RETRY
    for qp in (setup[0].qp, setup[1].id.qp):
        attr, _ = qp.query(mask)
        assert (attr.retry_cnt, attr.rnr_retry) == (7, 7)
    _close(setup)


def test_a_negative_retry_count_is_still_refused(env: Path) -> None:
    chc = rc.EventChannel()
    cli = rc.CmId(chc)
    cli.resolve_addr(None, ("127.0.0.1", 9), 2000, device="roce")
    expect(chc, T.ADDR_RESOLVED)
    cli.resolve_route()
    expect(chc, T.ROUTE_RESOLVED)
    pd = v.PD(cli.verbs)
    cq = v.CQ(cli.verbs, 4)
    cli.create_qp(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                   cap=v.QPCap(1, 1, 1, 1)))
    with pytest.raises(SoftRdmaError, match="retry_count"):
        cli.connect(rc.ConnParam(retry_count=-1))
    cli.destroy_qp()
    cli.destroy()
    cq.close()
    pd.close()
    chc.close()
