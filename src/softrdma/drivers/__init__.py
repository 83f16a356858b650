"""softrdma.drivers."""
