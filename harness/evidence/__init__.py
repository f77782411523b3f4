"""Evidence: the typed check record, the run document, the history, atomic writes, environments."""
