"""The command-line flags of ``softrdma stats`` and ``softrdma res``: the object words of
iproute2's ``rdma statistic`` / ``rdma resource`` and the ``-d``/``-j``/``-p`` options
both tools share (``stats`` adds ``-w``/``-n``).

Kept apart from the tools so that building the ``softrdma`` parser imports no verbs.
"""

from __future__ import annotations

import argparse

__all__ = ["add_arguments"]

# the object words of each tool: (metavar, help)
_WORDS = {
    "stats": ("show [link DEV[/PORT]]",
              "rdma statistic's object syntax: 'show', 'show link DEV/PORT'"),
    "res": ("show [qp|cq|mr|pd] | statistic [qp]", "rdma resource's object syntax"),
}


def add_arguments(p: argparse.ArgumentParser, tool: str) -> None:
    """The flags of ``tool`` (``stats`` or ``res``)."""
    words, words_help = _WORDS[tool]
    p.add_argument("words", nargs="*", metavar=words, help=words_help)
    p.add_argument("-d", "--dev", metavar="DEV", default=None, help="only device DEV")
    p.add_argument("-j", "--json", action="store_true", help="JSON output")
    p.add_argument("-p", "--pretty", action="store_true", help="pretty JSON")
    if tool == "stats":
        p.add_argument("-w", "--watch", type=float, default=None, metavar="SECONDS",
                       help="print the counters again every SECONDS")
        p.add_argument("-n", "--count", type=int, default=None, metavar="COUNT",
                       help="with -w: stop after COUNT rounds")
