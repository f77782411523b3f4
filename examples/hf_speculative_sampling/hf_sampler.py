"""Hugging Face transformers' ``_speculative_sampling`` behind the specdec-verify protocol.

``transformers.generation.utils._speculative_sampling`` is the verification step of HF's
assisted generation when it samples with an assistant model's logits
(``_assisted_decoding``, case 1: ``do_sample and candidate_logits is not None``): Leviathan
et al. (2023), Algorithm 1, one sequence at a time. This adapter calls it once per request,
with the inputs HF's caller builds, and nothing else of its own on the accept/reject path.

Conventions, each taken from HF's code (transformers 5.20.2):

* target rows: ``new_logits = outputs.logits[...].to(torch.float32)``, then the logits
  processors; with ``do_sample`` and ``temperature != 1.0`` that is
  ``TemperatureLogitsWarper(temperature)`` (``scores / temperature``). The adapter applies
  that warper itself, to the request's ``c + 1`` target rows in float32 (``c`` drafts).
* draft rows: the assistant's ``generate`` returns its processed scores
  (``output_scores=True``: float32 logits after the warpers of a copy of the same generation
  config, so the same temperature, applied once); ``candidate_logits = torch.stack(scores,
  dim=1)``. The adapter applies the same warper to the float32 draft rows.
* a draft vocabulary narrower than the target's: HF's ``AssistantToTargetTranslator``
  (``get_target_logits``) writes the assistant's logits into a target-width row filled with
  ``FILTER_VALUE = -inf``; the adapter pads the draft rows with ``-inf`` the same way.
* both softmaxes, the acceptance test ``rand <= p/q``, the residual and the draws are HF's
  own, on torch's global generator (``torch.rand_like``, ``torch.multinomial``). The
  adapter seeds that generator with ``torch.manual_seed(batch.seeds[r])`` before each
  request, so the same batch gives the same tokens, and restores the generator's state
  after the batch.
* ``assistant_ensemble_weight=None``: ``GenerationConfig``'s default, the lossless method.

Declined (``supports``), with the reason, because HF does not call ``_speculative_sampling``
for them: methods other than standard, requests with a logit bias or top-k / top-p / min-p
(HF applies those in ``generate()``'s logits processors, not here), batches without draft logits, greedy requests
(temperature 0), requests without a draft before their first placeholder, and target or
draft rows with no finite logit or with a NaN (HF's float32 softmax turns them into NaN
and ``torch.multinomial`` raises). A placeholder later in a request ends its drafts: HF
is called with the ``c`` drafts before it (``candidate_length = c``) and the ``c + 1``
target rows up to the placeholder's own, which is the bonus row.
"""

import numpy as np
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper
from transformers.generation.utils import _speculative_sampling

from reference.methods import Method

FILTER_VALUE = float("-inf")  # AssistantToTargetTranslator.FILTER_VALUE


def effective_drafts(draft_tokens: np.ndarray, cu_num_drafts: np.ndarray) -> np.ndarray:
    """Drafts per request before its first placeholder (-1)."""
    counts = np.diff(cu_num_drafts)
    out = counts.copy()
    for r in range(counts.size):
        holes = np.flatnonzero(draft_tokens[cu_num_drafts[r] : cu_num_drafts[r + 1]] < 0)
        if holes.size:
            out[r] = holes[0]
    return out


def _non_finite_rows(logits: np.ndarray) -> np.ndarray:
    """Rows holding a NaN or no finite logit."""
    return ~np.isfinite(np.max(logits, axis=-1)) if logits.shape[0] else np.zeros(0, dtype=bool)


class Sampler:
    name = "hf-speculative-sampling"
    devices = ("cpu",)

    def supports(self, batch) -> str | None:
        methods = np.asarray(batch.methods)
        other = methods[methods != Method.STANDARD]
        if other.size:
            return (
                f"method {Method(int(other[0])).name.lower()}: HF's _speculative_sampling is the standard method "
                "(Leviathan et al. Algorithm 1) alone"
            )
        if getattr(batch, "logit_bias_ids", None) is not None:
            return (
                "logit bias: this adapter hands _speculative_sampling logits after temperature only "
                "(HF adds a bias in generate()'s logits processors, SequenceBiasLogitsProcessor via sequence_bias, "
                "not in _speculative_sampling)"
            )
        if getattr(batch, "has_sampling_params", False):
            return (
                "top-k / top-p / min-p: this adapter hands _speculative_sampling logits after temperature only "
                "(HF's warpers run in generate()'s own order, top-k -> top-p -> min-p, which no reference engine models)"
            )
        if batch.draft_logits is None:
            return (
                "no draft logits: HF calls _speculative_sampling only with the candidate generator's logits "
                "(`do_sample and candidate_logits is not None` in _assisted_decoding)"
            )
        if (np.asarray(batch.temperature) == 0).any():
            return (
                "greedy (temperature 0): HF verifies greedy requests by argmax in _assisted_decoding (do_sample=False), "
                "not with _speculative_sampling"
            )
        cu = np.asarray(batch.cu_num_drafts)
        drafts = np.asarray(batch.draft_tokens)
        counts = effective_drafts(drafts, cu)
        if (counts == 0).any():
            return (
                "no draft to verify (zero drafts, or a placeholder first): HF's candidate generators return "
                "candidate_logits=None when they propose nothing, and _speculative_sampling is not called"
            )
        bad_target = _non_finite_rows(np.asarray(batch.target_logits))
        bad_draft = _non_finite_rows(np.asarray(batch.draft_logits))
        for r in range(counts.size):
            row, start, c = cu[r] + r, cu[r], counts[r]
            if bad_target[row : row + c + 1].any() or bad_draft[start : start + c].any():
                return (
                    "a row with a NaN or no finite logit: HF's softmax makes it NaN and torch.multinomial raises "
                    "('probability tensor contains either inf, nan or element < 0')"
                )
        return None

    def sample(self, batch):
        why = self.supports(batch)
        if why is not None:
            raise ValueError(f"{self.name}: {why}")
        cu = np.asarray(batch.cu_num_drafts, dtype=np.int64)
        drafts = torch.from_numpy(np.asarray(batch.draft_tokens, dtype=np.int64))
        counts = effective_drafts(np.asarray(batch.draft_tokens), cu)
        num_requests, vocab = cu.size - 1, batch.target_logits.shape[1]
        # HF's caller: `outputs.logits[...].to(dtype=torch.float32)`; _sample's scores are float32 too.
        target = torch.from_numpy(np.asarray(batch.target_logits)).to(torch.float32)
        draft = torch.from_numpy(np.asarray(batch.draft_logits)).to(torch.float32)
        if draft.shape[1] < vocab:  # AssistantToTargetTranslator.get_target_logits: -inf where the assistant has no id
            pad = torch.full((draft.shape[0], vocab - draft.shape[1]), FILTER_VALUE, dtype=torch.float32)
            draft = torch.cat([draft, pad], dim=1)
        temperature = np.asarray(batch.temperature, dtype=np.float64)
        seeds = np.asarray(batch.seeds)

        tokens = np.full((num_requests, int(batch.max_drafts) + 1), -1, dtype=np.int64)
        emitted = np.zeros(num_requests, dtype=np.int64)
        state = torch.get_rng_state()
        try:
            for r in range(num_requests):
                c, start = int(counts[r]), int(cu[r])
                row = start + r
                new_logits = target[row : row + c + 1][None]  # [1, c + 1, V]
                candidate_logits = draft[start : start + c][None]  # [1, c, V]
                t = float(temperature[r])
                if t != 1.0:  # _get_logits_processor adds the warper only for temperature != 1.0
                    warper = TemperatureLogitsWarper(t)
                    new_logits = warper(None, new_logits)
                    candidate_logits = warper(None, candidate_logits)
                # HF passes prompt + candidates; the function reads the last candidate_length ids only.
                candidate_input_ids = drafts[start : start + c][None]
                torch.manual_seed(int(seeds[r]))
                valid_tokens, n_matches = _speculative_sampling(
                    candidate_input_ids, candidate_logits, c, new_logits, assistant_ensemble_weight=None
                )
                n = int(n_matches)
                tokens[r, : n + 1] = valid_tokens[0].numpy()
                emitted[r] = n + 1
        finally:
            torch.set_rng_state(state)
        return tokens, emitted
