"""softrdma's devices under ``/sys/class/infiniband``, in a private mount namespace.

Programs written for kernel RDMA devices find a device's network interface as the entry
of ``/sys/class/infiniband/<dev>/device/net/`` (rdma-core's test suite does, to pick the
IP address its rdma_cm tests connect to). softrdma's devices live in user space, so the
kernel lists none. ``python -m softrdma.tools.suites.sysfs_ns DEV=IFACE... -- CMD...`` (root,
run under ``unshare --mount``, as :func:`wrap` builds it) makes them appear for ``CMD`` only:

1. every mount of the new namespace is made private (``mount --make-rprivate /``), so
   nothing below reaches the host;
2. the real ``/sys/class`` is bind-mounted aside (``--stash``), a tmpfs covers ``/sys/class`` and each
   real class directory is bind-mounted back in it (``/sys/class/net`` ... unchanged:
   their links are relative to ``/sys/class/<name>``, so they still resolve);
3. ``/sys/class/infiniband/<dev>/device/net/<iface>`` is created for each device, with
   ``device/numa_node`` and, for each ``--gid=DEV,INDEX,TYPE,HEX``, the port's
   ``ports/1/gids/INDEX`` and ``gid_attrs/{types,ndevs}/INDEX`` (what UCX reads to pick a
   RoCE GID and its interface);
4. with ``--uverbs=N`` (middleware such as UCX lists only devices whose
   ``/dev/infiniband/uverbsN`` is a character device it may read and write): when the host
   has no ``/dev/infiniband``, a tmpfs covers ``/dev`` with every real entry bound back
   (links copied), and ``/dev/infiniband/uverbs0..N-1`` and ``rdma_cm`` are ``/dev/null``
   bound in place: softrdma's C interface serves the verbs, nothing opens these files
   for real;

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
DEV = Path("/dev")
DEV_IB = DEV / "infiniband"
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


GidSpec = tuple[str, int, int, bytes]  # device, GID index, type (1 v1, 2 v2), 16-byte GID


def wrap(devices: dict[str, str], cmd: Sequence[str], stash: Path, *, uverbs: int = 0,
         gids: Sequence[GidSpec] = ()) -> list[str]:
    """``cmd`` run in a private mount namespace where each ``devices`` name (device ->
    netdev) has its ``/sys/class/infiniband/<dev>/device/net/<netdev>`` entry, its
    ``gids`` described under ``ports/1``, and (``uverbs`` > 0) ``/dev/infiniband`` has
    that many ``uverbsN`` nodes; ``stash`` is an empty directory (the caller's, removed by
    it afterwards) the real ``/sys/class`` and ``/dev`` are mounted under inside the
    namespace."""
    specs = [f"{dev}={iface}" for dev, iface in devices.items()]
    extra = [f"--gid={dev},{index},{kind},{raw.hex()}" for dev, index, kind, raw in gids]
    if uverbs:
        extra.append(f"--uverbs={uverbs}")
    return ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m",
            "softrdma.tools.suites.sysfs_ns", f"--stash={stash}", *extra, *specs, "--", *cmd]


def _mount(*args: str) -> None:
    # pipes, not /dev/null: while /dev is being rebuilt it has no null
    subprocess.run(["mount", *args], check=True, capture_output=True, stdin=subprocess.PIPE)


_GID_TYPES = {1: "IB/RoCE v1", 2: "RoCE v2"}


def _gid_text(raw: bytes) -> str:
    return ":".join(raw[i:i + 2].hex() for i in range(0, 16, 2))


def _dev_nodes(stash: Path, uverbs: int) -> None:
    """``/dev/infiniband/uverbs0..uverbs-1`` and ``rdma_cm``: ``/dev/null`` bound in place,
    over a tmpfs ``/dev`` holding every real entry (unless the host has the directory)."""
    if DEV_IB.exists():
        return
    real = stash / "dev"
    real.mkdir()
    # recursive: in a user namespace a mount with locked submounts (/dev/pts, /dev/shm)
    # cannot be bound without them
    _mount("--rbind", str(DEV), str(real))
    _mount("-t", "tmpfs", "-o", "mode=0755", "softrdma-dev", str(DEV))
    for entry in sorted(real.iterdir()):
        target = DEV / entry.name
        if entry.is_symlink():
            target.symlink_to(os.readlink(entry))
            continue
        if entry.is_dir():
            target.mkdir()
        else:
            target.touch()
        _mount("--rbind", str(entry), str(target))
    DEV_IB.mkdir()
    for name in [*(f"uverbs{i}" for i in range(uverbs)), "rdma_cm"]:
        (DEV_IB / name).touch()
        _mount("--bind", str(real / "null"), str(DEV_IB / name))


def _populate(stash: Path, devices: dict[str, str], gids: Sequence[GidSpec] = (),
              uverbs: int = 0) -> None:
    _mount("--make-rprivate", "/")
    classes = stash / "class" if uverbs else stash
    classes.mkdir(exist_ok=True)
    _mount("--bind", str(SYS_CLASS), str(classes))
    names = sorted(p.name for p in classes.iterdir() if p.name != _IB_CLASS)
    _mount("-t", "tmpfs", "-o", "mode=0755", "softrdma-sysclass", str(SYS_CLASS))
    for name in names:
        (SYS_CLASS / name).mkdir()
        _mount("--bind", str(classes / name), str(SYS_CLASS / name))
    for dev, iface in devices.items():
        (SYS_CLASS / _IB_CLASS / dev / "device" / "net" / iface).mkdir(parents=True)
        (SYS_CLASS / _IB_CLASS / dev / "device" / "numa_node").write_text("-1\n")
    for dev, index, kind, raw in gids:
        port = SYS_CLASS / _IB_CLASS / dev / "ports" / "1"
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / sub).mkdir(parents=True, exist_ok=True)
        (port / "gids" / str(index)).write_text(_gid_text(raw) + "\n")
        (port / "gid_attrs" / "types" / str(index)).write_text(_GID_TYPES[kind] + "\n")
        if dev in devices:
            (port / "gid_attrs" / "ndevs" / str(index)).write_text(devices[dev] + "\n")
    if uverbs:
        _dev_nodes(stash, uverbs)


_USAGE = ("usage: python -m softrdma.tools.suites.sysfs_ns --stash=DIR [--uverbs=N] "
          "[--gid=DEV,INDEX,TYPE,HEX]... DEV=IFACE... -- CMD...")


def _gid_spec(text: str) -> GidSpec:
    parts = text.split(",")
    try:
        dev, index, kind, raw = parts[0], int(parts[1]), int(parts[2]), bytes.fromhex(parts[3])
    except (IndexError, ValueError):
        raise ValueError(f"expected --gid=DEV,INDEX,TYPE,HEX, got {text!r}") from None
    if len(parts) != 4 or not dev or "/" in dev or index < 0 or kind not in _GID_TYPES \
            or len(raw) != 16:
        raise ValueError(f"expected --gid=DEV,INDEX,TYPE(1|2),HEX(16 bytes), got {text!r}")
    return dev, index, kind, raw


def _parse(argv: Sequence[str]) -> tuple[Path, dict[str, str], list[str]]:
    stash, devices, cmd, _, _ = _parse_all(argv)
    return stash, devices, cmd


def _parse_all(argv: Sequence[str]
               ) -> tuple[Path, dict[str, str], list[str], list[GidSpec], int]:
    if "--" not in argv or not argv or not argv[0].startswith("--stash="):
        raise ValueError(_USAGE)
    stash = Path(argv[0].partition("=")[2])
    if not stash.is_dir() or any(stash.iterdir()):
        raise ValueError(f"--stash must name an empty directory, got {str(stash)!r}")
    cut = list(argv).index("--")
    devices: dict[str, str] = {}
    gids: list[GidSpec] = []
    uverbs = 0
    for spec in argv[1:cut]:
        if spec.startswith("--gid="):
            gids.append(_gid_spec(spec.partition("=")[2]))
            continue
        if spec.startswith("--uverbs="):
            value = spec.partition("=")[2]
            if not value.isdigit() or not 0 < int(value) <= 64:
                raise ValueError(f"--uverbs must be 1..64, got {value!r}")
            uverbs = int(value)
            continue
        dev, sep, iface = spec.partition("=")
        if not sep or not dev or not iface or "/" in dev + iface:
            raise ValueError(f"expected DEV=IFACE, got {spec!r}")
        devices[dev] = iface
    cmd = list(argv[cut + 1:])
    if not cmd:
        raise ValueError("no command to run")
    return stash, devices, cmd, gids, uverbs


def main(argv: Sequence[str] | None = None) -> int:
    try:
        stash, devices, cmd, gids, uverbs = _parse_all(sys.argv[1:] if argv is None else argv)
        _populate(stash, devices, gids, uverbs)
    except (ValueError, OSError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else exc
        print(f"softrdma sysfs_ns: error: {detail}", file=sys.stderr)
        return 1
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main())
