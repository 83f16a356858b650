"""Results of the interop suite: one :class:`Result` per case and direction, the table
and the JSON form.

Result values: ``pass``; ``fail`` (with the reasons: exit statuses, error lines,
findings of :mod:`softrdma.interop.checks`, ``pcap-check``'s first inconsistency);
``skipped: REASON`` (for instance ``skipped: softrdma lacks write-bw``: never counted as
a pass). The table's figures column shows, for perftest cases, BW average [MB/sec] or
t_typical [usec] of each side (``softrdma`` / ``linux``), for pingpong cases usec/iter.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .parse import Figures

__all__ = ["Result", "render_table", "to_json", "summary", "exit_status", "figures_text"]

PASS = "pass"
FAIL = "fail"


@dataclass
class Result:
    """One case in one direction."""

    case: str
    direction: str
    result: str = PASS
    reasons: list[str] = field(default_factory=list)
    softrdma: Figures = field(default_factory=dict)
    linux: Figures = field(default_factory=dict)
    pcap: str = ""
    pcap_check: str = ""
    seconds: float = 0.0
    commands: dict[str, str] = field(default_factory=dict)
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    #: what the runner did besides the plain exchange, pass or fail (a client started again)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.result == PASS

    @property
    def skipped(self) -> bool:
        return self.result.startswith("skipped")

    def fail(self, reason: str) -> None:
        self.result = FAIL
        self.reasons.append(reason)


def _fig(f: Figures) -> str:
    if "bw_avg" in f:
        unit = "MB/s" if f.get("unit", 1.0) else "Gb/s"
        return f"{f['bw_avg']:.2f} {unit}"
    if "t_typical" in f:
        return f"{f['t_typical']:.1f} us"
    if "usec_iter" in f:
        return f"{f['usec_iter']:.0f} us/iter"
    return "-"


def figures_text(r: Result) -> str:
    """``softrdma X / linux Y`` (empty when neither side has figures)."""
    if not r.softrdma and not r.linux:
        return ""
    return f"softrdma {_fig(r.softrdma)} / linux {_fig(r.linux)}"


def render_table(results: list[Result]) -> str:
    """The table: case, direction, result, figures; each row is followed by its notes,
    failing rows also by their reasons, capture and pcap-check line."""
    rows = [("case", "direction", "result", "figures (softrdma / linux)")]
    notes: dict[int, list[str]] = {}
    for r in results:
        rows.append((r.case, r.direction, r.result, figures_text(r)))
        lines = list(r.notes)
        if r.result == FAIL:
            lines += r.reasons
            if r.pcap:
                lines.append(f"capture: {r.pcap}")
            if r.pcap_check:
                lines.append(f"pcap-check: {r.pcap_check}")
        if lines:
            notes[len(rows) - 1] = lines
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    out: list[str] = []
    for i, row in enumerate(rows):
        cells = [row[j].ljust(widths[j]) for j in range(3)] + [row[3]]
        out.append("  ".join(cells).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths) + "  " + "-" * len(row[3]))
        for note in notes.get(i, []):
            out.append(f"    {note}")
    out.append(summary(results))
    return "\n".join(out)


def summary(results: list[Result]) -> str:
    n_pass = sum(r.passed for r in results)
    n_skip = sum(r.skipped for r in results)
    n_fail = len(results) - n_pass - n_skip
    return f"{len(results)} runs: {n_pass} passed, {n_fail} failed, {n_skip} skipped"


def exit_status(results: list[Result]) -> int:
    """0 when every run passed or was skipped, else 1 (no runs at all: 1)."""
    if not results:
        return 1
    return 0 if all(r.passed or r.skipped for r in results) else 1


def to_json(results: list[Result]) -> str:
    return json.dumps({"results": [asdict(r) for r in results],
                       "summary": summary(results)}, indent=1, sort_keys=True)
