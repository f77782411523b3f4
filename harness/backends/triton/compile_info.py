"""The fused kernels as this machine's Triton compiles them for an H100 (sm_90), on any machine:
the launches a CUDA call would make, planned without a GPU (``cuda_launches``), and a kernel
compiled for sm_90 with the specialization Triton's JIT would give those arguments
(``compile_sm90``). ``suites/test_triton_layouts.py`` reads their layouts and
``benchmarks/kernel_resources.py`` their registers. Compiling needs the real compiler: run it
without ``TRITON_INTERPRET``.
"""

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from harness.backends.triton import fused

_SM90 = GPUTarget("cuda", 90, 32)
_POINTER = {
    torch.float32: "*fp32",
    torch.float64: "*fp64",
    torch.bfloat16: "*bf16",
    torch.int64: "*i64",
    torch.int32: "*i32",
    torch.int8: "*i8",
}


def compile_sm90(fn, args, num_warps: int, maxnreg: int | None = None):
    """``fn`` compiled for sm_90 as the JIT specializes ``args``: constexprs, None and ints
    equal to 1 as constants; tensors 16-byte aligned (CUDA allocations are); ints that are
    multiples of 16 marked so, unless the parameter is ``do_not_specialize``; registers capped
    at ``maxnreg`` where given, as the launch asks."""
    signature, constants, attrs = {}, {}, {}
    for i, (param, a) in enumerate(zip(fn.params, args, strict=True)):
        specialized = not param.do_not_specialize
        if param.is_constexpr or a is None or (type(a) is int and a == 1 and specialized):
            signature[param.name], constants[param.name] = "constexpr", a
        elif isinstance(a, torch.Tensor):
            signature[param.name], attrs[(i,)] = _POINTER[a.dtype], [["tt.divisibility", 16]]
        elif isinstance(a, bool):
            signature[param.name] = "i1"
        elif isinstance(a, int):
            signature[param.name] = "i32" if -(2**31) <= a < 2**31 else "i64"
            if a % 16 == 0 and specialized:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[param.name] = "fp32"
    options = {"num_warps": num_warps} | ({"maxnreg": maxnreg} if maxnreg else {})
    return triton.compile(ASTSource(fn, signature, constants, attrs), target=_SM90, options=options)


def cuda_launches(b: int, k: int, vocab: int, with_draft: bool, **flags) -> list:
    """The fused path's launches (kernel, arguments, options) for a batch of ``b`` requests of
    ``k`` drafts each, planned as on an H100 (programmatic dependent launch on) by
    ``fused.plan_fused``, every method present unless ``flags`` (``verify_fused``'s ``has_*``,
    ``tunables``) say otherwise, nothing run."""
    i64 = dict(dtype=torch.int64)
    _, _, stats, launches, args = fused.plan_fused(
        torch.zeros(b * (k + 1), vocab),
        torch.zeros(b * k, vocab, dtype=torch.bfloat16) if with_draft else None,
        torch.zeros(b * k, **i64),
        torch.arange(b + 1, **i64) * k,
        torch.ones(b, dtype=torch.float64),
        torch.zeros(b, **i64),
        torch.zeros(b * (k + 1), **i64),
        torch.zeros(b, dtype=torch.int8),
        torch.zeros(b, k, dtype=torch.float64),
        k,
        **flags,
        cuda=True,
        pdl=True,
    )
    fn, _, stats_args, options = stats
    return [(fn, stats_args, options)] + [(fn, args, options) for fn, _, options in launches]
