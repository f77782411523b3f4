"""The benchmarks' hooks into the fused path (issue 3): launch constants set from the command
line (``bench_kernels.set_constants``) and the call cut after its first kernels
(``ab_fused.cut_after``). Both time variants of the sampler on a GPU without a second copy of
its code, so both must do what they say; checked here under the interpreter."""

import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
pytest.importorskip("triton", reason="the Triton backend needs triton")

from benchmarks import ab_fused, bench_kernels  # noqa: E402
from harness.backends import triton_fused as tf  # noqa: E402
from harness.backends.triton_sampler import verify  # noqa: E402


@pytest.fixture
def restored(monkeypatch):
    """Whatever a test sets in ``triton_fused`` is put back after it."""
    for name in (*bench_kernels.TUNABLE, "launch_each"):
        monkeypatch.setattr(tf, name, getattr(tf, name))


def _call(b=3, k=2, vocab=300):
    """A fused call of standard requests with draft probabilities, several vocabulary splits."""
    g = torch.Generator().manual_seed(0)
    target = torch.randn(b * (k + 1), vocab, generator=g)
    draft = torch.randn(b * k, vocab, generator=g)
    drafts = torch.randint(0, vocab, (b * k,), generator=g)
    cu = torch.arange(0, b * k + 1, k)
    positions = torch.arange(b * (k + 1)) + 7
    methods = torch.zeros(b, dtype=torch.int8)
    temperature = torch.ones(b, dtype=torch.float64)
    seeds = torch.arange(b) + 11
    return lambda: verify(
        target, draft, drafts, cu, temperature, seeds, positions, methods, None, k,
        has_strict=False, has_block=False, has_synthetic=False, path="fused", block_v=64, splits=3,
    )  # fmt: skip


@pytest.mark.parametrize(
    "spec",
    ["FOO=1", "_STATS_PROGRAMS", "STATS_PROGRAMS=0", "STATS_PROGRAMS=x", "MASS_MAX_TILES=-2", "STATS_PROGRAMS=64,BAR=2"],
)
def test_set_constants_rejects_bad_input_before_setting_any(spec, restored):
    before = {name: getattr(tf, name) for name in bench_kernels.TUNABLE}
    with pytest.raises(ValueError, match="set_constants"):
        bench_kernels.set_constants(spec)
    assert {name: getattr(tf, name) for name in bench_kernels.TUNABLE} == before


def test_set_constants_leave_the_tokens_as_they_were(restored):
    """The constants only spread the work over programs: one program each for all the splits
    and tiles it may take gives the same tokens."""
    call = _call()
    tokens, emitted = call()
    assert bench_kernels.set_constants("STATS_PROGRAMS=1, _MASS_PROGRAMS=1,MASS_MAX_TILES=8, PICK_IN_MASS_MAX_BLOCKS=0") == {
        "_STATS_PROGRAMS": 1,
        "_MASS_PROGRAMS": 1,
        "_MASS_MAX_TILES": 8,
        "_PICK_IN_MASS_MAX_BLOCKS": 0,
    }
    assert tf._stats_splits_per_program(6, 3) == 3  # the setting reached the plan
    again, emitted_again = call()
    assert torch.equal(tokens, again) and torch.equal(emitted, emitted_again)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_cut_after_launches_the_first_kernels_only(n, restored):
    ab_fused.cut_after(n)
    _call()()
    kernels = ["_fused_stats_kernel", "_fused_chain_kernel", "_fused_candidate_kernel", "_fused_mass_kernel"]
    assert ab_fused.LAUNCHED == kernels[:n]
