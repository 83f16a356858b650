"""The IPoIB control sockets' readers (``ipoib show``/``down``) apply the state directory
checks writers make (issue 21 item 6: every path that reads state): a planted directory,
one open to other users or a symbolic link, is refused with an error naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from softrdma.drivers.host import ipoib_control
from softrdma.errors import DeviceError


def _tree(base: Path) -> Path:
    d = ipoib_control.control_dir(base)
    d.mkdir(parents=True, mode=0o700)
    base.chmod(0o700)
    (base / "ipoib").chmod(0o700)
    return d


def test_own_directory_is_read(tmp_path: Path) -> None:
    base = tmp_path / "state"
    d = _tree(base)
    (d / "ib9.sock").touch()
    assert ipoib_control.running(base) == ["ib9"]
    assert ipoib_control.running(tmp_path / "none") == []
    with pytest.raises(DeviceError, match="not answering"):
        ipoib_control.control_request("ib9", "show", directory=base, timeout=5)


@pytest.mark.parametrize("level", ["state", "ipoib", "netns"])
def test_directory_open_to_others_is_refused(tmp_path: Path, level: str) -> None:
    base = tmp_path / "state"
    d = _tree(base)
    (d / "ib9.sock").touch()
    bad = {"state": base, "ipoib": base / "ipoib", "netns": d}[level]
    bad.chmod(0o777)
    with pytest.raises(DeviceError, match=f"state directory {bad} is writable by other"):
        ipoib_control.running(base)
    with pytest.raises(DeviceError, match=f"state directory {bad}"):
        ipoib_control.control_request("ib9", "show", directory=base, timeout=5)


def test_symlinked_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    _tree(real)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(DeviceError, match="symbolic link"):
        ipoib_control.running(link)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a directory of another uid")
def test_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "state"
    _tree(base)
    os.chown(base / "ipoib", 1001, 1001)
    with pytest.raises(DeviceError, match="owned by uid 1001"):
        ipoib_control.running(base)
