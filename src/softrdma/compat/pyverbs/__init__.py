"""pyverbs on softrdma: rdma-core's Python verbs API backed by softrdma devices.

This package mirrors the module layout of rdma-core's ``pyverbs`` (``device``, ``pd``,
``mr``, ``cq``, ``qp``, ``wr``, ``addr``, ``srq``, ``xrcd``, ``enums``, ``cmid`` ...). It
lives in :data:`softrdma.compat.SHIM_DIR` and is imported as ``pyverbs`` only when that
directory is on ``sys.path`` (``softrdma pyverbs -- python3 program.py``).

Behaviour follows libibverbs on a software RoCE device (rxe): the same errno values for
the same invalid calls, the same port/GID query shapes (Ethernet link layer, RoCE v2
GIDs, port ACTIVE). Vendor providers (``pyverbs.providers.mlx5``/``efa``) load, and every
device-specific call fails with EOPNOTSUPP since softrdma devices are not mlx5/EFA.
"""

__version__ = "44.0-softrdma"
