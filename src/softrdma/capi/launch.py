"""``softrdma run [-d DEVICE] -- PROGRAM ARGS...``: run a C program on softrdma.

The program's libibverbs calls are served by softrdma through the preloaded library
built by :mod:`.build` (docs/design.md, "C programs"). :func:`preload_env` gives the
environment that does it, for launchers such as ``mpirun`` that cannot use the wrapper.
A statically linked or setuid program cannot be preloaded: that is said, exit status 1.
"""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from .bridge import PYTHON_ENV
from .build import build

__all__ = ["add_arguments", "run", "preload_env", "why_not_preloadable", "DEVICE_ENV"]

#: the device a program sees first (``softrdma run -d``)
DEVICE_ENV = "SOFTRDMA_CAPI_DEVICE"
_PT_INTERP = 3


def why_not_preloadable(path: str) -> str | None:
    """Why ``LD_PRELOAD`` cannot reach ``path`` (setuid/setgid, statically linked), or
    None. A script (``#!``) or an unreadable file is left to the kernel."""
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # only 64-bit ELF is inspected
                return None
            order: Literal["little", "big"] = "little" if head[5] == 1 else "big"
            phoff = int.from_bytes(head[32:40], order)
            phentsize = int.from_bytes(head[54:56], order)
            phnum = int.from_bytes(head[56:58], order)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return None
    if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        return "it is setuid/setgid, and the loader ignores LD_PRELOAD for it"
    types = {int.from_bytes(table[i:i + 4], order) for i in range(0, len(table), phentsize)}
    if _PT_INTERP not in types:
        return "it is statically linked, so LD_PRELOAD cannot interpose libibverbs"
    return None


def preload_env(library: Path, device: str | None = None,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that runs a program on softrdma: ``LD_PRELOAD`` of ``library``,
    this interpreter's ``sys.path`` as ``PYTHONPATH`` (the embedded interpreter finds
    softrdma and cffi) and this interpreter for the processes softrdma spawns (devd)."""
    env = dict(os.environ if base is None else base)
    old = env.get("LD_PRELOAD")
    env["LD_PRELOAD"] = str(library) + (f":{old}" if old else "")
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[PYTHON_ENV] = sys.executable
    if device:
        env[DEVICE_ENV] = device
    return env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-d", "--dev", metavar="DEVICE",
                        help="the softrdma device the program sees first")
    parser.add_argument("--print-env", action="store_true",
                        help="print the environment variables that run a program on "
                        "softrdma (for mpirun and other launchers) and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- PROGRAM ARGS",
                        help="the program to run, e.g. -- ibv_devinfo -v")


def run(args: argparse.Namespace) -> int:
    """Run ``args.command`` on softrdma; its exit status (127: could not be started)."""
    cmd: Sequence[str] = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    library = build()
    if args.print_env:
        env = preload_env(library, args.dev, base={})
        for key in ("LD_PRELOAD", "PYTHONPATH", PYTHON_ENV, DEVICE_ENV):
            if key in env:
                print(f"export {key}={env[key]}")
        return 0
    if not cmd:
        print("softrdma run: error: no program given (softrdma run -- ibv_devinfo)",
              file=sys.stderr)
        return 2
    path = cmd[0] if "/" in cmd[0] else None
    if path is None:
        import shutil

        path = shutil.which(cmd[0])
    if path is None:
        print(f"softrdma run: error: {cmd[0]}: command not found", file=sys.stderr)
        return 127
    why = why_not_preloadable(path)
    if why is not None:
        print(f"softrdma run: error: cannot run {cmd[0]} on softrdma: {why}", file=sys.stderr)
        return 1
    try:
        proc = subprocess.run(list(cmd), env=preload_env(library, args.dev), check=False)
    except OSError as exc:
        print(f"softrdma run: error: cannot run {cmd[0]}: {exc}", file=sys.stderr)
        return 127
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
