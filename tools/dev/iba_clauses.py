#!/usr/bin/env python3
"""The table of IBA Vol 1 chapter 9-12 clauses: where ``src`` cites each one, which tests
exercise it (issue 23). Run from a checkout's root:

    python3 tools/dev/iba_clauses.py            # write docs/iba-clauses.md
    python3 tools/dev/iba_clauses.py --check    # exit 1 when docs/iba-clauses.md is stale

Citations are read from the text of ``src/softrdma/**/*.py``: ``IBA`` followed by a clause
(``IBA 9.7.5.1.3``) or a list of them (``IBA 9.3.7-9.3.8``, ``IBA 12.6.6-7``,
``IBA 10.5, 11.2.2``, ``IBA 12.6 and 13.4``, across a line break too); a range cites its two
ends. A bare clause of three or more numbers (``the REP (12.6.8)``) in a file that cites
the IBA elsewhere counts too, unless an RFC section sign (``§``) or a dotted number
(an address, a version) makes it something else. Only chapters 9, 10, 11 and 12 are kept.

Tests are read from the syntax tree of ``tests/**/test_*.py`` (nothing is imported or
run): a test function or method carries ``@pytest.mark.iba("9.7.5.1.3", ...)`` (on
itself, on its class, or in the module's ``pytestmark``). The marker is registered in
pyproject (``--strict-markers``); ``tests/docs/test_iba_clauses.py`` checks that this file
is up to date and that every marker names a clause in the IBA's numbering.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

#: The chapters the table covers (IBA Vol 1): their titles.
CHAPTERS = {
    9: "Transport layer",
    10: "Software transport interface",
    11: "Software transport verbs",
    12: "Communication management",
}

#: What a clause number looks like: a chapter, then one or more section numbers, none 0.
CLAUSE = re.compile(r"(?:9|10|11|12)(?:\.[1-9][0-9]*)+")

#: Short titles of the clauses whose subject the source names the same way everywhere it
#: cites them (the headers of IBA 9.2-9.3, the CM messages of IBA 12.6-12.11).
TITLES = {
    "9.2": "Base Transport Header (BTH)",
    "9.3": "Extended transport headers",
    "9.3.2": "Datagram Extended Transport Header (DETH)",
    "9.3.3": "RDMA Extended Transport Header (RETH)",
    "9.3.4": "Atomic Extended Transport Header (AtomicETH)",
    "9.3.5": "ACK Extended Transport Header (AETH)",
    "9.3.6": "Atomic Acknowledge Extended Transport Header (AtomicAckETH)",
    "9.3.7": "Immediate Data Extended Transport Header (ImmDt)",
    "9.3.8": "Invalidate Extended Transport Header (IETH)",
    "12.6.5": "REQ",
    "12.6.6": "MRA",
    "12.6.7": "REJ",
    "12.6.8": "REP",
    "12.6.9": "RTU",
    "12.6.10": "DREQ",
    "12.6.11": "DREP",
    "12.11": "Service ID resolution (SIDR)",
    "12.11.1": "SIDR_REQ",
    "12.11.2": "SIDR_REP",
}

_NUM = r"\d+(?:\.\d+)+"
# "IBA", then a clause, then more clauses or range ends joined by , / - – "and",
# whitespace (a line break, a comment's "#") between the pieces.
_GAP = r"(?:\s|#)*"
_EXPLICIT = re.compile(
    rf"\bIBA{_GAP}(?P<list>{_NUM}(?:{_GAP}(?:,|/|and|-|–){_GAP}\d+(?:\.\d+)*)*)")
_ITEM = re.compile(rf"(?P<sep>^|,|/|and|-|–){_GAP}(?P<num>\d+(?:\.\d+)*)")
_BARE = re.compile(r"(?<![\w.§])(?<!§ )(?P<num>\d+(?:\.\d+){2,})(?![\w.]*\.\d|\w)")


@dataclass
class Clause:
    """One clause: where ``src`` cites it and which tests carry its marker."""

    number: str
    cited: list[tuple[str, int]] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)


def sort_key(number: str) -> tuple[int, ...]:
    """``"9.7.10"`` after ``"9.7.9"``."""
    return tuple(int(part) for part in number.split("."))


def in_scope(number: str) -> bool:
    """``number`` is a clause of chapters 9-12 (not a chapter alone)."""
    return CLAUSE.fullmatch(number) is not None


def _items(text: str) -> list[str]:
    """The clauses of one explicit citation's list, a range giving its two ends (the end
    of ``12.6.6-7`` completed from the start: ``12.6.7``)."""
    out: list[str] = []
    for m in _ITEM.finditer(text):
        num = m["num"]
        if m["sep"] in ("-", "–") and out and "." not in num:
            num = out[-1].rsplit(".", 1)[0] + "." + num
        elif "." not in num:
            continue
        out.append(num)
    return out


def citations(text: str) -> list[tuple[str, int]]:
    """The chapter 9-12 clauses ``text`` cites, each with its line (1-based)."""
    found: list[tuple[str, int]] = []
    spans: list[tuple[int, int]] = []
    for m in _EXPLICIT.finditer(text):
        spans.append(m.span())
        line = text.count("\n", 0, m.start()) + 1
        found += [(num, line) for num in _items(m["list"])]
    if spans:
        for m in _BARE.finditer(text):
            if any(a <= m.start() < b for a, b in spans):
                continue
            before = text[max(0, m.start() - 12):m.start()]
            if re.search(r"RFC\s*\d+\s*$", before):
                continue
            found.append((m["num"], text.count("\n", 0, m.start()) + 1))
    return [(num, line) for num, line in found if in_scope(num)]


def cited_in_src(root: Path) -> dict[str, list[tuple[str, int]]]:
    """Every chapter 9-12 clause cited in ``src/softrdma``: its (file, line) places."""
    out: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for path in sorted((root / "src" / "softrdma").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        seen: set[tuple[str, int]] = set()
        for num, line in citations(path.read_text()):
            if (num, line) not in seen:
                seen.add((num, line))
                out[num].append((rel, line))
    return dict(out)


def _marks(decorators: list[ast.expr]) -> list[ast.Call]:
    """The ``pytest.mark.iba(...)`` calls among ``decorators``."""
    return [d for d in decorators if isinstance(d, ast.Call)
            and isinstance(d.func, ast.Attribute) and d.func.attr == "iba"
            and isinstance(d.func.value, ast.Attribute) and d.func.value.attr == "mark"]


def _args(call: ast.Call, where: str) -> list[str]:
    """The clause strings of one marker (string constants only)."""
    if call.keywords or not call.args:
        raise ValueError(f"{where}: pytest.mark.iba takes clause strings only")
    out = []
    for arg in call.args:
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            raise ValueError(f"{where}: pytest.mark.iba takes clause strings only")
        out.append(arg.value)
    return out


def _module_marks(tree: ast.Module) -> list[ast.Call]:
    """``pytestmark = pytest.mark.iba(...)`` (or a list of marks) at module level."""
    calls: list[ast.Call] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            value = node.value
            elts = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            calls += _marks(list(elts))
    return calls


def _visit(body: list[ast.stmt], rel: str, prefix: str, inherited: list[str],
           out: dict[str, list[str]]) -> None:
    """The marked tests of ``body`` (a module's or a ``Test`` class's) into ``out``."""
    for node in body:
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            own = [a for c in _marks(node.decorator_list) for a in _args(c, where)]
            _visit(node.body, rel, f"{prefix}{node.name}::", inherited + own, out)
        elif (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
              and node.name.startswith("test")):
            own = [a for c in _marks(node.decorator_list) for a in _args(c, where)]
            clauses = list(dict.fromkeys(inherited + own))
            if clauses:
                out[f"{rel}::{prefix}{node.name}"] = clauses


def marked_tests(root: Path) -> dict[str, list[str]]:
    """Every test that carries the ``iba`` marker (``FILE::TEST`` or ``FILE::CLASS::TEST``):
    the clauses it names, in order, read from the syntax tree of ``tests/``."""
    out: dict[str, list[str]] = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), filename=rel)
        module = [a for c in _module_marks(tree) for a in _args(c, rel)]
        _visit(tree.body, rel, "", module, out)
    return out


def table(root: Path) -> dict[str, Clause]:
    """The clauses cited in ``src`` or named by a marker, each with its places and tests."""
    clauses: dict[str, Clause] = {}
    for num, places in cited_in_src(root).items():
        clauses[num] = Clause(num, cited=places)
    for test, nums in marked_tests(root).items():
        for num in nums:
            clauses.setdefault(num, Clause(num)).tests.append(test)
    return dict(sorted(clauses.items(), key=lambda kv: sort_key(kv[0])))


def _places(places: list[tuple[str, int]]) -> str:
    """``src/softrdma/ib/requester.py:12, 40``: one file's lines together."""
    by_file: dict[str, list[int]] = defaultdict(list)
    for path, line in places:
        by_file[path].append(line)
    return "<br>".join(f"`{path}:"
                       f"{', '.join(str(n) for n in sorted(lines))}`"
                       for path, lines in sorted(by_file.items()))


def _tests(tests: list[str]) -> str:
    return "<br>".join(f"`{t}`" for t in sorted(tests)) or "—"


def render(root: Path) -> str:
    """The text of ``docs/iba-clauses.md``."""
    clauses = table(root)
    marked = marked_tests(root)
    lines = [
        "# IBA clauses in the source and the tests that exercise them",
        "",
        "Generated by `python3 ./tools/dev/iba_clauses.py` from the checkout's root (do not edit by hand; "
        "`tests/docs/test_iba_clauses.py` fails when it is stale). It lists every clause of "
        "the InfiniBand Architecture Specification Volume 1, chapters 9 to 12, that a "
        "docstring or comment under `src/softrdma/` cites (as `IBA 9.7.5.1.3`), where it "
        "does (with line numbers), and the tests that carry the marker "
        "`@pytest.mark.iba(\"9.7.5.1.3\")` for it. A "
        "test carries a clause's marker when it checks a behaviour the source implements "
        "under that clause; a clause with no test is cited but not yet shown to be "
        "exercised. Titles are given where the source names the clause's subject.",
        "",
        "## Summary",
        "",
        "| Chapter | Cited in src | Exercised by a marked test |",
        "|---|---|---|",
    ]
    total_cited = total_covered = 0
    for ch, title in CHAPTERS.items():
        cited = [c for c in clauses.values() if c.cited and sort_key(c.number)[0] == ch]
        covered = [c for c in cited if c.tests]
        total_cited += len(cited)
        total_covered += len(covered)
        lines.append(f"| {ch}. {title} | {len(cited)} | {len(covered)} |")
    lines.append(f"| **All** | **{total_cited}** | **{total_covered}** |")
    lines += [
        "",
        f"{len(marked)} tests carry the marker, naming "
        f"{len({n for ns in marked.values() for n in ns})} clauses.",
    ]
    for ch, title in CHAPTERS.items():
        rows = [c for c in clauses.values() if sort_key(c.number)[0] == ch]
        lines += ["", f"## Chapter {ch}: {title}", "",
                  "| Clause | Title | Cited in src | Tests |", "|---|---|---|---|"]
        for c in rows:
            where = _places(c.cited) if c.cited else "(not cited)"
            lines.append(f"| {c.number} | {TITLES.get(c.number, '')} | {where} | "
                         f"{_tests(c.tests)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/iba-clauses.md is not what this would write")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    args = parser.parse_args(argv)
    doc = args.root / "docs" / "iba-clauses.md"
    text = render(args.root)
    if args.check:
        if not doc.exists() or doc.read_text() != text:
            print(f"{doc} is stale: run python3 tools/dev/iba_clauses.py", file=sys.stderr)
            return 1
        return 0
    doc.write_text(text)
    print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
