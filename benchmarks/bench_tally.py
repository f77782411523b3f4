"""Device time of the on-device tally (``harness.sampling.device.kernels.tally``) on outputs shaped
like the `gpu` catalog's: how much of a run's GPU time counting outcomes takes
(``benchmarks/RESULTS.md#tally-kernel``).

Run on a GPU machine: ``python benchmarks/bench_tally.py --json OUT.json [--impl FILE.py:tally]
[--copies 1,8,64]``. Outputs are synthetic but valid: every trial emits 1..d+1 tokens with its
drafts as prefix, the last token uniform over the vocabulary (the worst spread for the
counts). Each case is timed with CUDA events over ``--calls`` calls after a warm-up; the
tallies of every variant are compared with the default's, so a faster variant that counts
differently fails here.
"""

import argparse
import functools
import importlib
import importlib.util
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from harness.evidence.environment import describe  # noqa: E402

# (vocab, K, effective drafts per template, trials, drafts sampled per trial): the catalog's
# small-vocabulary shapes (300k trials, 2-3 templates), its 3000 and 32000 vocabularies, and
# one at V = 152064, K = 8 (4.1 million cells).
CASES = (
    (32, 3, (2, 3), 300_000, False),
    (32, 4, (1, 3, 4), 300_000, False),
    (32, 3, (1, 3), 600_000, True),
    (3000, 2, (2,), 180_000, False),
    (32000, 2, (2, 2), 355_000, False),
    (152064, 8, (8,), 100_000, True),
)


def load(spec: str):
    """``module:function`` or ``path/to/file.py:function``."""
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py"):
        found = importlib.util.spec_from_file_location("tally_variant", where)
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def outputs(vocab: int, k: int, effective: tuple, trials: int, sampled: bool, device="cuda", seed: int = 0):
    """Valid outputs of ``trials`` trials of ``len(effective)`` templates, with the tally's
    offsets and cell count (as ``DeviceTally.start_finish`` lays them out)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    on = {"device": device}
    t_count = len(effective)
    d = torch.tensor(effective, **on)
    shape = (trials if sampled else 1, t_count, k)
    drafts = torch.randint(0, vocab, shape, generator=gen, **on).expand(trials, -1, -1).clone()
    drafts[torch.arange(k, **on).expand(trials, t_count, k) >= d[None, :, None]] = -1
    emitted = 1 + (torch.rand((trials, t_count), generator=gen, **on) * (d + 1)).long()
    tokens = torch.cat([drafts, torch.full_like(drafts[..., :1], -1)], dim=2)
    tokens = torch.where(torch.arange(k + 1, **on) < (emitted - 1)[..., None], tokens, -1)
    tokens.scatter_(2, (emitted - 1)[..., None], torch.randint(0, vocab, (trials, t_count, 1), generator=gen, **on))
    sizes = [(e + 1) * vocab for e in effective]
    outcome_at = np.cumsum([0] + sizes[:-1])
    steps_at = sum(sizes) + 2 * outcome_at
    offsets = torch.tensor(np.stack([effective, outcome_at, steps_at]), **on)
    return tokens, emitted, drafts, offsets, 3 * sum(sizes)


def time_ms(call, calls: int) -> float:
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--impl", action="append", default=[], help="extra tally functions to time (module:fn or file.py:fn)")
    parser.add_argument("--copies", default="", help="comma-separated copy counts to time besides the default")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_tally needs a CUDA device")
    default = load("harness.sampling.device.kernels:tally")
    variants = {"default": default}
    for count in filter(None, args.copies.split(",")):
        variants[f"copies={count}"] = lambda *a, c=int(count): default(*a, copies=c)
    for spec in args.impl:
        variants[spec] = load(spec)
    rows = []
    for vocab, k, effective, trials, sampled in CASES:
        tokens, emitted, drafts, offsets, cells = outputs(vocab, k, effective, trials, sampled)
        inputs = (tokens, emitted, drafts, vocab, offsets, cells)
        expected = default(*inputs)
        assert int(expected[:cells].sum()) > 0 and int(expected[cells : cells + len(effective)].sum()) == 0
        for name, fn in variants.items():
            got = fn(*inputs)
            if not torch.equal(got, expected):
                raise SystemExit(f"{name} counts differently from the default at V={vocab}, K={k}")
            ms = time_ms(functools.partial(fn, *inputs), args.calls)
            lanes = trials * len(effective)
            row = {"impl": name, "V": vocab, "K": k, "templates": len(effective), "trials": trials, "sampled": sampled}
            row |= {"cells": cells, "ms": ms, "ns_per_lane": ms * 1e6 / lanes}
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(args.json, "w") as f:
        json.dump({"environment": describe(), "command": " ".join(sys.argv), "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
