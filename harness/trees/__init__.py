"""Tree verification (``python -m harness tree``): a draft tree's sampler held to the exact
law of its rule (``reference.tree``). ``scenario.py`` (the catalog of trees), ``backends.py``
(what a tree sampler is; reference, planted faults, dotted paths), ``faults.py`` (the
reference samplers with one planted bug each), ``run.py`` (trials, the checks and their
records). Chain batches (``harness run``) are not involved: a tree is no ``VerifyBatch``."""
