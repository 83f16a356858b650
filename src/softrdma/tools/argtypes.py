"""argparse types shared by the command-line tools (``softrdma`` and its subcommands)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["nonneg_int", "udp_port", "c_int", "int_in", "path_mtu", "positive_seconds",
           "PATH_MTUS"]

#: the IB path MTUs in bytes (IBA 9.7.5.1.2 ``PMTU``; ``enum ibv_mtu``)
PATH_MTUS = (256, 512, 1024, 2048, 4096)


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


def c_int(text: str) -> int:
    """``strtol(optarg, NULL, 0)`` as the C tools parse numbers: decimal, ``0x`` hex or
    ``0`` octal, with a sign."""
    body = text.strip()
    sign = -1 if body.startswith("-") else 1
    body = body.lstrip("+-")
    try:
        if body[:2].lower() == "0x":
            return sign * int(body[2:], 16)
        if len(body) > 1 and body.startswith("0"):
            return sign * int(body[1:], 8)
        return sign * int(body, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer: {text!r}") from None


def int_in(lo: int, hi: int | None, name: str) -> Callable[[str], int]:
    """argparse type: a C-style integer (:func:`c_int`) in ``lo..hi`` (``hi`` None: no
    upper bound); the error names ``name``."""
    def parse(text: str) -> int:
        value = c_int(text)
        if value < lo or (hi is not None and value > hi):
            bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"{name} must be {bound}, not {value}")
        return value
    return parse


def path_mtu(text: str) -> int:
    """argparse type: a path MTU in bytes, one of :data:`PATH_MTUS`."""
    try:
        value = c_int(text)
    except argparse.ArgumentTypeError:
        value = -1
    if value not in PATH_MTUS:
        raise argparse.ArgumentTypeError(
            f"MTU must be 256, 512, 1024, 2048 or 4096, not {text}")
    return value


def positive_seconds(name: str) -> Callable[[str], float]:
    """argparse type: a number of seconds > 0; the error names ``name``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {name}: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{name} must be > 0 seconds")
        return value
    return parse
