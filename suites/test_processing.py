"""``reference.processing`` pinned against vLLM's own code.

vLLM's pure-torch pieces are compiled from the source files of the installed vLLM (0.33.0)
and, where ``vendor/vllm-*`` trees exist, of the older releases, without importing vLLM
(importing it costs ~10 s on 2 cores): the function's own source runs, with the names it
calls that are not under test (a Triton expand kernel, the penalties, the random draw) given
by the test. Compared: the kept set exactly and the probabilities to 1e-6.

* ``topk_topp_sampler.py::apply_top_k_top_p_pytorch`` / ``apply_top_k_only``: the sort path.
* V1 ``sampler.py::Sampler.apply_logits_processors`` + ``Sampler.sample`` with
  ``builtin.py::LogitBiasLogitsProcessor.apply`` and ``MinPLogitsProcessor.apply``: the V1
  sampler's order and its bias/min-p/temperature steps; ``Sampler.sample``'s greedy path.
* V1 ``rejection_sampler.py::apply_sampling_constraints``: what V1 verifies against.
* V1 ``compute_probs_and_sample_next_token`` (``llm_base_proposer.py``; 0.19.1 ``eagle.py``):
  the draft's distribution.
* MRV2 ``worker/gpu/sample/sampler.py::Sampler.apply_sampling_params``: its order (its
  stages are Triton kernels; stand-ins apply their math, transcribed).

Not run on CPU (Triton kernels; this file uses no interpreter): ``topk_topp_triton.py::
apply_top_k_top_p_triton`` (what ``apply_top_k_top_p`` runs wherever vLLM has Triton, so
the reference's default conventions) and MRV2's ``_min_p_kernel``, ``_temperature_kernel``,
``_bias_kernel``: the ``gpu`` tests at the end run them on CUDA (the bias kernel where its
module imports: the vendored python-only 0.33.0 tree lacks ``sample/logits_processor``); on
CPU their conventions are checked on hand-made cases only. Those tests also record the
kernels' deviations from the reference found on an H200 (``reference.processing``, Top-k and
Top-p: "Not modeled").

The logit bias through the adapters (the last section; these import vLLM): MRV2 adds it with
its own ``apply_logit_bias`` (a contract scenario passes, and fails once that function is made
a no-op; greedy requests give the reference's tokens exactly); V1, and the example HF adapter,
decline a biased batch.
"""

import dataclasses
import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario
from reference.processing import (
    ENGINES,
    SamplingParams,
    processed_logits,
    processed_probs,
)
from suites.helpers import (
    NEG_INF,
    RANDOM_CASES,
    V1_CASES,
    VLLM_TREES,
    assert_processing_matches,
    dyadic_row,
    failing_checks,
    first_batch,
    kept_tokens,
    per_row,
    random_logits,
    vllm_backend,
    vllm_ops,
    vllm_source,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("tree", VLLM_TREES)
@pytest.mark.parametrize("vocab,kw", RANDOM_CASES, ids=[f"V{v}-{'-'.join(f'{k}{x}' for k, x in kw.items())}" for v, kw in RANDOM_CASES])
def test_sort_path_matches_reference_on_random_logits(tree, vocab, kw):
    ops = vllm_ops(tree)
    logits = random_logits(vocab, rows=4, seed=vocab)
    params = SamplingParams(1.0, **kw)
    k = per_row(4, kw["top_k"], torch.int32) if "top_k" in kw else None
    p = per_row(4, kw["top_p"], torch.float32) if "top_p" in kw else None
    out = ops.apply_top_k_top_p_pytorch(torch.tensor(logits), k, p)
    assert_processing_matches(out, logits, params, "vllm-sort", "apply_top_k_top_p_pytorch")
    if p is None:  # the CPU platform's top-k-only path
        assert_processing_matches(ops.apply_top_k_only(torch.tensor(logits), k.clone()), logits, params, "vllm-sort", "apply_top_k_only")
    # Away from ties the two implementations keep the same tokens.
    np.testing.assert_array_equal(
        kept_tokens(processed_logits(logits, params, "vllm")), kept_tokens(processed_logits(logits, params, "vllm-sort"))
    )


@pytest.mark.parametrize("tree", VLLM_TREES)
def test_top_k_keeps_every_tie_at_the_kth_value_on_the_sort_path(tree):
    """Sort path: ``logits < kth`` is removed, so all tokens equal to the k-th largest stay.
    Triton keeps exactly k (lowest ids): the reference's two kernels tell them apart."""
    ops = vllm_ops(tree)
    logits = np.array([[3.0, 2.0, 2.0, 0.5, 2.0, 1.0]], dtype=np.float32)
    params = SamplingParams(1.0, top_k=2)
    k = per_row(1, 2, torch.int32)
    for out in (ops.apply_top_k_top_p_pytorch(torch.tensor(logits), k, None), ops.apply_top_k_only(torch.tensor(logits), k.clone())):
        assert kept_tokens(out.numpy()).tolist() == [[True, True, True, False, True, False]]
        assert_processing_matches(out, logits, params, "vllm-sort", "top-k ties")
    assert kept_tokens(processed_logits(logits, params, "vllm")).tolist() == [[True, True, False, False, False, False]]
    # With top-p as well: ties at the k-th survive into the top-p step on the sort path.
    p = per_row(1, 0.999, torch.float32)
    assert_processing_matches(
        ops.apply_top_k_top_p_pytorch(torch.tensor(logits), k, p), logits, SamplingParams(1.0, top_k=2, top_p=0.999), "vllm-sort"
    )


@pytest.mark.parametrize("tree", VLLM_TREES)
def test_top_p_boundary_exactly_at_a_cumulative_mass(tree):
    """probs 1/2, 1/4, 1/8, 1/32 x4 (exact): p = 3/4 and 7/8 are reached exactly by a top set.
    vLLM keeps the smallest set with mass >= p (the reaching token stays, none after it); the
    "mass > p" convention keeps one more token, and is told apart on these rows."""
    ops = vllm_ops(tree)
    x, probs = dyadic_row([16, 8, 4, 1, 1, 1, 1])
    for p, kept in ((0.75, 2), (0.875, 3), (0.875 + 2**-10, 4)):
        params = SamplingParams(1.0, top_p=p)
        out = ops.apply_top_k_top_p_pytorch(torch.tensor(x, dtype=torch.float32), None, per_row(1, p, torch.float32))
        got = kept_tokens(out.numpy())[0]
        assert got[: min(kept, 3)].all() and got.sum() == kept, (p, got)
        assert (kept_tokens(processed_logits(x, params, "vllm-sort"))[0] == got).all(), p
        assert kept_tokens(processed_logits(x, params, "vllm"))[0].sum() == kept, p
        if kept < 4:  # at the exact boundary the wrong convention keeps one more
            wrong = _strict_top_p(probs, p)
            assert wrong.sum() == kept + 1 and not (wrong == got).all(), p


def _strict_top_p(probs, p):
    """A deliberately wrong top-p: the smallest top set with mass strictly > p."""
    order = np.argsort(-probs, kind="stable")
    before = np.concatenate([[0.0], np.cumsum(probs[order])[:-1]])
    keep = np.zeros(len(probs), dtype=bool)
    keep[order[before <= p]] = True
    return keep


@pytest.mark.parametrize("tree", VLLM_TREES)
def test_top_p_splits_a_tie_at_the_boundary(tree):
    """probs 1/2, 1/4, 1/8, 1/8, p = 7/8: one of the two 1/8 tokens is needed. The sort path
    keeps the one later in torch's (stable) ascending order, the higher id; Triton the lower."""
    ops = vllm_ops(tree)
    x, _ = dyadic_row([4, 2, 1, 1])
    params = SamplingParams(1.0, top_p=0.875)
    out = ops.apply_top_k_top_p_pytorch(torch.tensor(x, dtype=torch.float32), None, per_row(1, 0.875, torch.float32))
    assert kept_tokens(out.numpy()).tolist() == [[True, True, False, True]]
    assert_processing_matches(out, x.astype(np.float32), params, "vllm-sort", "top-p tie")
    assert kept_tokens(processed_logits(x, params, "vllm")).tolist() == [[True, True, True, False]]
    # An all-equal row: the sort path keeps ceil(p * n) of them (the highest ids); Triton all.
    flat = np.zeros((1, 4), dtype=np.float32)
    out = ops.apply_top_k_top_p_pytorch(torch.tensor(flat), None, per_row(1, 0.5, torch.float32))
    assert kept_tokens(out.numpy()).tolist() == [[False, False, True, True]]
    assert_processing_matches(out, flat, SamplingParams(1.0, top_p=0.5), "vllm-sort", "uniform row")
    assert kept_tokens(processed_logits(flat, SamplingParams(1.0, top_p=0.5), "vllm")).all()


# --- V1's sampler: bias -> temperature -> min-p -> top-k/top-p -----------------------------------
@functools.cache
def _v1_sampler(tree):
    ops = vllm_ops(tree)
    builtin = "v1/sample/logits_processor/builtin.py"
    min_p = vllm_source(tree, builtin, "MinPLogitsProcessor.apply").apply
    bias = vllm_source(tree, builtin, "LogitBiasLogitsProcessor.apply").apply
    platform = SimpleNamespace(is_cpu=lambda: False)
    sampler = vllm_source(
        tree,
        "v1/sample/sampler.py",
        "_SAMPLING_EPS",
        "Sampler.apply_temperature",
        "Sampler.greedy_sample",
        "Sampler.sample",
        "Sampler.apply_logits_processors",
        current_platform=platform,
        apply_bad_words=None,
    )
    return ops, min_p, bias, sampler


def _v1_process(tree, logits32: np.ndarray, params: SamplingParams):
    """vLLM V1's ``Sampler``: ``apply_logits_processors`` then ``sample``, with its own
    logit-bias and min-p processors; the logits its ``TopKTopPSampler`` hands to the softmax
    (``forward_native``: ``apply_top_k_top_p`` then ``softmax``), or the greedy tokens."""
    ops, min_p_apply, bias_apply, sampler = _v1_sampler(tree)
    rows, vocab = logits32.shape
    non_argmax, argmax = [], []
    if params.logit_bias:
        ids = [t for t, _ in params.logit_bias] * rows
        reqs = [r for r in range(rows) for _ in params.logit_bias]
        state = SimpleNamespace(
            biases={r: dict(params.logit_bias) for r in range(rows)},
            logits_slice=(torch.tensor(reqs, dtype=torch.int32), torch.tensor(ids, dtype=torch.int32)),
            bias_tensor=torch.tensor([b for _ in range(rows) for _, b in params.logit_bias], dtype=torch.float32),
        )
        non_argmax.append(SimpleNamespace(apply=functools.partial(bias_apply, state)))
    if params.min_p:
        state = SimpleNamespace(min_p_count=rows, min_p=torch.full((rows, 1), params.min_p, dtype=torch.float32))
        argmax.append(SimpleNamespace(apply=functools.partial(min_p_apply, state)))
    greedy = params.temperature == 0
    metadata = SimpleNamespace(
        all_greedy=greedy,
        all_random=not greedy,
        temperature=per_row(rows, params.temperature, torch.float32),
        top_k=None if params.top_k is None else per_row(rows, params.top_k, torch.int32),
        top_p=None if params.top_p is None else per_row(rows, params.top_p, torch.float32),
        generators={},
        logitsprocs=SimpleNamespace(non_argmax_invariant=non_argmax, argmax_invariant=argmax),
        bad_words_token_ids={},
        no_penalties=True,
        output_token_ids=[[] for _ in range(rows)],
        spec_token_ids=None,
        allowed_token_ids_mask=None,
        thinking_budget_state_holder=None,
        max_num_logprobs=None,
        logprob_token_ids=None,
    )
    seen = {}

    def topk_topp_sampler(logits, generators, k, p):
        seen["logits"] = ops.apply_top_k_top_p_pytorch(logits, k, p)
        return seen["logits"].argmax(dim=-1), None

    this = SimpleNamespace(
        apply_temperature=sampler.apply_temperature,
        greedy_sample=sampler.greedy_sample,
        apply_penalties=lambda logits, metadata, output_token_ids: logits,
        topk_topp_sampler=topk_topp_sampler,
        logprobs_mode="raw_logprobs",
    )
    logits = sampler.apply_logits_processors(this, torch.tensor(logits32).to(torch.float32), metadata, False)
    tokens, _ = sampler.sample(this, logits, metadata)
    return tokens if greedy else seen["logits"]


@pytest.mark.parametrize("tree", VLLM_TREES)
@pytest.mark.parametrize("case", list(V1_CASES))
def test_v1_sampler_matches_reference(tree, case):
    vocab, kw = V1_CASES[case]
    logits = random_logits(vocab, rows=3, seed=7 + vocab)
    params = SamplingParams(**kw)
    out = _v1_process(tree, logits, params)
    for engine in ("vllm-v1-sort", "vllm-sort"):  # V1 and MRV2 define the same distribution
        assert_processing_matches(out, logits, params, engine, f"V1 Sampler {case}")


@pytest.mark.parametrize("tree", VLLM_TREES)
def test_v1_order_bias_before_temperature_and_min_p_after_it(tree):
    """Deliberately wrong orders are told apart: a bias added after the temperature, and min-p
    applied before it, both give other kept sets than vLLM's on these rows."""
    logits = np.array([[2.0, 1.5, 0.0, -1.0, 0.5]], dtype=np.float32)
    bias = np.array([0.0, 0.0, 0.0, 2.6, 0.0])
    params = SamplingParams(0.5, min_p=0.2, logit_bias=((3, 2.6),))
    out = _v1_process(tree, logits, params)
    assert_processing_matches(out, logits, params, "vllm-v1", "order")
    got = kept_tokens(out.numpy())[0]
    assert got.tolist() == [True, True, False, True, False]
    x = logits[0].astype(np.float64)
    late_bias = x / 0.5 + bias  # bias after temperature: token 3 falls below min-p
    early_min_p = x + bias  # min-p before temperature: token 4 stays
    for wrong in (late_bias, early_min_p):
        assert (np.exp(wrong - wrong.max()) >= 0.2).tolist() != got.tolist()


@pytest.mark.parametrize("tree", VLLM_TREES)
def test_min_p_boundary_keeps_the_token_at_min_p_times_p_max(tree):
    """probs 1/2, 1/4, 1/8, 1/32 x4 (exact), min_p = 1/4: the 1/8 token sits exactly at
    ``min_p * p_max`` and is kept (V1 removes ``p < min_p * p_max``); "> min_p * p_max" would
    remove it. min_p = 1 keeps exactly the tokens tied at the maximum."""
    _, min_p_apply, _, _ = _v1_sampler(tree)
    x, probs = dyadic_row([16, 8, 4, 1, 1, 1, 1])
    state = SimpleNamespace(min_p_count=1, min_p=torch.full((1, 1), 0.25))
    got = kept_tokens(min_p_apply(state, torch.tensor(x, dtype=torch.float32)).numpy())[0]
    assert got.tolist() == [True, True, True, False, False, False, False]
    for engine in ENGINES:
        assert (kept_tokens(processed_logits(x, SamplingParams(1.0, min_p=0.25), engine))[0] == got).all(), engine
    assert not ((probs > 0.25 * probs.max()) == got).all()  # the wrong (strict) convention
    tied = np.array([[1.0, 3.0, 3.0, 2.9]], dtype=np.float32)
    state = SimpleNamespace(min_p_count=1, min_p=torch.full((1, 1), 1.0))
    got = kept_tokens(min_p_apply(state, torch.tensor(tied)).numpy())
    assert got.tolist() == [[False, True, True, False]]
    assert (kept_tokens(processed_logits(tied, SamplingParams(1.0, min_p=1.0))) == got).all()


@pytest.mark.parametrize("tree", VLLM_TREES)
@pytest.mark.parametrize(
    "kw",
    [dict(top_k=1), dict(top_p=1e-3), dict(min_p=1.0), dict(top_k=3, top_p=0.01), dict(min_p=0.999, top_k=5)],
    ids=["top_k1", "top_p-tiny", "min_p1", "top_k3-top_p-tiny", "min_p-high"],
)
def test_a_parameter_that_leaves_one_token(tree, kw):
    logits = random_logits(1000, rows=3, seed=3)
    params = SamplingParams(0.9, **kw)
    out = _v1_process(tree, logits, params)
    assert (kept_tokens(out.numpy()).sum(axis=1) == 1).all()
    assert_processing_matches(out, logits, params, "vllm-sort", f"one token {kw}")
    probs = processed_probs(logits, params)
    assert (probs.max(axis=1) == 1.0).all() and (probs.argmax(axis=1) == logits.argmax(axis=1)).all()


@pytest.mark.parametrize("tree", VLLM_TREES)
def test_logit_bias_makes_a_token_dominant_or_removes_it(tree):
    logits = random_logits(1000, rows=2, seed=11)
    low, top = int(logits[0].argmin()), int(logits[0].argmax())
    dominant = SamplingParams(1.0, top_p=0.9, logit_bias=((low, 100.0),))
    out = _v1_process(tree, logits, dominant)
    assert_processing_matches(out, logits, dominant, "vllm-sort", "bias +100")
    assert kept_tokens(out.numpy())[0].tolist() == [i == low for i in range(1000)]
    assert processed_probs(logits, dominant)[0, low] == 1.0
    removed = SamplingParams(0.7, top_k=10, logit_bias=((top, NEG_INF),))
    out = _v1_process(tree, logits, removed)
    assert_processing_matches(out, logits, removed, "vllm-sort", "bias -inf")
    probs = processed_probs(logits, removed)
    assert probs[0, top] == 0.0 and not kept_tokens(out.numpy())[0, top] and (probs > 0).sum(axis=1).tolist() == [10, 10]


@pytest.mark.parametrize("tree", VLLM_TREES)
def test_greedy_is_the_argmax_of_the_biased_logits(tree):
    """T = 0: ``Sampler.sample``'s greedy path runs before temperature, min-p, top-k and
    top-p: the argmax of ``logits + bias``, the lowest id among equal maxima."""
    logits = np.array([[1.0, 4.0, 4.0, 3.5], [0.0, 2.0, 1.0, 2.0]], dtype=np.float32)
    params = SamplingParams(0.0, top_k=1, top_p=0.1, min_p=0.5, logit_bias=((3, 0.5),))
    tokens = _v1_process(tree, logits, params).tolist()
    assert tokens == [1, 3]
    probs = processed_probs(logits, params)
    assert probs.argmax(axis=1).tolist() == tokens and (probs.max(axis=1) == 1.0).all()


# --- logit bias through the adapters (harness.backends.vllm.processing; the example HF adapter) ----
# These import vLLM (about 10 s) and run MRV2's Triton kernels under the interpreter.
# MRV2's verifier adds the bias with vllm/v1/worker/gpu/sample/logit_bias.py::apply_logit_bias
# (Sampler.apply_sampling_params' first logits processor, before the temperature); V1's adds
# none under a speculative config (v1/sample/logits_processor/__init__.py::build_logitsprocs).
# One request, one fixed draft, V = 8, T = 0.5: +2 on token 3 of a flat row gives it about 0.9
# of the mass (1/8 unbiased: a TV of 0.7 or more), -100 removes token 5.
CONTRACT_BIAS = Scenario("contract-logit-bias", "standard", 8, (RequestSpec(1, 0.5, "flat", "flat", logit_bias={3: 2.0, 5: -100.0}),))
BIAS_PROFILE = dataclasses.replace(get_profile("smoke"), tv=0.3)  # keeps the name: the runner resolves names
MRV2_DOTTED = "harness.backends.vllm.mrv2:VllmMrv2Backend"


@pytest.fixture(scope="module")
def mrv2_backend():
    from harness.backends.vllm import mrv2

    return vllm_backend(mrv2, "VllmMrv2Backend")


def test_mrv2_applies_logit_bias_and_a_broken_bias_kernel_fails(mrv2_backend, monkeypatch):
    """The contract scenario passes with vLLM's ``apply_logit_bias``; made a no-op (the same
    signature: the adapter binds by it), the law checks fail."""
    assert mrv2_backend.supports(first_batch(CONTRACT_BIAS)) is None
    bad = failing_checks(MRV2_DOTTED, CONTRACT_BIAS, BIAS_PROFILE)
    assert not bad, "\n".join(bad)
    from harness.backends.vllm import env as vllm_env
    from harness.backends.vllm import processing as vllm_processing

    module = vllm_env.import_vllm(vllm_processing.LOGIT_BIAS)

    @functools.wraps(module.apply_logit_bias)
    def skipped(logits, *args, **kwargs):
        return None

    monkeypatch.setattr(module, "apply_logit_bias", skipped)
    bad = failing_checks(MRV2_DOTTED, CONTRACT_BIAS, BIAS_PROFILE)
    assert any("outcome-law: fail" in line for line in bad), bad


def test_mrv2_greedy_logit_bias_is_the_reference_exactly(mrv2_backend):
    """T = 0: the argmax of the biased logits (vLLM's float32 sum), token for token, in a batch
    of several trials (requests at reversed state slots: the bias tables are read by slot)."""
    from harness.scenarios.catalog import catalog, find
    from reference.sampler import ReferenceSampler

    batch = first_batch(find(catalog(get_profile("smoke")), "greedy-logit-bias"), count=6)
    tokens, emitted = (np.asarray(x.cpu()) for x in mrv2_backend.sample(batch))
    want_tokens, want_emitted = ReferenceSampler().sample(batch)
    np.testing.assert_array_equal(emitted, want_emitted)
    for r in range(batch.num_requests):
        assert tokens[r, : emitted[r]].tolist() == want_tokens[r, : want_emitted[r]].tolist(), r


def test_mrv2_declines_more_bias_tokens_than_vllm_holds():
    """``LogitBiasState.add_request`` raises past ``MAX_NUM_LOGIT_BIAS_TOKENS`` (1024)."""
    from harness.backends.vllm import processing as vllm_processing

    processor = vllm_processing.Processor(None, with_min_p=True)
    ids = np.arange(1025)[None, :]
    batch = SimpleNamespace(logit_bias_ids=ids, logit_bias=np.ones(ids.shape, np.float32), temperature=np.ones(1), target_logits=None)
    bias = vllm_processing.logit_bias(batch)
    params = vllm_processing.Params(np.full(1, 2000, np.int32), np.ones(1, np.float32), np.zeros(1, np.float32), 2000, bias)
    reason = processor.logit_bias_reason(params)
    assert reason and "1025 tokens" in reason and "MAX_NUM_LOGIT_BIAS_TOKENS" in reason, reason


def test_v1_and_the_hf_example_decline_logit_bias():
    from harness.backends.vllm import v1
    from harness.scenarios.catalog import catalog, find

    batch = first_batch(find(catalog(get_profile("smoke")), "standard-logit-bias"))
    reason = vllm_backend(v1, "VllmV1Backend").supports(batch)
    assert reason and reason.startswith("logit bias (request 0: {0: 3})") and "build_logitsprocs" in reason, reason
    pytest.importorskip("transformers", reason="the example HF adapter needs transformers")
    from examples.hf_speculative_sampling.hf_sampler import Sampler

    reason = Sampler().supports(batch)
    assert reason and reason.startswith("logit bias:"), reason
