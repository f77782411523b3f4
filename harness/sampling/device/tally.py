"""``tally.add_outputs`` on the backend's device: outputs are counted where they are made.

Each chunk's outputs are copied into run-long device buffers; ``finish`` tallies every
trial at once (one Triton launch on CUDA, ``harness.sampling.device.kernels.tally``; a few dozen
torch ops elsewhere) and copies only the counts to host ``TemplateTally``s. Same validity
rules as ``harness.sampling.tally`` (a trial is valid when it emitted 1..d_eff + 1 tokens, all in
the vocabulary, with the drafts as its prefix).
"""

import numpy as np
import torch

from harness.sampling.device.copies import Download, upload
from harness.sampling.tally import TemplateTally


class DeviceTally:
    def __init__(self, effective_drafts: list[int], vocab: int, trials: int, k: int, device, kernels: bool | None = None):
        self.effective, self.vocab, self.k = effective_drafts, vocab, k
        # One Triton launch instead of the torch ops (harness.sampling.device.kernels): default on CUDA.
        self.kernels = torch.device(device).type == "cuda" if kernels is None else kernels
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
        """Counts of trials [0, filled), whose drafts are ``drafts [trials, T, K]``: every
        template in one pass, one copy of the offsets in and one of the counts out, whatever
        the number of templates."""
        return self.start_finish(drafts).tallies()

    def start_finish(self, drafts: torch.Tensor) -> "QueuedTallies":
        """``finish`` in two steps: the count and its copy to the host are queued now; the
        result's ``tallies()`` waits for them."""
        n, vocab = self.filled, self.vocab
        tok, num, drafts = self.tokens[:n], self.emitted[:n], drafts[:n]
        # Every template's cells in one count: its outcomes [(d+1), V] then, after all
        # outcomes, its steps [(d+1), 2, V]; invalid trials and unused slots fall into one extra
        # "dump" bin, dropped at the end. Offsets computed on the host: they are needed there too.
        sizes = [(e + 1) * vocab for e in self.effective]
        outcome_at = np.cumsum([0] + sizes[:-1])
        steps_at = sum(sizes) + 2 * outcome_at
        cells = 3 * sum(sizes)
        offsets = upload(np.stack([self.effective, outcome_at, steps_at]), tok.device)
        if self.kernels:
            from harness.sampling.device.kernels import tally

            counted = tally(tok, num, drafts, vocab, offsets, cells)
        else:
            counted = self._count(tok, num, drafts, *offsets, cells)
        download = Download(counted)  # through page-locked memory: 33 MB at V = 152,064, K = 8
        return QueuedTallies(download, lambda host: self._tallies(host, tok, num, drafts, sizes, outcome_at, steps_at))

    def _tallies(self, host, tok, num, drafts, sizes, outcome_at, steps_at) -> list[TemplateTally]:
        n, vocab, cells = self.filled, self.vocab, 3 * sum(sizes)
        violations, first_bad = host[cells : cells + len(sizes)], host[cells + len(sizes) :]
        tallies = []
        for i, e in enumerate(self.effective):
            tally = TemplateTally(e, vocab)
            tally.trials, tally.violations = n, int(violations[i])
            at, size = outcome_at[i], sizes[i]
            tally.outcome = host[at : at + size].reshape(e + 1, vocab)
            tally.steps = host[steps_at[i] : steps_at[i] + 2 * size].reshape(e + 1, 2, vocab)
            if tally.violations:
                j = int(first_bad[i])
                tally.example = {
                    "trial": j,
                    "num_emitted": int(num[j, i]),
                    "tokens": tok[j, i].tolist(),
                    "drafts": drafts[j, i].tolist(),
                    "max_emitted": e + 1,
                }
            tallies.append(tally)
        return tallies

    def _count(self, tok, num, drafts, d_dev, outcome_at_dev, steps_at_dev, cells: int) -> torch.Tensor:
        """``device_kernels.tally`` in torch ops (off CUDA): the cells' counts, the invalid
        trials per template, the first of them per template (``n`` if none)."""
        vocab, slot = self.vocab, torch.arange(self.k + 1, device=tok.device)
        expected = torch.cat([drafts, torch.full_like(drafts[..., :1], -2)], dim=2)
        in_vocab = torch.where(slot < num[..., None], (tok >= 0) & (tok < vocab), True).all(dim=2)
        prefix = torch.where(slot < (num - 1)[..., None], tok == expected, True).all(dim=2)
        ok = (num >= 1) & (num <= d_dev + 1) & in_vocab & prefix  # [n, T]
        last = torch.where(ok, num - 1, 0)
        y = tok.gather(2, last[..., None]).squeeze(2)
        outcome = torch.where(ok, outcome_at_dev + last * vocab + y, cells)
        # Steps: (j, accepted, draft j) for every j < last, then (last, rejected-or-bonus, y).
        draft_j = torch.cat([drafts, torch.zeros_like(drafts[..., :1])], dim=2).clamp(min=0)
        accepted = torch.where(ok[..., None] & (slot < last[..., None]), steps_at_dev[:, None] + slot * 2 * vocab + draft_j, cells)
        final = torch.where(ok, steps_at_dev + (last * 2 + 1) * vocab + y, cells)
        counts = torch.bincount(torch.cat([outcome.reshape(-1), accepted.reshape(-1), final.reshape(-1)]), minlength=cells + 1)
        trial = torch.arange(ok.shape[0], device=tok.device)[:, None]
        first_bad = torch.where(ok, ok.shape[0], trial).min(dim=0).values if ok.shape[0] else torch.zeros_like(d_dev)
        return torch.cat([counts[:-1], (~ok).sum(dim=0), first_bad])


class QueuedTallies:
    """A scenario's counts, queued on the device: ``ready()`` says whether they have reached
    the host, ``tallies()`` waits for them and gives the ``TemplateTally``s."""

    def __init__(self, download: Download, make):
        self._download, self._make = download, make

    def ready(self) -> bool:
        return self._download.ready()

    def tallies(self) -> list[TemplateTally]:
        return self._make(self._download.array())
