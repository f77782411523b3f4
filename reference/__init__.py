"""Float64 NumPy/SciPy ground truth for speculative-decoding rejection samplers.

Conventions every method shares (the suite holds engines to these):

* Arguments are named *target* (the model being sampled, Leviathan's p, Chen's q) and
  *draft* (the proposal), never p/q.
* Probabilities are ``softmax(logits / T)`` in float64 for both the target and the draft
  rows of a request with temperature ``T > 0``. ``T == 0`` is greedy verification.
* ``-inf`` logits are masked tokens (probability 0; this is how top-k/top-p reach the
  sampler). ``NaN`` anywhere in a target row poisons the row, as a softmax would; such a
  row, or a row with no finite logit, is *degenerate* and is treated as a point mass on
  token 0 (the greedy tie rule applied to an all-equal row). Engines are only required to
  emit an in-vocabulary id there. ``+inf`` logits and NaN draft logits are input errors.
* A draft vocabulary smaller than the target's gives draft probability 0 to the ids it
  lacks; the target keeps its full vocabulary (lossless; vLLM MRV2 instead truncates the
  target to the draft's width, which is lossless only when the extra target ids are masked).
* A placeholder draft id (-1) is never accepted: it ends the request's drafts at its step,
  and the row it sat on acts as the bonus row (vLLM: "stop verifying at the first -1").
* Drafts counts are ragged per request, 0 included (a request with no drafts emits one
  token from its only row).
* An empty residual (rounding, or a synthetic rejection where target == draft) falls back
  to the target row.

The package defines no names of its own; its public API is in its modules:

* ``reference.methods``: ``Method``, the verification methods and their codes in a batch.
* ``reference.distributions``: logits to float64 probabilities under these conventions.
* ``reference.rules``: the verification rules, shared by the sampler and the laws.
* ``reference.laws``: the exact output laws of every method.
* ``reference.sampler``: ``ReferenceSampler``, the vectorized float64 reference sampler.
* ``reference.rng``: counter-based float64 uniforms keyed by (seed, position, stream).
* ``reference.synthetic``: closed forms of the lossy synthetic mode.
* ``reference.typical``: typical acceptance (vLLM V0, Medusa): its rule and exact laws.
* ``reference.fly``: FLy (vLLM 0.33.0's entropy-gated deferred verification): its rule and
  exact laws.
* ``reference.tree``: tree verification (SGLang's EAGLE rule, SpecInfer's multi-round rule):
  draft trees, seeded samplers and exact laws.
"""
