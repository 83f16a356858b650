"""softrdma.verbs."""
