"""Sampling one scenario through one backend: host and device paths, tallies, streams, worker processes."""
