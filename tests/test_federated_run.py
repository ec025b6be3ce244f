"""No tests here: the round loop's tests are in ``tests/federation/test_loop.py``.

Test files that still import the tiny run from this module (``from test_federated_run import run, TEST, TRAIN``)
get it from :mod:`helpers.runs`; import it from there instead, then delete this module."""

from helpers.runs import TEST, TRAIN, run  # noqa: F401
