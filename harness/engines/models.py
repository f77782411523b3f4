"""Tiny Llama-style causal language models with seeded weights, built without a download.

The weights come from NumPy, one stream per parameter keyed by (seed, parameter name),
and are loaded over whatever the model class initialized: every transformers release
(their initializers differ) builds the same model from the same ``ModelSpec``. A draft
"close" to a target is that target's weights plus small seeded noise.
"""

import zlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ModelSpec:
    vocab: int
    hidden: int = 16
    layers: int = 1
    heads: int = 2
    seed: int = 0
    logit_scale: float = 3.0  # std of the output logits' weights x sqrt(hidden): how peaked each next-token law is
    noise: float = 0.0  # > 0: this seed's weights are the noise added to ``base``'s
    base: "ModelSpec | None" = None

    def __post_init__(self):
        for name in ("vocab", "hidden", "layers", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model {name}: must be a positive integer, got {value!r}")
        if self.vocab < 2 or self.vocab > 64:
            raise ValueError(f"model vocab: must be in [2, 64] (the law is enumerated), got {self.vocab}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"model hidden: must split into {self.heads} heads of even size, got {self.hidden}")
        if not self.logit_scale > 0 or self.noise < 0:
            raise ValueError("model logit_scale must be > 0 and noise >= 0")
        if (self.noise > 0) != (self.base is not None):
            raise ValueError("model: noise > 0 needs a base model, and a base needs noise > 0")
        if self.base is not None and (self.base.vocab, self.base.hidden, self.base.layers, self.base.heads) != (
            self.vocab, self.hidden, self.layers, self.heads,
        ):  # fmt: skip
            raise ValueError("model: a noisy copy has its base's shape")

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("vocab", "hidden", "layers", "heads", "seed", "logit_scale", "noise")}
        d["base"] = self.base.to_dict() if self.base else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        d = dict(d)
        base = d.pop("base", None)
        return cls(**d, base=cls.from_dict(base) if base else None)


def _stream(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def weights(spec: ModelSpec, shapes: dict) -> dict:
    """name -> float32 array for every parameter in ``shapes`` (name -> shape)."""
    out = {}
    for name, shape in shapes.items():
        if spec.base is not None:
            out[name] = weights(spec.base, {name: shape})[name] + spec.noise * _noise(spec.seed, name, shape)
            continue
        if name.endswith("norm.weight"):
            out[name] = np.ones(shape, dtype=np.float32)
            continue
        std = 1.0 if "embed_tokens" in name else 1.0 / np.sqrt(shape[-1])
        if name == "lm_head.weight":
            std = spec.logit_scale / np.sqrt(shape[-1])
        out[name] = (std * _stream(spec.seed, name).standard_normal(shape)).astype(np.float32)
    return out


def _noise(seed: int, name: str, shape) -> np.ndarray:
    return (_stream(seed, "noise/" + name).standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def build(spec: ModelSpec):
    """The ``LlamaForCausalLM`` of ``spec``, float32, in eval mode, on the CPU, with no
    end-of-sequence token (continuations always have their full length)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=2 * spec.hidden,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
        max_position_embeddings=128, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    state = model.state_dict()
    shapes = {name: tuple(t.shape) for name, t in state.items() if t.is_floating_point()}
    model.load_state_dict({name: torch.from_numpy(w) for name, w in weights(spec, shapes).items()}, strict=False)
    model.generation_config.pad_token_id = None
    model.generation_config.eos_token_id = None
    return model
