"""``softrdma pyverbs -- python3 program.py ...``: run a pyverbs program on softrdma.

The command runs with :data:`softrdma.compat.SHIM_DIR` first on ``PYTHONPATH`` (so
``import pyverbs`` finds softrdma's compatibility layer, :mod:`softrdma.compat.pyverbs`),
the directory holding the ``softrdma`` package after it (so the layer can import
softrdma even when it is not installed), and ``$SOFTRDMA_PYVERBS_DEVICE`` naming the
softrdma device that ``pyverbs.device.get_device_list()`` lists first. Nothing else is
changed: outside this command a real pyverbs installed on the machine is not shadowed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from softrdma.compat import DEVICE_ENV, SHIM_DIR
from softrdma.verbs.device_list import unknown_device

__all__ = ["add_arguments", "run", "shim_env", "SOFTRDMA_ROOT"]

#: The directory that contains the ``softrdma`` package.
SOFTRDMA_ROOT: Path = Path(__file__).resolve().parents[3]


def shim_env(device: str | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child that must see softrdma's pyverbs: ``base`` (default
    ``os.environ``) with the shim and softrdma first on ``PYTHONPATH`` and, when given,
    ``device`` in ``$SOFTRDMA_PYVERBS_DEVICE``."""
    env = dict(os.environ if base is None else base)
    paths = [str(SHIM_DIR), str(SOFTRDMA_ROOT)]
    old = env.get("PYTHONPATH")
    if old:
        paths += [p for p in old.split(os.pathsep) if p and p not in paths]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if device:
        env[DEVICE_ENV] = device
    return env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dev", metavar="NAME",
                        help="softrdma device the program sees first (default: the "
                        "registry's first device)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the program to run, e.g. -- python3 program.py")


def run(args: argparse.Namespace) -> int:
    """Run ``args.command`` with softrdma's pyverbs; its exit status (127 if it could not
    be started, 2 without a command)."""
    cmd: Sequence[str] = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("softrdma pyverbs: error: no command given (softrdma pyverbs -- python3 "
              "program.py ...)", file=sys.stderr)
        return 2
    if args.dev:
        why = unknown_device(args.dev)
        if why is not None:
            print(f"softrdma pyverbs: error: {why}", file=sys.stderr)
            return 1
    try:
        proc = subprocess.run(cmd, env=shim_env(args.dev), check=False)
    except OSError as exc:
        print(f"softrdma pyverbs: error: cannot run {cmd[0]}: {exc}", file=sys.stderr)
        return 127
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
