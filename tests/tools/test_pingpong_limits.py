"""rc-pingpong at sizes and failures the exchange does not usually see (issue 13):

* item 11: a large message keeps one buffer per side (receive + send area, the --chk
  pattern being the send area itself, no further copies), and the completion timeout is
  progress-based: a transfer longer than ``--timeout`` completes while packets move;
* item 7: with ``-e``, a devd that dies mid-run gives each side one clear error line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.pingpong import _env, _kill_devd, _spawn, device  # noqa: F401
from harness.ports import free_port
from harness.wait import StreamLines, wait_until

MiB = 1 << 20
SIZE = 32 * MiB


def _maxrss_of(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str],
                                                             float]:
    """Run ``softrdma ARGS`` in a child that reports its own peak RSS (MiB)."""
    code = ("import resource, runpy, sys\n"
            "sys.argv = ['softrdma', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('softrdma', run_name='__main__')\n"
            "finally:\n"
            "    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, text=True,
                       capture_output=True, timeout=300)
    rss_kib = int(p.stderr.strip().splitlines()[-1])
    return p, rss_kib / 1024


def test_large_message_one_buffer_per_side_and_progress_based_timeout(device: str) -> None:  # noqa: F811
    env = _env()
    base = ["rc-pingpong", "--loopback", "-d", device, "-n", "1", "-c"]
    small, rss_small = _maxrss_of([*base, "-s", "4096", "-p", str(free_port())],
                                  env)
    assert small.returncode == 0, small.stderr
    t0 = time.monotonic()
    # --timeout 1: the 32 MiB message takes longer than that to move (Python, loopback)
    big, rss_big = _maxrss_of([*base, "-s", str(SIZE), "--timeout", "1",
                               "-p", str(free_port())], env)
    took = time.monotonic() - t0
    assert big.returncode == 0, big.stderr
    assert f"{2 * SIZE} bytes in" in big.stdout  # rc_pingpong counts both directions
    buffers = 2 * 2 * SIZE / MiB  # two sides, each a receive and a send area
    print(f"\n[pingpong] -s {SIZE}: peak RSS {rss_big:.0f} MiB (tiny run {rss_small:.0f} MiB, "
          f"buffers {buffers:.0f} MiB), {took:.1f} s with --timeout 1")
    assert rss_big - rss_small < 1.25 * buffers


def test_devd_death_gives_one_error_line_with_events(device: str, tmp_path: Path) -> None:  # noqa: F811
    tcp = free_port()
    common = ["rc-pingpong", "-e", "-d", device, "-p", str(tcp), "-n", "100000000",
              "--timeout", "60"]
    env = _env()
    env["SOFTRDMA_SHARED"] = "1"
    procs = [_spawn([*common, "--bind", "127.0.0.1"], env)]
    try:
        procs.append(_spawn([*common, "127.0.0.1"], env))  # it retries until the server listens
        outs = [StreamLines(p.stdout) for p in procs if p.stdout is not None]
        errs = [StreamLines(p.stderr) for p in procs if p.stderr is not None]
        pidfile = Path(os.environ.get("SOFTRDMA_STATE_DIR", tmp_path)) / f"{device}.pid"
        wait_until(pidfile.exists, what="devd's pid file")
        for out in outs:  # both sides exchanged their addresses: the ping-pong runs
            out.wait_for("remote address")
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        for p, e in zip(procs, errs, strict=True):
            p.wait(timeout=120)
            err = e.join()
            assert p.returncode == 1
            # the server's "waiting for a client on PORT" (tools.waiting), then one error
            lines = [x for x in err.splitlines() if "waiting for a client on" not in x]
            assert len(lines) == 1, err
            assert lines[0].startswith("softrdma rc-pingpong: error: ") and "devd" in lines[0]
            assert "Traceback" not in err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


