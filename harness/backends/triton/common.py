"""What the staged and the fused kernels share besides their jit helpers over rows: the method and
noise-stream codes and numeric constants as constexprs, the planted faults' constexprs (and which
kernel compiles which), the counter-based noise, 1/T, and the host's tile plan (tiles and splits
from the vocabulary alone, residual candidates).

The jit helpers over rows live in ``row_stats`` (statistics) and ``draws`` (weights, masses,
draws, residual candidates); ``README.md`` in this folder says what each kernel constexpr means.
"""

import functools
import inspect
import re

import triton
import triton.language as tl

from harness.backends.triton.faults import TRITON_FAULTS
from harness.backends.triton.launch import cdiv, next_power_of_2
from harness.backends.triton.tunables import DEFAULT_TUNABLES, Tunables
from reference.methods import Method
from reference.rng import Stream

METHOD_STRICT = tl.constexpr(int(Method.STRICT))
METHOD_BLOCK = tl.constexpr(int(Method.BLOCK))
METHOD_SYNTHETIC = tl.constexpr(int(Method.SYNTHETIC))
STREAM_ACCEPT = tl.constexpr(int(Stream.ACCEPT))
STREAM_RESIDUAL = tl.constexpr(int(Stream.RESIDUAL))
STREAM_TARGET = tl.constexpr(int(Stream.TARGET))
STREAM_BLOCK = tl.constexpr(int(Stream.BLOCK))
STREAM_CANDIDATE = tl.constexpr(int(Stream.CANDIDATE))
STREAM_DRAFT = tl.constexpr(int(Stream.DRAFT))  # the drafter's alone (``drafting``): no verifier kernel draws from it
_TWO_M52 = tl.constexpr(2.220446049250313e-16)  # 2**-52
_MAX_INV_T = tl.constexpr(1e30)  # 1/T for tiny T: keeps (a - max) * inv_t finite, ties intact
LOWEST = tl.constexpr(-3.4028234663852886e38)  # -FLT_MAX: a finite "nothing seen yet"
NO_ID = tl.constexpr(2**31 - 1)
LOG2E = tl.constexpr(1.4426950408889634)


def _fault(name: str):
    return tl.constexpr(TRITON_FAULTS[name].code)


# Planted faults (``harness.backends.triton.faults``, ``triton-fault:NAME``): kernels take FAULT as a
# constexpr and every fault branch is resolved at compile time, so FAULT = 0 (the correct
# sampler) compiles to the code it had without them. The first two are the caller's (host) bugs.
IGNORE_DRAFT_PROBS = TRITON_FAULTS["ignore-draft-probs"].code
TEMPERATURE_TWICE = TRITON_FAULTS["temperature-twice"].code
DRAFT_BEFORE_TEMPERATURE = _fault("draft-before-temperature")
BLOCK_TOKEN_WISE = _fault("block-token-wise")
GREEDY_TIE_HIGHEST = _fault("greedy-tie-highest")
NAN_ROW_OUT_OF_VOCAB = _fault("nan-row-out-of-vocab")
INVERTED_RATIO = _fault("inverted-ratio")
ACCEPT_AT_ZERO_UNIFORM = _fault("accept-at-zero-uniform")
ACCEPT_PLACEHOLDER = _fault("accept-placeholder")
PLACEHOLDER_AS_INDEX = _fault("placeholder-as-index")
DRAFT_OFF_BY_ONE = _fault("draft-off-by-one")
WRONG_DRAFT_STEP = _fault("wrong-draft-step")
SYNTHETIC_RATES_AS_CONDITIONAL = _fault("synthetic-rates-as-conditional")
BONUS_WRONG_ROW = _fault("bonus-wrong-row")
GREEDY_BONUS_SAMPLED = _fault("greedy-bonus-sampled")
SEED_COLLISION = _fault("seed-collision")
RESIDUAL_IS_TARGET = _fault("residual-is-target")
KEEPS_REJECTED = _fault("one-hot-residual-keeps-rejected")
UNCLAMPED_RESIDUAL = _fault("unclamped-residual")
RESIDUAL_NOT_NORMALIZED = _fault("residual-not-normalized")
REUSE_UNIFORM = _fault("reuse-uniform")
NOISE_FLOOR = _fault("noise-floor")
OOV_LANE_WINS = _fault("oov-lane-wins")
CONTINUE_AFTER_REJECT = _fault("continue-after-reject")
BONUS_AFTER_REJECT = _fault("bonus-after-reject")
RESIDUAL_WRONG_POSITION = _fault("residual-wrong-position")
DRAFTER_SHARES_NOISE = _fault("drafter-shares-noise")
DRAFTER_OTHER_PRECISION = _fault("drafter-other-precision")
SHIFT_MARK = tl.constexpr(2.0)  # residual-wrong-position: a chain rejection's job rho (a real rho is <= 1)


def faults_compiled_by(fn, seen: set | None = None) -> set[int]:
    """Codes of the faults with a ``FAULT == NAME`` branch in jit function ``fn`` or in a jit
    helper it calls by name (read from the source; each name looked up in the globals of the
    module that defines the function, so helpers may live in other modules)."""
    seen = set() if seen is None else seen
    seen.add(fn)
    source = inspect.getsource(fn.fn)
    names = fn.fn.__globals__
    codes = {names[name].value for name in re.findall(r"FAULT == ([A-Z][A-Z0-9_]*)", source)}
    for name in set(re.findall(r"(?<![\w.])([A-Za-z_]\w*)\(", source)):
        helper = names.get(name)
        if hasattr(helper, "fn") and helper not in seen:
            codes |= faults_compiled_by(helper, seen)
    return codes


@functools.cache
def planted(kernel, fault: int) -> int:
    """The FAULT constexpr for ``kernel``: ``fault`` where the kernel has a branch for it,
    else 0, so that a planted fault compiles again only the kernels it lives in."""
    return fault if fault in faults_compiled_by(kernel) else 0


# --- noise ------------------------------------------------------------------------------------
@triton.jit
def uniform(seed, position, stream: tl.constexpr):
    """float64 uniform keyed by (seed, position, stream): Philox words mapped to
    (k + 0.5) * 2**-52, never 0 (a zero probability never passes ``u < p``) and never 1."""
    zero = seed * 0 + position * 0  # int64, the broadcast shape
    pos = position + zero
    c1 = (pos & 0xFFFFFFFF).to(tl.uint32)
    r0, r1, _, _ = tl.philox(seed + zero, zero.to(tl.uint32), c1, (pos >> 32).to(tl.uint32), (zero + stream).to(tl.uint32))
    bits = (r0.to(tl.uint64) << 20) | (r1 >> 12).to(tl.uint64)
    return (bits.to(tl.float64) + 0.5) * _TWO_M52


@triton.jit
def uniform_pair(seed, position, index, stream: tl.constexpr):
    """Two float64 uniforms keyed by (seed, position, index, stream), mapped as ``uniform``'s
    (index 0 gives ``uniform``'s first): one Philox call, its four words."""
    zero = seed * 0 + position * 0 + index * 0  # int64, the broadcast shape
    pos = position + zero
    c1 = (pos & 0xFFFFFFFF).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed + zero, (index + zero).to(tl.uint32), c1, (pos >> 32).to(tl.uint32), (zero + stream).to(tl.uint32))
    first = (r0.to(tl.uint64) << 20) | (r1 >> 12).to(tl.uint64)
    second = (r2.to(tl.uint64) << 20) | (r3 >> 12).to(tl.uint64)
    return (first.to(tl.float64) + 0.5) * _TWO_M52, (second.to(tl.float64) + 0.5) * _TWO_M52


@triton.jit
def inv_temperature(temp):
    """fp32 1/T; greedy rows (T = 0) use 1 (their statistics only feed the argmax)."""
    safe = tl.where(temp > 0, temp, 1.0)
    return tl.minimum(1.0 / safe, _MAX_INV_T).to(tl.float32)


# --- host side: the tile plan ---------------------------------------------------------------------
def tile_plan(vocab: int, cuda: bool, block_v: int | None = None, splits: int | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_V, BLOCK_R, NSPLIT, split_len) from the vocabulary alone, so that a request's
    reductions (hence its output) never depend on its batch mates. GPU: 2048-wide tiles, one
    split (a program's share of a row's statistics, and of the staged draw masses) per 4096
    ids: at B = 1 a program's time is its loads' latency, and at V = 152064, K = 1 the call
    took 1.08-1.10 of vLLM MRV2's time in 15 splits of five tiles, 0.97-0.99 in 38 splits,
    each read as one tile (``fused_plan.stats_width``). At large batches the fused path reads
    several splits per program (``fused_plan.stats_splits_per_program``; one each cost 5-7% at
    B = 1024, K >= 4) and sums masses over spans of its own (``fused_plan.mass_span``) (H100; other tile
    policies: benchmarks/RESULTS.md#tried-and-not-kept). The interpreter pays per operation, so CPU
    tiles are large and unsplit. ``block_v`` / ``splits`` override (tests)."""
    budget = 2048 if cuda else 1 << 18  # elements per tile
    block_v = block_v or min(next_power_of_2(vocab), 2048 if cuda else 1 << 16)
    block_r = max(1, budget // block_v)
    nsplit = splits or (cdiv(vocab, 4096) if cuda else 1)
    split_len = cdiv(cdiv(vocab, nsplit), block_v) * block_v
    return block_v, block_r, cdiv(vocab, split_len), split_len


def candidates_for(vocab: int, cuda: bool, tunables: Tunables = DEFAULT_TUNABLES) -> int:
    """Residual candidates per rejection of a request of ``vocab`` ids (0: none;
    ``Tunables.candidates``, on CUDA from ``Tunables.candidate_min_vocab_cuda`` ids on): a
    request's output depends on its vocabulary and its own inputs, never on its batch mates."""
    return tunables.candidates if not cuda or vocab >= tunables.candidate_min_vocab_cuda else 0


def candidate_plan(vocab: int, block_v: int, tile_width: int, tunables: Tunables = DEFAULT_TUNABLES) -> tuple[int, int, int]:
    """(GROUP, NTP, GPT) of ``residual_candidates`` for a vocabulary whose draw tiles are
    ``block_v`` wide and statistics tiles ``tile_width``: the group (never wider than a draw
    tile, so the paths' groups are the same ids), the row's tiles padded to a power of two
    and the groups per statistics tile (``Tunables.candidate_group`` ids a group, at most)."""
    group = min(tunables.candidate_group, block_v)
    return group, next_power_of_2(cdiv(vocab, tile_width)), tile_width // group


def candidate_width(candidates: int, ntp: int, gpt: int, group: int) -> int:
    """Elements per lane of ``residual_candidates``' widest tile (the interpreter's lanes stay
    within Triton's largest tensor)."""
    return candidates * max(group, gpt, ntp)


def tile_masses_width(n_tiles: int, lanes: int, cuda: bool) -> int:
    """``tile_masses``' NT: a power of two >= n_tiles. On CUDA at least 128 / lanes (and 4):
    Triton 3.6 fails to lower the draw's cumulative sum over a tile smaller than a program's
    threads (an assertion in ScanOpToLLVM at [2, 2]); at one lane that is all 128 tiles of V
    = 262,144, so larger vocabularies need no compile of their own."""
    floor = max(4, 128 // lanes) if cuda else 2
    return max(floor, next_power_of_2(n_tiles))
