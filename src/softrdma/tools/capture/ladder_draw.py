"""Drawing a :class:`~softrdma.tools.capture.ladder_events.Ladder`: the ladder diagram (SVG, PNG,
PDF: whatever matplotlib writes for the file's extension), the PSN-against-time plot, and
the same ladder as text.

matplotlib is imported only here, inside the functions, so the rest of softrdma works
without it; a missing matplotlib raises :class:`~softrdma.errors.SoftRdmaError` naming the
package. Text stays text in an SVG (``svg.fonttype: none``), so a browser or a test can
read the labels, and the SVG carries no date, so the same capture gives the same file.
"""

from __future__ import annotations

import os
from typing import Any, TextIO

from ...errors import SoftRdmaError
from .ladder_model import KINDS, Ladder

__all__ = ["MissingMatplotlib", "pyplot", "draw_ladder", "draw_psn_plot", "print_ladder",
           "save"]

COLORS = {"cm": "#1f5fbf", "data": "#222222", "read": "#7b3fa0", "ack": "#2e8b2e",
          "nak": "#d62728", "retrans": "#e07b00", "term": "#b00000", "gap": "#888888"}
LEGEND = {"cm": "CM / MPA", "data": "data", "read": "RDMA READ", "ack": "ACK", "nak": "NAK",
          "retrans": "retransmission", "term": "Terminate", "gap": "capture gap"}
ROW_H = 0.32  # inches per row
LANE_W = 2.6  # inches per lane


class MissingMatplotlib(SoftRdmaError):
    """matplotlib is not installed."""


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (or a clear error)."""
    try:
        import matplotlib
    except ImportError:
        raise MissingMatplotlib("drawing needs the Python package 'matplotlib' "
                                "(pip install 'softrdma[pictures]' or pip install "
                                "matplotlib)") from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # labels stay <text> in an SVG
    matplotlib.rcParams["svg.hashsalt"] = "softrdma"  # stable element ids
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str | os.PathLike[str]) -> None:
    """Write ``fig`` to ``path`` (format from the extension) without a date, then close it."""
    ext = os.path.splitext(os.fspath(path))[1].lower()
    meta: dict[str, Any] | None = {"Date": None} if ext in (".svg", ".pdf") else None
    try:
        fig.savefig(path, metadata=meta, bbox_inches="tight")
    except ValueError as e:  # an extension matplotlib does not know
        raise SoftRdmaError(f"cannot write {path}: {e}") from None
    finally:
        fig.canvas.figure.clf()
        import matplotlib.pyplot as plt

        plt.close(fig)


def _lane_text(lane: tuple[str, str]) -> str:
    return f"{lane[0]}\n{lane[1]}" if lane[1] else lane[0]


def draw_ladder(lad: Ladder, path: str | os.PathLike[str], title: str = "") -> None:
    """The ladder diagram of ``lad`` into ``path``: one vertical lane per endpoint, one
    arrow per row (capture order, top to bottom), frame number and time on the left."""
    plt = pyplot()
    n = max(1, len(lad.rows))
    lanes = lad.lanes or [("", "")]
    xs = {lane: i for i, lane in enumerate(lanes)}
    width = 2.2 + LANE_W * max(2, len(lanes))
    height = 1.6 + ROW_H * n
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(-1.0, max(1, len(lanes) - 1) + 0.6)
    ax.set_ylim(n + 0.6, -2.6)
    ax.axis("off")
    if title:
        ax.text(-0.95, -2.35, title, fontsize=11, fontweight="bold", va="center", ha="left")
    for lane, x in xs.items():
        ax.plot([x, x], [-0.5, n], color="#999999", linewidth=1.0, zorder=1)
        ax.text(x, -1.0, _lane_text(lane), ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round", "facecolor": "#eef2fa", "edgecolor": "#1f5fbf"},
                gid=f"lane-{x}")
    for i, row in enumerate(lad.rows):
        y = i + 0.3
        color = COLORS[row.kind]
        a, b = xs[row.src], xs[row.dst]
        ax.text(-0.95, y, f"{row.frame:>5}  {row.t * 1e3:10.3f} ms", fontsize=7, va="center",
                ha="left", family="monospace", color="#555555")
        style = "--" if row.kind in ("gap", "retrans") else "-"
        if a == b:  # both ends on one lane: a short loop
            ax.annotate("", xy=(a + 0.02, y + 0.15), xytext=(a + 0.02, y - 0.15),
                        arrowprops={"arrowstyle": "->", "color": color,
                                    "connectionstyle": "arc3,rad=-0.9", "linestyle": style})
            ax.text(a + 0.12, y, row.label, fontsize=7, va="center", ha="left", color=color)
            continue
        ax.annotate("", xy=(b, y), xytext=(a, y),
                    arrowprops={"arrowstyle": "-|>", "color": color, "linestyle": style,
                                "linewidth": 1.6 if row.count > 1 else 1.0,
                                "shrinkA": 0, "shrinkB": 0})
        ax.text((a + b) / 2, y - 0.08, row.label, fontsize=7, ha="center", va="bottom",
                color=color, fontweight="bold" if row.kind in ("nak", "term", "gap") else None)
    used = [k for k in KINDS if any(r.kind == k for r in lad.rows)]
    step = (max(1, len(lanes) - 1) + 1.55) / max(1, len(used))
    for j, k in enumerate(used):
        ax.text(-0.95 + j * step, -1.85, "\u25a0 " + LEGEND[k], color=COLORS[k], fontsize=7,
                va="center", ha="left")
    for j, note in enumerate(lad.notes[:3]):
        ax.text(-0.95, n + 0.2 + 0.3 * j, note, fontsize=7, color="#555555", va="center")
    save(fig, path)


def draw_psn_plot(lad: Ladder, path: str | os.PathLike[str], title: str = "") -> None:
    """PSN against time, one panel per connection direction: requests as dots,
    retransmissions as orange crosses, NAKs as red triangles at the NAK's PSN
    (unwrapped from the direction's first PSN, IBA 9.7.2)."""
    plt = pyplot()
    series = [(name, pts) for name, pts in lad.psns.items() if pts]
    if not series:
        raise SoftRdmaError("no RoCE request in the capture: nothing to plot (an iWARP "
                            "capture has no PSNs)")
    fig, axes = plt.subplots(len(series), 1, figsize=(9, 2.8 * len(series) + 0.6),
                             squeeze=False)
    for ax, (name, pts) in zip(axes[:, 0], series, strict=True):
        base = pts[0].psn
        groups: dict[str, tuple[list[float], list[int]]] = {}
        for pt in pts:
            xs, ys = groups.setdefault(pt.kind, ([], []))
            xs.append(pt.t)
            ys.append(((pt.psn - base + (1 << 23)) % (1 << 24)) - (1 << 23))
        style = {"data": ("o", COLORS["data"], "request"),
                 "read": ("o", COLORS["read"], "RDMA READ request"),
                 "retrans": ("x", COLORS["retrans"], "retransmission"),
                 "nak": ("v", COLORS["nak"], "NAK (at its PSN)")}
        for kind, (xs, ys) in groups.items():
            marker, color, label = style[kind]
            ax.plot(xs, ys, linestyle="none", marker=marker, color=color, markersize=4,
                    label=label)
            if kind == "nak":
                for x in xs:
                    ax.axvline(x, color=color, linewidth=0.6, linestyle=":")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("time since the first frame (s)", fontsize=8)
        ax.set_ylabel(f"PSN - {base:#x}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    save(fig, path)


def print_ladder(lad: Ladder, out: TextIO) -> None:
    """The ladder as text: one line per row (frame, time, source -> destination, label)."""
    for row in lad.rows:
        print(f"{row.frame:>6} {row.t:11.6f}  {row.src[0]} {row.src[1]} -> "
              f"{row.dst[0]} {row.dst[1]}  [{row.kind}] {row.label}", file=out)
    for note in lad.notes:
        print(f"note: {note}", file=out)
