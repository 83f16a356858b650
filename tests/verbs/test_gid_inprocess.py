"""An in-process device has the GID table the same device has through devd (issue 21):
every address of its netdev, so ``::1`` beside ``::ffff:127.0.0.1`` on ``lo``, and RC
traffic flows over the ``::1`` GID of an in-process device."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.ports import free_port
from harness.verbs_pair import ACC, Side

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.host.registry import Registry, ensure_state_dir

LOOP6 = v.GID("::1")


@pytest.fixture
def devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    state = ensure_state_dir(tmp_path / "state")
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(state))
    reg = Registry(state)
    for name in ("g0", "g1"):
        reg.add(name, "lo", "roce", free_port())
    yield reg


def test_in_process_and_shared_gid_tables_match(devices: Registry) -> None:
    with v.Context("g0", shared=False) as inproc, v.Context("g1", shared=True) as shared:
        assert LOOP6 in shared.gids  # devd receives on every address of lo
        assert inproc.gids == shared.gids
        assert inproc.gids[0] == v.GID("127.0.0.1")


def _rts(me: Side, peer: Side, sgid_index: int, dgid: v.GID) -> None:
    a = v.QPAttr(path_mtu=int(e.IBV_MTU_1024), dest_qp_num=peer.qp.qp_num, rq_psn=7,
                 sq_psn=7, max_dest_rd_atomic=4, max_rd_atomic=4, min_rnr_timer=1,
                 timeout=8, retry_cnt=5, rnr_retry=5)
    a.qp_access_flags = ACC
    a.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=dgid, sgid_index=sgid_index, hop_limit=64))
    me.qp.to_rts(a)


def test_rc_over_the_ipv6_loopback_gid_in_process(devices: Registry) -> None:
    with v.Context("g0", shared=False) as ctx:  # two QPs of one device: to itself over ::1
        a = Side(ctx, int(e.IBV_QPT_RC), bytearray(4096))
        b = Side(ctx, int(e.IBV_QPT_RC), bytearray(4096))
        _rts(a, b, ctx.gids.index(LOOP6), LOOP6)
        _rts(b, a, ctx.gids.index(LOOP6), LOOP6)
        a.buf[:6] = b"over 6"
        b.qp.post_recv(v.RecvWR(1, 1, [b.sge(0, 64)]))
        a.qp.post_send(v.SendWR(2, sg=[a.sge(0, 6)]))
        got: list[v.WC] = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += a.cq.poll(4)[1] + b.cq.poll(4)[1]
        assert sorted((w.wr_id, w.status) for w in got) == [(1, 0), (2, 0)]
        assert bytes(b.buf[:6]) == b"over 6"
