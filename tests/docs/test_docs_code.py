"""The Python blocks of the docs run as written (on a private RoCE device on lo), so the
pages stay true: docs/rdma_cm.md (blocking and asyncio use), docs/watch-the-packets.md
(the lossy fabric and its capture), docs/verbs-api.md (two RC QPs, blocking and asyncio),
docs/protocols.md (the ICRC worked examples)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness.rdma_cm import child_env, make_state_dir

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks(page: str) -> list[str]:
    return BLOCK.findall((DOCS / page).read_text())


@pytest.mark.parametrize(("page", "index", "expect"), [
    ("rdma_cm.md", 0, ["server got b'ping'"]),
    ("rdma_cm.md", 1, ["roce ('127.0.0.1', "]),
    ("watch-the-packets.md", 1, ["True ", "retransmitted: ", " ok, 0 failed"]),
    ("verbs-api.md", 1, ["GID ::ffff:127.0.0.1", "b received b'hello over RC' on its QP",
                         "a's buffer now holds b'written by b'"]),
    ("verbs-api.md", 2, ["b got b'ping 0'", "b got b'ping 2'", "a got b'pong'"]),
    ("protocols.md", 0, []),
])
def test_doc_block_runs(tmp_path: Path, page: str, index: int, expect: list[str]) -> None:
    blocks = _blocks(page)
    assert len(blocks) > index
    state, _ = make_state_dir(tmp_path)
    script = tmp_path / "block.py"
    script.write_text(blocks[index])
    r = subprocess.run([sys.executable, str(script)], env=child_env(state),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for text in expect:
        assert text in r.stdout, r.stdout
