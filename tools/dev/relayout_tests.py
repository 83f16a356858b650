#!/usr/bin/env python3
"""Issue 23's "Tests in folders", as a replayable script (run from a checkout's root).

    python3 tools/dev/relayout_tests.py            # extract, move, rewrite, sort imports, git add
    python3 tools/dev/relayout_tests.py --check    # say where each file goes; change nothing

What it does, in order (it refuses to run when ``tests/harness`` already exists):

1. **Shared code out of test files.** Each entry of :data:`EXTRACT` names a test file
   that other test files import from, and its harness module: every name they import
   (found by reading their imports) and the entry's own names move (with what they
   need from the same file: the closure over the top-level names they use, a fixture's
   fixture parameters included) into a new module of ``tests/harness/``, which gets the
   test file's imports; the test file imports them back from there (a fixture with
   ``noqa``); imports left unused on either side are dropped (``ruff --select F401 --fix``).
2. **Helpers into the harness package.** Every helper module and peer script of
   :data:`HARNESS` moves (``git mv``) to ``tests/harness/NEW.py``; ``tests/harness/__init__.py``
   is written.
3. **Tests into folders.** Every ``tests/test_*.py`` moves to ``tests/FOLDER/`` by
   :func:`folder_of` (:data:`EXPLICIT`, then the prefix rules of :data:`PREFIXES`); a test
   file no rule names stops the script before anything changes. The base names stay (they
   are unique, so pytest's default ``prepend`` import mode keeps working).
4. **Imports and paths.** In every Python file under ``tests/``: ``from engine_harness import X``
   -> ``from harness.engine import X``; ``import device_harness`` -> ``from harness import device
   as device_harness``; ``from test_devd import X`` -> ``from harness.devd import X`` (only
   names extracted in step 1; any other import of a test module stops the script). Files one
   folder deeper have their ``Path(__file__)`` arithmetic re-counted (``.parent`` ->
   ``.parents[1]``, ``.parents[N]`` -> ``.parents[N+1]``), and the peer scripts' names
   (``"ipoib_peer.py"``) gain their folder (``"harness/ipoib_peer.py"``).
5. **Paths in text.** Every ``tests/test_X.py`` and ``tests/OLD_helper.py`` named in README,
   docs, src, bench, tools, .ci, pyproject and the tests themselves names the new place;
   a glob (``tests/test_capi_*.py``) too, when all the files it matches went to one folder;
   a helper named in backquotes (:mod:`netns_harness`, ``engine_harness.Net``) becomes
   ``harness.NEW``. The Python files there (the benchmarks put ``tests/`` on ``sys.path``)
   have their helper imports rewritten as in step 4.
6. ``ruff check --select I --fix`` on the Python files it changed, then ``git add`` them.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: old helper module (tests/OLD.py) -> its module in the harness package (tests/harness/NEW.py)
HARNESS: dict[str, str] = {
    "bottleneck_harness": "bottleneck",
    "capi_harness": "capi",
    "cc_flows": "cc_flows",
    "cm_harness": "cm",
    "device_harness": "device",
    "engine_harness": "engine",
    "ipoib_netns": "ipoib_netns",
    "iwarp_harness": "iwarp",
    "iwarp_parts": "iwarp_parts",
    "mw_helper": "mw",
    "netns_harness": "netns",
    "perftest_harness": "perftest",
    "property_budget": "property_budget",
    "pyverbs_harness": "pyverbs",
    "rdma_cm_harness": "rdma_cm",
    "trace_harness": "trace",
    "wait_harness": "wait",
    # scripts the tests run by path (``sys.executable, PEER``): they import only softrdma
    "ipoib_peer": "ipoib_peer",
    "ipoib_tcp": "ipoib_tcp",
    "ipoib_tun_check": "ipoib_tun_check",
    "netns_endpoint": "netns_endpoint",
    "rocev1_peer": "rocev1_peer",
    "udp_gso_peer": "udp_gso_peer",
}
SCRIPTS = ("ipoib_peer", "ipoib_tcp", "ipoib_tun_check", "netns_endpoint", "rocev1_peer",
           "udp_gso_peer")


@dataclass(frozen=True)
class Extract:
    """Top-level ``names`` of ``tests/SOURCE.py`` go to ``tests/harness/DEST.py``."""

    source: str
    names: tuple[str, ...]
    dest: str
    doc: str


EXTRACT: tuple[Extract, ...] = (
    Extract("test_devd", ("LOCAL", "state", "Running", "start_devd", "running", "packet",
                          "recv_one", "wait_for", "free_udp_port"),
            "devd", "A devd of a private state directory on 127.0.0.1 and its raw datagrams."),
    Extract("test_devd_rej", ("PEER", "V4_MAPPED", "cm_client", "peer"), "devd_cm",
            "The CM side of a devd test: a client that listens for nothing, a raw peer."),
    Extract("test_verbs_data", (), "verbs_pair",
            "Two verbs endpoints (one side each: PD, CQ, QP, MR) connected RC/UC/UD, on the "
            "fabric or over UDP."),
    Extract("test_verbs_wr", (), "verbs_wr",
            "A connected pair on the fabric for work-request checks, and SGEs."),
    Extract("test_rping", (), "rping", "An rping server and client as two processes."),
    Extract("test_capi_pyverbs", ("need_real_pyverbs",), "capi_pyverbs",
            "Debian's real pyverbs for ``softrdma run`` tests (skips when it is missing)."),
    Extract("test_capi_rdmacm", ("pair", "perftest_pair"), "capi_pairs",
            "A server and a client run together under ``softrdma run``, their outputs."),
    Extract("test_cm_udp", ("contexts",), "cm_udp",
            "Two RoCE contexts on the loopback (127.0.0.1 <-> 127.0.0.2) for the CM over UDP."),
    Extract("test_cm_ibcm", ("SID", "connect", "check_lap_lids_ignored",
                             "check_req_lids_are_not_validated",
                             "check_roce_forbidden_codes_are_never_sent"),
            "cm_ibcm", "IB CM connections on the fabric (tests/harness/cm.py's Pair)."),
    Extract("test_static_rate", ("Net", "check_ud_ah_static_rate_is_kept",
                                 "check_rc_qp_static_rate_is_kept"), "static_rate",
            "Two contexts on a fabric that records when each packet left; static rate checks."),
    Extract("test_udp_gso", ("RecordingLink",), "recording_link",
            "A link that records what it is given to send."),
    Extract("test_pcap_gso", ("_segments", "_batch_frame"), "gso_frames",
            "UDP GSO batch frames as a capture on ``lo`` holds them."),
    Extract("test_trace_pcap_v1_iwarp", ("_iwarp_session",), "iwarp_session",
            "An iWARP session written to a capture by ``Context(pcap=...)``."),
    Extract("test_pingpong", ("device", "_kill_devd", "_spawn", "_env"), "pingpong",
            "The pingpong tools as processes on a private device."),
    Extract("test_engine_property", ("v1_of", "packet_budget", "run_mix"), "rc_mix",
            "A random mix of RC operations over a faulty virtual network, checked exactly once."),
    Extract("test_fabric_property", ("roce_ver_of",), "fabric_mix",
            "The RoCE version of a fabric property example."),
    Extract("test_port_counters", ("Pair",), "counters_pair",
            "Two contexts on one shared device with a connected RC pair, for the counters."),
    Extract("test_reuseport", ("LOCAL", "packet", "recv_all", "qpns_of"),
            "reuseport", "Raw datagrams on the direct receive path of a shared device."),
    Extract("test_iwarp_tcp", ("Ep",), "iwarp_tcp",
            "iWARP endpoints through the verbs API over TCP on the loopback."),
)

#: the folders, by prefix of a test file's name (first match wins; :data:`EXPLICIT` first)
PREFIXES: tuple[tuple[str, str], ...] = (
    ("test_wire_", "wire"),
    ("test_engine_", "ib"),
    ("test_iwarp_", "iwarp"),
    ("test_cm_", "ibcm"),
    ("test_rdma_cm_", "cm"),
    ("test_ipoib_", "ipoib"),
    ("test_devd", "drivers"),
    ("test_reuseport", "drivers"),
    ("test_udp_", "drivers"),
    ("test_verbs_", "verbs"),
    ("test_gid_", "verbs"),
    ("test_pyverbs_", "compat"),
    ("test_capi_", "capi"),
    ("test_perftest_", "tools"),
    ("test_pingpong", "tools"),
    ("test_pcap_", "tools"),
    ("test_tool", "tools"),
    ("test_rdma_core_", "tools"),
    ("test_interop_", "interop"),
    ("test_docs_", "docs"),
    ("test_bench_", "bench"),
)
EXPLICIT: dict[str, str] = {
    "test_architecture.py": "",  # stays in tests/: the shape of src and tests
    # ib: the IB transport engine (ib/), its rules on the virtual network
    "test_ack_before_flush.py": "ib", "test_fastpath.py": "ib", "test_gro_middle_run.py": "ib",
    "test_late_acks.py": "ib", "test_read_storm.py": "ib", "test_congestion.py": "ib",
    "test_static_rate.py": "ib", "test_source_check.py": "ib", "test_xrc.py": "ib",
    "test_rdma_cm_hooks.py": "ib", "test_roce_a16_compliance.py": "ib",
    # wire: codecs
    "test_pcap.py": "wire", "test_rocev1.py": "wire",
    # seam
    "test_seam.py": "seam",
    # iwarp
    "test_mpa_crc_initiator.py": "iwarp",
    # cm: the librdmacm-shaped API
    "test_conn_soak.py": "cm",
    # drivers: links, fabric, progress and runtimes, devd, registry, state directory, taps
    "test_fabric.py": "drivers", "test_fabric_property.py": "drivers",
    "test_progress.py": "drivers", "test_poll_pacer.py": "drivers",
    "test_receive_first.py": "drivers", "test_rx_overflow.py": "drivers",
    "test_registry.py": "drivers", "test_state_dir.py": "drivers",
    "test_state_dir_readers.py": "drivers", "test_counters_persist.py": "drivers",
    "test_device_error_cause.py": "drivers", "test_rocev1_netns.py": "drivers",
    "test_multihost.py": "drivers", "test_multihost_mcast.py": "drivers",
    "test_trace_pcap.py": "drivers", "test_trace_pcap_v1_iwarp.py": "drivers",
    # verbs
    "test_scale.py": "verbs", "test_port_counters.py": "verbs",
    # compat (pyverbs)
    "test_shared_objects.py": "compat", "test_odp_consistency.py": "compat",
    # tools: the subcommands
    "test_cmtools.py": "tools", "test_devices_asyncwatch.py": "tools", "test_ladder.py": "tools",
    "test_mckey.py": "tools", "test_oobtcp.py": "tools", "test_rping.py": "tools",
    "test_rdma_examples.py": "tools", "test_srq_pingpong.py": "tools",
    "test_xsrq_pingpong.py": "tools", "test_waiting.py": "tools",
    "test_demo_beside_devd.py": "tools", "test_link_rename.py": "tools",
    "test_res_show.py": "tools", "test_newcomer_edges.py": "tools",
    "test_tshark_own_traffic.py": "tools",
    # interop
    "test_mpa_crc_initiator_interop.py": "interop",
    # docs: README, docs/, examples/ as written
    "test_examples.py": "docs", "test_pictures.py": "docs", "test_readme_ci.py": "docs",
}
#: text files outside tests/ whose ``tests/...`` paths are rewritten
TEXT_ROOTS = ("README.md", "docs", "src", "bench", "tools", ".ci", "pyproject.toml", "examples")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".c", ".sh", ""}


def folder_of(name: str) -> str:
    """The folder of test file ``name`` (``""``: stays in tests/)."""
    if name in EXPLICIT:
        return EXPLICIT[name]
    for prefix, folder in PREFIXES:
        if name.startswith(prefix):
            return folder
    raise SystemExit(f"relayout_tests: no folder for tests/{name}: add it to EXPLICIT")


def sh(*args: str) -> None:
    subprocess.run(args, check=True)


# ---------------------------------------------------------------------------- step 1
def _bound(st: ast.stmt) -> list[str]:
    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [st.name]
    if isinstance(st, ast.Assign):
        return [n.id for t in st.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
        return [st.target.id]
    if isinstance(st, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in st.names]
    return []


def _free_names(st: ast.stmt) -> set[str]:
    """The names ``st`` reads that it does not bind itself (a function's parameters and
    locals are its own; nested scopes are counted with their parent, which is enough
    here)."""
    loads = {n.id for n in ast.walk(st) if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Load)}
    if not isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return loads
    own = {a.arg for a in ast.walk(st.args) if isinstance(a, ast.arg)}
    own |= {n.id for n in ast.walk(st) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    deco = {n.id for d in st.decorator_list for n in ast.walk(d) if isinstance(n, ast.Name)}
    return (loads - own) | deco


def _noqa_f811(text: str, names: set[str]) -> str:
    """Mark the parameters named ``names`` (fixtures now imported) ``# noqa: F811``."""
    lines = text.splitlines(keepends=True)
    marks = {a.lineno - 1 for f in ast.walk(ast.parse(text))
             if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for a in f.args.args + f.args.kwonlyargs if a.arg in names}
    for k in marks:
        ln = lines[k].rstrip("\n")
        if "F811" in ln:
            continue
        if "# noqa:" in ln:
            ln = ln.replace("# noqa:", "# noqa: F811,", 1)
        else:
            ln += "  # noqa: F811"
        lines[k] = ln + "\n"
    return "".join(lines)


def _is_fixture(st: ast.stmt) -> bool:
    return isinstance(st, ast.FunctionDef) and any(
        "fixture" in ast.unparse(d) for d in st.decorator_list)


def _span(st: ast.stmt, lines: list[str]) -> tuple[int, int]:
    """0-based [start, end) lines of ``st``: decorators and the comments just above."""
    start = min([st.lineno] + [d.lineno for d in getattr(st, "decorator_list", [])]) - 1
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    assert st.end_lineno is not None
    return start, st.end_lineno


def extract(tests: Path, ex: Extract) -> set[str]:
    """Step 1 for one entry; returns every name that moved."""
    src = tests / f"{ex.source}.py"
    text = src.read_text()
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    binds: dict[str, list[int]] = {}
    for i, st in enumerate(tree.body):
        for n in _bound(st):
            binds.setdefault(n, []).append(i)
    imports = {i for i, st in enumerate(tree.body) if isinstance(st, (ast.Import, ast.ImportFrom))}
    moved: set[str] = set()
    stmts: set[int] = set()
    todo = list(ex.names)
    while todo:
        name = todo.pop()
        if name in moved:
            continue
        if name not in binds:
            raise SystemExit(f"relayout_tests: tests/{ex.source}.py defines no {name}")
        if name.startswith("test_"):
            raise SystemExit(f"relayout_tests: {ex.dest} would take the test {name}")
        if all(i in imports for i in binds[name]):
            continue  # an imported name: the harness module gets the imports
        moved.add(name)
        for i in binds[name]:
            st = tree.body[i]
            if i in stmts or i in imports:
                continue
            stmts.add(i)
            moved.update(_bound(st))  # ``RC, UC, UD = ...`` moves whole
            used = _free_names(st)
            if _is_fixture(st):
                assert isinstance(st, ast.FunctionDef)
                used |= {a.arg for a in st.args.args}
            todo.extend(u for u in used if u in binds and u not in moved
                        and not all(j in imports for j in binds[u]))
    for n in moved:  # a moved name is bound by moved statements only
        if any(i not in stmts for i in binds[n]):
            raise SystemExit(f"relayout_tests: {ex.source}: {n} is bound twice")
    head = [ast.get_source_segment(text, tree.body[i]) or "" for i in sorted(imports)
            if not (isinstance(tree.body[i], ast.ImportFrom)
                    and tree.body[i].module == "__future__")]  # type: ignore[attr-defined]
    spans = [_span(tree.body[i], lines) for i in sorted(stmts)]
    body = ["".join(lines[a:b]).strip("\n") for a, b in spans]
    dest = tests / "harness" / f"{ex.dest}.py"
    if dest.exists():
        raise SystemExit(f"relayout_tests: {dest} exists")
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(f'"""{ex.doc}\n\n(Moved from tests/{ex.source}.py, which other test files '
                    'imported.)"""\n\nfrom __future__ import annotations\n\n'
                    + "\n".join(head) + "\n\n\n" + "\n\n\n".join(body) + "\n")
    keep: list[str] = []
    cut = {k for a, b in spans for k in range(a, b)}
    keep = [ln for k, ln in enumerate(lines) if k not in cut]
    rest = re.sub(r"\n{4,}", "\n\n\n", "".join(keep))
    fixtures = sorted(n for n in moved if any(_is_fixture(tree.body[i]) for i in binds[n]))
    used_rest = {n.id for n in ast.walk(ast.parse(rest)) if isinstance(n, ast.Name)}
    plain = sorted(n for n in moved if n in used_rest and n not in fixtures)
    new_imports = ""
    if plain:
        new_imports += f"from harness.{ex.dest} import {', '.join(plain)}\n"
    if fixtures:
        new_imports += (f"from harness.{ex.dest} import {', '.join(fixtures)}"
                        "  # noqa: F401  (fixtures)\n")
    last = max((st.end_lineno or 0) for st in ast.parse(rest).body
               if isinstance(st, (ast.Import, ast.ImportFrom)))
    rl = rest.splitlines(keepends=True)
    src.write_text(_noqa_f811("".join(rl[:last]) + new_imports + "".join(rl[last:]),
                              set(fixtures)))
    return moved


def imported_names(tests: Path, tests_mods: set[str]) -> dict[str, set[str]]:
    """What test files import from other test files: test module -> names."""
    out: dict[str, set[str]] = {}
    for p in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in tests_mods:
                out.setdefault(node.module, set()).update(a.name for a in node.names)
            if isinstance(node, ast.Import) and any(a.name in tests_mods for a in node.names):
                raise SystemExit(f"relayout_tests: {p} imports a test module whole")
    return out


# ---------------------------------------------------------------------------- step 4
_FROM = re.compile(r"^(\s*)from\s+([A-Za-z_][A-Za-z0-9_]*)\s+import\b", re.M)
_IMPORT = re.compile(r"^(\s*)import\s+([A-Za-z_][A-Za-z0-9_]*)(\s+as\s+([A-Za-z_]\w*))?\s*$", re.M)


def rewrite_imports(path: Path, extracted: dict[str, tuple[str, set[str]]],
                    tests_mods: set[str]) -> None:
    text = path.read_text()
    tree = ast.parse(text)
    for node in ast.walk(tree):  # every import of a test module must have been extracted
        if isinstance(node, ast.ImportFrom) and node.module in tests_mods:
            if node.module not in extracted:
                raise SystemExit(f"relayout_tests: {path} imports {node.module}: add an Extract")
            dest, names = extracted[node.module]
            bad = [a.name for a in node.names if a.name not in names]
            if bad:
                raise SystemExit(f"relayout_tests: {path} imports {bad} from {node.module}")
        if isinstance(node, ast.Import) and any(a.name in tests_mods for a in node.names):
            raise SystemExit(f"relayout_tests: {path} imports a test module whole")

    def from_(m: re.Match[str]) -> str:
        mod = m.group(2)
        if mod in HARNESS:
            return f"{m.group(1)}from harness.{HARNESS[mod]} import"
        if mod in extracted:
            return f"{m.group(1)}from harness.{extracted[mod][0]} import"
        return m.group(0)

    def import_(m: re.Match[str]) -> str:
        mod = m.group(2)
        if mod in HARNESS:
            return f"{m.group(1)}from harness import {HARNESS[mod]} as {m.group(4) or mod}"
        return m.group(0)

    new = _IMPORT.sub(import_, _FROM.sub(from_, text))
    if new != text:
        path.write_text(new)


def rewrite_file_paths(path: Path) -> None:
    """``path`` is one folder deeper than before: re-count its ``Path(__file__)`` steps."""
    text = path.read_text()
    pf = r"(Path\(__file__\)(?:\.resolve\(\))?)"
    text = re.sub(pf + r"\.parents\[(\d)\]", lambda m: f"{m.group(1)}.parents[{int(m.group(2)) + 1}]",
                  text)
    text = re.sub(pf + r"\.parent\.parent(?![.\w])", r"\1.parents[2]", text)
    text = re.sub(pf + r"\.parent(?!\.parent\b|\w)", r"\1.parents[1]", text)
    for s in SCRIPTS:
        text = text.replace(f'"{s}.py"', f'"harness/{s}.py"')
    path.write_text(text)


# ---------------------------------------------------------------------------- step 5
def rewrite_text_paths(path: Path, where: dict[str, str]) -> bool:
    """``where``: old path (``tests/x.py``) -> new path. Returns whether it changed."""
    try:
        text = path.read_text()
    except (UnicodeDecodeError, OSError):
        return False

    def sub(m: re.Match[str]) -> str:
        old = m.group(0)
        if old in where:
            return where[old]
        if "*" in old:
            hits = {where[o].rsplit("/", 1)[0] for o in where if fnmatch.fnmatch(o, old)}
            if len(hits) == 1:
                return f"{hits.pop()}/{old.rsplit('/', 1)[1]}"
        return old

    new = re.sub(r"(?<![\w/.])tests/[A-Za-z0-9_*]+\.py", sub, text)
    for mod, to in HARNESS.items():  # ``tests/cm_harness``, :mod:`netns_harness`, `x_harness.Y`
        new = re.sub(rf"(?<![\w/.])tests/{mod}(?![\w.])", f"tests/harness/{to}", new)
        new = re.sub(rf"(?<=`){mod}(?=`|\.(?!py\b)\w)", f"harness.{to}", new)
    if new != text:
        path.write_text(new)
        return True
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="say where each file goes")
    args = ap.parse_args()
    root = Path.cwd()
    tests = root / "tests"
    if not (tests / "conftest.py").is_file():
        raise SystemExit("relayout_tests: run from the checkout's root")
    if (tests / "harness").exists():
        raise SystemExit("relayout_tests: tests/harness exists: already done")
    top = sorted(p.name for p in tests.glob("*.py"))
    moves: dict[str, str] = {}  # old path -> new path, relative to root
    for name in top:
        stem = name[:-3]
        if name == "conftest.py":
            continue
        if stem in HARNESS:
            moves[f"tests/{name}"] = f"tests/harness/{HARNESS[stem]}.py"
        elif name.startswith("test_"):
            folder = folder_of(name)
            if folder:
                moves[f"tests/{name}"] = f"tests/{folder}/{name}"
        else:
            raise SystemExit(f"relayout_tests: tests/{name} is neither a test nor in HARNESS")
    missing = [m for m in HARNESS if f"tests/{m}.py" not in moves]
    if missing:
        raise SystemExit(f"relayout_tests: helpers not found: {missing}")
    if args.check:
        for old, new in moves.items():
            print(f"{old} -> {new}")
        for ex in EXTRACT:
            print(f"tests/{ex.source}.py {', '.join(ex.names)} -> tests/harness/{ex.dest}.py")
        return
    tests_mods = {n[:-3] for n in top if n.startswith("test_")}
    wanted = imported_names(tests, tests_mods)
    extracted: dict[str, tuple[str, set[str]]] = {}
    for ex in EXTRACT:
        names = tuple(dict.fromkeys(ex.names + tuple(sorted(wanted.pop(ex.source, set())))))
        extracted[ex.source] = (ex.dest, extract(tests, Extract(ex.source, names, ex.dest,
                                                                ex.doc)))
    if wanted:
        raise SystemExit(f"relayout_tests: test files import {sorted(wanted)}: add an Extract")
    (tests / "harness" / "__init__.py").write_text(
        '"""What the tests share: endpoints, networks, devices, waits and the peer scripts '
        "some tests run by path.\n\nTests import only this package, never another test file "
        '(tests/test_architecture.py checks it)."""\n')
    for old, new in moves.items():
        (root / new).parent.mkdir(exist_ok=True)
        sh("git", "mv", old, new)
    changed: list[Path] = [tests / "harness" / "__init__.py"]
    changed += [tests / "harness" / f"{ex.dest}.py" for ex in EXTRACT]
    for new in moves.values():
        rewrite_file_paths(root / new)
    for ex in EXTRACT:
        rewrite_file_paths(tests / "harness" / f"{ex.dest}.py")
    pyfiles = sorted(p for p in tests.rglob("*.py") if "data" not in p.relative_to(tests).parts)
    for p in pyfiles:
        rewrite_imports(p, extracted, tests_mods)
    changed += pyfiles
    for p in tests.rglob("*.py"):
        rewrite_text_paths(p, moves)
    tracked = subprocess.run(["git", "ls-files", "-z", "--", *TEXT_ROOTS], check=True,
                             capture_output=True, text=True).stdout.split("\0")
    for name in tracked:
        f = root / name
        if not (name and f.is_file() and f.suffix in TEXT_SUFFIXES
                and f.resolve() != Path(__file__).resolve()):
            continue
        before = f.read_bytes()
        if f.suffix == ".py":  # the benchmarks import helpers of tests/ (sys.path)
            rewrite_imports(f, {}, set())
        rewrite_text_paths(f, moves)
        if f.read_bytes() != before:
            changed.append(f)
    py = [str(p) for p in changed if p.suffix == ".py"]
    ruff = str(root / ".venv" / "bin" / "ruff")
    if not Path(ruff).exists():
        ruff = shutil.which("ruff") or "ruff"
    subprocess.run([ruff, "check", "-q", "--select", "F401", "--fix",
                    *[str(tests / "harness" / f"{ex.dest}.py") for ex in EXTRACT],
                    *[moves[f"tests/{ex.source}.py"] for ex in EXTRACT]], check=False)
    subprocess.run([ruff, "check", "-q", "--select", "I", "--fix", *py], check=False)
    sh("git", "add", "-A", "tests", *[str(p) for p in changed if p.exists()])


if __name__ == "__main__":
    main()
