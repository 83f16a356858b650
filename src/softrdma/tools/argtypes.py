"""argparse types shared by the command-line tools (``softrdma`` and its subcommands)."""

from __future__ import annotations

import argparse

__all__ = ["nonneg_int", "udp_port"]


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def udp_port(text: str) -> int:
    """argparse type: a UDP port number, 1..65535."""
    n = nonneg_int(text)
    if not 1 <= n <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"not a UDP port (1..65535): {n}")
    return n
