"""softrdma.ib."""
