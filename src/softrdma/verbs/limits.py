"""The object limits a device reports and enforces, and the largest MR this host can back.

The counts are rxe's (``rxe_param.h``): ``max_qp``, ``max_cq``, ``max_mr``, ``max_pd``,
``max_ah``, ``max_srq``, ``max_mw``. Creating one object more than its limit fails as
rxe's ``__rxe_add_to_pool`` fails when a pool is full: EINVAL
(:class:`~softrdma.errors.ResourceError` with ``errno`` EINVAL, naming the limit). XRC
SRQs count as SRQs and XRC TGT QPs as QPs (rxe keeps them in the same pools); a QP
opened with ``ibv_open_qp`` is a handle, not a QP.

Counting is **per process, per device**: every context this process opens on a device
(by transport and name, imported contexts included) shares one :class:`ObjectCounts`.
Other processes on a shared device (devd) have their own counts, since each runs its
own transport engine and objects (docs/design.md, "Devices shared by processes").

:data:`LIMITS` is read at every creation and by ``query_device``, so the reported and the
enforced values are the same; tests lower one with ``monkeypatch.setitem``.

``max_mr_size`` (:func:`max_mr_size`) is what this host can back with memory: the
kernel's overcommit bound (``vm.overcommit_memory``: MemTotal + SwapTotal in heuristic
mode, CommitLimit in strict mode, the user address space when always allowed), and
``RLIMIT_AS`` if set, rounded down to pages.
"""

from __future__ import annotations

import errno
import functools
import mmap
import resource
import threading

from ..errors import ResourceError

__all__ = ["MAX_QP", "MAX_CQ", "MAX_MR", "MAX_PD", "MAX_AH", "MAX_SRQ", "MAX_MW", "LIMITS",
           "ObjectCounts", "counts_for", "max_mr_size"]

# rxe_param.h
MAX_QP = 0x10000
MAX_CQ = 16384
MAX_MR = 256 * 1024
MAX_PD = 0x7FFC
MAX_AH = 0x7FFF
MAX_SRQ = 960
MAX_MW = 0x1000  # RXE_MAX_MW

#: the enforced limit of each counted object type, by its ``ibv_device_attr`` name
LIMITS: dict[str, int] = {
    "max_qp": MAX_QP, "max_cq": MAX_CQ, "max_mr": MAX_MR, "max_pd": MAX_PD,
    "max_ah": MAX_AH, "max_srq": MAX_SRQ, "max_mw": MAX_MW,
}
_OBJECT = {"max_qp": "QP", "max_cq": "CQ", "max_mr": "MR", "max_pd": "PD", "max_ah": "AH",
           "max_srq": "SRQ", "max_mw": "MW"}


class ObjectCounts:
    """How many objects of each counted type a device holds (in this process)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._n = dict.fromkeys(LIMITS, 0)
        # re-entrant: a collection inside take() may run a collected object's __del__,
        # which gives its count back here
        self._lock = threading.RLock()

    def take(self, limit: str) -> None:
        """Count one more object under ``limit`` ("max_pd" ...); ResourceError (EINVAL,
        rxe ``__rxe_add_to_pool``) if the device already holds that many."""
        with self._lock:
            most = LIMITS[limit]
            if self._n[limit] >= most:
                raise ResourceError(f"{self.device}: {limit} is {most}: no more "
                                    f"{_OBJECT[limit]}s on this device", errno=errno.EINVAL)
            self._n[limit] += 1

    def give(self, limit: str) -> None:
        """One object counted under ``limit`` is gone."""
        with self._lock:
            if self._n[limit] > 0:
                self._n[limit] -= 1

    def count(self, limit: str) -> int:
        return self._n[limit]


_counts: dict[tuple[str, str], ObjectCounts] = {}
_counts_lock = threading.Lock()


def counts_for(transport: str, name: str) -> ObjectCounts:
    """The counts of device ``name`` of ``transport`` in this process."""
    with _counts_lock:
        c = _counts.get((transport, name))
        if c is None:
            c = _counts[(transport, name)] = ObjectCounts(name)
        return c


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    except OSError:
        pass
    return out


def _virtual_bits() -> int:
    """The CPU's virtual address width (``address sizes`` of /proc/cpuinfo); 48 if unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("address sizes"):
                    for part in line.split(":", 1)[1].split(","):
                        if "virtual" in part:
                            return int(part.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return 48


@functools.cache
def max_mr_size() -> int:
    """The largest MR this host can back (see the module docstring), in bytes."""
    address_space = 1 << (_virtual_bits() - 1)  # the user half of the address space
    bound = address_space
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            mode = int(f.read().strip() or 0)
    except (OSError, ValueError):
        mode = 0
    info = _meminfo()
    if mode == 0 and info.get("MemTotal"):
        bound = info["MemTotal"] + info.get("SwapTotal", 0)
    elif mode == 2 and info.get("CommitLimit"):
        bound = info["CommitLimit"]
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft > 0:
        bound = min(bound, soft)
    bound = min(bound, address_space)
    return bound - bound % mmap.PAGESIZE
