"""The libibverbs examples and tools (ibv_*_pingpong, ibv_devinfo ...)."""
