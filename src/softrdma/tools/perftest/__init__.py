"""perftest-equivalent tools: ``softrdma write-bw``, ``read-bw``, ``send-bw``,
``atomic-bw``, ``write-lat``, ``read-lat``, ``send-lat``, ``atomic-lat``.

The same flags, output and wire behaviour as perftest 4.5 (``ib_write_bw`` ...), so a
stock perftest tool can be either side:

* :mod:`.options`  the command line (``-d -i -x -s -a -n -D -m -q -R -F --report_gbits
  -e -t -u -p -Q -A -o -b -c -I -S -T --tclass --run_infinitely --output --json
  --transport --device --timeout``);
* :mod:`.oob`      the out-of-band exchange (perftest_communication.c): TCP port 18515,
  or SEND/RECV over an rdma_cm connection with ``-R``; message codecs;
* :mod:`.cmconn`   ``-R``: the rdma_cm control connection and data QPs;
* :mod:`.engine`   verbs resources, QP connection (RTR/RTS), the BW and latency loops;
* :mod:`.report`   header, BW and latency tables, ``--json``, the progress line;
* :mod:`.runner`   the per-tool sequence of exchanges (write_bw.c, send_lat.c ...).
"""

from __future__ import annotations

TOOLS = ("write-bw", "read-bw", "send-bw", "atomic-bw",
         "write-lat", "read-lat", "send-lat", "atomic-lat")
