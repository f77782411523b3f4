"""vLLM's sampling parameters (min-p, top-k, top-p) on the target rows, with vLLM's own code.

Shared by ``vllm-mrv2`` and ``vllm-v1``. What is applied, in which order, and which of vLLM's
functions runs where come from its declared contract (``docs/adapter-contracts.md``, "Sampling
parameters"), never from running it:

* per-request values as vLLM's state tables hold them (MRV2 ``sample/states.py::
  SamplingStates.add_request``, V1 ``gpu_input_batch.py::InputBatch.add_request``): top-k
  int32, the vocabulary where off (0, or any k >= V); top-p and min-p float32; greedy
  requests (T = 0) have none (``SamplingParams.__post_init__`` resets them);
* top-k / top-p: ``None`` for k or p when no request of the call uses it (MRV2
  ``SamplingStates.get_top_k_top_p``, V1 ``InputBatch.no_top_k`` / ``no_top_p``), per-row
  values otherwise. Which implementation runs is ``apply_top_k_top_p``'s dispatch:

  - CPU: vLLM without Triton (a CPU has no active Triton driver; a ``+cpu`` build with
    triton-cpu would run Triton, not modeled): the sort path, ``apply_top_k_top_p_pytorch``,
    with ``allow_cpu_sync=True`` from 0.22.0 (``CPU_SORT_SYNCS``; 0.19-0.21 call it without);
    tie rules ``"vllm-sort"``. (Under the interpreter vLLM's Triton top-k/top-p cannot run:
    it needs ``num_compute_units``, which the unspecified platform lacks.)
  - CUDA: ``apply_top_k_top_p`` itself; from 0.30.0 Triton whenever ``HAS_TRITON``
    (``TRITON_AT_ANY_ROWS``), up to 0.29.0 Triton from ``MIN_TRITON_ROWS`` rows in the call,
    else the sort path. Triton's tie rules are ``"vllm"``;

* min-p (MRV2 only): ``sample/min_p.py::apply_min_p(logits, expanded_idx_mapping, min_p)``
  in place, per state slot, skipped when no request uses it (``SamplingStates.apply_min_p``).

A batch whose ``processing`` (the tie rules its law follows) is not the rules a call will use
is declined (``Processor.tie_rules_reason``).
"""

from dataclasses import dataclass

import numpy as np
from packaging.version import Version

from harness.backends import shared_rows as rows
from harness.backends.vllm import env as vllm_env
from harness.protocol import host

TOPK_TOPP = "vllm.v1.sample.ops.topk_topp_sampler"
MIN_P = "vllm.v1.worker.gpu.sample.min_p"
MIN_TRITON_ROWS = 8  # apply_top_k_top_p up to 0.29.0: `if HAS_TRITON and logits.shape[0] >= 8`
_RULES = {
    "vllm": "the Triton kernel's (exactly k, ties to the lowest ids)",
    "vllm-sort": "the sort path's (every tie at the k-th value stays)",
}


@dataclass(frozen=True)
class ReleaseBoundary:
    """A convention that no signature shows, by release: absent up to ``last_without``,
    present from ``first_with``. A version between the two (a dev build of the next
    release) does not say."""

    what: str
    last_without: str
    first_with: str

    def holds(self, version: Version | None) -> bool | None:
        if version is None:
            return None
        if version >= Version(self.first_with):
            return True
        return False if version <= Version(self.last_without) else None


TRITON_AT_ANY_ROWS = ReleaseBoundary(
    "apply_top_k_top_p runs Triton whenever HAS_TRITON (before: only for calls of 8 rows or more, else the sort path)", "0.29.0", "0.30.0"
)
CPU_SORT_SYNCS = ReleaseBoundary(
    "on the CPU platform apply_top_k_top_p calls the sort path with allow_cpu_sync=True (top-k alone: apply_top_k_only)", "0.21.0", "0.22.0"
)


@dataclass(frozen=True)
class Params:
    """One batch's per-request parameters as vLLM's state tables hold them (host arrays)."""

    top_k: np.ndarray  # int32 [B]; the vocabulary where off
    top_p: np.ndarray  # float32 [B]; 1 where off
    min_p: np.ndarray  # float32 [B]; 0 where off
    vocab: int

    @property
    def do_top_k(self) -> bool:
        return bool((self.top_k != self.vocab).any())

    @property
    def do_top_p(self) -> bool:
        return bool((self.top_p != 1.0).any())

    @property
    def do_min_p(self) -> bool:
        return bool((self.min_p != 0.0).any())

    @property
    def has_topp_only_rows(self) -> bool:
        """MRV2 0.33's argument: some row has top-p and no active top-k."""
        return bool(((self.top_k >= self.vocab) & (self.top_p < 1.0)).any())

    def key(self):
        """The values as one float64 array (what a memoized processed tensor depends on)."""
        return np.concatenate([self.top_k, self.top_p, self.min_p]).astype(np.float64)


def _on_cpu(device) -> bool:
    import torch

    return torch.device(device).type == "cpu"


def _drift(e: Exception) -> str:
    text = str(e)
    return text if text.startswith("vLLM API changed") else str(vllm_env.api_changed(text))


def request_params(batch) -> Params | None:
    """``Params`` of a batch, None when no request has top-k, top-p or min-p in effect."""
    if not batch.has_sampling_params:
        return None
    b, vocab = batch.num_requests, batch.vocab_size
    greedy = host(batch.temperature) == 0  # vLLM resets top-k / top-p / min-p of greedy requests

    def field(x, off, dtype):
        return np.full(b, off, dtype=dtype) if x is None else host(x).astype(dtype)

    k = field(batch.top_k, 0, np.int64)
    k = np.where((k <= 0) | (k >= vocab) | greedy, vocab, k).astype(np.int32)
    p = np.where(greedy, 1.0, field(batch.top_p, 1.0, np.float32)).astype(np.float32)
    m = np.where(greedy, 0.0, field(batch.min_p, 0.0, np.float32)).astype(np.float32)
    params = Params(k, p, m, vocab)
    return params if params.do_top_k or params.do_top_p or params.do_min_p else None


class Processor:
    """This vLLM's min-p and top-k/top-p functions, and which implementation runs where.

    A function that is missing or takes other arguments is recorded, not raised: batches
    that need it raise the api-drift error (``require``), the others run as before.
    """

    def __init__(self, version: Version | None, with_min_p: bool):
        self.version = version
        self.drift = {}  # what -> the api-drift message
        self.dispatch = self.sort = self.min_p = None
        self.topp_only_arg = False
        try:
            module = vllm_env.import_vllm(TOPK_TOPP)
            self.dispatch, self.sort = (getattr(module, n, None) for n in ("apply_top_k_top_p", "apply_top_k_top_p_pytorch"))
            if self.dispatch is None or self.sort is None:
                raise vllm_env.api_changed(f"{TOPK_TOPP} has no apply_top_k_top_p / apply_top_k_top_p_pytorch")
            have = vllm_env.require_parameters(self.dispatch, ["logits", "k", "p"], f"{TOPK_TOPP}.apply_top_k_top_p")
            self.topp_only_arg = "has_topp_only_rows" in have  # 0.33.0 on
            vllm_env.require_parameters(self.sort, ["logits", "k", "p", "allow_cpu_sync"], f"{TOPK_TOPP}.apply_top_k_top_p_pytorch")
        except (ImportError, RuntimeError) as e:
            self.drift["top-k/top-p"] = _drift(e)
        if with_min_p:
            try:
                self.min_p = vllm_env.import_vllm(MIN_P).apply_min_p
                vllm_env.require_parameters(self.min_p, ["logits", "expanded_idx_mapping", "min_p"], f"{MIN_P}.apply_min_p")
            except (ImportError, AttributeError, RuntimeError) as e:
                self.drift["min-p"] = _drift(e)

    def require(self, params: Params) -> None:
        """Raise the api-drift error when ``params`` need a function this vLLM lacks."""
        if (params.do_top_k or params.do_top_p) and "top-k/top-p" in self.drift:
            raise RuntimeError(self.drift["top-k/top-p"])
        if params.do_min_p and "min-p" in self.drift:
            raise RuntimeError(self.drift["min-p"])

    def rules(self, device: str, num_rows: int) -> str | None:
        """The tie rules of a top-k/top-p call of ``num_rows`` rows on ``device``; None when
        this release does not say."""
        if _on_cpu(device):
            return "vllm-sort"
        if num_rows >= MIN_TRITON_ROWS:
            return "vllm"  # Triton in every release (HAS_TRITON: the adapters require it)
        anywhere = TRITON_AT_ANY_ROWS.holds(self.version)
        return None if anywhere is None else ("vllm" if anywhere else "vllm-sort")

    def tie_rules_reason(self, batch, params: Params | None, device: str, calls) -> str | None:
        """Why a batch whose law follows ``batch.processing`` cannot be verified by these
        top-k/top-p calls (``calls``: (what, rows) of each), or None."""
        wanted = batch.processing
        if wanted is None or params is None or not (params.do_top_k or params.do_top_p):
            return None
        for what, num_rows in calls:
            got = self.rules(device, num_rows)
            if got is None:
                return (
                    f"its law follows {wanted!r} top-k/top-p tie rules, and vLLM {self.version or '(no version)'} does not say which "
                    f"implementation a call of {num_rows} rows ({what}) runs: {TRITON_AT_ANY_ROWS.what} "
                    f"(from {TRITON_AT_ANY_ROWS.first_with}; up to {TRITON_AT_ANY_ROWS.last_without} only from {MIN_TRITON_ROWS} rows)"
                )
            if got != wanted:
                where = (
                    "on the CPU vLLM runs the sort path (apply_top_k_top_p_pytorch: no Triton driver)"
                    if _on_cpu(device)
                    else f"vLLM {self.version} runs {'Triton' if got == 'vllm' else 'the sort path'} for a call of {num_rows} rows"
                )
                return f"its law follows {wanted!r} top-k/top-p tie rules, {_RULES[wanted]}, but {where} ({what}): {got!r}, {_RULES[got]}"
        return None

    def apply(self, logits, row_request, params: Params, min_p_slots=None, topp_only_arg: bool = False):
        """vLLM's min-p (MRV2: ``min_p_slots`` = (expanded_idx_mapping, per-slot min-p)) then
        top-k/top-p on fp32 rows already divided by the temperature, request ``row_request[i]``
        owning row ``i``. ``topp_only_arg``: pass ``has_topp_only_rows`` where the signature
        has it (MRV2's ``SamplingStates.apply_top_k_top_p`` does; V1's
        ``apply_sampling_constraints`` never passes it). Returns a new tensor: ``logits`` is
        never modified (vLLM works in place on its own fp32 copy).

        A row shared by every request (a stride-0 view) with parameters that are the same for
        every row is processed in a call of ``min(rows, MIN_TRITON_ROWS)`` copies, which vLLM's
        dispatch treats as it treats all the rows, and expanded again."""
        import torch

        self.require(params)
        device = logits.device
        req = row_request.to(device=device, dtype=torch.int64)
        k = torch.from_numpy(params.top_k).to(device)[req] if params.do_top_k else None
        p = torch.from_numpy(params.top_p).to(device)[req] if params.do_top_p else None
        num_rows, vocab = logits.shape
        mapping = None if min_p_slots is None or not params.do_min_p else min_p_slots[0]
        shared = rows.is_shared(logits) and num_rows > 0
        if shared:
            per_row = [x for x in (k, p, None if mapping is None else min_p_slots[1][mapping.long()]) if x is not None]
            shared = all(bool((x == x[0]).all()) for x in per_row)
        n = min(num_rows, MIN_TRITON_ROWS) if shared else num_rows
        work = torch.empty((n, vocab), dtype=torch.float32, device=device)
        work.copy_(logits[:n])
        if mapping is not None:
            self.min_p(work, mapping[:n], min_p_slots[1])
        if k is not None or p is not None:
            k, p = (None if x is None else x[:n].contiguous() for x in (k, p))
            if device.type == "cpu":
                work = self.sort(work, k, p, allow_cpu_sync=CPU_SORT_SYNCS.holds(self.version) is not False)
            elif topp_only_arg and self.topp_only_arg:
                work = self.dispatch(work, k, p, has_topp_only_rows=params.has_topp_only_rows)
            else:
                work = self.dispatch(work, k, p)
        return work[:1].expand(num_rows, vocab) if shared else work
