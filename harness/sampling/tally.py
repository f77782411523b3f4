"""Backend outputs -> counts over the laws' cells, per request template.

Only counts leave this module. A trial is *valid* when it emitted between 1 and
``d_eff + 1`` tokens, every emitted id is in the vocabulary and the emitted prefix equals
its drafts (drafts a backend drew itself in the vocabulary too); invalid trials are counted
as structure violations (with the first one kept as an example) and excluded from the
distribution counts.
"""

from dataclasses import dataclass

import numpy as np


@dataclass
class TemplateTally:
    effective_drafts: int  # d_eff: drafts before the first placeholder (the law's horizon)
    vocab: int
    outcome: np.ndarray = None  # [d+1, V] (n accepted, emitted token)
    steps: np.ndarray = None  # [d+1, 2, V] per step: accepted draft / rejected-emitted token
    trials: int = 0
    violations: int = 0
    example: dict | None = None
    repeatable: bool | None = None  # same outputs from two calls on the same inputs (None: not asked)
    drafted: np.ndarray | None = None  # [d, V] the drafts a backend's own drafter drew, per step (valid trials)
    stopped: bool = False  # sampling stopped before the scenario's count: a monitored (sequential) check rejected

    def __post_init__(self):
        d, v = self.effective_drafts, self.vocab
        self.outcome = np.zeros((d + 1, v), dtype=np.int64)
        self.steps = np.zeros((d + 1, 2, v), dtype=np.int64)

    @property
    def valid(self) -> int:
        return self.trials - self.violations

    def reached(self) -> np.ndarray:
        return self.steps.sum(axis=(1, 2))

    def accepted(self) -> np.ndarray:
        return self.steps[:, 0].sum(axis=-1)


def add_outputs(tallies: list[TemplateTally], tokens, emitted, drafts, first_trial: int, drafted: bool = False) -> None:
    """Accumulate one chunk: ``tokens [count*T, K+1]``, ``emitted [count*T]``, ``drafts [count, T, K]``.
    ``drafted``: the drafts are the backend's own (``VerifyBatch.draft_sampling``): they must
    be in the vocabulary too, and are counted per step."""
    count, t_count, _ = drafts.shape
    tokens = tokens.reshape(count, t_count, -1)
    emitted = emitted.reshape(count, t_count)
    for i, tally in enumerate(tallies):
        d, vocab = tally.effective_drafts, tally.vocab
        tok, num, dr = tokens[:, i], emitted[:, i], drafts[:, i]
        slot = np.arange(tok.shape[1])[None, :]
        shown = slot < num[:, None]
        in_vocab = np.where(shown, (tok >= 0) & (tok < vocab), True).all(axis=1)
        prefix = np.where(slot < (num - 1)[:, None], tok == np.pad(dr, ((0, 0), (0, 1)), constant_values=-2), True).all(axis=1)
        ok = (num >= 1) & (num <= d + 1) & in_vocab & prefix
        if drafted:
            ok &= ((dr[:, :d] >= 0) & (dr[:, :d] < vocab)).all(axis=1)
        tally.trials += count
        bad = np.flatnonzero(~ok)
        if bad.size:
            tally.violations += bad.size
            if tally.example is None:
                j = bad[0]
                tally.example = {
                    "trial": int(first_trial + j),
                    "num_emitted": int(num[j]),
                    "tokens": tok[j].tolist(),
                    "drafts": dr[j].tolist(),
                    "max_emitted": d + 1,
                }
        n = num[ok] - 1
        y = tok[ok][np.arange(n.size), n]
        np.add.at(tally.outcome, (n, y), 1)
        valid_drafts = dr[ok]
        for j in range(d):
            acc = n > j
            tally.steps[j, 0] += np.bincount(valid_drafts[acc, j], minlength=vocab)
            rej = n == j
            tally.steps[j, 1] += np.bincount(y[rej], minlength=vocab)
        tally.steps[d, 1] += np.bincount(y[n == d], minlength=vocab)
        if drafted:
            if tally.drafted is None:
                tally.drafted = np.zeros((d, vocab), dtype=np.int64)
            for j in range(d):
                tally.drafted[j] += np.bincount(valid_drafts[:, j], minlength=vocab)
