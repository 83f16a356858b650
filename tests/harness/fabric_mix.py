"""The RoCE version of a fabric property example.

(Moved from tests/drivers/test_fabric_property.py, which other test files imported.)"""

from __future__ import annotations


def roce_ver_of(seed: int) -> str:
    """Annex A16 CA16-15: examples with an odd seed run over RoCEv1 fabric links (GRH,
    RoCEv1 ICRC), the others over RoCEv2, with the same draws and budget."""
    return "1" if seed & 1 else "2"
