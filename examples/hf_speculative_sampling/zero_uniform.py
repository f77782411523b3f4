"""HF's acceptance test ``r <= p/q`` with ``r = torch.rand_like(...)`` accepts a draft whose
target probability is 0 when ``r`` is exactly 0.

``torch.rand`` (float32, CPU) returns multiples of 2**-24 in [0, 1), 0 included, so a draft
with ``p(x) = 0 < q(x)`` is accepted with probability 2**-24 per verification step instead
of 0 (Algorithm 1 draws ``r ~ U(0, 1)``, where ``r = 0`` has probability 0). This script
uses a seed whose 32 uniforms hold an exact 0 (``--search`` finds one again: about 2**19
seeds to try, under a minute on one core), then calls ``_speculative_sampling`` as
``_assisted_decoding`` does, with 32 drafts: every draft's target row equals its draft row
(ratio exactly 1, always accepted) except the one verified with that uniform, whose draft
token the target masks (-inf, p = 0).

    python zero_uniform.py [--search]
"""

import sys

import torch
from transformers.generation.utils import _speculative_sampling

K, V, MASKED = 32, 4, 3
SEED = 194552  # the first seed from 0 whose torch.rand(32) holds an exact 0 (torch 2.13.0, CPU)


def first_zero(seed: int) -> int | None:
    torch.manual_seed(seed)
    zeros = torch.nonzero(torch.rand(K) == 0)
    return int(zeros[0]) if zeros.numel() else None


def main() -> None:
    seed = SEED
    if "--search" in sys.argv[1:]:
        seed = next(s for s in range(1 << 24) if first_zero(s) is not None)
    j = first_zero(seed)
    if j is None:
        raise SystemExit(f"seed {seed}: torch.rand({K}) holds no exact 0 here (another torch build?): run with --search")
    print(f"seed {seed}: torch.rand({K}) is exactly 0 at index {j}")

    candidate_logits = torch.zeros(1, K, V)  # q = uniform over V ids, q(MASKED) = 1/V
    new_logits = torch.zeros(1, K + 1, V)
    new_logits[0, j, MASKED] = float("-inf")  # the target gives MASKED probability 0 at step j
    drafts = torch.zeros(1, K, dtype=torch.long)
    drafts[0, j] = MASKED
    torch.manual_seed(seed)
    valid_tokens, n_matches = _speculative_sampling(drafts, candidate_logits, K, new_logits)
    p = new_logits.softmax(dim=-1)[0, j, MASKED].item()
    accepted = int(n_matches) > j and int(valid_tokens[0, j]) == MASKED
    print(f"n_matches = {int(n_matches)}; draft {j} (token {MASKED}, target probability {p}) accepted: {accepted}")


if __name__ == "__main__":
    main()
