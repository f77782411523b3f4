"""The suite's own Triton sampler: staged and fused kernels, their launch path, planted kernel faults."""
