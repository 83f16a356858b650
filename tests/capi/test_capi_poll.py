"""``softrdma run``: a thread spinning on an empty ``ibv_poll_cq`` while its process waits
for a completion runs the receive step itself, which sleeps in the kernel until input
(issue 22: a busy-polling program on a loaded 2-core machine; tests/capi/poll_sleep.c,
tests/capi/wc_check.c)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.capi import compile_c, need_build, run
from harness.device import private_device


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    need_build()
    yield private_device("capipoll", tmp_path, monkeypatch)


def _run_ok(exe: Path, device: str, *args: str) -> str:
    """``exe DEVICE ARGS`` under ``softrdma run``, which must exit 0: its stdout."""
    p = run(str(exe), device, *args)
    assert p.returncode == 0, (p.stdout, p.stderr)
    return p.stdout


def test_busy_empty_polls_sleep_idle_ones_spin(device: str, tmp_path: Path) -> None:
    """After a post, a run of empty polls ends in futex sleeps (voluntary context switches
    of the polling thread); with nothing posted or completed for long, polls spin."""
    out = _run_ok(compile_c(tmp_path, "poll_sleep", "-libverbs"), device)
    busy = re.search(r"busy_nvcsw (\d+)", out)
    idle = re.search(r"idle_nvcsw (\d+)", out)
    assert busy and idle, out
    # 20000 empty polls: one sleep per 257 once the spin is over (<= 77 sleeps, fewer
    # when a sleep outlasts the busy window on a loaded machine)
    assert int(busy.group(1)) >= 2, out
    assert int(idle.group(1)) <= 1, out



def _hops(exe: Path, device: str, mode: str) -> tuple[int, int, float, str]:
    """wc_check's ``hops`` or ``hopsx`` mode: (the other threads' wake-ups, rounds,
    seconds, output)."""
    out = _run_ok(exe, device, mode)
    m = re.search(r"hops_nvcsw (\d+) rounds (\d+) seconds ([\d.]+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2)), float(m.group(3)), out


@pytest.mark.parametrize("mode", ["hops", "hopsx"])
def test_busy_poller_receives_itself(device: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """A thread that busy-polls for its answer runs the receive step itself once its
    short spin is over (sr_py_progress): the answer reaches it without a hand-off from
    the progress thread, which stands back meanwhile. In 400 loopback SEND rounds (a SEND
    and its ACK each) the process's other threads then wake far fewer times than once a
    round; with hand-offs (``SOFTRDMA_CAPI_INLINE=0``) they wake 3-4 times a round.

    On a busy machine the poller is descheduled for longer than the progress thread's
    grace time now and then, and the thread takes those answers: there the same program
    with hand-offs is run too, and the receive step must at least halve the wake-ups."""
    exe = compile_c(tmp_path, "wc_check", "-libverbs")
    wakes, rounds, seconds, out = _hops(exe, device, mode)
    # standing back, the progress thread wakes at most once per POLL_GRACE (5 ms) to
    # look again (its waits grow to STAND_BACK_MAX while the polls go on)
    if wakes < rounds / 2 + seconds / 0.005:
        return
    monkeypatch.setenv("SOFTRDMA_CAPI_INLINE", "0")
    handoff, _rounds, _seconds, out0 = _hops(exe, device, mode)
    assert wakes < handoff / 2, (out, out0)


def test_receiver_exiting_after_its_completion_acks_it(device: str, tmp_path: Path) -> None:
    """A busy poller's receive step leaves the ACK of what it received pending (it leaves
    with the next post, beside the program's next request). A C program that returns
    from main right after its last completion, closing nothing, still sends it (at exit):
    its peer's SEND completes with IBV_WC_SUCCESS, not RETRY_EXC_ERR once its retries are
    spent (tests/capi/exit_ack.c, two processes)."""
    out = _run_ok(compile_c(tmp_path, "exit_ack", "-libverbs"), device)
    assert out.splitlines() == ["send status success", "ok"], out
