"""The pyverbs compatibility layer's enumerations against the installed C headers.

Every name of ``pyverbs.enums`` (and the mlx5/EFA provider enums) that the rdma-core
headers define (``enum`` members and ``#define``\\ s, across ``<infiniband/*.h>``) must
have the header's value; almost all of them must be found there.
"""

from __future__ import annotations

import ast
import enum
import re
from pathlib import Path

import pytest

from softrdma import enums as softrdma_enums
from softrdma.compat.pyverbs import cm_enums, libibverbs_enums
from softrdma.compat.pyverbs import enums as pyverbs_enums
from softrdma.compat.pyverbs.providers.efa import efa_enums
from softrdma.compat.pyverbs.providers.mlx5 import mlx5_enums

INCLUDE = Path("/usr/include/infiniband")
U64 = (1 << 64) - 1
# pyverbs names with no C counterpart: the sysfs GID-type strings' indices, a driver.h
# flag, and a pointer constant ((void *)-1, IBV_ALLOCATOR_USE_DEFAULT).
NOT_IN_HEADERS = {"IBV_GID_TYPE_SYSFS_IB_ROCE_V1", "IBV_GID_TYPE_SYSFS_ROCE_V2",
                  "IBV_QPF_GRH_REQUIRED", "_IBV_ALLOCATOR_USE_DEFAULT"}

_ENUM = re.compile(r"\benum\b\s*\w*\s*(?::\s*[\w\s]+)?\{(.*?)\}\s*\w*\s*;", re.S)
_DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)\s+(.+?)\s*$", re.M)
_SUFFIX = re.compile(r"(?<=[0-9a-fA-F])(?:ULL|UL|LL|U|L)\b")


def _eval(expr: str, names: dict[str, int]) -> int:
    tree = ast.parse(_SUFFIX.sub("", " ".join(expr.split())), mode="eval")

    def ev(n: ast.AST) -> int:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name):
            return names[n.id]
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.Invert, ast.USub)):
            v = ev(n.operand)
            return ~v if isinstance(n.op, ast.Invert) else -v
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            ops = {ast.LShift: a << b if b < 128 else 0, ast.RShift: a >> b, ast.BitOr: a | b,
                   ast.BitAnd: a & b, ast.Add: a + b, ast.Sub: a - b}
            if type(n.op) in ops:
                return ops[type(n.op)]
        raise ValueError(expr)

    return ev(tree)


def header_constants(paths: list[Path]) -> dict[str, int]:
    """Enumerators and integer #defines of C headers (values resolved across files)."""
    pending: list[tuple[str, str | None, list[str]]] = []  # (name, expr, previous names)
    for p in paths:
        text = re.sub(r"/\*.*?\*/", "", p.read_text(errors="replace"), flags=re.S)
        text = re.sub(r"//[^\n]*", "", text)
        for m in _ENUM.finditer(text):
            prev: list[str] = []
            for item in m.group(1).split(","):
                item = item.strip()
                if not item:
                    continue
                name, _, expr = item.partition("=")
                name = name.strip()
                if re.fullmatch(r"\w+", name):
                    pending.append((name, expr.strip() or None, list(prev[-1:])))
                    prev.append(name)
        for m in _DEFINE.finditer(text):
            if "(" in m.group(1):
                continue
            pending.append((m.group(1), m.group(2), []))
    names: dict[str, int] = {}
    for _ in range(6):  # resolve forward references in a few passes
        for name, expr, prev in pending:
            if name in names:
                continue
            try:
                if expr is None:
                    names[name] = names[prev[0]] + 1 if prev else 0
                else:
                    names[name] = _eval(expr, names)
            except (KeyError, ValueError, SyntaxError, TypeError):
                continue
    return names


@pytest.fixture(scope="module")
def headers() -> dict[str, int]:
    paths = sorted(INCLUDE.glob("*.h"))
    if not (INCLUDE / "verbs.h").is_file():
        pytest.skip("libibverbs-dev (infiniband/verbs.h) is not installed")
    return header_constants(paths)


def _public_ints(mod: object) -> dict[str, int]:
    out = {}
    for n in dir(mod):
        if n.startswith("__"):
            continue
        v = getattr(mod, n)
        if isinstance(v, int) and n[:1] in "_IREMim" and n.lstrip("_")[:1].isupper():
            out[n] = int(v)
    return out


def _check(mod: object, headers: dict[str, int], min_found: float) -> None:
    values = _public_ints(mod)
    assert values, "no constants"
    found = 0
    wrong = []
    for name, value in values.items():
        key = name.lstrip("_") if name.startswith("_") else name
        if name in NOT_IN_HEADERS:
            continue
        if key in headers:
            found += 1
            if headers[key] & U64 != value & U64:
                wrong.append((name, value, headers[key]))
    assert not wrong, wrong
    assert found >= min_found * (len(values) - len(NOT_IN_HEADERS & values.keys()))


def test_libibverbs_enums_match_verbs_h(headers: dict[str, int]) -> None:
    _check(libibverbs_enums, headers, 0.99)


def test_softrdma_enums_match_verbs_h(headers: dict[str, int]) -> None:
    """softrdma.enums (generated from the header) keeps every value of verbs.h."""
    _check(softrdma_enums, headers, 1.0)


def test_well_known_values(headers: dict[str, int]) -> None:
    e = libibverbs_enums
    assert (e.IBV_QPT_RC, e.IBV_QPT_UC, e.IBV_QPT_UD) == (2, 3, 4)
    assert e.IBV_WR_ATOMIC_WRITE == headers["IBV_WR_ATOMIC_WRITE"] == 15
    assert e.IBV_ACCESS_ON_DEMAND == 64 and e.IBV_ACCESS_RELAXED_ORDERING == 1 << 20
    assert e.IBV_WC_STANDARD_FLAGS == headers["IBV_WC_STANDARD_FLAGS"] == 0x7F
    assert e._IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE == headers["IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE"]
    assert e.IBV_LINK_LAYER_ETHERNET == 2 and vars(e)["IBV_GID_TYPE_SYSFS_ROCE_V2"] == 1
    assert e._IBV_ALLOCATOR_USE_DEFAULT == U64  # (void *)-1


def test_enum_classes_are_int_enums_with_members_as_module_names() -> None:
    classes = [v for v in vars(libibverbs_enums).values()
               if isinstance(v, type) and issubclass(v, enum.Enum)
               and v not in (enum.IntEnum, enum.IntFlag)]
    assert len(classes) >= 50
    for cls in classes:
        assert issubclass(cls, (enum.IntEnum, enum.IntFlag))
        for member in cls:
            assert int(getattr(libibverbs_enums, str(member.name))) == int(member)
    # pyverbs.enums re-exports everything, underscore names included
    assert pyverbs_enums.ibv_qp_type is libibverbs_enums.ibv_qp_type
    assert pyverbs_enums._IBV_DEVICE_RAW_SCATTER_FCS == 1 << 34
    assert list(pyverbs_enums.ibv_access_flags)[0] == pyverbs_enums.IBV_ACCESS_LOCAL_WRITE


def test_enums_softrdma_has_are_its_own() -> None:
    """One source per value: an enum of softrdma.enums is re-exported, not defined again."""
    ours = {n: v for n, v in vars(softrdma_enums).items()
            if isinstance(v, type) and issubclass(v, enum.Enum)
            and v.__module__ == softrdma_enums.__name__}
    assert len(ours) >= 30
    for name, cls in ours.items():
        assert getattr(libibverbs_enums, name) is cls, name
        for member in cls:
            assert getattr(libibverbs_enums, member.name) is member
    assert libibverbs_enums.IBV_QPT_RC is softrdma_enums.ibv_qp_type.IBV_QPT_RC


def test_provider_enums_match_their_headers(headers: dict[str, int]) -> None:
    if "MLX5DV_CONTEXT_FLAGS_CQE_V1" not in headers:
        pytest.skip("mlx5dv.h is not installed")
    _check(mlx5_enums, headers, 0.8)
    _check(efa_enums, headers, 0.75)


def test_cm_enum_values() -> None:
    # <rdma/rdma_cma.h> (librdmacm-dev) is usually absent: check the ABI values.
    names = vars(cm_enums)  # each member is a module-level name too
    assert names["RDMA_PS_TCP"] == 0x0106 and names["RDMA_PS_UDP"] == 0x0111
    assert names["RDMA_CM_EVENT_ESTABLISHED"] == 9
    assert list(cm_enums.rdma_cm_event_type)[0].name == "RDMA_CM_EVENT_ADDR_RESOLVED"


def test_cm_enums_are_softrdma_cm_values_under_pyverbs_names() -> None:
    """One source: pyverbs.cm_enums's event types and port spaces are softrdma.cm's."""
    from softrdma.cm import rdma_cm as rc
    from softrdma.cm.rdma_events import RdmaCmEventType

    assert [(m.name, int(m)) for m in cm_enums.rdma_cm_event_type] == [
        (f"RDMA_CM_EVENT_{m.name}", int(m)) for m in RdmaCmEventType]
    ps = cm_enums.rdma_port_space
    assert (ps.RDMA_PS_TCP, ps.RDMA_PS_UDP, ps.RDMA_PS_IPOIB) == (
        rc.RDMA_PS_TCP, rc.RDMA_PS_UDP, rc.RDMA_PS_IPOIB)
