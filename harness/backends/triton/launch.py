"""Launch a compiled Triton kernel without ``JITFunction.run``'s per-call work.

``kernel[grid](*args)`` binds and specializes every argument, hashes the cache key, checks
the kernel's global values and builds launch metadata on every call: 24-65 us of host time
per launch of the sampler's kernels on H100 hosts (Triton 3.6; benchmarks/RESULTS.md#host-launch-time),
against 21-42 us through this module (key and launcher). The staged
sampler launches 8-10 kernels per batch, so eager calls were host-bound.

``launch(fn, grid, *args, **options)`` sends the first call of each specialization through
Triton and keeps the compiled kernel it returns; later calls with the same key call that
kernel's launcher directly. The key follows Triton's specialization rules (the binder of
``JITFunction``): constexpr values; each tensor's dtype and 16-byte alignment; each int's
value class (== 1, multiple of 16, 32- or 64-bit); the types of floats, bools and None; the
launch options and the device. Any other argument (an int subclass such as an IntEnum, a
tuple, a descriptor) and a callable grid go through Triton on every call. A key finer than
Triton's only costs an extra entry; one coarser would launch a kernel compiled for other
arguments, so ``SPECDEC_TRITON_CHECK_LAUNCH=1`` asks Triton for its kernel on every cached
launch and raises if it is not the cached one (the test suite sets it).

The direct call uses Triton internals (``CompiledKernel.run``'s argument order), so it is
taken only on Triton versions where it was verified (``DIRECT_TRITON_VERSIONS``), never under
the interpreter, and never while a launch hook (a profiler) is installed; everywhere else
``launch`` is ``fn[grid](*args, **options)``.
"""

import functools
import os

import torch
import triton

DIRECT_TRITON_VERSIONS = ("3.6.",)  # verified on an H100: same outputs, the GPU suite in check mode
CHECK_ENV = "SPECDEC_TRITON_CHECK_LAUNCH"


class LaunchMismatch(RuntimeError):
    """A cached launch would have run another kernel than Triton picks for these arguments."""


@functools.cache
def _direct_possible() -> bool:
    return os.environ.get("TRITON_INTERPRET") != "1" and triton.__version__.startswith(DIRECT_TRITON_VERSIONS)


def _hooks_installed() -> bool:
    """Whether a launch hook (a profiler such as Proton) is set: Triton 3.6 keeps them in
    ``HookChain``s that are never None; older versions held one callable or None."""
    runtime = triton.knobs.runtime
    return any(h is not None and getattr(h, "calls", True) for h in (runtime.launch_enter_hook, runtime.launch_exit_hook))


_Tensor = torch.Tensor
_PLAIN = (int, float, bool, type(None))  # exact types the key knows; others go through Triton


def launch_key(constexprs: tuple, args: tuple) -> tuple:
    """What Triton's specialization of ``args`` depends on (``constexprs``: per parameter,
    whether it is a constexpr): a constexpr's value; a tensor's dtype and 16-byte alignment;
    an int's == 1, multiple-of-16, 32- and 64-bit classes; the type of a float, bool or None.
    Finer than Triton where a parameter is not specialized (``do_not_specialize``): an extra
    entry, never a wrong kernel. None where an argument is of any other type. One
    expression: this runs on every launch."""
    key = tuple(
        [
            (a.dtype, not a.data_ptr() & 15)
            if isinstance(a, _Tensor)
            else a
            if constexpr
            else (a == 1, not a & 15, -(2**31) <= a < 2**31, -(2**63) <= a < 2**63)
            if type(a) is int
            else type(a)
            if type(a) in _PLAIN
            else None
            for constexpr, a in zip(constexprs, args)
        ]
    )
    return None if None in key else key


_UNKNOWN = object()  # no launch key given: compute it


class _Kernel:
    """One jit function's compiled kernels by specialization key."""

    def __init__(self, fn):
        self.fn = fn
        self.constexprs = tuple(p.is_constexpr for p in fn.params)
        self.compiled = {}

    def __call__(self, grid, args, options, args_key=_UNKNOWN):
        """``args_key``: ``launch_key(self.constexprs, args)`` where the caller has it (``launch_each``)."""
        if len(args) != len(self.constexprs):  # defaults and keywords would reorder the launcher's arguments
            raise TypeError(f"{self.fn.__name__}: launch passes every parameter by position ({len(self.constexprs)}), got {len(args)}")
        if callable(grid):
            args_key = None
        elif args_key is _UNKNOWN:
            args_key = launch_key(self.constexprs, args)
        if args_key is None:
            self.fn[grid](*args, **options)
            return
        device = torch.cuda.current_device()
        key = args_key, tuple(options.items()), device
        kernel = self.compiled.get(key)
        if kernel is None:
            self.compiled[key] = self.fn[grid](*args, **options)
            return
        if os.environ.get(CHECK_ENV) == "1":
            chosen = self.fn.warmup(*args, grid=grid, **options)
            if chosen is not kernel:
                raise LaunchMismatch(f"{self.fn.__name__}: the cached kernel for key {key} is not the one Triton picks")
        g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
        stream = torch._C._cuda_getCurrentRawStream(device)  # as Triton's driver reads it; torch.cuda.current_stream() costs ~7 us
        kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None, *args)


_KERNELS: dict = {}


def _kernel(fn) -> _Kernel:
    kernel = _KERNELS.get(fn)
    if kernel is None:
        kernel = _KERNELS[fn] = _Kernel(fn)
    return kernel


def launch(fn, grid, *args, **options):
    """``fn[grid](*args, **options)``; on CUDA, after the first call per specialization,
    through the compiled kernel's launcher. Every parameter is passed by position."""
    if not _direct_possible() or _hooks_installed():
        fn[grid](*args, **options)
        return
    _kernel(fn)(grid, args, options)


def launch_each(launches, *args):
    """``launch(fn, grid, *args, **options)`` for each ``(fn, grid, options)`` in order, for
    kernels of one signature given the same arguments: their specialization key is computed
    once (a key over a fused kernel's ~50 arguments took about 7 us on the CPU machine)."""
    if not _direct_possible() or _hooks_installed():
        for fn, grid, options in launches:
            fn[grid](*args, **options)
        return
    kernels = [_kernel(fn) for fn, _, _ in launches]
    constexprs = kernels[0].constexprs
    if any(k.constexprs != constexprs for k in kernels):
        raise TypeError(f"launch_each: {[fn.__name__ for fn, _, _ in launches]} differ in their constexpr parameters")
    args_key = launch_key(constexprs, args)
    for kernel, (_, grid, options) in zip(kernels, launches, strict=True):
        kernel(grid, args, options, args_key)


# Grid arithmetic in plain ints: triton.cdiv and triton.next_power_of_2 are constexpr
# functions, several microseconds per call from the host.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2``: the least power of two >= n (0 for 0)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
