"""The argument checks every verbs entry point shares: one rule per kind of field.

Each raises :class:`~softrdma.errors.InvalidArgument` naming the argument (EINVAL, as
libibverbs' callers see the kernel's answer), never ``TypeError``/``AttributeError``:

* :func:`uint`: an ``int`` in ``lo..hi``; :func:`u32`/:func:`u64` for the
  ``__u32``/``__u64`` fields of the verbs structs (``wr_id``, keys, addresses, immediate
  data);
* :func:`seconds`/:func:`timeout`: a duration in seconds (a non-negative real number;
  ``timeout`` also takes ``None``, wait forever);
* :func:`data_bytes`: bytes-like data (``bytes``, ``bytearray``, ``memoryview`` or any
  contiguous buffer; ``str`` as UTF-8), never ``None``.
"""

from __future__ import annotations

from ..errors import InvalidArgument

__all__ = ["U8", "U16", "U24", "U32", "U64", "uint", "u32", "u64", "seconds", "timeout",
           "data_bytes"]

U8 = 0xFF
U16 = 0xFFFF
U24 = 0xFFFFFF
U32 = 0xFFFFFFFF
U64 = 0xFFFFFFFFFFFFFFFF


def uint(value: object, hi: int, argument: str, lo: int = 0) -> int:
    """``value`` if it is an int in ``lo..hi``; else InvalidArgument naming ``argument``."""
    if type(value) is not int:
        if not isinstance(value, int):
            raise InvalidArgument(argument, f"must be an int in {lo}..{hi}, got {value!r}")
        value = int(value)  # an IntEnum/IntFlag (or bool, as pyverbs takes it): its value
    if not lo <= value <= hi:
        raise InvalidArgument(argument, f"must be {lo}..{hi}, got {value!r}")
    return value


def u32(value: object, argument: str) -> int:
    """A ``__u32`` field (0..2^32-1)."""
    return uint(value, U32, argument)


def u64(value: object, argument: str) -> int:
    """A ``__u64`` field (0..2^64-1), such as ``wr_id``."""
    return uint(value, U64, argument)


def seconds(value: object, argument: str) -> float:
    """A duration in seconds: an int or float, >= 0 (not NaN)."""
    if type(value) is float or type(value) is int:
        if value >= 0:  # NaN compares False
            return value
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    raise InvalidArgument(argument, f"must be a number of seconds >= 0, got {value!r}")


def timeout(value: object, argument: str = "timeout") -> float | None:
    """A timeout in seconds, or None (no timeout)."""
    return None if value is None else seconds(value, argument)


def data_bytes(data: object, argument: str) -> memoryview:
    """``data`` as a flat byte view (``str``: its UTF-8 encoding)."""
    if isinstance(data, str):
        data = data.encode()
    try:
        mv = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgument(argument, f"expected bytes-like data, got "
                              f"{type(data).__name__}") from None
    if not mv.c_contiguous:
        raise InvalidArgument(argument, "must be C-contiguous")
    return mv if mv.ndim == 1 and mv.format == "B" else mv.cast("B")
