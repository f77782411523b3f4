"""Trials built on the backend's device: the same batches as ``scenarios.trials``, bit for bit.

The host path tiles every template's logits into each chunk in NumPy and copies the chunk
to the device; at V = 152,064 that costs more than the sampler. Here the templates' rows
go to the device once per scenario and are repeated there once per chunk size (every chunk
of the same size has the same logits: only seeds, positions and drafts differ), and the
per-trial integers are computed on the device with a torch port of ``reference.rng`` (on
CUDA in one Triton launch, ``harness.sampling.device.kernels``). Only counts come back to the host
(``DeviceTally``).

When every row of the templates is the same row (``RequestSpec.stationary`` with one
template) and the backend reads rows through their stride (``shared_rows = True``), a
chunk's logits are that one row expanded with stride 0: nothing is repeated, and the
backend reads one row from L2 for every trial.

A device batch is a ``VerifyBatch`` whose array fields are torch tensors on the device;
its logits are stored in the scenario's ``logits_dtype`` (their values are exact in it).
Backends opt in with ``device_batches = True``.
"""

import numpy as np
import torch

from harness.protocol import VerifyBatch
from harness.sampling.device.copies import upload
from harness.scenarios.materialize import Template, batch_processing, conditional_rates, fly_arrays, sampling_arrays, typical_arrays
from harness.scenarios.scenario import POSITION_RANGE, Scenario
from harness.torch_rng import hash64, hash_state, shift_right, uniforms
from reference.rng import Stream


class DeviceTrials:
    """``count`` trials of every template from global trial ``first``, built on ``device``."""

    def __init__(self, s: Scenario, templates: list[Template], device: str, share_rows: bool = False, kernels: bool | None = None):
        self.scenario, self.templates, self.device = s, templates, device
        dev = torch.device(device)
        # The integer work in one Triton launch (harness.sampling.device.kernels): default on CUDA.
        self.kernels = dev.type == "cuda" if kernels is None else kernels
        self.t_count = len(templates)
        self.k = s.max_drafts
        counts = np.array([t.num_drafts for t in templates], dtype=np.int64)
        dtype = getattr(torch, s.dtype)

        def put(x, dt=None):
            return upload(x, dev, dt)

        target = np.concatenate([t.target_logits for t in templates])
        draft_width = s.draft_vocab_size or s.vocab_size
        proposal = np.concatenate([t.draft_logits for t in templates]) if counts.sum() else np.zeros((0, draft_width), np.float32)
        self.target_block, self.draft_block = put(target).to(dtype), put(proposal).to(dtype)
        # One row for all (NaN != NaN: a poisoned row is never shared); on the host: no device sync.
        self.shared_target = share_rows and _one_row(target)
        self.shared_draft = share_rows and _one_row(proposal)
        # Sampled drafts: the float64 CDF of each (template, step), as reference.rules.draw_from_row.
        cdfs = {}
        for i, t in enumerate(templates):
            if t.drafts is None and t.num_drafts:
                probs = t.sampling_probs()
                last = probs.shape[1] - 1 - np.argmax(probs[:, ::-1] > 0, axis=1)
                cdfs[i] = (np.cumsum(probs, axis=1), last)
        self.sampled_drafts = bool(cdfs)
        self.cdfs = {} if self.kernels else {i: (put(cdf), put(last)) for i, (cdf, last) in cdfs.items()}
        self.rows_per_trial, self.drafts_per_trial = int((counts + 1).sum()), int(counts.sum())
        # The small arrays in one copy per dtype: each copy to the device costs a launch and a wait.
        ints = dict(fixed=np.stack([_padded(t.drafts if t.drafts is not None else [], self.k) for t in templates]), counts=counts)
        floats = dict(temps=np.array([t.spec.temperature for t in templates]))
        if s.synthetic is not None:
            floats["rates"] = conditional_rates(s)
        if self.kernels:
            ints |= _kernel_ints(counts, cdfs)
            floats["cdf"] = np.concatenate([cdf for cdf, _ in cdfs.values()]) if cdfs else np.zeros((1, 1))
        else:  # within a trial: template of each draft column / target row, and each row's step
            ints["draft_cols"] = np.concatenate([i * self.k + np.arange(d) for i, d in enumerate(counts)])
            ints["row_template"] = np.repeat(np.arange(self.t_count), counts + 1)
            ints["row_step"] = np.concatenate([np.arange(d + 1) for d in counts])
        self.ints, self.floats = _upload(ints, dev, np.int64), _upload(floats, dev, np.float64)
        self.fixed, self.counts_t, self.temps = self.ints["fixed"], self.ints["counts"], self.floats["temps"]
        self.methods = put(np.array([t.method for t in templates], dtype=np.int8))
        self.method_codes = tuple(sorted({int(t.method) for t in templates}))  # every chunk holds every template
        self.rates = self.floats.get("rates")
        # top-k / top-p / min-p / logit bias ([T, L] rows), typical acceptance and FLy of one trial (None when no template sets it), and whose tie rules.
        methods = np.array([t.method for t in templates], dtype=np.int8)
        per_request = {**sampling_arrays(templates), **typical_arrays(s, methods), **fly_arrays(s, methods)}
        self.params = {name: None if x is None else upload(x, dev) for name, x in per_request.items()}
        self.processing = batch_processing(templates)
        self._tiled = (None, None, None)  # (count, target, draft): the last chunk size's logits
        self.drafts = None  # [trials, T, K], drawn by ``prepare``
        self._shape = {}  # count -> the fields every chunk of that size shares

    def logits(self, count: int):
        """The rows of ``count`` trials. Every chunk of one size gets the same tensors, and a
        smaller chunk (the last) a prefix of them: the rows repeat trial after trial."""
        tiled, target, draft = self._tiled
        if tiled is not None and tiled > count:
            return target[: count * self.target_block.shape[0]], None if draft is None else draft[: count * self.draft_block.shape[0]]
        if tiled != count:
            self._tiled = (None, None, None)  # free the old chunk's logits first
            draft = _rows(self.draft_block, count, self.shared_draft, self.kernels) if self.scenario.draft_probs else None
            self._tiled = (count, _rows(self.target_block, count, self.shared_target, self.kernels), draft)
        return self._tiled[1], self._tiled[2]

    def prepare(self, total: int) -> None:
        """Draw every trial's drafts, seeds and start positions for trials [0, total) at once,
        and lay out the batch fields of them all: a chunk is then a few slices (per-chunk
        integer work is launch-bound on a GPU)."""
        s, dev, t_count = self.scenario, self.device, self.t_count
        random_positions = s.positions == "random"
        if self.kernels:
            from harness.sampling.device.kernels import build_trials

            sizes = dict(T=t_count, K=self.k, R=self.rows_per_trial, D=self.drafts_per_trial, position_range=POSITION_RANGE)
            fields = self.ints | sizes | {"cdf": self.floats["cdf"], "sampled": self.sampled_drafts}
            built = build_trials(int(hash_state(s.seed)), total, fields, random_positions)
            self.drafts, self.seeds, self.positions, self.draft_tokens = (
                built[f] for f in ("drafts", "seeds", "positions", "draft_tokens")
            )
            return
        req = torch.arange(total * t_count, device=dev)  # request index of trial t, template i: t * T + i
        # Every integer of a request is a hash of (seed, request, ...): the common prefix once.
        state = hash_state(s.seed, req, device=dev)
        self.drafts = self.fixed[None].repeat(total, 1, 1)  # [total, T, K]
        for i, (cdf, last) in self.cdfs.items():
            d = cdf.shape[0]
            seeds = shift_right(state.view(total, t_count)[:, i], 1)  # hash64(seed, request)
            u = uniforms(seeds[:, None], torch.arange(d, device=dev)[None, :], Stream.DRAFT)
            for j in range(d):
                ids = torch.searchsorted(cdf[j], u[:, j] * cdf[j, -1], right=True)
                self.drafts[:, i, j] = torch.minimum(ids, last[j])
        self.seeds = shift_right(hash_state(1, start=state), 1)  # hash64(seed, request, 1)
        base = shift_right(hash_state(2, start=state), 1) % POSITION_RANGE if random_positions else torch.zeros_like(req)
        self.positions = (base.view(total, t_count)[:, self.ints["row_template"]] + self.ints["row_step"]).reshape(-1)
        self.draft_tokens = self.drafts.reshape(total, t_count * self.k)[:, self.ints["draft_cols"]].reshape(-1)

    def _shared(self, count: int) -> dict:
        """The fields every chunk of ``count`` trials shares; a smaller chunk (the last)
        takes a prefix of the largest built: they repeat trial after trial."""
        larger = [n for n in self._shape if n > count]
        if count not in self._shape and larger:
            t_count, fields = self.t_count, self._shape[max(larger)]
            return {name: None if x is None else x[: count * t_count + (name == "cu_num_drafts")] for name, x in fields.items()}
        if count not in self._shape:
            dev, t_count = self.device, self.t_count
            cu = torch.zeros(count * t_count + 1, dtype=torch.int64, device=dev)
            cu[1:] = self.counts_t.repeat(count).cumsum(0)
            self._shape[count] = dict(
                cu_num_drafts=cu,
                temperature=self.temps.repeat(count),
                methods=self.methods.repeat(count),
                synthetic_rates=None if self.rates is None else self.rates[None].repeat(count * t_count, 1),
                **{name: None if x is None else x.repeat(count, *[1] * (x.dim() - 1)) for name, x in self.params.items()},
            )
        return self._shape[count]

    def chunk(self, first: int, count: int) -> tuple[VerifyBatch, torch.Tensor]:
        """(the batch, drafts ``[count, T, K]``): ``scenarios.trials(s, templates, first, count)``
        on the device, for trials inside ``prepare``'s range."""
        s, dev, t_count, k = self.scenario, self.device, self.t_count, self.k
        last = first + count
        if self.drafts is None or last > self.drafts.shape[0]:  # drawing again per chunk would redo every trial
            raise ValueError(f"trials [{first}, {last}) are outside the prepared range: call prepare(total) first")
        drafts = self.drafts[first:last]
        rows, cols = self.rows_per_trial, self.drafts_per_trial
        slots = None
        if s.slots == "permuted":  # as scenarios.trials: a state table twice the batch
            slots = torch.argsort(hash64(s.seed, first + torch.arange(2 * count * t_count, device=dev), 3))[: count * t_count]
        target, draft = self.logits(count)
        batch = VerifyBatch(
            target_logits=target,
            draft_logits=draft,
            draft_tokens=self.draft_tokens[first * cols : last * cols],
            seeds=self.seeds[first * t_count : last * t_count],
            positions=self.positions[first * rows : last * rows],
            max_drafts=k,
            request_slots=slots,
            logits_dtype=s.dtype,
            method_codes=self.method_codes,
            processing=self.processing,
            **self._shared(count),
        )
        return batch, drafts


def _one_row(block: np.ndarray) -> bool:
    return block.shape[0] > 0 and bool((block == block[:1]).all())


def _kernel_ints(counts: np.ndarray, cdfs: dict) -> dict:
    """What ``device_kernels.build_trials`` reads besides the drafts: each template's first
    position row and first draft column within a trial, and where its CDF rows start in
    the stacked CDFs (-1: fixed drafts) and each row's last possible token."""
    cdf_rows = np.full(len(counts), -1, dtype=np.int64)
    at = 0
    for i, (cdf, _) in cdfs.items():
        cdf_rows[i], at = at, at + cdf.shape[0]
    return dict(
        row_offsets=np.cumsum(counts + 1) - (counts + 1),
        draft_offsets=np.cumsum(counts) - counts,
        cdf_rows=cdf_rows,
        cdf_last=np.concatenate([last for _, last in cdfs.values()]) if cdfs else np.zeros(1),
    )


def _upload(arrays: dict, device, dtype) -> dict:
    """Host arrays as views of one device tensor of 8-byte ``dtype``: one copy for all of
    them. Each view starts 16-byte aligned, as a tensor of its own would (Triton compiles a
    kernel again for each pattern of aligned pointers)."""
    flat = [np.asarray(a, dtype=dtype).ravel() for a in arrays.values()]
    starts = np.cumsum([0] + [f.size + f.size % 2 for f in flat])
    whole = np.zeros(starts[-1], dtype)
    for f, at in zip(flat, starts):
        whole[at : at + f.size] = f
    whole = upload(whole, device)
    return {name: whole[at : at + f.size].view(np.shape(a)) for (name, a), f, at in zip(arrays.items(), flat, starts)}


def _rows(block: torch.Tensor, count: int, shared: bool, kernels: bool) -> torch.Tensor:
    """``block`` repeated ``count`` times: a stride-0 view of its one row when ``shared``;
    with ``kernels``, one vectorized launch (``device_kernels.repeat_rows``)."""
    if shared:
        return block[:1].expand(count * block.shape[0], block.shape[1])
    if kernels:
        from harness.sampling.device.kernels import repeat_rows

        return repeat_rows(block, count)
    return block.repeat(count, 1)


def _padded(ids, k: int) -> np.ndarray:
    out = np.full(k, -1, dtype=np.int64)
    out[: len(ids)] = ids
    return out
