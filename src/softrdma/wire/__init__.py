"""softrdma.wire."""
