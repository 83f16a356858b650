"""softrdma.tools."""
