"""The TCP runtime's socket settings for the iWARP data path (softrdma.drivers.runtime.tcp).

``SO_SNDBUF`` is set only where ``net.core.wmem_max`` lets it beat the kernel's send-buffer
autotuning (``net.ipv4.tcp_wmem[2]``): with the default ``wmem_max`` asking for 4 MiB would
pin the buffer at 416 KiB. By default no size is asked for at all: the kernel's autotuning
costs less CPU per byte than a fixed 4 MiB (bench/iwarp_write_bw.py, issue 26). That
bench's ``--engine`` mode measures the engines alone.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from softrdma.drivers.runtime import tcp as tcp_runtime
from softrdma.errors import InvalidArgument


def _sysctls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wmem_max: int,
             tcp_wmem: str) -> None:
    w = tmp_path / "wmem_max"
    t = tmp_path / "tcp_wmem"
    w.write_text(f"{wmem_max}\n")
    t.write_text(tcp_wmem + "\n")
    monkeypatch.setattr(tcp_runtime, "_WMEM_MAX", str(w))
    monkeypatch.setattr(tcp_runtime, "_TCP_WMEM", str(t))


def test_default_wmem_max_keeps_autotuning(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _sysctls(tmp_path, monkeypatch, 212992, "4096\t16384\t4194304")
    assert tcp_runtime.sndbuf_setting(1 << 22) == 0  # 416 KiB would be worse than 4 MiB


def test_raised_wmem_max_sets_the_buffer(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _sysctls(tmp_path, monkeypatch, 1 << 22, "4096\t16384\t4194304")
    assert tcp_runtime.sndbuf_setting(1 << 22) == 1 << 22
    assert tcp_runtime.sndbuf_setting(0) == 0  # SOFTRDMA_IWARP_SNDBUF=0: autotuning


def test_unreadable_sysctls_set_what_is_asked(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcp_runtime, "_WMEM_MAX", str(tmp_path / "absent"))
    assert tcp_runtime.sndbuf_setting(1 << 20) == 1 << 20


def test_default_keeps_autotuning_even_where_wmem_max_allows_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _sysctls(tmp_path, monkeypatch, 1 << 22, "4096\t16384\t4194304")
    monkeypatch.delenv("SOFTRDMA_IWARP_SNDBUF", raising=False)
    assert tcp_runtime.sndbuf_setting() == 0
    monkeypatch.setenv("SOFTRDMA_IWARP_SNDBUF", str(1 << 22))  # asked for: set
    assert tcp_runtime.sndbuf_setting() == 1 << 22


def test_bad_sndbuf_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOFTRDMA_IWARP_SNDBUF", "4M")
    with pytest.raises(InvalidArgument, match="SOFTRDMA_IWARP_SNDBUF"):
        tcp_runtime.sndbuf_setting()


def test_bench_engine_mode_measures_both_sides() -> None:
    """``bench/iwarp_write_bw.py --engine``: the engines alone move the WRITEs (the
    receiving engine stays up, else the bench fails) and each side's CPU s/GB is printed."""
    bench = Path(__file__).resolve().parents[2] / "bench" / "iwarp_write_bw.py"
    out = subprocess.run([sys.executable, str(bench), "--engine", "--crc", "both", "--runs", "1"],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    got = re.findall(r"CRC32c (on|off): CPU s/GB median of 1: sender ([\d.]+), receiver ([\d.]+)",
                     out.stdout)
    assert [g[0] for g in got] == ["on", "off"], out.stdout
    assert all(float(s) > 0 and float(r) > 0 for _, s, r in got)
