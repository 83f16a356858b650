"""``softrdma run``: a C program of our own checks completion fields and libibverbs-style
errors (tests/capi/wc_check.c); the wrapper refuses what it cannot preload; the build
names the packages it misses."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from capi_harness import need_build, run
from device_harness import private_device

from softrdma.capi import build, launch

HERE = Path(__file__).resolve().parent


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    need_build()
    yield private_device("capiwc", tmp_path, monkeypatch)


def _compile(tmp_path: Path, name: str, *flags: str) -> Path:
    exe = tmp_path / name
    p = subprocess.run(["gcc", "-O2", "-Wall", "-o", str(exe), str(HERE / "capi" / f"{name}.c"),
                        *flags], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    return exe


def test_completion_fields_errors_and_fork(device: str, tmp_path: Path) -> None:
    """tests/capi/wc_check.c: the fields of a SEND-with-immediate's completions (inline
    data from an unregistered buffer), a remote access error completion, libibverbs-style
    errors, a CQ overrun's asynchronous event; and fork: a C fork() runs Python's at-fork handlers through the library's
    pthread_atfork, so the child gives up the device it inherited (its QP fails) and opens
    its own, and the parent goes on."""
    exe = _compile(tmp_path, "wc_check", "-libverbs")
    p = run(str(exe), device, "fork")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "ok: fork: the child opens its own device, its inherited QP fails" in p.stdout
    oks = [ln for ln in p.stdout.splitlines() if ln.startswith("ok: ")]
    assert len(oks) == 11, p.stdout
    assert "ok: bad R_Key -> remote access error" in oks
    assert "ok: bad R_Key -> local access violation work queue error on the responder's QP" in oks
    assert "ok: CQ overrun -> CQ error on that CQ; the queued completion stays pollable" in oks


def test_empty_poll_and_completion_cost(device: str, tmp_path: Path) -> None:
    """The figures the design promises in order of magnitude: an empty ibv_poll_cq stays
    in C (well under a microsecond even with its occasional yield)."""
    exe = _compile(tmp_path, "wc_check", "-libverbs")
    p = run(str(exe), device, "bench")
    assert p.returncode == 0, (p.stdout, p.stderr)
    empty = re.search(r"empty_poll_ns ([\d.]+)", p.stdout)
    rnd = re.search(r"send_round_us ([\d.]+)", p.stdout)
    assert empty and rnd, p.stdout
    # entering Python for an empty poll would cost several microseconds
    assert float(empty.group(1)) < 2000, p.stdout


def test_refuses_setuid_program(tmp_path: Path) -> None:
    need_build()
    exe = tmp_path / "suid-true"
    shutil.copy(shutil.which("true") or "/bin/true", exe)
    exe.chmod(0o755 | stat.S_ISUID)
    p = run(str(exe))
    assert p.returncode == 1
    assert "setuid" in p.stderr and p.stderr.count("\n") == 1


def test_refuses_static_program(tmp_path: Path) -> None:
    need_build()
    src = tmp_path / "s.c"
    src.write_text("int main(void) { return 0; }\n")
    exe = tmp_path / "static-prog"
    c = subprocess.run(["gcc", "-static", "-o", str(exe), str(src)], capture_output=True,
                       check=False)
    if c.returncode != 0:
        pytest.skip("no static libc here (Debian package libc6-dev)")
    assert launch.why_not_preloadable(str(exe)) is not None
    p = run(str(exe))
    assert p.returncode == 1 and "statically linked" in p.stderr


def test_dynamic_program_is_preloadable() -> None:
    assert launch.why_not_preloadable(shutil.which("true") or "/bin/true") is None


def test_no_program_and_unknown_program() -> None:
    need_build()
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-m", "softrdma", "run"], capture_output=True,
                       text=True, env=env, check=False, timeout=60)
    assert p.returncode == 2 and "no program given" in p.stderr
    p = run("no-such-program-softrdma")
    assert p.returncode == 127 and "command not found" in p.stderr


def test_print_env_for_other_launchers() -> None:
    lib = need_build()
    p = subprocess.run([sys.executable, "-m", "softrdma", "run", "--print-env"],
                       capture_output=True, text=True, check=False, timeout=60)
    assert p.returncode == 0
    assert f"export LD_PRELOAD={lib}" in p.stdout.splitlines()
    assert "export SOFTRDMA_CAPI_PYTHON=" in p.stdout
    # the printed environment alone (no wrapper) runs a program on softrdma
    env = dict(os.environ)
    for line in p.stdout.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    tool = shutil.which("ibv_devices")
    if tool is None:
        pytest.skip("ibv_devices is not installed (Debian package ibverbs-utils)")
    out = subprocess.run([tool], env=env, capture_output=True, text=True, check=False,
                         timeout=60)
    assert out.returncode == 0 and "softrdma_iw_lo" in out.stdout, out.stderr


def test_build_names_missing_debian_packages(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOFTRDMA_CAPI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    monkeypatch.setattr(build, "VERBS_H", tmp_path / "no-verbs.h")
    with pytest.raises(build.BuildError) as exc:
        build.build()
    msg = str(exc.value)
    assert "gcc" in msg and "libibverbs-dev" in msg and "python3-dev" in msg


def test_cache_is_keyed_by_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOFTRDMA_CAPI_CACHE", str(tmp_path))
    first = build.library_path()
    assert first.parent.parent == tmp_path and first.parent.name.startswith("capi-")
    monkeypatch.setattr(build, "_source", lambda: "/* another source */")
    assert build.library_path() != first
