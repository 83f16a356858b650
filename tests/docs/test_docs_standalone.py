"""The documentation stands alone (issue 24 §2): a user's clone has no ``../shared``, so
README, docs/ and examples/ must not send readers there, every relative link and every
``docs/NAME.md`` they mention must exist, every ``#anchor`` must name a heading, and what
docs/rdma_cm.md says about private data must match the wire codec."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from softrdma.wire.cm import PRIVATE_DATA_SIZE, CmAttr
from softrdma.wire.ipcm import IPCM_REQ_CONSUMER_MAX, IPCM_SIDR_CONSUMER_MAX

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOC_NAME = re.compile(r"\bdocs/[\w.-]+\.md\b")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "examples").glob("*.py"))]
    assert len(pages) > 5
    return pages


def _slugs(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = FENCE.sub("", page.read_text())
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_no_page_sends_readers_to_shared() -> None:
    bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
           for p in _pages() for n, line in enumerate(p.read_text().splitlines(), 1)
           if "../shared" in line or "shared/specs" in line]
    assert not bad, "\n".join(bad)


def test_relative_links_and_anchors_resolve() -> None:
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _slugs(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_mentioned_docs_exist() -> None:
    missing = sorted({f"{p.relative_to(ROOT)}: {name}" for p in _pages()
                      for name in DOC_NAME.findall(p.read_text())
                      if not (ROOT / name).is_file()})
    assert not missing, "\n".join(missing)


def test_rdma_cm_doc_states_private_data_padding() -> None:
    text = (ROOT / "docs" / "rdma_cm.md").read_text()
    section = text.split("## Private data", 1)[1].split("\n## ", 1)[0]
    assert "zero-padded" in section and "IBA 12.6" in section and "A11" in section
    rows = dict(re.findall(r"^\| (\S+) \(`\w+`(?:, \w+)?\) \| (\d+) bytes \|", section, re.M))
    assert rows == {
        "REQ": str(IPCM_REQ_CONSUMER_MAX),
        "REP": str(PRIVATE_DATA_SIZE[CmAttr.REP]),
        "REJ": str(PRIVATE_DATA_SIZE[CmAttr.REJ]),
        "SIDR_REQ": str(IPCM_SIDR_CONSUMER_MAX),
        "SIDR_REP": str(PRIVATE_DATA_SIZE[CmAttr.SIDR_REP]),
    }, rows


def _docstring_ids(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def test_messages_and_help_do_not_send_users_to_shared() -> None:
    """What softrdma prints (errors, help, counter explanations: every string that is not
    a docstring) never names the spec digests or the lab under ../shared."""
    bad = []
    for path in sorted((ROOT / "src" / "softrdma").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = _docstring_ids(tree)
        bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docs
                and ("shared/specs" in node.value or "shared/lab" in node.value)]
    assert not bad, "\n".join(bad)


def test_src_cites_primary_clauses_not_shared_digests() -> None:
    """Docstrings and comments cite the primary clause (IBA x.y.z, RFC nnnn §x, CA16-n),
    not the workspace's ``../shared/specs`` digests or ``../shared/captures``: a user's
    clone has neither. Only the interop suite names ``../shared`` (where it looks for the
    lab, saying so)."""
    src = ROOT / "src" / "softrdma"
    bad = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(ROOT)
        in_interop = path.is_relative_to(src / "interop")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if ("shared/specs" in line or "shared/captures" in line
                    or "captures README" in line or ("../shared" in line and not in_interop)):
                bad.append(f"{rel}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)
