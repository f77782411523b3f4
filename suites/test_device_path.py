"""The device path (inputs built and outputs tallied where the backend runs) equals the host path bit for bit."""

import dataclasses
import os

import numpy as np
import pytest
import torch

from harness import torch_rng
from harness.backends import load_backend
from harness.backends.vllm import mrv2 as vllm_mrv2
from harness.gpus import gpu_skip_reason
from harness.sampling.device import trials as device_trials
from harness.sampling.device.tally import DeviceTally
from harness.sampling.tally import TemplateTally, add_outputs
from harness.scenarios.catalog import catalog
from harness.scenarios.materialize import materialize, trials
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario
from reference import rng
from reference.rng import Stream

SCENARIOS = {s.name: s for s in catalog(get_profile("smoke"), 0)}

# Where the trials are built and tallied: torch ops on the CPU, the Triton kernels of
# harness.sampling.device.kernels under the interpreter, and those kernels on a GPU (their default).
PATHS = [
    pytest.param(("cpu", False), id="cpu-torch"),
    pytest.param(("cpu", True), id="cpu-kernels"),
    pytest.param(("cuda", True), id="cuda-kernels", marks=pytest.mark.gpu),
]


@pytest.fixture
def path(request):
    device, kernels = request.param
    if device == "cuda" and gpu_skip_reason():
        pytest.skip(gpu_skip_reason())
    if device == "cpu" and kernels and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the kernels on CPU tensors need TRITON_INTERPRET=1 (a GPU machine tests them in cuda-kernels)")
    return device, kernels


def test_hash_and_uniforms_match_the_reference_bit_for_bit():
    keys = np.array([0, 1, 2, 12345, 2**40 + 7, 2**62 + 11, 2**63 - 1], dtype=np.int64)
    for a in keys:
        expected = rng.hash64(int(a), keys, 3)
        assert np.array_equal(torch_rng.hash64(int(a), torch.from_numpy(keys), 3).numpy(), expected)
    seeds, positions = np.meshgrid(keys, keys)
    for stream in Stream:
        expected = rng.uniforms(seeds, positions, stream)
        got = torch_rng.uniforms(torch.from_numpy(seeds), torch.from_numpy(positions), stream).numpy()
        assert np.array_equal(got, expected)


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize(
    "name",
    [
        "standard-sampled", "standard-permuted-slots", "synthetic-mixed-batch", "standard-zero-drafts", "block-placeholder",
        "standard-bf16", "block-sampled", "standard-aligned-positions", "greedy-ragged", "standard-top-k-top-p",
        "standard-top-k-ties", "block-top-p",
    ],
)  # fmt: skip
def test_device_batches_equal_host_batches(name, path):
    s = SCENARIOS[name]
    templates = materialize(s)
    built = device_trials.DeviceTrials(s, templates, path[0], kernels=path[1])
    built.prepare(1007)
    for first, count in ((0, 5), (5, 5), (1000, 7), (10, 3)):  # 3 after 7: a prefix of the rows repeated for 7
        host = trials(s, templates, first, count)
        batch, drafts = built.chunk(first, count)
        assert np.array_equal(drafts.cpu().numpy(), host.drafts)
        fields = ("draft_tokens", "cu_num_drafts", "temperature", "seeds", "positions", "methods", "synthetic_rates", "request_slots")
        for field in fields + ("top_k", "top_p", "min_p"):
            want, got = getattr(host.batch, field), getattr(batch, field)
            assert (want is None) == (got is None), field
            if want is not None:
                assert np.array_equal(got.cpu().numpy(), want), field
        for field in ("target_logits", "draft_logits"):
            want, got = getattr(host.batch, field), getattr(batch, field)
            assert (want is None) == (got is None), field
            if want is not None:
                assert np.array_equal(got.float().cpu().numpy(), want, equal_nan=True), field
        assert batch.logits_dtype == s.dtype and batch.max_drafts == host.batch.max_drafts
        assert batch.processing == host.batch.processing
        assert batch.method_codes == tuple(np.unique(host.batch.methods).tolist())
    with pytest.raises(ValueError, match="outside the prepared range"):
        built.chunk(1005, 5)


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_device_batches_equal_host_batches_for_any_seed_and_draft_vocabulary(path):
    """Sampled drafts beside a template without drafts, a draft vocabulary narrower than the
    target's; and a seed whose hash state fits in 32 bits (Triton passes such a scalar as int32)."""
    requests = (RequestSpec(3), RequestSpec(0), RequestSpec(2, 0.5))
    for seed in (11, SMALL_STATE_SEED):
        s = Scenario(name="x", method="standard", vocab_size=40, requests=requests, draft_mode="sampled", draft_vocab_size=29, seed=seed)
        templates = materialize(s)
        built = device_trials.DeviceTrials(s, templates, path[0], kernels=path[1])
        built.prepare(300)
        host = trials(s, templates, 0, 300)
        batch, drafts = built.chunk(0, 300)
        assert np.array_equal(drafts.cpu().numpy(), host.drafts)
        for field in ("draft_tokens", "seeds", "positions"):
            assert np.array_equal(getattr(batch, field).cpu().numpy(), getattr(host.batch, field)), field


SMALL_STATE_SEED = 7496291377057076992  # hash64's state after this seed is 5


def test_small_state_seed_has_a_small_state():
    assert int(torch_rng.hash_state(SMALL_STATE_SEED)) == 5


@pytest.mark.parametrize("path", [p for p in PATHS if p.values[0][1]], indirect=True)
def test_trial_kernel_draws_as_searchsorted_right_then_clamps(path):
    """The kernel's draw on a hand-made CDF: values landing exactly on a CDF entry go past it
    (``right=True``), and each row's last possible token bounds its draws."""
    from harness.sampling.device.kernels import build_trials

    device, total, k = path[0], 64, 3
    seed_state = int(torch_rng.hash_state(5))
    req = torch.arange(total)
    u = torch_rng.uniforms(torch_rng.hash64(5, req)[:, None], torch.arange(k)[None, :], Stream.DRAFT)
    v, w = float(u[0, 0]), float(u[1, 1])  # the CDFs end at 1: trial 0 draws exactly v at step 0, trial 1 w at step 1
    cdf = torch.tensor(
        [[v / 2, v / 2, v, v, 1, 1, 1, 1], [w / 2, w / 2, w / 2, w / 2, w, 1, 1, 1], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1]],
        dtype=torch.float64,
    )
    last = torch.tensor([6, 3, 5])  # per row, below the end: the clamp binds
    on = {"device": device}
    fields = dict(
        T=1, K=k, R=k + 1, D=k, position_range=1 << 20, sampled=True,
        counts=torch.tensor([k], **on), fixed=torch.full((1, k), -1, **on),
        row_offsets=torch.tensor([0], **on), draft_offsets=torch.tensor([0], **on),
        cdf=cdf.to(device), cdf_rows=torch.tensor([0], **on), cdf_last=last.to(device),
    )  # fmt: skip
    drafts = build_trials(seed_state, total, fields, random_positions=True)["drafts"][:, 0].cpu()
    expected = torch.stack([torch.minimum(torch.searchsorted(cdf[j], u[:, j] * cdf[j, -1], right=True), last[j]) for j in range(k)], 1)
    assert torch.equal(drafts, expected)
    assert expected[0, 0] == 4 and (expected[:, 1] == 3).any() and (expected[:, 2] == 5).any()  # ties go right; clamps bind


# Effective drafts per template: [1, 3, 4]; [0, 1, 3, 4]; [0, 0, 2] (templates without drafts, d < K);
# standard-sampled: drafts that differ from trial to trial.
def _outputs(s, templates, count: int):
    """Outputs of ``count`` trials, most well formed (the drafts as prefix, an in-vocabulary
    last token), some not (counts out of range, tokens outside the vocabulary)."""
    t_count, k, vocab = len(templates), s.max_drafts, s.vocab_size
    host_batch = trials(s, templates, 0, count)
    gen = np.random.default_rng(3)
    emitted = gen.integers(0, k + 3, size=count * t_count)
    tokens = gen.integers(-1, vocab + 1, size=(count * t_count, k + 1))
    flat = host_batch.drafts.reshape(count * t_count, k)
    good = gen.random(count * t_count) < 0.9
    tokens[good, :k] = flat[good]
    tokens[good, -1] = gen.integers(0, vocab, size=good.sum())
    return host_batch, tokens, emitted


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("name", ["standard-near-target", "greedy-ragged", "standard-zero-drafts", "standard-sampled"])
def test_device_tally_equals_host_tally_including_violations(name, path):
    s = SCENARIOS[name]
    templates = materialize(s)
    count, t_count, k, vocab = 400, len(templates), s.max_drafts, s.vocab_size
    host_batch, tokens, emitted = _outputs(s, templates, count)
    host = [TemplateTally(t.effective_drafts, vocab) for t in templates]
    add_outputs(host, tokens, emitted, host_batch.drafts, 0)
    dev = DeviceTally([t.effective_drafts for t in templates], vocab, count, k, path[0], kernels=path[1])
    half = count // 2 * t_count  # two chunks, the second first: order must not matter
    on = {"device": path[0]}
    dev.add(torch.tensor(tokens[half:], **on), torch.tensor(emitted[half:], **on), count // 2)
    dev.add(torch.tensor(tokens[:half], **on), torch.tensor(emitted[:half], **on), 0)
    for h, d in zip(host, dev.finish(torch.tensor(host_batch.drafts, **on))):
        assert h.violations > 0 and (h.trials, h.violations, h.example) == (d.trials, d.violations, d.example)
        assert np.array_equal(h.outcome, d.outcome) and np.array_equal(h.steps, d.steps)


@pytest.mark.parametrize("path", PATHS[1:], indirect=True)
@pytest.mark.parametrize("copies", [1, 2, 5])
def test_the_tally_kernel_counts_the_same_into_any_number_of_copies(copies, path):
    """The kernel's programs add into ``copies`` copies of the cells, summed at the end."""
    from harness.sampling.device.kernels import tally

    s = SCENARIOS["standard-sampled"]
    templates = materialize(s)
    count, t_count, k = 1000, len(templates), s.max_drafts  # 8 programs of 256 lanes
    host_batch, tokens, emitted = _outputs(s, templates, count)
    dev = DeviceTally([t.effective_drafts for t in templates], s.vocab_size, count, k, path[0], kernels=False)
    dev.add(torch.tensor(tokens, device=path[0]), torch.tensor(emitted, device=path[0]), 0)
    drafts = torch.tensor(host_batch.drafts, device=path[0])
    sizes = [(t.effective_drafts + 1) * s.vocab_size for t in templates]
    at = np.cumsum([0] + sizes[:-1])
    offsets = torch.tensor(np.stack([[t.effective_drafts for t in templates], at, sum(sizes) + 2 * at]), device=path[0])
    expected = dev._count(dev.tokens, dev.emitted, drafts, *offsets, 3 * sum(sizes))
    got = tally(dev.tokens, dev.emitted, drafts, s.vocab_size, offsets, 3 * sum(sizes), copies=copies)
    assert int(expected[3 * sum(sizes) : 3 * sum(sizes) + t_count].sum()) > 0  # violations counted too
    assert torch.equal(got, expected)


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_device_tally_of_no_trials_is_empty(path):
    s = SCENARIOS["greedy-ragged"]
    templates = materialize(s)
    effective = [t.effective_drafts for t in templates]
    tallies = DeviceTally(effective, s.vocab_size, 0, s.max_drafts, path[0], kernels=path[1]).finish(
        torch.zeros((0, len(templates), s.max_drafts), dtype=torch.int64, device=path[0])
    )
    assert [(t.trials, t.violations, t.outcome.sum(), t.steps.sum()) for t in tallies] == [(0, 0, 0, 0)] * len(templates)
    assert [t.outcome.shape for t in tallies] == [(d + 1, s.vocab_size) for d in effective]


def _stationary(dtype="float32", temperature=1.0, method="standard"):
    return Scenario(
        name="stationary",
        method=method,
        vocab_size=67,
        requests=(RequestSpec(3, temperature, "peaked", "near-target", stationary=True),),
        dtype=dtype,
    )


def test_stationary_requests_repeat_one_target_row_and_one_draft_row():
    (t,) = materialize(_stationary())
    assert np.array_equal(t.target_logits, np.repeat(t.target_logits[:1], 4, axis=0))
    assert np.array_equal(t.draft_logits, np.repeat(t.draft_logits[:1], 3, axis=0))
    with pytest.raises(ValueError, match="stationary"):
        Scenario(name="x", method="standard", vocab_size=8, requests=(RequestSpec(1, stationary="yes"),))


def test_shared_rows_are_stride_0_views_of_the_same_values():
    s = _stationary()
    templates = materialize(s)
    built = device_trials.DeviceTrials(s, templates, "cpu", share_rows=True)
    built.prepare(9)
    batch, _ = built.chunk(0, 9)
    host = trials(s, templates, 0, 9).batch
    for field in ("target_logits", "draft_logits"):
        got = getattr(batch, field)
        assert got.stride(0) == 0 and np.array_equal(got.numpy(), getattr(host, field)), field
    # Rows that differ are repeated, whatever the backend accepts.
    s = SCENARIOS["standard-near-target"]
    built = device_trials.DeviceTrials(s, materialize(s), "cpu", share_rows=True)
    built.prepare(2)
    assert built.chunk(0, 2)[0].target_logits.stride(0) != 0


def _materialized(batch):
    copy = {f: getattr(batch, f) for f in ("target_logits", "draft_logits")}
    return dataclasses.replace(batch, **{f: None if x is None else x.contiguous() for f, x in copy.items()})


@pytest.mark.parametrize("backend_name", ["triton", "vllm-mrv2"])
@pytest.mark.parametrize("dtype,temperature", [("float32", 1.0), ("bfloat16", 0.7), ("float32", 0.0)])
def test_backends_emit_the_same_tokens_from_shared_rows_as_from_copies(backend_name, dtype, temperature):
    """A shared row must be read as the row it is: the same tokens, trial for trial."""
    if backend_name == "vllm-mrv2":
        ok, why = vllm_mrv2.availability()
        if not ok:
            pytest.skip(f"vLLM not usable here: {why}")
    backend = load_backend(backend_name)
    assert backend.shared_rows
    s = _stationary(dtype, temperature, "standard")
    built = device_trials.DeviceTrials(s, materialize(s), "cpu", share_rows=True)
    built.prepare(64)
    batch, _ = built.chunk(0, 64)
    assert batch.target_logits.stride(0) == 0
    shared = [x.numpy() for x in backend.sample(batch)]
    copied = [x.numpy() for x in backend.sample(_materialized(batch))]
    assert np.array_equal(shared[0], copied[0]) and np.array_equal(shared[1], copied[1])
    if temperature > 0:  # some drafts accepted, some rejected: later rows were read too
        assert 1 < shared[1].mean() < 4


@pytest.mark.parametrize("path", PATHS[1:], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_repeat_rows_equals_torch_repeat_bit_for_bit(path, dtype):
    from harness.sampling.device.kernels import repeat_rows

    # Blocks of 111, 1000 and 4500 elements: each tile width, and a block wider than one tile.
    for rows, width in ((3, 37), (2, 500), (3, 1500)):
        block = torch.randn(rows, width, generator=torch.Generator().manual_seed(0)).to(dtype)
        block[1, 5] = float("nan")
        block[-1, 0] = float("-inf")
        block = block.to(path[0])
        for count in (0, 1, 2, 70):  # 70 copies: more than one program's, the last program partial
            want, got = block.repeat(count, 1), repeat_rows(block, count)
            assert got.shape == want.shape and got.dtype == want.dtype
            bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
            assert torch.equal(got.view(bits), want.view(bits))  # NaN payloads too
