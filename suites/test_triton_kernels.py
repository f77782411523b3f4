"""The Triton sampler's kernels, one piece at a time (``harness/backends/triton/``): the noise, the
inverse-CDF draw's resolution, the tile masses, the far tail, and the residual candidates.

On a CPU-only machine the kernels run under the Triton interpreter (``conftest.py`` sets
TRITON_INTERPRET=1 before Triton is imported). What is checked:

* the counter-based uniforms lie in the open interval (0, 1);
* the far tail of the inverse-CDF draw: exact slices of (0, 1) for tokens 1e-12 below the
  head, and tail rates with calibrated binomial tests (``test_triton_gpu.py``: 1e-9 below the
  max on a GPU);
* a program of target-row draws sums the same tile masses in either tile loop;
* a rejection's replacement, by residual candidates or the fallback draw, has the residual's law.
"""

import dataclasses
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
triton = pytest.importorskip("triton", reason="the Triton backend needs triton")

import triton.language as tl  # noqa: E402

from harness.backends.triton.common import LOG2E, uniform  # noqa: E402
from harness.backends.triton.draws import split_tile_masses  # noqa: E402
from harness.backends.triton.staged import sample_rows  # noqa: E402
from harness.backends.triton.tunables import DEFAULT_TUNABLES  # noqa: E402
from harness.checking import pooling, power, stats  # noqa: E402
from harness.gpus import gpu_skip_reason  # noqa: E402
from harness.protocol import VerifyBatch  # noqa: E402
from suites.helpers import BOTH_PATHS, TRITON_ALPHA, TRITON_POWER, binomial_check, sample_triton, tail_rate  # noqa: E402

# The interpreter computes Philox's wrapping uint32 products with NumPy, which warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.*")
gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")


# --- the noise --------------------------------------------------------------------------------------
@triton.jit
def _uniform_probe(seed_ptr, pos_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    seed = tl.load(seed_ptr + i, mask=mask, other=0)
    pos = tl.load(pos_ptr + i, mask=mask, other=0)
    tl.store(out_ptr + i, uniform(seed, pos, 1), mask=mask)


@pytest.mark.parametrize("tiles", [{}, {"block_v": 2, "splits": 3}], ids=["one-split", "three-splits"])
def test_draw_resolves_the_far_tail(tiles):
    """Inverse CDF with a 52-bit uniform and fp64 sums: tokens 1e-12 and 1e-14 below the
    head own exactly their slices of (0, 1) (an fp32 draw cannot see below 2**-24)."""
    ratios = np.array([1.0, 1e-12, 1.0, 1e-14, 1.0])
    edges = np.cumsum(ratios) / ratios.sum()  # the head's value cancels: exact to ~1e-19
    slices = [(0.0, edges[0])] + list(zip(edges[:-1], edges[1:]))
    probes, want = [], []
    for token, (lo, hi) in enumerate(slices):
        width = hi - lo
        for u in (lo + 0.1 * width, lo + 0.5 * width, hi - 0.1 * width):
            probes.append(u)
            want.append(token)
    probes += [2.0**-53, 1 - 2.0**-53]
    want += [0, 4]
    logits = torch.from_numpy(np.log(ratios).astype(np.float32)).expand(len(probes), -1).contiguous()
    u = torch.tensor(probes, dtype=torch.float64)
    got = sample_rows(logits, torch.ones(len(probes), dtype=torch.float64), uniforms=u, **tiles)
    assert got.tolist() == want


def test_uniforms_are_open_interval():
    n = 1 << 14
    seeds = torch.arange(n, dtype=torch.int64) * 7919
    pos = torch.arange(n, dtype=torch.int64) << 20
    out = torch.empty(n, dtype=torch.float64)
    _uniform_probe[(1,)](seeds, pos, out, n, BLOCK=n)
    u = out.numpy()
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 6 * math.sqrt(1 / 12 / n)


# --- the masses: a program of target-row draws takes the short tile loop ---------------------------
@triton.jit
def _masses_probe(t_logits, d_logits, V, rho_ptr, m_ptr, logs2_ptr, out_w, out_t, BLOCK_V: tl.constexpr, NT: tl.constexpr):
    """``split_tile_masses`` of two lanes over the whole row, each as ``rho`` says (-1 a
    target-row draw, -2 inactive, >= 0 a residual, which takes the general loop for both)."""
    r = tl.arange(0, 2)
    rho = tl.load(rho_ptr + r)[:, None]
    active = rho > -2
    resid = active & (rho >= 0)
    m = tl.load(m_ptr + r)[:, None]
    logs2 = tl.load(logs2_ptr + r)[:, None]
    scale = tl.full([2, 1], LOG2E, tl.float32)
    split_tile_masses(
        t_logits, V, V, d_logits, V, V, r[:, None], r[:, None], m, logs2, m, logs2, scale, rho, active, resid,
        resid, tl.full([2, 1], -1, tl.int64), r < 2, 0, V, out_w + r * NT, out_t + r * NT, True, 0, BLOCK_V,
    )  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, gpu])])
def test_target_draw_masses_are_the_same_bits_in_either_tile_loop(device):
    """A program with no residual lane sums its tiles in a loop without the residual's draft
    tile and selects (the bonus rows' masses); a target-row draw's tile masses and maxima are
    the same bits there as beside a residual, in the general loop (tiles of 256, the last one
    partial, a -inf logit)."""
    vocab, block_v = 1000, 256
    n_tiles = -(-vocab // block_v)
    rng = np.random.default_rng(5)
    logits = torch.from_numpy(rng.normal(0.0, 3.0, (2, vocab)).astype(np.float32)).to(device)
    logits[0, 7] = float("-inf")
    draft = (logits + 0.5).to(torch.bfloat16)
    m = logits.max(dim=1).values.contiguous()
    logs2 = torch.log2(torch.exp2((logits - m[:, None]) * LOG2E.value).sum(dim=1)).contiguous()
    sums = {}
    for lane0, lane1 in ((-1.0, -2.0), (-1.0, -1.0), (-1.0, 0.5), (-2.0, -2.0)):  # rho -2: inactive, 0.5: a residual
        out_w = torch.full((2 * n_tiles,), float("nan"), dtype=torch.float64, device=device)
        out_t = torch.full_like(out_w, float("nan"))
        rho = torch.tensor([lane0, lane1], dtype=torch.float32, device=device)
        _masses_probe[(1,)](logits, draft, vocab, rho, m, logs2, out_w, out_t, BLOCK_V=block_v, NT=n_tiles)
        sums[lane1 if lane0 == -1 else "none"] = (out_w[:n_tiles].cpu(), out_t[:n_tiles].cpu())
    # No active lane: zeros, as the general loop stores them (its tile max starts at 0).
    assert not sums["none"][0].any() and not sums["none"][1].any(), "an inactive program stored weight or a max"
    tiles = torch.nn.functional.pad(logits[0].cpu(), (0, n_tiles * block_v - vocab), value=float("-inf"))
    assert torch.equal(sums[0.5][1], tiles.reshape(n_tiles, block_v).max(dim=1).values.double()), "not the tile maxima"
    assert torch.all(sums[0.5][0] >= 1), "a tile's mass relative to its max is at least 1"
    for lane1 in (-2.0, -1.0):
        assert torch.equal(sums[lane1][0], sums[0.5][0]), f"tile masses differ (lane 1 rho {lane1})"
        assert torch.equal(sums[lane1][1], sums[0.5][1]), f"tile maxima differ (lane 1 rho {lane1})"


# --- the far tail -----------------------------------------------------------------------------------
def _tail_batch(vocab, n, log_ratio, seed_base, residual=False):
    """n requests over [0, log_ratio, ..., log_ratio]: token 0 against the tail. Bonus-only
    (no drafts), or ``residual``: one draft, token 1, which the target masks (-inf), so it is
    always rejected and the replacement comes from the residual max(p - onehot(1), 0) = p."""
    row = np.full(vocab, log_ratio, np.float32)
    row[0] = 0.0
    b, d = n, int(residual)
    if residual:
        row[1] = -np.inf
    return VerifyBatch(
        np.broadcast_to(row, (b * (d + 1), vocab)), None, np.ones(b * d, np.int64), np.arange(b + 1, dtype=np.int64) * d, np.ones(b),
        seed_base + np.arange(b, dtype=np.int64) * 7919, np.arange(b * (d + 1), dtype=np.int64) * 13, np.zeros(b, np.int8), None, d,
    )  # fmt: skip


@pytest.mark.parametrize("path,residual", [("staged", False), ("fused", True)], ids=["staged-bonus", "fused-residual"])
def test_tail_tokens_drawn_at_their_rate(path, residual):
    """4095 tail tokens each e^-12 (6e-6) below the head (4094 in the residual): binomial test
    at alpha 1e-6 that detects (power 0.99) a 50% error in the tail rate (vLLM #43150: a draw
    in fp32 starves such tokens). The staged path draws bonus tokens (``_pick_kernel``), the
    fused path replacements from a residual (``_draw``, after its chain rejected the draft);
    either path draws both with the same code, and they agree token for token
    (``test_fused_equals_staged``). The interpreter cannot afford the 1e-9..1e-12 ratios
    (about 200 / ratio token draws): ``test_draw_resolves_the_far_tail`` covers those
    exactly, and ``test_gpu_far_tail`` statistically."""
    vocab, n, log_ratio = 4096, 10000, -12.0
    tokens, emitted = sample_triton(_tail_batch(vocab, n, log_ratio, 5, residual), path=path)
    assert np.all(emitted == 1), "a draft of target probability 0 was accepted"
    rate = tail_rate(vocab - 1 - int(residual), log_ratio)
    binomial_check(int((tokens[:, 0] != 0).sum()), n, rate, 0.5 * rate)


# --- residual candidates ---------------------------------------------------------------------------
def _rejection_batch(vocab, n, noise):
    """n requests with one target row, one draft row (the target plus Gaussian ``noise``) and
    one fixed draft, the token the draft over-weights most (rejected with probability
    1 - p/q there); seeds and positions differ, so the replacements are independent draws."""
    rng = np.random.default_rng(23)
    target = rng.normal(0.0, 1.5, vocab).astype(np.float32)
    draft = (target + rng.normal(0.0, noise, vocab)).astype(np.float32)
    x = int(np.argmax(draft - target))
    batch = VerifyBatch(
        np.tile(np.stack([target, target]), (n, 1)), np.tile(draft, (n, 1)), np.full(n, x, np.int64),
        np.arange(n + 1, dtype=np.int64), np.ones(n), 11 + np.arange(n, dtype=np.int64) * 7919,
        np.arange(2 * n, dtype=np.int64) * 13, np.zeros(n, np.int8), None, 1,
    ).validate()  # fmt: skip
    p, q = (np.exp(r.astype(np.float64) - r.max()) for r in (target, draft))
    p, q = p / p.sum(), q / q.sum()
    return batch, np.maximum(p - q, 0.0), 1.0 - min(1.0, p[x] / q[x])


@pytest.mark.parametrize("path", BOTH_PATHS)
@pytest.mark.parametrize("noise,kept", [(0.3, False), (2.0, True)], ids=["mostly-fallbacks", "mostly-kept"])
def test_rejection_replacements_have_the_residual_law(path, noise, kept):
    """A rejected draft's replacement is drawn by residual candidates (``residual_candidates``),
    or, when none of a request's 8 is kept, from the residual's masses: either way its law is
    max(p - q, 0) / R. Pearson chi-square over the rejections' tokens against it (cells pooled to
    >= 5 expected), alpha 1e-6; the rejections detect TV 0.1 with power 0.99 (requests: that
    many over the rejection's probability, and a fifth more). R = 0.07: (1 - R)^8 = 0.56 of the
    requests fall back; R = 0.67: nearly none. Which one ran shows against the draw without
    candidates (``Tunables.candidates`` 0), whose token a fallback keeps."""
    vocab = 64
    needed = power.trials_for_tv(TRITON_ALPHA, TRITON_POWER, 0.1, vocab - 1)
    n = math.ceil(1.2 * needed / _rejection_batch(vocab, 1, noise)[2])
    batch, residual, _ = _rejection_batch(vocab, n, noise)
    tokens, emitted = sample_triton(batch, path=path)
    plain, _ = sample_triton(batch, path=path, tunables=dataclasses.replace(DEFAULT_TUNABLES, candidates=0))
    rejected = emitted == 1
    got = np.bincount(tokens[rejected, 0], minlength=vocab).astype(np.float64)
    want = residual / residual.sum() * rejected.sum()
    assert power.detectable_tv(TRITON_ALPHA, TRITON_POWER, vocab - 1, int(rejected.sum())) <= 0.1, f"only {rejected.sum()} rejections"
    result = stats.chi_square_test(got, want, pooling.pool_cells(want), with_ci=False)
    assert result.p_value > TRITON_ALPHA, (
        f"replacements vs the residual: chi2 {result.statistic:.1f}, df {result.df}, p {result.p_value:.3g}"
    )
    same = float(np.mean(tokens[rejected, 0] == plain[rejected, 0]))
    assert (same < 0.3) if kept else (same > 0.3), f"{same:.2f} of the replacements are the fallback's token"
