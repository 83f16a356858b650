"""Opening registry devices: shared (through the device's devd process, which allocates
QPNs and forwards received datagrams) and in-process (own UDP socket), on loopback with a
private state directory and a free UDP port."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from harness.device import private_device

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.host import registry
from softrdma.drivers.runtime.roce import Runtime
from softrdma.errors import DeviceError

RC = int(e.IBV_QPT_RC)
ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return private_device("vt0", tmp_path, monkeypatch, subprocesses=False)


def test_device_list_and_unknown_name(device: str) -> None:
    names = [d.name for d in v.get_device_list()]
    assert device in names and "softrdma_lo" in names
    info = next(d for d in v.get_device_list() if d.name == device)
    assert info.netdev == "lo" and info.type == "roce" and bytes([127, 0, 0, 1]) in info.ips
    with pytest.raises(DeviceError):
        v.Context("nope", shared=False)


def test_in_process_device(device: str) -> None:
    with v.Context(device, shared=False) as ctx:
        assert ctx.name == device and ctx.netdev == "lo"
        # every address of lo, as through devd (127.0.0.1 first, then ::1)
        lo = next(d for d in v.get_device_list() if d.name == device)
        assert ctx.gids[0] == v.GID("127.0.0.1")
        assert [g.raw for g in ctx.gids] == v.device.gid_table(lo.ips)
        assert ctx.query_port().active_mtu == e.IBV_MTU_4096
        rt = ctx.runtime
        assert isinstance(rt, Runtime) and rt.udp_port == registry.get(device).udp_port
    assert ctx.runtime.closed


def _rc(ctx: v.Context):
    pd = v.PD(ctx)
    cq = v.CQ(ctx, 16)
    qp = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4, 1, 1, 0)))
    mr = v.MR(pd, 4096, ACC)
    return cq, qp, mr


def _wait(cq: v.CQ, timeout: float = 10.0) -> v.WC:
    end = time.monotonic() + timeout
    while True:
        n, wcs = cq.poll()
        if n:
            return wcs[0]
        assert time.monotonic() < end, "no completion"


def test_two_shared_contexts_talk_through_devd(device: str) -> None:
    a = v.Context(device, shared=True)
    b = v.Context(device, shared=True)
    try:
        assert a.gids == b.gids and v.GID("127.0.0.1") in a.gids
        ca, qa, ma = _rc(a)
        cb, qb, mb = _rc(b)
        assert qa.qp_num != qb.qp_num  # devd allocates QPNs per device
        idx = a.gid_index("127.0.0.1")
        for me, peer in ((qa, qb), (qb, qa)):
            at = v.QPAttr(path_mtu=e.IBV_MTU_1024, dest_qp_num=peer.qp_num, max_dest_rd_atomic=1,
                          max_rd_atomic=1, timeout=14, retry_cnt=7, rnr_retry=7)
            at.qp_access_flags = ACC
            at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid="127.0.0.1", sgid_index=idx, hop_limit=64))
            me.to_rts(at)
        ma.write(b"through devd", 12)
        qb.post_recv(v.RecvWR(1, 1, [v.SGE(mb.addr, 64, mb.lkey)]))
        qa.post_send(v.SendWR(2, sg=[v.SGE(ma.addr, 12, ma.lkey)]))
        assert _wait(ca).status == 0
        r = _wait(cb)
        assert r.status == 0 and r.byte_len == 12 and mb.read(12, 0) == b"through devd"
        w = v.SendWR(3, opcode=int(e.IBV_WR_RDMA_READ), sg=[v.SGE(mb.addr + 100, 12, mb.lkey)])
        w.set_wr_rdma(ma.rkey, ma.addr)
        qb.post_send(w)
        assert _wait(cb).status == 0 and mb.read(12, 100) == b"through devd"
    finally:
        a.close()
        b.close()
