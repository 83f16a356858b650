"""Build the C half of :mod:`softrdma.capi` on first use, into a cache.

The library is cffi's embedding mode: ``shim.c`` (the ibv_* exports, the context ops and
the completion ring) and ``rdmacm.c`` (the rdma_* exports) plus the ``extern "Python"`` entry points of :mod:`.bridge`, linked
against this Python's libpython. It is cached under ``$SOFTRDMA_CAPI_CACHE`` (default
``~/.cache/softrdma``) as ``capi-<hash>/libsoftrdma-capi.so``, the hash covering the C
source, the declarations, the Python version and cffi's, so an upgrade rebuilds it and
``pip install .`` never needs a compiler. Missing build tools are named by their Debian
packages.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from ..errors import SoftRdmaError
from . import cdefs

__all__ = ["BuildError", "library_path", "build", "MODULE", "LIB_NAME"]

MODULE = "_softrdma_capi"
LIB_NAME = "libsoftrdma-capi.so"
VERBS_H = Path("/usr/include/infiniband/verbs.h")
RDMA_CMA_H = Path("/usr/include/rdma/rdma_cma.h")
_HERE = Path(__file__).resolve().parent
# ``signal``'s first import in a new interpreter (a C program's) sets SIGINT to Python's
# KeyboardInterrupt handler; sr_keep_program_sigint puts back the program's (shim.c)
_INIT_CODE = f"""
import signal
from {MODULE} import ffi, lib
from softrdma.capi.cmlazy import install
install(ffi, lib)
lib.sr_keep_program_sigint()
"""


class BuildError(SoftRdmaError):
    """The C half cannot be built here (the message names what to install)."""


def _source() -> str:
    shim = (_HERE / "shim.c").read_text() + (_HERE / "rdmacm.c").read_text()
    return shim.replace("/* SR_PY_EXPORTS */", cdefs.PY_EXPORTS)


def _key() -> str:
    import cffi  # a dependency; imported here so that importing softrdma needs no cffi

    h = hashlib.sha256()
    for part in (_source(), cdefs.TYPES, cdefs.C_EXPORTS, _INIT_CODE, sys.version,
                 cffi.__version__, sysconfig.get_config_var("LDLIBRARY") or ""):
        h.update(part.encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    """Where built libraries live: ``$SOFTRDMA_CAPI_CACHE`` or ``~/.cache/softrdma``."""
    env = os.environ.get("SOFTRDMA_CAPI_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "softrdma"


def library_path() -> Path:
    """Where the library for this source and this Python is (built or not)."""
    return cache_root() / f"capi-{_key()}" / LIB_NAME


def missing_packages() -> list[str]:
    """The Debian packages the build needs that are not installed."""
    need = []
    if shutil.which(os.environ.get("CC", "gcc").split()[0]) is None:
        need.append("gcc")
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").exists():
        need.append("python3-dev")
    if not VERBS_H.exists():
        need.append("libibverbs-dev")
    if not RDMA_CMA_H.exists():
        need.append("librdmacm-dev")
    try:
        import cffi  # noqa: F401
    except ImportError:
        need.append("python3-cffi (or: pip install cffi)")
    return need


def build(force: bool = False) -> Path:
    """The library's path, building it first if needed (BuildError names what is missing)."""
    target = library_path()
    if target.exists() and not force:
        return target
    need = missing_packages()
    if need:
        raise BuildError("cannot build the C interface: install " + ", ".join(need)
                         + " (Debian: apt-get install gcc python3-dev libibverbs-dev "
                         "librdmacm-dev)")
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(cdefs.TYPES)
    ffi.cdef(cdefs.C_EXPORTS)
    ffi.embedding_api(cdefs.PY_EXPORTS)
    ffi.set_source(MODULE, _source(), extra_compile_args=["-O2", "-Wall"])
    ffi.embedding_init_code(_INIT_CODE)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        try:
            built = ffi.compile(tmpdir=tmp, target="libsoftrdma-capi.*", verbose=False)
        except Exception as exc:  # noqa: BLE001 - distutils/setuptools raise many kinds
            raise BuildError(f"building the C interface failed: {exc}") from None
        os.replace(built, target)  # atomic: a concurrent build wins or loses whole
    return target
