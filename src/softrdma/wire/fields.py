"""The range rule every wire encoder applies before packing: a field's value fits its
width (IBA 5.2 and RFC 5040/5041/5044 give each field a fixed number of bits).

One implementation, used by the header codecs of :mod:`.ddp`, :mod:`.mpa`,
:mod:`.ipcm`, :mod:`.rocev1` and :mod:`.mad`.
"""

from __future__ import annotations

from ..errors import InvalidArgument

__all__ = ["check_bits"]


def check_bits(name: str, value: int, bits: int) -> None:
    """Raise :class:`InvalidArgument` naming ``name`` unless ``0 <= value < 2**bits``."""
    if not 0 <= value < (1 << bits):
        raise InvalidArgument(name, f"{value} does not fit in {bits} bits")
