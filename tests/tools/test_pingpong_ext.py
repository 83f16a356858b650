"""``rc-pingpong``'s feature flags as ``ibv_rc_pingpong`` has them: ``-o``/``-O``/``-P``
(on-demand paging: a softrdma MR is never pinned), ``-j`` (device memory: a zero-based
MR, SGE addresses from 0), ``-N`` (the ibv_wr_* post-send API) run the exchange with
``-c`` checking every byte; ``-t`` and the invalid combinations fail with the C tool's
lines, in its order; the device-memory limit is the one the pyverbs layer reports."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.rdma_cm import ROCE_DEV, make_state_dir

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.compat.pyverbs.device import MAX_DM_SIZE as PYVERBS_MAX_DM_SIZE
from softrdma.errors import StateError
from softrdma.tools.cli import main
from softrdma.tools.ibverbs import pingpong as pp
from softrdma.tools.ibverbs import pingpong_ext as ext
from softrdma.verbs.cq import COMPLETION_TIMESTAMP_MASK


@pytest.fixture
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    make_state_dir(tmp_path)
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("SOFTRDMA_SHARED", "0")  # both sides in this process, no devd
    yield ROCE_DEV


@pytest.mark.parametrize("flags", [["-o"], ["-O"], ["-o", "-P"], ["-O", "-P"], ["-j"],
                                   ["-N"], ["-j", "-N", "-s", "70000"], ["--odp", "--new_send"]])
def test_feature_runs_check_every_byte(device: str, flags: list[str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["rc-pingpong", "--loopback", "-d", device, "-n", "20", "-c", "--timeout", "20",
               *flags])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    lines = cap.out.splitlines()
    assert lines[0] == "server:" and lines[5] == "client:"
    assert lines[9].startswith("20 iters in ")


@pytest.mark.parametrize(("flags", "line"), [
    (["-o", "-j"], "DM memory region can't be on demand"),
    (["-O", "-j", "-P"], "DM memory region can't be on demand"),
    (["-P"], "prefetch is valid only with on-demand memory region"),
    (["-P", "-t"], "prefetch is valid only with on-demand memory region"),
    (["-j", "-s", str(ext.MAX_DM_SIZE + 1)], "Device memory is insufficient"),
])
def test_refusals_are_the_c_tool_lines(device: str, flags: list[str], line: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["rc-pingpong", "--loopback", "-d", device, "-n", "2", *flags])
    err = capsys.readouterr().err
    assert rc == 1
    assert err == f"softrdma rc-pingpong: error: {line}\n"


@pytest.mark.parametrize("flags", [["-t"], ["-t", "-e"]])
def test_completion_timestamps(device: str, flags: list[str],
                               capsys: pytest.CaptureFixture[str]) -> None:
    """-t: each side reports the completion clock's cycles (ns) between its receive
    completions, as ibv_rc_pingpong -t: Min <= Average <= Max, 19 gaps of 20 receives
    within the run's own time (the client's first receive comes after its start)."""
    began = time.monotonic_ns()
    rc = main(["rc-pingpong", "--loopback", "-d", device, "-n", "20", "--timeout", "20",
               *flags])
    span = time.monotonic_ns() - began
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    found = re.findall(r"^(Max|Min|Average) receive completion clock cycles = ([\d.]+)$",
                       cap.out, re.M)
    assert [k for k, _ in found] == ["Max", "Min", "Average"] * 2, cap.out
    for i in (0, 3):
        mx, mn, avg = (float(v) for _, v in found[i:i + 3])
        assert 0 < mn <= avg <= mx, cap.out
        assert avg * 19 <= span, (cap.out, span)


def test_recv_clock_counts_across_a_wrap() -> None:
    c = ext.RecvClock()
    assert c.lines() == []
    c.add(100)
    c.add(250)
    c.add(COMPLETION_TIMESTAMP_MASK - 9)  # a huge gap, then the clock wraps
    c.add(40)  # 10 + 40 cycles after the last
    assert (c.min, c.n) == (50, 3) and c.max == COMPLETION_TIMESTAMP_MASK - 259
    assert c.lines()[1] == "Min receive completion clock cycles = 50"
    assert c.lines()[2].startswith("Average receive completion clock cycles = ")


def test_device_memory_limit_is_the_device_s() -> None:
    assert ext.MAX_DM_SIZE == PYVERBS_MAX_DM_SIZE


def test_dm_buffer_is_zero_based(device: str) -> None:
    ns = argparse.Namespace(dm=True)
    opts = pp.Options(kind="rc", ib_dev=device, size=4096, rx_depth=4,
                      ext=ext.ExtOptions.from_args(ns))
    ctx = pp.open_context(opts)
    ep = pp.Endpoint(ctx, opts)
    try:
        assert ep.addr == 0  # SGEs start at 0, as with ibv_reg_dm_mr
        assert ep.mr.access & int(e.IBV_ACCESS_ZERO_BASED)
    finally:
        ep.close()
        ctx.close()


class _FakeQP:
    def __init__(self) -> None:
        self.posted: list[Any] = []

    def post_send(self, wr: Any) -> None:
        self.posted.append(wr)


def test_new_send_batch_posts_on_complete_only() -> None:
    qp = _FakeQP()
    b = ext.NewSendBatch(qp, v)
    with pytest.raises(StateError):
        b.wr_send()
    b.wr_start()
    b.wr_id, b.wr_flags = 7, int(e.IBV_SEND_SIGNALED)
    b.wr_send()
    b.wr_set_sge(0x1234, 64, 100)
    assert qp.posted == []
    b.wr_complete()
    (wr,) = qp.posted
    assert (wr.wr_id, wr.opcode, wr.send_flags) == (7, int(e.IBV_WR_SEND),
                                                      int(e.IBV_SEND_SIGNALED))
    assert [(s.addr, s.length, s.lkey) for s in wr.sg_list] == [(64, 100, 0x1234)]
    with pytest.raises(StateError):
        b.wr_complete()
