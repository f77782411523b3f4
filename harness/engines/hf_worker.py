"""One Hugging Face transformers release's assisted generation, in its own process.

``python -m harness.engines.hf_worker`` reads a list of tasks (JSON on stdin) and writes
their results (JSON on stdout), in order. The release is whichever ``transformers`` comes first on ``sys.path``:
the runner puts a ``pip install --target`` folder there for ``hf@SITE``. Modes:

* ``sample``: one ``model.generate(prompt, assistant_model=draft, do_sample=True, ...)``
  per seed (``torch.manual_seed(seed)`` first: HF draws from the global generator), the
  N new tokens of each;
* ``audit``: the same calls, recording what the verifier (``_speculative_sampling``) is
  given, softmax(q logits) and softmax(p logits), and the law the assistant actually drew
  each candidate from (the rows its ``torch.multinomial`` calls received; a point mass at
  the candidate when it decoded without sampling).
"""

import contextlib
import json
import sys

import numpy as np

from harness.engines.faults import planted, restore_generate
from harness.engines.models import build
from harness.engines.scenario import EngineScenario


def generate_kwargs(scenario: EngineScenario, draft) -> dict:
    """The call's settings, and the assistant's: its generation config is where every
    release reads the draft length from."""
    s = scenario.sampling
    draft.generation_config.num_assistant_tokens = scenario.num_assistant_tokens
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    kwargs = dict(
        do_sample=True, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
        max_new_tokens=scenario.max_new_tokens, assistant_model=draft,
    )  # fmt: skip
    if scenario.ensemble_weight is not None:
        # The law of the ensemble depends on the block lengths: no early stop on the assistant's confidence.
        draft.generation_config.assistant_confidence_threshold = 0.0
        kwargs["assistant_ensemble_weight"] = scenario.ensemble_weight
    return kwargs


def declines(scenario: EngineScenario) -> str | None:
    """Why this release cannot run the scenario, from its declared API, or None."""
    import transformers
    from transformers import GenerationConfig

    if scenario.ensemble_weight is not None and "assistant_ensemble_weight" not in vars(GenerationConfig()):
        return f"transformers {transformers.__version__} has no assistant_ensemble_weight (added in 5.14.0)"
    return None


def continuations(scenario, seeds, fault=None) -> list[list[int]]:
    import torch

    target, draft = build(scenario.target), build(scenario.draft)
    kwargs = generate_kwargs(scenario, draft)
    prompt = torch.tensor([scenario.prompt], dtype=torch.long)
    out = []
    with torch.no_grad(), planted(fault, draft):
        for seed in seeds:
            torch.manual_seed(int(seed))
            tokens = target.generate(prompt, **kwargs)[0, len(scenario.prompt) :].tolist()
            if len(tokens) != scenario.max_new_tokens:
                raise RuntimeError(f"generate returned {len(tokens)} new tokens, not max_new_tokens={scenario.max_new_tokens}")
            out.append(tokens)
    return out


def audit(scenario, seeds, fault=None) -> list[dict]:
    """One entry per verifier call: the sequence it verified, its candidate count ``c``,
    the ``q`` (c rows) and ``p`` (c + 1 rows) it was given and the ``drafted`` rows the
    candidates were drawn from (float64 lists), and ``how`` they were drawn."""
    import torch
    import transformers.generation.utils as hf_utils

    target, draft = build(scenario.target), build(scenario.draft)
    kwargs = generate_kwargs(scenario, draft)
    prompt = torch.tensor([scenario.prompt], dtype=torch.long)
    calls, drafted = [], []
    verify = hf_utils._speculative_sampling

    def recording_verify(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kw):
        c = int(candidate_length)
        rows, how = drafted.pop() if drafted else (None, "unknown")
        calls.append({
            "sequence": candidate_input_ids[0].tolist(), "c": c,
            "q": _softmax(candidate_logits[0, :c]), "p": _softmax(new_logits[0, : c + 1]),
            "drafted": None if rows is None else rows[:c], "how": how,
        })  # fmt: skip
        return verify(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kw)

    with torch.no_grad(), planted(fault, draft), _drafter_recorded(draft, drafted):
        hf_utils._speculative_sampling = recording_verify
        try:
            for seed in seeds:
                torch.manual_seed(int(seed))
                target.generate(prompt, **kwargs)
        finally:
            hf_utils._speculative_sampling = verify
    return calls


@contextlib.contextmanager
def _drafter_recorded(draft, drafted: list):
    """Record, for each assistant ``generate``, the rows its ``torch.multinomial`` drew the
    candidates from (``"sampled"``), or point masses at the candidates when it made no draw
    (``"argmax"``)."""
    import torch

    inner, multinomial = draft.generate, torch.multinomial
    previous = vars(draft).get("generate")
    rows = []

    def recording_multinomial(probs, *args, **kwargs):
        rows.extend(_softmax(torch.log(probs.reshape(-1, probs.shape[-1]))))
        return multinomial(probs, *args, **kwargs)

    def generate(*args, **kwargs):
        rows.clear()
        torch.multinomial = recording_multinomial
        try:
            out = inner(*args, **kwargs)
        finally:
            torch.multinomial = multinomial
        n = len(out.scores)
        candidates = out.sequences[0, out.sequences.shape[1] - n :].tolist()
        if len(rows) == n:
            drafted.append((list(rows), "sampled"))
        elif not rows:
            vocab = out.scores[0].shape[-1]
            drafted.append(([np.eye(vocab)[t].tolist() for t in candidates], "argmax"))
        else:
            drafted.append((None, f"{len(rows)} draws for {n} candidates"))
        return out

    draft.generate = generate
    try:
        yield
    finally:
        restore_generate(draft, previous)


def _softmax(logits) -> list:
    x = logits.detach().to("cpu").double().numpy()
    x = x - x.max(axis=-1, keepdims=True)
    z = np.exp(x)
    return (z / z.sum(axis=-1, keepdims=True)).tolist()


def main() -> int:
    import torch
    import transformers

    torch.set_num_threads(1)  # tiny models: one thread per worker process, several processes
    results = []
    for task in json.load(sys.stdin):
        scenario = EngineScenario.from_dict(task["scenario"])
        run = continuations if task["mode"] == "sample" else audit
        result = {"transformers": transformers.__version__, "where": transformers.__file__}
        declined = declines(scenario)
        try:
            result[task["mode"]] = [] if declined else run(scenario, task["seeds"], task.get("fault"))
        except Exception as e:  # the engine failed on this scenario: reported, the others still run
            result["error"] = f"{type(e).__name__}: {e}"
        result["declined"] = declined
        results.append(result)
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
