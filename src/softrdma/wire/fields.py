"""The range rule every wire encoder applies before packing: a field's value fits its
width (IBA 5.2 and RFC 5040/5041/5044 give each field a fixed number of bits).

One implementation, used by the header codecs of :mod:`.ddp`, :mod:`.mpa`,
:mod:`.ipcm`, :mod:`.rocev1` and :mod:`.mad`; and the plain network-order words
(:data:`U16`, :data:`U32`, :data:`U64`: every header family is big-endian, IBA 5.2,
RFC 791, RFC 5041 §4) that the codecs read and write.
"""

from __future__ import annotations

import struct

from ..errors import InvalidArgument

__all__ = ["check_bits", "U16", "U32", "U64"]

U16 = struct.Struct("!H")
U32 = struct.Struct("!I")
U64 = struct.Struct("!Q")


def check_bits(name: str, value: int, bits: int) -> None:
    """Raise :class:`InvalidArgument` naming ``name`` unless ``0 <= value < 2**bits``."""
    if not 0 <= value < (1 << bits):
        raise InvalidArgument(name, f"{value} does not fit in {bits} bits")
