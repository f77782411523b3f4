"""What an engine-level check verifies: two seeded models, a prompt, the generation
settings and the continuation length. Pure data, validated on construction, serializable;
a reproducer names it by its catalog name."""

from dataclasses import dataclass, field

from harness.engines.models import ModelSpec
from reference.hf_processing import HfSampling

MAX_CELLS = 4096  # vocab ** max_new_tokens: the continuation law is enumerated


@dataclass(frozen=True)
class EngineScenario:
    name: str
    target: ModelSpec
    draft: ModelSpec
    prompt: tuple[int, ...]
    sampling: HfSampling = field(default_factory=HfSampling)
    num_assistant_tokens: int = 2
    max_new_tokens: int = 3
    ensemble_weight: float | None = None  # HF's static ensemble (``assistant_ensemble_weight``): lossy, law w*p + (1-w)*q
    description: str = ""

    def __post_init__(self):
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ValueError(f"scenario name: letters, digits, '-', '_' and '.' only, got {self.name!r}")
        if self.draft.vocab != self.target.vocab:
            raise ValueError(f"draft vocab {self.draft.vocab} != target vocab {self.target.vocab}: the engine's same-tokenizer path")
        if not self.prompt or any(not isinstance(t, int) or not 0 <= t < self.vocab for t in self.prompt):
            raise ValueError(f"prompt: one or more token ids in [0, {self.vocab}), got {self.prompt!r}")
        for name in ("num_assistant_tokens", "max_new_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.vocab**self.max_new_tokens > MAX_CELLS:
            raise ValueError(
                f"vocab ** max_new_tokens = {self.vocab**self.max_new_tokens} cells: at most {MAX_CELLS} (the law is enumerated)"
            )
        if self.ensemble_weight is not None and not 0.0 < self.ensemble_weight < 1.0:
            raise ValueError(f"ensemble_weight: must be in (0, 1) or None, got {self.ensemble_weight!r}")

    @property
    def vocab(self) -> int:
        return self.target.vocab

    @property
    def cells(self) -> int:
        return self.vocab**self.max_new_tokens

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "target": self.target.to_dict(),
            "draft": self.draft.to_dict(),
            "prompt": list(self.prompt),
            "sampling": {"temperature": self.sampling.temperature, "top_k": self.sampling.top_k, "top_p": self.sampling.top_p},
            "num_assistant_tokens": self.num_assistant_tokens,
            "max_new_tokens": self.max_new_tokens,
            "ensemble_weight": self.ensemble_weight,
            "description": self.description,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "EngineScenario":
        d = dict(d)
        d["target"] = ModelSpec.from_dict(d["target"])
        d["draft"] = ModelSpec.from_dict(d["draft"])
        d["prompt"] = tuple(d["prompt"])
        d["sampling"] = HfSampling(**d.get("sampling", {}))
        return cls(**d)


_TARGET = ModelSpec(vocab=8, hidden=16, layers=2, heads=2, seed=0)
_CLOSE = ModelSpec(vocab=8, hidden=16, layers=2, heads=2, seed=101, noise=0.05, base=_TARGET)
_FAR = ModelSpec(vocab=8, hidden=8, layers=1, heads=2, seed=1, logit_scale=4.0)

CATALOG = (
    EngineScenario(
        "hf-close-draft", _TARGET, _CLOSE, (1, 2, 3), HfSampling(temperature=1.5),
        description="a draft close to the target (its weights plus noise): most drafts accepted",
    ),
    EngineScenario(
        "hf-far-draft", _TARGET, _FAR, (4, 0, 6), HfSampling(temperature=0.8),
        description="a smaller draft that disagrees strongly with the target: many rejections and residual draws",
    ),
    EngineScenario(
        "hf-top-k-top-p", _TARGET, _FAR, (2, 5), HfSampling(temperature=2.0, top_k=5, top_p=0.9), num_assistant_tokens=3,
        description="temperature, top-k and top-p on target and draft: the processed law",
    ),
    EngineScenario(
        "hf-ensemble", _TARGET, _FAR, (4, 0, 6), HfSampling(temperature=1.0), num_assistant_tokens=1, max_new_tokens=3,
        ensemble_weight=0.5, description="HF's static ensemble (lossy by design): draft positions follow w*p + (1-w)*q",
    ),
)  # fmt: skip


def catalog_scenario(name: str) -> EngineScenario:
    for s in CATALOG:
        if s.name == name:
            return s
    raise ValueError(f"engine scenario: unknown {name!r} (known: {', '.join(s.name for s in CATALOG)})")
