"""docs/pictures.py makes the docs' pictures again from real runs, and what it makes
matches what is checked in (docs/images): the fabric and block-diagram pictures byte for
byte (virtual clock, fixed seed, no dates), the rping ladder in its lanes and messages
(its PSNs, QPNs and times differ from run to run)."""

from __future__ import annotations

import importlib.util
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("matplotlib")

DOCS = Path(__file__).resolve().parents[2] / "docs"
IMAGES = DOCS / "images"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pictures", DOCS / "pictures.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    return ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]


def _shape(text: str) -> str:
    """A label without its numbers (PSNs, QPNs, MSNs, times)."""
    return re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?", "N", text)


def test_docs_pictures_are_regenerable(tmp_path: Path) -> None:
    made = _generator().generate(tmp_path)
    assert sorted(p.name for p in made) == sorted(p.name for p in IMAGES.iterdir())
    for name in ("lossy-ladder.svg", "lossy-psn.png", "processes.svg"):
        assert (tmp_path / name).read_bytes() == (IMAGES / name).read_bytes(), (
            f"docs/images/{name} is stale: run python docs/pictures.py")
    new, old = _texts(tmp_path / "rping-ladder.svg"), _texts(IMAGES / "rping-ladder.svg")
    cm = [t for t in new if re.match(r"(REQ|REP|RTU|DREQ|DREP)\b", t)]
    assert [_shape(t) for t in cm] == ["REQ QPN N PSN N", "REP QPN N PSN N", "RTU", "DREQ",
                                       "DREP"]
    # The same lanes, legend and kinds of message (how many ACKs depends on timing:
    # a responder may coalesce them).
    kinds = Counter(_shape(t) for t in new if not t.strip().startswith(tuple("0123456789")))
    assert set(kinds) == {_shape(t) for t in old if not t.strip().startswith(tuple("0123456789"))}
    assert kinds["RDMA READ REQUEST PSN N len N"] == 3  # rping -C 3: one READ per ping
