"""Bad arguments to the rdma_cm API raise :class:`InvalidArgument` naming the argument
(or the ``ConnParam`` field), before anything is sent: ``rdma_connect``, ``rdma_accept``,
``rdma_listen`` and ``rdma_reject``, over RoCE and iWARP. An iWARP Request whose private
data does not fit is refused by ``connect`` itself (EINVAL), as Linux's ``siw_connect``
refuses it, with no event after."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.rdma_cm import expect, setup_env

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm import rdma_cm as rc
from softrdma.cm.rdma_cm import EventChannel
from softrdma.errors import InvalidArgument

T = rc.RdmaCmEventType

#: a ConnParam field, a value of the wrong type or range for it
BAD_FIELDS: list[tuple[str, Any]] = [
    ("private_data", None), ("private_data", "text"), ("private_data", 5),
    ("responder_resources", None), ("responder_resources", "x"), ("responder_resources", 256),
    ("initiator_depth", -1), ("initiator_depth", 1.5),
    ("flow_control", None), ("retry_count", "7"), ("rnr_retry_count", None),
    ("srq", -1), ("qp_num", 1 << 32), ("qkey", -1), ("qkey", "k"),
]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from setup_env(tmp_path, monkeypatch)


class Setup:
    """A listener and a client id whose route is resolved, with a QP."""

    def __init__(self, transport: str) -> None:
        self.chs, self.chc = EventChannel(), EventChannel()
        self.lst = rc.CmId(self.chs)
        self.lst.bind_addr(("127.0.0.1", 0), device=transport)
        self.lst.listen(4)
        assert self.lst.local_addr is not None
        self.cli = rc.CmId(self.chc)
        self.cli.resolve_addr(None, ("127.0.0.1", self.lst.local_addr[1]), 2000,
                              device=transport)
        expect(self.chc, T.ADDR_RESOLVED)
        self.cli.resolve_route()
        expect(self.chc, T.ROUTE_RESOLVED)
        self.pd = v.PD(self.cli.verbs)
        self.cq = v.CQ(self.cli.verbs, 16)
        self.cli.create_qp(self.pd, self.attr())

    def attr(self) -> v.QPInitAttr:
        return v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                            cap=v.QPCap(4, 4, 1, 1))

    def request(self) -> rc.CmId:
        """Connect with the defaults; the server side's new id, with a QP."""
        self.cli.connect(rc.ConnParam(private_data=b"hello"))
        child: rc.CmId = expect(self.chs, T.CONNECT_REQUEST).id
        child.create_qp(self.pd, self.attr())
        return child

    def close(self) -> None:
        for cid in (self.cli, self.lst):
            cid.destroy()
        self.chs.close()
        self.chc.close()


def _param(field: str, value: Any) -> rc.ConnParam:
    p = rc.ConnParam()
    setattr(p, field, value)
    return p


@pytest.mark.parametrize("transport", ["roce", "iwarp"])
def test_connect_and_accept_check_their_param(env: Path, transport: str) -> None:
    s = Setup(transport)
    try:
        for bad in (object(), b"pd", {"private_data": b""}):
            with pytest.raises(InvalidArgument) as info:
                s.cli.connect(bad)  # type: ignore[arg-type]
            assert info.value.argument == "param"
        for field, value in BAD_FIELDS:
            with pytest.raises(InvalidArgument) as info:
                s.cli.connect(_param(field, value))
            assert info.value.argument == f"param.{field}", (field, value)
        child = s.request()  # the refused calls left the id as it was
        for field, value in BAD_FIELDS:
            with pytest.raises(InvalidArgument) as info:
                child.accept(_param(field, value))
            assert info.value.argument == f"param.{field}", (field, value)
        with pytest.raises(InvalidArgument) as info:
            child.accept("yes")  # type: ignore[arg-type]
        assert info.value.argument == "param"
        with pytest.raises(InvalidArgument) as info:
            child.reject(42)  # type: ignore[arg-type]
        assert info.value.argument == "private_data"
        child.accept(rc.ConnParam(private_data=b"welcome"))  # the request is still there
        assert expect(s.chc, T.ESTABLISHED).private_data.startswith(b"welcome")
        child.destroy()
    finally:
        s.close()


def test_listen_checks_its_backlog(env: Path) -> None:
    ch = EventChannel()
    cid = rc.CmId(ch)
    cid.bind_addr(("127.0.0.1", 0), device="roce")
    for bad in ("16", None, 2.0, b"\x10"):
        with pytest.raises(InvalidArgument) as info:
            cid.listen(bad)  # type: ignore[arg-type]
        assert info.value.argument == "backlog"
    cid.listen(0)  # librdmacm: 0 or less is the default backlog
    cid.destroy()
    ch.close()


def test_iwarp_private_data_too_long_for_mpa_is_refused_at_once(
        env: Path) -> None:
    """252 octets fit (with MPA v2's 4-octet header, Linux's 256); 253 do not: connect
    raises EINVAL and no event follows, on either side; accept raises it too, and the
    request can then be accepted with less."""
    s = Setup("iwarp")
    try:
        with pytest.raises(InvalidArgument) as info:
            s.cli.connect(rc.ConnParam(private_data=b"x" * 253))
        assert info.value.argument == "param.private_data"
        assert info.value.errno == errno.EINVAL
        with pytest.raises(TimeoutError):
            s.chc.get_cm_event(timeout=0.3)
        s.cli.connect(rc.ConnParam(private_data=b"y" * 252))  # the id is still usable
        req = expect(s.chs, T.CONNECT_REQUEST)
        assert req.private_data == b"y" * 252
        child: rc.CmId = req.id
        child.create_qp(s.pd, s.attr())
        with pytest.raises(InvalidArgument) as info:  # the Reply's limit: the same
            child.accept(rc.ConnParam(private_data=b"z" * 253))
        assert info.value.argument == "param.private_data"
        child.accept(rc.ConnParam(private_data=b"z" * 252))  # request and QP as before
        assert expect(s.chc, T.ESTABLISHED).private_data == b"z" * 252
        expect(s.chs, T.ESTABLISHED)
        child.destroy()
    finally:
        s.close()
