"""Per-request sampling parameters as vLLM applies them to logits, in float64.

An engine verifies drafts against the *processed* target distribution: the one its sampler
draws from once temperature, top-k, top-p, min-p and logit bias are applied. This module
defines that distribution exactly as vLLM does (``processed_probs``), which parameters
vLLM's verification path applies (``spec_decode_params``) and the draft distribution its
proposers use (``processed_draft_probs``). It imports nothing of ``harness``; the pins
against vLLM's own code are in ``suites/test_processing.py``.

Engines (``ENGINES``): ``"vllm"`` (= ``"vllm-mrv2"``, Model Runner V2, vLLM 0.33.0's default
runner) and ``"vllm-v1"``; each with a ``-sort`` variant (``"vllm-sort"``, ``"vllm-mrv2-sort"``,
``"vllm-v1-sort"``). The processed distribution is the same for V1 and MRV2; what differs is
the top-k/top-p *implementation* behind ``vllm/v1/sample/ops/topk_topp_sampler.py::
apply_top_k_top_p``, whose conventions differ at ties (see "Which implementation runs"):
the plain names follow the Triton kernel, the ``-sort`` names the PyTorch sort path. The
runner matters only to ``spec_decode_params`` (V1's verifier applies no min-p).

Conventions pinned from vLLM's code (paths under ``vllm/``; "0.19.1" is every release from
0.19.1 to 0.33.0 unless a release is named; 0.19.1, 0.20.0, 0.24.0, 0.27.1 and 0.33.0 read):

What is applied to the target before verification, in this order
  * V1: ``v1/sample/rejection_sampler.py::RejectionSampler.forward``: the target rows go
    through ``RejectionSampler.apply_logits_processors`` (penalties, allowed ids, bad words,
    min-tokens) and then ``apply_sampling_constraints``: temperature, then
    ``apply_top_k_top_p``; ``rejection_sample`` takes ``softmax(dtype=float32)`` of that.
    Neither logit bias nor min-p is applied: under a speculative config
    ``v1/sample/logits_processor/__init__.py::build_logitsprocs`` builds only
    ``MinTokensLogitsProcessor`` ("min_p and logit_bias parameters won't work with
    speculative decoding"), so the bonus token (``Sampler.forward`` on the bonus rows) does
    not get them either.
  * MRV2: ``v1/worker/gpu/spec_decode/rejection_sampler.py::RejectionSampler._verify`` runs
    ``v1/worker/gpu/sample/sampler.py::Sampler.apply_sampling_params`` on every logits row
    (drafts and bonus): logit bias (``LogitBiasState``: allowed ids, bias, min-tokens), then
    penalties, bad words, custom processors, thinking budget, then temperature
    (``SamplingStates.apply_temperature``), min-p (``SamplingStates.apply_min_p``), top-k
    and top-p (``SamplingStates.apply_top_k_top_p`` -> ``apply_top_k_top_p``). 0.19.1 has
    the same order without the processor list (``logit_bias_state.apply_logit_bias``,
    ``penalties_state``, ``bad_words_state``).
  * V1's non-speculative sampler (``v1/sample/sampler.py::Sampler.forward``): float32,
    ``apply_logits_processors`` (allowed ids, bad words, the non-argmax-invariant processors:
    min-tokens and ``LogitBiasLogitsProcessor``, then penalties), then ``Sampler.sample``:
    greedy argmax here, else ``apply_temperature``, the argmax-invariant processors
    (``MinPLogitsProcessor``), then ``TopKTopPSampler`` (top-k, top-p, softmax).
  * So the order, for both runners: **logit bias -> temperature -> min-p -> top-k -> top-p**
    (top-p over the renormalized top-k survivors), then softmax. ``processed_probs`` applies
    all five; what a verifier applies is ``spec_decode_params``.
  * Request validation (``sampling_params.py::SamplingParams._validate_spec_decode``, called
    by ``verify`` for both runners, all releases read): with a speculative config, min_p >
    1e-5 (``_SAMPLING_EPS``) and any logit_bias are rejected. Left: min_p in (0, 1e-5],
    which MRV2 applies and V1 ignores. ``spec_decode_params`` encodes exactly this.
  * The draft gets the temperature only. V1: ``v1/spec_decode/llm_base_proposer.py::
    compute_probs_and_sample_next_token`` (0.19.1: ``v1/spec_decode/eagle.py``):
    ``logits.div_(T)``, ``softmax(dtype=float32)``, "we ignore most of the sampling
    parameters". MRV2: ``v1/worker/gpu/spec_decode/speculator.py::
    DraftModelSpeculator._copy_request_inputs`` (0.19.1: ``spec_decode/eagle/speculator.py::
    EagleSpeculator``; "we only consider the temperature and ignore the other sampling
    parameters such as top_k and top_p"); 0.33.0 caches the draft logits before temperature
    (``v1/worker/gpu/sample/gumbel.py::gumbel_block_argmax``, ``logits_cache``) and the
    rejection kernels divide by T on load (``spec_decode/rejection_sampler_utils.py``), 0.19.1
    caches them after it (``gumbel_sample(processed_logits_out=...)``): the same law,
    ``softmax(draft_logits / T)``. See ``processed_draft_probs``.

Temperature
  * Divides the (biased) logits: V1 ``Sampler.apply_temperature`` (``logits.div_(temp)``,
    greedy rows' T replaced by 1) and ``apply_sampling_constraints``; MRV2
    ``sample/gumbel.py::_temperature_kernel`` (``logits / temperature``, skipped for T in
    {0, 1}). float32 division.
  * ``SamplingParams.__post_init__`` first raises 0 < T < 0.01 (``_MAX_TEMP``) to 0.01, then,
    for T < 1e-5 (so only T = 0), resets top_p = 1, top_k = 0, min_p = 0; ``_verify_args``
    rejects T < 0, non-finite T and (since 0.24.0; 0.19.1 and 0.20.0 accept it) T > 2. The
    kernels take greedy as T < 1e-5 in V1 (``_SAMPLING_EPS``) and T == 0 in MRV2
    (``temperature == 0.0``): the two differ only below the 0.01 floor, i.e. only when they
    are driven directly. ``processed_probs`` raises for 0 < T < 0.01 and T > 2 (their meaning
    depends on the entry point; ``SamplingParams.from_vllm`` does vLLM's conversion).
  * T == 0 (greedy): a point mass on ``argmax(logits + bias)``, ties to the lowest id
    (``torch.argmax``; MRV2's block argmax ``tl.max(..., return_indices=True)`` then
    ``tl.argmax``, both left-biased). Temperature, min-p, top-k and top-p play no part (V1's
    greedy path runs before them; vLLM resets them for greedy requests).

Logit bias
  * Added to the raw logits, before temperature: the processed logit is ``(l + b) / T``. V1:
    ``v1/sample/logits_processor/builtin.py::LogitBiasLogitsProcessor.apply``
    (``logits[rows, ids] += bias``, float32); MRV2: ``sample/logit_bias.py::_bias_kernel``
    (``logits += bias``). ``SamplingParams.from_optional`` (the OpenAI server's path)
    clamps each bias to [-100, 100]; the constructor does not, so -inf reaches the kernels.
    ``_validate_logit_bias`` rejects ids outside the vocabulary (here: ValueError).

Min-p
  * After temperature, on the full (biased, tempered) distribution, before top-k/top-p.
    V1 ``builtin.py::MinPLogitsProcessor.apply``: ``probs = softmax(logits)`` (float32),
    removes ``probs < min_p * probs.max()``: a token at exactly ``min_p * p_max`` is kept,
    tokens tied at the maximum always are (min_p = 1 keeps exactly those). MRV2
    ``sample/min_p.py::_min_p_kernel``: removes ``logits < max_logit + log(min_p)``
    (float32): the same set in exact arithmetic, so both runners share this definition (the
    reference uses V1's probability form). min_p = 0 is a no-op in both.

Top-k
  * Disabled: vLLM's 0 (default) or -1; ``v1/worker/gpu_input_batch.py::InputBatch.add_request``
    and MRV2 ``sample/states.py::SamplingStates.add_request`` map k <= 0 or k >= vocab to
    vocab. Here: ``top_k=None`` (0 and -1 are rejected, ``SamplingParams.from_vllm`` maps
    them); k >= vocab is a no-op.
  * Sort path (``topk_topp_sampler.py::apply_top_k_top_p_pytorch``, and
    ``apply_top_k_only`` for top-k alone on CPU): removes ``logits < kth_largest``: **every
    token equal to the k-th largest value is kept** (more than k may survive).
  * Triton path (``topk_topp_triton.py::_topk_topp_kernel`` via ``apply_top_k_top_p_triton``):
    keeps **exactly k**: those above the pivot plus, among those equal to the k-th value,
    the lowest ids first (``num_keep`` duplicates, counted by a cumsum in id order); no-op
    when a row has at most k finite logits. Equality there is ``abs(a - b) < 1e-9``.
  * Not modeled (seen on an H200 with 0.33.0, ``suites/test_processing.py``): with top-p as
    well, once top-p's boundary reaches a tie at the k-th value the kernel keeps *every*
    tied token (its final pass finds the boundary's duplicates through ``log(prob * Z) +
    max``, a float32 round trip that misses them by more than 1e-9), e.g. logits
    (3, 2, 2, 0.5, 2, 1), k = 2, p = 0.8 keep ids {0, 1, 2, 4}; the reference keeps {0, 1}
    (the sort path {0, 2, 4}). Ties at the k-th value under top-p have no single vLLM law.

Top-p
  * On the top-k survivors, renormalized; disabled at p = 1 (V1 passes no top_p tensor when
    no request has p < 1; MRV2 when all are 1).
  * Sort path (``apply_top_k_top_p_pytorch``): sorts ascending, ``softmax`` of the sorted
    (top-k masked) logits, ``cumsum``, removes where ``cumsum <= 1 - p`` and always keeps the
    last (largest). So it keeps **the smallest top set whose mass is >= p: the token that
    reaches p is kept**, and at an exact boundary (some top set has mass exactly p) the
    tokens after it are removed. Ties are split by the position in ``torch.sort``'s
    ascending order, unspecified for equal values; CPU torch sorts stably, so among equal
    probabilities at the boundary the *highest* ids are kept; the reference uses that
    (stable ascending) order.
  * Triton path: a pivot search in probability space; keeps the smallest set with mass >= p
    as well (``p_pivots_sum >= p``), splitting a tie at the boundary value by keeping the
    *lowest* ids (``num_keep = dups - floor((mass - p) / dup)``; the split-row pipeline
    compares probabilities exactly, the monolithic kernel goes through the same float32
    round trip as above and may keep the whole tie). A row with no active top-k (top-k off,
    or at most k finite logits) whose finite logits are all equal is kept whole: no pivot
    separates equal probabilities (the 0.33.0 split-row pipeline, ``_topp_sb_mask_kernel``,
    does so for rows within 1e-6 relative of uniform as well).
  * Not modeled (seen on an H200 with 0.33.0): the monolithic kernel's standalone top-p
    (rows without an active top-k in calls of more than 64 rows, rows whose top-k is a no-op
    at any batch size, every row off CUDA) keeps too few tokens on rows with 2-3 finite
    logits: 2- and 3-token vocabularies (probs 0.63/0.37, p = 0.9: one token kept, mass
    0.63 < p), and a 7-token row that min-p had cut to 2 (0.32/0.68, k = 4, p = 0.8: one
    kept). No deviation on 7-, 50- and 1000-token random rows (120 calls each, 1 and 80
    rows). On 32000-token rows in an 80-row call it kept 2404 and 3061 tokens where the
    reference keeps 2419 and 3071, in one process; the same call matched exactly in
    another. A tie exactly at the top-p boundary (probs 1/2, 1/4, 1/8, 1/8, p = 7/8) kept one
    1/8 token in one process and both in another. Exact ties and exact boundaries have no
    stable Triton law; the reference's are the rules above.
  * The reference computes the sort path's rule as vLLM writes it (ascending cumsum against
    ``1 - p``) and the Triton one as exclusive descending prefix mass ``< p``; the two are the
    same rule in exact arithmetic.

Which implementation runs (``apply_top_k_top_p``)
  * 0.33.0: Triton whenever ``HAS_TRITON`` (every CUDA/ROCm/XPU build; MRV2 requires
    Triton), else the sort path (``allow_cpu_sync`` on the CPU platform). On CUDA with at
    most 64 rows, rows with top-p and no top-k go through the split-row pipeline
    (``_apply_topp_split``), the others through ``_topk_topp_kernel``.
  * 0.19.1 to 0.29.0 (every wheel read): Triton only when ``logits.shape[0] >= 8``, else the
    sort path; Triton whenever available from 0.30.0. On the CPU platform: 0.22.x the sort
    path, 0.23.0 to 0.29.0 Triton if available, else the sort path (a ``+cpu`` build with
    triton-cpu turns Triton on, ``vllm/triton_utils/importing.py``; not modeled by the
    adapters, which take the sort path on CPU). The rows counted are those of the call: V1's
    ``apply_sampling_constraints`` gets the draft rows of the whole batch, MRV2's
    ``apply_sampling_params`` all its logits rows. So up to 0.29.0 the tie conventions on a
    GPU depend on the batch size: ``-sort`` below 8 rows.
  * Not pinned: V1's bonus token on CUDA may be drawn by FlashInfer
    (``TopKTopPSampler.forward_cuda`` -> ``flashinfer_sample``, no masked logits), and
    FlashInfer/aiter/XPU samplers of non-speculative sampling.

Precision (vLLM is float32 throughout; the reference is float64)
  * vLLM casts logits to float32 and stores temperature, top_p, min_p and biases as float32
    tensors: the reference rounds the parameters to float32 first (``0.9`` acts as
    ``float32(0.9)``) and then computes in float64 from the logits it is given.
  * Where float32 can flip a token in or out (the suite's scenarios keep away from these):
    a top set whose mass is within about ``vocab * 6e-8`` of p (float32 cumsum; ``1 - p`` is
    rounded in float32 for p < 0.5); a probability within float32 rounding of
    ``min_p * p_max`` (V1), or a logit within a float32 ulp of ``max + log(min_p)`` (MRV2: the
    two forms round differently); logits within 1e-9 of the k-th value or probabilities
    within 1e-9 of each other (Triton treats them as equal); logits equal in float32 (or
    bf16) but not in float64: ties, where the implementations differ; the Triton searches'
    iteration caps (18 ternary/binary steps, 5 rounds of 8 pivots), which fall back to an
    approximate pivot when two values at the boundary are closer than their resolution.
    Division by T is monotone, so it can create ties but never reorders.

Degenerate rows follow the package's convention (``reference``): a row with a NaN, or with no
finite logit after the bias, is a point mass on token 0. ``+inf`` logits are input errors.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import numpy as np

from reference.distributions import degenerate_rows, greedy_tokens, softmax_rows

SAMPLING_EPS = 1e-5  # vllm/sampling_params.py::_SAMPLING_EPS: greedy below; min_p above it is rejected with drafts
MIN_TEMPERATURE = 1e-2  # vllm/sampling_params.py::_MAX_TEMP: 0 < T < this is raised to it
MAX_TEMPERATURE = 2.0  # vllm/sampling_params.py::_verify_args (0.24.0 on): T > 2 is rejected
FLOAT32_MAX = float(np.finfo(np.float32).max)  # a bias beyond it is +-inf in vLLM's float32 tables

_ENGINES = {
    "vllm": ("mrv2", "triton"),
    "vllm-mrv2": ("mrv2", "triton"),
    "vllm-v1": ("v1", "triton"),
    "vllm-sort": ("mrv2", "sort"),
    "vllm-mrv2-sort": ("mrv2", "sort"),
    "vllm-v1-sort": ("v1", "sort"),
}
ENGINES = tuple(_ENGINES)


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters, in the reference's spelling.

    ``None`` means "disabled" for ``top_k``, ``top_p`` and ``min_p`` (``top_p=1.0`` and
    ``min_p=0.0`` are disabled too, as in vLLM). vLLM spells a disabled top-k 0 or -1: those
    are rejected here (``from_vllm`` maps them). ``logit_bias`` is a tuple of
    ``(token_id, bias)`` pairs (a mapping is accepted and converted); it is stored sorted by
    id, ids unique and non-negative, biases finite or ``-inf`` (which masks the token).
    ``temperature`` is any finite value >= 0 (0: greedy); ``processed_probs`` further
    rejects what vLLM would not apply as given (0 < T < 0.01, T > 2).
    """

    temperature: float
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        object.__setattr__(self, "temperature", float(t))
        k = self.top_k
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
                raise ValueError(f"top_k must be None (disabled; vLLM spells it 0 or -1) or an integer >= 1, got {k!r}")
            object.__setattr__(self, "top_k", int(k))
        p = self.top_p
        if p is not None:
            if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 < p <= 1.0:
                raise ValueError(f"top_p must be None (disabled) or in (0, 1], got {p!r}")
            object.__setattr__(self, "top_p", float(p))
        m = self.min_p
        if m is not None:
            if isinstance(m, bool) or not isinstance(m, numbers.Real) or not 0.0 <= m <= 1.0:
                raise ValueError(f"min_p must be None (disabled) or in [0, 1], got {m!r}")
            object.__setattr__(self, "min_p", float(m))
        object.__setattr__(self, "logit_bias", _normalize_bias(self.logit_bias))

    @classmethod
    def from_vllm(
        cls,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        logit_bias: dict[int, float] | None = None,
    ) -> SamplingParams:
        """The parameters a ``vllm.SamplingParams`` built from these arguments applies.

        As its ``__post_init__`` and ``_verify_args`` do, in their order: 0 < T < 0.01 becomes
        0.01 (so only T = 0 is greedy), then T < 1e-5 resets top-k, top-p and min-p; top_k 0
        or -1 is disabled (``None``), below -1 an error; T > 2 an error. Biases are not
        clamped (the constructor does not; ``from_optional`` clamps them to [-100, 100])."""
        if isinstance(temperature, numbers.Real) and math.isfinite(temperature) and temperature > MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, 2] for vLLM, got {temperature!r}")
        if isinstance(temperature, numbers.Real) and 0 < temperature < MIN_TEMPERATURE:
            temperature = MIN_TEMPERATURE
        if isinstance(top_k, numbers.Integral) and not isinstance(top_k, bool) and top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), -1 (disable) or at least 1, got {top_k!r}")
        k = None if isinstance(top_k, numbers.Integral) and not isinstance(top_k, bool) and top_k <= 0 else top_k
        if isinstance(temperature, numbers.Real) and temperature < SAMPLING_EPS:
            temperature, k, top_p, min_p = 0.0, None, 1.0, 0.0
        return cls(temperature, k, top_p, min_p, () if logit_bias is None else logit_bias)


def _normalize_bias(bias) -> tuple[tuple[int, float], ...]:
    pairs = bias.items() if hasattr(bias, "items") else bias
    try:
        pairs = [tuple(pair) for pair in pairs]
    except TypeError as e:
        raise ValueError(f"logit_bias must be (token_id, bias) pairs or a mapping, got {bias!r}") from e
    out = {}
    for pair in pairs:
        if len(pair) != 2:
            raise ValueError(f"logit_bias entries must be (token_id, bias) pairs, got {pair!r}")
        token, value = pair
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
            raise ValueError(f"logit_bias token ids must be integers >= 0, got {token!r}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or value == math.inf:
            raise ValueError(f"logit_bias values must be finite or -inf, got {value!r} for token {token}")
        if math.isfinite(value) and abs(value) > FLOAT32_MAX:
            raise ValueError(f"logit_bias values must be finite in float32 (vLLM stores them so), got {value!r} for token {token}")
        if int(token) in out:
            raise ValueError(f"logit_bias gives token {int(token)} more than one bias")
        out[int(token)] = float(value)
    return tuple(sorted(out.items()))


def _engine(engine: str) -> tuple[str, str]:
    try:
        return _ENGINES[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}") from None


def _f32(value: float) -> float:
    """A parameter as vLLM stores it (a float32 tensor), back in float64."""
    return float(np.float32(value))


def _check_temperature(t: float) -> None:
    if 0 < t < MIN_TEMPERATURE:
        raise ValueError(
            f"temperature {t!r}: vLLM's SamplingParams raises 0 < T < 0.01 to 0.01 while its kernels, driven directly, "
            "divide by T; pass 0.01 (SamplingParams.from_vllm) or the T the kernels get, >= 0.01"
        )
    if t > MAX_TEMPERATURE:
        raise ValueError(f"temperature {t!r}: vLLM (0.24.0 on) rejects temperatures above 2")


def _rows(logits) -> tuple[np.ndarray, tuple[int, ...]]:
    x = np.array(logits, dtype=np.float64)  # a private copy
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"logits: expected rows of logits (..., vocab), got shape {x.shape}")
    if np.isposinf(x).any():
        raise ValueError("logits: +inf is an input error (-inf masks a token)")
    return x.reshape(-1, x.shape[-1]), x.shape


def _softmax(x: np.ndarray) -> np.ndarray:
    """Row softmax of rows with a finite maximum; -inf entries get 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _one_hot(tokens: np.ndarray, vocab: int) -> np.ndarray:
    out = np.zeros((len(tokens), vocab))
    out[np.arange(len(tokens)), tokens] = 1.0
    return out


def _scatter(order: np.ndarray, sorted_mask: np.ndarray) -> np.ndarray:
    """A mask given in ``order`` (per row) back in id order."""
    mask = np.zeros_like(sorted_mask)
    np.put_along_axis(mask, order, sorted_mask, axis=1)
    return mask


def _min_p(x: np.ndarray, min_p: float | None) -> np.ndarray:
    if not min_p:
        return x
    probs = _softmax(x)
    return np.where(probs < _f32(min_p) * probs.max(axis=1, keepdims=True), -np.inf, x)


def _top_k(x: np.ndarray, k: int | None, kernel: str) -> np.ndarray:
    vocab = x.shape[1]
    if k is None or k >= vocab:
        return x
    if kernel == "sort":  # remove logits < the k-th largest: ties at the k-th all stay
        kth = np.partition(x, vocab - k, axis=1)[:, vocab - k : vocab - k + 1]
        return np.where(x < kth, -np.inf, x)
    # triton: exactly k, ties at the k-th value to the lowest ids (rows with <= k finite logits keep them all)
    order = np.argsort(-x, axis=1, kind="stable")
    return np.where(_scatter(order, np.broadcast_to(np.arange(vocab) >= k, x.shape)), -np.inf, x)


def _top_p(x: np.ndarray, p: float | None, kernel: str, standalone: np.ndarray) -> np.ndarray:
    if p is None:
        return x
    p = _f32(p)
    if p >= 1.0:
        return x
    if kernel == "sort":  # ascending cumsum; remove cumsum <= 1 - p; the largest always stays
        order = np.argsort(x, axis=1, kind="stable")
        cumsum = np.cumsum(_softmax(np.take_along_axis(x, order, axis=1)), axis=1)
        drop = cumsum <= 1.0 - p
        drop[:, -1] = False
        return np.where(_scatter(order, drop), -np.inf, x)
    # triton: the smallest top set (ties to the lowest ids) whose mass is >= p
    order = np.argsort(-x, axis=1, kind="stable")
    probs = _softmax(np.take_along_axis(x, order, axis=1))
    before = np.concatenate([np.zeros((len(x), 1)), np.cumsum(probs, axis=1)[:, :-1]], axis=1)
    drop = _scatter(order, before >= p)
    finite = np.isfinite(x)
    with np.errstate(invalid="ignore"):
        uniform = np.where(finite, x, -np.inf).max(axis=1) == np.where(finite, x, np.inf).min(axis=1)
    drop[standalone & uniform] = False  # equal probabilities: no pivot separates them, the row stays whole
    return np.where(drop, -np.inf, x)


def processed_logits(logits, params: SamplingParams, engine: str = "vllm") -> np.ndarray:
    """float64 logits after vLLM's processing: ``-inf`` marks a removed token.

    Temperature > 0: ``(logits + bias) / T`` with min-p, top-k, top-p removals (in that order).
    Temperature 0: ``logits + bias``, what the greedy argmax reads. Degenerate rows (a NaN, or
    no finite logit after the bias) are returned as they are. Shape like ``logits``."""
    _, kernel = _engine(engine)
    _check_temperature(params.temperature)
    x, shape = _rows(logits)
    vocab = x.shape[1]
    if params.logit_bias:
        ids = np.array([token for token, _ in params.logit_bias])
        if ids.max() >= vocab:
            raise ValueError(f"logit_bias: token id {int(ids.max())} is outside the vocabulary (size {vocab})")
        x[:, ids] += np.array([_f32(b) for _, b in params.logit_bias])
    if params.temperature == 0:
        return x.reshape(shape)
    bad = degenerate_rows(x)
    raw = x[bad]
    x[bad] = 0.0  # processed as a uniform row, then restored
    x /= _f32(params.temperature)
    x = _min_p(x, params.min_p)
    k = params.top_k
    standalone = np.ones(len(x), dtype=bool) if k is None or k >= vocab else np.isfinite(x).sum(axis=1) <= k
    x = _top_k(x, k, kernel)
    x = _top_p(x, params.top_p, kernel, standalone)
    x[bad] = raw
    return x.reshape(shape)


def processed_probs(logits, params: SamplingParams, engine: str = "vllm") -> np.ndarray:
    """The probability rows (float64, each summing to 1, shape like ``logits``) that ``engine``
    samples and verifies against, for a request with ``params``.

    ``softmax`` of ``processed_logits``; temperature 0 is the greedy point mass on
    ``argmax(logits + bias)`` (ties to the lowest id). Degenerate rows are a point mass on
    token 0. For what a verifier applies with drafts, pass ``spec_decode_params(params)``."""
    x = processed_logits(logits, params, engine)
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    if params.temperature == 0:
        return _one_hot(greedy_tokens(x), shape[-1]).reshape(shape)
    bad = degenerate_rows(x)
    x[bad] = 0.0
    probs = _softmax(x)
    probs[bad] = _one_hot(np.zeros(int(bad.sum()), dtype=np.int64), shape[-1])
    return probs.reshape(shape)


def spec_decode_params(params: SamplingParams, engine: str = "vllm") -> SamplingParams:
    """The parameters ``engine``'s speculative-decoding verifier applies to the target.

    ValueError for a request vLLM rejects with a speculative config
    (``SamplingParams._validate_spec_decode``: min_p > 1e-5, any logit_bias). V1 applies no
    min-p at all (``build_logitsprocs``), so its min_p in (0, 1e-5] is dropped; MRV2 applies
    it. Everything else is applied as given."""
    runner, _ = _engine(engine)
    if params.logit_bias:
        raise ValueError("logit_bias: vLLM rejects logit_bias with speculative decoding (SamplingParams._validate_spec_decode)")
    if params.min_p is not None and params.min_p > SAMPLING_EPS:
        raise ValueError(
            f"min_p {params.min_p!r}: vLLM rejects min_p > 1e-5 with speculative decoding (SamplingParams._validate_spec_decode)"
        )
    if runner == "v1" and params.min_p:
        return replace(params, min_p=None)
    return params


def processed_draft_probs(draft_logits, params: SamplingParams, engine: str = "vllm") -> np.ndarray:
    """The draft distribution vLLM's proposers sample from and verify with:
    ``softmax(draft_logits / T)`` in float64 (T rounded to float32), the temperature only (no
    bias, min-p, top-k or top-p, for V1 and MRV2 alike); T = 0 is the point mass on the
    argmax (ties to the lowest id). Degenerate rows are a point mass on token 0."""
    _engine(engine)
    _check_temperature(params.temperature)
    x, shape = _rows(draft_logits)
    if params.temperature == 0:
        return _one_hot(greedy_tokens(x), shape[-1]).reshape(shape)
    bad = degenerate_rows(x)
    x[bad] = 0.0
    probs = _softmax(x / _f32(params.temperature))
    probs[bad] = _one_hot(np.zeros(int(bad.sum()), dtype=np.int64), shape[-1])
    return probs.reshape(shape)


def add_logit_bias(logits, ids, biases) -> np.ndarray:
    """float64 ``logits + bias`` of rows ``logits`` ``[n, V]`` with per-row sparse biases, as
    ``processed_logits`` adds them: ``ids`` ``[n, L]`` token ids (``-1`` pads a row's unused
    slots, whose ``biases`` are not read), ``biases`` ``[n, L]`` rounded to float32 first (vLLM's
    tables) and added in float64. A new array; ValueError for an id outside ``[-1, V)``."""
    x = np.array(logits, dtype=np.float64)
    ids = np.asarray(ids, dtype=np.int64).reshape(x.shape[0], -1)
    used = ids >= 0
    if ((ids < -1) | (ids >= x.shape[1])).any():
        bad = int(ids[(ids < -1) | (ids >= x.shape[1])][0])
        raise ValueError(f"logit_bias: token id {bad} is outside the vocabulary (size {x.shape[1]})")
    rows, slots = np.nonzero(used)
    values = np.asarray(biases, dtype=np.float32).reshape(ids.shape)[rows, slots].astype(np.float64)
    np.add.at(x, (rows, ids[rows, slots]), values)  # ids are unique per row in valid input; add.at sums repeats
    return x


def processed_rows(
    logits, temperature, top_k=None, top_p=None, min_p=None, engine: str = "vllm", logit_bias_ids=None, logit_bias=None
) -> np.ndarray:
    """``processed_probs`` of each row with its own parameters: ``temperature``, ``top_k``
    (0 = disabled), ``top_p`` (1 = disabled) and ``min_p`` (0 = disabled) are per-row arrays
    (the last three may be None: disabled for every row); ``logit_bias_ids`` / ``logit_bias``
    (``[rows, L]``, ``-1`` pads; None: no bias) each row's bias (``add_logit_bias``), added
    before everything else. Rows sharing their parameters are processed together. float64
    rows summing to 1, shape ``[rows, vocab]``."""
    x = np.asarray(logits)
    n = x.shape[0]
    biased = np.zeros(n)
    if logit_bias_ids is not None:
        # Then processed as unbiased rows (the same float64 sums), by processed_probs (T in float32) like the law.
        biased = (np.asarray(logit_bias_ids).reshape(n, -1) >= 0).any(axis=1).astype(np.float64)
        x = add_logit_bias(x, logit_bias_ids, logit_bias)

    def column(values, off):
        return np.full(n, off, dtype=np.float64) if values is None else np.asarray(values, dtype=np.float64).reshape(n)

    keys = np.stack([column(temperature, 1.0), column(top_k, 0), column(top_p, 1.0), column(min_p, 0.0), biased], axis=1)
    out = np.empty(x.shape, dtype=np.float64)
    groups, which = np.unique(keys, axis=0, return_inverse=True)
    for g, (t, k, p, m, b) in enumerate(groups):
        rows = np.flatnonzero(which.reshape(-1) == g)
        if k == 0 and p >= 1.0 and m == 0 and not b:  # nothing but temperature: any T the protocol allows
            out[rows] = softmax_rows(x[rows], t)
            continue
        params = SamplingParams(float(t), int(k) or None, None if p >= 1.0 else float(p), float(m) or None)
        out[rows] = processed_probs(x[rows], params, engine)
    return out


def tie_dependent(logits, params: SamplingParams) -> bool:
    """Whether ``processed_probs`` of these rows differs between vLLM's two top-k/top-p
    implementations (``"vllm"``: the Triton kernel, ``"vllm-sort"``: the sort path): only at
    an exact tie on a top-k or top-p boundary, or on a uniform row under top-p."""
    return not np.array_equal(processed_probs(logits, params, "vllm"), processed_probs(logits, params, "vllm-sort"))
