"""Runners of other projects' test suites (rdma-core's tests, pyverbs)."""
