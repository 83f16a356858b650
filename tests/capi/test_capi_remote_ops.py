"""``softrdma run``: memory windows through libibverbs (``ibv_alloc_mw``,
``ibv_bind_mw``, ``ibv_dealloc_mw``, ``IBV_WR_BIND_MW`` and ``IBV_WR_LOCAL_INV`` in
``ibv_post_send``, ``ibv_wr_bind_mw`` and ``ibv_wr_local_inv``; IBA 10.6.7) and the RDMA
Atomic Write (``ibv_wr_atomic_write``; IBA 1.5), checked by tests/capi/remote_ops.c: the
bytes a WRITE or READ through a window moves, the keys each bind, rebind, unbind and
invalidation leaves working, the 8 bytes an Atomic Write stores, the completions'
fields."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.capi import compile_c, need_build, run
from harness.device import private_device

from softrdma.verbs.device import IWARP_LOOPBACK

OKS = [
    "ok: type 1 bind completes as BIND_MW with the next key",
    "ok: type 1 WRITE and READ through the window land in its range",
    "ok: type 1 WRITE past the window's end -> remote access error",
    "ok: type 1 rebind: the new key works, the old one -> remote access error",
    "ok: type 1 unbind -> remote access error",
    "ok: type 2 BIND_MW work request; WRITE and READ through the window",
    "ok: SEND_WITH_INV revokes a type 2 window (WITH_INV, invalidated_rkey)",
    "ok: LOCAL_INV revokes a type 2 window, completes as LOCAL_INV",
    "ok: ibv_wr_bind_mw and ibv_wr_local_inv; a read-only window refuses a WRITE",
    "ok: ibv_dealloc_mw revokes a bound type 2 window",
    "ok: ibv_wr_atomic_write stores 8 bytes; unaligned -> EINVAL; ibv_post_send refuses "
    "ATOMIC_WRITE (EOPNOTSUPP, bad_wr)",
    "ok: bad types -> EINVAL (ibv_alloc_mw, ibv_bind_mw, a BIND_MW request)",
    "ok: a bind to an MR without MW_BIND -> MW bind error completion",
    "ok: all",
]


@pytest.fixture()
def exe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    need_build()
    return compile_c(tmp_path, "remote_ops", "-libverbs")


def test_memory_windows_and_atomic_write_on_roce(exe: Path, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    device = private_device("capimw", tmp_path, monkeypatch)
    p = run(str(exe), device)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.splitlines() == OKS, p.stdout


def test_iwarp_has_no_memory_windows(exe: Path) -> None:
    p = run(str(exe), IWARP_LOOPBACK, "iwarp")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.splitlines() == ["ok: iWARP: ibv_alloc_mw -> EOPNOTSUPP"], p.stdout
