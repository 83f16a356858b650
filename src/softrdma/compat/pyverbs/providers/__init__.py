"""``pyverbs.providers``: vendor direct-verbs providers (none apply to softrdma devices)."""
