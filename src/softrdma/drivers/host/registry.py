"""The device registry: ``softrdma link add/delete`` records, shared by all processes.

design.md "Devices shared by processes": a device is a record ``(name, netdev, type,
udp_port, roce_ver, vlan, mpa_crc)`` kept as JSON in a state directory (``roce_ver``: which
RoCE encapsulations its GIDs use, ``"1"``, ``"2"`` or ``"both"``; absent in older files: 2;
``mpa_crc``: an iWARP device asks for the MPA CRC in every MPA Request and Reply it sends,
like siw's ``mpa_crc_required`` module parameter, RFC 5044 §7.1; absent: off):

1. ``$SOFTRDMA_STATE_DIR`` if set;
2. ``/run/softrdma`` when running as root;
3. ``$XDG_RUNTIME_DIR/softrdma`` if that variable is set;
4. ``/tmp/softrdma-<uid>``.

The file is ``<state_dir>/devices.json``::

    {"version": 1,
     "devices": [{"name": "rxe0", "netdev": "eth0", "type": "roce", "udp_port": 4791},
                 {"name": "roce1", "netdev": "eth1", "type": "roce", "udp_port": 4791,
                  "roce_ver": "1", "vlan": 7},
                 {"name": "siw1", "netdev": "eth0", "type": "iwarp", "udp_port": 4791,
                  "mpa_crc": true}],
     "deleted_builtin": ["softrdma_lo"]}

Readers and writers alike use the directory only if it is safe (:func:`ensure_state_dir`,
:func:`check_state_dir`: not a symbolic link, owned by this user, writable by no one
else), and raise :class:`~softrdma.errors.DeviceError` naming it otherwise: a directory
another local user planted (``/tmp/softrdma-<uid>`` is guessable) defines no device.

Writers hold an ``fcntl.flock`` on ``<state_dir>/devices.lock`` for the whole
read-modify-write and replace the file atomically (write a temporary file, ``fsync``,
``rename``), so concurrent ``link add`` calls neither lose records nor leave a torn file;
readers need no lock.

Names follow ``rdma link add``: non-empty, at most 64 characters, ``[A-Za-z0-9_.-]``.
The built-in device ``softrdma_lo`` (roce on ``lo``) is always listed first unless it was
explicitly deleted.

The active MTU is computed as rxe does (``rxe_set_mtu`` / ``eth_mtu_int_to_enum`` in
``rxe_param.h``): subtract ``RXE_MAX_HDR_LENGTH`` (80 bytes, room for IPv4/IPv6 + UDP +
BTH + the largest extension header + ICRC) from the netdev MTU and take the largest IB
MTU (256, 512, 1024, 2048, 4096; IBA 7.7.8) that fits: Ethernet 1500 -> 1024, lo's
65536 -> 4096.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from softrdma.drivers.host import netdev as _netdev
from softrdma.drivers.links.link import ROCE_VERSIONS, check_roce_ver
from softrdma.errors import DeviceError, InvalidArgument

__all__ = [
    "BUILTIN_DEVICE",
    "DEFAULT_UDP_PORT",
    "DeviceRecord",
    "IB_MTUS",
    "RXE_MAX_HDR_LENGTH",
    "Registry",
    "add",
    "check_state_dir",
    "delete",
    "get",
    "ib_mtu_for",
    "list_devices",
    "state_dir",
    "validate_name",
]

DEFAULT_UDP_PORT = 4791  # Annex A17
RXE_MAX_HDR_LENGTH = 80  # rxe_hdr.h
IB_MTUS = (4096, 2048, 1024, 512, 256)
NAME_MAX = 64
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")
_FILE_VERSION = 1
MAX_VLAN_ID = 4095  # IEEE 802.1Q: VIDs 1..4094 (0 and 4095 reserved)
_UNSAFE_DIR_MODE = stat.S_IWGRP | stat.S_IWOTH  # others may create or replace files
DeviceType = Literal["roce", "iwarp"]
_TYPES: tuple[str, ...] = ("roce", "iwarp")
_IWARP_BUILTIN = "softrdma_iw_lo"  # verbs.device.IWARP_LOOPBACK: listed, never stored


def ib_mtu_for(netdev_mtu: int) -> int:
    """The active IB MTU in bytes for a netdev MTU, as rxe's ``eth_mtu_int_to_enum``.

    Returns 0 when not even 256 bytes of payload fit (rxe: no valid ``ib_mtu``).
    """
    room = netdev_mtu - RXE_MAX_HDR_LENGTH
    for mtu in IB_MTUS:
        if room >= mtu:
            return mtu
    return 0


def validate_name(name: str) -> None:
    """Raise :class:`InvalidArgument` unless ``name`` is a valid device name."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("name", "device name must not be empty")
    if len(name) > NAME_MAX:
        raise InvalidArgument("name", f"device name longer than {NAME_MAX} characters")
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise InvalidArgument(
            "name", f"device name {name!r} may only hold letters, digits, '_', '.' and '-'"
        )


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """One device: its name, the netdev it sits on, its transport and UDP port."""

    name: str
    netdev: str
    type: DeviceType = "roce"
    udp_port: int = DEFAULT_UDP_PORT
    roce_ver: str = "2"  # "1" (Annex A16, raw Ethernet), "2" (UDP) or "both"
    vlan: int | None = None  # RoCEv1 802.1Q VLAN ID tagged by softrdma on a plain netdev
    mpa_crc: bool = False  # iWARP: request/require the MPA CRC (siw mpa_crc_required)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.vlan is None:
            del out["vlan"]
        if not self.mpa_crc:  # the default: files stay readable by older versions
            del out["mpa_crc"]
        if self.roce_ver == "2":  # the default: files stay readable by older versions
            del out["roce_ver"]
        return out

    @property
    def roce_v1(self) -> bool:
        """The device carries RoCEv1 (raw Ethernet, EtherType 0x8915)."""
        return self.type == "roce" and self.roce_ver in ("1", "both")

    @property
    def roce_v2(self) -> bool:
        """The device carries RoCEv2 (UDP port :attr:`udp_port`)."""
        return self.type != "roce" or self.roce_ver in ("2", "both")

    @classmethod
    def from_json(cls, obj: Any) -> DeviceRecord:
        """Decode one record; :class:`DeviceError` on a malformed entry."""
        try:
            name, nd, typ, port = obj["name"], obj["netdev"], obj["type"], obj["udp_port"]
        except (KeyError, TypeError) as exc:
            raise DeviceError(f"device registry: malformed record {obj!r}") from exc
        if (
            not isinstance(name, str)
            or not isinstance(nd, str)
            or typ not in _TYPES
            or not isinstance(port, int)
            or not 0 <= port <= 0xFFFF
        ):
            raise DeviceError(f"device registry: malformed record {obj!r}")
        ver = obj.get("roce_ver", "2")  # files written before RoCEv1 existed: v2
        vlan = obj.get("vlan")
        crc = obj.get("mpa_crc", False)
        if ver not in ROCE_VERSIONS or not (
            vlan is None or (isinstance(vlan, int) and 0 < vlan < MAX_VLAN_ID)
        ) or not isinstance(crc, bool) or (crc and typ != "iwarp"):
            raise DeviceError(f"device registry: malformed record {obj!r}")
        return cls(name, nd, typ, port, ver, vlan, crc)

    def active_mtu(self) -> int:
        """The port's active MTU in bytes (rxe_set_mtu), from the netdev's current MTU."""
        return ib_mtu_for(_netdev.get(self.netdev).mtu)


BUILTIN_DEVICE = DeviceRecord("softrdma_lo", "lo", "roce", DEFAULT_UDP_PORT)


def state_dir() -> Path:
    """The state directory by the rules in the module docstring (not created here)."""
    env = os.environ.get("SOFTRDMA_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/run/softrdma")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "softrdma"
    return Path(f"/tmp/softrdma-{os.getuid()}")


def ensure_state_dir(path: Path) -> Path:
    """Create ``path`` with mode 0700 and check that it is safe to write files in.

    Another local user could create a shared-``/tmp`` path such as ``/tmp/softrdma-<uid>``
    first, or plant a symbolic link there, and so have us write through it. The directory
    must therefore be a plain directory (not a symbolic link), owned by our effective uid,
    and writable by no one else; :class:`DeviceError` names what is wrong otherwise. Files
    in it are opened with :func:`open_state_file` (``O_NOFOLLOW``)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        pass  # a symbolic link or a file: refused below with a clearer message
    except OSError as exc:
        raise DeviceError(f"cannot create state directory {path}: {exc}") from exc
    check_state_dir(path)
    return path


def check_state_dir(path: Path) -> bool:
    """Whether ``path`` exists, after the checks :func:`ensure_state_dir` makes on it: a
    reader (``Registry.list``, a client connecting to a devd socket) trusts nothing from a
    directory a writer would refuse, and raises the same :class:`DeviceError` naming it.
    False: there is no such directory (nothing recorded yet)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise DeviceError(f"cannot use state directory {path}: {exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise DeviceError(f"state directory {path} is a symbolic link: refusing to use it")
    if not stat.S_ISDIR(st.st_mode):
        raise DeviceError(f"state directory {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise DeviceError(
            f"state directory {path} is owned by uid {st.st_uid}, not by this user "
            f"(uid {os.geteuid()}): refusing to use it"
        )
    if st.st_mode & _UNSAFE_DIR_MODE:
        raise DeviceError(
            f"state directory {path} is writable by other users (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): refusing to use it"
        )
    return True


def open_state_file(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` a file of the state directory without following a symbolic link
    (``O_NOFOLLOW``) and close-on-exec; OSError as ``os.open`` raises it (ELOOP for a
    planted link)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


class Registry:
    """The device records of one state directory."""

    FILE = "devices.json"
    LOCK = "devices.lock"

    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else state_dir()

    @property
    def path(self) -> Path:
        return self.directory / self.FILE

    # -- file access -------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        ensure_state_dir(self.directory)
        try:
            fd = open_state_file(self.directory / self.LOCK, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise DeviceError(f"cannot open registry lock in {self.directory}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _load(self) -> tuple[builtins.list[DeviceRecord], builtins.list[str]]:
        """The records and deleted built-ins; only from a directory :func:`check_state_dir`
        accepts, and a ``devices.json`` that is not a symbolic link."""
        if not check_state_dir(self.directory):
            return [], []
        try:
            fd = open_state_file(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return [], []
        except OSError as exc:
            raise DeviceError(f"cannot read device registry {self.path}: {exc}") from exc
        try:
            with os.fdopen(fd, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise DeviceError(f"cannot read device registry {self.path}: {exc}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DeviceError(f"device registry {self.path} is corrupt: {exc}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("devices", []), builtins.list):
            raise DeviceError(f"device registry {self.path} is corrupt: not a registry object")
        records = [DeviceRecord.from_json(o) for o in data.get("devices", [])]
        deleted = data.get("deleted_builtin", [])
        if not isinstance(deleted, builtins.list) or not all(isinstance(d, str) for d in deleted):
            raise DeviceError(f"device registry {self.path} is corrupt: bad deleted_builtin")
        return records, deleted

    def _store(self, records: builtins.list[DeviceRecord], deleted: builtins.list[str]) -> None:
        data = {
            "version": _FILE_VERSION,
            "devices": [r.to_json() for r in records],
            "deleted_builtin": deleted,
        }
        try:
            fd, tmp = tempfile.mkstemp(prefix=".devices.", suffix=".tmp", dir=self.directory)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1)
                    f.write("\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError as exc:
            raise DeviceError(f"cannot write device registry {self.path}: {exc}") from exc

    # -- API ---------------------------------------------------------------------------

    def list(self) -> builtins.list[DeviceRecord]:
        """Every device: the built-in one first (unless deleted), then in order of addition."""
        records, deleted = self._load()
        out: builtins.list[DeviceRecord] = []
        if BUILTIN_DEVICE.name not in deleted and all(
            r.name != BUILTIN_DEVICE.name for r in records
        ):
            out.append(BUILTIN_DEVICE)
        out.extend(records)
        return out

    def get(self, name: str) -> DeviceRecord:
        """The record called ``name``; :class:`DeviceError` (ENODEV) if there is none."""
        for rec in self.list():
            if rec.name == name:
                return rec
        raise DeviceError(f"device {name!r}: no such device")

    def add(
        self,
        name: str,
        netdev: str,
        type: str = "roce",
        udp_port: int = DEFAULT_UDP_PORT,
        roce_ver: str | int = "2",
        vlan: int | None = None,
        mpa_crc: bool = False,
    ) -> DeviceRecord:
        """Add a device; :class:`InvalidArgument` for a bad name/type/port/roce_ver/vlan/
        mpa_crc, :class:`DeviceError` for an unknown netdev or a name already in use (EEXIST).

        ``roce_ver``: 1 (RoCEv1, Annex A16), 2 (RoCEv2) or ``"both"``; ``vlan``: an
        802.1Q VLAN ID the RoCEv1 link tags itself on a plain netdev; ``mpa_crc``: an
        iWARP device asks for the MPA CRC (RFC 5044 §7.1, siw ``mpa_crc_required``)."""
        validate_name(name)
        if type not in _TYPES:
            raise InvalidArgument("type", f"device type must be 'roce' or 'iwarp', not {type!r}")
        _check_mpa_crc(type, mpa_crc)
        ver = check_roce_ver(roce_ver)
        if type != "roce" and ver != "2":
            raise InvalidArgument("roce_ver", "only a roce device has a RoCE version")
        if vlan is not None:
            if isinstance(vlan, bool) or not isinstance(vlan, int) or not 0 < vlan < MAX_VLAN_ID:
                raise InvalidArgument("vlan", f"VLAN ID must be 1..4094, got {vlan!r}")
            if ver == "2":
                raise InvalidArgument("vlan", "a VLAN ID applies to RoCEv1 (roce_ver 1 or both)")
        if isinstance(udp_port, bool) or not isinstance(udp_port, int):
            raise InvalidArgument("udp_port", "UDP port must be an integer")
        if not 1 <= udp_port <= 0xFFFF:
            raise InvalidArgument("udp_port", f"UDP port {udp_port} not in 1..65535")
        if not _netdev.exists(netdev):
            raise DeviceError(f"netdev {netdev!r}: no such network interface")
        record = DeviceRecord(name, netdev, "roce" if type == "roce" else "iwarp", udp_port,
                              ver, vlan, mpa_crc)
        with self._locked():
            records, deleted = self._load()
            builtin_live = BUILTIN_DEVICE.name not in deleted
            if any(r.name == name for r in records) or (
                builtin_live and name == BUILTIN_DEVICE.name
            ):
                raise DeviceError(f"device {name!r}: already exists", errno=errno.EEXIST)
            shadowed = any(r.name == BUILTIN_DEVICE.name for r in records)
            live = records + ([BUILTIN_DEVICE] if builtin_live and not shadowed else [])
            _check_endpoint_free(record, live)
            if record.roce_v1:
                # Every packet socket on an interface sees every RoCEv1 frame: two RoCEv1
                # devices on one netdev would take each other's packets (rxe likewise
                # refuses a second device on a netdev: "already configured").
                for r in records:
                    if r.netdev == netdev and r.roce_v1 and r.vlan == record.vlan:
                        raise DeviceError(f"netdev {netdev!r} already carries RoCEv1 for "
                                          f"device {r.name!r}", errno=errno.EEXIST)
            if name == BUILTIN_DEVICE.name:
                deleted = [d for d in deleted if d != name]  # re-added as an ordinary record
            records.append(record)
            self._store(records, deleted)
        return record

    def rename(self, old: str, new: str) -> DeviceRecord:
        """Give device ``old`` the name ``new`` (``rdma dev set OLD name NEW``; the
        built-in device too: it becomes an ordinary record). :class:`DeviceError` if
        ``old`` does not exist or ``new`` does (EEXIST)."""
        validate_name(new)
        with self._locked():
            records, deleted = self._load()
            builtin_live = BUILTIN_DEVICE.name not in deleted and all(
                r.name != BUILTIN_DEVICE.name for r in records)
            names = {r.name for r in records} | ({BUILTIN_DEVICE.name} if builtin_live else set())
            if old not in names:
                raise DeviceError(f"device {old!r}: no such device")
            if new in names:
                raise DeviceError(f"device {new!r}: already exists", errno=errno.EEXIST)
            if old == BUILTIN_DEVICE.name and builtin_live:
                deleted.append(old)
                renamed = replace(BUILTIN_DEVICE, name=new)
                records.insert(0, renamed)
            else:
                i = next(i for i, r in enumerate(records) if r.name == old)
                renamed = replace(records[i], name=new)
                records[i] = renamed
            if new == BUILTIN_DEVICE.name:
                deleted = [d for d in deleted if d != new]
            self._store(records, deleted)
        return renamed

    def set_mpa_crc(self, name: str, on: bool) -> DeviceRecord:
        """Turn the MPA CRC request of iWARP device ``name`` on or off (``softrdma link set
        NAME mpa_crc on|off``; siw's ``mpa_crc_required`` module parameter, per device).
        Processes that open the device afterwards use it. :class:`DeviceError` for an
        unknown device or the built-in one (it has no record: use ``$SOFTRDMA_MPA_CRC``),
        :class:`InvalidArgument` for a RoCE device."""
        with self._locked():
            records, deleted = self._load()
            for i, rec in enumerate(records):
                if rec.name == name:
                    _check_mpa_crc(rec.type, on)
                    records[i] = replace(rec, mpa_crc=on)
                    self._store(records, deleted)
                    return records[i]
        if name == BUILTIN_DEVICE.name and name not in deleted:
            _check_mpa_crc(BUILTIN_DEVICE.type, on)
        if name == _IWARP_BUILTIN:
            raise DeviceError(f"device {name!r} is built in and has no record to change: "
                              "set SOFTRDMA_MPA_CRC=1 in the environment, or add an iwarp "
                              "device with 'mpa_crc on'")
        raise DeviceError(f"device {name!r}: no such device")

    def _forget_counters(self, name: str) -> None:
        """A deleted device's saved port counters go with it (devd's
        ``NAME.counters.json``): a new device of that name starts from zero."""
        with contextlib.suppress(OSError):
            (self.directory / f"{name}.counters.json").unlink()

    def delete(self, name: str) -> DeviceRecord:
        """Remove a device (the built-in one too); :class:`DeviceError` if there is none."""
        with self._locked():
            records, deleted = self._load()
            for i, rec in enumerate(records):
                if rec.name == name:
                    del records[i]
                    self._store(records, deleted)
                    self._forget_counters(name)
                    return rec
            if name == BUILTIN_DEVICE.name and name not in deleted:
                deleted.append(name)
                self._store(records, deleted)
                self._forget_counters(name)
                return BUILTIN_DEVICE
        raise DeviceError(f"device {name!r}: no such device")


def _check_mpa_crc(type: str, mpa_crc: object) -> None:
    if not isinstance(mpa_crc, bool):
        raise InvalidArgument("mpa_crc", f"must be True or False, got {mpa_crc!r}")
    if mpa_crc and type != "iwarp":
        raise InvalidArgument("mpa_crc", "only an iwarp device has an MPA CRC setting")


def _check_endpoint_free(record: DeviceRecord, live: builtins.list[DeviceRecord]) -> None:
    """Refuse a second device of the same type on the same netdev and port (RoCEv2 or
    iWARP; RoCEv1 has no port, see ``Registry.add``): both would own the same addresses
    and port (Linux ``rdma link add`` likewise refuses a
    second rxe on a netdev, rxe_net_add: EEXIST)."""
    for r in live:
        if (r.netdev == record.netdev and r.udp_port == record.udp_port
                and r.type == record.type and r.roce_v2 and record.roce_v2):
            raise DeviceError(
                f"device {r.name!r} already uses netdev {record.netdev} port "
                f"{record.udp_port} ({record.type}); pick another port (port N) or "
                f"rename it (softrdma link rename {r.name} {record.name})",
                errno=errno.EEXIST)


def add(
    name: str, netdev: str, type: str = "roce", udp_port: int = DEFAULT_UDP_PORT,
    roce_ver: str | int = "2", vlan: int | None = None, mpa_crc: bool = False,
) -> DeviceRecord:
    """:meth:`Registry.add` on the default state directory."""
    return Registry().add(name, netdev, type, udp_port, roce_ver, vlan, mpa_crc)


def delete(name: str) -> DeviceRecord:
    """:meth:`Registry.delete` on the default state directory."""
    return Registry().delete(name)


def get(name: str) -> DeviceRecord:
    """:meth:`Registry.get` on the default state directory."""
    return Registry().get(name)


def list_devices() -> list[DeviceRecord]:
    """:meth:`Registry.list` on the default state directory."""
    return Registry().list()
