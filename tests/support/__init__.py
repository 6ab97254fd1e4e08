"""Helpers the test suites share: a PKI, processes, a platform stack, waiting on a condition."""
