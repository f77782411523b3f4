"""vLLM MRV2 drafting its own drafts, then verifying them (``vllm-mrv2`` with ``drafter = True``).

A batch with ``draft_sampling`` set (``harness.protocol``, "The backend's own drafter") is drafted
with vLLM's own drafter sampling, called as the release's speculator calls it
(``docs/adapter-contracts-drafting.md``), and verified by ``VllmMrv2Backend``:

* "probabilistic": ``vllm.v1.worker.gpu.sample.gumbel.gumbel_sample`` once per draft step ``j``
  on the requests with more than ``j`` drafts, ``apply_temperature=True``, the verifier's own
  per-slot temperature and seed tables (``mrv2._Layout``), ``pos`` = the position of the target
  row verifying the draft (the engine's ``t + j``), and the draft-logits cache the signature
  declares: ``processed_logits_out=cache[:, j]`` (0.19-0.20), ``output_processed_logits`` +
  ``_col`` (0.21-0.27), ``logits_cache`` + ``_col`` (0.28), the same with ``is_drafting=True``
  (0.29+). The cache is a contiguous ``[slots, K, V]``: fp32 up to 0.27 (logits / T), the
  logits' dtype from 0.28 (raw). Rows narrower than the width the release reads are padded
  with -inf (an id with -inf never wins, and noise is keyed by id: the draws do not change);
* "greedy" (0.21+): ``logits.argmax(-1)``, as ``sample_draft`` for ``draft_sample_method``
  "greedy", verified as point masses (the drafter passes no draft logits then).

The verifier then gets the drawn ids and the draft logits; it builds the draft cache by the
same contract as the drafter writes it (a test holds the two equal). A batch without
``draft_sampling`` takes ``VllmMrv2Backend``'s path unchanged.
"""

import dataclasses

import numpy as np

from harness.backends.logits_cache import LogitsMemo
from harness.backends.vllm import env as vllm_env
from harness.backends.vllm import mrv2
from harness.backends.vllm.processing import ReleaseBoundary
from reference.methods import Method

_GUMBEL = "vllm.v1.worker.gpu.sample.gumbel"
_DRAW_ARGS = ["logits", "expanded_idx_mapping", "temperature", "seed", "pos", "apply_temperature"]
_CACHE_NAMES = ("processed_logits_out", "output_processed_logits", "output_processed_logits_col", "logits_cache", "logits_cache_col")

DRAFT_NOISE_SALT = ReleaseBoundary(
    "the drafter's gumbel_sample takes is_drafting and salts the draft's noise apart from the verifier's (#54282)", "0.28.0", "0.29.0"
)


@dataclasses.dataclass(frozen=True)
class Era:
    """One contract of the drafter's ``gumbel_sample``, told apart by its parameters."""

    releases: str
    cache_args: tuple[str, ...]  # the cache, then its column (draft step) when it takes one
    raw: bool  # the cache holds raw logits in their dtype (else logits / T in fp32)
    is_drafting: bool  # takes is_drafting (True from the drafter)
    greedy: bool  # the release has draft_sample_method "greedy" (argmax drafts, no draft logits)
    cache_for_standard_only: bool  # keeps a cache only when verifying probabilistically (else whenever drafting so)
    per_method: tuple[bool, ...]  # pairs with a function per method (mrv2._PerMethodApi, 0.19-0.21), rejection_sample (0.22+), or either


_RAW, _DIVIDED = ("logits_cache", "logits_cache_col"), ("output_processed_logits", "output_processed_logits_col")
ERAS = (
    Era(
        "0.19-0.20", ("processed_logits_out",), raw=False, is_drafting=False, greedy=False, cache_for_standard_only=True, per_method=(True,)
    ),
    Era(
        "0.21-0.27", _DIVIDED, raw=False, is_drafting=False, greedy=True, cache_for_standard_only=False, per_method=(True, False)
    ),  # 0.21: per method
    Era("0.28", _RAW, raw=True, is_drafting=False, greedy=True, cache_for_standard_only=False, per_method=(False,)),
    Era("0.29+", _RAW, raw=True, is_drafting=True, greedy=True, cache_for_standard_only=False, per_method=(False,)),
)


def bind_era(params, version, per_method: bool) -> Era:
    """The era whose parameters ``gumbel_sample`` has; api-drift when none, or when the
    release or the verifier found says another."""
    found = [
        e for e in ERAS if set(e.cache_args) == {p for p in params if p in _CACHE_NAMES} and ("is_drafting" in params) == e.is_drafting
    ]
    if len(found) != 1:
        raise vllm_env.api_changed(
            f"{_GUMBEL}.gumbel_sample matches no known drafter contract (its parameters: {list(params)}; known: "
            + "; ".join(f"{e.releases}: {', '.join(e.cache_args)}{', is_drafting' if e.is_drafting else ''}" for e in ERAS)
            + ")"
        )
    era = found[0]
    salted = DRAFT_NOISE_SALT.holds(version)
    if salted is not None and salted != era.is_drafting:
        raise vllm_env.api_changed(
            f"vLLM {version} is {'at or after' if salted else 'before'} {DRAFT_NOISE_SALT.first_with} "
            f"({DRAFT_NOISE_SALT.what}), but its gumbel_sample has the {era.releases} parameters"
        )
    if per_method not in era.per_method:
        verifier = "0.19-0.21's function per method" if per_method else "rejection_sampler_utils.rejection_sample"
        raise vllm_env.api_changed(f"a {era.releases} gumbel_sample with {verifier} is no known release")
    return era


def _discover(api):
    gumbel = vllm_env.import_vllm(_GUMBEL)
    vllm_env.require_parameters(gumbel.gumbel_sample, _DRAW_ARGS, f"{_GUMBEL}.gumbel_sample")
    params = vllm_env.parameters(gumbel.gumbel_sample)
    return gumbel, bind_era(params, vllm_env.version(), isinstance(api, mrv2._PerMethodApi))


def availability() -> tuple[bool, str]:
    return vllm_env.availability(lambda: _discover(mrv2._discover()))


class VllmMrv2DrafterBackend(mrv2.VllmMrv2Backend):
    """vLLM MRV2's verifier, and its drafter's sampling for batches it drafts (``draft_sampling``)."""

    drafter = True

    def __init__(self, use_fp64: bool = False):
        super().__init__(use_fp64)
        self._gumbel, self.era = _discover(self._api)
        self._takes_fp64 = "use_fp64" in vllm_env.parameters(self._gumbel.gumbel_sample)  # 0.22+

    @property
    def api(self) -> str:
        return f"{self._api.description}; drafts: {_GUMBEL}.gumbel_sample ({self.era.releases})"

    def supports(self, batch) -> str | None:
        sampling = getattr(batch, "draft_sampling", None)
        if sampling is None:
            return super().supports(batch)
        if sampling == "greedy" and not self.era.greedy:
            return (
                f"vLLM {self.era.releases}'s drafter has no greedy draft sampling (draft_sample_method, from 0.21): "
                "it always Gumbel-samples at the request's temperature"
            )
        # The verifier is asked about the batch it will get: drawn ids (any valid ones here).
        return super().supports(_verified(batch, np.zeros(len(batch.draft_tokens), np.int64)))

    def sample(self, batch):
        if getattr(batch, "draft_sampling", None) is None:
            return super().sample(batch)
        reason = self.supports(batch)
        if reason:
            raise ValueError(f"{self.name}: cannot draft this batch: {reason}")
        drafts, _ = self.draw(batch)
        host_drafts = drafts.cpu().numpy() if isinstance(batch.draft_tokens, np.ndarray) else drafts
        tokens, emitted = super().sample(_verified(batch, host_drafts))
        return tokens, emitted, drafts

    def draw(self, batch):
        """``(drafts [D] int64, cache)``: every draft, drawn as the release's drafter draws it,
        and the ``[slots, K, V]`` draft cache it wrote (None when greedy or no cache is kept;
        entries it did not write are NaN)."""
        import torch

        lay = mrv2._Layout(batch, self.device, LogitsMemo())  # the verifier's slots, temperature and seed tables
        logits = lay.fields["draft_logits"]
        num_drafts = logits.shape[0]
        dtype = getattr(torch, batch.logits_dtype)  # the draft head's dtype: the values are exact in it
        if batch.draft_sampling == "greedy":
            return logits.to(dtype).argmax(dim=-1), None
        drafts = torch.empty(num_drafts, dtype=torch.int64, device=self.device)
        if num_drafts == 0:
            return drafts, None
        # Up to 0.24 the kernels read the cache at the target's width, from 0.25 at the draft's.
        width = logits.shape[1] if getattr(self._api, "truncates", False) else batch.vocab_size
        rows = torch.full((num_drafts, width), float("-inf"), dtype=dtype, device=self.device)
        rows[:, : logits.shape[1]] = logits.to(dtype)
        cache = None
        # 0.19-0.20 keep a cache only for probabilistic verification; 0.21+ whenever drafting probabilistically.
        if not self.era.cache_for_standard_only or mrv2._single_method(batch) is Method.STANDARD:
            cache_dtype = dtype if self.era.raw else torch.float32
            cache = torch.full((lay.num_slots, lay.k, width), float("nan"), dtype=cache_dtype, device=self.device)
        verifying_row = torch.arange(num_drafts, device=self.device) + lay.owner_of_draft
        pos = lay.pos[verifying_row]
        for step in range(lay.k):
            sel = torch.nonzero(lay.draft_steps == step).view(-1)
            if sel.numel():
                drafts[sel] = self._draw_step(rows[sel], lay.slots[lay.owner_of_draft[sel]].to(torch.int32), lay, pos[sel], cache, step)
        return drafts, cache

    def _draw_step(self, logits, idx_mapping, lay, pos, cache, step: int):
        """One ``gumbel_sample`` call of draft step ``step``, with the arguments of the era."""
        import torch

        kwargs = {}
        if cache is not None:
            if len(self.era.cache_args) == 1:
                kwargs[self.era.cache_args[0]] = cache[:, step]  # a [slots, V] view: written at slot * stride(0)
            else:
                col = torch.tensor(step, dtype=torch.int64, device=self.device)  # the engine's current_draft_step
                kwargs.update(zip(self.era.cache_args, (cache, col)))
        if self.era.is_drafting:
            kwargs["is_drafting"] = True
        if self._takes_fp64:
            kwargs["use_fp64"] = self._api.use_fp64  # the engine's one use_fp64_gumbel flag, the verifier's too
        with torch.no_grad():
            return self._gumbel.gumbel_sample(
                logits, idx_mapping, lay.temperature, lay.seed, pos.contiguous(), apply_temperature=True, **kwargs
            )


def _verified(batch, drafts):
    """The batch as the verifier gets it: the drawn ids; greedy drafts with no draft logits."""
    greedy = batch.draft_sampling == "greedy"
    return dataclasses.replace(batch, draft_tokens=drafts, draft_logits=None if greedy else batch.draft_logits, draft_sampling=None)
