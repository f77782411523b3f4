"""The Triton sampler's tunables: every module-level number its launch code reads (thresholds,
tile widths, program counts, splits, a register cap), as one frozen dataclass.

``TritonBackend(tunables=...)`` and ``verify(..., tunables=...)`` take a ``Tunables``; the default
is ``DEFAULT_TUNABLES``, the values measured below. A variant is a ``dataclasses.replace`` of it
(``benchmarks/bench_kernels.py --set``, ``AB_SET``), never an assignment to a module global.

Which ones change the outputs: ``candidates``, ``candidate_group``, ``candidate_min_vocab_cuda``
(the residual candidates: the tokens, not their law) and ``stats_max_width`` (the fused
statistics' fp32 summation order: last bits, ``_ORDER_SLACK`` in the tests). The fused / staged
thresholds choose a path, and both give the same outputs. The others choose how the fused path
spreads its work over programs, cap its registers or give cache hints; for those the benchmarks
vary, ``suites/test_triton_paths.py`` checks that the tokens stay the staged path's.

This module imports nothing of the sampler, so anything may import it.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Tunables:
    # --- which path (``backend.takes_fused_path``) ---
    # ``path="auto"`` takes the fused path (3-5 launches, 3 allocations, no host sync, no
    # statistics of a request's last target row) for small batches and the staged pipeline (~10
    # launches, a dozen allocations) above. Interpreter (CPU): up to ``fused_max_requests_cpu``
    # requests, where the fused path's fewer programs pay. CUDA: up to ``fused_max_logits_cuda``
    # logits per row position (requests x V: 8,388 requests at V = 32000, 2,048 at 131072).
    # Measured on an H100 (B in {1, 64, 256, 1024}, V in {32000, 131072, 152064}): the fused path
    # took 8-48% less graph time than the staged path on every shape (it reads a target row less
    # per request). Not measured: B > 1024 and V < 32000.
    fused_max_requests_cpu: int = 256
    fused_max_logits_cuda: int = 2**28

    # --- residual candidates (``common.candidates_for``, ``draws.residual_candidates``) ---
    # A rejected draft's replacement is drawn by rejection from the target row, reading one group
    # of ids of the target and draft rows per candidate instead of both rows whole (a second read
    # after the statistics'). With ``candidates`` candidates a request falls back to the
    # residual's masses over the whole row with probability (1 - R)^N, R the residual's mass (the
    # rejection's chance at that step). On an H100 (benchmarks/RESULTS.md#residual-candidates)
    # they took B = 256, K = 1 from 144.0 / 165.6 us to 137.1 / 154.0 (V = 131072 / 152064) and
    # B = 1, K = 8, V = 152064 from 21.9 to 24.0, 21.3 once the candidate kernel finished a
    # request whose candidate it kept. With 16 candidates in the 4-warp chain kernel instead of 8
    # in a one-warp kernel of their own, B = 1 took 2-3x as long; with candidates in the chain
    # kernel at one warp, 64 us at B = 1, K = 8, V = 152064 (and 29.0 against 21.6 at V = 131072,
    # where no draft was rejected: one warp slows the chain itself). At V = 32000 they cost more
    # than the row reads they save (B = 64, K = 1: 29.0 -> 35.5 us, slower than vLLM MRV2), so
    # CUDA uses them from ``candidate_min_vocab_cuda`` ids on. 0 candidates: none.
    candidates: int = 8
    candidate_group: int = 64  # ids per group (never wider than a draw tile: ``common.candidate_plan``)
    candidate_min_vocab_cuda: int = 65536

    # --- the fused path's launch plan (``fused_plan``, ``fused.verify_fused``) ---
    cuda_requests: int = 64  # most requests per program of the fused chain kernels on CUDA (the staged chain's)
    mass_programs: int = 256  # mass programs a call spreads its tiles over, about (measured, H100)
    mass_max_tiles: int = 4  # most tiles one mass program sums (measured, H100)
    stats_max_width: int = 4096  # widest statistics tile on CUDA (ids; 32 fp32 per thread at 4 warps)
    stats_programs: int = 8192  # statistics programs a call spreads its splits over, at most about (measured, H100)
    stats_max_splits: int = 4  # most splits one statistics program reads
    # Storing the group sums made ptxas (Triton 3.6) give the statistics kernel 96 registers where
    # 48 suffice with no spill (benchmarks/kernel_resources.py, and on an H200; 40 spill). At 48 an
    # SM holds 10 of its programs, not 8 as at 64: on an H200 2.9-3.4 us less at B = 256, K = 1,
    # V = 131072, up to 1.5 us less at the other shapes timed, B = 1 within its spread
    # (benchmarks/RESULTS.md#kernel-registers; not yet measured on an H100). The cap changes only
    # ptxas's register allocation, not the arithmetic or its order: the tokens are the same.
    stats_max_registers: int = 48
    # Up to this many request blocks, the last mass program of each block picks its tokens (no
    # fourth launch; up to 0.9 us less at B = 1 on an H100). Above, the pick's registers cost the
    # mass kernel occupancy: 1-7% more time at B = 64-1024, V >= 131072 on an H100
    # (benchmarks/RESULTS.md#tried-and-not-kept). The tokens are the same either way.
    pick_in_mass_max_blocks: int = 8
    # Between these counts of a call's draft rows (B K where every request has K) the statistics
    # kernel loads its tiles ``evict_first`` (``row_stats._row_tile``): its rows are read once, so
    # their lines go before the lines L2 held. On an H200, with do_bench's flush (L2 left full of
    # dirty lines), the call took 0.5-3.9 us less at 64-512 draft rows (B = 256, K = 1, V = 131072:
    # 98.8-98.9 -> 97.2-97.5 us), mostly because those lines were no longer written back during it;
    # B = 16, K = 1 was level. It took 0.6 us more at B = 1, K = 8 (the chain and the candidates read
    # lines of its rows again) and 0.5-8.8 us more at 1024 draft rows and more (B = 1024, K = 1 and
    # 4; B = 256, K = 4). With clean lines in L2 it took 0.5-0.9 us less at B = 256, K = 1 and 12 us
    # less at B = 1024, K = 1 and B = 256, K = 4 (benchmarks/RESULTS.md#fused-path-ab). A hint
    # only: the outputs are the same.
    stats_evict_first_min_drafts: int = 16
    stats_evict_first_max_drafts: int = 512
    # Up to this many steps (``KP``: K + 1 padded to a power of two, at least 2, so K <= 1), the
    # chain kernel reads the caller's tensors before it waits for the statistics kernel and takes
    # the statistics it merged from registers (``INPUTS_FIRST``). At K = 1 on an H200 that took
    # 0.5 us off B = 256, V = 131072, 0.9-1.2 off V = 152064, B = 1 and B = 1024; at K = 8 the
    # chain kernel's registers went from 80 to 148 and it cost 1.3-1.5 us at B = 1 and 64, and
    # 1.0 us at B = 256, K = 4 (benchmarks/RESULTS.md#tried-and-not-kept). The outputs are the same.
    inputs_first_max_steps: int = 2
    # Programmatic dependent launch (Hopper and later): each kernel after the statistics kernel is
    # launched while the previous one runs and waits for it on the device (the mass kernel before
    # a pick kernel: on its block's flags), which hides its launch (1-3 us less per call on an
    # H100). Taken where the device has it (``fused_plan.pdl``).
    pdl: bool = True


DEFAULT_TUNABLES = Tunables()
