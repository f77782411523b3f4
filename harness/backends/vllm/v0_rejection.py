"""vLLM V0's ``RejectionSampler`` behind the protocol (``vllm-v0-rejection@PATH``).

V0 (vLLM up to 0.6.x) verified drafts with ``vllm/model_executor/layers/rejection_sampler.py``:
modified rejection sampling (Chen et al. 2023) in plain PyTorch, on any device. ``PATH`` is a
folder holding that file and ``spec_decode_base_sampler.py`` beside it, as the release's wheel
has them (``scripts/vllm_v0_files.py`` extracts them). Both are loaded from their files alone:
the release's ``vllm/__init__.py`` imports its whole engine. The sampler's file imports two more
vLLM modules; they are replaced by stubs that cannot touch the sampling law:

* ``vllm.envs``: read once, in ``__init__``, and only when ``use_flashinfer`` is None (to pick
  FlashInfer's CUDA kernel). The adapter passes ``use_flashinfer=False``, so it is never read;
  the stub raises on any attribute, so a release that read it elsewhere would error, not drift.
* ``vllm.logger``: ``init_logger(__name__)``, whose logger only says which path runs. The stub
  is ``logging.getLogger``.

The imports are answered by the loaded module's own ``__import__`` (its ``__builtins__``), so
``sys.modules`` is never touched: a process that imported another vLLM keeps it, and threads
importing it meanwhile are unaffected. ``find_spec("flashinfer")`` runs as written: if
FlashInfer is installed its kernel is imported but not used.

**Contract** (vLLM 0.6.3's code and docstrings; ``docs/adapter-contracts.md``):

* ``RejectionSampler(strict_mode=False, use_flashinfer=None)``; ``init_gpu_tensors(device)``
  before the first call (its counters). ``strict_mode=True`` checks shapes, dtypes, devices and
  vocabulary bounds on every call. ``use_flashinfer=False``: the PyTorch path, the one that
  runs on CPU (FlashInfer's ``chain_speculative_sampling`` is another implementation, CUDA only);
* ``forward(target_with_bonus_probs [B, k + 1, V], bonus_token_ids [B, 1], draft_probs
  [B, k, V], draft_token_ids [B, k], seeded_seqs: Dict[int, torch.Generator] | None)``: one
  draft count ``k`` per call (V0's engine verifies with one proposal length; batches go in
  groups of equal k), target and draft *probabilities* as V0's ``Sampler`` hands them after
  temperature (``softmax(logits / T)``, float32, the same T for both; the draft worker runs the
  same sampler), ``seeded_seqs`` the requests' generators by batch row (``spec_decode_worker``
  passes ``self.generators[request_id]`` of seeded requests); it returns ``[B, k + 1]`` token ids,
  -1 after the emitted prefix;
* the bonus token is the target's own sample at the bonus row, drawn by the engine's sampler
  before the class runs, with the request's same generator: here by inverse CDF of
  ``softmax(logits / T)`` in float64 with one ``torch.rand`` of that generator, which then goes
  to ``forward``. Each request's generator is ``torch.Generator().manual_seed(seeds[r])``, so a
  batch is reproducible and its requests independent;
* a draft vocabulary narrower than the target's: ``strict_mode`` requires ``draft_probs`` at
  the target's width, so the draft rows are padded with probability 0 (the protocol's q).

A signature that differs is api-drift. Declined, each with its reason: methods other than
standard, greedy requests (the class has no greedy rule: V0's ``Sampler`` makes greedy rows
one-hot first, ``_modify_greedy_probs_inplace``), no draft probabilities (``draft_probs`` is
required), placeholder drafts (V0 has none), requests without drafts (V0 calls its sampler with
k >= 1), top-k / top-p / min-p / logit bias (the processed target would need V0's own sampler).
"""

import builtins
import importlib.util
import inspect
import logging
import os
import types

import numpy as np

from harness.backends.vllm.env import SRC_ENV, api_changed
from harness.protocol import host
from reference.methods import Method

_PACKAGE = "vllm.model_executor.layers"
_FILES = ("spec_decode_base_sampler", "rejection_sampler")
_INIT = ["strict_mode", "use_flashinfer"]
_FORWARD = ["target_with_bonus_probs", "bonus_token_ids", "draft_probs", "draft_token_ids", "seeded_seqs"]


def _stub_vllm(base) -> dict[str, types.ModuleType]:
    """The vLLM modules the sampler's file imports, as stubs (see the module docstring)."""

    def no_envs(name):
        raise AttributeError(f"vllm.envs.{name}: not read with use_flashinfer=False (vllm-v0-rejection stubs vllm.envs)")

    envs = types.ModuleType("vllm.envs")
    envs.__getattr__ = no_envs
    logger = types.ModuleType("vllm.logger")
    logger.init_logger = logging.getLogger
    vllm = types.ModuleType("vllm")
    vllm.__path__ = []
    vllm.envs, vllm.logger = envs, logger
    return {"vllm": vllm, "vllm.envs": envs, "vllm.logger": logger, f"{_PACKAGE}.spec_decode_base_sampler": base}


def _load(name: str, path: str, local: dict[str, types.ModuleType]) -> types.ModuleType:
    """Execute ``path`` as module ``name``; its imports of ``local``'s names get those modules."""

    def imp(target, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and target in local:
            return local[target] if fromlist else local[target.partition(".")[0]]
        if level == 0 and target.partition(".")[0] == "vllm":
            raise ImportError(f"vllm-v0-rejection: {os.path.basename(path)} imports {target}, which the adapter does not bind")
        return builtins.__import__(target, globals, locals, fromlist, level)

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__builtins__ = {**vars(builtins), "__import__": imp}
    spec.loader.exec_module(module)
    return module


def load_sampler_class(tree: str):
    """``RejectionSampler`` from ``tree``'s two files, checked against the contract."""
    folder = os.path.join(tree, *_PACKAGE.split("."))
    paths = {name: os.path.join(folder, f"{name}.py") for name in _FILES}
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"vllm-v0-rejection: {tree} has no {missing[0]} (scripts/vllm_v0_files.py extracts it from a V0 wheel)")
    base = _load(f"{_PACKAGE}.spec_decode_base_sampler", paths["spec_decode_base_sampler"], {})
    module = _load(f"{_PACKAGE}.rejection_sampler", paths["rejection_sampler"], _stub_vllm(base))
    cls = getattr(module, "RejectionSampler", None)
    if cls is None:
        raise api_changed("rejection_sampler.py defines no RejectionSampler")
    for fn, names in ((cls.__init__, _INIT), (cls.forward, _FORWARD)):
        have = [p for p in inspect.signature(fn).parameters if p != "self"]
        if have != names:
            raise api_changed(f"RejectionSampler.{fn.__name__}{tuple(have)} is not V0's {tuple(names)}")
    return cls


def availability() -> tuple[bool, str]:
    """Runs wherever torch does, once bound to a V0 release's files (the ``backends`` listing)."""
    return (
        True,
        "vLLM V0's RejectionSampler (PyTorch path), bound with @PATH to a V0 release's files (python scripts/vllm_v0_files.py --version 0.6.3 --out vendor/vllm-0.6.3)",
    )


class VllmV0RejectionBackend:
    name = "vllm-v0-rejection"
    devices = ("cpu", "cuda")

    def __init__(self):
        tree = os.environ.get(SRC_ENV)
        if not tree:
            raise ValueError("vllm-v0-rejection: bind a V0 folder with vllm-v0-rejection@PATH")
        self._cls = load_sampler_class(tree)
        self._instance = None
        self.device = "cpu"

    def supports(self, batch) -> str | None:
        if (host(batch.methods) != Method.STANDARD).any():
            return "vLLM V0's RejectionSampler verifies the standard method only"
        if (host(batch.temperature) == 0).any():
            return "greedy requests: V0's RejectionSampler has no greedy rule (V0's Sampler hands it one-hot rows for them, _modify_greedy_probs_inplace)"
        if batch.draft_logits is None:
            return "no draft probabilities: V0's RejectionSampler.forward requires draft_probs [B, k, V]"
        if (host(batch.draft_tokens) < 0).any():
            return "placeholder drafts: V0 has none"
        if (np.diff(host(batch.cu_num_drafts)) == 0).any():
            return "requests without drafts: V0 calls its sampler with k >= 1 drafts"
        if batch.has_sampling_params:
            return "top-k / top-p / min-p / logit bias: the processed target is V0's sampler's, not this class's"
        return None

    def _sampler(self):
        if self._instance is None:
            sampler = self._cls(strict_mode=True, use_flashinfer=False)
            sampler.init_gpu_tensors(self.device)
            self._instance = sampler
        return self._instance

    @staticmethod
    def _draft_probs(draft_logits, t, vocab_size: int):
        """V0's draft worker's probabilities: ``softmax(logits / T)`` in float32 at the request's
        T, padded with 0 to the target's width (``[n, k, V_draft]`` -> ``[n, k, V]``)."""
        import torch

        q = torch.softmax(draft_logits / t, dim=-1, dtype=torch.float32)
        return torch.nn.functional.pad(q, (0, vocab_size - q.shape[-1]))

    @staticmethod
    def _bonus(logits, temps, generators):
        """The target's sample at each bonus row (``[n, V]`` raw logits), with each request's
        generator: inverse CDF of ``softmax(logits / T)`` in float64, ``[n, 1]`` int64."""
        import torch

        p = torch.softmax(logits.double() / temps.double()[:, None], dim=-1)
        u = torch.cat([torch.rand(1, dtype=torch.float64, device=logits.device, generator=g) for g in generators])
        cdf = p.cumsum(-1)
        idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]  # first id whose mass passes u
        last = p.shape[1] - 1 - (p > 0).flip(-1).int().argmax(-1)  # u * total rounded up to total: the last id with mass
        idx = torch.minimum(idx, last)
        idx[~(cdf[:, -1] > 0)] = 0  # a degenerate row (NaN, all masked): any in-vocabulary id
        return idx[:, None]

    def sample(self, batch):
        import torch

        dev = torch.device(self.device)
        cu = host(batch.cu_num_drafts).astype(np.int64)
        counts = np.diff(cu)
        b = counts.size
        vocab = batch.target_logits.shape[1]
        temps = host(batch.temperature).astype(np.float64)
        seeds = host(batch.seeds)
        logits = torch.as_tensor(host(batch.target_logits)).to(dev, torch.float32)
        draft_logits = torch.as_tensor(host(batch.draft_logits)).to(dev, torch.float32)
        drafts = torch.as_tensor(host(batch.draft_tokens)).to(dev, torch.int64)
        row0 = cu[:-1] + np.arange(b)  # each request's first target row (k + 1 rows a request)
        tokens = np.full((b, batch.max_drafts + 1), -1, dtype=np.int64)
        emitted = np.zeros(b, dtype=np.int64)
        groups = {}
        for r in range(b):
            groups.setdefault(int(counts[r]), []).append(r)
        for k, reqs in groups.items():
            reqs = np.asarray(reqs)
            rows = torch.as_tensor(row0[reqs][:, None] + np.arange(k + 1)).to(dev)
            cols = torch.as_tensor(cu[:-1][reqs][:, None] + np.arange(k)).to(dev)
            t = torch.as_tensor(temps[reqs], dtype=torch.float32, device=dev)[:, None, None]
            target = torch.softmax(logits[rows] / t, dim=-1, dtype=torch.float32)  # V0's sampler: fp32 after T
            draft = self._draft_probs(draft_logits[cols], t, vocab)
            generators = [torch.Generator(device=dev).manual_seed(int(seeds[r])) for r in reqs]
            bonus = self._bonus(logits[rows[:, -1]], torch.as_tensor(temps[reqs], device=dev), generators)
            out = self._sampler().forward(target, bonus, draft, drafts[cols], dict(enumerate(generators)))
            out = out.cpu().numpy()
            tokens[reqs, : k + 1] = out
            emitted[reqs] = (out != -1).sum(axis=1)
        return tokens, emitted
