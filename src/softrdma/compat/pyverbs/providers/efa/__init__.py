"""``pyverbs.providers.efa``: efa direct verbs (not offered by softrdma devices)."""
