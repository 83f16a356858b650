"""The docs name code that exists (issue 23, "Docs"): docs/design.md's layout table names
every module of each package (that its last column is ``ALLOWED`` is
``tests/test_architecture.py``'s check); its two walks name importable functions and
classes, each stop a file visited once; and no page of docs/, README.md or a source file
in src/ refers to a ``tests/``, ``src/`` or ``docs/`` path of ours that does not exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "softrdma"
DESIGN = ROOT / "docs" / "design.md"

# A path of this repository: tests/..., src/..., docs/..., bench/..., examples/...
PATH = re.compile(
    r"(?<![\w/.-])((?:tests|src|docs|bench|examples)/[\w/.-]*\w\.(?:py|md|c|h|sh|toml))\b")
# Another project's file: its project's name right before it ("librdmacm's
# ``examples/mckey.c``", "perftest (``src/perftest_communication.c``")
FOREIGN = re.compile(r"(?:librdmacm|perftest|rdma-core|linux)(?:'s)?[\s(`]*$", re.I)
# A module named by its path in src/softrdma (the design doc's drawings: ``ib/port.py``);
# the Linux kernel's drivers/infiniband/... files are not ours
SHORT_PATH = re.compile(r"(?<![\w/.-])((?:wire|seam|ib|iwarp|ipoib|ibcm|drivers|verbs|cm|apps|"
                        r"capi|tools|compat|interop)/[\w/]*\w\.(?:py|c))\b")
QUALIFIED = re.compile(r"`(softrdma(?:\.\w+)+)`")
STOP = re.compile(r"^\s*\d+\.\s+\*\*`([^`]+)`\*\*", re.M)


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next ``## ``)."""
    assert f"\n## {heading}\n" in text, heading
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def _walks() -> list[tuple[str, str]]:
    """(title, body) of each ``###`` walk of the "Two walks through the code" section."""
    body = _section(DESIGN.read_text(), "Two walks through the code")
    parts = re.split(r"^### (.+)$", body, flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def resolve(name: str) -> object:
    """Import the longest module prefix of a dotted ``name``, then getattr the rest."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)  # AttributeError: the name does not exist
        return obj
    raise ModuleNotFoundError(name)


def _layout_rows() -> dict[str, tuple[str, str]]:
    """package -> (what lives there, may import) of design.md's layout table."""
    rows = {}
    for line in _section(DESIGN.read_text(), "Layout").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`softrdma"):
            continue
        for pkg in re.findall(r"`softrdma\.(\w+)`", cells[0]):
            rows[pkg] = (cells[1], cells[2])
    return rows


def test_layout_table_names_every_module() -> None:
    missing = []
    for pkg, (what, _) in _layout_rows().items():
        d = SRC / pkg
        if not d.is_dir():
            continue
        named = set(re.findall(r"`([\w.]+)/?`", what))
        for p in sorted(d.iterdir()):
            if p.name.startswith(("__", ".")) or p.suffix not in (".py", ".c", ""):
                continue
            if p.suffix == "" and not (p / "__init__.py").is_file():
                continue
            name = p.name if p.suffix == ".c" else p.stem
            if name not in named:
                missing.append(f"softrdma.{pkg}: {p.name}")
    assert not missing, "not in design.md's layout table:\n" + "\n".join(missing)


def test_walks_name_existing_code() -> None:
    walks = _walks()
    assert len(walks) == 2, [t for t, _ in walks]
    bad = []
    for title, body in walks:
        stops = STOP.findall(body)
        assert len(stops) >= 5, title
        dup = sorted({s for s in stops if stops.count(s) > 1})
        if dup:
            bad.append(f"{title}: stops visited twice: {dup}")
        bad += [f"{title}: no file {s}" for s in stops if not (ROOT / s).is_file()]
        names = QUALIFIED.findall(body)
        assert len(names) >= 10, title
        for name in names:
            try:
                resolve(name)
            except (ImportError, AttributeError) as exc:
                bad.append(f"{title}: {name}: {exc}")
        # each stop names something of its own file
        for stop in stops:
            module = stop.removeprefix("src/").removesuffix(".py").replace("/", ".")
            if module + "." not in body and f"`{module}`" not in body:
                bad.append(f"{title}: stop {stop} names nothing of {module}")
    assert not bad, "\n".join(bad)


def test_resolve_rejects_missing_names() -> None:
    """The walk check can fail: a made-up name is an error, a real one resolves."""
    assert resolve("softrdma.ib.port.Port.receive") is not None
    for name in ("softrdma.ib.port.Port.no_such_method", "softrdma.no_such_module.f"):
        try:
            resolve(name)
        except (ImportError, AttributeError):
            continue
        raise AssertionError(f"{name} resolved")


# a name of softrdma in backquotes (``softrdma.ib.port.Port``, :mod:`~softrdma.wire.ib`)
NAMED = re.compile(r"(?:`|:`~?)(softrdma(?:\.\w+)+)`")
# logger names (softrdma.trace's kinds, the link's warnings), not code
LOGGERS = {"softrdma.qp", "softrdma.pkt", "softrdma.cm", "softrdma.link"}


def test_named_code_exists() -> None:
    """Every ``softrdma.…`` name that README, docs/ or a docstring quotes can be imported."""
    bad = []
    for f in _referring_files():
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for name in NAMED.findall(line):
                if name in LOGGERS:
                    continue
                try:
                    resolve(name)
                except (ImportError, AttributeError) as exc:
                    bad.append(f"{f.relative_to(ROOT)}:{n}: {name}: {exc}")
    assert not bad, "\n".join(bad)


def _referring_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted(SRC.rglob("*.py")), *sorted(SRC.rglob("*.c"))]


def test_referenced_paths_exist() -> None:
    missing = []
    for f in _referring_files():
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for path in PATH.findall(line):
                if (ROOT / path).exists() or FOREIGN.search(line.split(path, 1)[0]):
                    continue
                missing.append(f"{f.relative_to(ROOT)}:{n}: {path}")
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            missing += [f"{page.relative_to(ROOT)}:{n}: {path}" for path in SHORT_PATH.findall(line)
                        if not path.startswith("drivers/infiniband/") and not (SRC / path).exists()]
    assert not missing, "references to files that do not exist:\n" + "\n".join(missing)


def test_path_pattern_finds_our_paths_only() -> None:
    line = "see tests/test_enums.py, src/softrdma/ib/port.py and docs/design.md"
    assert PATH.findall(line) == ["tests/test_enums.py", "src/softrdma/ib/port.py",
                                  "docs/design.md"]
    assert not PATH.findall("softrdma/tests/x.py or /usr/src/a.c")
    assert SHORT_PATH.findall("ib/port.py Port.receive, drivers/devd/client.py, x/ib/a.py") == [
        "ib/port.py", "drivers/devd/client.py"]
    assert FOREIGN.search("librdmacm's ``") and FOREIGN.search("perftest (``")
    assert not FOREIGN.search("Generated from the header (rdma-core 44); ")
