"""``tally.add_outputs`` on the backend's device: outputs are counted where they are made.

Counts accumulate in device tensors; ``finish`` copies them to host ``TemplateTally``s
once per scenario. Same validity rules as ``harness.tally`` (a trial is valid when it
emitted 1..d_eff + 1 tokens, all in the vocabulary, with the drafts as its prefix); the
host syncs once per chunk only to learn whether any trial was invalid.
"""

import torch

from harness.tally import TemplateTally


class DeviceTally:
    def __init__(self, effective_drafts: list[int], vocab: int, k: int, device):
        self.vocab, self.k, self.device = vocab, k, device
        self.tallies = [TemplateTally(d, vocab) for d in effective_drafts]
        # Flat counts with one extra "dump" bin that invalid trials and unused slots fall into.
        self.outcome = [torch.zeros((d + 1) * vocab + 1, dtype=torch.int64, device=device) for d in effective_drafts]
        self.steps = [torch.zeros((d + 1) * 2 * vocab + 1, dtype=torch.int64, device=device) for d in effective_drafts]

    def add(self, tokens: torch.Tensor, emitted: torch.Tensor, drafts: torch.Tensor, first_trial: int) -> None:
        """One chunk: ``tokens [count*T, K+1]``, ``emitted [count*T]``, ``drafts [count, T, K]`` (device tensors)."""
        count, t_count, k = drafts.shape
        tokens = tokens.to(torch.int64).reshape(count, t_count, k + 1)
        emitted = emitted.to(torch.int64).reshape(count, t_count)
        slot = torch.arange(k + 1, device=tokens.device)
        pad = torch.full((count, t_count, 1), -2, dtype=torch.int64, device=tokens.device)
        expected = torch.cat([drafts, pad], dim=2)  # what each slot before the last emitted one must hold
        for i, tally in enumerate(self.tallies):
            d, vocab = tally.num_drafts, self.vocab
            tok, num = tokens[:, i], emitted[:, i]
            shown = slot[None] < num[:, None]
            in_vocab = torch.where(shown, (tok >= 0) & (tok < vocab), True).all(dim=1)
            prefix = torch.where(slot[None] < (num - 1)[:, None], tok == expected[:, i], True).all(dim=1)
            ok = (num >= 1) & (num <= d + 1) & in_vocab & prefix
            tally.trials += count
            bad = int((~ok).sum())
            if bad:
                tally.violations += bad
                if tally.example is None:
                    self._keep_example(tally, tok, num, drafts[:, i], ok, first_trial)
            n = torch.where(ok, num - 1, 0)
            y = tok.gather(1, n[:, None]).squeeze(1)
            dump_o = self.outcome[i].numel() - 1
            self.outcome[i] += torch.bincount(torch.where(ok, n * vocab + y, dump_o), minlength=dump_o + 1)
            # Steps: (j, accepted, draft j) for every j < n, then (n, rejected-or-bonus, y).
            steps = torch.arange(d + 1, device=tokens.device)[None]
            dump_s = self.steps[i].numel() - 1
            accepted = ok[:, None] & (steps < n[:, None])
            draft_j = torch.cat([drafts[:, i, :d], torch.zeros((count, 1), dtype=torch.int64, device=tokens.device)], dim=1)
            acc_idx = torch.where(accepted, (steps * 2) * vocab + draft_j.clamp(min=0), dump_s)
            last_idx = torch.where(ok, (n * 2 + 1) * vocab + y, dump_s)
            self.steps[i] += torch.bincount(torch.cat([acc_idx.reshape(-1), last_idx]), minlength=dump_s + 1)

    @staticmethod
    def _keep_example(tally, tok, num, drafts, ok, first_trial):
        j = int(torch.nonzero(~ok)[0, 0])
        tally.example = {
            "trial": int(first_trial + j),
            "num_emitted": int(num[j]),
            "tokens": tok[j].tolist(),
            "drafts": drafts[j].tolist(),
            "max_emitted": tally.num_drafts + 1,
        }

    def finish(self) -> list[TemplateTally]:
        for tally, outcome, steps in zip(self.tallies, self.outcome, self.steps):
            tally.outcome = outcome[:-1].view(tally.num_drafts + 1, self.vocab).cpu().numpy()
            tally.steps = steps[:-1].view(tally.num_drafts + 1, 2, self.vocab).cpu().numpy()
        return self.tallies
