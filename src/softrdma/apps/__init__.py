"""softrdma.apps: processes built on verbs and the CM (above ``cm``): the IPoIB
interface process (:mod:`.ipoib_runtime`, its connections: :mod:`.ipoib_conns`)."""
