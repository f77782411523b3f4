"""The suite's own Triton sampler: every verification method behind the protocol (``triton``).

``TritonBackend``, and ``verify``, which sends a batch down the fused path (``fused.verify_fused``:
three to five launches, no host synchronization) or the staged one (``staged.verify_staged``: up
to ten launches; planted faults live there). Both give the same outputs; ``path`` chooses, and the default takes the fused path up
to a batch size per vocabulary (``takes_fused_path``, from ``Tunables``). ``README.md`` in this
folder describes the modules and both paths.
"""

import os

import torch

from harness.backends import shared_rows as rows
from harness.backends.triton import drafting, fused, processing, staged
from harness.backends.triton.tunables import DEFAULT_TUNABLES, Tunables
from harness.protocol import method_codes
from reference.methods import Method

PATHS = ("auto", "fused", "staged")


def takes_fused_path(
    path: str, num_requests: int, fused_max_requests: int | None = None, fault: int = 0, cuda: bool = False, vocab: int = 1,
    tunables: Tunables = DEFAULT_TUNABLES,
) -> bool:  # fmt: skip
    """Whether ``verify`` runs a batch of ``num_requests`` on the fused path: "auto" takes
    it up to ``fused_max_requests`` requests (default: ``tunables.fused_max_requests_cpu``, or on
    CUDA as many as keep ``num_requests * vocab`` within ``tunables.fused_max_logits_cuda``).
    Planted faults (``fault != 0``) always take the staged path: they are planted in its kernels."""
    if path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    if fused_max_requests is None:
        fused_max_requests = tunables.fused_max_logits_cuda // max(vocab, 1) if cuda else tunables.fused_max_requests_cpu
    return fault == 0 and (path == "fused" or (path == "auto" and num_requests <= fused_max_requests))


def verify(
    target_logits, draft_logits, draft_tokens, cu_num_drafts, temperature, seeds, positions, methods,
    synthetic_rates, max_drafts: int, *, has_strict: bool = True, has_block: bool = True, has_synthetic: bool = True,
    block_v: int | None = None, splits: int | None = None, fault: int = 0, path: str = "auto",
    fused_max_requests: int | None = None, tunables: Tunables = DEFAULT_TUNABLES,
):  # fmt: skip
    """Device-side verification of one batch of torch tensors (``VerifyBatch`` layout).

    The ``has_*`` flags only skip work (a method absent from the batch); leaving them True
    is always correct. ``fault``: a planted bug's code (``harness.backends.triton.faults``), 0 none.
    ``path``: "fused", "staged", or "auto" (fused up to ``fused_max_requests`` requests;
    faults always staged: ``takes_fused_path``); both give the same outputs. ``tunables``: the
    thresholds, tile widths and launch plan (``tunables.Tunables``).
    Returns ``(tokens [B, K+1] int64, num_emitted [B] int64)``; slots past ``num_emitted``
    hold -1.
    """
    vocab = target_logits.shape[1]
    if takes_fused_path(path, cu_num_drafts.numel() - 1, fused_max_requests, fault, target_logits.is_cuda, vocab, tunables):
        return fused.verify_fused(
            target_logits, draft_logits, draft_tokens, cu_num_drafts, temperature, seeds, positions, methods, synthetic_rates,
            max_drafts, has_strict=has_strict, has_block=has_block, has_synthetic=has_synthetic, block_v=block_v, splits=splits,
            tunables=tunables,
        )  # fmt: skip
    return staged.verify_staged(
        target_logits, draft_logits, draft_tokens, cu_num_drafts, temperature, seeds, positions, methods, synthetic_rates,
        max_drafts, has_strict=has_strict, has_block=has_block, has_synthetic=has_synthetic, block_v=block_v, splits=splits,
        fault=fault, tunables=tunables,
    )  # fmt: skip


class TritonBackend:
    """Greedy, strict, standard (with or without draft logits), block and synthetic in Triton.

    ``device`` is "cpu" (Triton interpreter, TRITON_INTERPRET=1) or "cuda"; the runner sets it.
    On CUDA, logits are cast to ``batch.logits_dtype`` (exact by the protocol: half the
    bytes to read for bf16 / fp16 batches). ``path``: "auto" (fused up to
    ``fused_max_requests`` requests, staged above), "fused" or "staged" (``verify``).
    ``tunables``: thresholds, tile widths and launch plan (default ``DEFAULT_TUNABLES``; a variant
    is a ``dataclasses.replace`` of it). Top-k, top-p and min-p (vLLM's Triton rules) are applied
    to a copy of the target rows before either path (``processing.processed_target``); a batch
    whose law follows the sort path's tie rules is declined (``supports``). A batch with
    ``draft_sampling`` (``drafter``) has its drafts drawn on the device first
    (``drafting.draft``), once, then verified on either path; ``sample`` returns them too.
    """

    name = "triton"
    devices = ("cpu", "cuda")
    device_batches = True  # takes batches built on its device (harness.sampling.device.trials)
    shared_rows = True  # reads rows through their stride: stride-0 logits stay views
    drafter = True  # draws its own drafts when a batch asks (``draft_sampling``: ``drafting``)

    def __init__(
        self, device: str = "cpu", block_v: int | None = None, splits: int | None = None, path: str = "auto",
        fused_max_requests: int | None = None, tunables: Tunables = DEFAULT_TUNABLES,
    ):  # fmt: skip
        if not isinstance(tunables, Tunables):
            raise TypeError(f"tunables: expected a Tunables, got {type(tunables).__name__}")
        self.device = device
        self.tiles = {"block_v": block_v, "splits": splits}  # None: chosen from the vocabulary
        takes_fused_path(path, 0)  # a wrong name fails here, not at the first batch
        self.path = {"path": path, "fused_max_requests": fused_max_requests}
        self.tunables = tunables

    def supports(self, batch) -> str | None:
        if Method.TYPICAL in method_codes(batch):
            return "typical acceptance: not implemented by the Triton sampler"
        if Method.FLY in method_codes(batch):
            return "FLy: not implemented by the Triton sampler"
        return processing.declines(batch)

    def sample(self, batch):
        if self.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("triton backend on cpu needs TRITON_INTERPRET=1 set before triton is imported")
        flags = {}  # the has_* flags: all True unless known
        fault = self.tiles.get("fault", 0)
        fused = takes_fused_path(
            **self.path,
            num_requests=batch.num_requests,
            fault=fault,
            cuda=self.device == "cuda",
            vocab=batch.vocab_size,
            tunables=self.tunables,
        )
        # Reading a CUDA batch's methods synchronizes: worth it for the staged path only.
        if batch.method_codes is not None or not (fused and getattr(batch.methods, "is_cuda", False)):
            codes = method_codes(batch)
            flags = {f"has_{m.name.lower()}": bool(m in codes) for m in (Method.STRICT, Method.BLOCK, Method.SYNTHETIC)}
        t = batch.to_torch(self.device)
        # The interpreter reads fp32; CUDA reads the batch's dtype (half the bytes for bf16 / fp16).
        dtype = torch.float32 if self.device == "cpu" else getattr(torch, getattr(batch, "logits_dtype", "float32"))
        t["target_logits"] = rows.cast(t["target_logits"], dtype)
        t["draft_logits"] = None if t["draft_logits"] is None else rows.cast(t["draft_logits"], dtype)
        sampling = getattr(batch, "draft_sampling", None)
        drafts = None
        if sampling is not None:  # drawn once, before the dispatch: both paths verify the same drafts
            drafts = drafting.draft(t, sampling, block_v=self.tiles["block_v"], fault=fault)
        if batch.has_sampling_params:  # removed tokens become -inf in a copy; the kernels stay as they are
            t["target_logits"] = processing.processed_target(
                t["target_logits"], t["cu_num_drafts"], t["temperature"], t["top_k"], t["top_p"], t["min_p"], fault,
                t.get("logit_bias_ids"), t.get("logit_bias"),
            )  # fmt: skip
        out = verify(
            t["target_logits"], t["draft_logits"], t["draft_tokens"], t["cu_num_drafts"], t["temperature"], t["seeds"],
            t["positions"], t["methods"], t["synthetic_rates"], batch.max_drafts, **flags, **self.tiles, **self.path,
            tunables=self.tunables,
        )  # fmt: skip
        return out if drafts is None else (*out, drafts)


# --- backends with the path forced (``--backend harness.backends.triton.backend:FusedTritonBackend``) ---
class FusedTritonBackend(TritonBackend):
    """The Triton sampler on its fused path at every batch size."""

    name = "triton-fused"

    def __init__(self, device: str = "cpu", block_v: int | None = None, splits: int | None = None, tunables: Tunables = DEFAULT_TUNABLES):
        super().__init__(device, block_v, splits, path="fused", tunables=tunables)


class StagedTritonBackend(TritonBackend):
    """The Triton sampler on its staged path at every batch size."""

    name = "triton-staged"

    def __init__(self, device: str = "cpu", block_v: int | None = None, splits: int | None = None, tunables: Tunables = DEFAULT_TUNABLES):
        super().__init__(device, block_v, splits, path="staged", tunables=tunables)
