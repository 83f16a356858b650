"""The environment variables that ``softrdma run`` sets for the program it runs and that the
C interface's Python half reads: a module of their own, so that the launcher, which needs
only their names, imports none of the verbs (about 60 ms of every ``softrdma run``)."""

from __future__ import annotations

__all__ = ["PYTHON_ENV", "DEVICE_ENV", "PATH_ENV"]

#: the interpreter that devd and helpers must run with (the embedded one's
#: ``sys.executable`` is the program, not the venv's Python)
PYTHON_ENV = "SOFTRDMA_CAPI_PYTHON"
#: the device a program sees first (``softrdma run -d``)
DEVICE_ENV = "SOFTRDMA_CAPI_DEVICE"
#: the directories the program's softrdma imports from (this interpreter's ``sys.path``):
#: a name of softrdma's own, not ``PYTHONPATH``, which every Python the program starts
#: would read (another Python version then imported this one's standard library and failed)
PATH_ENV = "SOFTRDMA_CAPI_PATH"
