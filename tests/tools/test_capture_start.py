"""The test harness's :class:`harness.wait.Capture` returns only once the capture tool
captures: tshark and dumpcap print ``Capturing on`` before they open the interface, and
on a busy machine a test's first frames went by in that gap (a live iWARP capture held
0 or 1 of its frames). With ``-w FILE`` dumpcap opens the interface, installs the filter,
then writes and flushes the file's header: the harness waits for that header."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from harness.wait import Capture

FAKE = """#!{python}
import sys, time
out = sys.argv[sys.argv.index("-w") + 1]
print("Capturing on 'Loopback: lo'", file=sys.stderr, flush=True)
time.sleep(0.5)  # the tool opening the interface and its filter: frames now are missed
with open(out, "wb") as fh:
    fh.write(b"\\x0a\\x0d\\x0d\\x0a" + bytes(24))  # a pcapng section header, flushed
    fh.flush()
    sys.stdin.read()  # capture until SIGINT
"""


def test_capture_returns_once_the_file_header_is_written(tmp_path: Path) -> None:
    tool = tmp_path / "dumpcap"  # named as the tool: the harness knows dumpcap's habits
    tool.write_text(FAKE.format(python=sys.executable))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "cap.pcapng"
    cap = Capture([str(tool), "-q", "-i", "lo", "-w", str(out)])
    try:
        assert out.exists() and out.stat().st_size > 0, "returned before the tool captured"
    finally:
        cap.stop()
    assert cap.proc.returncode is not None
    assert os.path.getsize(out) == 28
