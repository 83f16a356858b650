"""The shape of ``src/softrdma``, read from its source with :mod:`ast` (nothing is imported).

Four rules (docs/design.md, "Layout"):

* the import graph of the package's modules has no cycle, function-local imports counted
  (an import under ``if TYPE_CHECKING:`` is not run and is not an edge here), and none
  either when type-only imports count too;
* the protocol packages hold no I/O: ``ib``, ``iwarp`` and ``seam`` import no ``socket``,
  ``threading``, ``select``, ``selectors``, ``asyncio``, ``subprocess`` nor ``time`` (engines
  are given the time); ``wire``, ``ibcm``, ``cm`` and ``ipoib`` import none of the first six and do
  not call ``time.sleep``;
* each package imports only the packages :data:`ALLOWED` gives it (type-only and
  function-local imports included);
* no module is over :data:`MAX_MODULE_LINES` lines (none is generated or a declarative
  table long enough to need an exception).

And one rule for ``tests/``: a test file imports no other test file and no helper outside
the ``tests/harness`` package (:func:`foreign_test_imports`); what tests share lives there.

There is no table of exceptions: a rule holds for every module or the test fails.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "softrdma"
ROOT_PACKAGE = "softrdma"

ANY = frozenset({"*"})
BASE = frozenset({"errors", "enums", "trace"})  # usable everywhere

# package -> the packages of ours it may import (docs/design.md's layout table). The order
# from the bottom: errors/enums, wire, seam, the sans-I/O engines (ib, iwarp, ipoib, and
# ibcm, the IB CM, beside ib), drivers (I/O: links, runtimes, devd, the CM's QP1 driver,
# iWARP connection setup), verbs, cm (the librdmacm-shaped API), then the applications
# (apps: the IPoIB interface process; tools, compat, interop).
ALLOWED: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "enums": frozenset(),
    "trace": frozenset({"errors"}),
    "": frozenset({"trace"}),  # the package itself: its __init__ configures tracing
    "wire": BASE,
    "seam": BASE,
    "ib": BASE | {"wire", "seam"},
    "iwarp": BASE | {"wire", "seam"},
    "ipoib": BASE | {"wire"},
    "ibcm": BASE | {"wire", "seam", "ib"},
    "drivers": BASE | {"wire", "seam", "ib", "iwarp", "ibcm"},
    "verbs": BASE | {"wire", "seam", "ib", "iwarp", "drivers"},
    "cm": BASE | {"wire", "seam", "ib", "iwarp", "ibcm", "drivers", "verbs"},
    # the IPoIB interface process: it drives the sans-I/O ipoib engine as a verbs + CM
    # application (UD QP, RC connections through the IB CM)
    "apps": BASE | {"wire", "seam", "ib", "ipoib", "ibcm", "drivers", "verbs", "cm"},
    "compat": ANY,
    # C programs (softrdma run): a verbs application whose API is libibverbs' C ABI
    "capi": BASE | {"seam", "verbs", "cm"},
    "tools": ANY,
    "interop": ANY,
    "__main__": ANY,
}

IO_MODULES = frozenset({"socket", "threading", "select", "selectors", "asyncio", "subprocess"})
NO_IO_NO_CLOCK = ("ib", "iwarp", "seam")  # ... and no `time` at all
NO_IO = ("wire", "cm", "ibcm", "ipoib")  # ... and no time.sleep()

# Module size (issue 23): a module over this many lines is split by responsibility.
MAX_MODULE_LINES = 600



@dataclass(frozen=True)
class Import:
    """One import statement's edge: ``source`` imports ``target`` (both module names)."""

    source: str
    target: str
    lineno: int
    local: bool  # inside a function body
    type_only: bool  # under ``if TYPE_CHECKING:``


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """``softrdma.ibcm.agent`` -> ``ibcm``; ``softrdma.errors`` -> ``errors``; the root -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def modules(src: Path = SRC) -> dict[str, Path]:
    return {module_name(p, src): p for p in sorted(src.rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                out.update(id(n) for n in ast.walk(child))
    return out


def _function_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for child in ast.iter_child_nodes(node):
                out.update(id(n) for n in ast.walk(child))
    return out


def imports_of(name: str, path: Path, known: Iterable[str]) -> list[Import]:
    """The imports of module ``name`` (file ``path``) that name modules in ``known``: an
    ``import a.b`` or ``from a import b`` names ``a.b`` when that is a module, else ``a``."""
    known = set(known)
    tree = ast.parse(path.read_text(), str(path))
    type_only, local = _type_checking_nodes(tree), _function_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod
                       for a in node.names]
        for t in targets:
            while t and t not in known and "." in t:  # `import a.b.c` of a package's name
                t = t.rpartition(".")[0]
            if t in known and t != name:
                out.append(Import(name, t, node.lineno, id(node) in local,
                                  id(node) in type_only))
    return out


@functools.cache
def import_graph(src: Path = SRC) -> list[Import]:
    mods = modules(src)
    return [imp for name, path in mods.items() for imp in imports_of(name, path, mods)]


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    graph = {k: sorted(set(v)) for k, v in edges.items()}
    for targets in list(graph.values()):
        for t in targets:
            graph.setdefault(t, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        # iterative DFS: (node, iterator over its successors)
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def runtime_edges(imports: Iterable[Import],
                  ignore: Iterable[tuple[str, str]] = ()) -> dict[str, set[str]]:
    """The module graph as run: every import but the type-only ones (and ``ignore``)."""
    skip = set(ignore)
    out: dict[str, set[str]] = {}
    for imp in imports:
        if not imp.type_only and (imp.source, imp.target) not in skip:
            out.setdefault(imp.source, set()).add(imp.target)
    return out


def all_edges(imports: Iterable[Import]) -> dict[str, set[str]]:
    """The module graph as typed: every import, type-only ones included."""
    out: dict[str, set[str]] = {}
    for imp in imports:
        out.setdefault(imp.source, set()).add(imp.target)
    return out


def layer_violations(imports: Iterable[Import],
                     allowed: Mapping[str, frozenset[str]] = ALLOWED) -> set[tuple[str, str]]:
    """(module, package) pairs where a module imports a package its layer may not."""
    bad = set()
    for imp in imports:
        src_pkg, dst_pkg = package_of(imp.source), package_of(imp.target)
        if src_pkg == dst_pkg or dst_pkg == "":
            continue
        ok = allowed.get(src_pkg, frozenset())
        if ok is ANY or dst_pkg in ok:
            continue
        bad.add((imp.source, dst_pkg))
    return bad


def io_uses(path: Path) -> set[str]:
    """The I/O modules (and ``time``) a file imports, and ``time.sleep`` if it calls it."""
    tree = ast.parse(path.read_text(), str(path))
    used = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module.split(".")[0]]
            if node.module == "time" and any(a.name == "sleep" for a in node.names):
                used.add("time.sleep")
        used.update(n for n in names if n in IO_MODULES or n == "time")
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "time.sleep":
            used.add("time.sleep")
    return used


def io_violations(src: Path = SRC) -> dict[str, set[str]]:
    out = {}
    for name, path in modules(src).items():
        pkg = package_of(name)
        if pkg in NO_IO_NO_CLOCK:
            banned = IO_MODULES | {"time", "time.sleep"}
        elif pkg in NO_IO:
            banned = IO_MODULES | {"time.sleep"}
        else:
            continue
        bad = io_uses(path) & banned
        if bad:
            out[name] = bad
    return out


def oversized_modules(src: Path = SRC, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """Module -> its number of lines, for each module over ``limit`` lines."""
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules(src).items()}
    return {name: n for name, n in sizes.items() if n > limit}


# ---------------------------------------------------------------------------- the tree

def test_every_package_has_a_row_in_the_layer_table() -> None:
    packages = {package_of(m) for m in modules()} - {""}
    assert packages <= set(ALLOWED), f"add to ALLOWED: {sorted(packages - set(ALLOWED))}"


def test_the_layer_table_has_no_cycle() -> None:
    table = {k: v for k, v in ALLOWED.items() if v is not ANY}
    assert cycles(table) == []


def test_import_graph_has_no_cycles_lazy_imports_included() -> None:
    graph = runtime_edges(import_graph())
    found = cycles(graph)
    assert not found, f"import cycles (function-local imports count): {found}"


def test_import_graph_has_no_cycles_type_only_imports_included() -> None:
    found = cycles(all_edges(import_graph()))
    assert found == [], f"import cycles (type-only imports count): {found}"


def test_every_package_imports_only_what_its_layer_allows() -> None:
    bad = layer_violations(import_graph())
    assert sorted(bad) == []


def test_protocol_packages_do_no_io() -> None:
    found = {m: sorted(u) for m, u in io_violations().items() if u}
    assert found == {}


def test_no_module_is_over_the_line_limit() -> None:
    found = oversized_modules()
    assert found == {}, f"split these modules (over {MAX_MODULE_LINES} lines): {found}"


def test_an_oversized_module_is_caught(tmp_path: Path) -> None:
    src = _write(tmp_path, {
        "wire/big.py": "x = 1\n" * 601,
        "wire/edge.py": "x = 1\n" * 600,
        "ib/small.py": "x = 1\n",
    })
    assert oversized_modules(src) == {"softrdma.wire.big": 601}


# ---------------------------------------------------------------------------- tests/
TESTS = Path(__file__).resolve().parent
HARNESS = "harness"


def foreign_test_imports(tests: Path = TESTS) -> list[str]:
    """``FILE: MODULE`` for each import, in a Python file under ``tests`` (``tests/data``
    aside: programs run by path), of a module that lives under ``tests`` outside the
    ``harness`` package: another test file, a conftest or a stray helper. Only ``harness``
    may be imported; function-local and type-only imports count."""
    files = [p for p in sorted(tests.rglob("*.py")) if "data" not in p.relative_to(tests).parts]
    local = {p.stem for p in files if HARNESS not in p.relative_to(tests).parts[:1]}
    found: list[str] = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [f"{p.relative_to(tests)}: {n}" for n in names
                      if n.split(".")[0] in local and n.split(".")[0] != HARNESS]
    return found


def test_tests_import_only_the_harness() -> None:
    assert foreign_test_imports() == []


def test_a_test_to_test_import_is_caught(tmp_path: Path) -> None:
    files = {
        "harness/__init__.py": "",
        "harness/pair.py": "import os\n",
        "ib/test_a.py": "from harness.pair import os\nfrom harness import pair\n",
        "ib/test_b.py": "def f():\n    from test_a import os\n",
        "cm/test_c.py": "import test_b as b\nimport stray_helper\n",
        "stray_helper.py": "",
        "data/prog.py": "import test_a\n",  # tests/data: programs, not looked at
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert foreign_test_imports(tmp_path) == [
        "cm/test_c.py: test_b", "cm/test_c.py: stray_helper", "ib/test_b.py: test_a"]


# ----------------------------------------------------- the checks catch what they look for

def _write(root: Path, files: Mapping[str, str]) -> Path:
    """A package ``softrdma`` under ``root`` with ``files`` (and an empty ``__init__.py`` in
    each of its folders)."""
    pkg = root / "softrdma"
    for rel, text in files.items():
        p = pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for folder in {pkg, *(p.parent for p in pkg.rglob("*.py"))}:
        (folder / "__init__.py").touch()
    return pkg


def test_cycle_finder_on_a_synthetic_graph() -> None:
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": []}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": ["a"], "c": ["d"], "d": ["c"]}) == [["a", "b"], ["c", "d"]]
    assert cycles({"a": ["b"], "b": ["c"], "c": []}) == []
    # a long chain closed at its end (the iterative search has no recursion limit)
    chain = {f"m{i}": [f"m{i + 1}"] for i in range(5000)}
    chain["m5000"] = ["m0"]
    assert len(cycles(chain)[0]) == 5001


def test_a_function_local_import_closing_a_cycle_is_caught(tmp_path: Path) -> None:
    src = _write(tmp_path, {
        "cm/a.py": "from .b import g\n\ndef f():\n    return g()\n",
        "cm/b.py": "def g():\n    from .a import f  # noqa: PLC0415\n    return f\n",
        "cm/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n",
    })
    imports = import_graph(src)
    assert {(i.source, i.target, i.local, i.type_only) for i in imports} == {
        ("softrdma.cm.a", "softrdma.cm.b", False, False),
        ("softrdma.cm.b", "softrdma.cm.a", True, False),
        ("softrdma.cm.c", "softrdma.cm.a", False, True),
    }
    assert cycles(runtime_edges(imports)) == [["softrdma.cm.a", "softrdma.cm.b"]]
    assert cycles(runtime_edges(imports, ignore=[("softrdma.cm.b", "softrdma.cm.a")])) == []
    # counting the type-only edge too, c joins no cycle (c -> a only), a and b still do
    assert cycles(all_edges(imports)) == [["softrdma.cm.a", "softrdma.cm.b"]]


def test_a_type_only_cycle_is_caught(tmp_path: Path) -> None:
    src = _write(tmp_path, {
        "drivers/a.py": "from .b import g\n",
        "drivers/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                        "    from .a import f\ng = 1\n",
    })
    imports = import_graph(src)
    assert cycles(runtime_edges(imports)) == []
    assert cycles(all_edges(imports)) == [["softrdma.drivers.a", "softrdma.drivers.b"]]


def test_a_layer_violation_is_caught(tmp_path: Path) -> None:
    src = _write(tmp_path, {
        "wire/x.py": "from .. import errors\n",
        "errors.py": "",
        "verbs/qp.py": "import softrdma.wire.x\n",
        "ib/qp.py": "def f():\n    from ..verbs import qp  # noqa: PLC0415\n    return qp\n",
    })
    assert layer_violations(import_graph(src)) == {("softrdma.ib.qp", "verbs")}


def test_io_in_a_protocol_package_is_caught(tmp_path: Path) -> None:
    src = _write(tmp_path, {
        "ib/a.py": "import time\n",
        "wire/b.py": "import time\n\ndef f():\n    time.sleep(0.002)\n",
        "wire/c.py": "import time\n\ndef f():\n    return time.time()\n",
        "cm/d.py": "from threading import Lock\n",
        "drivers/e.py": "import socket\nimport time\ntime.sleep(0)\n",
    })
    assert io_violations(src) == {"softrdma.ib.a": {"time"}, "softrdma.wire.b": {"time.sleep"},
                                  "softrdma.cm.d": {"threading"}}


def test_design_doc_layout_table_matches_the_allowed_table() -> None:
    """docs/design.md's "Layout" table says what each package may import: it is ALLOWED."""
    doc = (SRC.parent.parent / "docs" / "design.md").read_text()
    section = doc.split("## Layout", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, frozenset[str]] = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`softrdma."):
            continue
        may = cells[2].split(";")[0]  # a module's own extra imports follow a ";"
        targets = frozenset({"*"}) if may == "anything" else \
            frozenset(re.findall(r"`([a-z_]+)`", may)) & set(ALLOWED)
        for pkg in re.findall(r"`softrdma\.([a-z_]+)`", cells[0]):
            documented[pkg] = targets
    expected = {pkg: (ok if ok is ANY else ok - BASE) for pkg, ok in ALLOWED.items()
                if pkg not in ("__main__", "") and (pkg != "seam" or (SRC / "seam").is_dir())}
    assert {p: documented.get(p) for p in expected} == expected


def test_a_client_process_does_not_import_the_daemon() -> None:
    """A verbs, rdma_cm or IPoIB process opens devices through the daemon's client link
    (``drivers.devd.client``); the daemon's module (``drivers.devd.daemon``) is imported only
    by the daemon itself (``python -m``) and its in-process tests."""
    code = ("import sys, softrdma.verbs, softrdma.cm.rdma_cm, softrdma.apps.ipoib_runtime\n"
            "print(sorted(m for m in sys.modules if m == 'softrdma.drivers.devd.daemon'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]", out
