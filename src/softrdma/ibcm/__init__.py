"""softrdma.ibcm: the InfiniBand Communication Manager engine (IBA Vol 1 ch. 12).

Sans-I/O, beside the transports: it imports ``wire``, ``seam`` and ``ib`` only. Its
QP1 driver is :mod:`softrdma.drivers.gsi`; the librdmacm-shaped API over it is
:mod:`softrdma.cm`.
"""
