"""QP states and types by name, shared by both transports and the verbs layer
(IBA 10.3.1 QP states; IBA 10.2.1 transport service types; ``ibv_qp_state``,
``ibv_qp_type``). Plain ints: the engines compare them on every packet."""

from __future__ import annotations

from ..enums import ibv_qp_state as _QPS
from ..enums import ibv_qp_type as _QPT

__all__ = ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "QPT_RC", "QPT_UC", "QPT_UD",
           "state_name"]

RESET = int(_QPS.IBV_QPS_RESET)
INIT = int(_QPS.IBV_QPS_INIT)
RTR = int(_QPS.IBV_QPS_RTR)
RTS = int(_QPS.IBV_QPS_RTS)
SQD = int(_QPS.IBV_QPS_SQD)
SQE = int(_QPS.IBV_QPS_SQE)
ERR = int(_QPS.IBV_QPS_ERR)

QPT_RC = int(_QPT.IBV_QPT_RC)
QPT_UC = int(_QPT.IBV_QPT_UC)
QPT_UD = int(_QPT.IBV_QPT_UD)


def state_name(state: int) -> str:
    """``IBV_QPS_RTS`` for 3; the number itself when it names no state."""
    try:
        return _QPS(state).name or str(state)
    except ValueError:
        return str(state)
