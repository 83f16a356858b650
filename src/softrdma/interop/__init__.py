"""The live interoperability suite against Linux rxe and siw (issue 9, ``softrdma interop``).

Modules: :mod:`.lab` (the lab's scripts, guests, the suite's namespace, captures),
:mod:`.cases` (the case matrix and command lines), :mod:`.parse` (tool outputs and
counters), :mod:`.checks` (error completions, retransmission storms, stuck QPs),
:mod:`.report` (the table and JSON), :mod:`.runner` (a run), :mod:`.cli` (the command).
This package runs subprocesses; no protocol package imports it.
"""
