"""``pyverbs.providers.mlx5``: mlx5 direct verbs (not offered by softrdma devices)."""
