"""perftest tools when a run fails (issue 25) and the duration-mode progress line
(issue 24): under ``--json`` a failed run still prints its JSON object, with the error
(and exits 1); a server whose client dies notices it promptly (the exchange channel
closed), not after ``--timeout``; ``-D`` shows its progress against the duration."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.perftest import device_state, env_for, spawn
from harness.ports import free_port

from softrdma.tools.perftest import report

DEADLINE = 60.0  # generous: the machine may be busy (s)


@pytest.fixture()
def state(tmp_path: Path) -> Iterator[Path]:
    yield from device_state(tmp_path)


def test_duration_progress_is_measured_against_the_duration() -> None:
    buf = io.StringIO()
    p = report.Progress(True, 5000, "write-bw 65536 B", buf, duration=6.0)
    p.start -= 3.0  # half way through a 6 s run, far more messages than -n
    p.update(27970)
    line = buf.getvalue()
    assert "/5000" not in line and "559" not in line, line
    assert "27970 done" in line and "/6 s" in line and "50." in line, line
    p.finish()


def test_a_failed_json_run_prints_its_object_with_the_error(state: Path) -> None:
    port = free_port()  # nobody listens there
    p = spawn(["write-bw", "-d", "pttest", "-p", str(port), "--timeout", "1", "--json",
               "127.0.0.1"], env_for(state))
    out, err = p.communicate(timeout=DEADLINE)
    assert p.returncode == 1, (out, err)
    obj = json.loads(out)  # one JSON object, nothing else
    assert obj["test"] == "write-bw" and obj["role"] == "client" and obj["results"] == []
    assert obj["error"].startswith("Couldn't connect to 127.0.0.1:"), obj
    assert err.startswith("softrdma write-bw: error: Couldn't connect"), err


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_server_notices_a_dead_client_promptly(state: Path) -> None:
    """A send-lat client killed in the middle of its run: the server (waiting for the
    next message, with a --timeout of 120 s) fails within seconds, and prints its JSON."""
    env = env_for(state)
    port = str(free_port())
    common = ["send-lat", "-d", "pttest", "-p", port, "-s", "64", "--timeout", "120"]
    srv = spawn([*common, "--json"], env)
    cli = None
    try:
        end = time.monotonic() + DEADLINE
        while cli is None or cli.poll() is None:
            if cli is None:
                cli = spawn([*common, "-n", "100000000", "127.0.0.1"], env)
                assert cli.stdout is not None
                for line in cli.stdout:  # the table header: the run starts next
                    if line.lstrip().startswith("#bytes"):
                        break
                cpu0 = _cpu_s(cli.pid)
            if _cpu_s(cli.pid) - cpu0 > 0.5:  # well into the run
                break
            assert time.monotonic() < end, "the client never started its run"
            time.sleep(0.05)
        assert cli.poll() is None, cli.communicate()
        cli.kill()
        cli.communicate()
        t0 = time.monotonic()
        out, err = srv.communicate(timeout=DEADLINE)
        waited = time.monotonic() - t0
    finally:
        for p in (srv, cli):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    assert srv.returncode == 1, (out, err)
    assert waited < 20, f"the server waited {waited:.1f} s for a dead client"
    assert "peer closed" in json.loads(out)["error"], out
