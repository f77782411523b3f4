"""vLLM V0's ``TypicalAcceptanceSampler`` behind the protocol (``vllm-v0-typical@PATH``).

V0 (vLLM up to 0.6.x) verified Medusa-style drafts with
``vllm/model_executor/layers/typical_acceptance_sampler.py``, pure PyTorch on any device.
``PATH`` is a folder holding that file and ``spec_decode_base_sampler.py`` beside it, as the
release's wheel has them (``scripts/vllm_v0_files.py`` extracts them). The two modules are
loaded from their files alone: the release's ``vllm/__init__.py`` imports its whole engine.

**Contract** (vLLM 0.6.3's code and docstrings; ``docs/adapter-contracts.md``):

* ``TypicalAcceptanceSampler(posterior_threshold, posterior_alpha, strict_mode=False)``: one
  epsilon and delta per sampler, so a batch is verified in groups of equal (epsilon, delta)
  and equal draft count (``forward`` takes ``[B, k]`` drafts, no ragged rows);
* ``init_gpu_tensors(device)`` before the first call (its counters);
* ``forward(target_with_bonus_probs [B, k + 1, V], bonus_token_ids [B, 1], draft_probs,
  draft_token_ids [B, k])``: the target's probabilities as V0's sampler hands them, after
  temperature (``softmax(logits / T)``, float32); ``draft_probs`` is "unused by the
  acceptance sampler"; it returns ``[B, k + 1]`` token ids, -1 after the emitted prefix;
* the bonus token is the target's own sample at the bonus row, drawn by the engine's sampler
  outside this class: here from ``softmax(logits / T)`` in float64 by inverse CDF with the
  suite's counter-based uniform keyed by (seed, bonus position), as for V1.

A signature that differs is api-drift. Declined, each with its reason: other methods, greedy
requests (V0 scores them with ``softmax(logits)`` at T = 1: not the suite's law), placeholder
drafts (V0 has none), requests without drafts (V0 calls its sampler with k >= 1), top-k / top-p / min-p / logit bias (the law's processed target would
need V0's own sampler), draft ids the engine would not have.
"""

import importlib.util
import inspect
import os
import sys

import numpy as np

from harness.backends.vllm.env import SRC_ENV, api_changed
from harness.protocol import host
from reference.methods import Method
from reference.rng import Stream

_FILES = ("spec_decode_base_sampler", "typical_acceptance_sampler")
_PACKAGE = "vllm.model_executor.layers"
_INIT = ["posterior_threshold", "posterior_alpha", "strict_mode"]
_FORWARD = ["target_with_bonus_probs", "bonus_token_ids", "draft_probs", "draft_token_ids"]


def load_sampler_class(tree: str):
    """``TypicalAcceptanceSampler`` from ``tree``'s two files, checked against the contract."""
    folder = os.path.join(tree, *_PACKAGE.split("."))
    paths = {name: os.path.join(folder, f"{name}.py") for name in _FILES}
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"vllm-v0-typical: {tree} has no {missing[0]} (scripts/vllm_v0_files.py extracts it from a V0 wheel)")
    modules = {}
    try:
        for name, path in paths.items():  # the base first: the sampler's file imports it by its package name
            full = f"{_PACKAGE}.{name}"
            spec = importlib.util.spec_from_file_location(full, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[full] = module
            spec.loader.exec_module(module)
            modules[name] = module
    finally:  # registered only while the files import each other: a later vLLM import is untouched
        for name in _FILES:
            sys.modules.pop(f"{_PACKAGE}.{name}", None)
    cls = getattr(modules["typical_acceptance_sampler"], "TypicalAcceptanceSampler", None)
    if cls is None:
        raise api_changed("typical_acceptance_sampler.py defines no TypicalAcceptanceSampler")
    for fn, names in ((cls.__init__, _INIT), (cls.forward, _FORWARD)):
        have = [p for p in inspect.signature(fn).parameters if p != "self"]
        if have != names:
            raise api_changed(f"TypicalAcceptanceSampler.{fn.__name__}{tuple(have)} is not V0's {tuple(names)}")
    return cls


def availability() -> tuple[bool, str]:
    """Runs wherever torch does, once bound to a V0 release's files (the ``backends`` listing)."""
    return (
        True,
        "vLLM V0's TypicalAcceptanceSampler, bound with @PATH to a V0 release's files (python scripts/vllm_v0_files.py --version 0.6.3 --out vendor/vllm-0.6.3)",
    )


class VllmV0TypicalBackend:
    name = "vllm-v0-typical"
    devices = ("cpu", "cuda")

    def __init__(self):
        tree = os.environ.get(SRC_ENV)
        if not tree:
            raise ValueError("vllm-v0-typical: bind a V0 folder with vllm-v0-typical@PATH")
        self._cls = load_sampler_class(tree)
        self._samplers = {}
        self.device = "cpu"

    def supports(self, batch) -> str | None:
        methods = host(batch.methods)
        if (methods != Method.TYPICAL).any():
            return "vLLM V0's TypicalAcceptanceSampler verifies typical acceptance only"
        if (host(batch.temperature) == 0).any():
            return "greedy requests: V0 scores them with softmax(logits) at T = 1, not a point mass"
        if (host(batch.draft_tokens) < 0).any():
            return "placeholder drafts: V0 has none"
        if (np.diff(host(batch.cu_num_drafts)) == 0).any():
            return "requests without drafts: V0 calls its sampler with k >= 1 drafts"
        if batch.has_sampling_params:
            return "top-k / top-p / min-p / logit bias: the processed target is V0's sampler's, not this class's"
        return None

    def _sampler(self, eps: float, delta: float):
        key = (eps, delta)
        if key not in self._samplers:
            sampler = self._cls(posterior_threshold=eps, posterior_alpha=delta, strict_mode=True)
            sampler.init_gpu_tensors(self.device)
            self._samplers[key] = sampler
        return self._samplers[key]

    def sample(self, batch):
        import torch

        from harness.torch_rng import uniforms

        dev = torch.device(self.device)
        cu = host(batch.cu_num_drafts).astype(np.int64)
        counts = np.diff(cu)
        b = counts.size
        temps = host(batch.temperature).astype(np.float64)
        eps, delta = host(batch.posterior_threshold), host(batch.posterior_alpha)
        logits = torch.as_tensor(host(batch.target_logits)).to(dev, torch.float32)
        drafts = torch.as_tensor(host(batch.draft_tokens)).to(dev, torch.int64)
        seeds = torch.as_tensor(host(batch.seeds)).to(dev, torch.int64)
        positions = torch.as_tensor(host(batch.positions)).to(dev, torch.int64)
        row0 = cu[:-1] + np.arange(b)  # each request's first target row (k + 1 rows a request)
        tokens = np.full((b, batch.max_drafts + 1), -1, dtype=np.int64)
        emitted = np.zeros(b, dtype=np.int64)
        groups = {}
        for r in range(b):
            groups.setdefault((int(counts[r]), float(eps[r]), float(delta[r])), []).append(r)
        for (k, e, d), reqs in groups.items():
            reqs = np.asarray(reqs)
            rows = torch.as_tensor(row0[reqs][:, None] + np.arange(k + 1)).to(dev)
            t = torch.as_tensor(temps[reqs], dtype=torch.float32, device=dev)[:, None, None]
            probs = torch.softmax(logits[rows] / t, dim=-1, dtype=torch.float32)  # V0's sampler: fp32 after T
            bonus_rows = rows[:, -1]
            cdf = torch.softmax(logits[bonus_rows].double() / t[:, 0].double(), dim=-1).cumsum(-1)
            u = uniforms(seeds[torch.as_tensor(reqs, device=dev)], positions[bonus_rows], Stream.RESIDUAL)
            bonus = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp(max=logits.shape[1] - 1)
            cols = torch.as_tensor(cu[:-1][reqs][:, None] + np.arange(k)).to(dev)
            out = self._sampler(e, d).forward(probs, bonus, None, drafts[cols])
            out = out.cpu().numpy()
            tokens[reqs, : k + 1] = out
            emitted[reqs] = (out != -1).sum(axis=1)
        return tokens, emitted
