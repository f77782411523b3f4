"""A scenario made concrete from its seed: each template's logits and fixed drafts
(``materialize``), and chunks of trials as the backend receives them (``trials``)."""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from harness.protocol import VerifyBatch
from harness.scenarios.scenario import POSITION_RANGE, RequestSpec, Scenario, conditional_rates
from reference import processing
from reference.distributions import pad_vocab, softmax_rows
from reference.methods import Method
from reference.rng import Stream, hash64, uniforms
from reference.rules import draw_from_row


# --- distribution families ---------------------------------------------------------------
def family_logits(name: str, rng: np.random.Generator, vocab: int, target: np.ndarray | None = None) -> np.ndarray:
    """float64 logits of one row from a named family (draft families may look at ``target``)."""
    if name == "flat":
        return rng.normal(0.0, 0.3, vocab)
    if name == "peaked":
        return rng.normal(0.0, 2.5, vocab)
    if name == "heavy-tail":
        return -1.1 * np.log1p(rng.permutation(vocab).astype(np.float64))
    if name == "topk":
        x = rng.normal(0.0, 1.5, vocab)
        keep = max(2, vocab // 4)
        x[np.argsort(-x)[keep:]] = -np.inf
        return x
    if name == "tied":
        x = rng.normal(0.0, 1.0, vocab)
        x[rng.choice(vocab, size=min(3, vocab), replace=False)] = x.max() + 1.0
        return x
    if name == "near-target":
        base = target[:vocab]
        return np.where(np.isfinite(base), base + rng.normal(0.0, 0.3, vocab), -np.inf)
    if name == "offset":  # near-target shifted by +40, as a real head's logits sit: softmax ignores it, rounding does not
        base = target[:vocab]
        return np.where(np.isfinite(base), base + rng.normal(0.0, 0.3, vocab) + 40.0, -np.inf)
    if name == "same":  # draft == target: nothing to reject, an empty residual
        return target[:vocab].copy()
    if name == "disjoint":
        order = np.argsort(-np.where(np.isfinite(target[:vocab]), target[:vocab], -np.inf))
        x = rng.normal(0.0, 1.0, vocab)
        x[order[: max(1, vocab // 2)]] = -np.inf
        return x
    raise ValueError(f"family: unknown distribution family {name!r}")


@dataclass(frozen=True)
class Template:
    """One materialized request template: float32 logits and the laws' inputs."""

    spec: RequestSpec
    method: Method
    target_logits: np.ndarray  # [d+1, V] float32
    draft_logits: np.ndarray  # [d, V_draft] float32 (drafts come from these)
    drafts: np.ndarray | None  # [d] fixed draft ids (with placeholders), None when sampled
    rates: np.ndarray  # [d] synthetic conditional rates
    processing: str = "vllm"  # whose top-k/top-p tie rules the law follows (Scenario.processing)
    draft_sampling: str | None = None  # the backend's drafter draws: "probabilistic" or "greedy"; None: the suite

    @property
    def num_drafts(self) -> int:
        return self.spec.num_drafts

    @cached_property
    def tie_dependent(self) -> bool:
        """Whether the processed target law differs between vLLM's top-k/top-p implementations
        (an exact tie on a boundary): then only a backend with the scenario's rules is held to it."""
        params = self.spec.sampling_params
        return params is not None and params.temperature > 0 and processing.tie_dependent(self.target_logits, params)

    @property
    def effective_drafts(self) -> int:
        """Drafts before the first placeholder: the ones that can be accepted."""
        if self.drafts is None:
            return self.num_drafts
        return int(np.argmax(np.append(self.drafts, -1) < 0))

    def target_probs(self) -> np.ndarray:
        """The law the verifier must follow: the target after temperature and, when the request
        has them, logit bias / top-k / top-p / min-p (``reference.processing``); drafts keep
        temperature only."""
        params = self.spec.sampling_params
        if params is None:
            return softmax_rows(self.target_logits, self.spec.temperature)
        return processing.processed_probs(self.target_logits, params, self.processing)

    def sampling_probs(self) -> np.ndarray:
        """The law drafts are drawn from: the suite's, the draft rows at temperature 1 when
        greedy; the backend's drafter's (``draft_sampling``), the draft rows at the request's
        temperature, or their argmax (ties to the lowest id) when it drafts greedily or T = 0,
        as engines' drafters do. With draft probabilities this is also the verifier's q."""
        vocab = self.target_logits.shape[1]
        if self.draft_sampling is None:
            return pad_vocab(softmax_rows(self.draft_logits, self.spec.temperature or 1.0), vocab)
        t = 0.0 if self.draft_sampling == "greedy" else self.spec.temperature
        return pad_vocab(softmax_rows(self.draft_logits, t), vocab)

    def fly_gate_probs(self) -> np.ndarray | None:
        """The rows whose top-k entropy and support gate a FLy override of a greedy request:
        the target at temperature 1 (vLLM divides no greedy row by a temperature; a greedy FLy
        request has no sampling parameter), ``[d+1, V]``; None when the request samples (its
        gate is ``target_probs()``: ``reference.fly``)."""
        if self.spec.temperature > 0:
            return None
        return softmax_rows(self.target_logits, 1.0)

    def visible_draft_probs(self) -> np.ndarray:
        vocab = self.target_logits.shape[1]
        if self.draft_sampling is not None:
            return self.sampling_probs()
        return pad_vocab(softmax_rows(self.draft_logits, self.spec.temperature), vocab)


def round_to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 array holding values exactly representable in ``dtype`` (round to nearest even)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = x.view(np.uint32)
        rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        return np.where(np.isnan(x), x, rounded.astype(np.uint32).view(np.float32))
    return x


def materialize(s: Scenario) -> list[Template]:
    """Deterministic logits (and fixed drafts) for every request template."""
    vocab = s.vocab_size
    draft_vocab = s.draft_vocab_size or vocab
    rates = conditional_rates(s)
    out = []
    for i, spec in enumerate(s.requests):
        rng = np.random.default_rng([s.seed, i])
        d = spec.num_drafts
        target_rows = 1 if spec.stationary else d + 1
        target = round_to_dtype(np.stack([family_logits(spec.target, rng, vocab) for _ in range(target_rows)]), s.dtype)
        target = np.repeat(target, d + 1 if spec.stationary else 1, axis=0)
        proposal = np.zeros((d, draft_vocab), dtype=np.float32)
        for j in range(1 if spec.stationary and d else d):
            proposal[j] = family_logits(spec.draft, rng, draft_vocab, target[j].astype(np.float64))
        if spec.stationary:
            proposal[:] = proposal[:1]
        proposal = round_to_dtype(proposal, s.dtype)
        method = s.request_method(spec)
        drafts = None
        if s.draft_mode == "fixed":
            probs = Template(spec, method, target, proposal, None, rates[:d]).sampling_probs()
            drafts = np.array([rng.choice(vocab, p=row / row.sum()) for row in probs], dtype=np.int64).reshape(d)
            if spec.draft_ids is not None:
                drafts = np.array(spec.draft_ids, dtype=np.int64).reshape(d)
            if spec.placeholder_at is not None:
                drafts[spec.placeholder_at] = -1
        target[list(spec.masked_rows)] = -np.inf
        target[list(spec.nan_rows), 0] = np.nan
        drafter = s.draft_sampling if s.draft_mode == "engine" else None
        out.append(Template(spec, method, target, proposal, drafts, rates[:d], s.processing, drafter))
    return out


@dataclass(frozen=True)
class Trials:
    """A batch of trials: request ``t * T + i`` is trial ``t`` of template ``i``."""

    batch: VerifyBatch
    drafts: np.ndarray  # [count, T, K] draft ids per trial (-1 past each template's count)


def trials(s: Scenario, templates: list[Template], first: int, count: int) -> Trials:
    """``count`` trials of every template, starting at global trial index ``first``."""
    t_count = len(templates)
    k = s.max_drafts
    counts = np.array([t.num_drafts for t in templates], dtype=np.int64)
    req_index = (first + np.arange(count))[:, None] * t_count + np.arange(t_count)[None, :]  # [count, T]
    drafts = np.full((count, t_count, k), -1, dtype=np.int64)
    for i, t in enumerate(templates):
        d = t.num_drafts
        if d == 0:
            continue
        if t.drafts is not None:
            drafts[:, i, :d] = t.drafts
        elif t.draft_sampling is None:  # the backend's drafter draws "engine" drafts: -1 here, not read
            probs = t.sampling_probs()
            u = uniforms(hash64(s.seed, req_index[:, i])[:, None], np.arange(d)[None, :], Stream.DRAFT)
            for j in range(d):
                drafts[:, i, j] = draw_from_row(probs[j], u[:, j])
    target_block = np.concatenate([t.target_logits for t in templates])
    target = np.tile(target_block, (count, 1))
    draft_block = (
        np.concatenate([t.draft_logits for t in templates])
        if counts.sum()
        else np.zeros((0, s.draft_vocab_size or s.vocab_size), np.float32)
    )
    draft_logits = np.tile(draft_block, (count, 1)) if s.draft_probs else None
    flat_drafts = np.concatenate([drafts[:, i, : t.num_drafts] for i, t in enumerate(templates)], axis=1).reshape(-1)
    per_req_counts = np.tile(counts, count)
    cu = np.concatenate([[0], np.cumsum(per_req_counts)])
    seeds = hash64(s.seed, req_index.reshape(-1), 1)
    base = hash64(s.seed, req_index.reshape(-1), 2) % POSITION_RANGE if s.positions == "random" else np.zeros(req_index.size, np.int64)
    local = np.concatenate([np.arange(c + 1) for c in counts])
    positions = np.repeat(base, per_req_counts + 1) + np.tile(local, count)
    temps = np.tile(np.array([t.spec.temperature for t in templates], dtype=np.float64), count)
    params = {
        name: None if values is None else np.tile(values, (count,) + (1,) * (values.ndim - 1))  # 2-D: logit bias rows
        for name, values in sampling_arrays(templates).items()
    }
    methods = np.tile(np.array([t.method for t in templates], dtype=np.int8), count)
    rates = None
    if s.synthetic is not None:
        rates = np.tile(conditional_rates(s)[None, :], (count * t_count, 1))
    slots = None
    if s.slots == "permuted":  # a state table twice the batch, requests scattered over it
        slots = np.argsort(hash64(s.seed, first + np.arange(2 * count * t_count), 3))[: count * t_count]
    batch = VerifyBatch(
        target_logits=target,
        draft_logits=draft_logits,
        draft_tokens=flat_drafts,
        cu_num_drafts=cu,
        temperature=temps,
        seeds=seeds,
        positions=positions.astype(np.int64),
        methods=methods,
        synthetic_rates=rates,
        max_drafts=k,
        request_slots=slots,
        logits_dtype=s.dtype,
        processing=batch_processing(templates),
        draft_sampling=templates[0].draft_sampling,
        **params,
        **typical_arrays(s, methods),
        **fly_arrays(s, methods),
    )
    return Trials(batch=batch, drafts=drafts)


def typical_arrays(s: Scenario, methods: np.ndarray) -> dict:
    """The batch's ``posterior_threshold`` / ``posterior_alpha`` ([B] float64, the scenario's
    epsilon and delta), both None when no request is typical acceptance."""
    if not (methods == Method.TYPICAL).any():
        return {"posterior_threshold": None, "posterior_alpha": None}
    eps, delta = s.typical_params
    return {"posterior_threshold": np.full(methods.size, eps, np.float64), "posterior_alpha": np.full(methods.size, delta, np.float64)}


def fly_arrays(s: Scenario, methods: np.ndarray) -> dict:
    """The batch's ``fly_window_size`` / ``fly_entropy_threshold`` / ``fly_entropy_top_k`` ([B]
    int64, float64, int64: the scenario's ``fly_params``), all None when no request is FLy."""
    names = ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")
    if not (methods == Method.FLY).any():
        return dict.fromkeys(names)
    n = methods.size
    return {name: np.full(n, value, dtype) for name, value, dtype in zip(names, s.fly_params, (np.int64, np.float64, np.int64))}


def sampling_arrays(templates: list[Template]) -> dict:
    """One trial's ``top_k`` / ``top_p`` / ``min_p`` (``VerifyBatch`` spelling: 0, 1.0, 0.0 when
    off), each None when no template sets it, and ``logit_bias_ids`` / ``logit_bias`` (``[T, L]``
    int64 ids padded with -1, float32 biases padded with 0), both None when no template has a bias."""
    out = {}
    for name, off, dtype in (("top_k", 0, np.int64), ("top_p", 1.0, np.float64), ("min_p", 0.0, np.float64)):
        values = [getattr(t.spec, name) for t in templates]
        out[name] = None if all(v is None for v in values) else np.array([off if v is None else v for v in values], dtype=dtype)
    biases = [t.spec.logit_bias for t in templates]
    out["logit_bias_ids"] = out["logit_bias"] = None
    if any(biases):
        width = max(len(b) for b in biases)
        ids = np.full((len(templates), width), -1, dtype=np.int64)
        values = np.zeros((len(templates), width), dtype=np.float32)
        for i, pairs in enumerate(biases):
            ids[i, : len(pairs)] = [token for token, _ in pairs]
            values[i, : len(pairs)] = [bias for _, bias in pairs]
        out["logit_bias_ids"], out["logit_bias"] = ids, values
    return out


def batch_processing(templates: list[Template]) -> str | None:
    """``VerifyBatch.processing``: the scenario's tie rules when some template's law depends on them."""
    dependent = [t.processing for t in templates if t.tie_dependent]
    return dependent[0] if dependent else None
