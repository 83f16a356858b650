"""The librdmacm examples (rping, udaddy, ucmatose, mckey, rdma_server ...)."""
