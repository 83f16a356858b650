"""``softrdma run [-d DEVICE] -- PROGRAM ARGS...``: run a C program on softrdma.

The program's libibverbs calls are served by softrdma through the preloaded library
built by :mod:`.build` (docs/design.md, "C programs"). :func:`preload_env` gives the
environment that does it, for launchers such as ``mpirun`` that cannot use the wrapper.
A statically linked or setuid program cannot be preloaded: that is said, exit status 1.

A Python program (Debian's ``python3-pyverbs``: Cython over libibverbs) runs the same way:
the library's Python half attaches to the interpreter already running in the process
(cffi's embedding mode initializes Python only when it is not), so softrdma runs inside
the program's own interpreter, on its progress thread. That interpreter must be the
Python version the library was built for (the one running ``softrdma``, same major.minor;
another patch level is the same ABI): for another one ``softrdma run`` says so and exits
1 (:func:`python_mismatch`), and a program started without the wrapper gets the same
message from the library and ``ELIBBAD`` from its first verb. For a Python program the
environment carries only the directories of softrdma and its dependencies, never this
Python's standard library (:func:`preload_env` ``python_host``).
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from .build import build
from .envnames import DEVICE_ENV, PATH_ENV, PYTHON_ENV

__all__ = ["add_arguments", "run", "preload_env", "why_not_preloadable", "DEVICE_ENV",
           "python_host", "python_mismatch", "sysfs_command", "sysfs_unavailable",
           "sysfs_env", "sysfs_user_namespace", "UCX_ENV", "STATE_ENV", "USERNS_ENV"]

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


_PYTHON_NAME = re.compile(r"python[0-9.]*$")


def python_host(path: str) -> str | None:
    """The Python interpreter that runs ``path`` (``path`` itself when it is one, the
    ``#!`` interpreter of a Python script), or None for any other program."""
    if _PYTHON_NAME.match(os.path.basename(path)):
        return path
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    if words and _PYTHON_NAME.match(os.path.basename(words[0])):
        import shutil

        return words[0] if "/" in words[0] else shutil.which(words[0])
    return None


def python_mismatch(interpreter: str) -> str | None:
    """Why the library cannot serve a program run by Python ``interpreter`` (another
    major.minor than this one's: the library is linked against this Python), or None."""
    import subprocess as sp

    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    try:
        got = sp.run([interpreter, "-S", "-c",
                      "import sys; print('%d.%d' % sys.version_info[:2])"],
                     capture_output=True, text=True, timeout=60, check=False).stdout.strip()
    except (OSError, sp.TimeoutExpired):
        return None  # left to the kernel, and to the library's own check
    if not got or got == want:
        return None
    return (f"it runs Python {got}, and softrdma's C interface is built for the Python "
            f"that runs softrdma ({want}, {sys.executable}): run the program with a Python "
            f"{want}, or install softrdma in Python {got} and run that one's softrdma")


def _stdlib_dirs() -> set[str]:
    paths = sysconfig.get_paths()
    out = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths}
    out |= {os.path.join(d, "lib-dynload") for d in list(out)}
    return out


def preload_env(library: Path, device: str | None = None,
                base: dict[str, str] | None = None, *,
                python_host: bool = False) -> dict[str, str]:
    """The environment that runs a program on softrdma: ``LD_PRELOAD`` of ``library``,
    this interpreter's ``sys.path`` as ``SOFTRDMA_CAPI_PATH`` (:data:`PATH_ENV`: the
    embedded interpreter finds softrdma and cffi there; ``PYTHONPATH`` is left as it is,
    for the Pythons the program itself starts) and this interpreter for the processes
    softrdma spawns (devd). For a ``python_host`` (the program is a Python interpreter:
    its own standard library is already on its path) the standard library's directories
    are left out."""
    env = dict(os.environ if base is None else base)
    old = env.get("LD_PRELOAD")
    env["LD_PRELOAD"] = str(library) + (f":{old}" if old else "")
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if python_host:
        std = _stdlib_dirs()
        paths = [p for p in paths if os.path.realpath(p) not in std]
    env[PATH_ENV] = os.pathsep.join(paths)
    env[PYTHON_ENV] = sys.executable
    if device:
        env[DEVICE_ENV] = device
    return env


#: the state directory's variable (``drivers.host.registry.state_dir``)
STATE_ENV = "SOFTRDMA_STATE_DIR"
#: what ``--sysfs`` (the mode for UCX) sets unless the environment has it. UCX before 1.19
#: reads the IP version of a RoCE UD receive from ``wc.sl``, a Mellanox convention (sl 2:
#: IPv4; UCX commit 7de57ad9f9 reads the GRH area instead): softrdma, like rxe, reports
#: sl 0, so ud_verbs takes each IPv4 packet's GRH area as IPv6, finds no GID of its own in
#: it and drops the packet (its destination GID check): ``ucx_perftest -x ud_verbs`` timed
#: out on both. The check only drops packets for other GIDs of the port; a softrdma device
#: gets only its own.
UCX_ENV = {"UCX_UD_VERBS_ETH_DGID_CHECK": "n"}


#: ``1``: make ``--sysfs``'s view in a user namespace even as root (what another user
#: gets; also where root may not make a mount namespace of its own)
USERNS_ENV = "SOFTRDMA_SYSFS_USERNS"
_USERNS = ["--user", "--map-root-user"]


def _unshare_works(*flags: str) -> str | None:
    """None when ``unshare FLAGS --mount true`` succeeds here, else its complaint."""
    probe = subprocess.run(["unshare", *flags, "--mount", "true"], capture_output=True,
                           text=True, check=False)
    if probe.returncode == 0:
        return None
    text = probe.stderr.strip()
    return text.splitlines()[-1] if text else f"exit {probe.returncode}"


def sysfs_user_namespace() -> bool:
    """Whether ``--sysfs`` makes its mount namespace inside a user namespace of its own,
    where the program is root (``unshare --user --map-root-user``): for a user other than
    root, for root that may not make a mount namespace itself (a container without
    CAP_SYS_ADMIN), or with ``SOFTRDMA_SYSFS_USERNS=1``."""
    if os.geteuid() != 0 or os.environ.get(USERNS_ENV) == "1":
        return True
    return _unshare_works() is not None


def sysfs_command(cmd: Sequence[str], stash: Path, user_namespace: bool) -> list[str]:
    """``cmd`` wrapped in the private mount namespace of ``softrdma.tools.suites.sysfs_ns``:
    each device's ``/sys/class/infiniband`` entry (its netdev and RoCE v2 GIDs) and a
    ``/dev/infiniband/uverbsN`` node per device (``stash``: an empty directory), inside
    a user namespace with ``user_namespace`` (:func:`sysfs_user_namespace`): there the
    program runs as uid 0, which is the user outside (its files, its processes, its
    state directory: :func:`sysfs_env`)."""
    from ..verbs import get_device_list
    from ..verbs.device import gid_table

    devices = get_device_list()
    specs: list[str] = []
    for d in devices:
        if d.netdev:
            specs.append(f"{d.name}={d.netdev}")
        roce_ver = d.record.roce_ver if d.record is not None else "2"
        if d.type == "roce" and roce_ver == "2":
            specs += [f"--gid={d.name},{i},2,{g.hex()}" for i, g in enumerate(gid_table(d.ips))]
    user = _USERNS if user_namespace else []
    return ["unshare", *user, "--mount", "--propagation", "private", "--", sys.executable,
            "-m", "softrdma.tools.suites.sysfs_ns", f"--stash={stash}",
            f"--uverbs={max(1, len(devices))}", *specs, "--", *cmd]


def sysfs_env(env: dict[str, str], user_namespace: bool) -> None:
    """What ``--sysfs`` adds to the program's environment: :data:`UCX_ENV` unless set,
    and in a user namespace the state directory of the user outside (inside, the program
    is uid 0, whose default is root's ``/run/softrdma``)."""
    env.update({k: v for k, v in UCX_ENV.items() if k not in env})
    if user_namespace and STATE_ENV not in env:
        from ..verbs.device_list import state_directory

        env[STATE_ENV] = str(state_directory())


def sysfs_unavailable(user_namespace: bool) -> str | None:
    """Why ``--sysfs`` cannot work here, or None."""
    import shutil

    for tool in ("unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    why = _unshare_works(*_USERNS) if user_namespace else None
    if why is not None:
        who = "root" if os.geteuid() == 0 else "a user other than root"
        return (f"the private /sys/class/infiniband and /dev/infiniband view needs, for {who} "
                "here, a user namespace, which this system refuses (unshare --user: "
                f"{why}; see sysctl user.max_user_namespaces and "
                "kernel.unprivileged_userns_clone)")
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-d", "--dev", metavar="DEVICE",
                        help="the softrdma device the program sees first")
    parser.add_argument("--print-env", action="store_true",
                        help="print the environment variables that run a program on "
                        "softrdma (for mpirun and other launchers) and exit")
    parser.add_argument("--sysfs", action="store_true",
                        help="run the program in a private mount namespace (inside a user "
                        "namespace when not root) where softrdma's devices appear under "
                        "/sys/class/infiniband and /dev/infiniband (UCX and libfabric "
                        "look there themselves)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- PROGRAM ARGS",
                        help="the program to run, e.g. -- ibv_devinfo -v")


def run(args: argparse.Namespace) -> int:
    """Run ``args.command`` on softrdma; its exit status (127: could not be started)."""
    cmd: Sequence[str] = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if args.dev:
        from ..verbs.device_list import unknown_device

        why = unknown_device(args.dev)
        if why is not None:
            print(f"softrdma run: error: -d {args.dev}: {why}", file=sys.stderr)
            return 1
    library = build()
    if args.print_env:
        env = preload_env(library, args.dev, base={})
        for key in ("LD_PRELOAD", PATH_ENV, PYTHON_ENV, DEVICE_ENV):
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
    interpreter = python_host(path)
    if interpreter is not None:
        why = python_mismatch(interpreter)
        if why is not None:
            print(f"softrdma run: error: cannot run {cmd[0]} on softrdma: {why}",
                  file=sys.stderr)
            return 1
    env = preload_env(library, args.dev, python_host=interpreter is not None)
    from .. import trace

    if trace.capture_path is not None:  # `softrdma --pcap FILE run -- PROGRAM`: the
        # program is this process (it replaces it), so its devices capture to FILE
        env[trace.PCAP_ENV] = os.path.abspath(trace.capture_path)
    sysfs = bool(getattr(args, "sysfs", False))
    userns = sysfs and sysfs_user_namespace()
    if sysfs:
        no = sysfs_unavailable(userns)
        if no is not None:
            print(f"softrdma run: error: --sysfs: {no}", file=sys.stderr)
            return 1
        sysfs_env(env, userns)
    else:
        # the program takes this process: its signals (a `timeout` or a test harness that
        # stops `softrdma run` stops the program, none is left behind), its exit status.
        # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across
        # exec: the program gets them as its shell gave them (the default), as subprocess
        # does for its children (restore_signals); `softrdma run -- ibv_devinfo | head`
        # then ends on the closed pipe as ibv_devinfo alone does
        sys.stdout.flush()
        sys.stderr.flush()
        import signal

        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execve(path, list(cmd), env)
        except OSError as exc:
            print(f"softrdma run: error: cannot run {cmd[0]}: {exc}", file=sys.stderr)
            return 127
    import tempfile

    with tempfile.TemporaryDirectory(prefix="softrdma-run-") as tmp:
        cmd = sysfs_command(cmd, Path(tmp), userns)
        try:
            proc = subprocess.Popen(list(cmd), env=env)
        except OSError as exc:
            print(f"softrdma run: error: cannot run {cmd[0]}: {exc}", file=sys.stderr)
            return 127
        returncode = _wait_forwarding(proc)
    return returncode if returncode >= 0 else 128 - returncode


def _wait_forwarding(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc`` (``--sysfs``: the namespace's first process, which becomes the
    program), passing on SIGTERM and SIGHUP sent to this one; SIGINT is ignored here (a
    terminal sends it to the program too). Its return code."""
    import signal

    def forward(signum: int, frame: object) -> None:
        proc.send_signal(signum)

    saved = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    saved[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return proc.wait()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
