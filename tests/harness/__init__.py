"""What the tests share: endpoints, networks, devices, waits and the peer scripts some tests run by path.

Tests import only this package, never another test file (tests/test_architecture.py checks it)."""
