"""softrdma.ipoib."""
