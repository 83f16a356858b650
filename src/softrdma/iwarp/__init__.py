"""softrdma.iwarp."""
