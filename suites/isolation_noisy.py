"""A backend that writes to its stdout and stderr at import and on every call, through
Python and through the descriptors themselves (``suites/test_isolation.py``)."""

import os
import sys

print("noisy: print at import")
os.write(2, b"noisy: fd 2 at import\n")


class Noisy:
    def __init__(self):
        from reference.sampler import ReferenceSampler

        self._reference = ReferenceSampler()

    def sample(self, batch):
        print("noisy: print in sample")
        print("noisy: stderr in sample", file=sys.stderr)
        os.write(1, b"noisy: fd 1 in sample\n")
        os.write(2, b"noisy: fd 2 in sample\n")
        return self._reference.sample(batch)
