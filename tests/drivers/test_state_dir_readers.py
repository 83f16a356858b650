"""Readers of the state directory trust it no more than writers do (issue 21 item 6): a
directory another user planted (owned by someone else, writable by others, or a symbolic
link) defines no device; ``Registry.list``, ``get_device_list``, ``Context``, ``softrdma
link`` and ``softrdma devices`` refuse it with an error naming it, as ``link add`` does."""

from __future__ import annotations

import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from softrdma import verbs as v
from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.host.registry import DeviceRecord, Registry
from softrdma.errors import DeviceError
from softrdma.tools.admin.link import cmd_link

PLANTED = {"version": 1,
           "devices": [{"name": "evil0", "netdev": "lo", "type": "roce", "udp_port": 4791}],
           "deleted_builtin": ["softrdma_lo"]}
OTHER_UID = 1001
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown and setuid need root")


def plant(d: Path) -> None:
    (d / "devices.json").write_text(json.dumps(PLANTED))


@pytest.fixture(params=["foreign-owner", "mode-0777", "symlink"])
def hijacked(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    d = tmp_path / "softrdma-1001"
    if request.param == "symlink":
        real = tmp_path / "elsewhere"
        real.mkdir(mode=0o700)
        plant(real)
        d.symlink_to(real)
        return d
    d.mkdir(mode=0o700)
    plant(d)
    if request.param == "mode-0777":
        d.chmod(0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(d, pwd.getpwnam("nobody").pw_uid, -1)
    return d


def test_readers_refuse_a_hijacked_directory(hijacked: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(hijacked))
    where = f"state directory {hijacked}"
    with pytest.raises(DeviceError, match=where):
        Registry().list()
    with pytest.raises(DeviceError, match=where):
        v.get_device_list()
    with pytest.raises(DeviceError, match=where):
        v.Context("evil0", shared=False)
    with pytest.raises(DeviceError, match=where):
        DevdLink(DeviceRecord("evil0", "lo"), spawn=False)  # a planted devd socket
    out, err = io.StringIO(), io.StringIO()
    assert cmd_link(["-d"], stdout=out, stderr=err) == 1
    assert "evil0" not in out.getvalue()
    assert err.getvalue().startswith("softrdma link: error: ") and where in err.getvalue()
    assert err.getvalue().count("\n") == 1


def test_a_safe_directory_is_still_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    plant(d)
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(d))
    assert [r.name for r in Registry().list()] == ["evil0"]
    assert [r.name for r in Registry(tmp_path / "absent").list()] == ["softrdma_lo"]


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory another uid can reach (pytest's tmp_path is private to root)."""
    base = Path(tempfile.mkdtemp(prefix="softrdma-h21-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


_AS_USER = """
import os, sys
# loaded as root: the interpreter's own files may not be readable by the other user
import softrdma.tools.cli as cli, softrdma.tools.ibverbs.devices, softrdma.verbs as v
from softrdma.errors import DeviceError
os.setgid({uid}); os.setgroups([]); os.setuid({uid})
rc = cli.main(["devices"])  # softrdma devices
print("@@split@@", flush=True)
print("@@split@@", file=sys.stderr, flush=True)
try:
    print([x.name for x in v.get_device_list()])
except DeviceError as exc:
    print(exc, file=sys.stderr)
    rc |= 2
sys.exit(rc)
"""


def _as_other_user(state: Path) -> tuple[int, list[str], list[str]]:
    """``softrdma devices`` and ``get_device_list()`` run as uid OTHER_UID: the exit
    status, and each one's stdout and stderr."""
    env = {k: val for k, val in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["SOFTRDMA_STATE_DIR"] = str(state)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    p = subprocess.run([sys.executable, "-c", _AS_USER.format(uid=OTHER_UID)], env=env,
                       cwd=state.parent, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout.split("@@split@@\n"), p.stderr.split("@@split@@\n")


@needs_root
@pytest.mark.parametrize("planted_by_other", [True, False])
def test_another_users_planted_directory(shared_tmp: Path, planted_by_other: bool) -> None:
    d = shared_tmp / f"softrdma-{OTHER_UID}"
    d.mkdir()
    plant(d)
    if planted_by_other:
        d.chmod(0o777)  # root's, open to everyone: the planted directory
    else:
        d.chmod(0o700)  # the user's own: read as before
        os.chown(d, OTHER_UID, OTHER_UID)
        os.chown(d / "devices.json", OTHER_UID, OTHER_UID)
    rc, out, err = _as_other_user(d)
    assert len(out) == len(err) == 2, (out, err)
    if planted_by_other:
        assert rc == 3 and "evil0" not in "".join(out)  # both refused
        for text in err:
            assert f"state directory {d}" in text and "Traceback" not in text
    else:
        assert rc == 0 and "evil0" in out[0], err
        # the registry's devices (softrdma_lo deleted, evil0 added) and the built-in iWARP one
        assert out[1].strip() == "['evil0', 'softrdma_iw_lo']", err
