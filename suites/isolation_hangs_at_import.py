"""A backend module whose import never ends (``suites/test_isolation.py``): never import it
in the test process."""

import time

time.sleep(3600)


def sample(batch):
    raise AssertionError("never loaded")
