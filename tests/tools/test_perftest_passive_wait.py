"""The passive side of a one-sided perftest (the target of WRITEs and READs) waits for
the active side's whole run, as perftest's server does (issue 25: ``read-bw -a`` failed
at 4 MiB because the server gave up after ``--timeout`` while its client was still
reading, and the client then saw its peer close). ``--timeout`` still bounds a wait for
a peer that makes no progress; a peer that dies closes the exchange channel."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.perftest import device_state, run_pair


@pytest.fixture()
def state(tmp_path: Path) -> Iterator[Path]:
    yield from device_state(tmp_path)


@pytest.mark.parametrize(("tool", "run"), [
    ("write-bw", ["-s", "4096", "-D", "3"]),  # 3 s, three times the server's --timeout
    ("read-bw", ["-s", "4096", "-D", "3"]),
    ("read-lat", ["-s", "64", "-n", "40000"]),  # 40,000 READs one at a time: seconds
])
def test_passive_server_outwaits_its_timeout(state: Path, tool: str, run: list[str]) -> None:
    srv, cli = run_pair(tool, state, ["-d", "pttest", *run], server_extra=["--timeout", "1"])
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert srv.returncode == 0, srv.stdout + srv.stderr
    assert "did not answer" not in srv.stderr
