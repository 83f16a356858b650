#!/usr/bin/env python3
"""Issue 23's "drivers/ in rooms", as a re-runnable script (run from a checkout's root).

    python3 tools/dev/relayout_drivers.py            # move, rewrite, sort imports, git add
    python3 tools/dev/relayout_drivers.py --check    # say what would move; change nothing

The flat modules of ``src/softrdma/drivers/`` move into sub-packages named for what they
hold (:data:`ROOMS`; a module may get a shorter name in its room: ``runtime`` becomes
``runtime/roce``, ``tcp_runtime`` ``runtime/tcp``). ``devd/`` stays, and so does the entry
point ``opening`` (:data:`STAY`). A module the table does not know is matched against
:data:`PATTERNS` (``cm_*.py``: the CM's drivers), else left where it is and listed.

It is safe to run again, on a tree where some modules moved already and others (a merge
of other branches) arrived flat, or where files still name the old places:

1. **Moves.** ``git mv drivers/OLD.py drivers/ROOM/NEW.py`` for each module still flat;
   each room gets an ``__init__.py`` (a docstring; it imports nothing).
2. **Imports.** In every Python file of src/, tests/, bench/, tools/, examples/, docs/: each
   ``from X import ...`` whose target resolves (relative imports against the file's
   package *before* it moved) to an old module names the new one; a moved file's own
   relative imports are re-counted from its new package; ``from softrdma.drivers import
   netdev`` (``from . import mcast``) imports from the module's room.
3. **Names and paths in text** (the same files, README, docs/, .ci/, pyproject.toml,
   C sources): ``softrdma.drivers.OLD`` and ``drivers.OLD`` -> ``...drivers.ROOM.NEW``;
   ``drivers/OLD.py`` -> ``drivers/ROOM/NEW.py``; in docs/design.md's layout row of
   ``softrdma.drivers``, a backquoted ``OLD`` -> ``ROOM/NEW``, and the rooms are listed.
4. ``ruff check --select I --fix`` on the Python files it changed, then ``git add``.

It prints every move and every file it rewrote.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import subprocess
import sys
import textwrap
from pathlib import Path

PKG = "softrdma.drivers"
DRIVERS = Path("src/softrdma/drivers")

#: room -> {old module name: new module name in the room}
ROOMS: dict[str, dict[str, str]] = {
    "links": {  # datagram links: the Link protocol and its implementations
        "link": "link", "udp": "udp", "udp_opts": "udp_opts", "udp_rx": "udp_rx",
        "udp_multi": "udp_multi", "rawether": "rawether", "dual": "dual",
        "fabric": "fabric", "fabric_rules": "fabric_rules", "tun": "tun", "mcast": "mcast",
    },
    "runtime": {  # the progress core and the runtimes that drive the engines
        "runtime": "roce", "runtime_tx": "roce_tx", "runtime_rx": "roce_rx",
        "tcp_runtime": "tcp", "progress": "progress", "clock": "clock",
        "workers": "workers", "eventpipe": "eventpipe",
    },
    "host": {  # facts of the host: netdevs, routes, neighbours, the device registry
        "netdev": "netdev", "route": "route", "neigh": "neigh", "portwatch": "portwatch",
        "registry": "registry", "resources": "resources", "port_totals": "port_totals",
        "ipoib_control": "ipoib_control",
    },
    "capture": {  # pcap capture and packet trace
        "tap": "tap", "tap_stream": "tap_stream",
    },
    "cm": {  # the connection managers' drivers: QP1 (IB CM), iWARP TCP connection setup
        "gsi": "gsi", "iwconnect": "iwconnect",
    },
}

#: an unknown flat module whose name matches goes to that room, under its own name
PATTERNS: list[tuple[str, str]] = [("cm_*", "cm")]

#: modules (and packages) that stay at the top of drivers/
STAY = {"__init__", "opening", "devd"}

ROOM_DOCS = {
    "links": "the datagram links: the :class:`~softrdma.drivers.links.link.Link` protocol "
             "and its implementations (UDP, raw Ethernet, both, the in-memory fabric, TUN).",
    "runtime": "the progress core and the runtimes that bind an engine to its I/O "
               "(RoCE over a link, iWARP over TCP sockets), clocks and worker threads.",
    "host": "facts of the host: netdevs, routes, neighbours, port watching, the device "
            "registry, per-process resources and counters that outlive processes.",
    "capture": "pcap capture and packet trace of RoCE and iWARP devices.",
    "cm": "the connection managers' drivers: the IB CM on QP1 (``gsi``) and iWARP TCP "
          "connection setup (``iwconnect``).",
}

TEXT_GLOBS = ["README.md", "docs/**/*.md", ".ci/*", "pyproject.toml", "src/**/*.c",
              "src/**/*.h", "examples/**/*.md"]
PY_DIRS = ["src", "tests", "bench", "tools", "examples", "docs"]


def mapping(flat: list[str]) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """old module -> (room, new name), for the table and for the flat modules the
    patterns match; and the flat modules nothing maps."""
    table = {old: (room, new) for room, names in ROOMS.items() for old, new in names.items()}
    unknown = []
    for name in flat:
        if name in table or name in STAY:
            continue
        for pattern, room in PATTERNS:
            if fnmatch.fnmatch(name, pattern):
                table[name] = (room, name)
                break
        else:
            unknown.append(name)
    return table, unknown


def flat_modules(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / DRIVERS).glob("*.py"))


def module_of(path: Path) -> str:
    """The dotted module of a file under src/ (``a/b/__init__.py`` -> ``a.b``)."""
    parts = list(path.relative_to("src").with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(path: Path) -> str:
    """The package a relative import in ``path`` (under src/) starts from."""
    mod = module_of(path)
    return mod if path.name == "__init__.py" else mod.rpartition(".")[0]


class Rewriter:
    def __init__(self, table: dict[str, tuple[str, str]]) -> None:
        self.table = table
        self.rooms = {room: set(names.values()) for room, names in ROOMS.items()}
        for room, _new in table.values():
            self.rooms.setdefault(room, set())
        for room, new in table.values():
            self.rooms[room].add(new)
        self.new_of = {f"{PKG}.{old}": f"{PKG}.{room}.{new}"
                       for old, (room, new) in table.items()}

    # ---- dotted names ---------------------------------------------------------------
    def _lookahead(self, old: str) -> str:
        """A name ``drivers.OLD`` where OLD is also a room: not when a room's module
        follows (``drivers.runtime.roce`` is already the new name)."""
        if old in self.rooms and self.rooms[old]:
            alts = "|".join(sorted(map(re.escape, self.rooms[old])))
            return rf"(?!\.(?:{alts})\b)(?!\s+import\b)"  # (imports: done by imports())
        return ""

    def dotted(self, text: str) -> str:
        for old, (room, new) in sorted(self.table.items(), key=lambda kv: -len(kv[0])):
            ahead = self._lookahead(old)
            text = re.sub(rf"(?<![\w.])((?:softrdma\.)?drivers)\.{re.escape(old)}\b{ahead}",
                          rf"\1.{room}.{new}", text)
        return text

    def paths(self, text: str) -> str:
        for old, (room, new) in self.table.items():
            text = re.sub(rf"(?<![\w.-])(?<!tests/)((?:src/softrdma/)?drivers)/{re.escape(old)}\.py\b",
                          rf"\1/{room}/{new}.py", text)
        return text

    # ---- imports ----------------------------------------------------------------------
    def new_module(self, absolute: str, names: list[str]) -> str:
        """Where ``from absolute import names`` now imports from."""
        if absolute in self.new_of:
            old = absolute.rsplit(".", 1)[1]
            if old in self.rooms and names and all(n in self.rooms[old] for n in names):
                return absolute  # ``from ...drivers.runtime import roce``: the room already
            return self.new_of[absolute]
        return absolute

    @staticmethod
    def resolve(dots: str, mod: str, package: str) -> str:
        base = package.split(".")
        if len(dots) > 1:
            base = base[: len(base) - (len(dots) - 1)]
        return ".".join([*base, mod] if mod else base)

    @staticmethod
    def relative(target: str, package: str) -> tuple[str, str]:
        """(dots, module) of a relative import of ``target`` from ``package``."""
        t, p = target.split("."), package.split(".")
        common = 0
        while common < min(len(t), len(p)) and t[common] == p[common]:
            common += 1
        return "." * (len(p) - common + 1), ".".join(t[common:])

    _FROM = re.compile(r"^(?P<indent>[ \t]*)from (?P<dots>\.*)(?P<mod>[\w.]*) import "
                       r"(?P<names>\([^)]*\)|[^\n]*)", re.M)

    def imports(self, text: str, old_pkg: str | None, new_pkg: str | None) -> str:
        """Rewrite the ``from`` imports of a file whose package was ``old_pkg`` and is now
        ``new_pkg`` (None: not under src/, only absolute imports)."""

        def one(m: re.Match[str]) -> str:
            dots, mod, names_src = m["dots"], m["mod"], m["names"]
            if dots:
                if old_pkg is None or new_pkg is None:
                    return m[0]
                absolute = self.resolve(dots, mod, old_pkg)
            else:
                absolute = mod
            if not absolute.startswith(PKG):
                return m[0] if not dots or old_pkg == new_pkg else self._emit(
                    m, absolute, names_src, new_pkg)
            names = [n.strip().split(" as ")[0] for n in names_src.strip("()").split(",")
                     if n.strip() and not n.strip().startswith("#")]
            names = [n.split("#")[0].strip() for n in names]
            if absolute == PKG and any(n in self.table for n in names):
                return self._split(m, names_src, new_pkg if dots else None)
            target = self.new_module(absolute, names)
            if target == absolute and (not dots or old_pkg == new_pkg):
                return m[0]
            return self._emit(m, target, names_src, new_pkg if dots else None)

        return self._FROM.sub(one, text)

    def _emit(self, m: re.Match[str], target: str, names_src: str, pkg: str | None) -> str:
        if pkg is None:
            return f"{m['indent']}from {target} import {names_src}"
        dots, mod = self.relative(target, pkg)
        return f"{m['indent']}from {dots}{mod} import {names_src}"

    def _split(self, m: re.Match[str], names_src: str, pkg: str | None) -> str:
        """``from softrdma.drivers import netdev as _netdev, devd``: one line per room."""
        by_target: dict[str, list[str]] = {}
        for item in names_src.strip("()").split(","):
            item = item.strip()
            if not item or item.startswith("#"):
                continue
            name = item.split(" as ")[0].strip()
            if name in self.table:
                room, new = self.table[name]
                alias = item.split(" as ")[1].strip() if " as " in item else name
                spelled = new if new == alias else f"{new} as {alias}"
                by_target.setdefault(f"{PKG}.{room}", []).append(spelled)
            else:
                by_target.setdefault(PKG, []).append(item)
        lines = []
        for target, items in by_target.items():
            if pkg is None:
                lines.append(f"{m['indent']}from {target} import {', '.join(items)}")
            else:
                dots, mod = self.relative(target, pkg)
                lines.append(f"{m['indent']}from {dots}{mod} import {', '.join(items)}")
        return "\n".join(lines)

    def design_row(self, text: str) -> str:
        """docs/design.md: the layout row of softrdma.drivers names rooms and new places."""
        out = []
        for line in text.splitlines(keepends=True):
            if line.startswith("| `softrdma.drivers` |"):
                for old, (room, new) in self.table.items():
                    line = re.sub(rf"`{re.escape(old)}`", f"`{room}/{new}`", line)
                if "in rooms:" not in line:
                    rooms = ", ".join(f"`{r}/`" for r in ROOMS)
                    line = line.replace("| all I/O: ", f"| all I/O, in rooms: {rooms}, "
                                        "`devd/`; ", 1)
            out.append(line)
        return "".join(out)


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="print the moves, change nothing")
    ap.add_argument("--root", default=".", help="the checkout (default: .)")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    if not (root / DRIVERS).is_dir():
        print(f"no {DRIVERS} under {root}", file=sys.stderr)
        return 2
    flat = flat_modules(root)
    table, unknown = mapping(flat)
    moves = [(old, *table[old]) for old in flat if old in table]
    for old, room, new in moves:
        print(f"move  drivers/{old}.py -> drivers/{room}/{new}.py")
    for name in unknown:
        if name not in STAY:
            print(f"leave drivers/{name}.py (no room for it: add it to ROOMS or PATTERNS)")
    if args.check:
        return 0
    for _old, room, new in moves:
        dest = root / DRIVERS / room / f"{new}.py"
        if dest.exists():
            print(f"stop: {dest.relative_to(root)} exists", file=sys.stderr)
            return 1
    moved_from: dict[Path, str] = {}  # new path -> the package it was in before
    for old, room, new in moves:
        (root / DRIVERS / room).mkdir(exist_ok=True)
        git(root, "mv", str(DRIVERS / f"{old}.py"), str(DRIVERS / room / f"{new}.py"))
        moved_from[DRIVERS / room / f"{new}.py"] = PKG
    for room in sorted({room for room, _new in table.values()}):
        init = root / DRIVERS / room / "__init__.py"
        if (root / DRIVERS / room).is_dir() and not init.exists():
            doc = ROOM_DOCS.get(room, "drivers of one kind.")
            # (not named ``softrdma.drivers.ROOM``: a room named like an old module,
            # ``runtime``, would be rewritten as that module's new name)
            text = textwrap.fill(f"The drivers' {room}/ room: {doc}", 88)
            init.write_text(f'"""{text}\n\nImporting this package imports none of its '
                            'modules."""\n')
            git(root, "add", str(init.relative_to(root)))
            print(f"write {init.relative_to(root)}")
    rw = Rewriter(table)
    changed: list[Path] = []
    py_files = sorted({p for d in PY_DIRS for p in (root / d).rglob("*.py")
                       if ".venv" not in p.parts and "__pycache__" not in p.parts})
    for path in py_files:
        rel = path.relative_to(root)
        if rel.parts[:2] == ("tools", "dev") and rel.name.startswith("relayout_"):
            continue  # the relayout scripts name the old places on purpose
        text = path.read_text()
        new_pkg: str | None = package_of(rel) if rel.parts[0] == "src" else None
        old_pkg = moved_from.get(rel, new_pkg) if new_pkg is not None else None
        out = rw.paths(rw.dotted(rw.imports(text, old_pkg, new_pkg)))
        if out != text:
            path.write_text(out)
            changed.append(path)
    for pattern in TEXT_GLOBS:
        for path in sorted(root.glob(pattern)):
            if not path.is_file():
                continue
            text = path.read_text()
            out = rw.paths(rw.dotted(text))
            if path.relative_to(root) == Path("docs/design.md"):
                out = rw.design_row(out)
            if out != text:
                path.write_text(out)
                changed.append(path)
    for path in changed:
        print(f"rewrote {path.relative_to(root)}")
    py = [str(p.relative_to(root)) for p in changed if p.suffix == ".py"]
    if py:
        ruff = root / ".venv" / "bin" / "ruff"
        cmd = [str(ruff)] if ruff.exists() else [sys.executable, "-m", "ruff"]
        subprocess.run([*cmd, "check", "-q", "--select", "I", "--fix", *py], cwd=root,
                       check=False)
    if changed:
        git(root, "add", *[str(p.relative_to(root)) for p in changed])
    return 0


if __name__ == "__main__":
    sys.exit(main())
