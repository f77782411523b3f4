"""vLLM's V1 rejection sampler behind the protocol (``vllm-v1``).

Calls ``vllm.v1.sample.rejection_sampler.rejection_sample`` (the function under
``RejectionSampler.forward``) with a hand-built ``SamplingMetadata``:

* ``target_logits``: the draft rows only (no bonus rows), processed the way
  ``apply_sampling_constraints`` leaves them: ``logits / T`` (greedy rows untouched), then,
  with top-k / top-p, vLLM's ``apply_top_k_top_p`` on the per-token k and p (the CPU: its sort
  path; see ``harness.backends.vllm.processing``). V1 applies no min-p with drafts;
* ``draft_probs``: ``softmax(draft_logits / T)`` in fp32, zero-padded to the target's vocabulary
  (V1's kernels index draft and target probabilities with one width), or None;
* ``draft_token_ids`` with -1 placeholders, ``cu_num_draft_tokens`` (inclusive, no leading 0);
* ``num_draft_tokens`` as a Python list of Python ints: vLLM iterates it in Python
  (``generate_uniform_probs``), so a list from ``ndarray.tolist()`` is the cheapest correct
  form (~0.25 s per million requests here, of which ~0.03 s is the conversion; an ndarray
  iterates slower, a device tensor syncs per element);
* randomness: each request with drafts gets a ``torch.Generator`` seeded with its seed, as
  vLLM does for seeded requests (float64 acceptance uniforms, then its Exp(1) vector for
  recovered tokens). Above ``max_generators`` (256) requests per call the per-request streams
  cost more than the kernels (a Python step and tiny launches per request: 355k requests took
  7 s on an H200, 20x the kernels), so the batch instead uses the global generator, seeded
  from all the batch's seeds inside ``torch.random.fork_rng``, as vLLM does for unseeded
  requests.

**Bonus tokens.** V1 samples bonus tokens outside the rejection sampler (the engine's normal
``Sampler`` on the bonus rows) and passes them in as ``bonus_token_ids``. Here the harness
draws them itself: the argmax for greedy requests, else an inverse-CDF draw from
``softmax(logits / T)`` in float64 with the suite's counter-based uniform keyed by (seed,
bonus position); with top-k / top-p, from the bonus rows after temperature (fp32) and the
same vLLM top-k/top-p function. Checks on the bonus token therefore test that draw plus V1's
bookkeeping (when the bonus is emitted, and where), not vLLM's normal sampler.

**FLy** (``reference.fly``; 0.33.0+): ``rejection_sample``'s ``fly_window_size``,
``fly_entropy_threshold`` and ``fly_entropy_top_k`` (what ``RejectionSampler.__init__`` reads
from ``SpeculativeConfig`` when ``rejection_sample_method == "fly"``) get the batch's one
window, threshold and top-k; the function computes the entropy from the target logits passed
in and rewrites its argmaxes / uniforms (``vllm/v1/spec_decode/fly.py``) before the native
kernels. ``RejectionSampler.__init__`` refuses FLy on a CPU *device*; the function itself runs
under the Triton interpreter.

``supports(batch)`` names what V1 cannot express: strict and block verification, batches
mixing methods, per-request synthetic rates, synthetic mode in versions without it, FLy in
versions without it (the three parameters, bound by the signature) and per-request FLy
parameters, min-p (not applied with drafts), and a law following other top-k/top-p tie rules
(``batch.processing``) than its calls will use.

**Contract** (``docs/adapter-contracts.md``): the same in every release from 0.19 to 0.33, so
nothing here depends on the version: ``rejection_sample``'s parameters (checked by
``inspect.signature``; ``synthetic_mode`` and ``use_fp64_gumbel`` are used where the signature
has them), target logits divided by T by the caller (``apply_sampling_constraints``), draft
probabilities after temperature ("probability distribution for the draft tokens"), and the
module's ``GREEDY_TEMPERATURE = 0`` and ``PLACEHOLDER_TOKEN_ID = -1`` (greedy requests are
passed T = 0; unfilled output slots read -1). A release declaring other values is api-drift.
"""

import dataclasses

import numpy as np

from harness.backends.logits_cache import LogitsMemo
from harness.backends.vllm import env as vllm_env
from harness.backends.vllm import processing
from harness.protocol import host, method_codes
from reference.methods import Method
from reference.rng import Stream, hash64

_MODULE = "vllm.v1.sample.rejection_sampler"
_METADATA = "vllm.v1.sample.metadata"
_ARGS = [
    "draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
    "target_logits", "bonus_token_ids", "sampling_metadata",
]  # fmt: skip
_READ_FIELDS = ("temperature", "all_greedy", "all_random", "generators")  # all rejection_sample reads
_CONSTANTS = {"GREEDY_TEMPERATURE": 0, "PLACEHOLDER_TOKEN_ID": -1}  # the values this adapter writes and reads


def _discover():
    vllm_env.import_vllm("vllm")
    module = vllm_env.optional_module(_MODULE)
    if module is None:  # 0.34.0 ships Model Runner V2's sampler alone
        raise vllm_env.api_changed(f"vLLM {vllm_env.version()} has no V1 rejection sampler ({_MODULE})")
    fn = getattr(module, "rejection_sample", None)
    if fn is None:
        raise vllm_env.api_changed(f"{_MODULE} has no rejection_sample")
    params = vllm_env.require_parameters(fn, _ARGS, f"{_MODULE}.rejection_sample")
    for name, expected in _CONSTANTS.items():
        value = getattr(module, name, None)
        value = getattr(value, "value", value)  # a tl.constexpr
        if value != expected:
            raise vllm_env.api_changed(f"{_MODULE}.{name} is {value!r}, not {expected!r}")
    metadata = vllm_env.import_vllm(_METADATA).SamplingMetadata
    names = {f.name for f in dataclasses.fields(metadata)}
    if not set(_READ_FIELDS) <= names:
        raise vllm_env.api_changed(f"SamplingMetadata lacks {sorted(set(_READ_FIELDS) - names)}")
    vllm_env.triton_ready()
    return fn, params, metadata, processing.Processor(vllm_env.version(), with_min_p=False)


def availability() -> tuple[bool, str]:
    return vllm_env.availability(_discover)


class VllmV1Backend:
    """vLLM V1 rejection sampling (Triton; CPU under TRITON_INTERPRET=1, or CUDA)."""

    name = "vllm-v1"
    devices = ("cpu", "cuda")
    device_batches = True  # takes batches built on its device (harness.sampling.device.trials)

    def __init__(self, max_generators: int = 256, use_fp64_gumbel: bool = False):
        self.device = "cpu"
        self.max_generators = max_generators
        self.use_fp64_gumbel = use_fp64_gumbel
        self._memo = LogitsMemo()  # logits-derived tensors, reused across a device batch's chunks
        self._fn, self._params, self._metadata_cls, self._processor = _discover()

    def supports(self, batch) -> str | None:
        methods = method_codes(batch)
        if methods.size > 1:
            return "mixes verification methods in one batch (vLLM V1 verifies a batch with one method)"
        method = Method(int(methods[0]))
        if method in (Method.STRICT, Method.BLOCK):
            return f"vLLM V1 has no {method.name.lower()} verification"
        if method is Method.TYPICAL:
            return "typical acceptance: not implemented by vLLM V1 (V0's TypicalAcceptanceSampler was not carried over)"
        if method is Method.FLY:
            _, reason = vllm_env.fly_kwargs(batch, self._params, "V1 rejection_sample")
            if reason:
                return reason
        if method is Method.SYNTHETIC:
            if "synthetic_mode" not in self._params:
                return "this vLLM's V1 rejection_sample has no synthetic mode"
            rates = host(batch.synthetic_rates)
            if not np.all(rates == rates[0]):
                return "per-request synthetic rates (vLLM V1 takes one rate vector per batch)"
        params = processing.request_params(batch)
        if params is None:
            return None
        if params.do_min_p:
            r = int(np.flatnonzero(params.min_p)[0])
            return (
                f"min-p (request {r}: min_p={float(params.min_p[r]):g}): vLLM V1 applies no min-p with speculative decoding "
                "(build_logitsprocs builds only MinTokensLogitsProcessor under a speculative config; "
                "SamplingParams._validate_spec_decode rejects min_p > 1e-5)"
            )
        num_drafts = int(host(batch.cu_num_drafts)[-1])
        calls = [("V1's apply_sampling_constraints on the draft rows", num_drafts)] if num_drafts else []
        calls.append(("the engine's sampler on the bonus rows", batch.num_requests))
        return self._processor.tie_rules_reason(batch, params, self.device, calls)

    def sample(self, batch):
        import torch

        reason = self.supports(batch)
        if reason:
            raise ValueError(f"{self.name}: cannot verify this batch: {reason}")
        device = self.device
        f = batch.to_torch(device)
        cu = host(batch.cu_num_drafts).astype(np.int64)
        b, counts = cu.size - 1, np.diff(cu)
        width = int(batch.max_drafts) + 1
        temperature = host(batch.temperature).astype(np.float64)
        seeds = host(batch.seeds)
        bonus_rows = cu[1:] + np.arange(b)
        draft_rows = np.delete(np.arange(int(cu[-1]) + b), bonus_rows)

        def t(x):
            return torch.from_numpy(np.ascontiguousarray(x)).to(device)

        params = processing.request_params(batch)
        bonus = self._bonus_tokens(f, batch.vocab_size, temperature, t(bonus_rows), params)
        max_spec_len = int(counts.max(initial=0))
        if max_spec_len == 0:  # no drafts at all: V1 never reaches the rejection sampler
            tokens = torch.full((b, width), -1, dtype=torch.int64, device=device)
            tokens[:, 0] = bonus
            return tokens, torch.ones(b, dtype=torch.int64, device=device)
        draft_temperature = t(np.repeat(np.where(temperature > 0, temperature, 1.0), counts).astype(np.float32))
        rows = t(draft_rows)
        target = self._memo.get(
            "target", f["target_logits"], rows, lambda: f["target_logits"][rows].to(torch.float32) / draft_temperature[:, None]
        )
        if params is not None:  # apply_sampling_constraints: top-k / top-p after the temperature
            owners = t(np.repeat(np.arange(b), counts))
            key = torch.cat([rows.to(torch.float64), draft_temperature.to(torch.float64), t(params.key())])
            target = self._memo.get("processed", f["target_logits"], key, lambda: self._processor.apply(target, owners, params))
        draft_probs = None
        if f["draft_logits"] is not None:

            def probs():
                p = torch.softmax(f["draft_logits"].to(torch.float32) / draft_temperature[:, None], -1)
                padded = torch.zeros((p.shape[0], batch.vocab_size), dtype=torch.float32, device=device)
                padded[:, : p.shape[1]] = p  # ids the draft lacks have probability 0
                return padded

            draft_probs = self._memo.get("draft", f["draft_logits"], draft_temperature, probs)
        kwargs = {}
        method = Method(int(method_codes(batch)[0]))
        if method is Method.SYNTHETIC:
            kwargs = dict(synthetic_mode=True, synthetic_conditional_rates=f["synthetic_rates"][0].to(torch.float32))
        if method is Method.FLY:
            kwargs, _ = vllm_env.fly_kwargs(batch, self._params, "V1 rejection_sample")
        if self.use_fp64_gumbel and "use_fp64_gumbel" in self._params:
            kwargs["use_fp64_gumbel"] = True
        seeded = b <= self.max_generators
        generators = {}
        if seeded:
            for i in np.flatnonzero(counts > 0):  # requests without drafts consume nothing
                generators[int(i)] = torch.Generator(device=device).manual_seed(int(seeds[i]))
        metadata = self._sampling_metadata(t(temperature.astype(np.float32)), temperature, generators)
        cuda_devices = [] if device == "cpu" else [torch.device(device).index or torch.cuda.current_device()]
        with torch.random.fork_rng(devices=cuda_devices), torch.no_grad():
            if not seeded:
                torch.manual_seed(int(np.bitwise_xor.reduce(hash64(seeds, host(batch.positions)[bonus_rows]))))
            out = self._fn(
                f["draft_tokens"].to(torch.int32), counts.tolist(), max_spec_len, t(cu[1:].astype(np.int32)),
                draft_probs, target, bonus[:, None].contiguous(), metadata, **kwargs,
            )  # fmt: skip
        tokens = torch.full((b, width), -1, dtype=torch.int64, device=device)
        tokens[:, : out.shape[1]] = out
        return tokens, (out != -1).sum(dim=1)  # V1 pre-fills with -1 and writes a contiguous prefix

    def _bonus_tokens(self, f, vocab: int, temperature, bonus_rows, params):
        """What the engine's sampler would hand V1: argmax (greedy) or a draw from softmax(logits / T);
        with top-k / top-p, from the bonus rows processed by vLLM's function (fp32, as its sampler)."""
        import torch

        from harness.torch_rng import uniforms as torch_uniforms

        temps = torch.from_numpy(temperature).to(bonus_rows.device)

        def cdf():
            logits = f["target_logits"][bonus_rows].to(torch.float64)
            divisor = torch.where(temps > 0, temps, 1.0)[:, None]
            if params is None:
                probs = torch.softmax(logits / divisor, dim=-1)
            else:
                owners = torch.arange(len(temps), device=bonus_rows.device)
                processed = self._processor.apply(f["target_logits"][bonus_rows].to(torch.float32) / divisor.float(), owners, params)
                probs = torch.softmax(processed.to(torch.float64), dim=-1)
            return probs.cumsum(-1), logits.argmax(-1)

        key = torch.cat(
            [bonus_rows.to(torch.float64), temps] + ([] if params is None else [torch.from_numpy(params.key()).to(temps.device)])
        )
        cdf, argmax = self._memo.get("bonus", f["target_logits"], key, cdf)
        u = torch_uniforms(f["seeds"].to(torch.int64), f["positions"].to(torch.int64)[bonus_rows], Stream.RESIDUAL)
        drawn = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(1).clamp(max=vocab - 1)
        return torch.where(temps == 0, argmax, drawn)

    def _sampling_metadata(self, temperature_tensor, temperature, generators):
        """Only temperature / all_greedy / all_random / generators are read by rejection_sample;
        the other fields get neutral values (None where vLLM's type allows nothing simpler)."""
        values = dict(
            temperature=temperature_tensor, all_greedy=bool(np.all(temperature == 0)), all_random=bool(np.all(temperature > 0)),
            top_p=None, top_k=None, generators=generators, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
            output_token_ids=[], allowed_token_ids_mask=None, bad_words_token_ids={},
        )  # fmt: skip
        kwargs = {}
        for f in dataclasses.fields(self._metadata_cls):
            if f.name in values:
                kwargs[f.name] = values[f.name]
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                kwargs[f.name] = None  # penalties, logits processors: never read here
        return self._metadata_cls(**kwargs)
