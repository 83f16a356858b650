"""softrdma.cm."""
