"""The fused kernels as this machine's Triton compiles them for an H100 (sm_90), on the CPU machine.

Triton picks a register layout per tile. Twice a kernel change made it lay a
2048-wide vocabulary tile out a second way and convert between the two: a shared-memory
round trip per tile and 16,000 lines of PTX instead of 1,600, found only by timing on a GPU.
These tests plan the fused path's CUDA launches (tiles, grids, arguments) for a few batches,
compile each kernel for sm_90 with the argument specialization Triton's JIT would use (the
bundled compiler, no GPU: ``harness/backends/triton/compile_info.py``), and fail where a tile as wide as a vocabulary tile changes layout.
The interpreter, which the rest of the CPU suite runs, has no layouts, so the compiles run
in a child process without it (this file is its script). The layouts are the installed
Triton's (3.8 in CI); the GPU machines ran 3.6, whose layouts may differ.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
triton = pytest.importorskip("triton", reason="the Triton backend needs triton")

import triton.language as tl  # noqa: E402

from harness.backends.triton import fused as tf  # noqa: E402
from harness.backends.triton.common import candidates_for  # noqa: E402
from harness.backends.triton.compile_info import compile_sm90, cuda_launches  # noqa: E402
from harness.backends.triton.tunables import DEFAULT_TUNABLES  # noqa: E402

_ROOT = Path(__file__).resolve().parents[1]

_WIDE = 1024  # a tile at least this wide along one axis is a vocabulary tile (2048 on CUDA, 4096 in the fused statistics)
# Known and cheap: the draw's exclusion mask (``_tile_weights``: ``resid & (cols == excl)``), a
# 2048-bit tile that Triton 3.8 computes in another layout than the weights it masks.
_KNOWN_WIDE_CHANGE = re.compile(r"tensor<1x2048xi1,")


def _ttgir_sm90(fn, args, num_warps: int) -> str:
    """``fn``'s TTGIR for sm_90 (``compile_sm90``)."""
    return compile_sm90(fn, args, num_warps).asm["ttgir"]


def _wide_layout_changes(ttgir: str) -> list[str]:
    """``convert_layout`` ops on a tensor with an axis of at least ``_WIDE`` elements."""
    changes = []
    for line in re.findall(r"ttg\.convert_layout[^\n]*", ttgir):
        shape = re.search(r"tensor<((?:\d+x)+)", line)
        if shape and max(int(d) for d in shape.group(1).rstrip("x").split("x")) >= _WIDE:
            changes.append(re.sub(r"\s*loc\(.*", "", line))
    return changes


def _layout_changes(case: list) -> dict:
    """Per compiled kernel, its wide layout changes: the fused kernels of batch ``case`` (b, k,
    vocab, with_draft), or ``_transposed_store`` for ``["known-bad"]``."""
    if case == ["known-bad"]:
        launches = [(_transposed_store, (torch.zeros(8192), torch.zeros(8192), 2048), {})]
    else:
        launches = cuda_launches(*case)
    return {fn.__name__: _wide_layout_changes(_ttgir_sm90(fn, args, options.get("num_warps", 4))) for fn, args, options in launches}


def _compiled_in_child(case: list) -> dict:
    """``_layout_changes(case)`` (``_evict_first_hints()`` for ``["evict-first-hints"]``) in a child
    process without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    try:
        done = subprocess.run([sys.executable, __file__, json.dumps(case)], cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the sm_90 compile of {case} took over 600 s")
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines, f"the sm_90 compile of {case} failed:\n{done.stdout[-1000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1])


@triton.jit
def _transposed_store(src, dst, WIDTH: tl.constexpr):
    """A known layout change of a [4, WIDTH] tile (read row-major, stored transposed)."""
    ids = tl.arange(0, WIDTH)
    tile = tl.load(src + ids[:, None] * 4 + tl.arange(0, 4)[None, :])
    tl.store(dst + ids[None, :] + tl.arange(0, 4)[:, None] * WIDTH, tl.trans(tile))


def test_the_detector_sees_a_wide_layout_change():
    """The check below can fail: a kernel known to convert a [4, 2048] tile is flagged."""
    assert _compiled_in_child(["known-bad"])["_transposed_store"], "no layout change found: the detector proves nothing"


@pytest.mark.parametrize(
    "b,k,vocab,with_draft",
    [(1, 1, 32000, True), (64, 4, 131072, True), (3, 8, 152064, False)],
    ids=["B1-K1-V32000", "B64-K4-V131072", "B3-K8-V152064-no-draft"],
)
def test_fused_kernels_keep_one_layout_per_vocabulary_tile(b, k, vocab, with_draft):
    """Every fused kernel (statistics, chain, residual candidates, masses with or without the pick, the pick; strict,
    block and synthetic code included) compiles for sm_90 without changing the layout of a vocabulary-wide tile,
    but for the known mask (``_KNOWN_WIDE_CHANGE``, a 2048-wide boolean tile)."""
    changes = _compiled_in_child([b, k, vocab, with_draft])
    kernels = ["_fused_stats_kernel", "_fused_chain_kernel"] + (["_fused_candidate_kernel"] if candidates_for(vocab, True) else [])
    kernels += ["_fused_mass_kernel"]
    # One request per program at these vocabularies: B request blocks.
    assert list(changes) == kernels + ([] if b <= DEFAULT_TUNABLES.pick_in_mass_max_blocks else ["_fused_pick_kernel"])
    new = {name: [c for c in found if not _KNOWN_WIDE_CHANGE.search(c)] for name, found in changes.items()}
    new = {name: found for name, found in new.items() if found}
    assert not new, f"vocabulary tiles change layout: {new}"


@pytest.mark.parametrize("b", [1, 64])
def test_programmatic_dependent_launch_spares_the_first_kernel(b):
    """With programmatic dependent launch on, every fused kernel after the statistics kernel
    is launched with it (each waits for the previous one, ``gdc_wait``) and the statistics
    kernel without: it must wait for the caller's work (inputs written, scratch memory freed by
    earlier kernels) before it starts."""
    launches = cuda_launches(b, 4, 32000, True)
    assert [fn.__name__ for fn, _, _ in launches][0] == "_fused_stats_kernel"
    assert [options.get("launch_pdl", False) for _, _, options in launches] == [False] + [True] * (len(launches) - 1)
    # Every kernel's PDL flag is on: the statistics kernel's signals its dependents, the others' wait (gdc_wait).
    assert all(dict(zip(fn.arg_names, args))["PDL"] is True for fn, args, _ in launches)


@pytest.mark.parametrize(
    "b,vocab,flags,carried",
    [
        (256, 131072, {"has_strict": False, "has_block": False}, True),
        (256, 131072, {"has_block": False}, False),  # strict requests need n_eff from the chain
        (256, 131072, {"has_strict": False}, False),  # block verification its running ratios
        (256, 1024, {"has_strict": False, "has_block": False}, False),  # two requests a block
        (8, 131072, {"has_strict": False, "has_block": False}, False),  # the pick in the mass kernel: no flags
    ],
)
def test_flags_carry_the_chain_only_for_one_chain_request_a_block(b, vocab, flags, carried):
    """The chain rides on the flags (``fused_plan.flag_chain``: 1 + rejected + 2 n) only where the mass kernel
    waits on flags (a pick kernel follows), a block holds one request and no strict or block request
    needs more of the chain than n."""
    launches = cuda_launches(b, 1, vocab, True, **flags)
    assert {dict(zip(fn.arg_names, args))["FLAG_CHAIN"] for fn, args, _ in launches[1:]} == {carried}


@pytest.mark.parametrize(
    "b,k,told",
    [(1, 8, False), (15, 1, False), (16, 1, True), (256, 1, True), (64, 8, True), (65, 8, False), (256, 4, False), (1024, 1, False)],
)
def test_statistics_tiles_evict_first_between_its_draft_counts(b, k, told):
    """The statistics kernel loads its tiles ``evict_first`` for B K draft rows from
    ``Tunables.stats_evict_first_min_drafts`` to ``stats_evict_first_max_drafts`` (16 to 512), not
    outside (the calls measured slower there: ``benchmarks/RESULTS.md#fused-path-ab``)."""
    stats = cuda_launches(b, k, 4096, True)[0]
    assert stats[0] is tf._fused_stats_kernel
    assert dict(zip(stats[0].arg_names, stats[1]))["EVICT_FIRST"] is told


def test_evict_first_reaches_the_statistics_loads():
    """Compiled for sm_90, the statistics kernel told ``EVICT_FIRST`` loads every tile with an L2
    evict_first hint (``createpolicy ... L2::evict_first`` and ``L2::cache_hint`` vector loads):
    as many as the kernel not told loads plainly, and none plainly itself."""
    loads = _compiled_in_child(["evict-first-hints"])
    assert loads["not told"]["plain"] > 0 and loads["not told"]["hinted"] == 0, loads
    assert loads["told"] == {"hinted": loads["not told"]["plain"], "plain": 0}, loads


def _evict_first_hints() -> dict:
    """Vector loads with an L2 evict_first policy (``hinted``) and without a cache hint
    (``plain``) in the sm_90 statistics kernel of a batch told ``EVICT_FIRST`` (B = 64, K = 1) and
    of one not told (B = 513, K = 1), at V = 65536 (the smallest with group sums)."""
    counts = {}
    for name, b in (("told", 64), ("not told", 513)):
        fn, args, options = cuda_launches(b, 1, 65536, True, has_strict=False, has_block=False)[0]
        ptx = compile_sm90(fn, args, options.get("num_warps", 4), options.get("maxnreg")).asm["ptx"]
        vector_loads = re.findall(r"ld\.global\S*\.v[24]\.\S+", ptx)
        hinted = sum("L2::cache_hint" in load for load in vector_loads) if "L2::evict_first" in ptx else 0
        counts[name] = {"hinted": hinted, "plain": sum("L2::cache_hint" not in load for load in vector_loads)}
    return counts


if __name__ == "__main__":
    case = json.loads(sys.argv[1])
    print(json.dumps(_evict_first_hints() if case == ["evict-first-hints"] else _layout_changes(case)))


def test_kernel_resources_reports_every_fused_kernel():
    """``benchmarks/kernel_resources.py`` (registers of the sm_90 compiles, no GPU) prints a register count
    for each kernel of a planned call."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(_ROOT / "benchmarks" / "kernel_resources.py"), "--shapes", "1,1,32000"],
        cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    regs = dict(re.findall(r"(_fused_\w+): reg (\d+)", done.stdout))
    assert set(regs) == {"_fused_stats_kernel", "_fused_chain_kernel", "_fused_mass_kernel"}, done.stdout
    assert all(0 < int(n) <= 255 for n in regs.values()), regs
