"""devd's XRC domains (softrdma.drivers.devd.xrc; IBA 9.8.5, Annex A14): a domain is
named by the file a client passes (so a client joins only a domain whose file it has
open), an SRQ is registered by the client owning its QPN, and a hand-over record reaches
the SRQ's owner only from a client of the same domain; anything else is refused and
counted, and the daemon and its other clients carry on."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest
from harness.devd import (  # noqa: F401  (fixtures)
    Running,
    running,
    state,
    wait_for,
)

from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.devd.proto import XHDR, XRC_RECORD
from softrdma.drivers.devd.xrc import XF_CREDIT
from softrdma.errors import DeviceError
from softrdma.ib import xrc

Got = list[tuple[int, int, int, int, int, bytes]]


def _sink(link: DevdLink) -> Got:
    got: Got = []
    link.xrc_sink = lambda f, s, t, q, w, p: got.append((f, s, t, q, w, bytes(p)))
    return got


def _errno(fn: object, *args: object) -> int:
    assert callable(fn)
    with pytest.raises(DeviceError) as info:
        fn(*args)
    return info.value.errno or 0


def _drain(link: DevdLink, got: Got, n: int) -> None:
    def more() -> bool:
        link.recv_batch(8)
        return len(got) >= n

    wait_for(more)


def test_domains_by_file_srq_registration_and_hand_over(running: Running,  # noqa: F811
                                                        tmp_path: Path) -> None:
    a, b, c = running.client(), running.client(), running.client()
    one = os.open(tmp_path / "one", os.O_RDONLY | os.O_CREAT, 0o400)
    again = os.open(tmp_path / "one", os.O_RDONLY)
    two = os.open(tmp_path / "two", os.O_RDONLY | os.O_CREAT, 0o400)
    try:
        da, db = a.xrcd_open(one), b.xrcd_open(again)  # the same file: the same domain
        dc = c.xrcd_open(two)
        assert da == db != dc
        srqn = a.alloc_qpn()
        other = b.alloc_qpn()
        # only the owner of the QPN registers it, only in a domain it has open
        assert _errno(b.xrc_srq, db, srqn) == errno.ENOENT
        assert _errno(a.xrc_srq, dc, srqn) == errno.EACCES
        a.xrc_srq(da, srqn)
        assert b.xrc_lookup(db, srqn) and not b.xrc_lookup(db, other)
        assert not a.xrc_lookup(da, srqn)  # its own SRQ is not another process's
        assert _errno(c.xrc_lookup, da, srqn) == errno.EACCES
        got = _sink(a)
        assert b.xrc_send(0x03, db, srqn, 0x123, 0x456, 7, b"payload")
        _drain(a, got, 1)
        assert got == [(0x03, srqn, 0x123, 0x456, 7, b"payload")]
        # a client of another domain, a domain it did not open, an unregistered SRQ
        stats = running.devd.counters
        refused = stats["xrc_refused"]
        assert c.xrc_send(0x03, dc, srqn, 1, 1, 0, b"x")
        assert c.xrc_send(0x03, da, srqn, 1, 1, 0, b"x")
        assert b.xrc_send(0x03, db, other, 1, 1, 0, b"x")
        wait_for(lambda: stats["xrc_refused"] == refused + 3)
        # the QPN freed: no longer an SRQ of the domain
        a.free_qpn(srqn)
        assert not b.xrc_lookup(db, srqn)
        a.xrcd_close(da)
        assert _errno(a.xrcd_close, da) == errno.ENOENT
        assert b.xrc_lookup(db, other) is False  # b's domain lives on
    finally:
        for fd in (one, again, two):
            os.close(fd)
        for link in (a, b, c):
            link.close()


def test_malformed_xrc_requests_and_records(running: Running,  # noqa: F811
                                            tmp_path: Path) -> None:
    """An XRCD_OPEN with a socket instead of a file is EBADF; a short hand-over record is
    counted malformed; a client that leaves takes its SRQs out of the domain."""
    a, b = running.client(), running.client()
    path = tmp_path / "dom"
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o400)
    s1, s2 = socket.socketpair()
    try:
        assert _errno(a.xrcd_open, s1.fileno()) == errno.EBADF
        da, db = a.xrcd_open(fd), b.xrcd_open(fd)
        srqn = a.alloc_qpn()
        a.xrc_srq(da, srqn)
        malformed = running.devd.counters["malformed"]
        b._data.send(bytes([XRC_RECORD]) + bytes(XHDR.size - 2))
        wait_for(lambda: running.devd.counters["malformed"] == malformed + 1)
        assert b.xrc_lookup(db, srqn)
        a.close()
        wait_for(lambda: not b.xrc_lookup(db, srqn))
    finally:
        os.close(fd)
        s1.close()
        s2.close()
        a.close()
        b.close()


def test_records_for_a_full_channel_wait_in_order(running: Running,  # noqa: F811
                                                  tmp_path: Path) -> None:
    """The SRQ owner's data channel is full (it reads nothing for a while): the records
    (acknowledged by the sender's TGT QP) wait in devd and reach it later, all of them,
    in order; none is dropped (``client_full``). Before the backlog devd dropped what
    did not fit."""
    a, b = running.client(), running.client()
    fd = os.open(tmp_path / "dom", os.O_RDONLY | os.O_CREAT, 0o400)
    try:
        da, db = a.xrcd_open(fd), b.xrcd_open(fd)
        srqn = a.alloc_qpn()
        a.xrc_srq(da, srqn)
        got = _sink(a)
        full = running.devd.counters["client_full"]
        n, size = 2500, 4096  # 10 MiB in MTU-sized packets: more than the channel holds
        for k in range(n):
            payload = k.to_bytes(4, "big") * (size // 4)
            wait_for(lambda: b.xrc_send(0x03, db, srqn, 0x123, 0x456, k, payload),  # noqa: B023
                     timeout=30)
        devd = running.devd
        wait_for(lambda: bool(getattr(devd, "_xrc_backlog", None))  # the channel filled up
                 or devd.counters["client_full"] > full, timeout=30)
        _drain(a, got, n)
        assert [(g[4], g[5][:4], len(g[5])) for g in got] == [
            (k, k.to_bytes(4, "big"), size) for k in range(n)]
        assert running.devd.counters["client_full"] == full
        wait_for(lambda: not getattr(devd, "_xrc_backlog", None))
    finally:
        os.close(fd)
        a.close()
        b.close()


def test_credit_records_go_from_the_srq_owner_to_the_tgt_qp_owner(
        running: Running, tmp_path: Path) -> None:  # noqa: F811
    """A credit record (``XF_CREDIT``: the owner consumed packets of a TGT QP) goes from
    the client that registered the SRQ to the client owning the TGT QPN, in the same
    domain; from another client, or for a TGT QPN of no client of the domain, it is
    refused and counted."""
    a, b, c = running.client(), running.client(), running.client()
    fd = os.open(tmp_path / "dom", os.O_RDONLY | os.O_CREAT, 0o400)
    other = os.open(tmp_path / "other", os.O_RDONLY | os.O_CREAT, 0o400)
    try:
        da, db, dc = a.xrcd_open(fd), b.xrcd_open(fd), c.xrcd_open(other)
        srqn, tgt, tgt_c = a.alloc_qpn(), b.alloc_qpn(), c.alloc_qpn()
        a.xrc_srq(da, srqn)
        assert XF_CREDIT == xrc.XF_CREDIT
        got = _sink(b)
        assert a.xrc_send(XF_CREDIT, da, srqn, tgt, 0, 16, b"")
        _drain(b, got, 1)
        assert got == [(XF_CREDIT, srqn, tgt, 0, 16, b"")]
        stats = running.devd.counters
        refused = stats["xrc_refused"]
        assert b.xrc_send(XF_CREDIT, db, srqn, tgt, 0, 16, b"")  # not the SRQ's owner
        assert a.xrc_send(XF_CREDIT, da, srqn, tgt_c, 0, 16, b"")  # c: another domain
        assert c.xrc_send(XF_CREDIT, dc, srqn, tgt, 0, 16, b"")
        wait_for(lambda: stats["xrc_refused"] == refused + 3)
        assert len(got) == 1
    finally:
        os.close(fd)
        os.close(other)
        for link in (a, b, c):
            link.close()
