"""Debian's real pyverbs for ``softrdma run`` tests (skips when it is missing).

(Moved from tests/capi/test_capi_pyverbs.py, which other test files imported.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from softrdma.tools.suites import rdma_core_tests as rct


def need_real_pyverbs(tmp_path: Path) -> Path:
    """A directory holding only a link to the real pyverbs (skip when not installed)."""
    package = rct.REAL_PYVERBS_DIR / "pyverbs"
    if not (package / "__init__.py").is_file():
        pytest.skip("python3-pyverbs is not installed (Debian package python3-pyverbs)")
    link = tmp_path / "real-pyverbs"
    link.mkdir()
    (link / "pyverbs").symlink_to(package)
    return link
