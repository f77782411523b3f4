"""Does the Triton sampler fault on very large batches of stride-0 rows? (The open CUDA fault in
``docs/verification-results.md``; the last outputs: ``benchmarks/data/probe_large_batches_h100.txt``.)

One case per process, so that a CUDA fault does not poison the next case:
``CUDA_LAUNCH_BLOCKING=1 python scripts/probe_large_batches.py V K B greedy|standard staged|fused``.
"""

import sys
import time

import torch

from harness.gpus import configure_triton

configure_triton()

from harness.backends.triton.backend import verify  # noqa: E402
from reference.methods import Method  # noqa: E402


def main(vocab: int, k: int, b: int, kind: str, path: str) -> None:
    dev, rows = "cuda", b * (k + 1)
    target = torch.randn(1, vocab, device=dev).expand(rows, vocab)
    draft = torch.randn(1, vocab, device=dev).expand(b * k, vocab) if k else None
    cu = torch.arange(b + 1, device=dev, dtype=torch.int64) * k
    temperature = torch.full((b,), 0.0 if kind == "greedy" else 1.0, device=dev, dtype=torch.float64)
    seeds = torch.arange(b, device=dev, dtype=torch.int64)
    positions = torch.arange(rows, device=dev, dtype=torch.int64)
    methods = torch.full((b,), int(Method.STANDARD), device=dev, dtype=torch.int8)  # greedy: temperature 0
    drafts = torch.randint(0, vocab, (b * k,), device=dev)
    t0 = time.perf_counter()
    tokens, emitted = verify(
        target, draft, drafts, cu, temperature, seeds, positions, methods, None, k, path=path,
        has_strict=False, has_block=False, has_synthetic=False,
    )  # fmt: skip
    torch.cuda.synchronize()
    print(
        f"V={vocab} K={k} B={b} {kind} {path}: ok in {time.perf_counter() - t0:.2f} s, emitted {int(emitted.min())}..{int(emitted.max())}"
    )


if __name__ == "__main__":
    v, k, b, kind, path = sys.argv[1:6]
    main(int(v), int(k), int(b), kind, path)
