"""The state directory cannot be taken over by another local user (issue 13 item 3): it is
created 0700 and refused when it is a symbolic link, not a directory, owned by someone
else or writable by others; its files are opened with O_NOFOLLOW."""

from __future__ import annotations

import io
import os
import pwd
import stat
from pathlib import Path

import pytest

from softrdma.drivers.devd.daemon import Devd
from softrdma.drivers.host.registry import DeviceRecord, Registry, ensure_state_dir
from softrdma.errors import DeviceError
from softrdma.tools.admin.link import cmd_link

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def test_created_with_mode_0700(tmp_path: Path) -> None:
    d = tmp_path / "softrdma-1000"
    ensure_state_dir(d)
    st = os.lstat(d)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.geteuid()
    ensure_state_dir(d)  # an existing safe directory is accepted again


def test_symlinked_directory_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    planted = tmp_path / "softrdma-1000"
    planted.symlink_to(victim)
    with pytest.raises(DeviceError, match="symbolic link"):
        ensure_state_dir(planted)
    with pytest.raises(DeviceError, match="symbolic link"):
        Registry(planted).add("r1", "lo")
    assert list(victim.iterdir()) == []


def test_plain_file_refused(tmp_path: Path) -> None:
    f = tmp_path / "softrdma-1000"
    f.write_text("")
    with pytest.raises(DeviceError, match="not a directory"):
        ensure_state_dir(f)


def test_writable_by_others_refused(tmp_path: Path) -> None:
    d = tmp_path / "softrdma-1000"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(DeviceError, match="writable by other users"):
        ensure_state_dir(d)


@needs_root
def test_foreign_owned_directory_refused_with_a_clear_cli_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "softrdma-1000"
    d.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(d, nobody, -1)
    with pytest.raises(DeviceError, match="owned by uid"):
        ensure_state_dir(d)
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(d))
    out, err = io.StringIO(), io.StringIO()
    assert cmd_link(["add", "r1", "netdev", "lo"], stdout=out, stderr=err) == 1
    assert err.getvalue().startswith("softrdma link: error: ") and err.getvalue().count("\n") == 1
    assert "owned by uid" in err.getvalue() and list(d.iterdir()) == []


def test_planted_pid_file_link_is_not_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ensure_state_dir(state)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (state / "t9.pid").symlink_to(victim)
    d = Devd(DeviceRecord("t9", "lo", "roce", 0), state, ips=["127.0.0.1"])
    with pytest.raises(DeviceError):
        d.start()
    assert victim.read_text() == "precious\n"


def test_planted_lock_file_link_is_not_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ensure_state_dir(state)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (state / "devices.lock").symlink_to(tmp_path / "created-by-us")
    with pytest.raises(DeviceError):
        Registry(state).add("r1", "lo")
    assert not (tmp_path / "created-by-us").exists()
