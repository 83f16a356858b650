"""libibverbs enumerations with the values of rdma-core's <infiniband/verbs.h>.

Generated from the header (rdma-core 44); tests/compat/test_pyverbs_enums.py re-checks every
value against the installed header when libibverbs-dev is present. One module per family,
every name importable from here as before: each enum (``ibv_qp_type``) and each of its
members as a module-level name (``IBV_QPT_RC``), as in verbs.h.

* :mod:`._device`: devices and ports, async events;
* :mod:`._qp`: queue pairs, work requests, SRQs, XRC domains;
* :mod:`._cq`: completions and CQs;
* :mod:`._mr`: memory registration and windows.
"""

from enum import Enum as _Enum

from ._cq import *  # noqa: F403
from ._device import *  # noqa: F403
from ._mr import *  # noqa: F403
from ._qp import *  # noqa: F403

# The enums are softrdma.enums's, as when they were one module: their repr, pickles and the
# one-source-per-value check of compat (tests/compat/test_pyverbs_enums.py) name this module.
for _v in list(globals().values()):
    if isinstance(_v, type) and issubclass(_v, _Enum) and _v.__module__.startswith(__name__ + "."):
        _v.__module__ = __name__
del _v
