"""Verification harness: scenarios, statistics, backends, runner, CLI and reports."""
