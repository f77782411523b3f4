"""vLLM Model Runner V2's rejection sampler behind the protocol (``vllm-mrv2``).

Calls vLLM's own functions; which ones, and what they take, comes from vLLM's declared
contract (``docs/adapter-contracts.md``), never from running them:

* 0.22 .. 0.33 API: ``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils.
  rejection_sample``: standard (with draft logits or one-hot), greedy (T = 0), synthetic
  (``synthetic_conditional_rates``), block (``use_block_verification``, from 0.25) and FLy
  (``fly_window_size`` > 0, ``fly_entropy_threshold``, ``fly_entropy_top_k``, from 0.33: the
  batch's one set, as ``RejectionSampler.__init__`` reads them from ``SpeculativeConfig``;
  ``reference.fly``);
* 0.19 to 0.21 APIs, a function per method: ``probabilistic_rejection_sample`` (0.19:
  ``rejection_sampler``; 0.20-0.21: ``probabilistic_rejection_sampler_utils``, draft logits
  optional from 0.21), ``rejection_sampler.strict_rejection_sample`` (0.19-0.20) and
  ``synthetic_rejection_sampler_utils.synthetic_rejection_sample`` (0.19: ``(base_acceptance_rate,
  decay_factor)``; 0.20-0.21: conditional ``acceptance_rates``); strict and synthetic target
  tokens come from vLLM's own ``gumbel_sample``, as the engine's sampler would produce them;
* anything else: the api-drift error ("vLLM API changed").

Translation of a ``VerifyBatch`` (vLLM's production layout, see the vLLM notes):

* rows are flattened per request; request ``r`` owns ``cu_num_logits[r] ..`` (``d_r + 1``
  rows); the draft verified at row ``j`` is ``draft_sampled[row + 1]``; the first entry of a
  request (its last committed token) is set to 0;
* request-state slots are the batch's ``request_slots`` (else a reversed permutation), with
  unused slots poisoned with NaN, so reading ``req_idx`` where ``req_state_idx`` is meant (or
  a wrong draft step) shows up;
* target logits are passed temperature-processed (vLLM's sampler divides before calling, in
  every release) and, with top-k / top-p / min-p, processed further by vLLM's own functions
  as ``Sampler.apply_sampling_params`` runs them on every logits row: min-p
  (``sample/min_p.py::apply_min_p``), then ``apply_top_k_top_p`` (the CPU: its sort path;
  see ``harness.backends.vllm.processing``). 0.19-0.21's strict and synthetic target
  tokens are then ``gumbel_sample(processed, apply_temperature=False)``, as its ``Sampler.sample``;
* draft logits go into the ``[max_num_reqs, K, V_draft]`` cache as the release's drafter
  writes it: raw, in the logits' dtype, from 0.28.0 (#50910: the kernels divide on load),
  divided by T in fp32 up to 0.27.1. The release says which (``DRAFT_LOGITS_RAW``), and so
  does the signature of the drafter's ``gumbel_sample`` (``logits_cache`` against
  ``output_processed_logits`` / ``processed_logits_out``); when both speak they must agree.
  A kernel that divides when its release says it does not (or the reverse) then fails the
  statistical checks: nothing here adapts to it;
* up to 0.24 the kernels read the draft cache at the target's width, so a narrower draft
  vocabulary is padded with -inf; from 0.25 they cut the target to the cache's width
  (``TRUNCATES_TARGET``);
* vLLM leaves the outputs past ``num_sampled`` uninitialised: they are set to -1 here.

What one vLLM call cannot express is reported by ``supports(batch)`` (the runner then skips
the check): a batch mixing methods, strict verification (gone after 0.19), per-request
synthetic rates, FLy before 0.33 or with per-request parameters, from 0.25 a draft vocabulary narrower than the target's while the target
gives mass to the missing ids (vLLM MRV2 then truncates the target to the draft's width, a
documented convention; see ``reference``), and a law following other top-k/top-p tie rules
(``batch.processing``) than the call will use.
"""

import inspect

import numpy as np
from packaging.version import Version

from harness.backends import shared_rows as rows
from harness.backends.logits_cache import LogitsMemo
from harness.backends.vllm import env as vllm_env
from harness.backends.vllm import processing
from harness.backends.vllm.processing import ReleaseBoundary
from harness.protocol import host, method_codes
from reference.methods import Method

_UTILS = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
_LEGACY = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
_LEGACY_SYNTHETIC = "vllm.v1.worker.gpu.spec_decode.synthetic_rejection_sampler_utils"
_GUMBEL = "vllm.v1.worker.gpu.sample.gumbel"
_PROBABILISTIC_020 = "vllm.v1.worker.gpu.spec_decode.probabilistic_rejection_sampler_utils"
_DRAFT_LOGITS_CACHE = "vllm.v1.worker.gpu.spec_decode.draft_logits"
_CORE_ARGS = [
    "target_logits", "draft_logits", "draft_sampled", "cu_num_logits", "pos", "idx_mapping",
    "expanded_idx_mapping", "expanded_local_pos", "temperature", "seed", "num_speculative_steps",
]  # fmt: skip
_SYNTHETIC_ARGS = {  # synthetic_rejection_sample's rate arguments: 0.19's (a0, gamma), 0.20-0.21's conditional rates
    "geometric": ["target_sampled", "draft_sampled", "cu_num_logits", "pos", "idx_mapping", "seed", "base_acceptance_rate", "decay_factor"],
    "conditional": ["target_sampled", "draft_sampled", "cu_num_logits", "pos", "idx_mapping", "seed", "acceptance_rates"],
}
# gumbel_sample's draft-cache argument names what the drafter caches: True raw, False divided by T.
_DRAFT_CACHE_ARGS = {"logits_cache": True, "output_processed_logits": False, "processed_logits_out": False}


DRAFT_LOGITS_RAW = ReleaseBoundary(
    "the drafter caches raw draft logits and the kernels divide them by the temperature on load (#50910)", "0.27.1", "0.28.0"
)
TRUNCATES_TARGET = ReleaseBoundary(
    "rejection_sample cuts the target to the draft cache's width (vocab_size = min(V, V_draft))", "0.24.0", "0.25.0"
)


def draft_logits_raw(version: Version | None, gumbel_params) -> bool:
    """Whether this vLLM's kernels take raw draft logits (True) or divided ones (False), from
    its release and the signature of the drafter's ``gumbel_sample``; api-drift when the
    signature matches no known contract or the two disagree."""
    named = {_DRAFT_CACHE_ARGS[p] for p in gumbel_params if p in _DRAFT_CACHE_ARGS}
    if len(named) != 1:
        raise vllm_env.api_changed(
            f"{_GUMBEL}.gumbel_sample names no known draft-logits cache "
            f"({' / '.join(_DRAFT_CACHE_ARGS)}; it has {list(gumbel_params)}): what the MRV2 kernels expect in draft_logits is unknown"
        )
    raw = named.pop()
    by_release = DRAFT_LOGITS_RAW.holds(version)
    if by_release is not None and by_release != raw:
        raise vllm_env.api_changed(
            f"vLLM {version} is {'at or after' if by_release else 'before'} {DRAFT_LOGITS_RAW.first_with} "
            f"({DRAFT_LOGITS_RAW.what}), but its gumbel_sample caches {'raw' if raw else 'divided'} logits"
        )
    return raw


def _discover():
    vllm_env.import_vllm("vllm")
    version = vllm_env.version()
    gumbel = vllm_env.import_vllm(_GUMBEL)
    gumbel_params = vllm_env.parameters(gumbel.gumbel_sample)
    utils = vllm_env.optional_module(_UTILS)
    if utils is not None and hasattr(utils, "rejection_sample"):
        # 0.34.0 passes the draft logits as a DraftLogitsCache object (draft_logits_cache).
        wrap = "draft_logits_cache" in vllm_env.parameters(utils.rejection_sample)
        core = [("draft_logits_cache" if a == "draft_logits" and wrap else a) for a in _CORE_ARGS]
        vllm_env.require_parameters(utils.rejection_sample, core, f"{_UTILS}.rejection_sample")
        raw = draft_logits_raw(version, gumbel_params)
        cache_class = _draft_logits_cache_class() if wrap else None
        vllm_env.triton_ready()
        processor = processing.Processor(version, True)
        return _CurrentApi(utils.rejection_sample, version, raw, TRUNCATES_TARGET.holds(version), processor, cache_class)
    probabilistic_020 = vllm_env.optional_module(_PROBABILISTIC_020)
    legacy = vllm_env.optional_module(_LEGACY)
    if probabilistic_020 is not None or (legacy is not None and hasattr(legacy, "strict_rejection_sample")):
        return _per_method_api(version, gumbel, gumbel_params, legacy, probabilistic_020)
    raise vllm_env.api_changed(
        f"no MRV2 rejection sampler found: neither {_UTILS}.rejection_sample (0.22-0.33), "
        f"{_PROBABILISTIC_020}.probabilistic_rejection_sample (0.20-0.21) "
        f"nor {_LEGACY}.strict_rejection_sample/probabilistic_rejection_sample (0.19)"
    )


def _draft_logits_cache_class():
    """0.34.0's ``DraftLogitsCache``: its replicated form (every request at row req_state_idx,
    ``row_mapping`` None) is the one-rank engine's; ``rejection_sample`` reads ``.values`` and
    ``.row_mapping``."""
    module = vllm_env.optional_module(_DRAFT_LOGITS_CACHE)
    cls = getattr(module, "DraftLogitsCache", None)
    if cls is None:
        raise vllm_env.api_changed(f"rejection_sample takes draft_logits_cache but {_DRAFT_LOGITS_CACHE}.DraftLogitsCache is missing")
    return cls


def _replicated_cache(cls, values):
    """A ``DraftLogitsCache`` holding ``values`` as the replicated cache its __init__ builds
    without sharding (``row_mapping`` None), without allocating a second cache."""
    cache = cls.__new__(cls)
    cache.values, cache.row_mapping = values, None
    return cache


def _per_method_api(version, gumbel, gumbel_params, legacy, probabilistic_020) -> "_PerMethodApi":
    """0.19 to 0.21: a function per method. 0.19.1: strict and probabilistic in
    ``rejection_sampler``, synthetic ``(base_acceptance_rate, decay_factor)``; 0.20.x:
    probabilistic in ``probabilistic_rejection_sampler_utils`` (draft logits required), strict
    in ``rejection_sampler``, synthetic ``acceptance_rates`` (conditional, one per step);
    0.21.0: the same without strict, and draft logits optional (one-hot drafts when None)."""
    module, where = (probabilistic_020, _PROBABILISTIC_020) if probabilistic_020 is not None else (legacy, _LEGACY)
    if not hasattr(module, "probabilistic_rejection_sample"):
        raise vllm_env.api_changed(f"{where} has no probabilistic_rejection_sample")
    probabilistic = module.probabilistic_rejection_sample
    vllm_env.require_parameters(probabilistic, _CORE_ARGS, f"{where}.probabilistic_rejection_sample")
    vllm_env.require_parameters(gumbel.gumbel_sample, ["logits", "apply_temperature"], f"{_GUMBEL}.gumbel_sample")
    strict = getattr(legacy, "strict_rejection_sample", None) if legacy is not None else None
    synthetic = vllm_env.optional_module(_LEGACY_SYNTHETIC)
    rates = None
    if synthetic is not None:
        params = vllm_env.parameters(synthetic.synthetic_rejection_sample)
        forms = [form for form, args in _SYNTHETIC_ARGS.items() if all(a in params for a in args)]
        if len(forms) != 1:
            raise vllm_env.api_changed(
                f"{_LEGACY_SYNTHETIC}.synthetic_rejection_sample takes {list(params)}: neither 0.19's "
                f"{_SYNTHETIC_ARGS['geometric']} nor 0.20-0.21's {_SYNTHETIC_ARGS['conditional']}"
            )
        rates = forms[0]
    if draft_logits_raw(version, gumbel_params):
        raise vllm_env.api_changed(f"vLLM {version}'s 0.19-0.21 MRV2 API with a raw draft-logits cache is no known contract")
    # 0.21.0 declares draft_logits optional ("torch.Tensor | None"): one-hot drafts when None.
    optional = "None" in str(inspect.signature(probabilistic).parameters["draft_logits"].annotation)
    vllm_env.triton_ready()
    entry_points = f"{where}.probabilistic_rejection_sample{' + strict' if strict else ''}{' + synthetic' if synthetic else ''}"
    description = f"{entry_points} (vLLM {version or 'of undeclared version'}: draft logits divided by T)"
    processor = processing.Processor(version, True)
    return _PerMethodApi(probabilistic, strict, synthetic, rates, optional, gumbel.gumbel_sample, description, processor)


def availability() -> tuple[bool, str]:
    return vllm_env.availability(_discover)


class VllmMrv2Backend:
    """vLLM MRV2 rejection sampling (Triton; CPU under TRITON_INTERPRET=1, or CUDA)."""

    name = "vllm-mrv2"
    devices = ("cpu", "cuda")
    device_batches = True  # takes batches built on its device (harness.sampling.device.trials)
    shared_rows = True  # vLLM reads target rows by stride and draft rows by (slot, step) strides

    def __init__(self, use_fp64: bool = False):
        self.device = "cpu"
        self._api = _discover()
        self._api.use_fp64 = use_fp64

    @property
    def api(self) -> str:
        return self._api.description

    def supports(self, batch) -> str | None:
        return self._api.supports(batch, self.device)

    def sample(self, batch):
        reason = self._api.supports(batch, self.device)
        if reason:
            raise ValueError(f"{self.name}: cannot verify this batch: {reason}")
        return self._api.sample(batch, self.device)


# --- the batch in vLLM's layout ---------------------------------------------------------------
class _Layout:
    """Index tensors shared by every MRV2 entry point, built with torch on the device.

    The batch may hold NumPy arrays or device tensors (a device batch). Tensors derived
    from the logits (temperature-processed target rows, the draft cache) are memoized on
    the logits tensor they came from: a device batch reuses its logits across chunks.
    """

    def __init__(self, batch, device: str, memo: LogitsMemo):
        import torch

        self.memo = memo
        f = batch.to_torch(device)
        cu = f["cu_num_drafts"].to(torch.int64)
        b = len(cu) - 1
        counts = cu.diff()
        k = int(batch.max_drafts)
        ar = torch.arange(b, device=device)
        num_drafts = int(cu[-1])
        num_logits = num_drafts + b
        starts = cu[:-1] + ar  # first row of each request
        owner_of_draft = torch.repeat_interleave(ar, counts, output_size=num_drafts)
        draft_rows = torch.arange(num_drafts, device=device) + owner_of_draft  # the row verifying each draft
        owner_of_row = torch.repeat_interleave(ar, counts + 1, output_size=num_logits)
        slots = f["request_slots"]
        slots = b - ar if slots is None else slots.to(torch.int64)  # default: reversed
        num_slots = int(slots.max()) + 2 if b else 1  # at least one unused slot, poisoned
        temperature = f["temperature"].to(torch.float64)
        draft_sampled = torch.zeros(num_logits, dtype=torch.int64, device=device)
        draft_sampled[draft_rows + 1] = f["draft_tokens"].to(torch.int64)
        slot_temperature = torch.full((num_slots,), float("nan"), dtype=torch.float32, device=device)
        slot_temperature[slots] = temperature.to(torch.float32)
        slot_seed = torch.full((num_slots,), -1, dtype=torch.int64, device=device)
        slot_seed[slots] = f["seeds"].to(torch.int64)
        self.device, self.num_reqs, self.num_logits, self.k, self.num_slots = device, b, num_logits, k, num_slots
        self.fields, self.slots, self.owner_of_draft, self.owner_of_row = f, slots, owner_of_draft, owner_of_row
        self.draft_steps = draft_rows - starts[owner_of_draft]
        self.draft_temperature = temperature[owner_of_draft]
        self.row_temperature = temperature[owner_of_row]
        self.cu_num_logits = (cu + torch.arange(b + 1, device=device)).to(torch.int32)
        self.draft_sampled = draft_sampled
        self.pos = f["positions"].to(torch.int64)
        self.idx_mapping = slots.to(torch.int32)
        self.expanded_idx_mapping = slots[owner_of_row].to(torch.int32)
        self.expanded_local_pos = (torch.arange(num_logits, device=device) - starts[owner_of_row]).to(torch.int32)
        self.temperature = slot_temperature
        self.seed = slot_seed

    def target_logits(self, processed: bool):
        """fp32 target rows; ``processed``: divided by the temperature as vLLM's sampler does."""
        import torch

        logits = self.fields["target_logits"]
        if not processed:
            return rows.cast(logits, torch.float32)
        temp = torch.where(self.row_temperature > 0, self.row_temperature, 1.0).to(torch.float32)
        return self.memo.get("target", logits, temp, lambda: rows.divided(logits, temp))

    def processed_target(self, params, processor):
        """``target_logits(processed=True)``, then (``params``: the batch's sampling
        parameters, or None) vLLM's min-p and top-k/top-p, as ``apply_sampling_params``."""
        import torch

        if params is None:
            return self.target_logits(processed=True)
        # Unused slots get min_p = 1 (only the argmax stays): reading a wrong slot shows up.
        slot_min_p = torch.ones(self.num_slots, dtype=torch.float32, device=self.device)
        slot_min_p[self.slots] = torch.from_numpy(params.min_p).to(self.device)
        key = torch.cat([self.row_temperature, torch.from_numpy(params.key()).to(self.device), self.slots.to(torch.float64)])

        def build():
            target = self.target_logits(processed=True)
            return processor.apply(target, self.owner_of_row, params, (self.expanded_idx_mapping, slot_min_p), topp_only_arg=True)

        return self.memo.get("processed", self.fields["target_logits"], key, build)

    def draft_cache(self, batch, divide: bool, width: int | None = None):
        """``[max_num_reqs, K, V]`` draft logits by (state slot, step); unused entries are NaN.
        Raw logits are cached in the batch's ``logits_dtype`` (vLLM caches the draft head's
        dtype, bf16 typically; the values are exact in it); divided ones in fp32.

        Shared draft rows (one row for every request, ``harness.backends.shared_rows``) give a
        stride-0 cache of that row: every entry holds it, unused ones too (not NaN)."""
        import torch

        draft = self.fields["draft_logits"]
        if draft is None or self.k == 0:
            return None
        dtype = torch.float32 if divide else getattr(torch, getattr(batch, "logits_dtype", "float32"))
        width = width or draft.shape[1]
        key = torch.cat([self.slots, self.draft_steps, self.draft_temperature.view(torch.int64)])
        temp = torch.where(self.draft_temperature > 0, self.draft_temperature, 1.0).to(torch.float32)

        def build():
            r = rows.divided(draft, temp) if divide else rows.cast(draft, torch.float32)
            if rows.is_shared(r):
                row = torch.full((1, 1, width), float("-inf"), dtype=dtype, device=self.device)  # ids the draft lacks
                row[0, 0, : r.shape[1]] = r[0].to(dtype)
                return row.expand(self.num_slots, self.k, width)
            cache = torch.full((self.num_slots, self.k, width), float("nan"), dtype=dtype, device=self.device)
            slot = self.slots[self.owner_of_draft]
            cache[slot, self.draft_steps] = float("-inf")  # ids the draft lacks
            cache[slot, self.draft_steps, : r.shape[1]] = r.to(dtype)
            return cache

        return self.memo.get(f"draft-{divide}-{width}", draft, key, build)

    def outputs(self, sampled, num_sampled):
        """Slots past ``num_sampled`` are uninitialised memory in vLLM: make them -1."""
        import torch

        cols = torch.arange(sampled.shape[1], device=sampled.device)
        return torch.where(cols[None, :] < num_sampled[:, None], sampled, -1), num_sampled


def _single_method(batch) -> Method | None:
    methods = method_codes(batch)
    return Method(int(methods[0])) if methods.size == 1 else None


def _uniform_rates(batch) -> np.ndarray | None:
    rates = host(batch.synthetic_rates).astype(np.float64)
    return rates[0] if np.all(rates == rates[0]) else None


def _target_beyond_draft_vocab(batch) -> bool:
    if batch.draft_logits is None or batch.draft_logits.shape[1] >= batch.vocab_size:
        return False
    beyond = batch.target_logits[:, batch.draft_logits.shape[1] :]
    return bool((beyond > float("-inf")).any())  # a finite logit (+inf is invalid input): mass the draft cannot propose


def _processing_reason(api, batch, device: str) -> str | None:
    """Why the batch's sampling parameters cannot be verified here: the tie rules of the one
    top-k/top-p call over every logits row (drafts and bonus), ``Sampler.apply_sampling_params``."""
    params = processing.request_params(batch)
    if params is None:
        return None
    calls = [("MRV2's apply_sampling_params over every logits row", batch.target_logits.shape[0])]
    return _processor(api).tie_rules_reason(batch, params, device, calls)


def _processor(api) -> processing.Processor:
    """The API's ``Processor``, bound on first use when it was built without one."""
    if api.processor is None:
        api.processor = processing.Processor(vllm_env.version(), True)
    return api.processor


# --- 0.22 .. 0.33 API ----------------------------------------------------------------------
class _CurrentApi:
    def __init__(self, fn, version: Version | None, draft_raw: bool, truncates: bool | None, processor=None, cache_class=None):
        self.fn = fn
        self.processor = processor  # vLLM's min-p and top-k/top-p (processing.Processor); None: bound when needed
        self.params = vllm_env.parameters(fn)
        self.version = version
        self.draft_raw = draft_raw  # the cache holds raw logits, the kernels divide (DRAFT_LOGITS_RAW)
        self.truncates = truncates  # the kernels cut the target to the cache's width; None: unknown (TRUNCATES_TARGET)
        self.use_fp64 = False
        self.cache_class = cache_class  # 0.34.0: the draft cache goes in a DraftLogitsCache
        self.memo = LogitsMemo()  # logits-derived tensors, reused across a device batch's chunks
        cache = "raw draft logits, divided by T in the kernels" if draft_raw else "draft logits divided by T"
        self.description = f"{_UTILS}.rejection_sample (vLLM {version or 'of undeclared version'}: {cache})"

    def supports(self, batch, device: str = "cpu") -> str | None:
        method = _single_method(batch)
        if method is None:
            return "mixes verification methods in one batch (vLLM MRV2 verifies a batch with one method)"
        if method is Method.STRICT:
            return "vLLM MRV2 has no strict verification since 2026-04 (0.19 had strict_rejection_sample)"
        if method is Method.TYPICAL:
            return "typical acceptance: not implemented by vLLM MRV2"
        if method is Method.FLY:
            _, reason = vllm_env.fly_kwargs(batch, self.params, "MRV2 rejection_sample")
            if reason:
                return reason
        if method is Method.BLOCK and "use_block_verification" not in self.params:
            return "this vLLM's rejection_sample has no block verification (use_block_verification)"
        if method is Method.SYNTHETIC:
            if "synthetic_conditional_rates" not in self.params:
                return "this vLLM's rejection_sample has no synthetic_conditional_rates"
            if _uniform_rates(batch) is None:
                return "per-request synthetic rates (vLLM MRV2 takes one rate vector per batch)"
        narrow = batch.draft_logits is not None and batch.draft_logits.shape[1] < batch.vocab_size
        if narrow and self.truncates is None:
            return (
                f"draft vocabulary narrower than the target's, and vLLM {self.version or '(no version)'} does not say whether "
                f"{TRUNCATES_TARGET.what} (absent up to {TRUNCATES_TARGET.last_without}, present from {TRUNCATES_TARGET.first_with})"
            )
        if self.truncates and _target_beyond_draft_vocab(batch):
            return "draft vocabulary narrower than the target's with target mass on the missing ids (vLLM MRV2 truncates the target)"
        return _processing_reason(self, batch, device)

    def sample(self, batch, device: str):
        import torch

        lay = _Layout(batch, device, self.memo)
        method = _single_method(batch)
        params = processing.request_params(batch)
        kwargs = {}
        if method is Method.SYNTHETIC:
            rates = _uniform_rates(batch)
            kwargs["synthetic_conditional_rates"] = torch.tensor(rates, dtype=torch.float32, device=device)
        if method is Method.BLOCK:
            kwargs["use_block_verification"] = True
        if method is Method.FLY:
            kwargs |= vllm_env.fly_kwargs(batch, self.params, "MRV2 rejection_sample")[0]
        if self.use_fp64 and "use_fp64" in self.params:
            kwargs["use_fp64"] = True
        draft = None
        if batch.draft_logits is not None:
            # Before the cut to the cache's width, the kernels read the cache at the target's width.
            width = None if self.truncates else batch.vocab_size
            draft = lay.draft_cache(batch, divide=not self.draft_raw, width=width)
            if self.cache_class is not None and draft is not None:
                draft = _replicated_cache(self.cache_class, draft)
        with torch.no_grad():
            target = lay.processed_target(params, _processor(self))
            sampled, num_sampled = self.fn(
                target, draft, lay.draft_sampled, lay.cu_num_logits, lay.pos,
                lay.idx_mapping, lay.expanded_idx_mapping, lay.expanded_local_pos, lay.temperature, lay.seed, lay.k,
                **kwargs,
            )  # fmt: skip
        return lay.outputs(sampled, num_sampled)


# --- 0.19 to 0.21 APIs: a function per method -------------------------------------------------
class _PerMethodApi:
    """Strict (0.19-0.20), probabilistic, synthetic; target tokens for strict and synthetic come
    from the engine's sampler: ``Sampler.sample`` runs ``apply_sampling_params`` (temperature,
    min-p, top-k/top-p) and then ``gumbel_sample(processed, apply_temperature=False)``."""

    def __init__(self, probabilistic, strict, synthetic, rates, optional_draft, gumbel_sample, description, processor=None):
        self.description = description
        self.probabilistic, self.strict, self.synthetic, self.gumbel_sample = probabilistic, strict, synthetic, gumbel_sample
        self.rates = rates  # "geometric" (0.19: one base rate and decay) or "conditional" (0.20-0.21: a rate per step)
        self.optional_draft = optional_draft  # probabilistic_rejection_sample takes draft_logits=None (one-hot drafts)
        self.processor = processor
        self.use_fp64 = False
        self.memo = LogitsMemo()

    def supports(self, batch, device: str = "cpu") -> str | None:
        method = _single_method(batch)
        if method is None:
            return "mixes verification methods in one batch (vLLM MRV2 verifies a batch with one method)"
        if method is Method.BLOCK:
            return "vLLM MRV2 before 0.25 has no block verification"
        if method is Method.TYPICAL:
            return "typical acceptance: not implemented by vLLM MRV2"
        if method is Method.FLY:
            return "this vLLM's MRV2 API (0.19-0.21: a function per method) has no FLy (vLLM 0.33.0+)"
        if method is Method.STRICT and self.strict is None:
            return "vLLM MRV2 has no strict verification since 0.21 (0.19-0.20 had strict_rejection_sample)"
        # No placeholder handling before vLLM #46533 (0.25.0): a -1 draft is verified as the
        # release does it (read at index -1, or accepted), and the law checks say what it does.
        if method is Method.STANDARD and batch.draft_logits is None and not self.optional_draft:
            return "this vLLM's probabilistic_rejection_sample needs draft logits (draft_logits=None from 0.21)"
        if method is Method.SYNTHETIC:
            if self.synthetic is None:
                return "this vLLM has no synthetic_rejection_sample"
            if self.rates == "geometric" and _geometric(batch) is None:
                return "synthetic rates are not a0 * gamma**i for every request (vLLM 0.19 takes one base rate and decay)"
            if self.rates == "conditional" and _uniform_rates(batch) is None:
                return "per-request synthetic rates (vLLM MRV2 takes one rate vector per batch)"
        return _processing_reason(self, batch, device)

    def sample(self, batch, device: str):
        import torch

        lay = _Layout(batch, device, self.memo)
        method = _single_method(batch)
        params = processing.request_params(batch)
        with torch.no_grad():
            target = lay.processed_target(params, _processor(self))
            if method is Method.STANDARD:
                draft = lay.draft_cache(batch, divide=True, width=batch.vocab_size)  # post-temperature logits, target's width
                if draft is None and not self.optional_draft:  # no drafts at all: the function still needs a cache
                    draft = torch.zeros((lay.num_slots, max(lay.k, 1), batch.vocab_size), device=device)
                sampled, num_sampled = self.probabilistic(
                    target, draft, lay.draft_sampled, lay.cu_num_logits, lay.pos,
                    lay.idx_mapping, lay.expanded_idx_mapping, lay.expanded_local_pos, lay.temperature, lay.seed, lay.k,
                )  # fmt: skip
            else:
                target_sampled = self.gumbel_sample(
                    target, lay.expanded_idx_mapping, lay.temperature, lay.seed, lay.pos, apply_temperature=False
                )
                if method is Method.STRICT:
                    sampled, num_sampled = self.strict(target_sampled, lay.draft_sampled, lay.cu_num_logits, lay.k)
                elif self.rates == "geometric":
                    base, decay = _geometric(batch)
                    sampled, num_sampled = self.synthetic.synthetic_rejection_sample(
                        target_sampled, lay.draft_sampled, lay.cu_num_logits, lay.pos, lay.idx_mapping, lay.seed, base, decay, lay.k
                    )
                else:
                    rates = torch.tensor(_uniform_rates(batch), dtype=torch.float32, device=device)
                    sampled, num_sampled = self.synthetic.synthetic_rejection_sample(
                        target_sampled, lay.draft_sampled, lay.cu_num_logits, lay.pos, lay.idx_mapping, lay.seed, rates, lay.k
                    )
        return lay.outputs(sampled, num_sampled.to(torch.int32))


def _geometric(batch) -> tuple[float, float] | None:
    """(a0, gamma) when every request's conditional rates are a0 * gamma**i."""
    rates = _uniform_rates(batch)
    if rates is None or rates.size == 0:
        return (0.0, 1.0) if rates is not None else None
    base = float(rates[0])
    decay = float(rates[1] / rates[0]) if rates.size > 1 and rates[0] > 0 else 1.0
    ok = np.allclose(base * decay ** np.arange(rates.size), rates, rtol=1e-12, atol=1e-15)
    return (base, decay) if ok else None
