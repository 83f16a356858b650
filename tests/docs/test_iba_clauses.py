"""The IBA clause table (issue 23): docs/iba-clauses.md is what tools/dev/iba_clauses.py
makes of the source's citations and the tests' ``@pytest.mark.iba`` markers, every marker
names a chapter 9-12 clause the source cites, and the marker is registered under
``--strict-markers``."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "iba-clauses.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "iba_clauses", ROOT / "tools" / "dev" / "iba_clauses.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


gen = _generator()


def test_doc_is_up_to_date() -> None:
    """Regenerated in memory, the table is the checked-in one (a source line that moved, a
    new citation or a new marker changes it: run ``python3 tools/dev/iba_clauses.py``)."""
    assert DOC.read_text() == gen.render(ROOT), (
        "docs/iba-clauses.md is stale: run python3 tools/dev/iba_clauses.py")


def test_markers_name_clauses_cited_in_src() -> None:
    """Every clause a marker names is a chapter 9-12 clause number that ``src`` cites: a
    typo (``9.7.5.13``) or a clause the source does not implement is an error."""
    cited = gen.cited_in_src(ROOT)
    marked = gen.marked_tests(ROOT)
    assert marked, "no test carries @pytest.mark.iba"
    bad = [f"{test}: {num}" for test, nums in marked.items() for num in nums
           if not gen.in_scope(num) or num not in cited]
    assert not bad, "markers naming no clause cited in src:\n" + "\n".join(bad)


def test_marker_is_registered_and_markers_strict() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]
    assert "--strict-markers" in options["addopts"].split()
    assert any(m.split("(")[0].split(":")[0] == "iba" for m in options["markers"])


def test_citations_read_lists_ranges_and_line_breaks() -> None:
    text = (
        '"""Requester (IBA 9.7.1-9.7.6, 9.9.2; rxe_req.c); MRA or REJ (IBA 12.6.6-7).\n'
        "The QP (IBA\n"
        "    10.2.4, 11.2.4) and SIDR (IBA 12.11 and 13.4); the REP (12.6.8).\n"
        "# a comment (IBA 10.5, 11.2.2) and a bare 9.7.5.1.3 in a file citing the IBA\n"
        '"""\n'
    )
    assert gen.citations(text) == [
        ("9.7.1", 1), ("9.7.6", 1), ("9.9.2", 1), ("12.6.6", 1), ("12.6.7", 1),
        ("10.2.4", 2), ("11.2.4", 2), ("12.11", 3), ("10.5", 4), ("11.2.2", 4),
        ("12.6.8", 3), ("9.7.5.1.3", 4)]


def test_citations_leave_out_what_is_not_an_iba_clause() -> None:
    """Other chapters, RFC sections, addresses, versions and bare numbers in a file that
    cites no IBA clause are not citations."""
    assert gen.citations("IBA 13.4.2, IBA 8.2.1, Annex A16 CA16-9") == []
    assert gen.citations("IBA 9.2; RFC 4391 §9.1.1, § 10.2.3, 10.0.17.1 and 3.12.1, "
                         "version 11.2.5.0") == [("9.2", 1)]
    assert gen.citations("RFC 5040 §9.7.5.1 and 12.6.5") == []
    assert gen.citations("IBA 9.7, 12 bytes") == [("9.7", 1)]


def test_markers_read_from_the_syntax_tree(tmp_path: Path) -> None:
    """Markers on a function, on a class (its methods) and in ``pytestmark``; a marker that
    is not a list of strings is an error naming its place."""
    (tmp_path / "src" / "softrdma").mkdir(parents=True)
    (tmp_path / "tests" / "ib").mkdir(parents=True)
    (tmp_path / "tests" / "ib" / "test_a.py").write_text(
        "import pytest\n"
        "pytestmark = [pytest.mark.iba('9.2')]\n"
        "@pytest.mark.iba('9.7.5.1.3', '9.3.5')\n"
        "def test_f(): pass\n"
        "def helper(): pass\n"
        "@pytest.mark.iba('12.6.5')\n"
        "class TestC:\n"
        "    @pytest.mark.slow\n"
        "    @pytest.mark.iba('9.2')\n"
        "    def test_m(self): pass\n")
    assert gen.marked_tests(tmp_path) == {
        "tests/ib/test_a.py::test_f": ["9.2", "9.7.5.1.3", "9.3.5"],
        "tests/ib/test_a.py::TestC::test_m": ["9.2", "12.6.5"],
    }
    (tmp_path / "tests" / "ib" / "test_b.py").write_text(
        "import pytest\nC = '9.2'\n@pytest.mark.iba(C)\ndef test_g(): pass\n")
    with pytest.raises(ValueError, match=r"tests/ib/test_b.py:4: pytest.mark.iba takes"):
        gen.marked_tests(tmp_path)
