"""softrdma.compat: compatibility layers that let existing RDMA programs run on softrdma.

``softrdma/compat/pyverbs`` is a package named ``pyverbs`` that implements the modules
and classes rdma-core's Python bindings offer (``pyverbs.device``, ``pyverbs.qp`` ...)
on top of :mod:`softrdma.verbs`. It is found only when :data:`SHIM_DIR` is put first on
``sys.path`` (``softrdma pyverbs -- python3 program.py`` does that), so a real pyverbs
installed on the same machine is never shadowed by accident.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SHIM_DIR", "DEVICE_ENV"]

#: The directory that holds the ``pyverbs`` package (put it first on ``PYTHONPATH``).
SHIM_DIR: Path = Path(__file__).resolve().parent

#: Environment variable naming the softrdma device pyverbs programs see first.
DEVICE_ENV = "SOFTRDMA_PYVERBS_DEVICE"
