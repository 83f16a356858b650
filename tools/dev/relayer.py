#!/usr/bin/env python3
"""Issue 23's package moves, as a replayable script (run from a checkout's root).

    python3 tools/dev/relayer.py            # moves + rewrites, then `ruff --select I --fix`
    python3 tools/dev/relayer.py --check    # say what would move; change nothing

What it does, in order:

1. checks the tree: every module of :data:`MOVES` is where the table says and none of its
   destinations exists, and the work tree has no uncommitted change to a tracked file
   (``--allow-dirty`` skips that). A second run fails here, naming the first module that
   has already moved: the script is not idempotent, it refuses to run twice.
2. rewrites every ``from ... import`` of every Python file it finds (tracked or untracked
   but not ignored) under :data:`ROOTS`, files it has never seen included: an import of a
   moved module (``from softrdma.cm.gsi import X``, ``from softrdma.cm import gsi``,
   ``from .gsi import X``, ``from . import gsi``, ``from ..cm.gsi import X``) names its new
   place; relative imports stay relative (re-counted from the importing file's new
   place), absolute stay absolute; a name whose module moved elsewhere than its siblings
   gets its own statement; a module renamed on the way keeps its local name (``as``).
3. rewrites the dotted names of moved modules in every text file under :data:`ROOTS`
   (``import softrdma.cm.gsi``, ``mock.patch("softrdma.cm.ibcm.time")``,
   ``python -m softrdma.drivers.ipoib_runtime``, ``:mod:`softrdma.cm.gsi```, pyproject and
   mypy settings), their paths (``src/softrdma/cm/gsi.py``) and, outside Python files, the
   package-relative dotted forms the docs use (``cm.gsi``); paths ``cm/gsi.py`` everywhere;
   and in ``src``, Sphinx references relative to the package (``:mod:`.gsi```).
4. ``git mv``s the files and writes the ``__init__.py`` of the new packages
   (:data:`NEW_PACKAGES`).
5. sorts the imports of the files it changed (``ruff check --select I --fix``): a moved
   module's new name sorts elsewhere; then stages every file it changed (``git add``), so
   ``git commit`` takes the whole result.

The hand edits the script cannot make (docstrings that name a module relatively, the layer
table of tests/test_architecture.py and docs/design.md, code that has to change package)
are separate commits on the relayer branch, to cherry-pick after running this.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT_PACKAGE = "softrdma"
SRC = Path("src")
# where imports and names are rewritten (files or folders, relative to the checkout root)
ROOTS = ("src", "tests", "bench", "examples", "docs", "tools", ".ci", "pyproject.toml",
         "README.md", "CONTRIBUTING.md", "Makefile", "setup.cfg", "tox.ini", "conftest.py")
TEXT_SUFFIXES = frozenset({".py", ".pyi", ".md", ".rst", ".txt", ".toml", ".cfg", ".ini",
                           ".sh", ".yml", ".yaml", ".json", ".c", ".h", ".in", ""})

_CM_ENGINE = ("model", "state", "establish", "release", "mra_lap", "retry", "sidr", "cmid",
              "params", "events", "qpctl", "userqp", "ipcm")

_TOOL_ROOMS = {
    "ibverbs": ("pingpong", "pingpong_ext", "srq_pingpong", "xsrq_pingpong", "xsrq_msg",
                "devinfo", "devices", "asyncwatch", "oobconnect"),
    "rdmacm": ("rping", "rping_run", "udaddy", "ucmatose", "mckey", "rdma_server", "cmtest",
               "cmargs", "cmflags"),
    "capture": ("pcap_check", "pcap_check_iwarp", "pcap_conv", "pcap_gso", "pcap_oob",
                "ladder", "ladder_draw", "ladder_events", "ladder_iwarp", "ladder_model"),
    "suites": ("rdma_core_tests", "pyverbs_run", "sysfs_ns", "hugepages"),
    "admin": ("link", "stats", "res", "ipoib"),
}

# old module -> new module (both dotted, from the top package)
MOVES: dict[str, str] = {
    # 1. the IB CM engine (imports wire, seam, ib only) leaves cm/ for its own package;
    #    cm/ keeps the librdmacm-shaped API (rdma_*) and the Hello dialect (a verbs user)
    **{f"softrdma.cm.{m}": f"softrdma.ibcm.{m}" for m in _CM_ENGINE},
    "softrdma.cm.ibcm": "softrdma.ibcm.agent",
    #    ... its QP1 driver and iWARP's TCP connection setup are I/O: drivers
    "softrdma.cm.gsi": "softrdma.drivers.cm.gsi",
    "softrdma.cm.iwconnect": "softrdma.drivers.cm.iwconnect",
    # 2. the IPoIB interface process, a verbs + CM application of the ipoib engine
    "softrdma.drivers.ipoib_runtime": "softrdma.apps.ipoib_runtime",
    # 3. drivers/ in rooms: the device daemon and what only it (and its client) use
    "softrdma.drivers.devd": "softrdma.drivers.devd.daemon",
    **{f"softrdma.drivers.devd_{m}": f"softrdma.drivers.devd.{m}"
       for m in ("client", "proto", "spawn", "qpn", "forward", "cm", "mcast", "v1")},
    **{f"softrdma.drivers.{m}": f"softrdma.drivers.devd.{m}"
       for m in ("admission", "cm_reject", "reuseport")},
    #    tools/ in rooms (cli, demo, waiting, argtypes and perftest/ stay)
    **{f"softrdma.tools.{m}": f"softrdma.tools.{room}.{m}"
       for room, ms in _TOOL_ROOMS.items() for m in ms},
}

# (old module, name) -> the old module that defines the name: an import of a name that a
# module only re-exported comes from where it is defined (``from softrdma.drivers.devd
# import DevdLink`` -> ``from softrdma.drivers.devd.client import DevdLink``), so client
# processes do not import the daemon.
NAME_HOMES: dict[tuple[str, str], str] = {
    **{("softrdma.drivers.devd", n): "softrdma.drivers.devd_proto"
       for n in ("DEFAULT_IDLE_TIMEOUT", "QPN_FIRST", "QPN_LAST", "STAT_NAMES",
                 "socket_path")},
    **{("softrdma.drivers.devd", n): "softrdma.drivers.devd_spawn"
       for n in ("DEVD_START_TIMEOUT", "DevdVanished", "ensure_devd")},
    ("softrdma.drivers.devd", "DevdLink"): "softrdma.drivers.devd_client",
    **{("softrdma.drivers.devd", n): "softrdma.drivers.host.port_totals"
       for n in ("counters_path", "saved_counters")},
}

NEW_PACKAGES: dict[str, str] = {
    "softrdma.ibcm": (
        '"""softrdma.ibcm: the InfiniBand Communication Manager engine (IBA Vol 1 ch. 12).\n\n'
        "Sans-I/O, beside the transports: it imports ``wire``, ``seam`` and ``ib`` only. Its\n"
        "QP1 driver is :mod:`softrdma.drivers.cm.gsi`; the librdmacm-shaped API over it is\n"
        ':mod:`softrdma.cm`.\n"""\n'),
    "softrdma.drivers.devd": (
        '"""softrdma.drivers.devd: the per-device daemon (:mod:`.daemon`, ``python -m\n'
        "softrdma.drivers.devd.daemon``) and its client link (:mod:`.client`), the protocol\n"
        "between them (:mod:`.proto`), starting it (:mod:`.spawn`), QPN allocation\n"
        "(:mod:`.qpn`), forwarding (:mod:`.forward`), the kernel's reuseport demultiplexing\n"
        "(:mod:`.reuseport`), admission (:mod:`.admission`), REJ for unlistened REQs\n"
        "(:mod:`.cm`, :mod:`.cm_reject`), multicast (:mod:`.mcast`) and RoCEv1 (:mod:`.v1`).\n\n"
        "Importing this package imports none of them: a client process imports\n"
        ':mod:`.client`, never the daemon.\n"""\n'),
    "softrdma.tools.ibverbs": '"""The libibverbs examples and tools (ibv_*_pingpong, ibv_devinfo ...)."""\n',
    "softrdma.tools.rdmacm": '"""The librdmacm examples (rping, udaddy, ucmatose, mckey, rdma_server ...)."""\n',
    "softrdma.tools.capture": '"""Capture analysis: pcap-check, pcap conversion, ladder diagrams."""\n',
    "softrdma.tools.suites": '"""Runners of other projects\' test suites (rdma-core\'s tests, pyverbs)."""\n',
    "softrdma.tools.admin": '"""Administration: link, stats, res, ipoib."""\n',
    "softrdma.apps": (
        '"""softrdma.apps: processes built on verbs and the CM (above ``cm``): the IPoIB\n'
        'interface process (:mod:`.ipoib_runtime`)."""\n'),
}


class RelayerError(Exception):
    """The tree is not the one the moves were written for (or they already ran)."""


def module_path(module: str, packages: set[str]) -> Path:
    parts = module.split(".")
    if module in packages:
        return SRC.joinpath(*parts, "__init__.py")
    return SRC.joinpath(*parts).with_suffix(".py")


def module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True,
                          text=True).stdout


def candidate_files() -> list[Path]:
    """Tracked and untracked-but-not-ignored files under :data:`ROOTS`."""
    out = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
              *[r for r in ROOTS if Path(r).exists()])
    files = sorted({Path(p) for p in out.split("\0") if p})
    me = Path(__file__).resolve()
    return [f for f in files if f.is_file() and f.suffix in TEXT_SUFFIXES
            and not f.is_symlink() and f.resolve() != me]


def check_tree(modules: set[str], packages: set[str], allow_dirty: bool) -> None:
    for old, new in MOVES.items():
        if old not in modules:
            where = " (already moved: this script runs once)" if new in modules else ""
            raise RelayerError(f"{old} is not in src/{where}")
        if new in modules or module_path(new, packages).exists():
            raise RelayerError(f"{new} exists already: this script runs once")
        for other in MOVES:
            if new == other or (new.startswith(other + ".") and other not in NEW_PACKAGES):
                raise RelayerError(f"{new} is also a module that moves (chained move)")
    for pkg in NEW_PACKAGES:
        if pkg in modules and pkg not in MOVES:
            raise RelayerError(f"package {pkg} exists already: this script runs once")
    if not allow_dirty:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        if dirty.strip():
            raise RelayerError("uncommitted changes to tracked files (commit them, or "
                               f"--allow-dirty):\n{dirty}")


# ------------------------------------------------------------------ import statements

@dataclass
class Edit:
    start: int  # offsets into the file's text
    end: int
    text: str


def _offsets(text: str) -> list[int]:
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def relative_spec(importer_pkg: str, target: str) -> str:
    """The ``from`` spec naming ``target`` relatively from package ``importer_pkg``."""
    a, b = importer_pkg.split("."), target.split(".")
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    if common == 0:
        return target  # another top package: absolute
    return "." * (len(a) - common + 1) + ".".join(b[common:])


def _alias(name: str, asname: str | None) -> str:
    return name if asname is None or asname == name else f"{name} as {asname}"


def rewrite_imports(text: str, path: Path, modules: set[str],
                    packages: set[str]) -> str:
    """``text`` with each ``from ... import`` of a moved module (or from a moved module)
    naming the new place."""
    try:
        tree = ast.parse(text, str(path))
    except SyntaxError:
        return text
    in_src = path.parts[:2] == (SRC.name, ROOT_PACKAGE)
    old_mod = module_of(path) if in_src else ""
    new_mod = MOVES.get(old_mod, old_mod)
    is_pkg = path.name == "__init__.py"
    old_pkg = old_mod if is_pkg else old_mod.rpartition(".")[0]
    new_pkg = new_mod if is_pkg else new_mod.rpartition(".")[0]
    moved_file = new_mod != old_mod
    offs = _offsets(text)
    edits: list[Edit] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            if not in_src:
                continue
            base = old_pkg.split(".")[:len(old_pkg.split(".")) - (node.level - 1)]
            src_mod = ".".join(base + ([node.module] if node.module else []))
        else:
            src_mod = node.module or ""
        if src_mod != ROOT_PACKAGE and not src_mod.startswith(ROOT_PACKAGE + "."):
            continue
        # each name -> (module it is imported from now, name, local name)
        groups: dict[str, list[str]] = {}
        changed = moved_file and node.level > 0
        for a in node.names:
            full = f"{src_mod}.{a.name}"
            if full in modules and full in MOVES:
                parent, _, name = MOVES[full].rpartition(".")
                local = a.asname or a.name
                groups.setdefault(parent, []).append(_alias(name, local))
                changed = True
            else:
                home = NAME_HOMES.get((src_mod, a.name), src_mod)
                parent = MOVES.get(home, home)
                changed |= parent != src_mod
                groups.setdefault(parent, []).append(_alias(a.name, a.asname))
        if not changed:
            continue
        start = offs[node.lineno - 1] + node.col_offset
        end = offs[node.end_lineno - 1] + node.end_col_offset  # type: ignore[operator]
        segment = text[start:end]

        def spec(target: str, level: int = node.level) -> str:
            return relative_spec(new_pkg, target) if level else target

        if len(groups) == 1 and [n for ns in groups.values() for n in ns] == \
                [_alias(a.name, a.asname) for a in node.names]:
            (target,) = groups
            new = re.sub(r"^from\s+[.\w]+", lambda _m, t=target: f"from {spec(t)}", segment,
                         count=1)
        else:
            comments = " ".join(re.findall(r"#[^\n]*", segment))
            indent = " " * node.col_offset
            lines = [f"from {spec(t)} import {', '.join(ns)}" for t, ns in groups.items()]
            if comments:
                lines[0] += f"  {comments}"
            new = ("\n" + indent).join(lines)
        if new != segment:
            edits.append(Edit(start, end, new))
    for e in sorted(edits, key=lambda e: e.start, reverse=True):
        text = text[:e.start] + e.text + text[e.end:]
    return text


# ------------------------------------------------------------------ names and paths

def _name_rules() -> list[tuple[re.Pattern[str], dict[str, str], bool]]:
    """(pattern, old -> new, python files too): one alternation per form, longest name
    first, so each place is rewritten once (``drivers.devd_client`` is not also taken for
    ``drivers.devd`` + ``_client``, nor ``drivers.devd.client`` for ``drivers.devd``)."""
    forms: list[tuple[str, str, str, bool]] = [  # (lookbehind, joiner, suffix, in python)
        (r"(?<![\w.])", ".", r"(?!\w)", True),  # softrdma.cm.gsi
        (r"(?<![\w.])", "/", r"(?=\.py\b)", True),  # softrdma/cm/gsi.py
    ]
    rules: list[tuple[re.Pattern[str], dict[str, str], bool]] = []
    for behind, joiner, suffix, in_python in forms:
        for short in (False, True):  # short: package-relative (cm.gsi, cm/gsi.py)
            table: dict[str, str] = {}
            for old, new in MOVES.items():
                o, n = old.split("."), new.split(".")
                if short:
                    o, n = o[1:], n[1:]
                table[joiner.join(o)] = joiner.join(n)
            alts = "|".join(re.escape(k) for k in sorted(table, key=len, reverse=True))
            pattern = re.compile(
                f"{behind}{'(?<![/-])' if short else ''}({alts}){suffix}")
            rules.append((pattern, table, in_python and not (short and joiner == ".")))
    return rules


def _sub_names(text: str, python: bool) -> str:
    for pattern, table, in_python in _name_rules():
        if python and not in_python:
            continue
        text = pattern.sub(lambda m, t=table: t[m.group(1)], text)
    return text


def rewrite_names(text: str, python: bool) -> str:
    """``text`` with the names and paths of moved modules rewritten; in a Python file,
    outside its ``from ... import`` statements (:func:`rewrite_imports` does those)."""
    if not python:
        return _sub_names(text, python)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return _sub_names(text, python)
    offs = _offsets(text)
    spans = sorted((offs[n.lineno - 1] + n.col_offset,
                    offs[n.end_lineno - 1] + n.end_col_offset)  # type: ignore[operator]
                   for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    out, pos = [], 0
    for start, end in spans:
        out += [_sub_names(text[pos:start], python), text[start:end]]
        pos = end
    out.append(_sub_names(text[pos:], python))
    return "".join(out)


_DOC_REF = re.compile(r"(?<=`)(~?)\.([A-Za-z_]\w*)")


def rewrite_doc_refs(text: str, path: Path, modules: set[str]) -> str:
    """Sphinx references relative to a module's package (``:mod:`.gsi```,
    ``:class:`~.ibcm.CmAgent```) in a file of ``src``: a reference to a module that moved,
    or from a module that moved, names the module from the file's new place (relatively
    when it is in the same package, else in full)."""
    if path.parts[:2] != (SRC.name, ROOT_PACKAGE):
        return text
    old_mod = module_of(path)
    new_mod = MOVES.get(old_mod, old_mod)
    is_pkg = path.name == "__init__.py"
    old_pkg = old_mod if is_pkg else old_mod.rpartition(".")[0]
    new_pkg = new_mod if is_pkg else new_mod.rpartition(".")[0]

    def fix(m: re.Match[str]) -> str:
        target = f"{old_pkg}.{m.group(2)}"
        if target not in modules:
            return m.group(0)
        new = MOVES.get(target, target)
        parent, _, last = new.rpartition(".")
        return f"{m.group(1)}.{last}" if parent == new_pkg else f"{m.group(1)}{new}"

    return _DOC_REF.sub(fix, text)


_PARENTS = re.compile(r"(Path\(__file__\)(?:\.resolve\(\))?\.parents\[)(\d+)\]")


def rewrite_file_paths(text: str, path: Path) -> str:
    """In a module that moves to another depth, ``Path(__file__).parents[N]`` (a folder of
    the checkout) counts the new depth."""
    if path.parts[:2] != (SRC.name, ROOT_PACKAGE):
        return text
    old = module_of(path)
    delta = len(MOVES.get(old, old).split(".")) - len(old.split("."))
    if not delta:
        return text
    return _PARENTS.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + delta}]", text)


# ------------------------------------------------------------------ the run

def _ruff() -> list[str] | None:
    for cand in (Path(".venv/bin/ruff"), Path(sys.executable).parent / "ruff"):
        if cand.exists():
            return [str(cand)]
    found = shutil.which("ruff")
    return [found] if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--check", action="store_true", help="say what would move; change nothing")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="run with uncommitted changes to tracked files")
    args = ap.parse_args(argv)
    if not (SRC / ROOT_PACKAGE / "__init__.py").exists():
        print("relayer: run from the checkout's root (src/softrdma/ not found)",
              file=sys.stderr)
        return 2
    inits = sorted((SRC / ROOT_PACKAGE).rglob("__init__.py"))
    packages = {module_of(p) for p in inits}
    modules = {module_of(p) for p in sorted((SRC / ROOT_PACKAGE).rglob("*.py"))}
    try:
        check_tree(modules, packages, args.allow_dirty)
    except RelayerError as e:
        print(f"relayer: {e}", file=sys.stderr)
        return 1
    if args.check:
        for old, new in MOVES.items():
            print(f"{module_path(old, packages)} -> {module_path(new, packages)}")
        return 0
    changed: list[Path] = []
    for path in candidate_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        new = rewrite_names(text, python=path.suffix in (".py", ".pyi"))
        if path.suffix == ".py":
            new = rewrite_doc_refs(new, path, modules)
            new = rewrite_file_paths(new, path)
            new = rewrite_imports(new, path, modules, packages)
        if new != text:
            path.write_text(new)
            changed.append(path)
    for pkg, doc in NEW_PACKAGES.items():
        init = module_path(pkg, packages | {pkg})
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text(doc)
            git("add", str(init))
    for old, new in MOVES.items():
        dst = module_path(new, packages)
        dst.parent.mkdir(parents=True, exist_ok=True)
        git("mv", str(module_path(old, packages)), str(dst))
        changed = [dst if c == module_path(old, packages) else c for c in changed]
        if dst not in changed:
            changed.append(dst)
    py = [str(c) for c in changed if c.suffix == ".py" and c.exists()]
    ruff = _ruff()
    if ruff and py:
        subprocess.run([*ruff, "check", "--quiet", "--select", "I", "--fix", *py],
                       check=False)
    elif py:
        print("relayer: ruff not found: sort the imports of the changed files by hand",
              file=sys.stderr)
    git("add", "--", *[str(c) for c in changed if c.exists()])
    print(f"relayer: moved {len(MOVES)} modules, rewrote {len(changed)} files (staged: "
          "commit them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
