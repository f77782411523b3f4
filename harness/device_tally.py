"""``tally.add_outputs`` on the backend's device: outputs are counted where they are made.

Each chunk's outputs are copied into run-long device buffers; ``finish`` tallies every
trial at once (a few dozen launches per scenario, not per chunk) and copies only the counts
to host ``TemplateTally``s. Same validity rules as ``harness.tally`` (a trial is valid when
it emitted 1..d_eff + 1 tokens, all in the vocabulary, with the drafts as its prefix).
"""

import torch

from harness.tally import TemplateTally


class DeviceTally:
    def __init__(self, effective_drafts: list[int], vocab: int, trials: int, k: int, device):
        self.effective, self.vocab, self.k = effective_drafts, vocab, k
        t_count = len(effective_drafts)
        self.tokens = torch.full((trials, t_count, k + 1), -1, dtype=torch.int64, device=device)
        self.emitted = torch.zeros((trials, t_count), dtype=torch.int64, device=device)
        self.filled = 0

    def add(self, tokens: torch.Tensor, emitted: torch.Tensor, first_trial: int) -> None:
        """One chunk's outputs, ``tokens [count*T, K+1]`` and ``emitted [count*T]``, of trials from ``first_trial``."""
        count = tokens.shape[0] // len(self.effective)
        self.tokens[first_trial : first_trial + count] = tokens.reshape(count, len(self.effective), self.k + 1)
        self.emitted[first_trial : first_trial + count] = emitted.reshape(count, len(self.effective))
        self.filled = max(self.filled, first_trial + count)

    def finish(self, drafts: torch.Tensor) -> list[TemplateTally]:
        """Counts of trials [0, filled), whose drafts are ``drafts [trials, T, K]``."""
        n = self.filled
        return [self._tally(i, d, self.tokens[:n, i], self.emitted[:n, i], drafts[:n, i]) for i, d in enumerate(self.effective)]

    def _tally(self, i, d, tok, num, drafts) -> TemplateTally:
        vocab, dev = self.vocab, tok.device
        count, width = tok.shape
        tally = TemplateTally(d, vocab)
        slot = torch.arange(width, device=dev)[None]
        expected = torch.cat([drafts, torch.full((count, 1), -2, dtype=torch.int64, device=dev)], dim=1)
        in_vocab = torch.where(slot < num[:, None], (tok >= 0) & (tok < vocab), True).all(dim=1)
        prefix = torch.where(slot < (num - 1)[:, None], tok == expected, True).all(dim=1)
        ok = (num >= 1) & (num <= d + 1) & in_vocab & prefix
        tally.trials = count
        tally.violations = int((~ok).sum())
        if tally.violations:
            j = int(torch.nonzero(~ok)[0, 0])
            tally.example = {
                "trial": j,
                "num_emitted": int(num[j]),
                "tokens": tok[j].tolist(),
                "drafts": drafts[j].tolist(),
                "max_emitted": d + 1,
            }
        # Invalid trials and unused slots fall into one extra "dump" bin, dropped at the end.
        n = torch.where(ok, num - 1, 0)
        y = tok.gather(1, n[:, None]).squeeze(1)
        cells = (d + 1) * vocab
        outcome = torch.bincount(torch.where(ok, n * vocab + y, cells), minlength=cells + 1)[:-1]
        # Steps: (j, accepted, draft j) for every j < n, then (n, rejected-or-bonus, y).
        steps = torch.arange(d + 1, device=dev)[None]
        cells = (d + 1) * 2 * vocab
        draft_j = torch.cat([drafts[:, :d], torch.zeros((count, 1), dtype=torch.int64, device=dev)], dim=1)
        accepted = torch.where(ok[:, None] & (steps < n[:, None]), steps * 2 * vocab + draft_j.clamp(min=0), cells)
        last = torch.where(ok, (n * 2 + 1) * vocab + y, cells)
        counts = torch.bincount(torch.cat([accepted.reshape(-1), last]), minlength=cells + 1)[:-1]
        tally.outcome = outcome.view(d + 1, vocab).cpu().numpy()
        tally.steps = counts.view(d + 1, 2, vocab).cpu().numpy()
        return tally
