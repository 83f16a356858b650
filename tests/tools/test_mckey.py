"""``softrdma mckey`` (librdmacm's mckey): a receiver and a sender in two processes join
an IPv4 group on the RoCE device on lo (shared through devd), the sender's messages
reach every receiving id, both leave; mckey's output lines; send-only joins (``-o``) are
not attached; ``-l`` is refused as rxe refuses QP create flags; argument errors."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.rdma_cm import Ep, child_env, expect, make_state_dir, setup_env
from harness.wait import waits_until_stopped

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm import rdma_cm as rc
from softrdma.cm import rdma_mcast

T = rc.RdmaCmEventType


def _tool(*args: str) -> list[str]:
    return [sys.executable, "-m", "softrdma", "mckey", *args]


def _group() -> str:
    return f"239.{random.randrange(1, 250)}.{random.randrange(1, 250)}.{random.randrange(1, 250)}"


def _joined(group: str) -> str:
    return f"mckey: joined dgid: ::ffff:{group} mlid 0x0 sl 0"


@pytest.mark.iba("10.5.2.1")
def test_receiver_and_sender(tmp_path: Path) -> None:
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    group = _group()
    common = ["-m", group, "-b", "127.0.0.1", "-C", "5", "-S", "300", "--timeout", "20"]
    rx = subprocess.Popen(_tool(*common, "-c", "2", "--settle", "0"), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert rx.stdout is not None
        lines = [rx.stdout.readline().rstrip("\n") for _ in range(5)]
        assert lines == ["mckey: starting server", "mckey: joining", _joined(group),
                         _joined(group), "receiving data transfers"]
        tx = subprocess.run(_tool(*common, "-s", "--settle", "0.2"), env=env,
                            capture_output=True, text=True, timeout=60)
        assert tx.returncode == 0, tx.stdout + tx.stderr
        assert tx.stdout.splitlines() == [
            "mckey: starting client", "mckey: joining", _joined(group),
            "initiating data transfers", "data transfers complete", "test complete",
            "return status 0"]
        out, err = rx.communicate(timeout=60)
        assert rx.returncode == 0, out + err
        assert out.splitlines() == ["data transfers complete", "test complete",
                                    "return status 0"]
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.communicate()


def test_receiver_waits_for_the_first_message_then_times_out(tmp_path: Path) -> None:
    """Nobody sends: the receiver keeps waiting (no timeout before the first message)."""
    state, _ = make_state_dir(tmp_path)
    # still waiting, past --timeout, once it waits for data
    waits_until_stopped(_tool("-m", _group(), "-b", "127.0.0.1", "--settle", "0", "--timeout",
                              "1"), child_env(state), "receiving data transfers", on="stdout",
                        stop=False)


@pytest.fixture
def cm_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from setup_env(tmp_path, monkeypatch)


def _ud_join(group: str, *, send_only: bool) -> tuple[rc.EventChannel, rc.CmId, Ep, Any]:
    ch = rc.EventChannel()
    cid = rc.CmId(ch, rc.RDMA_PS_UDP)
    cid.resolve_addr(("127.0.0.1", 0), (group, 0))
    expect(ch, T.ADDR_RESOLVED)
    ep = Ep(cid, ud=True)
    for i in range(4):
        ep.recv(256, wr_id=i)
    rdma_mcast.join(cid, group, send_only=send_only)
    ev = expect(ch, T.MULTICAST_JOIN)
    assert ev.ud is not None and ev.ud.qp_num == rdma_mcast.MULTICAST_QPN
    return ch, cid, ep, v.AH(ep.pd, ev.ud.ah_attr)


@pytest.mark.parametrize("send_only", [False, True])
def test_send_only_member_is_not_attached(cm_env: Path, send_only: bool) -> None:
    """A full member receives its own multicast (loopback); a send-only full member
    (mckey -o, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) is not attached and does not,
    while the group's full members still get its messages."""
    group = _group()
    _ch1, rx_id, rx, _ah1 = _ud_join(group, send_only=False)
    _ch2, tx_id, tx, ah = _ud_join(group, send_only=send_only)
    try:
        wr = v.SendWR(9, None, 1, [v.SGE(tx.mr.addr, 64, tx.mr.lkey)], e.IBV_WR_SEND, 0)
        wr.set_wr_ud(ah, rdma_mcast.MULTICAST_QPN, 0x01234567)
        tx.qp.post_send(wr)
        got = rx.wait(1)
        assert [w.byte_len for w in got] == [64 + 40]  # the GRH area, then the payload
        own = tx.wait(1, timeout=1.0)
        assert len(own) == (0 if send_only else 1)
        rdma_mcast.leave(tx_id, group, send_only=send_only)
        rdma_mcast.leave(rx_id, group)
    finally:
        for cid in (rx_id, tx_id):
            cid.destroy_qp()
            cid.destroy()


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    state, _ = make_state_dir(tmp_path)
    return subprocess.run(_tool(*args), env=child_env(state), capture_output=True, text=True,
                          timeout=60)


def test_no_loopback_is_refused_as_rxe_does(tmp_path: Path) -> None:
    r = _run(tmp_path, "-m", _group(), "-b", "127.0.0.1", "-l", "--settle", "0")
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        "mckey: starting server", "mckey: joining",
        "mckey: unable to create QP: Operation not supported",
        "mckey: failure leaving: Cannot assign requested address", "test complete",
        "return status -95"]


def test_message_larger_than_the_mtu(tmp_path: Path) -> None:
    r = _run(tmp_path, "-m", _group(), "-b", "127.0.0.1", "-S", "5000", "--settle", "0")
    assert r.returncode == 1
    assert "mckey: message_size 5000 is larger than active mtu 4096" in r.stdout.splitlines()


@pytest.mark.parametrize(("args", "message"), [
    (["-m", "10.0.0.1"], "-m: 10.0.0.1 is not a multicast address"),
    (["-M", "ff0e::1"], "-M: unmapped multicast address requires binding to source address"),
    (["-M", "ff0e::1", "-b", "::1"], "-M: an unmapped multicast address is an AF_IB address"),
    (["-m", "239.1.1.1", "-p", "0x2"], "-p: the IPoIB port space needs an InfiniBand port"),
    (["-m", "239.1.1.1", "-C", "-1"], "-C: must be at least 0, got -1"),
])
def test_argument_errors(tmp_path: Path, args: list[str], message: str) -> None:
    r = _run(tmp_path, *args)
    assert r.returncode == 1
    assert r.stderr.startswith(f"softrdma mckey: error: {message}"), r.stderr
    assert "Traceback" not in r.stderr
