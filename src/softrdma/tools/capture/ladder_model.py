"""The picture of a capture that ``softrdma ladder`` draws: lanes, rows and PSN points
(filled by :mod:`softrdma.tools.capture.ladder_events` and :mod:`softrdma.tools.capture.ladder_iwarp`,
drawn by :mod:`softrdma.tools.capture.ladder_draw`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["KINDS", "Lane", "End", "Row", "PsnPoint", "Ladder", "RowSink"]

# Row kinds, in the order the legend lists them.
KINDS = ("cm", "data", "read", "ack", "nak", "retrans", "term", "gap")

Lane = tuple[str, str]  # (address, "QP 0x11" or "port 4791")


@dataclass
class Row:
    """One arrow (``src`` -> ``dst``) or, for a gap, a mark on ``src``'s lane."""

    frame: int
    t: float  # seconds since the first frame of the capture
    src: Lane
    dst: Lane
    label: str
    kind: str  # one of KINDS
    count: int = 1  # packets collapsed into this arrow
    _run: tuple[object, int, int, int] | None = None  # (flow, opcode, first, last PSN) of a run


@dataclass
class PsnPoint:
    """One point of the PSN plot: a request (``kind`` data/read/retrans) or a NAK."""

    t: float
    psn: int
    kind: str


@dataclass
class Ladder:
    """What :func:`capture_events` found: lanes in order of appearance, rows, PSN series
    (per connection direction, ``"A QP 0x11 -> B QP 0x12"``) and notes."""

    lanes: list[Lane] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    psns: dict[str, list[PsnPoint]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    frames: int = 0


End = tuple[str, ...]  # an end of a row, resolved when the capture is read (ladder_events)


class RowSink(Protocol):
    """Where the protocol walkers put rows (:class:`softrdma.tools.capture.ladder_events._Builder`)."""

    @property
    def notes(self) -> list[str]: ...

    def add(self, row: Row, src: End, dst: End) -> None: ...

    def last(self) -> Row | None: ...
