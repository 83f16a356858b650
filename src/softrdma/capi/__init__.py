"""softrdma.capi: unmodified C programs on softrdma (docs/design.md, "C programs").

``softrdma run -- PROGRAM`` preloads a library (built on first use by :mod:`.build`,
cffi embedding mode) whose ``ibv_*`` exports are served by this Python stack:

* ``shim.c``: the C half (libibverbs structs, context ops, completion rings);
* :mod:`.cdefs`: the declarations both halves share;
* :mod:`.bridge`: the Python half (over :mod:`softrdma.verbs`; its handle table is :mod:`.handles`);
* :mod:`.launch`: the ``run`` subcommand and the environment for other launchers.
"""
