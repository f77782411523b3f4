"""The exact law of an engine's N-token continuation, from the models' own logits.

Each next-token law is the model's float32 logits on the prefix, processed in float64 as
the engine documents it (``reference.hf_processing``). Lossless speculative decoding emits
the target's law: the product of its next-token laws. HF's static ensemble emits, at a
draft position, ``v = w*p + (1-w)*q`` and, at a bonus position, ``p``; which position a
token takes depends on the earlier acceptances, so its law is a dynamic programme over
(prefix, place in the draft block) with HF's block length ``min(k, N - generated - 1)``
(``AssistedCandidateGenerator._calculate_new_tokens``).
"""

import functools
import itertools

import numpy as np

from harness.engines.models import ModelSpec, build
from harness.engines.scenario import EngineScenario
from reference.hf_processing import HfSampling, processed_probs


@functools.lru_cache(maxsize=16)
def _model(spec: ModelSpec):
    return build(spec)


def prefix_laws(spec: ModelSpec, sampling: HfSampling, prefixes) -> np.ndarray:
    """``[len(prefixes), V]`` float64: the processed next-token law after each prefix."""
    import torch

    model = _model(spec)
    out = np.empty((len(prefixes), spec.vocab))
    by_length = {}
    for i, p in enumerate(prefixes):
        by_length.setdefault(len(p), []).append(i)
    with torch.no_grad():
        for rows in by_length.values():
            ids = torch.tensor([list(prefixes[i]) for i in rows], dtype=torch.long)
            logits = model(ids).logits[:, -1].to(torch.float32).numpy()
            out[rows] = processed_probs(logits.astype(np.float64), sampling)
    return out


def _laws_by_depth(spec: ModelSpec, scenario: EngineScenario) -> list[np.ndarray]:
    """Element t: ``[V**t, V]``, the law after the prompt and each t-token prefix (prefix
    index in base V, first token most significant)."""
    v = scenario.vocab
    return [
        prefix_laws(spec, scenario.sampling, [scenario.prompt + tail for tail in itertools.product(range(v), repeat=t)])
        for t in range(scenario.max_new_tokens)
    ]


def continuation_law(scenario: EngineScenario) -> np.ndarray:
    """``[V**N]``: the probability of each N-token continuation (index in base V)."""
    p = _laws_by_depth(scenario.target, scenario)
    if scenario.ensemble_weight is None:
        law = np.ones(1)
        for rows in p:
            law = (law[:, None] * rows).ravel()
        return law
    return _ensemble_law(scenario, p, _laws_by_depth(scenario.draft, scenario))


def _ensemble_law(scenario: EngineScenario, p, q) -> np.ndarray:
    n, k, w = scenario.max_new_tokens, scenario.num_assistant_tokens, scenario.ensemble_weight

    def new_block(generated):  # (place in the block, block length): candidates are drafted up to N - 1 tokens
        return 0, min(k, n - generated - 1)

    mass = [{new_block(0): 1.0}]  # per prefix: state -> probability
    for t in range(n):
        nxt = []
        for prefix, states in enumerate(mass):
            pt, qt = p[t][prefix], q[t][prefix]
            vt = w * pt + (1 - w) * qt
            accepted, rejected = np.minimum(qt, vt), np.maximum(vt - qt, 0.0)
            for x in range(scenario.vocab):
                out = {}
                for (j, c), m in states.items():
                    if j < c:  # a draft position: accepted (next place) or a residual draw (block ends)
                        _add(out, (j + 1, c), m * accepted[x])
                        _add(out, new_block(t + 1), m * rejected[x])
                    else:  # the bonus position, or no candidate left: the target's own draw
                        _add(out, new_block(t + 1), m * pt[x])
                nxt.append(out)
        mass = nxt
    return np.array([sum(states.values()) for states in mass])


def _add(d: dict, key, value: float) -> None:
    d[key] = d.get(key, 0.0) + value
