#!/usr/bin/env python3
"""Coverage-guided fuzzing of softrdma's receive paths and decoders with atheris (libFuzzer).

    pip install atheris
    python3 tools/dev/fuzz.py TARGET [CORPUS_DIR] [libFuzzer flags]
    python3 tools/dev/fuzz.py iwarp /tmp/corpus-iwarp -max_total_time=600 -max_len=300

TARGET is one of ``tests/harness/fuzz_targets.py``'s (``TARGETS``): ib, roce, ibcm, devd,
ipoib, iwarp, mpa, pcap, wire.
Any exception a target lets out is a defect: libFuzzer stops, prints the traceback and
writes the input to ``crash-<sha1>`` (run the same command with that file instead of the
corpus to replay it; a target whose engine draws random numbers, as iWARP's STags, may
need ``-runs=300`` to meet the same state again). Only ``softrdma`` is instrumented.
Run from a checkout's root; the targets use the tests' harnesses.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        import atheris
    except ImportError:
        print("fuzz.py: atheris is not installed: pip install atheris", file=sys.stderr)
        return 2
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
    with atheris.instrument_imports(include=["softrdma"]):
        from harness.fuzz_targets import TARGETS
        name = sys.argv[1]
        target = TARGETS.get(name)
        if target is None:
            print(f"fuzz.py: no target {name!r} (one of {', '.join(TARGETS)})",
                  file=sys.stderr)
            return 2
        target(b"")  # the modules it imports when it first runs are instrumented too
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
