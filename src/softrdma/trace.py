"""Tracing through Python's :mod:`logging`: ``SOFTRDMA_TRACE=qp,cm,pkt`` (or ``--trace``
on any ``softrdma`` tool).

Three loggers, each a kind of line a person can follow:

* ``softrdma.qp``: QP state transitions (``QP 0x000011 RC: RESET -> INIT``, IBA 10.3.1);
* ``softrdma.cm``: IB CM state transitions of a connection (IBA 12.9.6, by local
  communication ID) and the rdma_cm events queued to the application;
* ``softrdma.pkt``: one line per RoCE packet a device sends or receives: direction,
  addresses with the source and destination QP (``127.0.0.1:4791 (QP 0x000011) ->
  127.0.0.1:4791 (QP 0x000012)``, so that loopback lines tell who talks), opcode,
  destination QPN, PSN, length, the AETH syndrome of an ACK/NAK
  (:func:`softrdma.wire.ib.describe`; IBA 9.2-9.3).

:func:`configure` enables the named loggers at DEBUG and, when the application has not
configured logging itself, sends them to stderr as ``softrdma pkt: ...``. An application
may instead attach its own handlers to these loggers and set their levels; nothing is
printed unless one of the two is done. Only what is enabled costs anything: the packet
tap exists only while ``softrdma.pkt`` is enabled or a capture is asked for
(:mod:`softrdma.drivers.capture.tap`).
"""

from __future__ import annotations

import logging
import os
import sys

from .errors import InvalidArgument

__all__ = ["configure", "configure_from_env", "KINDS", "ENV", "PCAP_ENV", "logger",
           "capture_path", "default_capture"]

ENV = "SOFTRDMA_TRACE"
PCAP_ENV = "SOFTRDMA_PCAP"  # every device of the process captures there (one file per process)
#: ``--pcap FILE`` of the ``softrdma`` command: like $SOFTRDMA_PCAP, for this process only
#: (a tool's child processes must not truncate the same file)
capture_path: str | None = None
KINDS = ("qp", "cm", "pkt")
_HANDLER_NAME = "softrdma-trace"


def logger(kind: str) -> logging.Logger:
    """The logger of one trace kind (``softrdma.qp``, ``softrdma.cm``, ``softrdma.pkt``)."""
    return logging.getLogger(f"softrdma.{kind}")


def parse(spec: str) -> tuple[str, ...]:
    """``"qp,cm,pkt"`` / ``"all"`` -> the kinds; :class:`InvalidArgument` for others."""
    words = [w.strip().lower() for w in spec.replace(" ", ",").split(",") if w.strip()]
    if words in (["all"], ["1"], ["yes"]):
        return KINDS
    bad = [w for w in words if w not in KINDS]
    if bad:
        raise InvalidArgument("trace", f"unknown trace kind {bad[0]!r} (known: "
                                        f"{', '.join(KINDS)}, all)")
    return tuple(dict.fromkeys(words))


def configure(spec: str, stream: object = None) -> tuple[str, ...]:
    """Enable the trace kinds of ``spec``; returns them. A stderr handler is installed
    on ``softrdma`` once, unless the root logger already has handlers."""
    kinds = parse(spec)
    for kind in kinds:
        logger(kind).setLevel(logging.DEBUG)
    top = logging.getLogger("softrdma")
    if kinds and not logging.getLogger().handlers and not any(
            h.get_name() == _HANDLER_NAME for h in top.handlers):
        h = logging.StreamHandler(stream if stream is not None else sys.stderr)  # type: ignore[arg-type]
        h.set_name(_HANDLER_NAME)
        h.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        top.addHandler(h)
    return kinds


def configure_from_env() -> tuple[str, ...]:
    """:func:`configure` from ``$SOFTRDMA_TRACE`` (nothing when unset; a bad value is
    reported once on stderr and ignored, so a typo never stops a program)."""
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return ()
    try:
        return configure(spec)
    except InvalidArgument as exc:
        print(f"softrdma: ignoring {ENV}={spec!r}: {exc}", file=sys.stderr)
        return ()


def default_capture() -> str | None:
    """Where devices opened without ``pcap=`` capture: ``--pcap``, else
    ``$SOFTRDMA_PCAP``, else nowhere."""
    return capture_path or os.environ.get(PCAP_ENV) or None
