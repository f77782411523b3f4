"""The Triton sampler's fused path against its staged path (``harness/backends/triton/fused.py``,
taken by default up to ``Tunables.fused_max_requests_cpu`` requests a call in the interpreter).

On a CPU-only machine the kernels run under the Triton interpreter (``conftest.py`` sets
TRITON_INTERPRET=1 before Triton is imported). What is checked: the same outputs token for token
on random mixed batches, with every variant of the fused launch plan (a pick kernel of its own,
the benchmarks' tunables, inputs read before or after the wait, equal draft counts, several splits
a program); no read of an unwritten scratch slot; the fused chain kernel's final statistics bit
for bit; the plan's spans and tiles; and the dispatch rule (planted faults always staged).
On CUDA: ``test_triton_gpu.py``.
"""

import dataclasses
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
triton = pytest.importorskip("triton", reason="the Triton backend needs triton")

from harness.backends.triton import fused as tf  # noqa: E402
from harness.backends.triton.backend import TritonBackend, takes_fused_path  # noqa: E402
from harness.backends.triton.common import tile_plan  # noqa: E402
from harness.backends.triton.fused_plan import counters_and_flags, mass_span, stats_splits_per_program, stats_width  # noqa: E402
from harness.backends.triton.staged_jobs import Stats  # noqa: E402
from harness.backends.triton.tunables import DEFAULT_TUNABLES, Tunables  # noqa: E402
from harness.backends.triton.variants import TritonFaultBackend  # noqa: E402
from harness.protocol import as_numpy_outputs  # noqa: E402
from suites.helpers import (  # noqa: E402
    any_requests,
    assert_same_outputs,
    assert_stats_equal,
    build_batch,
    fused_scratch,
    mixed_requests,
    rows_with_drafts,
    sample_triton,
    staged_group,
)

# The interpreter computes Philox's wrapping uint32 products with NumPy, which warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.*")


FUSED_CASES = [  # vocab, draft vocab, draft logits, tiles
    (300, 300, True, {}),  # one tile, one split
    (1025, 700, True, {"block_v": 256, "splits": 3}),  # a narrower draft vocabulary (3 splits each)
    (1025, 256, True, {"block_v": 256, "splits": 3}),  # a draft vocabulary of one split, the target's of 3
    (33, 33, False, {"block_v": 8, "splits": 2}),  # no draft logits; partial last tile
    (7, 5, True, {"block_v": 4, "splits": 3}),  # tiles and splits past a tiny vocabulary
    (2, 2, True, {}),
]


def _mixed_batch(vocab, draft_vocab, with_draft, seed):
    """Thirty mixed requests of up to 5 drafts over a ``FUSED_CASES`` vocabulary (rng ``[vocab, seed]``)."""
    rng = np.random.default_rng([vocab, seed])
    return build_batch(any_requests(rng, vocab, 30, draft_vocab, int(rng.integers(1, 6))), vocab, draft_vocab, with_draft)


def _assert_fused_equals_staged(vocab, draft_vocab, with_draft, tiles, seed, tunables=DEFAULT_TUNABLES):
    """The fused path's outputs (with ``tunables``) are the staged path's on ``_mixed_batch``."""
    batch = _mixed_batch(vocab, draft_vocab, with_draft, seed)
    fused = sample_triton(batch, path="fused", tunables=tunables, **tiles)
    assert_same_outputs(fused, sample_triton(batch, path="staged", **tiles), batch)


@pytest.mark.parametrize(
    "vocab,draft_vocab,with_draft,tiles",
    FUSED_CASES,
    ids=["V300", "V1025-draft700-split3", "V1025-draft256-split3-1", "V33-no-draft-split2", "V7-draft5-split3", "V2"],
)
def test_fused_equals_staged(vocab, draft_vocab, with_draft, tiles):
    """The fused path's outputs are the staged path's, token for token, on mixed batches
    (the same tiles, reductions and counter-based uniforms drive the same decisions)."""
    for seed in range(3):
        _assert_fused_equals_staged(vocab, draft_vocab, with_draft, tiles, seed)


def test_fused_pick_in_a_kernel_of_its_own_equals_staged():
    """Above ``Tunables.pick_in_mass_max_blocks`` request blocks (large batches on CUDA) the fused
    path picks in a fourth kernel: the same tokens (the interpreter's one block picks in the mass kernel)."""
    tunables = dataclasses.replace(DEFAULT_TUNABLES, pick_in_mass_max_blocks=0)
    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES[:4]:
        _assert_fused_equals_staged(vocab, draft_vocab, with_draft, tiles, 13, tunables)


def test_fused_launch_constants_leave_the_tokens_as_they_were():
    """The launch constants a GPU is tuned by (``benchmarks/bench_kernels.py --set``) only spread
    the work over programs: all splits in one statistics program, eight tiles in one mass
    program and a pick kernel of its own give the staged path's tokens."""
    tunables = dataclasses.replace(DEFAULT_TUNABLES, stats_programs=1, mass_programs=1, mass_max_tiles=8, pick_in_mass_max_blocks=0)
    assert stats_splits_per_program(6, 3, tunables) == 3  # the settings reach the plan
    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES[:4]:
        _assert_fused_equals_staged(vocab, draft_vocab, with_draft, tiles, 17, tunables)


def test_fused_chain_kernel_reads_its_inputs_first_or_after_with_the_same_bits(monkeypatch):
    """The chain kernel reads the drafts, their logits and uniforms before its wait and takes the
    statistics it merged from registers up to ``Tunables.inputs_first_max_steps`` steps, else after the
    merge and from the statistics loaded back: forced each way at every K, the scratch is the
    same bit for bit (final statistics, the chain, block verification's running ratios, the
    masses), and the tokens are the staged path's."""
    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES:
        batch = _mixed_batch(vocab, draft_vocab, with_draft, 19)
        scratches, outputs = [], []
        for max_steps in (0, 64):
            tunables = dataclasses.replace(DEFAULT_TUNABLES, inputs_first_max_steps=max_steps)

            def run(batch=batch, tiles=tiles, outputs=outputs, tunables=tunables):
                outputs.append(sample_triton(batch, path="fused", tunables=tunables, **tiles))

            scratches.append(fused_scratch(monkeypatch, run).view(torch.int64))
        same = scratches[0] == scratches[1]
        assert bool(same.all()), f"V = {vocab}: {int((~same).sum())} scratch slots differ between the two orders"
        staged = sample_triton(batch, path="staged", **tiles)
        for fused in outputs:
            assert_same_outputs(fused, staged, batch)


def _equal_counts_batch(vocab, draft_vocab, with_draft, k, seed):
    """About forty mixed requests (``any_requests``) of exactly ``k`` drafts each."""
    rng = np.random.default_rng([vocab, k, seed])
    requests = [q for q in any_requests(rng, vocab, 40 * (k + 1), draft_vocab, k) if len(q["drafts"]) == k]
    return build_batch(requests, vocab, draft_vocab, with_draft)


@pytest.mark.parametrize("k", [1, 3])
def test_fused_batch_of_equal_draft_counts_finds_its_rows_without_cu(monkeypatch, k):
    """Where every request has K drafts (the host knows: B K draft tokens) the statistics kernel
    finds its rows as r (K + 1) + k and r K + k, with no load of ``cu`` before its reads; the
    tokens are the staged path's. A ragged batch is told apart and loads ``cu``."""
    told = []
    real_launch = tf.launch

    def spy(fn, grid, *args, **options):
        if fn is tf._fused_stats_kernel:
            told.append(dict(zip(fn.arg_names, args))["EQUAL_COUNTS"])
        return real_launch(fn, grid, *args, **options)

    monkeypatch.setattr(tf, "launch", spy)
    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES:
        batch = _equal_counts_batch(vocab, draft_vocab, with_draft, k, 23)
        assert (np.diff(batch.cu_num_drafts) == k).all() and batch.num_requests > 10
        assert_same_outputs(sample_triton(batch, path="fused", **tiles), sample_triton(batch, path="staged", **tiles), batch)
        assert told[-1] is True, "the batch's equal draft counts were not told to the statistics kernel"
    _assert_fused_equals_staged(*FUSED_CASES[0], 1)  # a ragged batch
    assert told[-1] is False, "a ragged batch was taken for one of equal draft counts"


def test_fused_reads_only_what_it_wrote(monkeypatch):
    """With its float64 scratch allocated full of NaN, the fused path still gives the staged
    path's outputs: no kernel reads a slot no earlier kernel wrote (a request's last target
    row has no statistics; its draws, greedy and degenerate decisions come from its tiles)."""
    real_empty = torch.empty

    def poisoned(*shape, **kwargs):
        out = real_empty(*shape, **kwargs)
        return out.fill_(math.nan) if out.dtype == torch.float64 else out

    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES[:4]:
        batch = _mixed_batch(vocab, draft_vocab, with_draft, 11)
        staged = sample_triton(batch, path="staged", **tiles)
        monkeypatch.setattr(torch, "empty", poisoned)
        try:
            fused = sample_triton(batch, path="fused", **tiles)
        finally:
            monkeypatch.setattr(torch, "empty", real_empty)
        assert_same_outputs(fused, staged, batch)


@pytest.mark.parametrize("splits_per_program", [1, 2])
def test_fused_final_statistics_are_the_staged_ones(monkeypatch, splits_per_program):
    """The fused chain kernel's merge of split statistics stores the staged path's final
    statistics bit for bit (max, log-sum, argmax, degenerate flag) for every draft row and
    every target row but a request's last: a merge that drifts moves draws only near a
    boundary, but moves these. Also with two splits per statistics program (large batches
    on CUDA): a split's partials do not depend on which program reads it."""
    # One statistics program a call at most: each reads min(splits_per_program, NSPLIT) splits.
    tunables = dataclasses.replace(DEFAULT_TUNABLES, stats_programs=1, stats_max_splits=splits_per_program)
    assert stats_splits_per_program(1000, 3, tunables) == min(splits_per_program, 3)
    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES:
        block_v, splits = tiles.get("block_v"), tiles.get("splits")
        if not splits:
            continue  # one split everywhere: the stats kernel stores final statistics itself
        batch = _mixed_batch(vocab, draft_vocab, with_draft, 7)
        scratch = fused_scratch(
            monkeypatch, lambda batch=batch, tiles=tiles: sample_triton(batch, path="fused", tunables=tunables, **tiles)
        )
        t = batch.to_torch("cpu")
        counts = torch.diff(torch.as_tensor(batch.cu_num_drafts))
        temperature = t["temperature"].to(torch.float64)
        # Final statistics: the chain kernel's (before the mass counters and flags) for a side of several
        # splits, else the stats kernel's own (target at 0, draft after the target's partials).
        n_t, n_d = len(batch.target_logits), len(batch.draft_tokens) if with_draft else 0
        t_split = tile_plan(vocab, False, block_v, splits)[2]
        d_split = tile_plan(draft_vocab, False, block_v, splits)[2] if with_draft else 1
        at = (
            len(scratch) - counters_and_flags(len(counts)) - 4 * (n_t * (t_split > 1) + n_d * (d_split > 1))
        )  # before the counters and flags
        t_at = at if t_split > 1 else 0
        d_at = at + 4 * n_t * (t_split > 1) if d_split > 1 else 4 * n_t * t_split
        sides = [(t["target_logits"], torch.repeat_interleave(torch.arange(len(counts)), counts + 1), t_at, rows_with_drafts(counts))]
        if with_draft:
            sides.append((t["draft_logits"], torch.repeat_interleave(torch.arange(len(counts)), counts), d_at, None))
        for logits, owner, start, rows in sides:
            group = staged_group(vocab, False, block_v, splits) if rows is not None else 0
            want = Stats(logits.to(torch.float32), owner, temperature, False, (block_v, splits), group=group)
            sampled = (temperature[owner] > 0) & (want.bad == 0)
            assert torch.all(want.arg[sampled] == 2**31 - 1), "a sampled row's argmax is not computed (_NO_ID)"
            assert_stats_equal(scratch[start : start + 4 * len(owner)].view(4, -1), want, f"V={vocab}", rows=rows)


def test_mass_spans_cover_the_vocabulary_in_whole_tiles():
    """``fused_plan.mass_span``: whole tiles, one each at small batches, at most
    ``Tunables.mass_max_tiles`` and the row, about ``Tunables.mass_programs`` programs a call at large batches."""
    for vocab in (2, 3000, 32000, 131072, 152064, 262144):
        block_v = tile_plan(vocab, cuda=True)[0]
        n_tiles = -(-vocab // block_v)
        for blocks in (1, 3, 17, 64, 256, 1024):
            span = mass_span(blocks, n_tiles, block_v)
            assert span % block_v == 0 and block_v <= span <= min(DEFAULT_TUNABLES.mass_max_tiles, n_tiles) * block_v
            if blocks * n_tiles < 2 * DEFAULT_TUNABLES.mass_programs:
                assert span == block_v, (vocab, blocks, span)
            else:
                assert span == DEFAULT_TUNABLES.mass_max_tiles * block_v or blocks * -(-vocab // span) >= DEFAULT_TUNABLES.mass_programs, (
                    vocab,
                    blocks,
                    span,
                )


def test_statistics_tile_is_the_split_where_it_fits():
    """``fused_plan.stats_width``: on CUDA one tile per split up to ``Tunables.stats_max_width`` ids (a power of
    two, as Triton's ranges), else the staged tile; the interpreter keeps its large tiles."""
    for vocab in (2, 3000, 4096, 32000, 131072, 152064, 262144):
        block_v, _, nsplit, split_len = tile_plan(vocab, cuda=True)
        width = stats_width(split_len, block_v, cuda=True)
        assert width == split_len <= DEFAULT_TUNABLES.stats_max_width and nsplit * width >= vocab, (vocab, width, split_len)
    assert stats_width(6144, 2048, cuda=True) == 2048  # a split of three tiles is read tile by tile
    assert stats_width(8192, 2048, cuda=True) == 2048  # wider than the register budget
    assert stats_width(4096, 65536, cuda=False) == 65536


def test_path_dispatch():
    """auto: fused up to ``fused_max_requests`` requests, staged above; a planted fault always staged."""
    assert takes_fused_path("auto", DEFAULT_TUNABLES.fused_max_requests_cpu) and not takes_fused_path(
        "auto", DEFAULT_TUNABLES.fused_max_requests_cpu + 1
    )
    assert takes_fused_path("auto", 10, fused_max_requests=10) and not takes_fused_path("auto", 11, fused_max_requests=10)
    assert takes_fused_path("fused", 10**6) and not takes_fused_path("staged", 1)
    assert not takes_fused_path("fused", 1, fault=3) and not takes_fused_path("auto", 1, fault=3)
    # CUDA: logits per row position (8,388 requests at V = 32000, 2,048 at 131072, 1,024 at 262,144)
    for b, v in ((8388, 32000), (2048, 131072), (1024, 262144)):
        assert takes_fused_path("auto", b, cuda=True, vocab=v) and not takes_fused_path("auto", b + 1, cuda=True, vocab=v)
    with pytest.raises(ValueError, match="path"):
        TritonBackend(path="fast")


def test_faults_take_the_staged_path(monkeypatch):
    """A planted fault lives in the staged kernels: a fault backend never calls the fused path."""

    def refuse(*args, **kwargs):
        raise AssertionError("the fused path ran a planted fault")

    monkeypatch.setattr(tf, "verify_fused", refuse)
    batch = build_batch(mixed_requests(np.random.default_rng(1), 16, 4), 16)
    tokens, emitted = as_numpy_outputs(TritonFaultBackend("bonus-wrong-row").sample(batch), batch.num_requests, batch.max_drafts)
    assert np.all((emitted >= 1) & (emitted <= batch.max_drafts + 1))
    with pytest.raises(AssertionError, match="fused path ran"):
        sample_triton(batch, path="fused")


def test_tunables_are_frozen_and_reach_the_fused_plan_through_the_backend(monkeypatch):
    """``Tunables`` is frozen (a variant is a ``dataclasses.replace``, never an assignment), the
    backend refuses anything else, and a backend's tunables reach the fused plan: with no pick in
    the mass kernel the call launches a pick kernel of its own."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_TUNABLES.candidates = 0
    with pytest.raises(TypeError, match="Tunables"):
        TritonBackend(tunables={"candidates": 0})
    launched = []
    real_launch_each = tf.launch_each
    monkeypatch.setattr(
        tf, "launch_each", lambda launches, *a: launched.append([fn.__name__ for fn, _, _ in launches]) or real_launch_each(launches, *a)
    )
    batch = _mixed_batch(300, 300, True, 29)
    for tunables, pick in ((DEFAULT_TUNABLES, False), (Tunables(pick_in_mass_max_blocks=0), True)):
        sample_triton(batch, path="fused", tunables=tunables)
        assert ("_fused_pick_kernel" in launched[-1]) is pick, launched[-1]
