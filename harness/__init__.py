"""Verification harness: scenarios, statistics, backends, runner, CLI and reports."""

__version__ = "0.1.0"  # the package's version (pyproject reads it): every run document and history run names it
