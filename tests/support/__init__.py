"""Helpers the tests share that are not fixtures (fixtures live in the ``conftest.py`` of the folder
that uses them): paths, a stub HTTP server, equivalence checks, built optimize results, and
``python -m tests.support.mp_faults``, a worker module with injected faults."""
