"""Direct launches of compiled Triton kernels (``harness/backends/triton/launch.py``).

* CPU: the launch key tells apart every pair of arguments that Triton's own specializer
  (``native_specialize_impl``) tells apart, over tensors of each alignment and dtype, ints at
  each boundary, floats, bools and None, for each (specialize, align) setting; the host grid
  arithmetic equals Triton's.
* GPU (Triton versions where the direct launch is taken): the sampler's outputs are the same
  token for token with direct launches as with Triton's own; a key blind to alignment is
  caught by the check mode that the suite runs in (``conftest.py`` sets
  ``SPECDEC_TRITON_CHECK_LAUNCH=1``).
"""

import itertools

import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
triton = pytest.importorskip("triton", reason="the Triton backend needs triton")

import triton.language as tl  # noqa: E402

from harness.backends.triton import fused as tf  # noqa: E402
from harness.backends.triton import launch as tlaunch  # noqa: E402
from harness.backends.triton import staged_jobs as tj  # noqa: E402
from harness.backends.triton.backend import verify  # noqa: E402
from harness.gpus import gpu_skip_reason  # noqa: E402
from suites.helpers import device_mixed_batch  # noqa: E402

_NO_DIRECT = gpu_skip_reason() or (
    None
    if triton.__version__.startswith(tlaunch.DIRECT_TRITON_VERSIONS)
    else f"direct launches are taken on Triton {tlaunch.DIRECT_TRITON_VERSIONS} only (here {triton.__version__})"
)
direct = pytest.mark.skipif(_NO_DIRECT is not None, reason=_NO_DIRECT or "")


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def _arguments():
    base = torch.empty(64, dtype=torch.float32)
    tensors = [base, base[1:], base[2:], base[4:], base.to(torch.bfloat16), base.to(torch.bfloat16)[1:], base.to(torch.int64)]
    tensors += [
        torch.nn.Parameter(base[1:].clone()[1:], requires_grad=False),
        torch.nn.Parameter(base.to(torch.int32), requires_grad=False),
    ]
    ints = [0, 1, 2, 8, 15, 16, 17, 24, 32, -8, -1, -16, 2**31 - 1, 2**31, 2**31 + 16, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63, 2**64 - 16]
    return tensors + ints + [0.5, 1.0, True, False, None]


def test_the_launch_key_tells_apart_what_triton_specializes_on():
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    args = _arguments()
    for a, b in itertools.combinations(args, 2):
        if tlaunch.launch_key((False,), (a,)) == tlaunch.launch_key((False,), (b,)):
            for specialize, align in itertools.product((True, False), repeat=2):
                ta = native_specialize_impl(BaseBackend, a, False, specialize, align)
                tb = native_specialize_impl(BaseBackend, b, False, specialize, align)
                assert ta == tb, f"{a!r} and {b!r} share a key but Triton gives {ta} and {tb} ({specialize=}, {align=})"


def test_arguments_the_key_does_not_know_go_through_triton():
    """An int subclass (Triton specializes an IntEnum by value), a tuple: no key, no cache."""
    from reference.rng import Stream

    assert tlaunch.launch_key((False,), (Stream.ACCEPT,)) is None
    assert tlaunch.launch_key((False, False), (1, (1, 2))) is None
    assert tlaunch.launch_key((False,), (None,)) is not None


def test_a_constexpr_is_keyed_by_its_value():
    for a, b in ((64, 128), (True, False), (16, 32)):
        assert tlaunch.launch_key((True,), (a,)) != tlaunch.launch_key((True,), (b,))


def test_a_launch_hook_sends_launches_back_through_triton():
    """Profilers hook Triton's launches; the direct call would skip their hooks."""
    hooks = triton.knobs.runtime.launch_enter_hook
    assert not tlaunch._hooks_installed()
    hooks.add(print)
    try:
        assert tlaunch._hooks_installed()
    finally:
        hooks.remove(print)
    assert not tlaunch._hooks_installed()


def test_launch_each_shares_a_key_only_between_kernels_of_one_signature(monkeypatch):
    """``launch_each`` computes one specialization key for all its kernels: it refuses kernels
    whose constexpr parameters sit elsewhere (the key would be another kernel's), before any
    launch. Compiled-kernel objects (``JITFunction``) even under the interpreter, which has no
    direct launches of its own."""
    from triton.runtime.jit import JITFunction

    def copy(src, dst, n, BLOCK: tl.constexpr):
        pass

    def fill(dst, n: tl.constexpr, BLOCK: tl.constexpr, value):
        pass

    monkeypatch.setattr(tlaunch, "_direct_possible", lambda: True)
    dst = torch.empty(8)
    with pytest.raises(TypeError, match=r"\['copy', 'fill'\] differ in their constexpr parameters"):
        tlaunch.launch_each([(JITFunction(copy), (1,), {}), (JITFunction(fill), (1,), {})], dst, dst, 8, 8)


def test_grid_arithmetic_matches_triton():
    for n in range(0, 3000):
        assert tlaunch.next_power_of_2(n) == triton.next_power_of_2(n)
        for d in (1, 3, 64, 2048):
            assert tlaunch.cdiv(n, d) == triton.cdiv(n, d)


@pytest.mark.gpu
@direct
@pytest.mark.parametrize("path", ["staged", "fused"])
def test_direct_launches_give_the_outputs_of_triton_launches(path, monkeypatch):
    batch = device_mixed_batch(32000, 48, 4, seed=3)
    direct_runs = [verify(*batch, path=path) for _ in range(3)]  # the first compiles, the others launch directly
    kernel = tlaunch._KERNELS[tj._stats_kernel if path == "staged" else tf._fused_stats_kernel]
    assert kernel.compiled, "no kernel was cached: the direct path was not taken"
    monkeypatch.setattr(tlaunch, "_direct_possible", lambda: False)
    tokens, emitted = verify(*batch, path=path)
    for got_tokens, got_emitted in direct_runs:
        assert torch.equal(got_tokens, tokens) and torch.equal(got_emitted, emitted)


@pytest.mark.gpu
@direct
def test_check_mode_catches_a_key_blind_to_alignment(monkeypatch):
    monkeypatch.setenv(tlaunch.CHECK_ENV, "1")
    src = torch.arange(4097, dtype=torch.float32, device="cuda")
    dst = torch.empty(4097, dtype=torch.float32, device="cuda")
    tlaunch._KERNELS.pop(_copy_kernel, None)
    for view in (src[:4096], src[1:], src[:4096]):  # aligned, unaligned, aligned: two kernels
        tlaunch.launch(_copy_kernel, (4,), view, dst, 4096, 1024)
        torch.cuda.synchronize()
        assert torch.equal(dst[:4096], view)
    assert len(tlaunch._KERNELS[_copy_kernel].compiled) == 2

    keyed = tlaunch.launch_key

    def blind(constexprs, args):  # a tensor's key without its alignment
        return tuple(p[0] if isinstance(p, tuple) and isinstance(p[0], torch.dtype) else p for p in keyed(constexprs, args))

    monkeypatch.setattr(tlaunch, "launch_key", blind)
    tlaunch._KERNELS.pop(_copy_kernel)
    tlaunch.launch(_copy_kernel, (4,), src[:4096], dst, 4096, 1024)
    with pytest.raises(tlaunch.LaunchMismatch):
        tlaunch.launch(_copy_kernel, (4,), src[1:], dst, 4096, 1024)
