"""The suite's own Triton sampler: staged and fused kernels, their launch path, planted kernel faults.

The backend is ``backend.TritonBackend``; ``README.md`` in this folder says what each module holds.
"""
