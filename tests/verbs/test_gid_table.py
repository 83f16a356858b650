"""The GID table is the same everywhere (issue 14): ``query_port`` reports rxe's 1024
entries, ``query_gid`` reads an empty entry as the zero GID and fails past the end,
and an address handle on an empty entry fails with ENODATA (Linux ``rdma_get_gid_attr``),
naming the table's size and the populated entries; the pyverbs layer agrees."""

from __future__ import annotations

import errno

import pytest

from softrdma import verbs as v
from softrdma.compat.pyverbs import device as pd_device
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.errors import InvalidArgument


@pytest.fixture()
def ctx():
    fab = Fabric(VirtualClock())
    c = v.Context(fabric=fab.link("10.7.0.1"))
    peer = v.Context(fabric=fab.link("10.7.0.2"))
    yield c, peer
    c.close()
    peer.close()


def test_query_port_and_query_gid_agree(ctx) -> None:
    c, _ = ctx
    size = c.query_port(1).gid_tbl_len
    assert size == v.device.GID_TABLE_LEN == pd_device.GID_TABLE_LEN == 1024
    populated = len(c.port.gids)
    assert 1 <= populated < size
    assert c.query_gid(1, 0).raw == c.port.gids[0]
    assert c.query_gid(1, size - 1).raw == bytes(16)  # empty: zero GID, as sysfs reads
    with pytest.raises(InvalidArgument) as exc:
        c.query_gid(1, size)
    assert exc.value.errno == errno.EINVAL and "outside the GID table" in str(exc.value)
    with pytest.raises(InvalidArgument) as exc:
        c.query_gid_type(1, populated)
    assert exc.value.errno == errno.ENODATA


def test_ah_on_an_empty_entry_fails_with_enodata(ctx) -> None:
    c, peer = ctx
    pd = v.PD(c)
    populated = len(c.port.gids)
    dgid = peer.query_gid(1, 0)
    ah = v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid=dgid, sgid_index=0)))
    ah.close()
    with pytest.raises(InvalidArgument) as exc:
        v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid=dgid, sgid_index=populated + 1)))
    msg = str(exc.value)
    assert exc.value.errno == errno.ENODATA
    assert "sgid_index" in msg and "1024 entries" in msg and f"{populated} populated" in msg
