"""Planted faults in a whole engine's speculative path (``hf-fault:NAME``): the current
transformers release with one wiring bug of a class engines have shipped. Each patches
the engine inside the worker process for the whole run; nothing else changes."""

import contextlib
import copy

FAULTS = {
    "greedy-draft-soft-q": "the assistant decodes greedily while its processed softmax is the verifier's q (HF #32867 before PR #33534)",
    "q-before-processor": "the verifier's q is the assistant's raw logits, not the processed ones it sampled from (the HF #47932 class)",
    "target-top-k-skipped": "the target's rows reach the verifier without the top-k warper the assistant applied (the vLLM #42744 / TensorRT-LLM #17955 class)",
}


@contextlib.contextmanager
def planted(name: str | None, assistant):
    """Plant fault ``name`` (None: none) in the engine for the duration of the block."""
    if name is None:
        yield
        return
    if name not in FAULTS:
        raise ValueError(f"engine fault: unknown {name!r} (known: {', '.join(FAULTS)})")
    if name == "target-top-k-skipped":
        with _target_without(_top_k_class()):
            yield
        return
    original = assistant.generate
    previous = vars(assistant).get("generate")

    def generate(*args, **kwargs):
        config = kwargs.get("generation_config")
        if config is not None:
            config = kwargs["generation_config"] = copy.deepcopy(config)
        if name == "greedy-draft-soft-q":
            config.do_sample = False
            return original(*args, **kwargs)
        config.output_logits = True
        out = original(*args, **kwargs)
        out.scores = tuple(out.logits)  # raw logits where the processed scores belong
        return out

    assistant.generate = generate
    try:
        yield
    finally:
        restore_generate(assistant, previous)


def restore_generate(model, previous) -> None:
    """Put back the instance's own ``generate`` (another wrapper's), or remove ours."""
    if previous is None:
        vars(model).pop("generate", None)
    else:
        model.generate = previous


def _top_k_class():
    from transformers.generation.logits_process import TopKLogitsWarper

    return TopKLogitsWarper


@contextlib.contextmanager
def _target_without(processor_class):
    """The target's rows skip ``processor_class``; the candidate generator, built inside
    ``_assisted_decoding`` from the same list, still iterates (and applies) all of them."""
    import functools

    from transformers.generation.logits_process import LogitsProcessorList
    from transformers.generation.utils import GenerationMixin

    class Skipping(LogitsProcessorList):
        def __call__(self, input_ids, scores, **kwargs):
            for processor in self:
                if not isinstance(processor, processor_class):
                    scores = processor(input_ids, scores)
            return scores

    original = GenerationMixin._assisted_decoding

    @functools.wraps(original)
    def assisted(self, *args, **kwargs):
        kwargs["logits_processor"] = Skipping(kwargs["logits_processor"])
        return original(self, *args, **kwargs)

    GenerationMixin._assisted_decoding = assisted
    try:
        yield
    finally:
        GenerationMixin._assisted_decoding = original
