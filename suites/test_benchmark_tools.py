"""The benchmarks' hooks into the fused path: launch constants read from the command
line into the sampler's ``Tunables`` (``bench_kernels.parse_tunables``) and the call cut after its
first kernels (``ab_fused.cut_after``). Both time variants of the sampler on a GPU without a second
copy of its code, so both must do what they say; checked here under the interpreter. That the
constants leave the tokens as they were: ``suites/test_triton_paths.py``. Also the streaming floor's
kernels (``benchmarks/stream_floor.py``): each computes what it claims, so its times say what
the least work over the sampler's bytes takes."""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
pytest.importorskip("triton", reason="the Triton backend needs triton")

from benchmarks import ab_fused, bench_kernels, stream_floor  # noqa: E402
from harness.backends.triton import fused as tf  # noqa: E402
from harness.backends.triton.tunables import DEFAULT_TUNABLES, Tunables  # noqa: E402
from suites.helpers import any_requests, build_batch, sample_triton  # noqa: E402


@pytest.fixture
def restored(monkeypatch):
    """What a test replaces in ``triton_fused`` (``cut_after``: its ``launch_each``) is put back after it."""
    monkeypatch.setattr(tf, "launch_each", tf.launch_each)


@pytest.mark.parametrize(
    "spec",
    [
        "FOO=1",
        "_STATS_PROGRAMS",
        "STATS_PROGRAMS=0",
        "STATS_PROGRAMS=x",
        "MASS_MAX_TILES=-2",
        "STATS_PROGRAMS=64,BAR=2",
        "STATS_MAX_REGISTERS=31",
        "STATS_PROGRAMS=64,STATS_MAX_REGISTERS=256",
    ],
)
def test_set_constants_rejects_bad_input_before_setting_any(spec, restored):
    """A bad ``--set`` / ``AB_SET`` spec raises before any variant is made; the defaults stay."""
    before = dataclasses.asdict(DEFAULT_TUNABLES)
    with pytest.raises(ValueError, match="parse_tunables"):
        bench_kernels.parse_tunables(spec)
    with pytest.raises(ValueError, match="parse_tunables"):
        bench_kernels.tunables_from(spec)
    assert dataclasses.asdict(DEFAULT_TUNABLES) == before == dataclasses.asdict(Tunables())


def test_set_constants_sets_the_fused_module(restored):
    """A ``--set`` / ``AB_SET`` spec gives the fused path's variant: names as the module constants
    were spelled (any case, a leading underscore or not) name ``Tunables`` fields, and the variant
    is a replace of the defaults, which stay as they were (the name predates ``Tunables``: the
    spec once assigned module globals of ``fused``)."""
    wanted = {"stats_programs": 1, "mass_programs": 1, "mass_max_tiles": 8, "pick_in_mass_max_blocks": 0, "stats_max_registers": 255}
    spec = "STATS_PROGRAMS=1, _MASS_PROGRAMS=1,mass_max_tiles=8, PICK_IN_MASS_MAX_BLOCKS=0,_stats_max_registers=255"
    assert bench_kernels.parse_tunables(spec) == wanted
    variant = bench_kernels.tunables_from(spec)
    assert {name: getattr(variant, name) for name in wanted} == wanted
    assert variant == dataclasses.replace(DEFAULT_TUNABLES, **wanted) != DEFAULT_TUNABLES
    assert set(bench_kernels.TUNABLE) <= {f.name for f in dataclasses.fields(Tunables)}


@pytest.mark.parametrize("n", [1, 2, 4])
def test_cut_after_launches_the_first_kernels_only(n, restored):
    rng = np.random.default_rng(0)
    vocab = 300
    batch = build_batch(any_requests(rng, vocab, 3, vocab, 2), vocab)
    ab_fused.cut_after(n)
    sample_triton(batch, path="fused")
    kernels = ["_fused_stats_kernel", "_fused_chain_kernel", "_fused_candidate_kernel", "_fused_mass_kernel"]
    assert ab_fused.LAUNCHED == kernels[:n]


def _floor_inputs(b, k, v, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"target": torch.randn(b * (k + 1), v, generator=g), "draft": torch.randn(b, k, v, generator=g).to(torch.bfloat16)}


@pytest.mark.parametrize("with_sum", [False, True])
def test_split_floor_gives_each_splits_max_and_sum(with_sum):
    b, k, v = 3, 2, 2 * stream_floor.SPLIT + 100  # a last split cut short
    x = _floor_inputs(b, k, v)
    target, draft = stream_floor._rows(x, b, k, v)
    want = stream_floor.lane_major(stream_floor.expected_rows(target, draft, v), b * k)
    stream_floor.check("split", stream_floor.split_floor(x, b, k, v, with_sum)(), want, with_sum)
    with pytest.raises(AssertionError, match="split"):  # the check can fail: another row's splits
        stream_floor.check("split", stream_floor.split_floor(_floor_inputs(b, k, v, 1), b, k, v, with_sum)(), want, with_sum)


def test_two_phase_floor_reads_the_accepting_requests_bonus_rows():
    b, k, v = 7, 1, 3 * stream_floor.TILE + 5
    x = _floor_inputs(b, k, v)
    call, rows = stream_floor.two_phase(x, b, k, v)
    assert rows.tolist() == sorted(rows.tolist()) and len(rows) == round(stream_floor.ACCEPT_SHARE * b)
    assert all(row % (k + 1) == k for row in rows.tolist())  # bonus rows only
    stream_floor.check("bonus", call(), stream_floor.expected_splits(x["target"][rows], v, stream_floor.TILE))


def test_tma_floor_gives_the_split_floors_values_and_refuses_a_cut_split():
    b, k, v = 3, 2, 2 * stream_floor.SPLIT
    x = _floor_inputs(b, k, v)
    target, draft = stream_floor._rows(x, b, k, v)
    want = stream_floor.side_major(stream_floor.expected_rows(target, draft, v))
    stream_floor.check("tma", stream_floor.tma_floor(x, b, k, v, stages=3, programs=4)(), want)
    assert stream_floor.tma_floor(_floor_inputs(b, k, v + 256), b, k, v + 256, stages=3, programs=4) is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shapes", "256,1"], "--shapes"),
        (["--shapes", "a,b,c"], "--shapes"),
        (["--shapes", "256,0,131072"], "--shapes"),
        (["--stages", "0"], "--stages"),
        (["--stages", "3,x"], "--stages"),
        (["--reps", "0"], "--reps"),
    ],
)
def test_stream_floor_refuses_bad_arguments_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        stream_floor.main(argv)
    assert e.value.code == 2 and f"error: {message}:" in capsys.readouterr().err


def test_split_floor_refuses_an_unknown_row_mode():
    with pytest.raises(ValueError, match="rows must be 0, 1 or 2"):
        stream_floor.split_floor(_floor_inputs(1, 1, 8), 1, 1, 8, True, 3)


@pytest.mark.parametrize("rows", [1, 2])
def test_split_floor_reads_the_rows_cu_names_when_loaded_or_guessed(rows):
    b, k, v = 3, 2, stream_floor.SPLIT + 7
    x = _floor_inputs(b, k, v)
    x["target"], x["draft"] = torch.cat([x["target"], x["target"][:2]]), torch.cat([x["draft"].reshape(b * k, v), x["draft"][0]])
    x["cu"] = torch.tensor([0, 3, 5, 7])  # request 0 has 3 drafts: the others' rows are not at r K
    x["temperature"] = torch.tensor([0.5, 1.0, 2.0])  # the modes that load it scale by 1 / T
    lanes = [(r, j) for r in range(b) for j in range(k)]
    target = torch.stack([x["target"][x["cu"][r] + r + j] for r, j in lanes])
    draft = torch.stack([x["draft"][x["cu"][r] + j] for r, j in lanes])
    want = stream_floor.lane_major(stream_floor.expected_rows(target, draft, v, x["temperature"].repeat_interleave(k)), b * k)
    stream_floor.check("rows", stream_floor.split_floor(x, b, k, v, True, rows)(), want)
    with pytest.raises(AssertionError, match="rows"):  # rows taken as r K, T = 1: other rows and sums
        stream_floor.check("rows", stream_floor.split_floor(x, b, k, v, True, 0)(), want)
    with pytest.raises(AssertionError, match="sums"):  # the right rows, scaled as if T = 1
        stream_floor.check(
            "rows",
            stream_floor.split_floor(x, b, k, v, True, rows)(),
            stream_floor.lane_major(stream_floor.expected_rows(target, draft, v), b * k),
        )
