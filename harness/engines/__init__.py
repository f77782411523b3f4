"""Whole engines verified end to end: the engine drafts, verifies and emits continuations
itself (``model.generate(..., assistant_model=...)``), and the continuations are held to
the target model's exact law. See ``docs/engines.md``."""
