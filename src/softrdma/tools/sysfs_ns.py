"""softrdma's devices under ``/sys/class/infiniband``, in a private mount namespace.

Programs written for kernel RDMA devices find a device's network interface as the entry
of ``/sys/class/infiniband/<dev>/device/net/`` (rdma-core's test suite does, to pick the
IP address its rdma_cm tests connect to). softrdma's devices live in user space, so the
kernel lists none. ``python -m softrdma.tools.sysfs_ns DEV=IFACE... -- CMD...`` (root,
run under ``unshare --mount``, as :func:`wrap` builds it) makes them appear for ``CMD`` only:

1. every mount of the new namespace is made private (``mount --make-rprivate /``), so
   nothing below reaches the host;
2. the real ``/sys/class`` is bind-mounted aside (``--stash``), a tmpfs covers ``/sys/class`` and each
   real class directory is bind-mounted back in it (``/sys/class/net`` ... unchanged:
   their links are relative to ``/sys/class/<name>``, so they still resolve);
3. ``/sys/class/infiniband/<dev>/device/net/<iface>`` is created for each device;

then ``CMD`` replaces the process. The namespace, and every mount in it, ends with it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SYS_CLASS", "available", "unavailable_reason", "wrap", "main"]

SYS_CLASS = Path("/sys/class")
_IB_CLASS = "infiniband"


def unavailable_reason() -> str | None:
    """Why the namespace cannot be made here, or None."""
    if os.geteuid() != 0:
        return "making softrdma's devices appear in /sys/class/infiniband needs root"
    for tool in ("unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def available() -> bool:
    return unavailable_reason() is None


def wrap(devices: dict[str, str], cmd: Sequence[str], stash: Path) -> list[str]:
    """``cmd`` run in a private mount namespace where each ``devices`` name (device ->
    netdev) has its ``/sys/class/infiniband/<dev>/device/net/<netdev>`` entry;
    ``stash`` is an empty directory (the caller's, removed by it afterwards) the real
    ``/sys/class`` is mounted on inside the namespace."""
    specs = [f"{dev}={iface}" for dev, iface in devices.items()]
    return ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m",
            "softrdma.tools.sysfs_ns", f"--stash={stash}", *specs, "--", *cmd]


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


def _populate(stash: Path, devices: dict[str, str]) -> None:
    _mount("--make-rprivate", "/")
    _mount("--bind", str(SYS_CLASS), str(stash))
    names = sorted(p.name for p in stash.iterdir() if p.name != _IB_CLASS)
    _mount("-t", "tmpfs", "-o", "mode=0755", "softrdma-sysclass", str(SYS_CLASS))
    for name in names:
        (SYS_CLASS / name).mkdir()
        _mount("--bind", str(stash / name), str(SYS_CLASS / name))
    for dev, iface in devices.items():
        (SYS_CLASS / _IB_CLASS / dev / "device" / "net" / iface).mkdir(parents=True)


_USAGE = "usage: python -m softrdma.tools.sysfs_ns --stash=DIR DEV=IFACE... -- CMD..."


def _parse(argv: Sequence[str]) -> tuple[Path, dict[str, str], list[str]]:
    if "--" not in argv or not argv or not argv[0].startswith("--stash="):
        raise ValueError(_USAGE)
    stash = Path(argv[0].partition("=")[2])
    if not stash.is_dir() or any(stash.iterdir()):
        raise ValueError(f"--stash must name an empty directory, got {str(stash)!r}")
    cut = list(argv).index("--")
    devices: dict[str, str] = {}
    for spec in argv[1:cut]:
        dev, sep, iface = spec.partition("=")
        if not sep or not dev or not iface or "/" in dev + iface:
            raise ValueError(f"expected DEV=IFACE, got {spec!r}")
        devices[dev] = iface
    cmd = list(argv[cut + 1:])
    if not cmd:
        raise ValueError("no command to run")
    return stash, devices, cmd


def main(argv: Sequence[str] | None = None) -> int:
    try:
        stash, devices, cmd = _parse(sys.argv[1:] if argv is None else argv)
        _populate(stash, devices)
    except (ValueError, OSError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else exc
        print(f"softrdma sysfs_ns: error: {detail}", file=sys.stderr)
        return 1
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main())
