"""The device path (inputs built and outputs tallied where the backend runs) equals the host path bit for bit."""

import numpy as np
import pytest
import torch

from harness import device_trials
from harness.catalog import catalog
from harness.device_tally import DeviceTally
from harness.profiles import get_profile
from harness.scenarios import materialize, trials
from harness.tally import TemplateTally, add_outputs
from reference import rng
from reference.rng import Stream

SCENARIOS = {s.name: s for s in catalog(get_profile("smoke"), 0)}


def test_hash_and_uniforms_match_the_reference_bit_for_bit():
    keys = np.array([0, 1, 2, 12345, 2**40 + 7, 2**62 + 11, 2**63 - 1], dtype=np.int64)
    for a in keys:
        expected = rng.hash64(int(a), keys, 3)
        assert np.array_equal(device_trials.hash64(int(a), torch.from_numpy(keys), 3).numpy(), expected)
    seeds, positions = np.meshgrid(keys, keys)
    for stream in Stream:
        expected = rng.uniforms(seeds, positions, stream)
        got = device_trials.uniforms(torch.from_numpy(seeds), torch.from_numpy(positions), stream).numpy()
        assert np.array_equal(got, expected)


@pytest.mark.parametrize(
    "name",
    ["standard-sampled", "standard-permuted-slots", "synthetic-mixed-batch", "standard-zero-drafts", "block-placeholder", "standard-bf16"],
)
def test_device_batches_equal_host_batches(name):
    s = SCENARIOS[name]
    templates = materialize(s)
    built = device_trials.DeviceTrials(s, templates, "cpu")
    built.prepare(1007)
    for first, count in ((0, 5), (5, 5), (1000, 7)):
        host = trials(s, templates, first, count)
        batch, drafts = built.chunk(first, count)
        assert np.array_equal(drafts.numpy(), host.drafts)
        for field in ("draft_tokens", "cu_num_drafts", "temperature", "seeds", "positions", "methods", "synthetic_rates", "request_slots"):
            want, got = getattr(host.batch, field), getattr(batch, field)
            assert (want is None) == (got is None), field
            if want is not None:
                assert np.array_equal(got.numpy(), want), field
        for field in ("target_logits", "draft_logits"):
            want, got = getattr(host.batch, field), getattr(batch, field)
            assert (want is None) == (got is None), field
            if want is not None:
                assert np.array_equal(got.float().numpy(), want, equal_nan=True), field
        assert batch.logits_dtype == s.dtype and batch.max_drafts == host.batch.max_drafts
    with pytest.raises(ValueError, match="outside the prepared range"):
        built.chunk(1005, 5)


def test_device_tally_equals_host_tally_including_violations():
    s = SCENARIOS["standard-near-target"]
    templates = materialize(s)
    count, t_count, k, vocab = 400, len(templates), s.max_drafts, s.vocab_size
    host_batch = trials(s, templates, 0, count)
    gen = np.random.default_rng(3)
    emitted = gen.integers(0, k + 3, size=count * t_count)  # some counts out of range: violations
    tokens = gen.integers(-1, vocab + 1, size=(count * t_count, k + 1))
    # Most trials well formed: the drafts as prefix, an in-vocabulary last token.
    flat = host_batch.drafts.reshape(count * t_count, k)
    good = gen.random(count * t_count) < 0.9
    tokens[good, :k] = flat[good]
    tokens[good, -1] = gen.integers(0, vocab, size=good.sum())
    host = [TemplateTally(t.effective_drafts, vocab) for t in templates]
    add_outputs(host, tokens, emitted, host_batch.drafts, 0)
    dev = DeviceTally([t.effective_drafts for t in templates], vocab, count, k, "cpu")
    half = count // 2 * t_count  # two chunks, the second first: order must not matter
    dev.add(torch.from_numpy(tokens[half:]), torch.from_numpy(emitted[half:]), count // 2)
    dev.add(torch.from_numpy(tokens[:half]), torch.from_numpy(emitted[:half]), 0)
    for h, d in zip(host, dev.finish(torch.from_numpy(host_batch.drafts))):
        assert h.violations > 0 and (h.trials, h.violations, h.example) == (d.trials, d.violations, d.example)
        assert np.array_equal(h.outcome, d.outcome) and np.array_equal(h.steps, d.steps)
