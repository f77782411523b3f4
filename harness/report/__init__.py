"""Reports: the run page, the drift page, and their self-contained HTML."""
