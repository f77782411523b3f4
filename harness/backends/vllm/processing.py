"""vLLM's sampling parameters (logit bias, min-p, top-k, top-p) on the target rows, with vLLM's own code.

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
* logit bias (MRV2 only): ``sample/logit_bias.py::apply_logit_bias`` (its ``_bias_kernel``:
  ``logits += bias`` in float32) on an fp32 copy of the raw target rows, *before* the
  temperature, with per-slot tables as ``LogitBiasState.add_request`` writes them (at most
  ``MAX_LOGIT_BIAS_TOKENS`` ids a request; no allowed ids, no min-tokens), as
  ``Sampler.apply_sampling_params`` runs its first logits processor on every row the
  verifier hands it (``spec_decode/rejection_sampler.py::RejectionSampler._verify``, every
  release from 0.19.1 to 0.33.0). The adapters hand ``Processor.apply`` rows already divided
  by T, so a biased batch's rows are rebuilt from its raw rows (``LogitBias.target``), biased,
  then divided as the adapters divide (fp32 ``/ T``, greedy rows by 1). V1 applies none:
  ``logit_bias_reason`` declines (``v1/sample/logits_processor/__init__.py::
  build_logitsprocs`` builds only ``MinTokensLogitsProcessor`` under a speculative config).
  Both runners' requests never get here through vLLM's front door:
  ``sampling_params.py::SamplingParams._validate_spec_decode`` rejects any logit_bias with a
  speculative config; what is verified is the verifier's own code path, as for min-p.

A batch whose ``processing`` (the tie rules its law follows) is not the rules a call will use
is declined (``Processor.tie_rules_reason``).
"""

from dataclasses import dataclass, field

import numpy as np
from packaging.version import Version

from harness.backends import shared_rows as rows
from harness.backends.vllm import env as vllm_env
from harness.protocol import host

TOPK_TOPP = "vllm.v1.sample.ops.topk_topp_sampler"
MIN_P = "vllm.v1.worker.gpu.sample.min_p"
LOGIT_BIAS = "vllm.v1.worker.gpu.sample.logit_bias"
# apply_logit_bias's arguments in every release read (0.19.1 to 0.33.0); 0.29.0 on adds
# restore_when_all_masked and check_all_masked_rows (min-tokens with structured outputs).
LOGIT_BIAS_ARGS = [
    "logits", "expanded_idx_mapping", "pos", "num_allowed_token_ids", "allowed_token_ids", "num_logit_bias",
    "logit_bias_token_ids", "logit_bias", "min_lens", "num_stop_token_ids", "stop_token_ids",
]  # fmt: skip
MAX_LOGIT_BIAS_TOKENS = 1024  # logit_bias.py::MAX_NUM_LOGIT_BIAS_TOKENS (every release): add_request raises past it
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
class LogitBias:
    """A batch's logit biases as MRV2's ``LogitBiasState`` tables hold them (host arrays),
    with what adding them before the temperature needs: the raw target rows and T."""

    counts: np.ndarray  # int32 [B]: num_logit_bias
    ids: np.ndarray  # int32 [B, L]: logit_bias_token_ids, packed to the left (0 past the count)
    values: np.ndarray  # float32 [B, L]: logit_bias (0 past the count)
    temperature: np.ndarray  # float64 [B]: the requests' T (0: greedy, divided by 1)
    target: object = field(compare=False, repr=False)  # the batch's target rows before temperature

    def key(self) -> np.ndarray:
        return np.concatenate([self.counts, self.ids.ravel(), self.values.ravel(), self.temperature]).astype(np.float64)

    def request(self, r: int) -> str:
        """Request ``r``'s bias, briefly (for a reason)."""
        pairs = ", ".join(
            f"{int(i)}: {float(b):g}" for i, b in zip(self.ids[r, : self.counts[r]][:3], self.values[r, : self.counts[r]][:3])
        )
        return "{" + pairs + (", ..." if self.counts[r] > 3 else "") + "}"


@dataclass(frozen=True)
class Params:
    """One batch's per-request parameters as vLLM's state tables hold them (host arrays)."""

    top_k: np.ndarray  # int32 [B]; the vocabulary where off
    top_p: np.ndarray  # float32 [B]; 1 where off
    min_p: np.ndarray  # float32 [B]; 0 where off
    vocab: int
    logit_bias: LogitBias | None = None  # None: no request has a bias

    @property
    def do_logit_bias(self) -> bool:
        return self.logit_bias is not None

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
        bias = [] if self.logit_bias is None else [self.logit_bias.key()]
        return np.concatenate([self.top_k, self.top_p, self.min_p, *bias]).astype(np.float64)


def _on_cpu(device) -> bool:
    import torch

    return torch.device(device).type == "cpu"


def _drift(e: Exception) -> str:
    text = str(e)
    return text if text.startswith("vLLM API changed") else str(vllm_env.api_changed(text))


def logit_bias(batch) -> LogitBias | None:
    """The batch's ``LogitBias`` (greedy requests keep theirs: vLLM resets only top-k, top-p
    and min-p), None when no request has a bias."""
    if getattr(batch, "logit_bias_ids", None) is None:
        return None
    ids, values = host(batch.logit_bias_ids).astype(np.int64), host(batch.logit_bias).astype(np.float32)
    used = ids >= 0
    if not used.any():
        return None
    order = np.argsort(~used, axis=1, kind="stable")  # each request's ids first, in their order
    ids, values, used = (np.take_along_axis(x, order, axis=1) for x in (ids, values, used))
    return LogitBias(
        counts=used.sum(axis=1).astype(np.int32),
        ids=np.where(used, ids, 0).astype(np.int32),
        values=np.where(used, values, 0.0).astype(np.float32),
        temperature=host(batch.temperature).astype(np.float64),
        target=batch.target_logits,
    )


def request_params(batch) -> Params | None:
    """``Params`` of a batch, None when no request has top-k, top-p, min-p or a logit bias in effect."""
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
    params = Params(k, p, m, vocab, logit_bias(batch))
    return params if params.do_top_k or params.do_top_p or params.do_min_p or params.do_logit_bias else None


class Processor:
    """This vLLM's min-p and top-k/top-p functions, and which implementation runs where.

    A function that is missing or takes other arguments is recorded, not raised: batches
    that need it raise the api-drift error (``require``), the others run as before.
    """

    def __init__(self, version: Version | None, with_min_p: bool):
        self.version = version
        self.drift = {}  # what -> the api-drift message
        self.dispatch = self.sort = self.min_p = self.logit_bias = None
        self.topp_only_arg = False
        self.runner = "MRV2" if with_min_p else "V1"  # MRV2's verifier applies min-p and logit bias, V1's neither
        self.bias_args: list[str] = []
        self.no_bias_module = None  # why this vLLM tree has no logit-bias module (a python-only tree may lack it)
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
            try:
                module = vllm_env.import_vllm(LOGIT_BIAS)
            except ImportError as e:
                self.no_bias_module = str(e).split("; install")[0]
            else:
                try:
                    self.logit_bias = getattr(module, "apply_logit_bias", None)
                    if self.logit_bias is None:
                        raise vllm_env.api_changed(f"{LOGIT_BIAS} has no apply_logit_bias")
                    self.bias_args = vllm_env.require_parameters(self.logit_bias, LOGIT_BIAS_ARGS, f"{LOGIT_BIAS}.apply_logit_bias")
                except RuntimeError as e:
                    self.drift["logit bias"] = _drift(e)

    def require(self, params: Params) -> None:
        """Raise the api-drift error when ``params`` need a function this vLLM lacks."""
        if (params.do_top_k or params.do_top_p) and "top-k/top-p" in self.drift:
            raise RuntimeError(self.drift["top-k/top-p"])
        if params.do_min_p and "min-p" in self.drift:
            raise RuntimeError(self.drift["min-p"])
        if params.do_logit_bias and "logit bias" in self.drift:
            raise RuntimeError(self.drift["logit bias"])

    def logit_bias_reason(self, params: Params | None) -> str | None:
        """Why a batch's logit biases cannot be verified by this runner, or None (no bias, or
        MRV2 with its ``apply_logit_bias``)."""
        if params is None or params.logit_bias is None:
            return None
        bias = params.logit_bias
        r = int(np.flatnonzero(bias.counts)[0])
        if self.runner == "V1":
            return (
                f"logit bias (request {r}: {bias.request(r)}): vLLM V1 applies no logit bias with speculative decoding "
                "(v1/sample/logits_processor/__init__.py::build_logitsprocs builds only MinTokensLogitsProcessor under a "
                "speculative config, so neither RejectionSampler.apply_logits_processors nor the bonus token's sampler adds it; "
                "SamplingParams._validate_spec_decode rejects logit_bias)"
            )
        if self.no_bias_module is not None:
            return f"logit bias (request {r}: {bias.request(r)}): this vLLM has no {LOGIT_BIAS} to apply it with ({self.no_bias_module})"
        many = np.flatnonzero(bias.counts > MAX_LOGIT_BIAS_TOKENS)
        if many.size:
            return (
                f"logit bias of {int(bias.counts[many[0]])} tokens (request {int(many[0])}): vLLM MRV2 takes at most "
                f"{MAX_LOGIT_BIAS_TOKENS} a request (LogitBiasState.add_request raises past MAX_NUM_LOGIT_BIAS_TOKENS)"
            )
        return None

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
        top-k/top-p calls (``calls``: (what, rows) of each), or None. A logit bias the runner
        does not apply is declined first (``logit_bias_reason``)."""
        reason = self.logit_bias_reason(params)
        if reason:
            return reason
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
        bias = params.logit_bias
        if bias is not None and (min_p_slots is None or self.logit_bias is None):
            raise RuntimeError(f"vLLM {self.runner}: no logit bias is applied here ({self.logit_bias_reason(params)})")
        shared = rows.is_shared(logits) and num_rows > 0
        if shared:
            per_row = [x for x in (k, p, None if mapping is None else min_p_slots[1][mapping.long()]) if x is not None]
            shared = all(bool((x == x[0]).all()) for x in per_row) and (bias is None or _same_bias(bias))
        n = min(num_rows, MIN_TRITON_ROWS) if shared else num_rows
        if bias is None:
            work = torch.empty((n, vocab), dtype=torch.float32, device=device)
            work.copy_(logits[:n])
        else:  # vLLM adds the bias before the temperature: from the raw rows, then divided as the adapters divide
            work = self._biased(bias, req[:n], min_p_slots, vocab, device)
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

    def _biased(self, bias: LogitBias, req, min_p_slots, vocab: int, device):
        """fp32 raw target rows (of requests ``req``) with vLLM's ``apply_logit_bias`` as
        ``LogitBiasState.apply`` calls it, per state slot (``min_p_slots[0]``: each row's slot;
        unused slots hold one NaN bias on token 0, so reading a wrong slot shows up), then divided
        by the row's T in fp32 (greedy rows by 1), as the adapters divide the unbiased rows."""
        import torch

        n = req.numel()
        raw = bias.target if isinstance(bias.target, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(bias.target))
        work = torch.empty((n, vocab), dtype=torch.float32, device=device)
        work.copy_(raw[:n])  # apply_sampling_params: torch.empty_like(logits, dtype=float32).copy_(logits)
        mapping = min_p_slots[0][:n].to(device)
        num_slots = min_p_slots[1].numel()
        slot_of = torch.full((bias.counts.size,), -1, dtype=torch.int64, device=device)
        slot_of[req] = mapping.to(torch.int64)
        ids, width = bias.ids, max(bias.ids.shape[1], 1)
        i32 = dict(dtype=torch.int32, device=device)
        counts_t = torch.ones(num_slots, **i32)  # unused slots: one NaN bias on token 0
        ids_t = torch.zeros((num_slots, width), **i32)
        values_t = torch.full((num_slots, width), float("nan"), dtype=torch.float32, device=device)
        seen = torch.unique(req)
        slots = slot_of[seen]
        counts_t[slots] = torch.from_numpy(bias.counts).to(device)[seen]
        ids_t[slots, : ids.shape[1]] = torch.from_numpy(ids).to(device)[seen]
        values_t[slots, : ids.shape[1]] = torch.from_numpy(bias.values).to(device)[seen]
        zeros = torch.zeros(num_slots, **i32)
        tables = dict(
            num_allowed_token_ids=zeros, allowed_token_ids=torch.zeros((num_slots, 1), **i32), num_logit_bias=counts_t,
            logit_bias_token_ids=ids_t, logit_bias=values_t, min_lens=zeros, num_stop_token_ids=zeros,
            stop_token_ids=torch.zeros((num_slots, 1), **i32),
        )  # fmt: skip
        if "restore_when_all_masked" in self.bias_args:  # 0.29.0 on
            tables["restore_when_all_masked"] = zeros
        pos = torch.zeros(n, dtype=torch.int64, device=device)  # read for min-tokens only: no stop ids here
        self.logit_bias(work, mapping, pos, **tables)
        t = torch.from_numpy(bias.temperature).to(device)[req]
        return work / torch.where(t > 0, t, 1.0).to(torch.float32)[:, None]


def _same_bias(bias: LogitBias) -> bool:
    """Every request has the same bias and T (a shared row then stays shared)."""
    return all(bool((x == x[:1]).all()) for x in (bias.counts, bias.ids, bias.values, bias.temperature))
